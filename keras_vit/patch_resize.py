"""FlexiViT's patch-embedding resize (Beyer et al., 2023, "FlexiViT: One Model for All Patch Sizes",
section 3.4): pure numpy."""

import numpy as np


def bilinear_resize_matrix(old, new):
    """(new, old) matrix of 1D bilinear resizing with half-pixel centres, antialiased when shrinking.

    Output pixel i samples the input at x = (i + 0.5) * old / new - 0.5 with a triangle kernel
    stretched by old / new when shrinking; each row is normalised to sum to 1 (at the borders this
    is the same as clamping x to the image when enlarging).
    """
    scale = min(new / old, 1.0)
    x = (np.arange(new) + 0.5) * (old / new) - 0.5
    weights = np.maximum(0.0, 1.0 - np.abs(x[:, None] - np.arange(old)[None, :]) * scale)
    return weights / weights.sum(axis=1, keepdims=True)


def resize_patch_embedding(kernel, new_patch_size):
    """Resizes a (P, P, C, D) patch-embedding kernel to (P', P', C, D) by the pseudo-inverse resize.

    With B the (P'^2, P^2) matrix that resizes a P x P patch bilinearly to P' x P' (each channel),
    the new kernel is w' = pinv(B^T) w, the least-norm solution of <x, w> = <B x, w'> for all x:
    when enlarging (P' >= P) a patch resized up gives exactly its old token; when shrinking, w' is
    the least-squares best fit.

    Args:
        kernel: array (P, P, C, D), e.g. the official `embedding/kernel`.
        new_patch_size: P', a positive int.
    Returns:
        float array (P', P', C, D) in kernel's dtype (computed in float64).
    """
    kernel = np.asarray(kernel)
    if kernel.ndim != 4 or kernel.shape[0] != kernel.shape[1]:
        raise ValueError(f"a patch-embedding kernel must have shape (P, P, C, D), got {kernel.shape}")
    if isinstance(new_patch_size, bool) or not isinstance(new_patch_size, (int, np.integer)) or new_patch_size < 1:
        raise ValueError(f"new_patch_size must be a positive int, got {new_patch_size!r}")
    old, new = kernel.shape[0], int(new_patch_size)
    if old == new:
        return kernel.copy()
    r = bilinear_resize_matrix(old, new)
    resize = np.kron(r, r)  # (new*new, old*old) on row-major flattened patches
    flat = kernel.reshape(old * old, -1).astype(np.float64)
    out = np.linalg.pinv(resize.T) @ flat
    return out.reshape(new, new, *kernel.shape[2:]).astype(kernel.dtype)
