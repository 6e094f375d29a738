"""Training recipes of the ViT paper as plain Keras objects.

Everything here returns ordinary Keras pieces (a learning-rate schedule, a
compiled model, callbacks), so ``model.fit`` stays the user's own call:

    from keras_vit import recipes
    recipes.compile_for_finetuning(model, total_steps=10_000, base_lr=0.01,
                                   batch_size=512, device_batch_size=64)
    model.fit(train, steps_per_epoch=..., epochs=...)

Sources: paper section 4.1 (pre-training: Adam beta1 0.9, beta2 0.999, weight
decay, linear warm-up and decay), appendix B.1.1 and Table 4 (fine-tuning: SGD
momentum 0.9, batch 512, no weight decay, global-norm clipping at 1, cosine
decay, step counts and learning-rate grids, dev splits), and the official code's
500-step fine-tuning warm-up.

Classifier and learning rate (appendix D.3, Figure 9): the [class] token and global
average pooling (``classifier="gap"``) work equally well, but not at the same learning
rate: in Figure 9 GAP trained at the class token's rate (8e-4) falls far behind, and at
3e-4 matches it; the paper's first, "very poor" GAP attempt is fully explained by the
rate. Sweep the learning rate again when changing the classifier
(``examples/ablations.py`` measures it at small scale).

Self-supervised pre-training (masked patch prediction, appendix B.1.2) has its own
recipe: :func:`keras_vit.masked_patch.compile_for_masked_patch_prediction`.

Step counting: a schedule built with ``accumulation_steps=k`` counts optimizer
*updates*, i.e. ``total_steps`` updates of ``batch_size`` images each take
``total_steps * k`` calls of ``train_step`` (batches of ``device_batch_size``).
Use :func:`fit_steps` to get the number of batches to give ``model.fit``.
"""

from keras_vit.recipes.callbacks import (
    NonFiniteLossError,
    NonFiniteLossStop,
    StopOnCtrlC,
    TrainingBackup,
)
from keras_vit.recipes.compile import (
    SparseCategoricalCrossentropyWithSmoothing,
    compile_for_finetuning,
    compile_for_pretraining,
    fit_steps,
    gradient_accumulation_steps,
    not_decayed,
)
from keras_vit.recipes.layer_decay import LayerDecayAdamW, LayerDecaySGD, layer_decay_scales
from keras_vit.recipes.schedules import (
    WarmupDecay,
    finetune_schedule,
    pretrain_schedule,
)
from keras_vit.recipes.setups import FINETUNE_SETUPS, FinetuneSetup, sweep_learning_rate

__all__ = [
    "WarmupDecay",
    "finetune_schedule",
    "pretrain_schedule",
    "gradient_accumulation_steps",
    "fit_steps",
    "compile_for_finetuning",
    "compile_for_pretraining",
    "not_decayed",
    "SparseCategoricalCrossentropyWithSmoothing",
    "FinetuneSetup",
    "FINETUNE_SETUPS",
    "sweep_learning_rate",
    "NonFiniteLossError",
    "NonFiniteLossStop",
    "StopOnCtrlC",
    "TrainingBackup",
    "layer_decay_scales",
    "LayerDecaySGD",
    "LayerDecayAdamW",
]
