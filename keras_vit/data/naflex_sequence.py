"""One image as a NaFlex sequence: the size rule (`naflex_grid`, timm's `get_image_size_for_seq`), the resize
and the cut into patches (`patchify`, `cut`), in numpy; the checks the NaFlex feed shares.
"""

import functools
import math

import numpy as np

from keras_vit.data.preprocess import IMAGE_DTYPES
from keras_vit.preprocessing import NORMALIZATIONS, preprocess_input

# the size rule's bisection over the scale: its tolerance and its bounds (timm's and Hugging Face's)
_TOLERANCE = 1e-5


_SCALES = (_TOLERANCE / 10, 100.0)


def whole(value, what, least=1):
    """`value` as an int when it is an integer >= `least`, else one ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{what} must be an integer >= {least}; got {value!r}")
    return int(value)


def check_image(image):
    """`image` as a numpy array (H, W, 3) of numbers, else a ValueError saying what came."""
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"a NaFlex image must be (height, width, 3) RGB, channels last; got shape {array.shape}")
    if array.dtype.kind not in "uif" or array.dtype == np.bool_:
        raise ValueError(f"a NaFlex image must hold uint8 or float values in [0, 255]; got dtype {array.dtype}")
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"a NaFlex image must have at least one pixel; got shape {array.shape}")
    return array


def check_scaling(mode, image_dtype):
    if image_dtype not in IMAGE_DTYPES:
        raise ValueError(f"image_dtype must be one of {IMAGE_DTYPES}; got {image_dtype!r}")
    if mode not in NORMALIZATIONS:
        raise ValueError(f"mode must be one of {tuple(NORMALIZATIONS)}; got {mode!r}")


@functools.lru_cache(maxsize=4096)
def _grid(height, width, patch, budget):
    def tiles(scale):
        return max(math.ceil(height * scale / patch), 1), max(math.ceil(width * scale / patch), 1)

    fits, too_big = _SCALES
    while too_big - fits >= _TOLERANCE:
        scale = (fits + too_big) / 2
        rows, cols = tiles(scale)
        if rows * cols <= budget:
            fits = scale
        else:
            too_big = scale
    if fits <= _TOLERANCE:
        raise ValueError(f"a {height}x{width} image fits {budget} token(s) of {patch}x{patch} pixels only when "
                         f"shrunk below {_TOLERANCE} of its size, which the size rule (timm's) refuses; expected "
                         "an image at most ~100000 patches on a side")
    return tiles(fits)


def naflex_grid(height, width, patch_size, max_tokens):
    """(rows, cols) of patches an image of `height` x `width` pixels is resized to within a budget of
    `max_tokens` patches, keeping its aspect ratio: timm's `get_image_size_for_seq` (divisible by the
    patch, no `max_ratio`) divided by the patch size.

    The rule: the grid at a scale s is `max(ceil(height * s / patch_size), 1)` by the same of `width`;
    s is the largest scale whose grid has at most `max_tokens` patches, found by bisecting
    (1e-6, 100) to a tolerance of 1e-5, so a large image is shrunk and a small one enlarged, at most
    ~100 times (a 1 x 1 image in a million 1-pixel tokens: 100 x 100). The grid may hold fewer than
    `max_tokens` patches where both sides round up (a 1 x 1 image in 1000 1-pixel tokens: 31 x 31 = 961).

    Hugging Face's SigLIP 2 processor (`get_image_size_for_max_num_patches`) runs the same bisection
    and gives the same sizes; it differs only for images that would have to shrink below 1e-5 of
    their size (about 100000 patches on a side): timm raises there, and so does this function,
    while Hugging Face returns the size at scale 1e-6.

    Args:
        height, width: the image's size in pixels (positive integers).
        patch_size: the side of a square patch in pixels (a positive integer).
        max_tokens: the budget: most patches the grid may hold (a positive integer).

    Returns:
        (rows, cols), ints >= 1 with rows * cols <= max_tokens.

    Raises:
        ValueError: an argument is not a positive integer, or the image is too large for the rule.
    """
    return _grid(whole(height, "height"), whole(width, "width"), whole(patch_size, "patch_size"),
                 whole(max_tokens, "max_tokens"))


def resize_antialiased(image, size):
    """float32 (h, w, 3) of `image` resized to `size` (h, w): bilinear with antialiasing (the triangle
    filter widened by the reduction; Pillow's BILINEAR on each channel in float32), the rule of
    `keras_vit.interpolation.resize_matrix(..., "bilinear_antialias")` and of `tf.image.resize(...,
    antialias=True)`."""
    from PIL import Image

    if image.shape[:2] == tuple(size):
        return image.astype(np.float32)
    return np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(image[..., c], dtype=np.float32))
                                .resize((size[1], size[0]), Image.BILINEAR)) for c in range(3)], axis=-1)


def image_sequence(image, patch, grid, seq_len, flip=False, mode="vit", image_dtype="float32"):
    """The NaFlex dict of one checked image resized to `grid` patches, flipped left-right with `flip`,
    padded to `seq_len` (None: the grid's own length)."""
    rows, cols = grid
    count = rows * cols
    seq_len = count if seq_len is None else whole(seq_len, "seq_len")
    if seq_len < count:
        raise ValueError(f"the image's {rows}x{cols} grid is {count} patches, longer than seq_len={seq_len}; "
                         f"expected seq_len >= {count} (or a token budget of at most seq_len)")
    resized = resize_antialiased(image, (rows * patch, cols * patch))
    if flip:
        resized = resized[:, ::-1]
    if image_dtype == "uint8":
        pixels = np.round(np.clip(resized, 0.0, 255.0)).astype(np.uint8)
    else:
        pixels = preprocess_input(resized, mode)
    patches = np.zeros((seq_len, patch * patch * 3), pixels.dtype)
    coord = np.zeros((seq_len, 2), np.int32)
    patches[:count], coord[:count] = cut(pixels, patch)
    return {"patches": patches, "patch_coord": coord, "patch_valid": np.arange(seq_len) < count}


def cut(pixels, patch_size):
    """(patches (..., gh * gw, P * P * C), their (row, col) (gh * gw, 2) int32) of an (H, W, C) image, or a
    (..., H, W, C) stack of images of one size, cut into `patch_size` P patches (the pixels past the last
    whole patch dropped): row-major over the grid, each patch flattened with the channels fastest."""
    *lead, height, width, channels = pixels.shape
    rows, cols = height // patch_size, width // patch_size
    patches = pixels[..., :rows * patch_size, :cols * patch_size, :].reshape(
        *lead, rows, patch_size, cols, patch_size, channels)
    coord = np.stack(np.divmod(np.arange(rows * cols, dtype=np.int32), cols), axis=-1)
    return np.swapaxes(patches, -4, -3).reshape(*lead, rows * cols, patch_size * patch_size * channels), coord


def patchify(image, patch_size, max_tokens, seq_len=None, *, mode="vit", image_dtype="float32"):
    """One image as a NaFlex sequence: resized to the grid `naflex_grid` gives it within `max_tokens`
    patches, cut into patches and padded to `seq_len`.

    The resize is bilinear with antialiasing (the filter widened by the reduction when shrinking):
    the rule of `tf.image.resize(..., "bilinear", antialias=True)`, of torch's
    `F.interpolate(mode="bilinear", antialias=True)` and of Pillow's BILINEAR, computed in float32
    (timm resizes uint8 images with Pillow, which rounds to uint8: within one level of 255 of this).
    Patches are row-major over the grid, each flattened as (P, P, 3) with the channels fastest (timm's
    `batch_patchify` with `channels_last=True`, Hugging Face's SigLIP 2 layout).

    Args:
        image: (H, W, 3) RGB, uint8 or float in [0, 255] (numpy array or nested lists).
        patch_size: the side P of a square patch in pixels.
        max_tokens: the token budget the image is resized to fit.
        seq_len: the length to pad to; default: the image's own number of patches.
        mode: the input scaling of `keras_vit.preprocessing.preprocess_input`: "vit" ([-1, 1], the
            default), "imagenet" or "clip".
        image_dtype: "float32" (scaled by `mode`) or "uint8" (the resized pixels rounded to [0, 255],
            for a model that scales them itself).

    Returns:
        {"patches": (seq_len, P * P * 3) float32 (or uint8), "patch_coord": (seq_len, 2) int32 (row,
        col), "patch_valid": (seq_len,) bool}: padding patches zero, at (0, 0), not valid.

    Raises:
        ValueError: the image is not (H, W, 3) numbers; `patch_size` or `max_tokens` is not a positive
            integer; `seq_len` is shorter than the image's patches (the message names both); an
            unknown `mode` or `image_dtype`.
    """
    check_scaling(mode, image_dtype)
    image = check_image(image)
    grid = naflex_grid(image.shape[0], image.shape[1], patch_size, max_tokens)
    return image_sequence(image, int(patch_size), grid, seq_len, False, mode, image_dtype)


def stack_batch(sequences, labels):
    """A batch: the sequences' dicts stacked, the labels as an array (integers as int32)."""
    inputs = {key: np.stack([s[key] for s in sequences]) for key in sequences[0]}
    labels = np.asarray(labels)
    return inputs, labels.astype(np.int32) if labels.dtype.kind in "iu" else labels
