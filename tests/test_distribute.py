"""Scale-out: JAX data and model parallelism on 8 virtual CPU devices (one subprocess,
tests/_distribute_jax.py), the choice of tf.distribute strategy, and the refusals. (TensorFlow's
MirroredStrategy on 2 logical CPU devices against one device is the reference run of
tests/test_multiprocess.py's two workers, which checks it too.)"""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import backend

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def jax8(tmp_path_factory):
    """The measurements of tests/_distribute_jax.py (JAX, 8 devices), run once, under the lane's XLA flags
    (the suite's compile-time flags kept: without them this run took 38 s instead of 22 s)."""
    from keras_vit.launch import with_cpu_devices

    tmp = tmp_path_factory.mktemp("jax8")
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_FLAGS": with_cpu_devices(os.environ.get("XLA_FLAGS", ""), 8),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "_distribute_jax.py"), str(tmp / "out.json"),
                           str(tmp / "backup")], env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text())


@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.parametrize("mode, replicas", [("data", 8), ("model", 2)])
def test_parallel_training_matches_one_device(jax8, mode, replicas):
    """4 SGD updates (momentum, clipping) of the same global batches: data parallel over 8 devices
    and model parallel on a 2x4 mesh give one device's losses and weights (float32)."""
    result = jax8[mode]
    assert result["replicas"] == replicas
    assert result["weights_allclose"]
    assert result["max_rel"] <= 1e-5
    assert result["loss_max_rel"] <= 1e-5
    assert len(result["losses"]) == len(jax8["single_losses"]) == 4


@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["data", "model"])
def test_layer_decay_under_the_distribution_api(jax8, mode):
    """4 updates with layer_decay=0.5, data parallel over 8 devices or model parallel on 2x4: one
    device's decayed trajectory (which differs from the undecayed one)."""
    assert jax8["decay_effect"] > 1e-3
    assert jax8[f"decay_{mode}"]["weights_allclose"] and jax8[f"decay_{mode}"]["max_rel"] <= 1e-5
    assert jax8[f"decay_{mode}"]["loss_max_rel"] <= 1e-5


@pytest.mark.backend_independent
@pytest.mark.slow
def test_stochastic_depth_under_data_parallel(jax8):
    """4 updates with drop_path_rate=0.3, data parallel over 8 devices: one device's trajectory (the
    per-image masks drawn from the same seed whatever the sharding), which differs from the one without."""
    assert jax8["drop_path_effect"] > 1e-3
    assert jax8["drop_path_data"]["weights_allclose"] and jax8["drop_path_data"]["max_rel"] <= 1e-5
    assert jax8["drop_path_data"]["loss_max_rel"] <= 1e-5


@pytest.mark.backend_independent
@pytest.mark.slow
def test_gradient_accumulation_matches_the_whole_batch(jax8):
    """One device accumulating 2 micro-batches of 8 updates as one batch of 16 (the global batch
    kept when devices are few)."""
    assert jax8["accumulated"]["weights_allclose"] and jax8["accumulated"]["max_rel"] <= 1e-5
    assert jax8["accumulated"]["loss_max_rel"] <= 1e-5


@pytest.mark.backend_independent
@pytest.mark.slow
def test_model_parallel_kernels_are_split_over_the_model_axis(jax8):
    """Read from the arrays: every device holds a quarter of each attention and MLP kernel and of
    its optimizer slot, split along heads (q/k/v, out) or the MLP width."""
    shards = jax8["shards"]
    assert len(shards) == 2 * 2 * 6  # 2 blocks x (q, k, v, out, Dense_0, Dense_1) x (weight, momentum)
    split_dim = {"query": 1, "key": 1, "value": 1, "out": 0, "Dense_0": 1, "Dense_1": 0}
    for path, info in shards.items():
        (shard,) = info["shards"]  # the same shape on every device
        assert info["devices"] == 8
        assert np.prod(shard) * 4 == np.prod(info["shape"]), path
        dim = next(d for name, d in split_dim.items() if re.search(rf"\b{name}\b|_{name}_", path))
        assert shard[dim] * 4 == info["shape"][dim], path
    # the per-device bytes computed from the layouts alone equal the real shards' bytes
    assert jax8["tiny_layout_bytes"] == jax8["tiny_real_bytes"]


@pytest.mark.backend_independent
@pytest.mark.slow
def test_vit_h14_fits_a_quarter_per_device(jax8):
    """ViT-H/14 with AdamW on a 2x4 mesh: each device holds about a quarter of parameters + state."""
    assert jax8["h14_params"] == 632_045_800
    assert jax8["h14_total_bytes"] == 4 * 3 * jax8["h14_params"] + 8  # params, m, v (+ step counter)
    per_device = jax8["h14_per_device"]
    assert len(per_device) == 8 and len(set(per_device.values())) == 1
    fraction = next(iter(per_device.values())) / jax8["h14_total_bytes"]
    assert 0.25 < fraction < 0.26, fraction


@pytest.mark.backend_independent
@pytest.mark.slow
def test_layout_covers_every_variant(jax8):
    """Every variant, token and gap, pre-logits and hybrids: all attention, MLP, pre-logits and
    head kernels split; only norms, embeddings, output biases and ResNet stems replicated."""
    replicated_ok = re.compile(r"(.*LayerNorm_\d/(gamma|beta)|encoder_norm/(gamma|beta)|cls/cls|"
                               r"posembed_input/pos_embedding|embedding/(kernel|bias)|resnet/.*|"
                               r".*/out/bias|.*Dense_1/bias|head/bias)")
    for name, info in jax8["variants"].items():
        assert [p for p in info["replicated"] if not replicated_ok.fullmatch(p)] == [], name
        for kind in ("query/kernel", "key/kernel", "value/kernel", "out/kernel", "Dense_0/kernel",
                     "Dense_1/kernel"):
            count = sum(p.endswith(kind) for p in info["split"])
            assert count == sum(p.endswith(kind) for p in info["split"] + info["replicated"]) > 0, (name, kind)
        assert {"pre_logits/kernel", "head/kernel"} <= set(info["split"]), name
        if info["model_axis"] > 1 and not name.startswith("R"):
            assert info["split_params"] / info["params"] > 0.9, name
    assert jax8["variants"]["ViT_H14/token"]["model_axis"] == 8
    assert jax8["variants"]["ViT_S16/gap"]["model_axis"] == 2


@pytest.mark.backend_independent
@pytest.mark.slow
def test_layout_of_the_vit_family(jax8):
    """DeiT's second head is split as the head; distillation and register tokens, layer scales, the
    extra LayerNorms and the attention-pool probe are replicated; every block kernel is split."""
    deit, siglip = jax8["families"]["deit_registers_clip"], jax8["families"]["siglip"]
    assert {"head/kernel", "head_dist/kernel"} <= set(deit["split"])
    assert {"dist/tokens", "registers/tokens", "pre_norm/gamma", "encoderblock_0/layer_scale_0",
            "encoderblock_11/layer_scale_1"} <= set(deit["replicated"])
    assert {"map_head/probe", "map_head/query/kernel", "fc_norm/gamma"} <= set(siglip["replicated"])
    assert "map_head/Dense_0/kernel" in siglip["split"]
    for info in (deit, siglip):
        for kind in ("query/kernel", "key/kernel", "value/kernel", "out/kernel", "Dense_0/kernel", "Dense_1/kernel"):
            assert sum(p.startswith("encoderblock_") and p.endswith(kind) for p in info["split"]) == 12, kind


@pytest.mark.backend_independent
@pytest.mark.slow
def test_model_parallel_refuses_what_does_not_fit(jax8):
    errors = jax8["errors"]
    assert "mesh_shape (3, 2)" in errors["mesh"] and "8 devices" in errors["mesh"]
    assert "does not divide the heads (2)" in errors["heads"] and "4 devices" in errors["heads"]
    assert "MLP width (66)" in errors["mlp"]
    assert "batch size (15)" in errors["batch"] and "2 replicas" in errors["batch"]


@pytest.mark.backend_independent
@pytest.mark.slow
def test_backup_resumes_under_model_parallel(jax8):
    """TrainingBackup written from sharded arrays loads into a fresh model-parallel model."""
    assert jax8["backup_done"] == 4
    assert jax8["backup_equal"]
    assert jax8["backup_sharded"] == "P(None, 'model')"


@pytest.mark.backend_independent
def test_strategy_choice_from_a_faked_machine():
    from keras_vit.distribute import Machine, strategy_kind

    workers = {"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"type": "worker", "index": 0}}
    assert strategy_kind(Machine(tpu="local", gpus=0, tf_config=None)) == "tpu"
    assert strategy_kind(Machine(tpu="local", gpus=0, tf_config=workers)) == "tpu"
    assert strategy_kind(Machine(tpu=None, gpus=8, tf_config=workers)) == "multi_worker"
    assert strategy_kind(Machine(tpu=None, gpus=2, tf_config=None)) == "mirrored"
    assert strategy_kind(Machine(tpu=None, gpus=1, tf_config=None)) == "default"
    assert strategy_kind(Machine(tpu=None, gpus=0, tf_config={"cluster": {}})) == "default"


@pytest.mark.skipif(backend() != "tensorflow", reason="tf.distribute strategies need the tensorflow backend")
def test_tf_strategy_builds_the_chosen_strategy(monkeypatch):
    import tensorflow as tf

    from keras_vit import distribute

    assert distribute.tf_strategy(distribute.Machine(None, 0, None)) is tf.distribute.get_strategy()
    assert isinstance(distribute.tf_strategy(distribute.Machine(None, 2, None)), tf.distribute.MirroredStrategy)
    calls = []
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver",
                        lambda tpu: calls.append(tpu) or (_ for _ in ()).throw(ValueError("no TPU here")))
    with pytest.raises(ValueError, match="no TPU here"):
        distribute.tf_strategy(distribute.Machine("local", 0, None))
    assert calls == ["local"]


def test_torch_backend_says_what_to_use_instead():
    if backend() != "torch":
        pytest.skip("torch-only message: jax and tensorflow have these engines (tested above)")
    from keras_vit import distribute

    for start in (distribute.data_parallel, distribute.model_parallel, distribute.initialize_multihost):
        with pytest.raises(NotImplementedError) as error:
            start()
        message = str(error.value)
        assert "has no distribution for 'torch'" in message and "model.fit and the keras_vit recipes train on one" in message
        assert "KERAS_BACKEND=jax or tensorflow" in message and "DistributedDataParallel" in message
