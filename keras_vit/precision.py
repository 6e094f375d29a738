"""Float32 exactness on GPUs.

On NVIDIA GPUs from Ampere on, JAX, TensorFlow and PyTorch run float32 matmuls and/or
convolutions on TF32 tensor cores by default (10-bit mantissa): outputs then differ from the
official full-float32 ones by ~1e-3. `exact_float32()` turns that off for the current backend so
float32 models reproduce the official outputs to ~1e-6; it changes nothing on CPUs. For speed
on GPUs, prefer the `mixed_bfloat16` policy over TF32.
"""

import keras


def exact_float32(enabled=True):
    """Use full float32 (no TF32) for matmuls and convolutions on the current Keras backend."""
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
