"""All four figures of paper section 4.5 for one model, written as PNGs into a folder."""

import os

import numpy as np

from keras_vit.inspection import plots
from keras_vit.inspection.capture import _run_vit, _to_numpy
from keras_vit.inspection.maps import (
    attention_rollout,
    embedding_filters,
    mean_attention_distance,
    position_embedding_similarity,
    upsample_map,
)
from keras_vit.preprocessing import input_scaling
from keras_vit.structure import find_vit

FIGURE_NAMES = {
    "rollout": "attention_rollout.png",
    "attention_distance": "attention_distance.png",
    "position_embedding": "position_embedding_similarity.png",
    "embedding_filters": "embedding_filters.png",
}


def inspect_model(model, image, out_dir, patch_size=None, num_components=28, max_rollout_images=4, input_mode="vit"):
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
        input_mode: the `keras_vit.preprocess_input` mode `image` was scaled with ("vit": [-1, 1];
            "imagenet", "clip": per-channel mean and std): the range checked, and undone to draw.

    Returns:
        dict with keys ``"rollout"``, ``"attention_distance"``,
        ``"position_embedding"``, ``"embedding_filters"`` mapping to the written
        paths (``"embedding_filters"`` is None for hybrids).
    """
    parts = find_vit(model)
    images, scale, offset = _checked_images(image, input_mode)
    if max_rollout_images < 1:
        raise ValueError(f"max_rollout_images must be >= 1, got {max_rollout_images}")
    model_hw = parts.image_size
    model_images = _at_model_size(images, model_hw, offset, 255 * scale + offset)
    if patch_size is None:
        patch_size = (model_hw[0] / parts.grid_size[0], model_hw[1] / parts.grid_size[1])

    attentions, _ = _run_vit(parts, model_images, list(range(parts.num_layers)))

    os.makedirs(out_dir, exist_ok=True)
    paths = {key: os.path.join(out_dir, name) for key, name in FIGURE_NAMES.items()}
    tag = f"{parts.container.name}"
    _draw_rollout(parts, attentions, images[:max_rollout_images], scale, offset, paths["rollout"], tag)
    _draw_attention_distance(parts, attentions, len(images), patch_size, paths["attention_distance"], tag)
    paths["position_embedding"] = _draw_position_similarity(parts, paths["position_embedding"], tag)
    paths["embedding_filters"] = _draw_embedding_filters(parts, num_components, paths["embedding_filters"], tag)
    return paths


def _checked_images(image, input_mode):
    """(images (B, H, W, 3) float32, scale, offset of input_mode): `image` as a batch, checked to be
    finite RGB in the range preprocess_input's `input_mode` gives 0..255 pixels."""
    images = np.asarray(_to_numpy(image), dtype=np.float32)
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[-1] != 3 or images.shape[0] == 0:
        raise ValueError(
            f"image must have shape (H, W, 3) or (B, H, W, 3) (RGB), got {np.shape(image)}"
        )
    if not np.all(np.isfinite(images)):
        raise ValueError("image contains NaN or infinite values")
    scale, offset = (np.asarray(v, np.float32) for v in input_scaling(input_mode))
    bottom, top = offset, 255 * scale + offset  # per channel: what 0 and 255 become
    lo, hi = float(images.min()), float(images.max())
    if lo < bottom.min() - 0.01 or hi > top.max() + 0.01:
        raise ValueError(
            f"image values span [{lo:g}, {hi:g}]; expected RGB scaled as the model takes it "
            f"(preprocess_input mode {input_mode!r}: [{bottom.min():g}, {top.max():g}]): apply "
            "keras_vit.preprocess_input to 0..255 pixels first"
        )
    return images, scale, offset


def _at_model_size(images, model_hw, bottom, top):
    """`images` resized to the model's (bilinear, antialiased) and clipped to [bottom, top] per channel;
    as they are when they have its size."""
    import keras

    if tuple(images.shape[1:3]) == model_hw:
        return images
    resized = keras.ops.image.resize(
        keras.ops.convert_to_tensor(images), model_hw, interpolation="bilinear", antialias=True
    )
    return np.clip(_to_numpy(resized), bottom, top).astype(np.float32)


def _draw_rollout(parts, attentions, shown, scale, offset, path, tag):
    """Figure 6: the attention rollout of the images `shown` (the first of the batch), over them."""
    prefix, grid = parts.num_prefix_tokens, parts.grid_size
    rollout = attention_rollout([a[: len(shown)] for a in attentions], prefix, grid)
    maps = upsample_map(rollout, shown.shape[1:3], normalize=True)
    source = "class token" if prefix else "mean of all tokens (classifier='gap')"
    plots.plot_rollout(
        (shown - offset) / scale / 255.0, maps, path,
        title=f"{tag}: attention rollout from the {source} to the input",
    )


def _draw_attention_distance(parts, attentions, num_images, patch_size, path, tag):
    """Figure 7 right: each head's mean attention distance over the `num_images` images against depth."""
    prefix, grid = parts.num_prefix_tokens, parts.grid_size
    distances = mean_attention_distance(attentions, grid, patch_size, prefix)
    tokens = parts.num_tokens
    uniform = mean_attention_distance([np.full((1, 1, tokens, tokens), 1.0 / tokens)], grid, patch_size, prefix)
    plots.plot_attention_distance(
        distances, path, image_size=parts.image_size[1], uniform=float(uniform[0, 0]),
        title=f"{tag}: mean attention distance ({num_images} image{'s' * (num_images > 1)})",
    )


def _draw_position_similarity(parts, path, tag):
    """Figure 7 centre at `path`, returned; None (nothing drawn) for a model without position embeddings."""
    if getattr(parts.posembed, "pos_embedding", None) is None:  # "none", "relative", "factorized"
        return None
    similarity = position_embedding_similarity(_to_numpy(parts.posembed.pos_embedding), parts.grid_size,
                                               parts.posembed.num_prefix_tokens)
    plots.plot_position_similarity(
        similarity, path, title=f"{tag}: position embedding similarity"
    )
    return path


def _draw_embedding_filters(parts, num_components, path, tag):
    """Figure 7 left at `path`, returned; None and a warning (to inspect_model's caller) for a hybrid."""
    import warnings

    if parts.is_hybrid:
        warnings.warn(
            f"{tag} is a hybrid (ResNet + ViT): its embedding is a "
            f"{parts.embedding.patch_size}x{parts.embedding.patch_size} projection of the ResNet "
            "feature map, so there are no RGB embedding filters to draw; "
            "embedding_filters.png was not written",
            stacklevel=3,
        )
        return None
    kernel = _to_numpy(parts.embedding.kernel)
    p, _, c, d = kernel.shape
    k = min(int(num_components), d, p * p * c)
    filters, variance = embedding_filters(kernel, k, return_variance=True)
    plots.plot_embedding_filters(
        filters, path, variance=variance,
        title=f"{tag}: RGB embedding filters (first {k} principal components)",
    )
    return path
