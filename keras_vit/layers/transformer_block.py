"""The Transformer encoder block of ViT (paper Eq. 2-3): pre-LN attention and MLP with residuals."""

import math

import keras
from keras import ops

from keras_vit.layers.attention import MultiHeadDotProductAttention, _plain, check_attention_implementation, dense
from keras_vit.layers.differential_attention import DifferentialAttention
from keras_vit.layers.drop_path import check_drop_path_rate, drop_path, drop_path_keep
from keras_vit.layers.initial import initial
from keras_vit.layers.jax_cpu import cotangent_barrier, jax_cpu_remat
from keras_vit.layers.mlp import activate, check_mlp_activation, hidden_width, swiglu
from keras_vit.layers.norms import check_normalization, direct, make_norm, norm_weights, normalize
from keras_vit.layers.position_embedding import runtime_grid
from keras_vit.layers.quantized import with_sublayer_policies
from keras_vit.layers.relative_position_bias import RelativeBiasAttention
from keras_vit.layers.relative_position_mlp import RelativeMlpAttention
from keras_vit.layers.rotary import (check_rope, check_rope_head_dim, mixed_rope_frequencies, mixed_rope_tables,
                                     rope_augmented, rope_tables)
from keras_vit.runtime import per_platform

LAYER_NORM_EPSILON = 1e-6


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """`x + Dropout(MSA(LN(x)))`, then `x + MLP(LN(x))`; as the official `encoderblock_i`, each residual
    branch optionally dropped per sample in training (stochastic depth, `drop_path_rate`).

    Numerics follow the official model by default: LayerNorm epsilon 1e-6, tanh-approximate GELU,
    biases on every projection, dropout after every dense layer except q/k/v, dropout on the
    attention weights. timm and Hugging Face checkpoints take `approximate_gelu=False` (and
    Hugging Face `layer_norm_epsilon=1e-12`).

    Args:
        num_heads: attention heads.
        mlp_dim: hidden width of the MLP.
        dropout_rate: dropout after the attention output and each MLP dense layer.
        attention_dropout_rate: dropout on the attention weights.
        approximate_gelu: the MLP's GELU as the tanh approximation (official) or the exact erf form.
        layer_norm_epsilon: epsilon of both LayerNorms.
        mlp_activation: "gelu" (the paper's; `approximate_gelu` picks the form), "quick_gelu"
            (OpenAI CLIP's x * sigmoid(1.702 x)) or "swiglu" (DINOv2-giant: the first dense layer is
            2 * mlp_dim wide, silu of its first half times its second half).
        layer_scale: None, or the initial value of a learned per-channel scale on each residual
            branch (CaiT / DeiT III / DINOv2 layer scale: `x + ls * branch(x)`), parameters
            `LayerScale_0/scale` (attention) and `LayerScale_1/scale` (MLP).
        remat: in training, recompute the block's activations in the backward pass instead of
            keeping them (gradient checkpointing: `keras.remat`; with JAX on a CPU, where that
            saves nothing, a custom gradient that does). The dropout and drop-path masks are drawn
            outside the recomputed part, so the recomputation sees the same masks; attention-weight
            dropout is not supported with it.
        attention_implementation: "auto" (a GPU's fused kernel where backend, device, dtype and
            head size allow it, else the standard path), "flash" (the fused kernel, or a
            ValueError where it cannot run) or "standard".
        drop_path_rate: stochastic depth: in training, each residual branch (attention, MLP) is
            dropped for a whole sample with this probability and kept ones are scaled by
            1 / (1 - rate) (timm's `drop_path`; `keras_vit.layers.drop_path`), masks drawn per sample
            from the block's seed generator; 0 (the default) or evaluation computes exactly the
            block without it. In [0, 1); the builder gives each block its rate
            (`keras_vit.layers.drop_path_rates`).
        rope: None (the default), or the block's rotary position embedding (`keras_vit.layers.rotary`,
            DINOv3's or EVA-02's): `check_rope`'s dict (its kind and that kind's keys), `num_prefix_tokens` (the
            tokens before the patches, left unrotated) and either `grid_size` (gh, gw), the tables
            made once when the block is built, or `stride` (pixels per token), the grid read off the
            images each call gives (`images=`: a model that takes any size).
        mlp_norm: a LayerNorm `MlpNorm` on the MLP's hidden units, after the activation and before the second
            dense layer (EVA-02's SwiGLU; timm's `scale_mlp`); False (the default) has none.
        attention_norm: a LayerNorm on the heads' concatenated outputs before the attention's output
            projection (EVA-02 CLIP; timm's `scale_attn_inner`; see `MultiHeadDotProductAttention`).
        normalization: "layer_norm" (the default) or "rms_norm" (AIMv2's RMSNorm, no bias) for every norm of
            the block (`keras_vit.layers.norms`), of epsilon `layer_norm_epsilon`.
        post_norm: each norm after its branch, `x + norm(branch(x))` (timm's ResPostBlock), not before it.
        qk_norm: a norm on each head's queries and keys (`MultiHeadDotProductAttention`'s `qk_norm`).
        differential: None (the default), or the block's index: its attention differential (`DifferentialAttention`).
        parallel: the attention and the MLP side by side on one norm of x, `x + scale(attention(n) + mlp(n))`
            with `n = norm(x)` (ViT-22B's parallel layers; timm's ParallelScalingBlock): the block has no second
            norm and, with `layer_scale`, one scale.
        relative_bias_grid: None (the default), or the (h, w) patch grid of BEiT's relative position bias in the
            attention (`keras_vit.layers.relative_position_bias`; a class token first, then the grid).
        relative_mlp: None (the default), or timm's relative position MLP in the attention
            (`keras_vit.layers.relative_position_mlp`): a dict of its `grid_size`, `hidden_dim` and
            `num_prefix_tokens`.
        relative_stride: None (the default): the relative position bias (`relative_bias_grid`'s or
            `relative_mlp`'s) is for the grid the block is built at; or the pixels per token of the images
            each call gives (`images=`: a model that takes any size), whose grid the bias is made for there
            (BEiT's table resized as transformers' `interpolate_pos_encoding` resizes it).
    Call args:
        x: tokens (B, T, D).
        return_attention: also return the softmax attention weights (B, heads, T, T).
        valid: None, or (B, T) bool, the tokens attention reads (a NaFlex batch: False on padding).
        images: the model's images (B, H, W, C), for a rotary or relative block that reads its grid off them.
        rope_augment: None, or the (3, 2) draw of DINOv3's training-time augmentation of the rotary coordinates
            (`RotaryAugment`), which a block whose `rope` sets shift, jitter or rescale reads in training.
    """

    def __init__(self, num_heads, mlp_dim, dropout_rate=0.0, attention_dropout_rate=0.0, remat=False,
                 approximate_gelu=True, layer_norm_epsilon=LAYER_NORM_EPSILON, attention_implementation="auto",
                 mlp_activation="gelu", layer_scale=None, drop_path_rate=0.0, rope=None, mlp_norm=False,
                 attention_norm=False, normalization="layer_norm", relative_bias_grid=None, relative_mlp=None,
                 relative_stride=None, post_norm=False, qk_norm=False, parallel=False, differential=None, **kwargs):
        super().__init__(**kwargs)
        self.differential = differential
        self.post_norm, self.qk_norm, self.parallel = bool(post_norm), bool(qk_norm), bool(parallel)
        if self.post_norm and self.parallel:
            raise ValueError("TransformerBlock: post_norm and parallel do not combine (a parallel block's one norm "
                             "comes before its two branches)")
        self.relative_mlp = None if relative_mlp is None else {
            "grid_size": tuple(int(v) for v in relative_mlp["grid_size"]), "hidden_dim": int(relative_mlp["hidden_dim"]),
            "num_prefix_tokens": int(relative_mlp.get("num_prefix_tokens", 0))}
        self.relative_bias_grid = None if relative_bias_grid is None else tuple(int(v) for v in relative_bias_grid)
        self.relative_stride = _check_relative_stride(relative_stride, self.relative_bias_grid, self.relative_mlp)
        self.normalization = check_normalization(normalization)
        self.mlp_norm, self.attention_norm = bool(mlp_norm), bool(attention_norm)
        self.rope = _check_block_rope(rope)
        self.rope_moves = rope_augmented(self.rope)  # set once: read on every call
        self.drop_path_rate = check_drop_path_rate(drop_path_rate, f"{type(self).__name__}: drop_path_rate")
        self.mlp_activation = check_mlp_activation(mlp_activation)
        if layer_scale is not None and (isinstance(layer_scale, bool) or not isinstance(layer_scale, (int, float))):
            raise ValueError(f"layer_scale must be None or a float (the initial scale), got {layer_scale!r}")
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        self.attention_implementation = check_attention_implementation(attention_implementation)
        self.approximate_gelu = bool(approximate_gelu)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.remat = bool(remat)
        if self.remat and self.attention_dropout_rate > 0:
            raise ValueError(
                f"TransformerBlock: remat=True needs attention_dropout_rate=0, got {self.attention_dropout_rate} "
                "(the (B, heads, T, T) dropout mask would have to be kept, which remat is there to avoid)"
            )
        self.input_spec = keras.InputSpec(ndim=3)

    def build(self, input_shape):
        dim = input_shape[-1]
        policy = self.dtype_policy
        self.norm_0 = make_norm(self.normalization, self.layer_norm_epsilon, "LayerNorm_0", policy)
        self.attention = self.make_attention(input_shape)
        self.norm_2 = None if self.parallel else make_norm(self.normalization, self.layer_norm_epsilon, "LayerNorm_2",
                                                           policy)
        init = dict(kernel_initializer=initial("glorot_uniform"),
                    bias_initializer=initial(keras.initializers.RandomNormal(stddev=1e-6)))
        self.mlp_0 = keras.layers.Dense(hidden_width(self.mlp_dim, self.mlp_activation), name="Dense_0", dtype=policy,
                                        **init)
        self.mlp_1 = keras.layers.Dense(dim, name="Dense_1", dtype=policy, **init)
        self.dropout = keras.layers.Dropout(self.dropout_rate)
        # its own generator, made only with a rate: a model without stochastic depth has the state it had
        self.drop_path_seed = keras.random.SeedGenerator(name="drop_path_seed") if self.drop_path_rate else None
        self.norm_mlp = make_norm(self.normalization, self.layer_norm_epsilon, "MlpNorm", policy) if self.mlp_norm \
            else None
        for layer in (self.norm_0, self.attention, self.norm_2, self.mlp_0):
            if layer is not None:
                layer.build(input_shape)
        for layer in (self.norm_mlp, self.mlp_1):
            if layer is not None:
                layer.build((*input_shape[:-1], self.mlp_dim))
        self.tables = None
        if self.rope is not None:
            check_rope_head_dim(dim // self.num_heads)
            grid = self.rope["grid_size"]
            if grid is not None and input_shape[1] is not None and \
                    input_shape[1] != self.rope["num_prefix_tokens"] + grid[0] * grid[1]:
                raise ValueError(f"{self.name}: its rotary tables are laid out for {self.rope['num_prefix_tokens']} "
                                 f"prefix tokens and a {grid[0]}x{grid[1]} grid, got {input_shape[1]} tokens")
            if self.rope["kind"] == "mixed":  # learned: the block's own frequencies, its tables made per call
                frequencies = lambda shape, dtype=None: mixed_rope_frequencies(  # noqa: E731
                    self.num_heads, dim // self.num_heads, self.rope["temperature"],
                    keras.random.uniform((self.num_heads,), maxval=2 * math.pi))
                self.rope_freqs = self.add_weight(name="rope_freqs", shape=(2, self.num_heads, dim // self.num_heads // 2),
                                                  initializer=initial(frequencies))
            elif grid is not None:  # made once: a fixed grid's tables are constants
                self.tables = rope_tables(*grid, dim // self.num_heads, self.rope)
        self.scales = ()
        if self.layer_scale is not None:
            self.scales = tuple(self.add_weight(name=f"layer_scale_{i}", shape=(dim,),
                                                initializer=keras.initializers.Constant(self.layer_scale))
                                for i in range(1 if self.parallel else 2))

    def attention_args(self):
        """The keyword arguments every attention layer of this block takes (its subclasses' too)."""
        return dict(attention_implementation=self.attention_implementation, inner_norm=self.attention_norm,
                    layer_norm_epsilon=self.layer_norm_epsilon, normalization=self.normalization,
                    qk_norm=self.qk_norm, name="MultiHeadDotProductAttention_1", dtype=self.dtype_policy)

    def make_attention(self, input_shape):
        """The block's self-attention layer (a hook for subclasses)."""
        args = self.attention_args()
        if self.differential is not None:
            return DifferentialAttention(self.num_heads, self.differential, dropout_rate=self.attention_dropout_rate,
                                         **args)
        if self.relative_mlp is not None:
            return RelativeMlpAttention(self.num_heads, dropout_rate=self.attention_dropout_rate, **self.relative_mlp,
                                        **args)
        if self.relative_bias_grid is not None:
            return RelativeBiasAttention(self.num_heads, self.relative_bias_grid, dropout_rate=self.attention_dropout_rate,
                                         **args)
        return MultiHeadDotProductAttention(self.num_heads, self.attention_dropout_rate, **args)

    def call(self, x, training=None, return_attention=False, valid=None, images=None, rope_augment=None):
        x = cotangent_barrier(x)
        moved = rope_augment if training and self.rope_moves else None
        tables = self._tables(images, moved)
        grid = self._relative_grid(images)
        paths = self._path_masks(x) if training else ()  # drawn once: a recomputation reuses them
        if self.remat and training and not return_attention:
            # the masks travel with the dropout masks: the recomputation may close over no traced value
            keep = (self._keep_masks(x), paths, valid, tables)
            forward = lambda x, keep: self._forward(  # noqa: E731
                x, training, keep=keep[0], paths=keep[1], valid=keep[2], tables=keep[3], grid=grid)
            if keras.backend.backend() != "jax":
                if self.rope is not None and self.rope["kind"] == "mixed":  # tables of weights: made in the
                    # recomputed part, where TensorFlow's recompute_grad sees the weights they are read from
                    return keras.remat(lambda x: forward(x, (*keep[:3], self._tables(images, moved))))(x)
                return keras.remat(lambda x: forward(x, keep))(x)
            # chosen for the platform the step is lowered for: `jax.checkpoint` on a GPU or TPU
            return per_platform(x, keep, cpu=lambda x, keep: jax_cpu_remat(forward, self.variables, x, keep),
                                default=keras.remat(forward))
        return self._forward(x, training, return_attention=return_attention, valid=valid, paths=paths, tables=tables,
                             grid=grid)

    @property
    def reads_images(self):
        """Whether the block reads its grid off the images each call gives (`images=`): a rotary block without a
        grid of its own, or a relative one with a `relative_stride`."""
        return (self.rope is not None and self.rope["grid_size"] is None) or self.relative_stride is not None

    @property
    def rope_options(self):
        """The builder's `rope` this block was made with (`check_rope`'s dict), or None."""
        return None if self.rope is None else {k: v for k, v in self.rope.items() if k not in _ROPE_LAYOUT}

    def _tables(self, images, moved=None):
        """The rotary (sin, cos) tables of this call: the fixed grid's, or those of the grid of `images`; with
        `moved`, a draw of DINOv3's training-time augmentation (`RotaryAugment`), of the moved coordinates."""
        if self.rope is None or (self.tables is not None and moved is None):
            return self.tables
        grid = self.rope["grid_size"]
        if grid is None:
            grid = self._grid_of(images, "rotary", f"rope stride {self.rope['stride']}", self.rope["stride"])
        if self.rope["kind"] == "mixed":  # from the block's learned frequencies
            return mixed_rope_tables(*grid, self.rope_freqs, self.rope["axes"])
        return rope_tables(*grid, self.attention.head_dim, self.rope, moved)

    def _relative_grid(self, images):
        """The patch grid of this call's `images` for a relative block that reads it off them, else None."""
        if self.relative_stride is None:
            return None
        return self._grid_of(images, "relative position", f"relative_stride {self.relative_stride}",
                             self.relative_stride)

    def _grid_of(self, images, kind, setting, stride):
        """The patch grid of `images` cut in `stride`-pixel tokens, for a `kind` block that reads it off them (its
        `setting` said where the images are missing)."""
        if images is None:
            raise ValueError(f"{self.name}: a {kind} block that reads its grid off the images ({setting}) needs "
                             "them: call it with images=")
        return runtime_grid(images, stride)

    def _keep_masks(self, x):
        """Dropout keep-masks for the three dropouts of a training step (none without dropout)."""
        if not self.dropout_rate:
            return ()
        gen = self.dropout.seed_generator
        shape = ops.shape(x)
        hidden = (*shape[:-1], self.mlp_dim)
        return tuple(keras.random.uniform(s, seed=gen) >= self.dropout_rate for s in (shape, hidden, shape))

    def _path_masks(self, x):
        """Per-sample keep-masks (B, 1, 1) of the two residual branches (none without stochastic depth)."""
        if not self.drop_path_rate:
            return ()
        return tuple(drop_path_keep(x, self.drop_path_rate, self.drop_path_seed) for _ in range(2))

    def _drop_branch(self, y, paths, i):
        return drop_path(y, paths[i], self.drop_path_rate) if paths else y

    def _drop(self, y, training, keep, i):
        if not keep:  # the layer only where it drops something: a layer call is a host cost on eager torch
            return self.dropout(y, training=training) if training and self.dropout_rate else y
        return ops.where(keep[i], y / ops.cast(1.0 - self.dropout_rate, y.dtype), ops.zeros_like(y))

    def _dense(self, layer, x, activation=False):
        fused = activation and self.mlp_activation == "gelu"  # the backends' fused dense + GELU
        if not _plain(layer):
            y = layer(x)
        elif activation and self.mlp_activation == "swiglu":  # `activate`'s SwiGLU as two matmuls on the kernel's
            # halves, not one sliced after: TensorFlow's gradient of that slice cost a third of the MLP's step
            kernel, bias = ops.cast(layer.kernel, x.dtype), ops.cast(layer.bias, x.dtype)
            half = kernel.shape[-1] // 2
            return swiglu(dense(x, kernel[:, :half], bias[:half]), dense(x, kernel[:, half:], bias[half:]))
        else:
            y = dense(x, ops.cast(layer.kernel, x.dtype), ops.cast(layer.bias, x.dtype), gelu=fused,
                      approximate=self.approximate_gelu)
            if fused:
                return y
        return activate(y, self.mlp_activation, self.approximate_gelu) if activation else y

    def _scaled(self, y, i):
        return y * ops.cast(self.scales[i], y.dtype) if self.scales else y

    def _forward(self, x, training, return_attention=False, keep=(), valid=None, paths=(), tables=None, grid=None):
        positions = {} if tables is None else {"rope": tables, "rope_prefix_tokens": self.rope["num_prefix_tokens"]}
        if grid is not None:
            positions["grid"] = grid
        x_0 = x if self.post_norm else normalize(self.norm_0, x)
        attention = self.attention.call if direct(self.attention, x_0) else self.attention
        y = attention(x_0, training=training, return_attention=return_attention, valid=valid, **positions)
        if return_attention:
            y, weights = y
        if self.parallel:  # the MLP on the attention's input, the two branches summed, scaled and dropped as one
            y = self._drop(y, training, keep, 0) + self._drop(self._mlp(x_0, training, keep), training, keep, 2)
            x = x + self._drop_branch(self._scaled(y, 0), paths, 0)
            return (x, weights) if return_attention else x
        if self.post_norm:
            y = normalize(self.norm_0, y)
        x = x + self._drop_branch(self._drop(self._scaled(y, 0), training, keep, 0), paths, 0)
        y = self._mlp(x if self.post_norm else normalize(self.norm_2, x), training, keep)
        if self.post_norm:
            y = normalize(self.norm_2, y)
        x = x + self._drop_branch(self._drop(self._scaled(y, 1), training, keep, 2), paths, 1)
        return (x, weights) if return_attention else x

    def _mlp(self, x, training, keep):
        """The MLP branch on its input x, the dropout of its hidden units applied (not its output's)."""
        y = self._drop(self._dense(self.mlp_0, x, activation=True), training, keep, 1)
        return self._dense(self.mlp_1, y if self.norm_mlp is None else normalize(self.norm_mlp, y))

    def compute_output_shape(self, input_shape):
        return input_shape

    def official_weights(self):
        params = {f"LayerNorm_0/{k}": v for k, v in norm_weights(self.norm_0).items()}
        params |= {f"MultiHeadDotProductAttention_1/{k}": v for k, v in self.attention.official_weights().items()}
        if self.norm_2 is not None:
            params |= {f"LayerNorm_2/{k}": v for k, v in norm_weights(self.norm_2).items()}
        for name, layer in (("Dense_0", self.mlp_0), ("Dense_1", self.mlp_1)):
            params |= {f"MlpBlock_3/{name}/kernel": layer.kernel, f"MlpBlock_3/{name}/bias": layer.bias}
        if self.norm_mlp is not None:
            params |= {f"MlpBlock_3/norm/{k}": v for k, v in norm_weights(self.norm_mlp).items()}
        params |= {f"LayerScale_{i}/scale": scale for i, scale in enumerate(self.scales)}
        if self.rope is not None and self.rope["kind"] == "mixed":
            params["rope_freqs"] = self.rope_freqs
        return params

    def get_config(self):
        return {
            **with_sublayer_policies(self, super().get_config()),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "remat": self.remat,
            "approximate_gelu": self.approximate_gelu,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "attention_implementation": self.attention_implementation,
            "mlp_activation": self.mlp_activation,
            "layer_scale": self.layer_scale,
            "drop_path_rate": self.drop_path_rate,
            "rope": self.rope,
            "mlp_norm": self.mlp_norm,
            "attention_norm": self.attention_norm,
            "normalization": self.normalization,
            "relative_bias_grid": self.relative_bias_grid,
            "relative_mlp": self.relative_mlp,
            "relative_stride": self.relative_stride,
            "post_norm": self.post_norm,
            "qk_norm": self.qk_norm,
            "parallel": self.parallel,
            "differential": self.differential,
        }


_ROPE_LAYOUT = ("num_prefix_tokens", "grid_size", "stride")  # where a block's rope meets its tokens


def _check_relative_stride(stride, bias_grid, mlp):
    """`stride` (None, or a positive int) where the block has a relative position bias to give it to."""
    if stride is None:
        return None
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"relative_stride must be None or the pixels per token (a positive int), got {stride!r}")
    if bias_grid is None and mlp is None:
        raise ValueError("relative_stride reads the grid of a relative position bias off the images; the block has "
                         "none (relative_bias_grid and relative_mlp are None)")
    return stride


def _check_block_rope(rope):
    """A block's `rope` (see `TransformerBlock`) checked, with grid_size a tuple; a ValueError otherwise."""
    if rope is None:
        return None
    layout = _ROPE_LAYOUT
    if not isinstance(rope, dict):
        raise ValueError(f"TransformerBlock: rope must be None or a dict, got {rope!r}")
    checked = check_rope({k: v for k, v in rope.items() if k not in layout}, "TransformerBlock: rope")
    prefix, grid, stride = (rope.get(k) for k in layout)
    if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise ValueError(f"TransformerBlock: rope's num_prefix_tokens must be a non-negative int, got {prefix!r}")
    if (grid is None) == (stride is None):
        raise ValueError("TransformerBlock: rope takes grid_size (a fixed grid) or stride (the grid of the images "
                         f"each call gives), one of them; got grid_size={grid!r}, stride={stride!r}")
    grid = None if grid is None else tuple(int(v) for v in grid)
    return {**checked, "num_prefix_tokens": prefix, "grid_size": grid, "stride": stride}
