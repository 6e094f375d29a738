"""The accelerator code paths, checked without an accelerator: the training and inference steps of a
ViT-B/16 configuration (two of its blocks: the blocks are alike, and each lowers the same branches), jitted as Keras' `fit` and `predict` jit them (the recipes' optimizers and
gradient accumulation, mixed_bfloat16, dropout, stochastic depth, remat), lowered on this CPU for TPU
and CUDA with `jax.jit(...).trace(...).lower(lowering_platforms=...)`. The computations keras-vit
picks for a CPU (the gradient fusion barrier, the attention layout, the remat that saves something on
XLA:CPU) are chosen per lowered platform (`runtime.per_platform`, the CPU branch under
`runtime.CPU_ONLY_SCOPE`): a CPU lowering holds them, a TPU or CUDA lowering none, and no lowering
calls back to the host.
Only shapes are used: the model's and the optimizer's variables are declared, never computed."""

import contextlib
import re

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import recipes
from keras_vit.configs import get_variant
from keras_vit.runtime import CPU_ONLY_SCOPE, per_platform, platform_chosen_on_host

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax",
                                reason="lowers JAX's jitted steps for other platforms (lowering_platforms); "
                                       "the other backends have no such lowering")

ACCELERATORS = ("tpu", "cuda")
BATCH = 2  # the images' shapes are what matters: 224 px, 197 tokens
BLOCKS = 2  # of ViT-B/16's twelve: a block's lowering is the same at any depth (tracing twelve took 4 times as long)
# a host callback (jax.pure_callback, io_callback, jax.debug.print) or a host transfer in lowered code
HOST_CALLBACK = re.compile(r"custom_call @\w*callback|stablehlo\.(send|recv|infeed|outfeed)\b")
DROP_PATH_MASK = re.compile(rf"tensor<{BATCH}x1x1xi1>")
# recipe -> (compile function, model arguments): fine-tuning's SGD with momentum, pre-training's AdamW
# with remat (its drop-path masks drawn outside the recomputation); both accumulate the gradients of two
# device batches, both with stochastic depth (DeiT's recipes)
RECIPES = {"finetuning": (recipes.compile_for_finetuning, {"drop_path_rate": 0.1}),
           "pretraining": (recipes.compile_for_pretraining, {"remat": True, "drop_path_rate": 0.1})}


@contextlib.contextmanager
def _declared_only():
    """Variables created inside have shapes and dtypes but no values (Keras' deferred initialisation),
    and are taken off Keras' list of variables to initialise, so no later scope computes them."""
    from keras.src.backend.common import global_state

    with keras.StatelessScope(initialize_variables=False):
        yield
    pending = global_state.get_global_attribute("uninitialized_variables")
    if pending:
        global_state.set_global_attribute("uninitialized_variables", [])


def _abstract(variables):
    import jax

    return [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in variables]


@pytest.fixture(scope="module", params=list(RECIPES))
def steps(request):
    """{"train"|"predict": (jitted step, abstract arguments)} of ViT-B/16 (BLOCKS blocks) at 224 px compiled with a
    recipe and built as `fit` builds it (`_symbolic_build`: shapes only)."""
    import jax

    compile_recipe, options = RECIPES[request.param]
    images = jax.ShapeDtypeStruct((BATCH, 224, 224, 3), "float32")
    labels = jax.ShapeDtypeStruct((BATCH,), "int32")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with _declared_only():
            arch = {**get_variant("ViT_B16").build_args(), "num_layers": BLOCKS}
            model = keras_vit.VisionTransformer(**arch, classes=10, dropout_rate=0.1, **options)
        assert model.get_layer(f"encoderblock_{BLOCKS - 1}").drop_path_rate == 0.1
        compile_recipe(model, total_steps=10_000, batch_size=2 * BATCH, device_batch_size=BATCH)
        with _declared_only():
            model._symbolic_build(data_batch=(keras.KerasTensor(images.shape, "float32"),
                                              keras.KerasTensor(labels.shape, "int32")))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    weights = (_abstract(model.trainable_variables), _abstract(model.non_trainable_variables))
    state = (*weights, _abstract(model.optimizer.variables), _abstract(model.metrics_variables))
    # the functions Keras' JAX trainer jits in make_train_function / make_predict_function
    return {"train": (lambda: jax.jit(lambda *a: model.train_step(*a), donate_argnums=0), (state, (images, labels))),
            "predict": (lambda: jax.jit(lambda *a: model.predict_step(*a)), (weights, (images,)))}


def _traced(steps, step, host=None):
    """The step traced on this machine (kept for the next call), or traced where keras-vit takes
    the host for `host` (`jax.default_backend`)."""
    import jax

    make, args = steps[step]
    if host is None:
        if (step, "traced") not in steps:
            steps[step, "traced"] = make().trace(*args)
        return steps[step, "traced"]
    with _pretending(jax, "default_backend", lambda: host):
        return make().trace(*args)


@contextlib.contextmanager
def _pretending(owner, name, value):
    real = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, real)


@pytest.mark.parametrize("step", ["train", "predict"])
def test_accelerator_lowerings_hold_no_cpu_only_branch_and_no_host_callback(steps, step):
    traced = _traced(steps, step)
    # what the check looks for is there where it belongs (named scopes are in the debug locations)
    assert CPU_ONLY_SCOPE in traced.lower(lowering_platforms=("cpu",)).as_text(debug_info=True)
    for platform in ACCELERATORS:
        text = traced.lower(lowering_platforms=(platform,)).as_text(debug_info=True)
        assert CPU_ONLY_SCOPE not in text, platform
        assert not HOST_CALLBACK.search(text), (platform, HOST_CALLBACK.search(text).group())
        assert "stablehlo.dot_general" in text and "bf16" in text, platform  # the step itself, in bfloat16
        # training: the per-image drop-path masks (BATCH, 1, 1) are drawn in the step
        assert (DROP_PATH_MASK.search(text) is not None) == (step == "train"), platform


@pytest.mark.parametrize("steps", ["pretraining"], indirect=True)  # remat: every choice keras-vit makes
@pytest.mark.parametrize("step", ["train", "predict"])
def test_no_choice_depends_on_the_tracing_host(steps, step, monkeypatch):
    """The TPU lowering traced here equals the one traced where keras-vit takes the host for a TPU:
    a choice made with `on_cpu()` at trace time (not through `per_platform`) would tell them apart.
    Keras' own CPU-only fix of argmax for -0.0 (the accuracy metric's) stays as on this host: Keras'
    choice, not keras-vit's (harmless on a TPU: one select on the logits)."""
    import jax
    from keras.src.backend.jax import numpy as keras_jax_numpy

    truth = jax.default_backend() == "cpu"  # Keras' test for a traced value, taken before pretending
    monkeypatch.setattr(keras_jax_numpy, "_uses_cpu", lambda x: truth)
    here, there = (_traced(steps, step, host).lower(lowering_platforms=("tpu",)).as_text() for host in (None, "tpu"))
    assert _ssa_names_dropped(there) == _ssa_names_dropped(here)


def _ssa_names_dropped(text):
    """The lines of StableHLO `text` with its value names (%5771, %cst_12: numbered in the order
    they are printed) left out."""
    return re.sub(r"%[\w#:]+", "%", text).splitlines()


def test_the_host_callback_check_finds_a_callback():
    import jax

    def step(x):
        return jax.pure_callback(lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1

    text = jax.jit(step).trace(jax.ShapeDtypeStruct((3,), "float32")).lower(lowering_platforms=("cpu",)).as_text()
    assert HOST_CALLBACK.search(text)


def test_export_tracing_chooses_on_the_host():
    """jax2onnx has no converter for `platform_index`: inside `platform_chosen_on_host` the
    choice is made when tracing, for this machine (a CPU), and the trace holds no platform_index."""
    import jax

    def step():  # a new function each time: JAX reuses the trace of one it has seen
        return lambda x: per_platform(x, cpu=lambda t: t * 2, default=lambda t: t * 3)

    x = np.ones(3, "float32")
    assert "platform_index" in str(jax.make_jaxpr(step())(x))
    with platform_chosen_on_host():
        jaxpr = str(jax.make_jaxpr(step())(x))
        np.testing.assert_array_equal(jax.jit(step())(x), 2 * x)
    assert "platform_index" not in jaxpr and "mul" in jaxpr, jaxpr
    np.testing.assert_array_equal(jax.jit(step())(x), 2 * x)  # chosen per platform again: the CPU's


@pytest.mark.parametrize("step", ["train", "predict"])
def test_a_naflex_step_lowers_for_accelerators_masking_the_padding(step):
    """A NaFlex model's fine-tuning and predict steps (ViT-B/16 widths, two blocks, 256-token sequences):
    lowered for TPU and CUDA with no CPU-only branch and no host callback; the padding's mask is in the
    lowering (`mask_keys`' fill of the masked logits). cuDNN's own path (sequence lengths) needs cuDNN to lower:
    tests/test_naflex.py runs it through JAX's XLA implementation."""
    import jax

    batch = {"patches": jax.ShapeDtypeStruct((BATCH, 256, 768), "float32"),
             "patch_coord": jax.ShapeDtypeStruct((BATCH, 256, 2), "int32"),
             "patch_valid": jax.ShapeDtypeStruct((BATCH, 256), "bool")}
    labels = jax.ShapeDtypeStruct((BATCH,), "int32")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with _declared_only():
            model = keras_vit.VisionTransformer(num_layers=2, classes=10, classifier="map", naflex=True)
        recipes.compile_for_finetuning(model, total_steps=10_000, batch_size=BATCH, device_batch_size=BATCH)
        with _declared_only():
            model._symbolic_build(data_batch=({k: keras.KerasTensor(v.shape, v.dtype) for k, v in batch.items()},
                                              keras.KerasTensor(labels.shape, "int32")))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    weights = (_abstract(model.trainable_variables), _abstract(model.non_trainable_variables))
    if step == "train":
        state = (*weights, _abstract(model.optimizer.variables), _abstract(model.metrics_variables))
        traced = jax.jit(lambda *a: model.train_step(*a)).trace(state, (batch, labels))
    else:
        traced = jax.jit(lambda *a: model.predict_step(*a)).trace(weights, (batch,))
    for platform in ACCELERATORS:
        text = traced.lower(lowering_platforms=(platform,)).as_text(debug_info=True)
        assert CPU_ONLY_SCOPE not in text, platform
        assert not HOST_CALLBACK.search(text), platform
        assert "-1.000000e+30" in text and "bf16" in text, platform  # mask_keys' fill: the padding masked
