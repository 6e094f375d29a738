"""The analyses of paper section 4.5 as pure numpy functions: attention rollout (D.8), mean
attention distance (D.7), position-embedding similarity and the patch-embedding filters (Figure 7).

Conventions: attention arrays are ``(B, heads, T, T)`` with rows = queries and columns = keys;
tokens are ``num_prefix_tokens`` prefix tokens (the class token, for ``classifier="token"``)
followed by the ``gh * gw`` patch tokens in row-major order.
"""

import math

import numpy as np

from keras_vit.configs import pair
from keras_vit.interpolation import resize_2d


def _grid_pair(grid_size, num_patches=None, what="grid_size"):
    """Return ``(gh, gw)`` from an int, a pair, or (if None) a square ``num_patches``."""
    if grid_size is None:
        if num_patches is None:
            raise ValueError(f"{what} is required")
        side = int(round(math.sqrt(num_patches)))
        if side * side != num_patches:
            raise ValueError(
                f"cannot infer a square patch grid from {num_patches} patch tokens; "
                f"pass {what}=(rows, cols) explicitly"
            )
        return side, side
    return pair(grid_size, what)


def _check_prefix(num_prefix_tokens):
    if isinstance(num_prefix_tokens, bool) or not isinstance(
        num_prefix_tokens, (int, np.integer)
    ):
        raise ValueError(
            f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens!r}"
        )
    if num_prefix_tokens < 0:
        raise ValueError(
            f"num_prefix_tokens must be a non-negative int, got {num_prefix_tokens}"
        )
    return int(num_prefix_tokens)


def _stack_attentions(attentions):
    """Turn a list of per-layer attention arrays into one ``(L, B, H, T, T)`` array.

    Accepts a list/tuple of ``(B, H, T, T)`` (or ``(H, T, T)`` for one image)
    arrays, or an already stacked ``(L, B, H, T, T)`` array. Returns the stacked
    float64 array and whether the batch axis was added (single image).
    """
    if isinstance(attentions, np.ndarray) and attentions.ndim == 5:
        layers = [attentions[i] for i in range(attentions.shape[0])]
    elif isinstance(attentions, (list, tuple)):
        layers = list(attentions)
    else:
        raise ValueError(
            "attentions must be a list of per-layer arrays of shape (B, heads, T, T) "
            "(or (heads, T, T) for one image), or one array of shape "
            f"(layers, B, heads, T, T); got {type(attentions).__name__}"
            + (f" of shape {np.shape(attentions)}" if hasattr(attentions, "shape") else "")
        )
    if not layers:
        raise ValueError("attentions is empty: expected at least one layer")
    arrays = [np.asarray(a, dtype=np.float64) for a in layers]
    ndims = {a.ndim for a in arrays}
    if ndims == {3}:
        arrays = [a[None] for a in arrays]
        single = True
    elif ndims == {4}:
        single = False
    else:
        raise ValueError(
            "every layer's attention must have shape (B, heads, T, T) (or all "
            f"(heads, T, T)); got shapes {[a.shape for a in arrays]}"
        )
    shape0 = arrays[0].shape
    for i, a in enumerate(arrays):
        if a.shape[-1] != a.shape[-2]:
            raise ValueError(
                f"layer {i} attention must be square over tokens (..., T, T), got {a.shape}"
            )
        if a.shape != shape0:
            raise ValueError(
                f"all layers must have the same attention shape; layer 0 has {shape0}, "
                f"layer {i} has {a.shape}"
            )
    stacked = np.stack(arrays)
    if not np.all(np.isfinite(stacked)):
        raise ValueError("attentions contain NaN or infinite values")
    if np.any(stacked < 0):
        raise ValueError(
            "attentions contain negative values: expected softmax attention weights"
        )
    return stacked, single


def _check_tokens(num_tokens, num_prefix_tokens, grid_size, what="the attention"):
    num_patches = num_tokens - num_prefix_tokens
    if num_patches <= 0:
        raise ValueError(
            f"{what} has {num_tokens} tokens, not more than num_prefix_tokens="
            f"{num_prefix_tokens}"
        )
    if grid_size is None:
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(
                f"{what} has {num_tokens} tokens; minus num_prefix_tokens="
                f"{num_prefix_tokens} that leaves {num_patches} patch tokens, which is not a "
                "square grid: pass grid_size=(rows, cols), and check num_prefix_tokens "
                "(1 with a class token, 0 for classifier='gap')"
            )
    gh, gw = _grid_pair(grid_size, num_patches)
    if gh * gw != num_patches:
        raise ValueError(
            f"grid_size {(gh, gw)} has {gh * gw} patches but {what} has "
            f"{num_tokens} tokens - {num_prefix_tokens} prefix = {num_patches} patch tokens"
        )
    return gh, gw


def attention_rollout(attentions, num_prefix_tokens=1, grid_size=None):
    """Attention Rollout (Abnar & Zuidema 2020; ViT paper appendix D.8).

    For every layer the attention is averaged over heads, the identity is added
    (the residual connection) and each row is renormalised to sum to one; the
    resulting matrices are multiplied through the layers, first layer rightmost:
    ``R = Â_L @ ... @ Â_1``. ``R[q, k]`` is how much of token ``k`` of the input
    reaches token ``q`` of the output.

    The map is read off the row of the output token:

    * ``num_prefix_tokens >= 1`` (``classifier="token"``): the class token's row
      (token 0), restricted to the patch tokens.
    * ``num_prefix_tokens == 0`` (``classifier="gap"``, no class token): the
      output is the mean of all tokens, so the map is the mean of all rows of
      ``R`` (the rollout of the pooled representation), over the patch tokens.

    Args:
        attentions: list of per-layer softmax attention arrays ``(B, heads, T, T)``
            (first layer first), or ``(heads, T, T)`` arrays for one image, or one
            ``(layers, B, heads, T, T)`` array. Rows must be queries.
        num_prefix_tokens: number of non-patch tokens before the patches (1 for
            the class token, 0 for ``classifier="gap"``).
        grid_size: ``(gh, gw)`` patch grid or an int for a square one; ``None``
            infers a square grid from the number of patch tokens.

    Returns:
        ``(B, gh, gw)`` float array (``(gh, gw)`` for per-image ``(heads, T, T)``
        input) of rollout weights. They are not rescaled: for a class-token model
        they sum to ``1 - R[0, 0]`` (the weight of the class token's own input is
        left out); for ``"gap"`` they sum to 1. Use :func:`upsample_map` (which can
        rescale to [0, 1]) to bring them to the image.
    """
    num_prefix_tokens = _check_prefix(num_prefix_tokens)
    stacked, single = _stack_attentions(attentions)
    num_layers, batch, _, num_tokens, _ = stacked.shape
    gh, gw = _check_tokens(num_tokens, num_prefix_tokens, grid_size)

    eye = np.eye(num_tokens)
    rollout = np.broadcast_to(eye, (batch, num_tokens, num_tokens)).copy()
    for layer in range(num_layers):
        fused = stacked[layer].mean(axis=1) + eye  # (B, T, T)
        fused /= fused.sum(axis=-1, keepdims=True)
        rollout = fused @ rollout
    if num_prefix_tokens > 0:
        weights = rollout[:, 0, num_prefix_tokens:]
    else:
        weights = rollout.mean(axis=1)
    maps = weights.reshape(batch, gh, gw)
    return maps[0] if single else maps


def upsample_map(map, image_hw, method="bilinear", normalize=False):  # noqa: A002
    """Resize a patch-grid map to image pixels.

    Args:
        map: ``(gh, gw)`` or ``(B, gh, gw)`` array (e.g. from :func:`attention_rollout`).
        image_hw: target ``(height, width)`` in pixels (an int for square).
        method: ``"bilinear"`` (half-pixel centres, edges clamped: every patch's
            value sits at the patch centre) or ``"nearest"`` (each patch becomes a
            constant block; exact ``np.kron`` when the size is a multiple).
        normalize: if True, rescale each map linearly to [0, 1] (a constant map
            becomes all zeros).

    Returns:
        ``(H, W)`` or ``(B, H, W)`` float array.
    """
    arr = np.asarray(map, dtype=np.float64)
    if arr.ndim not in (2, 3):
        raise ValueError(f"map must have shape (gh, gw) or (B, gh, gw), got {arr.shape}")
    if method not in ("bilinear", "nearest"):
        raise ValueError(f"method must be 'bilinear' or 'nearest', got {method!r}")
    height, width = _grid_pair(image_hw, what="image_hw")
    single = arr.ndim == 2
    if single:
        arr = arr[None]
    kind = "nearest" if method == "nearest" else "linear"
    out = np.moveaxis(resize_2d(np.moveaxis(arr, 0, -1), (height, width), align_corners=False, method=kind), -1, 0)
    if normalize:
        lo = out.min(axis=(1, 2), keepdims=True)
        span = out.max(axis=(1, 2), keepdims=True) - lo
        out = np.where(span > 0, (out - lo) / np.where(span > 0, span, 1.0), 0.0)
    return out[0] if single else out


def patch_centres(grid_size, patch_size):
    """``(gh * gw, 2)`` pixel coordinates (y, x) of the patch centres, row-major.

    Args:
        grid_size: ``(gh, gw)`` (or one int for a square grid).
        patch_size: pixels per token, int or ``(ph, pw)``.
    """
    gh, gw = _grid_pair(grid_size)
    ph, pw = _pair_float(patch_size, "patch_size")
    ys, xs = np.meshgrid(
        (np.arange(gh) + 0.5) * ph, (np.arange(gw) + 0.5) * pw, indexing="ij"
    )
    return np.stack([ys.ravel(), xs.ravel()], axis=-1)


def _pair_float(value, what):
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool
    ):
        pair = (float(value), float(value))
    else:
        try:
            pair = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a number or a pair, got {value!r}") from None
        if len(pair) != 2:
            raise ValueError(f"{what} must be a number or a pair, got {value!r}")
    if min(pair) <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return pair


def mean_attention_distance(attentions, grid_size, patch_size, num_prefix_tokens=1):
    """Mean attention distance in pixels per layer and head (paper D.7, Figure 11).

    For each query patch, the distance to every key patch (between patch centres,
    in pixels) is weighted by the attention the query pays to that key; this is
    averaged over query patches and over images. Prefix tokens (class token) are
    excluded both as queries and as keys, and each query's attention is
    renormalised over the patch keys so the weights sum to one. Query rows that
    put (numerically) all their weight on prefix tokens carry no spatial
    information and are left out of the average.

    Args:
        attentions: list of per-layer ``(B, heads, T, T)`` arrays (or ``(heads, T, T)``,
            or a stacked ``(layers, B, heads, T, T)`` array).
        grid_size: ``(gh, gw)`` or int.
        patch_size: pixels per patch, int or ``(ph, pw)``. For hybrid models this
            is the total downsampling from pixels to tokens (ResNet stride times
            the patch size), i.e. ``image_size / grid_size``.
        num_prefix_tokens: 1 for a class-token model, 0 for ``classifier="gap"``.

    Returns:
        ``(layers, heads)`` float array of distances in pixels.
    """
    num_prefix_tokens = _check_prefix(num_prefix_tokens)
    stacked, _ = _stack_attentions(attentions)
    num_tokens = stacked.shape[-1]
    gh, gw = _check_tokens(num_tokens, num_prefix_tokens, grid_size)
    centres = patch_centres((gh, gw), patch_size)
    dist = np.sqrt(((centres[:, None, :] - centres[None, :, :]) ** 2).sum(-1))  # (N, N)

    patches = stacked[..., num_prefix_tokens:, num_prefix_tokens:]  # (L, B, H, N, N)
    mass = patches.sum(axis=-1)  # (L, B, H, N)
    valid = mass > 1e-12
    weighted = (patches * dist).sum(axis=-1) / np.where(valid, mass, 1.0)
    count = valid.sum(axis=(1, 3))  # (L, H)
    total = np.where(valid, weighted, 0.0).sum(axis=(1, 3))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def position_embedding_similarity(pos_embedding, grid_size=None, num_prefix_tokens=1):
    """Cosine similarity between the position embeddings of all patches (Figure 7 centre).

    Args:
        pos_embedding: ``(1, T, D)`` or ``(T, D)`` learned position embedding
            (``posembed_input.pos_embedding``), prefix tokens first.
        grid_size: ``(gh, gw)`` or int; ``None`` infers a square grid.
        num_prefix_tokens: leading non-patch rows to drop (1 with a class token).

    Returns:
        ``(gh, gw, gh, gw)`` array; ``[r, c]`` is the tile for the patch in row
        ``r``, column ``c``: its cosine similarity with every patch. A zero
        embedding vector has similarity 0 with everything.
    """
    num_prefix_tokens = _check_prefix(num_prefix_tokens)
    emb = np.asarray(pos_embedding, dtype=np.float64)
    if emb.ndim == 3 and emb.shape[0] == 1:
        emb = emb[0]
    if emb.ndim != 2:
        raise ValueError(
            f"pos_embedding must have shape (1, T, D) or (T, D), got {np.shape(pos_embedding)}"
        )
    gh, gw = _check_tokens(emb.shape[0], num_prefix_tokens, grid_size, "the position embedding")
    patches = emb[num_prefix_tokens:]
    norms = np.linalg.norm(patches, axis=-1, keepdims=True)
    unit = patches / np.where(norms > 0, norms, 1.0)
    sim = unit @ unit.T
    return sim.reshape(gh, gw, gh, gw)


def embedding_filters(kernel, num_components=28, normalize=True, return_variance=False):
    """Principal components of the patch-embedding filters (Figure 7 left).

    The embedding projects each flattened ``P x P x C`` patch to ``D`` dimensions:
    its kernel holds ``D`` filters of ``P*P*C`` values. PCA over those ``D``
    filters (centred on the mean filter) gives the directions in patch space
    that the embedding spans most; each is reshaped back to a ``P x P x C``
    image. Component signs are fixed so that the entry of largest magnitude is
    positive; with ``normalize`` (default) every component is then rescaled
    linearly to [0, 1] for display (a constant component becomes 0.5).

    Hybrid models (ResNet + ViT) embed a CNN feature map with a 1x1 projection:
    their kernel has as many input channels as the ResNet's output, so there are
    no RGB filters to show and a ValueError is raised.

    Args:
        kernel: ``(P, P, C, D)`` patch-embedding kernel (``embedding.kernel``),
            flattened row-major as ``(P*P*C, D)`` like the patches.
        num_components: how many leading components to return (at most
            ``min(D, P*P*C)``).
        normalize: rescale each component to [0, 1] for display; if False the
            raw unit-norm components are returned.
        return_variance: also return the fraction of variance each component
            explains.

    Returns:
        ``(k, P, P, C)`` float array, in [0, 1] if ``normalize`` (and a ``(k,)`` array of explained
        variance ratios if ``return_variance``).
    """
    w = np.asarray(kernel, dtype=np.float64)
    if w.ndim != 4:
        raise ValueError(
            f"kernel must be the patch-embedding kernel of shape (P, P, C, D), got {w.shape}"
        )
    ph, pw, channels, dim = w.shape
    if channels not in (1, 3):
        raise ValueError(
            f"the embedding kernel takes {channels} input channels (shape {w.shape}), "
            "not RGB (3) or grayscale (1): this is a hybrid model whose embedding is a "
            f"{ph}x{pw} projection of a ResNet feature map, so RGB embedding filters "
            "do not exist for it"
        )
    max_components = min(dim, ph * pw * channels)
    if isinstance(num_components, bool) or not isinstance(num_components, (int, np.integer)):
        raise ValueError(f"num_components must be an int, got {num_components!r}")
    if not 1 <= num_components <= max_components:
        raise ValueError(
            f"num_components must be between 1 and {max_components} "
            f"(min of D={dim} and P*P*C={ph * pw * channels}), got {num_components}"
        )
    filters = w.reshape(ph * pw * channels, dim).T  # (D, P*P*C): one filter per row
    centred = filters - filters.mean(axis=0, keepdims=True)
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    comps = vt[:num_components]
    biggest = np.argmax(np.abs(comps), axis=1)
    signs = np.sign(comps[np.arange(num_components), biggest])
    comps = comps * np.where(signs == 0, 1.0, signs)[:, None]
    if normalize:
        lo = comps.min(axis=1, keepdims=True)
        span = comps.max(axis=1, keepdims=True) - lo
        comps = np.where(span > 0, (comps - lo) / np.where(span > 0, span, 1.0), 0.5)
    images = comps.reshape(num_components, ph, pw, channels)
    if return_variance:
        var = singular**2
        ratio = var / var.sum() if var.sum() > 0 else np.zeros_like(var)
        return images, ratio[:num_components]
    return images
