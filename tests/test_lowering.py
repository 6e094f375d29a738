"""The accelerator code paths, checked without an accelerator: the training and inference steps of
a ViT-B/16 configuration, jitted as `fit` and `predict` jit them (the recipes' optimizer,
mixed_bfloat16, dropout), lowered on this CPU for TPU and CUDA with `jax.export`. The
computations keras-vit picks for a CPU (the gradient barrier, the attention layout)
are chosen per lowered platform (`jax.lax.platform_dependent`, under `runtime.CPU_ONLY_SCOPE`): a
CPU lowering holds them, a TPU or CUDA lowering none, and no lowering calls back to the host."""

import re

import keras
import pytest

import keras_vit
from keras_vit import recipes
from keras_vit.runtime import CPU_ONLY_SCOPE

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax", reason="jax.export lowers JAX steps")


@pytest.fixture(scope="module")
def steps():
    """{"train"|"predict": (jitted step, argument shapes)} of ViT-B/16 at 224 px, batch 8."""
    import jax

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = keras_vit.ViT_B16(classes=10, dropout_rate=0.1)
        recipes.compile_for_finetuning(model, total_steps=10_000, batch_size=512, device_batch_size=256)
        model.optimizer.build(model.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")

    def shapes(variables):
        return [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in variables]

    weights = (shapes(model.trainable_variables), shapes(model.non_trainable_variables))
    images = jax.ShapeDtypeStruct((8, 224, 224, 3), "float32")
    labels = jax.ShapeDtypeStruct((8,), "int32")
    train_state = (*weights, shapes(model.optimizer.variables), shapes(model.metrics_variables))
    # the functions Keras' JAX trainer jits in make_train_function / make_predict_function
    return {"train": (jax.jit(model.train_step, donate_argnums=0), (train_state, (images, labels))),
            "predict": (jax.jit(model.predict_step, ), (weights, (images,)))}


def _lowered(steps, step, platform):
    import jax

    fn, args = steps[step]
    return jax.export.export(fn, platforms=(platform,))(*args).mlir_module()


@pytest.mark.parametrize("step", ["train", "predict"])
def test_accelerator_lowerings_hold_no_cpu_only_branch_and_no_host_callback(steps, step):
    cpu = _lowered(steps, step, "cpu")
    assert CPU_ONLY_SCOPE in cpu  # what the check looks for is there where it belongs
    for platform in ("tpu", "cuda"):
        text = _lowered(steps, step, platform)
        assert CPU_ONLY_SCOPE not in text, platform
        assert not re.search(r"custom_call @\w*callback", text), platform
        assert "stablehlo.dot_general" in text and "bf16" in text, platform  # the step itself, in bfloat16
