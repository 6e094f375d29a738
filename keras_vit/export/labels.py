"""The class names an artefact carries (`model.class_names`): a `class_names.txt` in its folder (a
SavedModel's in its `assets/`), and in an ONNX file's metadata too; `read_class_names` reads them back."""

import json
import os

# the file of the names, one a line (UTF-8), and the key of the JSON list in an ONNX file's metadata_props
CLASS_NAMES_FILE = "class_names.txt"
ONNX_CLASS_NAMES_KEY = "class_names"


def check_line_names(names):
    """Raises ValueError when a class name holds a line break, which `class_names.txt` (a name a line)
    could not keep: before anything is written."""
    broken = [n for n in names if "\n" in n or "\r" in n]
    if broken:
        raise ValueError(f"class name {broken[0]!r} holds a line break, which class_names.txt (one name a line) "
                         "cannot keep; expected names of one line (set them again, e.g. model.class_names = "
                         "[n.strip() for n in model.class_names])")


def _names_file(path):
    """Where `class_names.txt` of the artefact at `path` is: a SavedModel's (a folder) in its `assets/`, a
    file's beside it."""
    if os.path.isdir(path):
        saved_model = os.path.isfile(os.path.join(path, "saved_model.pb"))
        return os.path.join(path, "assets", CLASS_NAMES_FILE) if saved_model else os.path.join(path, CLASS_NAMES_FILE)
    return os.path.join(os.path.dirname(os.path.abspath(path)), CLASS_NAMES_FILE)


def _attach_class_names(path, format, names):
    """Writes `names` with the artefact at `path` (inside `export`'s temporary folder, so that they appear
    with it): `class_names.txt`, and for ONNX the JSON list under ONNX_CLASS_NAMES_KEY in its metadata."""
    file = _names_file(path)
    os.makedirs(os.path.dirname(file), exist_ok=True)
    with open(file, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(f"{n}\n" for n in names))
    if format == "onnx":
        import onnx

        model = onnx.load(path)
        kept = [p for p in model.metadata_props if p.key != ONNX_CLASS_NAMES_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        model.metadata_props.add(key=ONNX_CLASS_NAMES_KEY, value=json.dumps(list(names), ensure_ascii=False))
        onnx.save(model, path)


def read_class_names(path):
    """The class names an artefact carries (`export` of a model with `class_names`), or None.

    An ONNX file's are read from its metadata (`metadata_props`, key "class_names", a JSON list);
    otherwise from `class_names.txt` (one name a line, UTF-8): a SavedModel's in its `assets/` folder,
    an ONNX or LiteRT file's beside it.

    Args:
        path: the artefact, as `export` returns it (a SavedModel folder, a .onnx or a .tflite file),
            or the output folder of an ONNX or LiteRT export.

    Returns:
        A tuple of str, one per class of the artefact's output, or None when it carries none.

    Raises:
        FileNotFoundError: nothing at `path`.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no artefact at {path}")
    if path.endswith(".onnx") and os.path.isfile(path):
        import onnx

        props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
        if ONNX_CLASS_NAMES_KEY in props:
            return tuple(json.loads(props[ONNX_CLASS_NAMES_KEY]))
    file = _names_file(path)
    if not os.path.isfile(file):
        return None
    with open(file, encoding="utf-8") as f:  # universal newlines: a file edited on Windows reads the same
        text = f.read()
    return tuple(text.removesuffix("\n").split("\n")) if text else ()
