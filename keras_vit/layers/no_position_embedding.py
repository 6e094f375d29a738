"""No position information: the patches as a bag (paper appendix D.4, Table 8's first row)."""

import keras

from keras_vit.layers.position_embedding import AddPositionEmbs


@keras.saving.register_keras_serializable(package="keras_vit")
class NoPositionEmbs(AddPositionEmbs):
    """Adds nothing; checks the token count and carries the patch grid for the tools that read it.

    Args:
        grid_size: (gh, gw), the patch grid.
        num_prefix_tokens: tokens before the grid (1 for the [class] token, 0 for "gap" models).
    """

    pos_embedding = None

    def build(self, input_shape):
        self._check(input_shape)

    def call(self, tokens, images=None, patch_coord=None, patch_valid=None):  # the parent's signature
        if patch_coord is None and self.stride is None:  # any size, or a NaFlex batch: any number of tokens
            self._check(tokens.shape)
        return tokens

    def official_weights(self):
        return {}
