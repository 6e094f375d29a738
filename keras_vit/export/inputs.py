"""What an artefact takes, decided once per `export` (`served_input`) and carried to the signature, the
writers and the ONNX checks: uint8 images of the model's own size (`FixedImages`), uint8 images of any height
and width (`AnySizeImages`), or the NaFlex dict of patches, their coordinates and validity (`NaFlexBatch`).

Each case knows what differs between them: which writers cannot take it (and what no writer takes), the
serving model's inputs, the input signature and symbolic shapes the exporters trace, the names of its
dimensions in an ONNX file, the module and example inputs of torch's exporter, and random inputs for a
check in onnxruntime. A new kind of input is one new case here, not a branch in every writer."""

import dataclasses

import numpy as np

from keras_vit.calls import NAFLEX_KEYS, is_naflex
from keras_vit.export.int8 import check_calibration

# (backend, format) pairs whose exporter writes a fixed image size only, and why: an artefact of a model that
# takes any size (input shape (None, None, 3)) is written from the TensorFlow backend in a fresh process
# instead, whose exporters keep the height and width as they are (README's any-size table)
THROUGH_TENSORFLOW_ANY_SIZE = {
    ("jax", "onnx"): "jax2onnx 0.17 traces jnp.arange over a size known only when run as a placeholder, which the "
                     "position embeddings' resize takes",
    ("torch", "onnx"): "Keras' ops take torch.export's symbolic sizes for no dtype (a SymInt), which the position "
                       "embeddings' resize takes",
    ("torch", "litert"): "litert-torch 0.10 lowers fixed shapes only",
}
# (backend, format) pairs whose exporter cannot write a NaFlex model (`keras_vit.naflex`: a dict of patches,
# their coordinates and validity, of any batch and sequence length), and why: written from the TensorFlow
# backend in a fresh process instead (the pairs of THROUGH_TENSORFLOW too)
THROUGH_TENSORFLOW_NAFLEX = {
    ("jax", "onnx"): "jax2onnx 0.17 gives a concatenation along the symbolic sequence length (the prefix tokens, "
                     "then the n patches) the shape of its first part, and bakes that length into the reshapes "
                     "after",
}
# formats no backend writes for a NaFlex model, and why (refused by check_format before anything is written)
NAFLEX_REFUSED = {
    "litert": "TensorFlow's LiteRT converter leaves the slices that add an axis to the NaFlex arrays, whose batch and "
              "sequence length are known only when run, as TensorFlow ops (FlexStridedSlice), which the LiteRT "
              "interpreter does not run",
}
# the ONNX opset tf2onnx writes a NaFlex model in (see `NaFlexBatch.export_options`)
NAFLEX_TF2ONNX_OPSET = 18


def takes_any_size(model):
    """Whether `model` takes images of any height or width (built with `input_shape=(None, None, 3)`);
    False for a NaFlex model, which takes patches (`keras_vit.naflex`)."""
    return not is_naflex(model) and _images_of_any_size(model)


def _images_of_any_size(model):
    """Whether the images `model` (which takes images) takes have a height or width of any size."""
    return None in tuple(model.input_shape[1:3])


def served_input(model, resize_to=None):
    """What the artefact of `model` takes (checked later, by `ServedInput.check`): a NaFlex batch for a
    NaFlex model, images of any size for a model of any size or with `resize_to`, else images of its size.

    Args:
        model: the Keras model to export.
        resize_to: None, or the size (an int or (h, w)) images are resized to inside the artefact.
    """
    if is_naflex(model):
        return NaFlexBatch(resize_to)
    if _images_of_any_size(model) or resize_to is not None:
        return AnySizeImages(resize_to)
    return FixedImages()


def served_kind(any_size=False, naflex=False):
    """The case of `writer`'s and `check_format`'s flags (no resize): NaFlexBatch, AnySizeImages or FixedImages.

    Args:
        any_size: whether the artefact takes images of any height and width.
        naflex: whether it takes a NaFlex dict (this wins over `any_size`, as in `served_input`).
    """
    return NaFlexBatch() if naflex else AnySizeImages() if any_size else FixedImages()


@dataclasses.dataclass(frozen=True)
class ServedInput:
    """The input of an artefact: uint8 images "images" (N, h, w, 3), the batch dynamic unless fixed; the
    cases below say the rest.

    Args:
        resize_to: None, or the size (an int or (h, w)) images are resized to inside, as asked of `export`.
    """

    resize_to: object = None
    # the case's name in SERVED_INPUTS (how the fresh TensorFlow process is told it)
    name = "fixed"
    # (backend, format) pairs written from the TensorFlow backend for this input, and why (see `writer`)
    through_tensorflow = {}
    # formats no backend writes for this input, and why (see `check_format`)
    refused = {}
    # what an export of this input is called in a message: "onnx from the jax backend<phrase>"
    phrase = ""
    # what a model of this input is called in the refusal of a format of `refused`
    described = "a model"

    def check(self, model, input_mode="vit", calibration=None):
        """Raises ValueError when `resize_to` or `calibration` do not fit `model` (see `check_resize_to`,
        `keras_vit.export.check_calibration`); `input_mode` scales any image."""
        if self.resize_to is not None:
            check_resize_to(model, self.resize_to)
        if calibration is not None:
            check_calibration(calibration, self.calibration_size(model))

    def calibration_size(self, model):
        """The (h, w) of the calibration images of static int8: the model's own."""
        return tuple(model.input_shape[1:3])

    def inputs(self, model, input_mode="vit"):
        """(the serving model's inputs, what `model` is called on): uint8 images scaled as
        `keras_vit.preprocess_input(x, input_mode)` does (unless `model` takes uint8 itself)."""
        import keras

        inputs = keras.Input(model.input_shape[1:], dtype="uint8", name="images")
        return inputs, _rescaled(model, inputs, input_mode)

    def signature(self, serving, batch_size):
        """The input signature of Keras' `model.export` for the serving model `serving`."""
        import keras

        return keras.InputSpec(shape=(batch_size, *serving.input_shape[1:]), dtype="uint8", name="images")

    def export_options(self, backend, format, model, serving, batch_size):
        """Keyword arguments of Keras' `model.export` this input needs from `backend` to `format`: none."""
        return {}

    def dimension_names(self, serving, batch):
        """{input name: the names of its dimensions of unknown size in an ONNX file}, `batch` the batch's."""
        return {"images": [batch, "height", "width", None]}

    def torch_module(self, serving):
        """`serving` (on the torch backend) as a module in eval mode whose forward takes one argument named
        `images` (for dynamic_shapes and the artefact's input name)."""
        import torch

        class Images(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, images):
                return self.model(images)

        return Images(serving).eval()

    def torch_example(self, serving, batch_size):
        """(example inputs, their names, dynamic_shapes) of torch.export: a batch of 2 images (torch.export
        specialises a dimension it sees as 1), the batch dynamic unless fixed."""
        import torch

        example = (torch.zeros((batch_size or 2, *serving.input_shape[1:]), dtype=torch.uint8),)
        return example, ["images"], None if batch_size else {"images": {0: torch.export.Dim("batch")}}

    def random_inputs(self, session, batch=2):
        """Random inputs of the onnxruntime `session`: `batch` uint8 or float images in [0, 255]."""
        spec = session.get_inputs()[0]
        shape = [d if isinstance(d, int) else batch for d in spec.shape]
        dtype = {"tensor(uint8)": np.uint8, "tensor(float)": np.float32}[spec.type]
        return {spec.name: np.random.default_rng(0).integers(0, 256, shape).astype(dtype)}


class FixedImages(ServedInput):
    """uint8 images of the model's own size (N, h, w, 3)."""


@dataclasses.dataclass(frozen=True)
class AnySizeImages(ServedInput):
    """uint8 images of any height and width: those of a model of any size (multiples of its pixels per
    token), or any, resized to `resize_to` inside.

    Args:
        resize_to: None, or the size (an int or (h, w)) images are resized to inside.
    """

    name = "any_size"
    through_tensorflow = THROUGH_TENSORFLOW_ANY_SIZE
    phrase = " at any image size"

    def calibration_size(self, model):
        """None: calibration images of any size."""
        return None

    def inputs(self, model, input_mode="vit"):
        """As `ServedInput.inputs`, resized to `resize_to` first (`keras_vit.layers.ResizeImages`)."""
        if self.resize_to is None:
            return super().inputs(model, input_mode)
        import keras

        from keras_vit.layers import ResizeImages

        size = check_resize_to(model, self.resize_to)
        inputs = keras.Input((None, None, model.input_shape[-1]), dtype="uint8", name="images")
        x = ResizeImages(size, name="resize")(inputs)  # float32 in [0, 255]
        if model.inputs[0].dtype == "uint8":  # rounded back, as an image file read at that size would be
            x = keras.ops.cast(keras.ops.round(keras.ops.clip(x, 0, 255)), "uint8")
        return inputs, _rescaled(model, x, input_mode)

    def export_options(self, backend, format, model, serving, batch_size):
        """From jax to a SavedModel, jax2tf's symbolic shape of the images: each side a multiple of the pixels
        per token ("(batch, 16*h, 16*w, 3)"), so that the patches' reshape is proven to fit when traced; any
        side when the artefact resizes its input, or where the model crops to whole patches (its sides then
        floor(h / 14) * 14, whose gradient jax2tf cannot trace: a serving artefact is written without one)."""
        from keras_vit.structure import find_vit

        if (backend, format) != ("jax", "tf_saved_model"):
            return {}
        h, w, channels = model.input_shape[1:]
        parts = find_vit(model)
        crop = self.resize_to is None and parts.crop is not None
        if self.resize_to is not None:
            sides = ["h", "w"]
        else:
            unit = "" if crop else f"{parts.stride}*"
            sides = [f"{unit}{name}" if size is None else str(size) for size, name in ((h, "h"), (w, "w"))]
        shape = f"({batch_size or 'batch'}, {', '.join(sides)}, {channels})"
        return {"jax2tf_kwargs": {"polymorphic_shapes": [shape], **({"with_gradient": False} if crop else {})}}


@dataclasses.dataclass(frozen=True)
class NaFlexBatch(ServedInput):
    """A NaFlex model's dict (`keras_vit.naflex`): "patches" (B, N, P * P * C), float32 as the model takes
    them (already scaled), or uint8 for a model built with `input_dtype="uint8"`, "patch_coord" (B, N, 2)
    int32 and "patch_valid" (B, N) bool, B and N any (B fixed by a batch size); the inputs named as their
    keys. `resize_to`, an input mode and calibration images act on images and are refused (`check`).

    Args:
        resize_to: what was asked of `export` (refused unless None).
    """

    name = "naflex"
    through_tensorflow = THROUGH_TENSORFLOW_NAFLEX
    refused = NAFLEX_REFUSED
    phrase = " of a NaFlex model"
    described = "a NaFlex model (patches, patch_coord, patch_valid in)"

    def check(self, model, input_mode="vit", calibration=None):
        """Raises ValueError for `input_mode`, `resize_to` or `calibration`, which act on images."""
        check_naflex_serving(model, input_mode, self.resize_to)
        if calibration is not None:
            raise ValueError(f"calibration: model {model.name!r} is a NaFlex model, whose artefact takes patches, and "
                             "static int8 is calibrated on images; quantize='int8' without calibration quantizes "
                             "it dynamically")

    def inputs(self, model, input_mode="vit"):
        """(the model's three inputs, the same): the patches as the model takes them."""
        from keras_vit.naflex import naflex_inputs

        check_naflex_serving(model, input_mode, self.resize_to)
        inputs = naflex_inputs(model.input["patches"].shape[-1], model.input["patches"].dtype)
        return inputs, inputs

    def signature(self, serving, batch_size):
        import keras

        return {k: keras.InputSpec(shape=(batch_size, *t.shape[1:]), dtype=t.dtype, name=k)
                for k, t in serving.input.items()}

    def export_options(self, backend, format, model, serving, batch_size):
        """From TensorFlow to ONNX, NAFLEX_TF2ONNX_OPSET: tf2onnx's default opset, 15, has no
        Split(num_outputs), into which onnxscript's optimizer (`_optimize_onnx`) rewrites the slices of the
        NaFlex grid sizes regardless, a file onnxruntime refuses. From jax to a SavedModel, jax2tf's shapes
        of the three inputs, one batch and one sequence length shared by them ({"patches": "(batch, tokens,
        192)", ...}): each its own symbols, they could not be broadcast."""
        if (backend, format) == ("tensorflow", "onnx"):
            return {"opset_version": NAFLEX_TF2ONNX_OPSET}
        if (backend, format) != ("jax", "tf_saved_model"):
            return {}
        shapes = {k: "(" + ", ".join(str(d) for d in (batch_size or "batch", "tokens", *t.shape[2:])) + ")"
                  for k, t in serving.input.items()}
        return {"jax2tf_kwargs": {"polymorphic_shapes": [shapes]}}

    def dimension_names(self, serving, batch):
        return {k: [batch, "tokens"] + [None] * (len(t.shape) - 2) for k, t in serving.input.items()}

    def torch_module(self, serving):
        """`serving` as a module whose forward takes the three inputs by their names, passed on as the dict."""
        import torch

        class NaFlex(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, patches, patch_coord, patch_valid):
                return self.model({"patches": patches, "patch_coord": patch_coord, "patch_valid": patch_valid})

        return NaFlex(serving).eval()

    def torch_example(self, serving, batch_size):
        """3 sequences of 17 patches (one of the same size as another dimension might be taken for it); the
        batch dynamic unless fixed, the sequence length always."""
        import torch

        names = list(NAFLEX_KEYS)
        batch, tokens = (batch_size or 3), 17
        example = tuple(torch.zeros((batch, tokens, *t.shape[2:]), dtype=getattr(torch, t.dtype))
                        for t in (serving.input[k] for k in names))
        dims = {1: torch.export.Dim("tokens")}
        if batch_size is None:
            dims[0] = torch.export.Dim("batch")
        return example, names, {k: dims for k in names}

    def random_inputs(self, session, batch=2, tokens=6):
        """`batch` sequences of `tokens` random patches on a 2 x `tokens // 2` grid, all valid."""
        patches = next(s for s in session.get_inputs() if s.name == "patches")
        n = patches.shape[0] if isinstance(patches.shape[0], int) else batch
        dtype = {"tensor(uint8)": np.uint8, "tensor(float)": np.float32}[patches.type]
        coord = np.stack(np.divmod(np.arange(2 * (tokens // 2)), tokens // 2), -1).astype(np.int32)
        return {"patches": np.random.default_rng(0).integers(0, 256, (n, len(coord), patches.shape[-1])).astype(dtype),
                "patch_coord": np.repeat(coord[None], n, 0), "patch_valid": np.ones((n, len(coord)), bool)}


# every case by its name
SERVED_INPUTS = {case.name: case for case in (FixedImages, AnySizeImages, NaFlexBatch)}


def _rescaled(model, x, input_mode):
    """`x` scaled by a `Rescaling` layer as `input_mode` says, unless `model` takes uint8 (it scales itself)."""
    import keras

    if model.inputs[0].dtype == "uint8":
        return x
    from keras_vit.preprocessing import input_scaling

    scale, offset = input_scaling(input_mode)
    return keras.layers.Rescaling(scale, offset=offset, name="rescale")(x)


def check_naflex_serving(model, input_mode="vit", resize_to=None):
    """Raises ValueError when `input_mode` or `resize_to`, which act on images, are asked of the NaFlex
    model `model`, whose artefact takes its patches as they are."""
    if resize_to is not None:
        raise ValueError(f"resize_to={resize_to!r}: model {model.name!r} is a NaFlex model, whose artefact takes "
                         "patches of any number (patches, patch_coord, patch_valid), not images; resize each image "
                         "before cutting it into patches (keras_vit.data.naflex_feed)")
    if input_mode != "vit":
        raise ValueError(f"input_mode={input_mode!r}: model {model.name!r} is a NaFlex model, whose artefact takes the "
                         "patches as the model does (scaled as they are fed to it, or uint8 for a model built with "
                         "input_dtype='uint8'); no scaling is added inside")


def check_resize_to(model, resize_to):
    """`resize_to` as (h, w), one `model` takes: its own size, or for a model of any size a multiple of its
    token size (any size of a patch or more where the model crops to whole patches); ValueError naming what
    was expected otherwise."""
    from keras_vit.configs import pair
    from keras_vit.structure import find_vit

    size = pair(resize_to, "resize_to")
    fixed = tuple(model.input_shape[1:3])
    if None not in fixed and size != fixed:
        raise ValueError(f"resize_to {size}: model {model.name!r} takes {fixed[0]}x{fixed[1]} images only; expected "
                         f"resize_to={fixed[0] if fixed[0] == fixed[1] else fixed} (or a model of any size)")
    parts = find_vit(model)
    stride = parts.stride
    if parts.crop is not None and min(size) >= stride:
        return size
    if size[0] % stride or size[1] % stride:
        raise ValueError(f"resize_to {size}: model {model.name!r} cuts images into {stride}-pixel tokens; expected "
                         f"multiples of {stride}")
    return size
