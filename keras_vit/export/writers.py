"""Writing an artefact from the running backend: Keras' `model.export`, torch's ONNX exporter, litert-torch."""

from keras_vit.calls import NAFLEX_KEYS
from keras_vit.export.formats import takes_any_size
from keras_vit.export.onnx_rewrites import _fix_onnx, _optimize_onnx
from keras_vit.export.serving import serving_model
from keras_vit.naflex import is_naflex
from keras_vit.runtime import platform_chosen_on_host

# the ONNX opset tf2onnx writes a NaFlex model in (see `_write`)
NAFLEX_TF2ONNX_OPSET = 18


def _write(model, path, format, top_k, batch_size, input_mode="vit", resize_to=None):
    """Writes `serving_model(model, top_k, input_mode, resize_to)` as `format` at `path` from the running
    backend."""
    import keras

    backend = keras.backend.backend()
    serving = serving_model(model, top_k, input_mode, resize_to)
    flex = is_naflex(serving)
    if backend == "torch" and format == "onnx":
        _torch_onnx(serving, path, batch_size)
    elif backend == "torch" and format == "litert":
        _torch_litert(serving, path, batch_size)
    else:
        kwargs = {}
        if flex:
            spec = {k: keras.InputSpec(shape=(batch_size, *t.shape[1:]), dtype=t.dtype, name=k)
                    for k, t in serving.input.items()}
        else:
            spec = keras.InputSpec(shape=(batch_size, *serving.input_shape[1:]), dtype="uint8", name="images")
        if flex and backend == "tensorflow" and format == "onnx":
            # tf2onnx's default opset, 15, has no Split(num_outputs), into which onnxscript's optimizer
            # (`_optimize_onnx`) rewrites the slices of the NaFlex grid sizes regardless: a file onnxruntime refuses
            kwargs["opset_version"] = NAFLEX_TF2ONNX_OPSET
        if backend == "jax" and format == "tf_saved_model" and (flex or takes_any_size(serving)):
            shape = _naflex_symbolic_shapes(serving, batch_size) if flex else \
                _symbolic_shape(model, batch_size, resize_to)
            kwargs["jax2tf_kwargs"] = {"polymorphic_shapes": [shape]}
        # jax2onnx has no converter for a computation chosen per lowered platform (platform_index):
        # the layers' CPU/accelerator choices are made for this machine when tracing (every format,
        # so that every artefact is made the same way)
        with platform_chosen_on_host():
            serving.export(path, format=format, input_signature=[spec], verbose=False, **kwargs)
    if format == "onnx":
        _fix_onnx(path, sorted(serving.output), _dimension_names(serving, batch_size))
        _optimize_onnx(path)


def _symbolic_shape(model, batch_size, resize_to=None):
    """jax2tf's shape of the images of a model of any size: each side a multiple of the pixels per token
    ("(batch, 16*h, 16*w, 3)"), so that the patches' reshape is proven to fit when traced; any side when
    the artefact resizes its input (`resize_to`)."""
    from keras_vit.structure import find_vit

    h, w, channels = model.input_shape[1:]
    if resize_to is not None:
        sides = ["h", "w"]
    else:
        stride = find_vit(model).stride
        sides = [f"{stride}*{name}" if size is None else str(size) for size, name in ((h, "h"), (w, "w"))]
    return f"({batch_size or 'batch'}, {', '.join(sides)}, {channels})"


def _naflex_symbolic_shapes(serving, batch_size):
    """jax2tf's shapes of a NaFlex model's inputs, one batch and one sequence length shared by the three
    ({"patches": "(batch, tokens, 192)", ...}): each its own symbols, they could not be broadcast."""
    return {k: "(" + ", ".join(str(d) for d in (batch_size or "batch", "tokens", *t.shape[2:])) + ")"
            for k, t in serving.input.items()}


def _dimension_names(serving, batch_size):
    """{input or output name: [its dimensions' names in the ONNX file]} of a serving model, for the
    dimensions of unknown size (tf2onnx numbers them, "unk__527"): "batch" (unless fixed) first; an
    image's "height" and "width", a NaFlex model's (and its patch tokens') "tokens", a feature map's
    "grid_height" and "grid_width"; the other dimensions left as the exporter wrote them (None)."""
    batch = "batch" if batch_size is None else None
    if is_naflex(serving):
        names = {k: [batch, "tokens"] + [None] * (len(t.shape) - 2) for k, t in serving.input.items()}
    else:
        names = {"images": [batch, "height", "width", None]}
    middle = {3: ["tokens"], 4: ["grid_height", "grid_width"]}
    for k, t in serving.output.items():
        rank = len(t.shape)
        names[k] = [batch, *middle.get(rank, [None] * (rank - 2)), None] if rank >= 2 else [None]
    return names


def _images_module(serving):
    """`serving` (a Keras model on the torch backend) as a module whose forward takes one argument
    named `images` (for dynamic_shapes and the artefact's input name), in eval mode; a NaFlex
    model's takes its three inputs by their names, passed on as the model's dict."""
    import torch

    class Images(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, images):
            return self.model(images)

    class NaFlex(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, patches, patch_coord, patch_valid):
            return self.model({"patches": patches, "patch_coord": patch_coord, "patch_valid": patch_valid})

    return (NaFlex if is_naflex(serving) else Images)(serving).eval()


def _torch_example(serving, batch_size):
    """(example inputs, their names, dynamic_shapes) of torch.export for `serving`: a batch of 2 images, or
    for a NaFlex model 3 sequences of 17 patches (torch.export specialises a dimension it sees as 1, and
    one of the same size as another might be taken for it); the batch dynamic unless fixed, a NaFlex
    model's sequence length always."""
    import torch

    if not is_naflex(serving):
        example = (torch.zeros((batch_size or 2, *serving.input_shape[1:]), dtype=torch.uint8),)
        return example, ["images"], None if batch_size else {"images": {0: torch.export.Dim("batch")}}
    names = list(NAFLEX_KEYS)
    batch, tokens = (batch_size or 3), 17
    example = tuple(torch.zeros((batch, tokens, *t.shape[2:]), dtype=getattr(torch, t.dtype))
                    for t in (serving.input[k] for k in names))
    dims = {1: torch.export.Dim("tokens")}
    if batch_size is None:
        dims[0] = torch.export.Dim("batch")
    return example, names, {k: dims for k in names}


def _torch_onnx(serving, path, batch_size):
    """ONNX from the torch backend through torch's dynamo exporter, the batch (and a NaFlex model's
    sequence length) dynamic unless fixed."""
    import torch

    example, names, dynamic = _torch_example(serving, batch_size)
    program = torch.onnx.export(_images_module(serving), example, dynamo=True, input_names=names,
                                dynamic_shapes=dynamic, verbose=False)
    program.optimize()
    program.save(path)


def _torch_litert(serving, path, batch_size):
    """LiteRT from the torch backend through litert-torch, at a fixed batch (THROUGH_TENSORFLOW says why).

    Called directly rather than through Keras' `model.export`, which traces with the batch set to
    1 and names the input `args_0`; here the input is `images`, like the other artefacts'.
    litert-torch turns JAX's 64-bit mode on when imported; it is restored after.
    """
    import contextlib
    import io

    import torch

    try:
        import jax

        x64 = jax.config.jax_enable_x64
    except ImportError:
        jax = None
    try:
        import litert_torch

        example = torch.zeros((batch_size, *serving.input_shape[1:]), dtype=torch.uint8)
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
            litert_torch.convert(_images_module(serving), sample_kwargs={"images": example}).export(path)
    finally:
        if jax is not None:
            jax.config.update("jax_enable_x64", x64)
