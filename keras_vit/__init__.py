"""keras-vit: the Vision Transformer of "An Image is Worth 16x16 Words" for Keras 3.

Plain imports: `import keras_vit` imports Keras (and so its backend) and registers the package's
layers, schedules and losses, so `keras.saving.load_model` finds them in safe mode. Keras is imported
first, by `keras_vit.startup.import_backend`: TensorFlow's start-up notes held back, as TF_CPP_MIN_LOG_LEVEL
holds back its later ones, so every entry point starts quietly.
"""

from keras_vit.startup import import_backend

import_backend()  # before any module of the package imports Keras

from keras_vit import distribute, layers, recipes
from keras_vit.configs import VARIANTS, VariantConfig, get_variant
from keras_vit.convert import from_huggingface, from_keras_hub, from_timm
from keras_vit.features import feature_extractor
from keras_vit.lora import enable_lora, load_lora, merge_lora, save_lora
from keras_vit.model import any_size
from keras_vit.patch_resize import resize_patch_embedding
from keras_vit.preprocessing import decode_predictions, preprocess_input
from keras_vit.runtime import exact_float32, jit_compile_default
from keras_vit.variants import *  # noqa: F403  VisionTransformer and one factory per row of VARIANTS
from keras_vit.variants import __all__ as _factories
from keras_vit.weights import list_weights, load_weights

__version__ = "0.1.0"
__all__ = sorted({
    "VARIANTS", "VariantConfig", "any_size", "decode_predictions", "distribute", "enable_lora", "exact_float32",
    "feature_extractor", "load_lora", "merge_lora", "save_lora",
    "from_huggingface", "from_keras_hub", "from_timm", "get_variant", "jit_compile_default", "layers", "list_weights", "load_weights", "preprocess_input",
    "recipes", "resize_patch_embedding", *_factories})
