"""1-D relative position attention (paper appendix D.4): one learned key per offset between a query
and a key position; the query's logits against those keys are added to the content logits."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.attention import MultiHeadDotProductAttention
from keras_vit.layers.initial import initial
from keras_vit.layers.transformer_block import TransformerBlock


def relative_offsets(num_tokens):
    """(T, T) int array: entry (q, k) indexes the offset q - k in a table of 2T - 1 offsets."""
    t = np.arange(num_tokens)
    return (t[:, None] - t[None, :] + num_tokens - 1).astype("int32")


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativeMultiHeadDotProductAttention(MultiHeadDotProductAttention):
    """`MultiHeadDotProductAttention` plus a bias `q_i . r[i - j]` on the logit of query i and key j.

    Positions are the token indices of the 1-D sequence (prefix tokens first, the grid in raster
    order), so the table `rel_embedding` holds (2T - 1, heads, head_dim) parameters, (2T - 1) * D
    a layer; T is read from the input when the layer is built. The queries are scaled by
    1/sqrt(head_dim) for both terms.

    Args:
        num_heads: number of heads; must divide the input width.
        dropout_rate: dropout on the attention weights (training only).
    """

    def build(self, input_shape):
        super().build(input_shape)
        if input_shape[1] is None:
            raise ValueError(f"relative attention needs a known number of tokens, got input shape {tuple(input_shape)}")
        self.num_tokens = int(input_shape[1])
        self.rel_embedding = self.add_weight(
            name="rel_embedding",
            shape=(2 * self.num_tokens - 1, self.num_heads, self.head_dim),
            initializer=initial(keras.initializers.RandomNormal(stddev=0.02)),
        )

    def _flash_possible(self):
        if self.attention_implementation == "flash":
            raise ValueError(f"{self.name}: attention_implementation='flash' cannot run here: relative attention "
                             "adds a bias to the logits, which the fused kernel does not take; use 'auto'")
        return False

    def logit_bias(self, q, scale, training=None, grid=None):
        t = self.num_tokens
        if q.shape[1] is not None and q.shape[1] != t:
            raise ValueError(f"relative attention was built for {t} tokens, got {q.shape[1]}")
        rel = ops.einsum("bqnh,onh->bnqo", q * ops.cast(scale, q.dtype), ops.cast(self.rel_embedding, q.dtype))
        index = ops.convert_to_tensor(relative_offsets(t)[None, None])
        index = ops.broadcast_to(index, (ops.shape(rel)[0], self.num_heads, t, t))
        return ops.take_along_axis(rel, index, axis=-1)

    def official_weights(self):
        return {**super().official_weights(), "rel_embedding": self.rel_embedding}


@keras.saving.register_keras_serializable(package="keras_vit")
class RelativeTransformerBlock(TransformerBlock):
    """`TransformerBlock` whose self-attention is `RelativeMultiHeadDotProductAttention`."""

    def make_attention(self, input_shape):
        if self.differential is not None:
            raise ValueError(f"{self.name}: differential attention does not take relative position embeddings")
        return RelativeMultiHeadDotProductAttention(self.num_heads, self.attention_dropout_rate,
                                                    **self.attention_args())
