"""Data-parallel fit over two (virtual CPU) devices equals the single-device fit."""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import backend

SCRIPT = textwrap.dedent("""
    import os, sys
    import numpy as np
    import keras
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras_vit
    from keras_vit import distribute

    def train(parallel):
        keras.utils.set_random_seed(0)
        ctx = distribute.data_parallel() if parallel else __import__("contextlib").nullcontext()
        with ctx:
            replicas = distribute.num_replicas()
            model = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, mlp_dim=32,
                                                num_heads=2, num_layers=1, classes=3, classifier_activation=None)
            model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (32, 16, 16, 3)).astype("float32")
        y = rng.integers(0, 3, 32)
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return replicas, model.get_weights()

    if sys.argv[1] == "parallel":
        replicas, w = train(True)
    else:
        replicas, w = train(False)
    np.savez(sys.argv[2], replicas=replicas, *w)
""")


@pytest.mark.skipif(backend() == "torch", reason="torch scales with one process per device (torchrun)")
def test_two_device_data_parallel_matches_one_device(tmp_path):
    script = tmp_path / "dp.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    import numpy as np

    results = {}
    for mode in ("single", "parallel"):
        out = tmp_path / f"{mode}.npz"
        proc = subprocess.run([sys.executable, str(script), mode, str(out)], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[mode] = np.load(out)
    assert int(results["parallel"]["replicas"]) == 2 and int(results["single"]["replicas"]) == 1
    keys = [k for k in results["single"].files if k != "replicas"]
    for k in keys:
        np.testing.assert_allclose(results["parallel"][k], results["single"][k], atol=1e-5)


def test_torch_backend_says_what_to_use_instead():
    if backend() != "torch":
        pytest.skip("torch-only message")
    from keras_vit import distribute

    with pytest.raises(NotImplementedError, match="torchrun"):
        distribute.data_parallel()
