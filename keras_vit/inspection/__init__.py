"""Inspecting a Vision Transformer (paper section 4.5, appendices D.7 and D.8).

* `maps`: the four analyses as pure numpy functions: :func:`attention_rollout` (D.8, Figures 6
  and 14), :func:`mean_attention_distance` (D.7, Figures 7 right and 11),
  :func:`position_embedding_similarity` (Figure 7 centre), :func:`embedding_filters` (Figure 7
  left), and :func:`upsample_map` to draw a patch-grid map over an image.
* `capture`: :func:`attention_maps` runs a ViT (found anywhere inside a possibly nested Keras
  model) block by block and returns the softmax attention of every block.
* `figures`: :func:`inspect_model` draws all four figures into a folder (`plots` draws each);
  the command line is ``keras-vit inspect``.
"""

from keras_vit.inspection.capture import attention_maps
from keras_vit.inspection.figures import FIGURE_NAMES, inspect_model
from keras_vit.inspection.maps import (
    attention_rollout,
    embedding_filters,
    mean_attention_distance,
    patch_centres,
    position_embedding_similarity,
    upsample_map,
)
from keras_vit.structure import ViTParts, find_vit

__all__ = [
    "FIGURE_NAMES",
    "ViTParts",
    "attention_maps",
    "attention_rollout",
    "embedding_filters",
    "find_vit",
    "inspect_model",
    "mean_attention_distance",
    "patch_centres",
    "position_embedding_similarity",
    "upsample_map",
]
