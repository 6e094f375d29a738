"""Inspecting a Vision Transformer (paper section 4.5, appendices D.7 and D.8).

Four analyses, each as a pure numpy function plus a model-level helper:

* :func:`attention_rollout` - attention from the output token to the input
  patches (Attention Rollout, paper D.8, Figures 6 and 14).
* :func:`mean_attention_distance` - attention-weighted distance in pixels between
  query and key patches, per layer and head (paper D.7, Figures 7 right and 11).
* :func:`position_embedding_similarity` - cosine similarity of every patch's
  position embedding with all others (Figure 7 centre).
* :func:`embedding_filters` - principal components of the patch-embedding
  projection, as RGB patches (Figure 7 left).

:func:`attention_maps` runs a ViT (found anywhere inside a possibly nested Keras
model) layer by layer and returns the softmax attention of every block;
:func:`inspect_model` draws all four figures into a folder; :func:`add_cli` and
:func:`run_cli` implement ``keras-vit inspect``.

Conventions: attention arrays are ``(B, heads, T, T)`` with rows = queries and
columns = keys; tokens are ``num_prefix_tokens`` prefix tokens (the class token,
for ``classifier="token"``) followed by the ``gh * gw`` patch tokens in row-major
order. Pure functions take and return numpy arrays.
"""

from __future__ import annotations

import math
import os

import numpy as np

from keras_vit.structure import ViTParts, find_vit  # noqa: F401  (public here too)

__all__ = [
    "attention_rollout",
    "upsample_map",
    "mean_attention_distance",
    "position_embedding_similarity",
    "embedding_filters",
    "find_vit",
    "attention_maps",
    "inspect_model",
    "add_cli",
    "run_cli",
]


# --------------------------------------------------------------------------- #
# Input checking helpers
# --------------------------------------------------------------------------- #


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
    if isinstance(grid_size, (int, np.integer)):
        gh = gw = int(grid_size)
    else:
        try:
            gh, gw = (int(v) for v in grid_size)
        except (TypeError, ValueError):
            raise ValueError(
                f"{what} must be an int or a pair (rows, cols), got {grid_size!r}"
            ) from None
    if gh <= 0 or gw <= 0:
        raise ValueError(f"{what} must be positive, got {(gh, gw)}")
    return gh, gw


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


# --------------------------------------------------------------------------- #
# Pure analyses
# --------------------------------------------------------------------------- #


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


def _resize_axis_matrix(n_in, n_out, method):
    """``(n_out, n_in)`` matrix that resamples a 1-D signal (half-pixel centres)."""
    matrix = np.zeros((n_out, n_in))
    # Position of each output sample's centre in input-sample coordinates.
    centres = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    if method == "nearest":
        idx = np.clip(np.floor(centres + 0.5).astype(int), 0, n_in - 1)
        matrix[np.arange(n_out), idx] = 1.0
        return matrix
    centres = np.clip(centres, 0.0, n_in - 1)
    lo = np.floor(centres).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = centres - lo
    rows = np.arange(n_out)
    np.add.at(matrix, (rows, lo), 1.0 - frac)
    np.add.at(matrix, (rows, hi), frac)
    return matrix


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
    rows = _resize_axis_matrix(arr.shape[1], height, method)
    cols = _resize_axis_matrix(arr.shape[2], width, method)
    out = np.einsum("hi,bij,wj->bhw", rows, arr, cols)
    if normalize:
        lo = out.min(axis=(1, 2), keepdims=True)
        span = out.max(axis=(1, 2), keepdims=True) - lo
        out = np.where(span > 0, (out - lo) / np.where(span > 0, span, 1.0), 0.0)
    return out[0] if single else out


def patch_centres(grid_size, patch_size):
    """``(gh * gw, 2)`` pixel coordinates (y, x) of the patch centres, row-major."""
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


# --------------------------------------------------------------------------- #
# Running the ViT found inside a Keras model layer by layer
# --------------------------------------------------------------------------- #

def _resolve_layers(layers, num_layers):
    """Turn ``layers`` (None, int or ints; negatives count from the end) into indices."""
    if layers is None:
        return list(range(num_layers))
    single = isinstance(layers, (int, np.integer)) and not isinstance(layers, bool)
    items = [layers] if single else list(layers)
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, np.integer)):
            raise ValueError(f"layer indices must be ints, got {item!r}")
        if not -num_layers <= item < num_layers:
            raise IndexError(
                f"layer index {item} is out of range: the ViT has {num_layers} encoder "
                f"blocks, valid indices are 0..{num_layers - 1} (or -{num_layers}..-1)"
            )
        out.append(int(item) % num_layers)
    if not out:
        raise ValueError("layers is empty: pass None for all layers or at least one index")
    return out


class _no_grad:
    """Disable autograd tracking on the torch backend (no-op elsewhere)."""

    def __enter__(self):
        import keras

        self._ctx = None
        if keras.backend.backend() == "torch":
            import torch

            self._ctx = torch.no_grad()
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


def _as_image_batch(images, expected_hw, where):
    import keras

    shape = tuple(images.shape)
    if len(shape) == 3:
        images = keras.ops.expand_dims(images, 0)
        shape = (1, *shape)
    if len(shape) != 4 or shape[-1] != 3:
        raise ValueError(
            f"images must have shape (B, H, W, 3) or (H, W, 3) (NHWC, RGB scaled to [-1, 1]), "
            f"got {shape}"
        )
    if tuple(shape[1:3]) != tuple(expected_hw):
        raise ValueError(
            f"images are {shape[1]}x{shape[2]} pixels but the ViT at {where!r} expects "
            f"{expected_hw[0]}x{expected_hw[1]}: resize them first (e.g. "
            "keras.ops.image.resize) or use inspect_model(), which resizes"
        )
    return images


def _run_vit(parts, images, layer_indices):
    """Run the ViT's layers in order; returns (attention per requested layer, final tokens)."""
    import keras

    needed = set(layer_indices)
    last = max(needed)
    attentions = {}
    with _no_grad():
        x = keras.ops.convert_to_tensor(images, dtype="float32")
        x = _as_image_batch(x, parts.image_size, parts.path)
        if parts.resnet is not None:
            x = parts.resnet(x)
        x = parts.embedding(x)
        if parts.cls is not None:
            x = parts.cls(x)
        x = parts.posembed(x)
        for i, block in enumerate(parts.blocks[: last + 1]):
            x, attn = block(x, training=False, return_attention=True)
            if i in needed:
                attentions[i] = keras.ops.convert_to_numpy(keras.ops.cast(attn, "float32"))
        tokens = keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))
    return [attentions[i] for i in layer_indices], tokens


def attention_maps(model, images, layers=None):
    """Softmax attention weights of every (or the chosen) encoder block.

    The ViT is looked up inside ``model`` with :func:`find_vit` (it may be a
    sub-model of a larger Keras model, nested at any depth); its layers are run
    in order (ResNet stem if hybrid, ``embedding``, ``cls`` if any,
    ``posembed_input``, then every ``encoderblock_i`` with
    ``return_attention=True``) in inference mode. Layers of the outer model
    around the ViT (e.g. a user's preprocessing) are not run: pass images as
    the ViT itself receives them.

    Args:
        model: a keras_vit ViT or any Keras model containing exactly one.
        images: ``(B, H, W, 3)`` or ``(H, W, 3)`` array or tensor scaled to [-1, 1]
            (``keras_vit.preprocess_input``). ``H, W`` must equal the ViT's image
            size; otherwise a ValueError is raised (this function does not
            resize, so a map is never computed on an image the model was not
            built for; :func:`inspect_model` resizes for you).
        layers: None for all blocks, or an int / list of ints (negative counts
            from the end). Out-of-range indices raise IndexError naming the
            valid range.

    Returns:
        list (one per requested layer, in the requested order) of float32 numpy
        arrays ``(B, heads, T, T)``; rows are queries and sum to 1; token 0 is
        the class token when the model has one.
    """
    parts = find_vit(model)
    indices = _resolve_layers(layers, parts.num_layers)
    attentions, _ = _run_vit(parts, images, indices)
    return attentions


# --------------------------------------------------------------------------- #
# All four figures for one model
# --------------------------------------------------------------------------- #

FIGURE_NAMES = {
    "rollout": "attention_rollout.png",
    "attention_distance": "attention_distance.png",
    "position_embedding": "position_embedding_similarity.png",
    "embedding_filters": "embedding_filters.png",
}


def _to_numpy(value):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(value))


def inspect_model(model, image, out_dir, patch_size=None, num_components=28, max_rollout_images=4):
    """Compute the four analyses of paper section 4.5 and save them as PNGs in ``out_dir``.

    Writes (each atomically: temp file, then ``os.replace``):

    * ``attention_rollout.png`` - input, rollout overlay, input weighted by the
      rollout (Figure 6), for up to ``max_rollout_images`` images;
    * ``attention_distance.png`` - mean attention distance per head against
      depth, averaged over all given images (Figure 7 right), with the distance
      uniform attention would give as a dashed line;
    * ``position_embedding_similarity.png`` - cosine-similarity tiles (Figure 7 centre);
    * ``embedding_filters.png`` - principal components of the RGB patch
      embedding (Figure 7 left), each labelled with the share of the filters'
      variance it explains. Hybrid models have no RGB embedding filters
      (their embedding is a 1x1 projection of the ResNet feature map): the file
      is not written, its entry is None and a warning says why.

    Args:
        model: a keras_vit ViT, or a model containing one (see :func:`find_vit`).
        image: ``(H, W, 3)`` or ``(B, H, W, 3)`` RGB scaled to [-1, 1] as the model
            takes it (``keras_vit.preprocess_input``). Any ``H, W``: images of
            another size than the model's are resized (bilinear, antialiased,
            ``keras.ops.image.resize``) for the forward pass; the rollout is drawn
            over the original image. Values outside [-1, 1] raise ValueError
            (e.g. raw 0..255 pixels that were not preprocessed).
        out_dir: folder to write into (created if missing).
        patch_size: pixels per token used for the attention distance; None
            takes ``image_size / grid_size`` of the model (for hybrids this
            includes the ResNet's downsampling).
        num_components: embedding-filter components to draw (capped at what the
            kernel has).
        max_rollout_images: how many images the rollout figure shows.

    Returns:
        dict with keys ``"rollout"``, ``"attention_distance"``,
        ``"position_embedding"``, ``"embedding_filters"`` mapping to the written
        paths (``"embedding_filters"`` is None for hybrids).
    """
    import warnings

    import keras

    from keras_vit import plotting

    parts = find_vit(model)
    images = np.asarray(_to_numpy(image), dtype=np.float32)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] != 3 or images.shape[0] == 0:
        raise ValueError(
            f"image must have shape (H, W, 3) or (B, H, W, 3) (RGB), got {np.shape(image)}"
        )
    if not np.all(np.isfinite(images)):
        raise ValueError("image contains NaN or infinite values")
    lo, hi = float(images.min()), float(images.max())
    if lo < -1.01 or hi > 1.01:
        raise ValueError(
            f"image values span [{lo:g}, {hi:g}]; expected RGB scaled to [-1, 1] as the model "
            "takes it: apply keras_vit.preprocess_input to 0..255 pixels first"
        )
    if max_rollout_images < 1:
        raise ValueError(f"max_rollout_images must be >= 1, got {max_rollout_images}")
    model_hw = parts.image_size
    if tuple(images.shape[1:3]) != model_hw:
        resized = keras.ops.image.resize(
            keras.ops.convert_to_tensor(images), model_hw, interpolation="bilinear", antialias=True
        )
        model_images = np.clip(_to_numpy(resized), -1.0, 1.0).astype(np.float32)
    else:
        model_images = images
    if patch_size is None:
        patch_size = (model_hw[0] / parts.grid_size[0], model_hw[1] / parts.grid_size[1])

    attentions, _ = _run_vit(parts, model_images, list(range(parts.num_layers)))
    prefix, grid = parts.num_prefix_tokens, parts.grid_size

    os.makedirs(out_dir, exist_ok=True)
    paths = {key: os.path.join(out_dir, name) for key, name in FIGURE_NAMES.items()}
    tag = f"{parts.container.name}"

    shown = images[:max_rollout_images]
    rollout = attention_rollout([a[: len(shown)] for a in attentions], prefix, grid)
    maps = upsample_map(rollout, shown.shape[1:3], normalize=True)
    source = "class token" if prefix else "mean of all tokens (classifier='gap')"
    plotting.plot_rollout(
        (shown + 1.0) / 2.0, maps, paths["rollout"],
        title=f"{tag}: attention rollout from the {source} to the input",
    )

    distances = mean_attention_distance(attentions, grid, patch_size, prefix)
    tokens = parts.num_tokens
    uniform = mean_attention_distance([np.full((1, 1, tokens, tokens), 1.0 / tokens)], grid, patch_size, prefix)
    plotting.plot_attention_distance(
        distances, paths["attention_distance"], image_size=model_hw[1], uniform=float(uniform[0, 0]),
        title=f"{tag}: mean attention distance ({len(images)} image{'s' * (len(images) > 1)})",
    )

    similarity = position_embedding_similarity(_to_numpy(parts.posembed.pos_embedding), grid, prefix)
    plotting.plot_position_similarity(
        similarity, paths["position_embedding"], title=f"{tag}: position embedding similarity"
    )

    if parts.is_hybrid:
        warnings.warn(
            f"{tag} is a hybrid (ResNet + ViT): its embedding is a "
            f"{parts.embedding.patch_size}x{parts.embedding.patch_size} projection of the ResNet "
            "feature map, so there are no RGB embedding filters to draw; "
            "embedding_filters.png was not written",
            stacklevel=2,
        )
        paths["embedding_filters"] = None
    else:
        kernel = _to_numpy(parts.embedding.kernel)
        p, _, c, d = kernel.shape
        k = min(int(num_components), d, p * p * c)
        filters, variance = embedding_filters(kernel, k, return_variance=True)
        plotting.plot_embedding_filters(
            filters, paths["embedding_filters"], variance=variance,
            title=f"{tag}: RGB embedding filters (first {k} principal components)",
        )
    return paths


# --------------------------------------------------------------------------- #
# keras-vit inspect
# --------------------------------------------------------------------------- #


def add_cli(subparsers):
    """Add the ``inspect`` sub-command to an ``argparse`` sub-parsers object; returns its parser."""
    parser = subparsers.add_parser(
        "inspect",
        help="draw attention rollout, attention distance, position-embedding similarity "
        "and embedding filters (paper section 4.5) as PNGs",
        description="Inspect a ViT as in section 4.5 of the paper: writes attention_rollout.png, "
        "attention_distance.png, position_embedding_similarity.png and embedding_filters.png "
        "(not for hybrids, which have no RGB filters) into --out.",
    )
    parser.add_argument("--model", required=True, help="variant factory name, e.g. ViT_B16 or R50_ViT_B16")
    parser.add_argument("--weights", required=True,
                        help="registry tag or path (.npz, .weights.h5) of the weights to inspect; "
                        "'none' for a randomly initialised model")
    parser.add_argument("--image", required=True, action="append", metavar="PATH",
                        help="image file (repeat for several; all are used for the attention distance)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="model input size in pixels (images are resized to it); default: the variant's")
    parser.add_argument("--out", required=True, help="output folder for the PNGs")
    parser.add_argument("--num-components", type=int, default=28,
                        help="embedding-filter principal components to draw (default 28)")
    parser.set_defaults(func=run_cli)
    return parser


def _load_image(path, size_hw):
    from PIL import Image

    if not os.path.isfile(path):
        raise FileNotFoundError(f"image file not found: {path!r}")
    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB").resize((size_hw[1], size_hw[0]), Image.Resampling.BICUBIC)
            return np.asarray(rgb, dtype=np.float32)
    except OSError as err:
        raise ValueError(f"cannot read {path!r} as an image: {err}") from None


def run_cli(args):
    """Run ``keras-vit inspect`` for parsed ``args`` (see :func:`add_cli`); returns 0 on success."""
    import keras_vit

    name = args.model
    factory = getattr(keras_vit, name, None)
    variants = getattr(keras_vit, "VARIANTS", {})
    if factory is None or not callable(factory) or (variants and name not in variants):
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(variants)}")
    weights = args.weights
    if isinstance(weights, str) and weights.lower() in ("", "none"):
        weights = None
    kwargs = {"weights": weights}
    if args.image_size is not None:
        if args.image_size < 1:
            raise ValueError(f"--image-size must be a positive number of pixels, got {args.image_size}")
        kwargs["image_size"] = args.image_size
    model = factory(**kwargs)
    parts = find_vit(model)
    pixels = np.stack([_load_image(p, parts.image_size) for p in args.image])
    images = np.asarray(keras_vit.preprocess_input(pixels), dtype=np.float32)
    import warnings

    with warnings.catch_warnings():  # the hybrid note is printed below instead
        warnings.filterwarnings("ignore", message=".*no RGB embedding filters.*")
        paths = inspect_model(model, images, args.out, num_components=args.num_components)
    for key, path in paths.items():
        if path is None:
            print(f"{key}: not written ({name} is a hybrid: no RGB embedding filters)")
        else:
            print(f"{key}: {path}")
    return 0
