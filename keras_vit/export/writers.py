"""Writing an artefact from the running backend: Keras' `model.export`, torch's ONNX exporter, litert-torch."""

import logging
import os

from keras_vit.export.onnx_rewrites import _fix_onnx, _optimize_onnx
from keras_vit.export.serving import serve
from keras_vit.runtime import platform_chosen_on_host


def _write(model, path, format, top_k, batch_size, input_mode, served):
    """Writes `serving_model(model, top_k, input_mode)` behind the input `served` (a
    `keras_vit.export.inputs.ServedInput`) as `format` at `path` from the running backend."""
    import keras

    backend = keras.backend.backend()
    serving = serve(model, served, top_k, input_mode)
    if backend == "torch" and format == "onnx":
        _torch_onnx(serving, path, batch_size, served)
    elif backend == "torch" and format == "litert":
        _torch_litert(serving, path, batch_size, served)
    else:
        kwargs = served.export_options(backend, format, model, serving, batch_size)
        # jax2onnx has no converter for a computation chosen per lowered platform (platform_index):
        # the layers' CPU/accelerator choices are made for this machine when tracing (every format,
        # so that every artefact is made the same way)
        def keras_export():
            with platform_chosen_on_host():
                serving.export(path, format=format, input_signature=[served.signature(serving, batch_size)],
                               verbose=False, **kwargs)

        if (backend, format) == ("tensorflow", "onnx"):
            _through_tf2onnx(keras_export)
        else:
            keras_export()
    if format == "onnx":
        _fix_onnx(path, sorted(serving.output), _dimension_names(serving, batch_size, served))
        _optimize_onnx(path, served)


def _through_tf2onnx(keras_export):
    """Calls `keras_export` (Keras' ONNX export on TensorFlow, through tf2onnx) with tf2onnx's graph
    optimizers working in place. By default tf2onnx deep-copies the whole graph, weights included, before
    each of its optimizers (about 45 copies of a ViT), so that one that raises can be skipped: a third of
    the export's time. Its variable TF2ONNX_CATCH_ERRORS turns the copies off (unless the user has set it);
    an export that then fails is written again as tf2onnx writes it by default, so no graph that exported
    before fails now."""
    if "TF2ONNX_CATCH_ERRORS" in os.environ:
        keras_export()
        return
    os.environ["TF2ONNX_CATCH_ERRORS"] = "false"
    try:
        keras_export()
        return
    except Exception as e:
        logging.getLogger("keras_vit").info("keras_vit.export: tf2onnx failed with its optimizers in place "
                                            "(%s); exporting again with its defaults", e)
    finally:
        del os.environ["TF2ONNX_CATCH_ERRORS"]
    keras_export()


def _dimension_names(serving, batch_size, served):
    """{input or output name: [its dimensions' names in the ONNX file]} of a serving model, for the
    dimensions of unknown size (tf2onnx numbers them, "unk__527"): "batch" (unless fixed) first; the
    input's as `served` names them (an image's "height" and "width"), a feature map's "grid_height" and
    "grid_width", patch tokens' "tokens"; the other dimensions left as the exporter wrote them (None)."""
    batch = "batch" if batch_size is None else None
    names = served.dimension_names(serving, batch)
    middle = {3: ["tokens"], 4: ["grid_height", "grid_width"]}
    for k, t in serving.output.items():
        rank = len(t.shape)
        names[k] = [batch, *middle.get(rank, [None] * (rank - 2)), None] if rank >= 2 else [None]
    return names


def _torch_onnx(serving, path, batch_size, served):
    """ONNX from the torch backend through torch's dynamo exporter, the batch dynamic unless fixed (and
    the other dimensions `served`, the input, says: `ServedInput.torch_example`)."""
    import torch

    example, names, dynamic = served.torch_example(serving, batch_size)
    program = torch.onnx.export(served.torch_module(serving), example, dynamo=True, input_names=names,
                                dynamic_shapes=dynamic, verbose=False)
    program.optimize()
    program.save(path)


def _torch_litert(serving, path, batch_size, served):
    """LiteRT from the torch backend through litert-torch, at a fixed batch (THROUGH_TENSORFLOW says why),
    of the images `served` takes.

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
            litert_torch.convert(served.torch_module(serving), sample_kwargs={"images": example}).export(path)
    finally:
        if jax is not None:
            jax.config.update("jax_enable_x64", x64)
