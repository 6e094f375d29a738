"""The builder's architecture options as one validated object (`keras_vit.model.build_vit` makes it)."""

import dataclasses

import keras

from keras_vit.configs import resnet_stride
from keras_vit.interpolation import check_interpolation
from keras_vit.layers.attention import check_attention_implementation
from keras_vit.layers.drop_path import check_drop_path_rate
from keras_vit.layers.mlp import check_mlp_activation
from keras_vit.layers.norms import check_normalization
from keras_vit.layers.resnet import check_numerics
from keras_vit.layers.rotary import check_rope, check_rope_head_dim
from keras_vit.preprocessing import NORMALIZATIONS

CLASSIFIERS = ("token", "gap", "map", "token_gap")
CLASS_TOKEN_CLASSIFIERS = ("token", "token_gap")  # those that read a class token
POOLINGS = ("representation", None, "token", "avg")
# paper appendix D.4 / Table 8: what encodes position, and where it is added; "factorized": NaViT's
# per-axis tables (timm's NaFlex "parfac" models)
POSITION_EMBEDDINGS = ("learned_1d", "learned_2d", "relative", "none", "factorized")
# the position embeddings a model that takes any size (and a NaFlex batch) can have: read at any grid
ANY_SIZE_POSITIONS = ("learned_1d", "factorized", "none")
POSITION_PLACEMENTS = ("once", "every_layer", "every_layer_shared")
# what the model's input holds: images already in [-1, 1], or uint8 [0, 255] scaled on the device
INPUT_DTYPES = ("float32", "uint8")
# what the top is: a classifier (logits, or probabilities through classifier_activation) or a projection
# into an embedding space (CLIP's), whose output is named "embeddings" and takes no activation
HEADS = ("classifier", "projection")


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """The architecture of a Vision Transformer: `build_vit`'s arguments but `input_tensor` and `name`,
    with its defaults (what each means: `build_vit`'s docstring), checked when the object is made, and
    the facts the builder's stages derive from them. `image_size` and `input_shape` are kept as given:
    the builder resolves them against its input tensor.

    Raises:
        ValueError: an option out of its range or two options that do not go together, in the
            builder's words (TypeError where a value is not even of the expected kind).
    """

    image_size: int | tuple | None = 224
    patch_size: int = 16
    hidden_size: int = 768
    mlp_dim: int = 3072
    num_heads: int = 12
    num_layers: int = 12
    classes: int = 1000
    classifier: str = "token"
    representation_size: int | None = None
    resnet: dict | None = None
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    include_top: bool = True
    classifier_activation: object = "softmax"  # a name, a callable or None
    remat: bool = False
    input_shape: tuple | None = None
    pooling: str | None = "representation"
    position_embedding: str = "learned_1d"
    position_placement: str = "once"
    approximate_gelu: bool = True
    layer_norm_epsilon: float = 1e-6
    input_dtype: str = "float32"
    input_mode: str = "vit"
    attention_implementation: str = "auto"
    distillation_token: bool = False
    num_register_tokens: int = 0
    prefix_position_embedding: bool = True
    layer_scale: float | None = None
    pre_norm: bool = False
    fc_norm: bool = False
    mlp_activation: str = "gelu"
    position_interpolation: str = "bilinear"
    head: str = "classifier"
    position_aspect_preserving: bool = False
    naflex: bool = False
    drop_path_rate: float = 0.0
    crop_to_patches: bool = False
    rope: dict | None = None
    mlp_norm: bool = False
    attention_norm: bool = False
    normalization: str = "layer_norm"
    embed_norm: bool = False
    relative_position_bias: bool = False
    relative_position_mlp: int | None = None
    post_norm: bool = False
    qk_norm: bool = False
    parallel_blocks: bool = False
    parallel_branches: int = 1
    differential_attention: bool = False
    class_token: bool | None = None
    map_num_heads: int | None = None
    map_mlp_dim: int | None = None
    map_include_prefix: bool = False
    encoder_norm: bool = True
    register_position_embedding: bool = False

    def __post_init__(self):
        # In this order, the builder's: of several bad options, the same one is named.
        _check_positions(self)
        _check_input(self)
        check_attention_implementation(self.attention_implementation)
        _check_head(self)
        _check_numbers(self)
        check_drop_path_rate(self.drop_path_rate)
        _check_pooling(self)
        check_mlp_activation(self.mlp_activation)
        check_normalization(self.normalization)
        check_interpolation(self.position_interpolation, "position_interpolation")
        _check_token_layout(self)
        _check_rope(self)
        _check_relative_bias(self)
        _check_class_token_and_map(self)

    @property
    def cls_tokens(self):
        """The class and distillation tokens: what the position embeddings cover beside the patches."""
        return int(self.has_class_token) + int(bool(self.distillation_token))

    @property
    def has_class_token(self):
        """Whether the model has a class token: the "token" classifier's, or one `class_token=True` puts beside
        another (Perception Encoder's, pooled by attention or average)."""
        return self.classifier in CLASS_TOKEN_CLASSIFIERS if self.class_token is None else bool(self.class_token)

    @property
    def num_prefix_tokens(self):
        """The tokens before the patch grid (class, distillation, registers): what pooling drops."""
        return self.cls_tokens + self.num_register_tokens

    @property
    def position_prefix_tokens(self):
        """The prefix tokens that get a position embedding (none when added to the patches only)."""
        if not self.prefix_position_embedding:
            return 0
        return self.cls_tokens + (self.num_register_tokens if self.register_position_embedding else 0)

    @property
    def stride(self):
        """Pixels per token along each axis: the patch size times a hybrid's ResNet stride."""
        return self.patch_size * resnet_stride(self.resnet and self.resnet["num_layers"])

    def check_any_size(self, what="a model of runtime resolution (image_size=None or a None height/width)"):
        """Raises unless the position embeddings can be resized at call time: a model that takes
        any size (or a NaFlex batch) has one learned 1-D or factorized table, or none, added once."""
        if self.position_embedding not in ANY_SIZE_POSITIONS or self.position_placement != "once":
            raise ValueError(
                f"{what} takes position_embedding 'learned_1d', 'factorized' or 'none' added once; got "
                f"position_embedding={self.position_embedding!r}, position_placement={self.position_placement!r}")


def _check_positions(c):
    if c.position_embedding not in POSITION_EMBEDDINGS:
        raise ValueError(f"unknown position_embedding {c.position_embedding!r}; expected one of {POSITION_EMBEDDINGS}")
    if c.position_placement not in POSITION_PLACEMENTS:
        raise ValueError(f"unknown position_placement {c.position_placement!r}; expected one of {POSITION_PLACEMENTS}")
    if c.position_placement != "once" and c.position_embedding not in ("learned_1d", "learned_2d"):
        raise ValueError(
            f"position_placement={c.position_placement!r} needs a learned position embedding, got "
            f"position_embedding={c.position_embedding!r} (Table 8 has no such variant)"
        )
    if c.position_aspect_preserving and c.position_embedding not in ("learned_1d", "factorized"):
        raise ValueError(f"position_aspect_preserving=True resizes learned 1-D or factorized position embeddings, "
                         f"got position_embedding={c.position_embedding!r}")
    if c.naflex:
        c.check_any_size("a NaFlex model (naflex=True)")
        if c.resnet is not None:
            raise ValueError("naflex=True takes patches of pixels; a hybrid's ResNet stem needs whole images "
                             "(resnet=None)")


def _check_input(c):
    if c.input_dtype not in INPUT_DTYPES:
        raise ValueError(f"unknown input_dtype {c.input_dtype!r}; expected one of {INPUT_DTYPES}")
    if c.input_mode not in NORMALIZATIONS or (c.input_mode != "vit" and c.input_dtype != "uint8"):
        raise ValueError(f"input_mode {c.input_mode!r} must be one of {tuple(NORMALIZATIONS)}, and other than 'vit' "
                         f"only with input_dtype='uint8' (got input_dtype={c.input_dtype!r})")


def _check_head(c):
    if c.head not in HEADS:
        raise ValueError(f"unknown head {c.head!r}; expected one of {HEADS}")
    if c.head == "projection" and c.include_top and (c.classifier_activation is not None or c.distillation_token):
        raise ValueError(f"head='projection' outputs an embedding: it takes classifier_activation=None and no "
                         f"distillation token, got classifier_activation={c.classifier_activation!r}, "
                         f"distillation_token={c.distillation_token!r}")
    if c.classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {c.classifier!r}; expected one of {CLASSIFIERS}")
    if c.classifier_activation is not None:  # checked with or without a top, as every other argument
        try:
            keras.activations.get(c.classifier_activation)
        except (ValueError, TypeError):
            raise ValueError(f"unknown classifier_activation {c.classifier_activation!r}; expected None, the name of "
                             "a Keras activation (e.g. 'softmax') or a callable") from None


def _check_numbers(c):
    for key in ("patch_size", "hidden_size", "mlp_dim", "num_heads", "num_layers", "classes", "parallel_branches"):
        value = getattr(c, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    if c.hidden_size % c.num_heads:
        raise ValueError(f"hidden_size {c.hidden_size} is not divisible by num_heads {c.num_heads}")
    if c.resnet is not None:
        unknown = set(c.resnet) - {"num_layers", "width_factor", "numerics"}
        if unknown or "num_layers" not in c.resnet:
            raise ValueError(f"resnet must be None or {{'num_layers': (...), 'width_factor': int, 'numerics': "
                             f"'official' or 'timm'}}, got {c.resnet!r}")
        check_numerics(c.resnet.get("numerics", "official"))
    if not isinstance(c.crop_to_patches, bool):
        raise ValueError(f"crop_to_patches must be True or False, got {c.crop_to_patches!r}")
    if c.crop_to_patches and c.resnet is not None:
        raise ValueError("crop_to_patches=True drops the pixels a patch convolution without padding leaves unread; "
                         "a hybrid's ResNet stem pads its convolutions and reads them all (resnet=None)")


def _check_pooling(c):
    if c.pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {c.pooling!r}; expected one of {POOLINGS}")
    if c.include_top and c.pooling not in ("representation", "avg"):
        raise ValueError(f"pooling={c.pooling!r} is for include_top=False (the head reads the representation, or "
                         "with 'avg' the mean of the patch tokens)")
    if c.pooling == "token" and not c.has_class_token:
        raise ValueError(f'pooling="token" needs a class token; this model has classifier={c.classifier!r} (use "avg")')
    if c.pooling != "representation" and c.representation_size is not None:
        raise ValueError(f"representation_size (pre-logits) goes with pooling='representation', got pooling={c.pooling!r}")


def _check_token_layout(c):
    """The tokens before the patches (class, distillation, registers) and which get position embeddings."""
    n = c.num_register_tokens
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"num_register_tokens must be a non-negative int, got {n!r}")
    layout = [f"num_register_tokens={n}"] if n else []
    layout += [] if c.prefix_position_embedding else ["prefix_position_embedding=False"]
    if c.position_placement != "once" and layout:
        raise ValueError(f"position_placement={c.position_placement!r} adds position embeddings to every block's "
                         f"tokens, which {', '.join(layout)} does not lay out; use position_placement='once'")
    if not c.prefix_position_embedding and c.position_embedding not in ("learned_1d", "learned_2d", "factorized"):
        raise ValueError(f"prefix_position_embedding=False is about learned position embeddings, got "
                         f"position_embedding={c.position_embedding!r}")
    if c.register_position_embedding and not (n and c.prefix_position_embedding and c.position_placement == "once"
                                              and c.position_embedding in ("learned_1d", "learned_2d")):
        raise ValueError("register_position_embedding=True gives the register tokens learned position embeddings: it "
                         f"takes num_register_tokens > 0 and prefix_position_embedding=True, got {', '.join(layout)}")
    if c.position_embedding == "factorized" and c.position_prefix_tokens:
        raise ValueError("position_embedding='factorized' adds to the patch tokens only: with a class or distillation "
                         "token it takes prefix_position_embedding=False (as timm's NaFlex models)")
    if c.distillation_token and c.classifier != "token":
        raise ValueError(f"distillation_token=True sits beside a class token (classifier='token'), got "
                         f"classifier={c.classifier!r}")
    if c.distillation_token and (c.representation_size is not None or c.fc_norm):
        raise ValueError("distillation_token=True takes no representation_size (pre-logits) and no fc_norm "
                         "(DeiT has neither)")


def _check_class_token_and_map(c):
    """A class token beside another classifier, and the attention-pool head's own options."""
    if c.class_token is not None and not isinstance(c.class_token, bool):
        raise ValueError(f"class_token must be None (as the classifier says), True or False, got {c.class_token!r}")
    if c.class_token is False and c.classifier in CLASS_TOKEN_CLASSIFIERS:
        raise ValueError(f"class_token=False: classifier={c.classifier!r} reads the class token; use classifier='gap' "
                         "or 'map'")
    heads = c.map_num_heads
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1
                              or c.hidden_size % heads):
        raise ValueError(f"map_num_heads must be None (the encoder's) or a positive int dividing hidden_size "
                         f"{c.hidden_size}, got {heads!r}")
    mlp = c.map_mlp_dim
    if mlp is not None and (isinstance(mlp, bool) or not isinstance(mlp, int) or mlp < 0):
        raise ValueError(f"map_mlp_dim must be None (the encoder's mlp_dim), a positive int or 0 (no MLP), got {mlp!r}")
    if (heads is not None or mlp is not None or c.map_include_prefix) and c.classifier != "map":
        raise ValueError(f"map_num_heads, map_mlp_dim and map_include_prefix are the attention-pool head's "
                         f"(classifier='map'), got classifier={c.classifier!r}")


def _check_relative_bias(c):
    """BEiT's relative position bias: a class token and the patches, nothing else, on one grid; timm's relative
    position MLP: a positive hidden width, any class token, no other prefix, no other relative encoding."""
    mlp = c.relative_position_mlp
    if mlp is not None:
        if isinstance(mlp, bool) or not isinstance(mlp, int) or mlp < 1:
            raise ValueError(f"relative_position_mlp must be None or the MLP's hidden width (a positive int), got {mlp!r}")
        if c.relative_position_bias or c.position_embedding == "relative" or c.num_register_tokens or \
                c.distillation_token or c.naflex:
            raise ValueError("relative_position_mlp (timm's relative position MLP) takes a class token or none and "
                             "no other relative encoding; got relative_position_bias="
                             f"{c.relative_position_bias}, position_embedding={c.position_embedding!r}, "
                             f"num_register_tokens={c.num_register_tokens}, distillation_token={c.distillation_token}, "
                             f"naflex={c.naflex}")
    if not c.relative_position_bias:
        return
    if c.classifier != "token" or c.num_register_tokens or c.distillation_token or c.naflex:
        raise ValueError("relative_position_bias=True is BEiT's: laid out for a class token and the patch grid; got "
                         f"classifier={c.classifier!r}, num_register_tokens={c.num_register_tokens}, "
                         f"distillation_token={c.distillation_token}, naflex={c.naflex}")
    if c.position_embedding == "relative":
        raise ValueError("relative_position_bias=True (BEiT's 2-D bias) and position_embedding='relative' (the "
                         "paper's 1-D relative attention) are two encodings of the same thing; choose one")


def _check_rope(c):
    """Rotary position embedding: a known kind, heads it can rotate, and images (not a NaFlex batch)."""
    object.__setattr__(c, "rope", check_rope(c.rope))  # normalised: the temperature a float
    if c.rope is None:
        return
    check_rope_head_dim(c.hidden_size // c.num_heads)
    if c.naflex:
        raise ValueError("rope: a NaFlex batch holds each image at its own grid, which the rotary tables are not laid "
                         "out for; use naflex=False")
