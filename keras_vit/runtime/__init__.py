"""Runtime concerns: which device computes, how to compile, float32 exactness, distribution.

Nothing here depends on the model; the layers, the recipes and the tools import it.
"""

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


__all__ = ["exact_float32", "jit_compile_default", "on_cpu"]
