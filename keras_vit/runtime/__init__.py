"""Runtime concerns: which device computes, how to compile, float32 exactness, distribution.

Nothing here depends on the model; the layers, the recipes and the tools import it.
"""

import contextlib
import contextvars

import keras


def on_cpu():
    """True when the JAX or TensorFlow backend computes on the CPU (no GPU/TPU default device)."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_physical_devices("GPU")
    return False


# The name scope of every JAX computation keras-vit chooses for a CPU only (the cpu branch of
# `per_platform`): a step lowered for a TPU or GPU holds none (tests/test_lowering.py)
CPU_ONLY_SCOPE = "keras_vit_cpu_only"
_CHOSEN_ON_HOST = contextvars.ContextVar("keras_vit_platform_chosen_on_host", default=False)


def per_platform(*args, cpu, default):
    """`cpu(*args)` where the computation runs on a CPU, `default(*args)` on a GPU or TPU.

    On JAX the choice is made for the platform a jitted step is lowered for, not the tracing host's
    (`jax.lax.platform_dependent`: both are traced, the other platform's branch is dropped when
    lowering), so a step traced on a CPU and lowered for a TPU or GPU holds no CPU-only branch;
    the cpu branch runs under the CPU_ONLY_SCOPE name scope. Inside `platform_chosen_on_host()`,
    and on the other backends, `on_cpu()` chooses when tracing.

    Args:
        *args: the arrays (or pytrees of arrays) both branches take.
        cpu: the computation chosen for a CPU.
        default: the computation chosen for any other platform.

    Returns:
        The chosen branch's result; both branches must return the same shapes and dtypes.
    """
    if keras.backend.backend() != "jax":
        return cpu(*args) if on_cpu() else default(*args)
    import jax

    def scoped(*args):
        with jax.named_scope(CPU_ONLY_SCOPE):
            return cpu(*args)

    if _CHOSEN_ON_HOST.get():
        return scoped(*args) if on_cpu() else default(*args)
    return jax.lax.platform_dependent(*args, cpu=scoped, default=default)


@contextlib.contextmanager
def platform_chosen_on_host():
    """Within it, `per_platform` chooses by `on_cpu()` when tracing instead of per lowered platform.

    For exporters that trace JAX into another format: jax2onnx has no converter for
    `jax.lax.platform_dependent`'s `platform_index`. The artefact then holds the computation chosen
    for the exporting machine, as it did before the choice moved to lowering time;
    keras_vit.export enters it around every trace it makes (the SavedModel's jax2tf too, which
    lowers `platform_index` itself, so that every artefact is made the same way).
    JAX reuses the trace of a function it traced before with the same argument shapes, whatever
    this says: trace a function made inside it (as Keras' exporters do).
    """
    token = _CHOSEN_ON_HOST.set(True)
    try:
        yield
    finally:
        _CHOSEN_ON_HOST.reset(token)


def jit_compile_default(training=True):
    """The `jit_compile` keras-vit measured fastest for a ViT on the current backend and device.

    For `model.compile(jit_compile=...)` where a caller would pass "auto" (Keras' own "auto" turns
    XLA off for TensorFlow on a CPU); the measurements are in benchmarks/README.md:
    - tensorflow: XLA for training; on a CPU oneDNN without XLA for inference, XLA on a GPU; no
      XLA under a strategy of several replicas (an XLA step cannot reach a MirroredStrategy's
      per-device variables: "Trying to access resource ... located in device CPU:1").
    - jax: XLA always (there is no fast eager mode).
    - torch: eager (False), as Keras' "auto"; `torch.compile` stays opt-in.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        return True
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.distribute.get_strategy().num_replicas_in_sync > 1:
            return False
        return bool(training) or not on_cpu()
    return False


def exact_float32(enabled=True):
    """Full float32 (no TF32) for matmuls and convolutions on the current Keras backend.

    On NVIDIA GPUs from Ampere on, JAX, TensorFlow and PyTorch run float32 matmuls and/or
    convolutions on TF32 tensor cores by default (10-bit mantissa), and outputs then differ from
    the official full-float32 ones by ~1e-3. This turns that off so float32 models reproduce the
    official outputs; it changes nothing on CPUs. For speed on GPUs prefer `mixed_bfloat16`.

    Args:
        enabled: True turns TF32 off (exact float32); False turns it back on.

    Returns:
        The name of the Keras backend it set.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest" if enabled else None)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(not enabled)
    elif backend == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = not enabled
        torch.backends.cudnn.allow_tf32 = not enabled
    return backend


__all__ = ["CPU_ONLY_SCOPE", "exact_float32", "jit_compile_default", "on_cpu", "per_platform",
           "platform_chosen_on_host"]
