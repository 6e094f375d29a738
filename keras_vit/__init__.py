"""keras-vit: the Vision Transformer of "An Image is Worth 16x16 Words" for Keras 3."""

from keras_vit import layers, recipes  # recipes registers its schedules/losses for model reloading
from keras_vit.configs import VARIANTS, VariantConfig, get_variant
from keras_vit.features import feature_extractor
from keras_vit.patch_resize import resize_patch_embedding
from keras_vit.preprocessing import decode_predictions, preprocess_input
from keras_vit.runtime import distribute, exact_float32, jit_compile_default
from keras_vit.variants import (
    R26_ViT_B32,
    R26_ViT_S32,
    R50_ViT_B16,
    R50_ViT_L32,
    VisionTransformer,
    ViT_B8,
    ViT_B16,
    ViT_B32,
    ViT_H14,
    ViT_L16,
    ViT_L32,
    ViT_S16,
    ViT_S32,
    ViT_Ti16,
)
from keras_vit.weights import list_weights, load_weights

__version__ = "0.1.0"
