"""Masked patch prediction, the paper's self-supervision (section 4.6, appendix B.1.2).

    encoder = keras_vit.VisionTransformer(image_size=224, include_top=False, ...)   # any ViT
    model = MaskedPatchPredictor(encoder, target="mean_color")
    compile_for_masked_patch_prediction(model, total_steps=100_000)
    model.fit(images_dataset, ...)                 # images only, no labels
    keras_vit.weights.save_npz(model.encoder, "ssl.npz")
    keras_vit.VisionTransformer(..., classes=10, weights="ssl.npz")   # fine-tune as any checkpoint

Half of the patch embeddings are corrupted (`MaskedPatchCorruption`), the encoder runs on the
corrupted sequence, and a linear layer on each corrupted patch's output token predicts its target
(`MaskedPatchTargets`): the 3-bit mean colour (one of 512 classes; the paper's reported option),
its 4x4 downsized colours (16 predictions of 512 classes), or its pixels (L2 regression).
"""

import keras
import numpy as np
from keras import ops

from keras_vit import recipes
from keras_vit.calls import KeepsStateOnError
from keras_vit.layers.patch_corruption import MaskedPatchCorruption
from keras_vit.layers.patch_targets import TARGETS, MaskedPatchTargets
from keras_vit.recipes.compile import _clipnorm
from keras_vit.runtime import jit_compile_default
from keras_vit.structure import find_vit

__all__ = ["MaskedPatchPredictor", "compile_for_masked_patch_prediction", "patch_targets", "color_classes"]


# --------------------------------------------------------------------------
# targets: the numpy reference
# --------------------------------------------------------------------------
def color_classes(colours, bits=3):
    """(..., C) colours in [-1, 1] -> (...,) int class of 2**(bits*C): channel bins, first channel most significant."""
    colours = np.asarray(colours, np.float64)
    levels = 2 ** bits
    bins = np.clip(np.floor((colours + 1.0) / 2.0 * levels), 0, levels - 1).astype(np.int64)
    classes = np.zeros(bins.shape[:-1], np.int64)
    for c in range(bins.shape[-1]):
        classes = classes * levels + bins[..., c]
    return classes


def patch_targets(images, patch_size, target="mean_color", bits=3, size=4):
    """The targets of `MaskedPatchTargets` for (B, H, W, C) images in [-1, 1], in numpy (float64)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    images = np.asarray(images, np.float64)
    b, h, w, c = images.shape
    p = patch_size
    patches = [images[:, i:i + p, j:j + p] for i in range(0, h, p) for j in range(0, w, p)]
    patches = np.stack(patches, axis=1)  # (B, N, P, P, C), row-major over the grid
    if target == "pixels":
        return patches.reshape(b, len(patches[0]), -1)
    if target == "mean_color":
        return color_classes(patches.mean(axis=(2, 3)), bits)[:, :, None]
    k = p // size
    cells = np.stack([patches[:, :, r * k:(r + 1) * k, s * k:(s + 1) * k].mean(axis=(2, 3))
                      for r in range(size) for s in range(size)], axis=2)
    return color_classes(cells, bits)


# --------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------
@keras.saving.register_keras_serializable(package="keras_vit")
class MaskedPatchPredictor(KeepsStateOnError, keras.Model):
    """A ViT encoder trained to predict its corrupted patches; `fit` it on images alone.

    It runs the encoder's own layers (ResNet stem, `embedding`, then the corruption, `cls`, the
    position embeddings, the blocks and `encoder_norm`), so training it trains `encoder`, which
    saves and loads like any ViT (`keras_vit.weights.save_npz(model.encoder, path)`). Its output is
    a dict: "predictions" (B, N, K, 512) logits (K = 1 or 16) or (B, N, P*P*C) pixels, "targets"
    and "corrupted" (B, N); the loss averages over the corrupted patches only.

    Args:
        encoder: a model built by `keras_vit.VisionTransformer` (usually `include_top=False`).
        target: "mean_color", "downsized_color" or "pixels" (appendix B.1.2's options 1-3).
        corruption_rate, mask_fraction, random_fraction: see `MaskedPatchCorruption`.
        bits: colour bits a channel of the class targets.
        seed: seed of the corruption's random draws.
    """

    def __init__(self, encoder, target="mean_color", corruption_rate=0.5, mask_fraction=0.8, random_fraction=0.1,
                 bits=3, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.parts = find_vit(encoder)
        self.target = target
        self.corruption_rate, self.mask_fraction, self.random_fraction = corruption_rate, mask_fraction, random_fraction
        self.bits, self.seed = int(bits), seed
        self.corruption = MaskedPatchCorruption(corruption_rate, mask_fraction, random_fraction, seed=seed,
                                                name="corruption")
        self.targets = MaskedPatchTargets(self.parts.stride, target, bits=bits, name="targets")
        self.classes = 2 ** (self.bits * 3)
        p = self.parts.stride
        self.outputs_per_patch = {"mean_color": 1, "downsized_color": self.targets.size ** 2}.get(target)
        width = p * p * 3 if target == "pixels" else self.outputs_per_patch * self.classes
        self.head = keras.layers.Dense(width, name="prediction_head", dtype="float32")
        self.encoder_norm = encoder.get_layer("encoder_norm")
        self.build()

    def build(self, input_shape=None):
        dim = self.parts.embedding.hidden_size
        n = self.parts.grid_size[0] * self.parts.grid_size[1]
        for layer in (self.corruption, self.head):
            if not layer.built:
                layer.build((None, n, dim))
        self.built = True

    def call(self, images, training=None):
        parts = self.parts
        x = images
        if parts.resnet is not None:
            x = parts.resnet(x, training=training)
        x = parts.embedding(x)
        x, corrupted = self.corruption(x)
        x = parts.embed(x, training=training)
        for i, block in enumerate(parts.blocks):
            if i and parts.block_posembeds[i] is not None:
                x = parts.block_posembeds[i](x)
            x = block(x, training=training)
        x = self.encoder_norm(x)[:, parts.num_prefix_tokens:]
        predictions = self.head(x)
        if self.target != "pixels":
            predictions = ops.reshape(predictions, (-1, x.shape[1], self.outputs_per_patch, self.classes))
        return {"predictions": predictions, "targets": self.targets(images), "corrupted": corrupted}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = masked_patch_loss(y_pred)
        if self.losses:
            loss = loss + ops.sum(self.losses)
        return loss

    def get_config(self):
        return {
            **super().get_config(),
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "target": self.target,
            "corruption_rate": self.corruption_rate,
            "mask_fraction": self.mask_fraction,
            "random_fraction": self.random_fraction,
            "bits": self.bits,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["encoder"] = keras.saving.deserialize_keras_object(config["encoder"])
        return cls(**config)


def masked_patch_loss(outputs):
    """The loss of `MaskedPatchPredictor`'s outputs: cross-entropy (or squared error for pixels)
    averaged over the corrupted patches (and over a patch's predictions / pixels)."""
    predictions, targets, corrupted = outputs["predictions"], outputs["targets"], outputs["corrupted"]
    corrupted = ops.cast(corrupted, "float32")
    if len(predictions.shape) == 4:
        per_patch = ops.mean(keras.losses.sparse_categorical_crossentropy(targets, predictions, from_logits=True), -1)
    else:
        per_patch = ops.mean(ops.square(ops.cast(predictions, "float32") - ops.cast(targets, "float32")), axis=-1)
    return ops.sum(per_patch * corrupted) / ops.maximum(ops.sum(corrupted), 1.0)


def masked_accuracy(outputs):
    """Accuracy of the class predictions on the corrupted patches (numpy; not for "pixels")."""
    predictions = ops.convert_to_numpy(outputs["predictions"])
    targets = ops.convert_to_numpy(outputs["targets"])
    corrupted = ops.convert_to_numpy(outputs["corrupted"]).astype(bool)
    right = (predictions.argmax(-1) == targets).mean(-1)
    return float(right[corrupted].mean())


# --------------------------------------------------------------------------
# the recipe
# --------------------------------------------------------------------------
def compile_for_masked_patch_prediction(model, total_steps, base_lr=2e-4, warmup_steps=10_000, decay="cosine",
                                        weight_decay=0.0, global_clipnorm=1.0, batch_size=4096,
                                        device_batch_size=None, jit_compile="auto", **compile_kwargs):
    """Compile a `MaskedPatchPredictor` with the recipe of appendix B.1.2: Adam, base learning rate
    2e-4, 10k warm-up steps, cosine decay (the paper: 1M steps at batch 4096 on JFT; diminishing
    returns after 100k). `weight_decay` > 0 switches to AdamW; the rest as
    `keras_vit.recipes.compile_for_pretraining`. The loss is the model's own."""
    if not isinstance(model, MaskedPatchPredictor):
        raise TypeError(f"expected a MaskedPatchPredictor, got {type(model).__name__}")
    accumulation = recipes.gradient_accumulation_steps(batch_size, device_batch_size)
    schedule = recipes.pretrain_schedule(base_lr, total_steps, warmup_steps, decay, accumulation)
    kwargs = dict(learning_rate=schedule, global_clipnorm=_clipnorm(global_clipnorm),
                  gradient_accumulation_steps=accumulation if accumulation > 1 else None)
    optimizer = (keras.optimizers.AdamW(weight_decay=weight_decay, **kwargs) if weight_decay
                 else keras.optimizers.Adam(**kwargs))
    if jit_compile == "auto":
        jit_compile = jit_compile_default(training=True)
    model.compile(optimizer=optimizer, jit_compile=jit_compile, **compile_kwargs)
    return model
