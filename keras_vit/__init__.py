"""keras-vit: the Vision Transformer of "An Image is Worth 16x16 Words" for Keras 3.

The parts that import Keras (and so its backend) load on first use of any name below, so that
`keras-vit --help` and `keras-vit list` start without a backend. When Keras is already imported,
they load at once: its custom layers and schedules are then registered for `keras.saving.load_model`.
"""

import importlib
import importlib.util
import sys

_NAMES = {
    "VARIANTS": "keras_vit.configs",
    "VariantConfig": "keras_vit.configs",
    "get_variant": "keras_vit.configs",
    "decode_predictions": "keras_vit.preprocessing",
    "preprocess_input": "keras_vit.preprocessing",
    "distribute": "keras_vit.runtime",
    "exact_float32": "keras_vit.runtime",
    "jit_compile_default": "keras_vit.runtime",
    "VisionTransformer": "keras_vit.variants",
    **{name: "keras_vit.variants" for name in (
        "ViT_Ti16", "ViT_S16", "ViT_S32", "ViT_B8", "ViT_B16", "ViT_B32", "ViT_L16", "ViT_L32", "ViT_H14",
        "R26_ViT_S32", "R26_ViT_B32", "R50_ViT_B16", "R50_ViT_L32")},
    "feature_extractor": "keras_vit.features",
    "resize_patch_embedding": "keras_vit.patch_resize",
    "list_weights": "keras_vit.weights",
    "load_weights": "keras_vit.weights",
}
# Imported with the first name: recipes registers its schedules and losses for model reloading.
_EAGER = ("keras_vit.layers", "keras_vit.recipes")

__version__ = "0.1.0"
__all__ = sorted(_NAMES)


def _load():
    for module in (*_EAGER, *sorted(set(_NAMES.values()))):
        importlib.import_module(module)  # also sets the submodule as an attribute of the package
    for name, module in _NAMES.items():
        parent = sys.modules[module]
        globals()[name] = getattr(parent, name) if hasattr(parent, name) else importlib.import_module(
            f"{module}.{name}")  # a submodule, e.g. keras_vit.runtime.distribute


def __getattr__(name):
    if name in _NAMES:
        _load()
        return globals()[name]
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule, e.g. `from keras_vit import cli`
    raise AttributeError(f"module 'keras_vit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES))


class _LoadAfterKeras:
    """Finds nothing itself: when Keras is first imported, it loads the package right after, so that
    `import keras_vit; import keras; keras.saving.load_model(...)` finds the registered layers."""

    searching = False

    def find_spec(self, name, path=None, target=None):
        if name != "keras" or self.searching:
            return None
        self.searching = True
        try:
            spec = importlib.util.find_spec("keras")
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _load()

        spec.loader.exec_module = exec_module
        return spec


if "keras" in sys.modules:
    _load()
else:
    sys.meta_path.insert(0, _LoadAfterKeras())
