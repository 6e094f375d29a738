"""Saving layers whose sublayers Keras quantized (`model.quantize("int8")`).

`Model.quantize` quantizes the leaf Dense / EinsumDense layers, including those a composite layer
(an encoder block, its attention) creates in `build`; the composite's own dtype policy stays float.
A reloaded composite would build float sublayers that cannot take the int8 variables, so the
composite's config carries a `DTypePolicyMap` from each quantized sublayer's path to its policy;
the sublayers, built with that map as their dtype, look their own policy up by path.
"""

import keras


def with_sublayer_policies(layer, config):
    """`config` (the layer's get_config) with "dtype" a map of its quantized sublayers' policies."""
    if isinstance(layer._dtype_policy, keras.dtype_policies.DTypePolicyMap):
        return config  # already one (a reloaded layer): Layer.get_config serialised it
    quantized = {sub.path: sub.dtype_policy for sub in layer._flatten_layers(include_self=False)
                 if sub.quantization_mode is not None}
    if quantized:
        policy = keras.dtype_policies.DTypePolicyMap(default_policy=layer.dtype_policy, policy_map=quantized)
        config["dtype"] = keras.dtype_policies.serialize(policy)
    return config
