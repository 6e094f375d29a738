"""Running the ViT found inside a Keras model (nested at any depth) block by block, to capture the
softmax attention of every block."""


import numpy as np

from keras_vit.structure import find_vit


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
    if expected_hw is not None and tuple(shape[1:3]) != tuple(expected_hw):
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
        runtime = getattr(parts.posembed, "stride", None) is not None  # takes any size that tiles
        if parts.crop is not None:  # the pixels that fill no whole patch, dropped as the model drops them
            x = parts.crop(_as_image_batch(x, None, parts.path))
        x = pixels = _as_image_batch(x, None if runtime else parts.image_size, parts.path)
        if parts.resnet is not None:
            x = parts.resnet(x)
        x = parts.embed(parts.embedding(x), pixels, training=False)
        for i, block in enumerate(parts.blocks[: last + 1]):
            posembed = parts.block_posembeds[i]
            if i and posembed is not None:
                x = posembed(x)
            on_images = {"images": pixels} if getattr(block, "reads_images", False) else {}
            x, attn = block(x, training=False, return_attention=True, **on_images)
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


def _to_numpy(value):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(value))
