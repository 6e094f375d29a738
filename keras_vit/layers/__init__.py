"""The layers of the Vision Transformer, one concept per file."""

from keras_vit.layers.attention import MultiHeadDotProductAttention
from keras_vit.layers.class_token import ClassToken
from keras_vit.layers.crop_to_patches import CropToPatches
from keras_vit.layers.differential_attention import DifferentialAttention
from keras_vit.layers.drop_path import drop_path, drop_path_keep, drop_path_rates
from keras_vit.layers.factorized_position_embedding import AddFactorizedPositionEmbs
from keras_vit.layers.feature_map import TokensToMap
from keras_vit.layers.group_norm import GroupNorm
from keras_vit.layers.map_head import MAPHead
from keras_vit.layers.no_position_embedding import NoPositionEmbs
from keras_vit.layers.norms import NORMALIZATIONS, make_norm
from keras_vit.layers.parallel_branches import ParallelBranchesBlock
from keras_vit.layers.patch_corruption import MaskedPatchCorruption
from keras_vit.layers.patch_encoder import PatchEncoder
from keras_vit.layers.patch_targets import MaskedPatchTargets
from keras_vit.layers.pooling import SequencePooling
from keras_vit.layers.prefix_tokens import PrefixTokens
from keras_vit.layers.position_embedding import AddPositionEmbs, resize_position_embeddings
from keras_vit.layers.position_embedding_2d import AddPositionEmbs2D
from keras_vit.layers.relative_attention import RelativeMultiHeadDotProductAttention, RelativeTransformerBlock
from keras_vit.layers.relative_position_bias import (RelativeBiasAttention, relative_position_index,
                                                     resize_relative_position_bias)
from keras_vit.layers.relative_position_mlp import RelativeMlpAttention
from keras_vit.layers.resize_images import ResizeImages
from keras_vit.layers.resnet import BottleneckUnit, ResNetStem, StdConv2D, standardize_kernel
from keras_vit.layers.rotary import rope_tables, rotate_patches
from keras_vit.layers.rotary_augment import RotaryAugment, rotary_augment_inputs
from keras_vit.layers.token_validity import TokenValidity
from keras_vit.layers.top_k import TopK
from keras_vit.layers.transformer_block import TransformerBlock

__all__ = [
    "AddFactorizedPositionEmbs",
    "AddPositionEmbs",
    "AddPositionEmbs2D",
    "BottleneckUnit",
    "ClassToken",
    "CropToPatches",
    "DifferentialAttention",
    "GroupNorm",
    "MAPHead",
    "MaskedPatchCorruption",
    "MaskedPatchTargets",
    "MultiHeadDotProductAttention",
    "NORMALIZATIONS",
    "NoPositionEmbs",
    "ParallelBranchesBlock",
    "PatchEncoder",
    "PrefixTokens",
    "RelativeBiasAttention",
    "RelativeMlpAttention",
    "RelativeMultiHeadDotProductAttention",
    "RelativeTransformerBlock",
    "ResNetStem",
    "ResizeImages",
    "RotaryAugment",
    "SequencePooling",
    "StdConv2D",
    "TokenValidity",
    "TokensToMap",
    "TopK",
    "TransformerBlock",
    "drop_path",
    "drop_path_keep",
    "drop_path_rates",
    "make_norm",
    "relative_position_index",
    "resize_relative_position_bias",
    "resize_position_embeddings",
    "rope_tables",
    "rotary_augment_inputs",
    "rotate_patches",
    "standardize_kernel",
]
