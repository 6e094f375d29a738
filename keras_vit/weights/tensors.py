"""Reading PyTorch-world weight files as numpy arrays: `.safetensors` (parsed here, no library
needed) and `.pth` / `.bin` (`torch.load(weights_only=True)`: tensors only, nothing else unpickled)."""

import json
import os
import struct

import numpy as np

from keras_vit.extras import require

TORCH_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")

# safetensors dtype name -> numpy dtype (BF16 is widened to float32 by hand below)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def _bad(path, why):
    return ValueError(f"{path} is not a readable weights file (expected {_expected(path)}; truncated or corrupt?): {why}")


def _expected(path):
    if str(path).endswith(".safetensors"):
        return "a .safetensors file: an 8-byte header length, a JSON header, then the tensor bytes"
    return "a PyTorch state dict of tensors saved with torch.save"


def read_safetensors(path):
    """{name: array} of a `.safetensors` file, checked against its own header."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"{size} bytes, shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise _bad(path, f"header of {length} bytes announced, {size - 8} bytes in the file")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise _bad(path, f"header is not JSON: {err}") from None
        data = f.read()
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    arrays = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _bad(path, f"tensor {name!r} has no dtype/shape/data_offsets") from None
        if not 0 <= begin <= end <= len(data):
            raise _bad(path, f"tensor {name!r} lies at bytes {begin}-{end}, the data holds {len(data)}")
        raw = data[begin:end]
        if dtype != "BF16" and dtype not in _DTYPES:
            raise _bad(path, f"tensor {name!r} has dtype {dtype}, expected one of {', '.join(['BF16', *_DTYPES])}")
        itemsize = 2 if dtype == "BF16" else np.dtype(_DTYPES[dtype]).itemsize
        if len(raw) != int(np.prod(shape)) * itemsize:
            raise _bad(path, f"tensor {name!r}: {len(raw)} bytes do not hold a {dtype} array of shape {shape}")
        if dtype == "BF16":
            array = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, np.dtype(_DTYPES[dtype]).newbyteorder("<"))
        arrays[name] = array.reshape(shape)
    return arrays


def _state_dict(obj, path):
    """The tensor dict inside a loaded torch checkpoint (bare, or under "state_dict" / "model")."""
    import torch

    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise _bad(path, f"it holds a {type(obj).__name__}, not a dict of tensors")
    arrays = {}
    for name, value in obj.items():
        if isinstance(value, torch.Tensor):
            arrays[name] = value.detach().to(torch.float32 if value.is_floating_point() else value.dtype).numpy()
    if not arrays:
        raise _bad(path, "it holds no tensors")
    return arrays


def read_torch(path):
    """{name: array} of a `.pth`/`.bin` state dict, with `torch.load(weights_only=True)`."""
    import pickle

    require("reading a .pth or .bin checkpoint", f"reading {path}")
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path} needs unpickling objects other than tensors, which keras_vit refuses "
            f"(torch.load(weights_only=True)): {first}. Save the state dict alone (model.state_dict()) "
            "or as .safetensors."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise _bad(path, err) from None
    return _state_dict(obj, path)


def read_tensors(path):
    """{name: numpy array} of a `.safetensors`, `.pth`, `.pt` or `.bin` file."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"weights file not found: {path}")
    if path.endswith(".safetensors"):
        return read_safetensors(path)
    return read_torch(path)
