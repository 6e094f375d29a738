"""Where the ViT is inside a Keras model: its layers found by their names, at any nesting depth.

Shared by the checkpoint loader and the inspection tools.
"""

import re

_BLOCK_NAME = re.compile(r"^encoderblock_(\d+)$")


class ViTParts:
    """The layers of one ViT found inside a model, in the order they run.

    Attributes:
        container: the model (or layer) whose direct sub-layers are the ViT's.
        path: human-readable location of ``container`` inside the inspected model.
        crop: the layer that drops the pixels filling no whole patch (``crop_to_patches``) or None.
        resnet: the hybrid stem (``resnet`` layer) or None.
        embedding: the patch embedding (``embedding``).
        cls: the class-token layer (``cls``) or None (``classifier="gap"``/``"map"``).
        posembed: the position embedding (``posembed_input``).
        dist, registers: DeiT's distillation token and the register tokens (``PrefixTokens``
            layers ``dist`` / ``registers``), or None.
        pre_norm: the LayerNorm before the first block (``pre_norm``, CLIP) or None.
        blocks: the encoder blocks ``encoderblock_0 ... encoderblock_{L-1}``.
        grid_size: ``(gh, gw)`` patch grid.
        num_prefix_tokens: tokens before the patch grid: the class, distillation and register tokens.
        stride: pixels per token along each axis (patch size times ResNet stride).
        dropout: the dropout layer after the position embedding, or None.
        image_size: ``(H, W)`` the ViT expects, ``grid_size * stride``.
        block_posembeds: per block, the position embedding added right before it (None for none);
            block 0's is ``posembed`` itself, the others exist for ``position_placement``
            "every_layer" (``posembed_i``) or "every_layer_shared" (``posembed`` again).
    """

    def __init__(self, container, path, resnet, embedding, cls, posembed, blocks, block_posembeds=None, dist=None,
                 registers=None, pre_norm=None, dropout=None, crop=None):
        self.container = container
        self.crop = crop
        self.dist, self.registers, self.pre_norm, self.dropout = dist, registers, pre_norm, dropout
        self.path = path
        self.resnet = resnet
        self.embedding = embedding
        self.cls = cls
        self.posembed = posembed
        self.blocks = blocks
        self.block_posembeds = list(block_posembeds or [posembed] + [None] * (len(blocks) - 1))
        self.grid_size = tuple(int(v) for v in posembed.grid_size)
        self.num_prefix_tokens = (int(cls is not None) + int(dist is not None)
                                  + (0 if registers is None else int(registers.num_tokens)))
        self.stride = int(embedding.patch_size) * _stem_stride(resnet)
        self.image_size = (self.grid_size[0] * self.stride, self.grid_size[1] * self.stride)

    def embed(self, x, pixels=None, training=None):
        """The tokens entering block 0, from the patch embedding's output `x`: the prefix tokens
        and position embeddings in the order the builder lays them out (`pixels`: the images, for
        a position embedding of runtime resolution), then the dropout and `pre_norm` if any."""
        def add_positions(x):
            return self.posembed(x, pixels) if getattr(self.posembed, "stride", None) else self.posembed(x)

        covers_prefix = int(self.posembed.num_prefix_tokens) > 0 or self.cls is None
        if not covers_prefix:
            x = add_positions(x)
        for layer in (self.cls, self.dist):
            x = x if layer is None else layer(x)
        if covers_prefix:
            x = add_positions(x)
        if self.registers is not None:
            x = self.registers(x)
        if self.dropout is not None:
            x = self.dropout(x, training=training)
        return x if self.pre_norm is None else self.pre_norm(x)

    def family(self):
        """The builder's family options this ViT was built with (see `keras_vit.configs.FAMILY_DEFAULTS`),
        and its `classifier`."""
        block = self.blocks[0]
        names = {layer.name for layer in _direct_sublayers(self.container)}
        # a feature-map model without the final norm may have moved it after pooling (fc_norm) or have none: None
        pooled, final = bool(names & {"pool", "pool_average", "map_head"}), "encoder_norm" in names
        return dict(
            distillation_token=self.dist is not None,
            num_register_tokens=0 if self.registers is None else int(self.registers.num_tokens),
            prefix_position_embedding=int(self.posembed.num_prefix_tokens) > 0 or self.cls is None,
            layer_scale=getattr(block, "layer_scale", None), pre_norm=self.pre_norm is not None,
            fc_norm="fc_norm" in names if pooled or final else None,
            encoder_norm=final if pooled or final else None, mlp_activation=getattr(block, "mlp_activation", "gelu"),
            rope=getattr(block, "rope_options", None), mlp_norm=getattr(block, "mlp_norm", False),
            attention_norm=getattr(block, "attention_norm", False),
            normalization=getattr(block, "normalization", "layer_norm"), embed_norm="embed_norm" in names,
            relative_position_bias=getattr(block, "relative_bias_grid", None) is not None,
            relative_position_mlp=(getattr(block, "relative_mlp", None) or {}).get("hidden_dim"),
            post_norm=getattr(block, "post_norm", False), qk_norm=getattr(block, "qk_norm", False),
            parallel_blocks=getattr(block, "parallel", False), parallel_branches=getattr(block, "branches", 1),
            differential_attention=getattr(block, "differential", None) is not None,
            classifier=self._classifier(names))

    def _classifier(self, names):
        """The classifier the pooling of a model whose direct layers are `names` tells; None where it cannot be told:
        a feature-map model (pooling=None), or a class token beside a mean of the patch tokens (the "gap" classifier
        of CLIPForImageClassification, or a "token" model pooled by "gap": the same weights)."""
        if "map_head" in names:
            return "map"
        if not names & {"pool", "pool_average"}:
            return None
        method = self.container.get_layer("pool").method if "pool" in names else None
        if method == "token_gap":
            return method
        if self.cls is None:
            return "gap"
        return None if method == "gap" else "token"

    @property
    def num_layers(self):
        return len(self.blocks)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    @property
    def is_hybrid(self):
        return self.resnet is not None

    def __repr__(self):
        return (
            f"ViTParts(path={self.path!r}, layers={self.num_layers}, grid={self.grid_size}, "
            f"prefix={self.num_prefix_tokens}, image_size={self.image_size}, hybrid={self.is_hybrid})"
        )


def _stem_stride(resnet):
    if resnet is None:
        return 1
    stride = getattr(resnet, "stride", None)
    if stride is None:  # any stem that downsamples uniformly: measure it
        side = 1024
        out = resnet.compute_output_shape((1, side, side, 3))
        stride = side // int(out[1])
    return int(stride)


def _direct_sublayers(obj):
    layers = getattr(obj, "layers", None)
    if isinstance(layers, (list, tuple)):
        return list(layers)
    flatten = getattr(obj, "_flatten_layers", None)
    if flatten is not None:
        try:
            return list(flatten(include_self=False, recursive=False))
        except TypeError:
            return []
    return []


def _parts_of(container, path):
    """ViTParts if ``container``'s direct sub-layers form a ViT, else None."""
    by_name = {}
    for layer in _direct_sublayers(container):
        by_name.setdefault(layer.name, layer)
    if not {"embedding", "posembed_input", "encoderblock_0"} <= set(by_name):
        return None
    embedding, posembed = by_name["embedding"], by_name["posembed_input"]
    for layer, attrs in ((embedding, ("kernel", "patch_size")),
                         (posembed, ("grid_size", "num_prefix_tokens"))):
        missing = [a for a in attrs if not hasattr(layer, a)]
        if missing:
            raise ValueError(
                f"{path}: layer {layer.name!r} ({type(layer).__name__}) lacks {missing}; "
                "expected the keras_vit ViT layers (PatchEncoder / AddPositionEmbs)"
            )
    indices = sorted(int(m.group(1)) for m in map(_BLOCK_NAME.match, by_name) if m)
    if indices != list(range(len(indices))):
        raise ValueError(
            f"{path}: encoder blocks are not numbered 0..{len(indices) - 1}: found {indices}"
        )
    blocks = [by_name[f"encoderblock_{i}"] for i in indices]
    cls = by_name.get("cls")
    dist = by_name.get("dist")
    registers = by_name.get("registers")
    prefix = int(cls is not None) + int(dist is not None)
    # the prefix tokens, or none beside a class token, or the prefix and the registers (timm's vit_so150m*)
    covered = {prefix, prefix + (0 if registers is None else int(registers.num_tokens))} | ({0} if cls is not None else set())
    if int(posembed.num_prefix_tokens) not in covered:
        raise ValueError(
            f"{path}: posembed_input expects {posembed.num_prefix_tokens} prefix token(s) "
            f"but the model has {'a' if cls is not None else 'no'} 'cls' and {'a' if dist is not None else 'no'} "
            "'dist' layer"
        )
    # a position embedding shared by every block is one layer called once per block in the graph
    nodes = [n for depth in getattr(container, "_nodes_by_depth", {}).values() for n in depth]
    shared = sum(node.operation is posembed for node in nodes) > 1
    block_posembeds = [posembed] + [posembed if shared else by_name.get(f"posembed_{i}") for i in indices[1:]]
    return ViTParts(container, path, by_name.get("resnet"), embedding, cls, posembed, blocks, block_posembeds, dist=dist,
                     registers=by_name.get("registers"), pre_norm=by_name.get("pre_norm"),
                     dropout=by_name.get("dropout"), crop=by_name.get("crop_to_patches"))


def find_vit(model):
    """Locate the ViT inside ``model`` (itself, or nested at any depth).

    A ViT is recognised by sub-layers named ``embedding``, ``posembed_input`` and
    ``encoderblock_0`` (plus ``resnet`` for hybrids and ``cls`` for class-token
    models) that sit side by side in one model, as built by
    :func:`keras_vit.VisionTransformer`.

    Returns:
        :class:`ViTParts`.

    Raises:
        ValueError: if there is no ViT, or more than one (pass the sub-model you
            mean instead).
    """
    found, seen = [], set()

    def visit(obj, path):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        parts = _parts_of(obj, path)
        if parts is not None:
            found.append(parts)
            return
        for layer in _direct_sublayers(obj):
            visit(layer, f"{path}/{layer.name}")

    visit(model, getattr(model, "name", type(model).__name__))
    if not found:
        raise ValueError(
            f"no Vision Transformer found inside {getattr(model, 'name', model)!r} "
            f"({type(model).__name__}): expected layers named 'embedding', "
            "'posembed_input' and 'encoderblock_0' (as built by keras_vit.VisionTransformer), "
            "at any nesting depth"
        )
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} Vision Transformers found inside {getattr(model, 'name', model)!r} "
            f"at {[p.path for p in found]}; pass the one to inspect"
        )
    return found[0]


# a keras_vit model's output layer (by name) -> what the model outputs; "predictions" is the head's activation
OUTPUT_LAYERS = {"head": "logits", "head_average": "logits", "embeddings": "embeddings", "features": "features"}


def output_kind(model):
    """What a model built by keras_vit outputs: "probabilities" (a softmax head), "scores" (another
    activation), "logits", "embeddings" (a projection head) or "features" (include_top=False);
    None for a model of another make (its output layer has none of the builder's names)."""
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1 or not hasattr(outputs[0], "_keras_history"):
        return None
    layer = outputs[0]._keras_history.operation
    if layer.name == "predictions":
        # the function, not get_config(): serializing an activation imports TensorFlow on every backend
        activation = getattr(getattr(layer, "activation", None), "__name__", None)
        return "probabilities" if activation == "softmax" else "scores"
    return OUTPUT_LAYERS.get(layer.name)
