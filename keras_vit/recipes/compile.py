"""The paper's optimisers and losses as a compiled Keras model: `compile_for_finetuning` (SGD with
momentum, B.1.1) and `compile_for_pretraining` (Adam with weight decay, 4.1), with gradient
accumulation, EMA and label smoothing."""

import functools
import types

import keras
from keras import ops

from keras_vit.recipes.checks import _check_int, _check_positive_float
from keras_vit.recipes.layer_decay import LayerDecayAdamW, LayerDecaySGD, check_layer_decay, layer_decay_scales
from keras_vit.recipes.presets import OPTIMIZERS
from keras_vit.recipes.schedules import finetune_schedule, pretrain_schedule
from keras_vit.runtime import jit_compile_default


def gradient_accumulation_steps(batch_size, device_batch_size=None):
    """Number of micro-batches per update: ``batch_size // device_batch_size`` (1 if none).

    Raises a ``ValueError`` unless ``device_batch_size`` divides ``batch_size``.
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    if device_batch_size is None:
        return 1
    device_batch_size = _check_int("device_batch_size", device_batch_size, 1)
    if device_batch_size > batch_size:
        raise ValueError(
            f"`device_batch_size` ({device_batch_size}) must not exceed `batch_size` "
            f"({batch_size}); it is the part of the batch one step holds."
        )
    if batch_size % device_batch_size:
        raise ValueError(
            f"`batch_size` ({batch_size}) must be a multiple of `device_batch_size` "
            f"({device_batch_size}) to accumulate gradients over equal micro-batches; "
            f"e.g. device_batch_size={_largest_divisor(batch_size, device_batch_size)}."
        )
    return batch_size // device_batch_size


def _largest_divisor(n, at_most):
    return max(d for d in range(1, at_most + 1) if n % d == 0)


def fit_steps(model_or_optimizer, updates):
    """Number of batches ``model.fit`` must run for ``updates`` optimizer updates.

    ``updates * gradient_accumulation_steps`` of the compiled optimizer.

    Args:
        model_or_optimizer: a model compiled by a recipe, or its optimizer.
        updates: the number of optimizer updates wanted.
    """
    optimizer = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "`fit_steps` expects a compiled keras.Model or a keras optimizer; "
            f"got {type(model_or_optimizer).__name__}."
        )
    updates = _check_int("updates", updates, 0)
    return updates * (optimizer.gradient_accumulation_steps or 1)


@keras.saving.register_keras_serializable(package="keras_vit")
class SparseCategoricalCrossentropyWithSmoothing(keras.losses.Loss):
    """Cross-entropy on integer labels with label smoothing.

    Keras' sparse cross-entropy has no ``label_smoothing``; this one-hot encodes
    the labels to the width of the predictions and uses the categorical loss.

    Args:
        from_logits: whether the predictions are logits (else probabilities).
        label_smoothing: in [0, 1): the one-hot targets become
            ``(1 - label_smoothing) * onehot + label_smoothing / classes``.
        name: the loss's name.
    """

    def __init__(self, from_logits=False, label_smoothing=0.0,
                 name="sparse_categorical_crossentropy_with_smoothing", **kwargs):
        super().__init__(name=name, **kwargs)
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        num_classes = ops.shape(y_pred)[-1]
        y_true = ops.cast(y_true, "int32")
        if len(y_true.shape) == len(y_pred.shape):
            y_true = ops.squeeze(y_true, axis=-1)
        onehot = ops.one_hot(y_true, num_classes, dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(
            onehot, y_pred, from_logits=self.from_logits,
            label_smoothing=self.label_smoothing,
        )

    def get_config(self):
        config = super().get_config()
        config.update(from_logits=self.from_logits, label_smoothing=self.label_smoothing)
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class BinaryCrossentropyOnTargets(keras.losses.Loss):
    """DeiT III's loss (timm's ``--bce-loss``): each class's output against its target by binary
    cross-entropy, averaged over the classes and the batch.

    The targets are soft (MixUp's and CutMix's mixed, smoothed ones) or, with ``sparse_labels``, integer
    labels made one-hot and smoothed as timm smooths them (``1 - label_smoothing + label_smoothing / classes``
    on the label, ``label_smoothing / classes`` elsewhere). The outputs are sigmoid probabilities, or
    logits with ``from_logits``. With ``target_threshold`` the targets are made hard: 1 above it, 0 elsewhere
    (timm's ``--bce-target-thresh``; DeiT III's own code binarizes the mixed targets at 0, so that both
    classes of a MixUp or CutMix pair are positives).

    Args:
        from_logits: whether the predictions are logits (else per-class sigmoid probabilities).
        label_smoothing: in [0, 1), for integer labels (soft targets carry their own).
        sparse_labels: integer labels (True) or per-class targets (False).
        target_threshold: None (soft targets), or a number in [0, 1): targets above it become 1, others 0.
        name: the loss's name.
    """

    def __init__(self, from_logits=False, label_smoothing=0.0, sparse_labels=False, target_threshold=None,
                 name="binary_crossentropy_on_targets", **kwargs):
        super().__init__(name=name, **kwargs)
        self.from_logits = bool(from_logits)
        self.label_smoothing = float(label_smoothing)
        self.sparse_labels = bool(sparse_labels)
        if target_threshold is not None:
            target_threshold = _check_positive_float("target_threshold", target_threshold, allow_zero=True)
            if target_threshold >= 1:
                raise ValueError(f"`target_threshold` must be in [0, 1) or None; got {target_threshold}.")
        self.target_threshold = target_threshold

    def call(self, y_true, y_pred):
        if self.sparse_labels:
            y_true = ops.cast(y_true, "int32")
            if len(y_true.shape) == len(y_pred.shape):
                y_true = ops.squeeze(y_true, axis=-1)
            num_classes = ops.shape(y_pred)[-1]
            y_true = ops.one_hot(y_true, num_classes, dtype=y_pred.dtype)
            y_true = y_true * (1.0 - self.label_smoothing) + self.label_smoothing / num_classes
        y_true = ops.cast(y_true, y_pred.dtype)
        if self.target_threshold is not None:
            y_true = ops.cast(ops.greater(y_true, self.target_threshold), y_pred.dtype)
        return keras.losses.binary_crossentropy(y_true, y_pred, from_logits=self.from_logits)

    def get_config(self):
        config = super().get_config()
        config.update(from_logits=self.from_logits, label_smoothing=self.label_smoothing,
                      sparse_labels=self.sparse_labels, target_threshold=self.target_threshold)
        return config


def _outputs_logits(model, probabilities=("softmax",)):
    """True if the model's output layer has a linear activation, False for one of `probabilities`."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model; got {type(model).__name__}.")
    if not model.layers:
        raise ValueError("The model has no layers; pass `from_logits` explicitly.")
    layer = model.layers[-1]
    if isinstance(layer, keras.layers.Softmax):
        return False
    activation = getattr(layer, "activation", None)
    if activation is None:
        raise ValueError(
            f"Cannot tell whether the output layer {layer.name!r} "
            f"({type(layer).__name__}) returns logits or probabilities; pass "
            "`from_logits=True` or `from_logits=False`."
        )
    name = getattr(activation, "__name__", str(activation))
    if name == "linear":
        return True
    if name in probabilities:
        return False
    raise ValueError(
        f"The output layer {layer.name!r} has activation {name!r}; expected "
        f"'linear' (logits) or {' or '.join(map(repr, probabilities))} (probabilities). Pass `from_logits` explicitly."
    )


def _make_loss(model, from_logits, label_smoothing, sparse_labels, bce_loss=False, bce_target_threshold=None):
    if from_logits is None:  # a sigmoid head goes with the binary cross-entropy only
        from_logits = _outputs_logits(model, ("sigmoid",) if bce_loss else ("softmax",))
    label_smoothing = _check_positive_float("label_smoothing", label_smoothing, allow_zero=True)
    if label_smoothing >= 1:
        raise ValueError(f"`label_smoothing` must be in [0, 1); got {label_smoothing}.")
    if bce_loss:
        return BinaryCrossentropyOnTargets(from_logits=from_logits, label_smoothing=label_smoothing,
                                           sparse_labels=sparse_labels, target_threshold=bce_target_threshold)
    if not sparse_labels:
        return keras.losses.CategoricalCrossentropy(
            from_logits=from_logits, label_smoothing=label_smoothing)
    if label_smoothing:
        return SparseCategoricalCrossentropyWithSmoothing(
            from_logits=from_logits, label_smoothing=label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def _ema_args(ema, ema_momentum, accumulation):
    if not ema:
        return {}
    ema_momentum = float(ema_momentum)
    if not 0.0 <= ema_momentum < 1.0:
        raise ValueError(f"`ema_momentum` must be in [0, 1); got {ema_momentum}.")
    # Keras updates the average after every train_step, also between
    # accumulated micro-batches when the weights have not moved; taking the
    # k-th root gives the requested momentum per optimizer update.
    return {"use_ema": True, "ema_momentum": ema_momentum ** (1.0 / accumulation)}


def _copy_average_into_weights(optimizer, trainable_variables):
    # Replaces the optimizer's own method on this instance (see _compile).
    averages = optimizer._model_variables_moving_average
    if len(trainable_variables) != len(averages):
        raise ValueError(
            f"Expected {len(averages)} model variables to overwrite with their "
            f"moving averages; got {len(trainable_variables)}."
        )
    for variable, average in zip(trainable_variables, averages):
        if average is not None:
            variable.assign(ops.copy(average.value))


def _clip_across_replicas(optimizer, grads):
    """Global-norm clipping by the norm of the gradient summed over the replicas.

    Keras clips each replica's share of the gradient by its own norm before the all-reduce, which
    is not the clipping of the whole batch's gradient under a TensorFlow strategy of several
    replicas; here every share is scaled by the one factor the summed gradient calls for.
    """
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    clip = optimizer.global_clipnorm
    if not clip or context is None or context.num_replicas_in_sync == 1:
        return type(optimizer)._clip_gradients(optimizer, grads)
    present = [g for g in grads if g is not None]
    norm = tf.linalg.global_norm(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    scale = clip / tf.maximum(norm, clip)
    return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]


def _compile(model, optimizer, loss, jit_compile, compile_kwargs):
    if optimizer.use_ema:
        # At the end of fit, Keras assigns each EMA average to its weight. On
        # JAX both variables then hold the same buffer, and the next evaluate or
        # predict (which donates the weights' buffers) deletes the average
        # too, so a later model.save fails with "Array has been deleted".
        # Assigning a copy keeps the two buffers apart on every backend.
        optimizer._overwrite_model_variables_with_average_value = types.MethodType(
            _copy_average_into_weights, optimizer)
    if keras.backend.backend() == "tensorflow" and optimizer.global_clipnorm:
        optimizer._clip_gradients = types.MethodType(_clip_across_replicas, optimizer)
    if "optimizer" in compile_kwargs or "loss" in compile_kwargs:
        raise TypeError("`optimizer` and `loss` are chosen by the recipe; do not pass them.")
    compile_kwargs.setdefault("metrics", ["accuracy"])
    if isinstance(jit_compile, str) and jit_compile == "auto":
        jit_compile = jit_compile_default(training=True)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=jit_compile, **compile_kwargs)
    return model


def compile_for_finetuning(model, total_steps, base_lr=0.01, warmup_steps=500,
                           batch_size=512, device_batch_size=None, ema=False,
                           label_smoothing=0.0, jit_compile="auto", *,
                           momentum=0.9, global_clipnorm=1.0, ema_momentum=0.9999,
                           from_logits=None, sparse_labels=True, layer_decay=None, optimizer="sgd",
                           weight_decay=0.0, bce_loss=False, bce_target_threshold=None, **compile_kwargs):
    """Compile ``model`` with the paper's fine-tuning recipe (B.1.1, Table 4), or another optimizer.

    SGD with momentum 0.9, no weight decay, gradient clipping at global norm 1,
    linear warm-up then cosine decay to 0 over ``total_steps`` updates. When
    ``device_batch_size`` is smaller than ``batch_size``, gradients of
    ``batch_size // device_batch_size`` micro-batches are averaged before each
    update (the data pipeline must then yield batches of ``device_batch_size``
    and ``model.fit`` must run ``fit_steps(model, total_steps)`` batches).
    ``ema=True`` keeps a Polyak average of the weights (momentum 0.9999 per
    update) that replaces the weights at the end of ``fit``.

    The loss is cross-entropy on integer labels (``sparse_labels=False`` for
    one-hot labels), from logits when the output layer is linear and from
    probabilities when it is a softmax (or as ``from_logits`` says). Metrics
    default to ``["accuracy"]``; other ``compile`` arguments pass through.
    ``layer_decay`` (e.g. 0.75; off by default, as in the paper) makes block
    ``i`` of a depth-``L`` encoder learn at ``layer_decay ** (L - i)`` times the
    scheduled rate, the embeddings at ``layer_decay ** (L + 1)`` and the head at
    the full rate (BEiT, MAE, DINOv2; timm's ``layer_decay``).
    ``jit_compile="auto"`` takes :func:`keras_vit.jit_compile_default`, the
    setting measured fastest for training on the current backend (XLA on JAX,
    and on TensorFlow also on a CPU, where Keras' own "auto" turns it off;
    eager on torch); ``True``/``False`` override it.

    ``optimizer`` picks the update rule under the same schedule, clipping, accumulation and EMA: "sgd"
    (the paper's), "adamw" (DeiT's and AugReg's Adam with decoupled weight decay) or "lamb" (DeiT III's;
    no ``layer_decay``). ``weight_decay`` is decoupled as Keras applies it (``weight_decay x learning
    rate`` per update) on the kernels only (:func:`not_decayed`). ``bce_loss``
    trains with :class:`BinaryCrossentropyOnTargets` (DeiT III), for a model whose head is a sigmoid (or
    logits).

    Args:
        model: the model to compile (a keras-vit model for ``layer_decay``).
        total_steps: optimizer updates of the whole run (the schedule's length).
        optimizer: "sgd", "adamw" or "lamb".
        weight_decay: decoupled weight decay (0: none, the paper's).
        bce_loss: binary cross-entropy instead of cross-entropy.
        bce_target_threshold: with ``bce_loss``, None (soft targets) or the threshold above which a target
            counts as 1 (DeiT III: 0.0; :class:`BinaryCrossentropyOnTargets`).
        base_lr: the peak learning rate (Table 4's grid: 0.001 to 0.03).
        warmup_steps: updates of linear warm-up from 0 (the official code: 500).
        batch_size: images per update.
        device_batch_size: images per step when smaller than ``batch_size``
            (gradient accumulation), else None.
        ema: keep a Polyak average of the weights, assigned to them at the end of ``fit``.
        label_smoothing: in [0, 1), on the targets of the cross-entropy.
        jit_compile: "auto", True or False (see above).
        momentum: SGD momentum.
        global_clipnorm: clip the gradient to this global norm (None: no clipping).
        ema_momentum: the average's momentum per update.
        from_logits: whether the model outputs logits (None: read from its output layer).
        sparse_labels: integer labels (True) or one-hot labels (False).
        layer_decay: None, or the per-block learning-rate decay in (0, 1].
        **compile_kwargs: passed to ``model.compile`` (not ``optimizer`` or ``loss``).

    Returns:
        the same model, compiled.
    """
    plain, decayed, rule = _finetune_optimizer(optimizer, momentum, weight_decay, layer_decay)
    optimizer_class = _optimizer(plain, decayed, model, layer_decay)
    accumulation = gradient_accumulation_steps(batch_size, device_batch_size)
    schedule = finetune_schedule(base_lr, total_steps, warmup_steps, accumulation)
    update = optimizer_class(
        learning_rate=schedule,
        global_clipnorm=_clipnorm(global_clipnorm),
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
        **rule, **_ema_args(ema, ema_momentum, accumulation),
    )
    if rule.get("weight_decay"):
        update.exclude_from_weight_decay(var_list=not_decayed(model))
    if bce_target_threshold is not None and not bce_loss:
        raise ValueError(f"`bce_target_threshold` ({bce_target_threshold}) goes with bce_loss=True.")
    loss = _make_loss(model, from_logits, label_smoothing, sparse_labels, bce_loss, bce_target_threshold)
    return _compile(model, update, loss, jit_compile, compile_kwargs)


def not_decayed(model):
    """The trainable variables of `model` that weight decay leaves alone: all but the kernels (the matrices of
    the dense, attention and convolution layers, LoRA's factors included), so the biases (the attention's are
    (heads, head_dim)), the norms, the class and distillation tokens and the position embeddings. This is
    timm's rule (1-D variables, biases and `no_weight_decay()`: pos_embed, cls_token, dist_token) and
    big_vision's (decay on `.*/kernel$`).

    Args:
        model: a built Keras model.
    """
    return [v for v in model.trainable_variables if not v.name.endswith("kernel")]


def _finetune_optimizer(name, momentum, weight_decay, layer_decay):
    """(plain class, layer-decay class or None, its own arguments) of `compile_for_finetuning`'s optimizer
    `name` (one of `OPTIMIZERS`)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"`optimizer` must be one of {', '.join(map(repr, OPTIMIZERS))}; got {name!r}.")
    weight_decay = _check_positive_float("weight_decay", weight_decay, allow_zero=True)
    rule = {"weight_decay": weight_decay} if weight_decay else {}
    if name == "sgd":
        momentum = _check_positive_float("momentum", momentum, allow_zero=True)
        return keras.optimizers.SGD, LayerDecaySGD, {"momentum": momentum, **rule}
    if name == "adamw":
        return keras.optimizers.AdamW, LayerDecayAdamW, {"weight_decay": weight_decay}
    if check_layer_decay(layer_decay) is not None:
        raise ValueError(f"`layer_decay` ({layer_decay}) works with optimizer='sgd' or 'adamw', got 'lamb'.")
    return keras.optimizers.Lamb, None, rule


def compile_for_pretraining(model, total_steps, base_lr=1e-3, weight_decay=0.1,
                            warmup_steps=10_000, decay="linear", label_smoothing=0.0,
                            global_clipnorm=1.0, batch_size=4096, device_batch_size=None,
                            ema=False, jit_compile="auto", *, beta_1=0.9, beta_2=0.999,
                            ema_momentum=0.9999, from_logits=None, sparse_labels=True,
                            layer_decay=None, **compile_kwargs):
    """Compile ``model`` with the paper's pre-training recipe (4.1, Table 3).

    AdamW (beta1 0.9, beta2 0.999) with decoupled weight decay (Keras applies
    ``weight_decay * learning_rate`` per update), linear warm-up over
    ``warmup_steps`` then linear (or ``decay="cosine"``) decay to 0, optional
    global-norm clipping (``global_clipnorm=None`` to switch off) and label
    smoothing. Dropout is a property of the model (``dropout_rate=0.1`` in the
    paper's ImageNet runs). Batch-size handling, loss and metrics as in
    :func:`compile_for_finetuning`. The best ``base_lr`` depends on the
    classifier: global average pooling needs a lower one than the [class]
    token (appendix D.3, Figure 9: 3e-4 against 8e-4). ``layer_decay`` as in
    :func:`compile_for_finetuning`, the weight decay of each variable scaled
    with its learning rate.

    Args:
        model: the model to compile (a keras-vit model for ``layer_decay``).
        total_steps: optimizer updates of the whole run (the schedule's length).
        base_lr: the peak learning rate.
        weight_decay: decoupled weight decay (Table 3: 0.03 to 0.3).
        warmup_steps: updates of linear warm-up from 0.
        decay: "linear" (the paper's) or "cosine" decay after the warm-up.
        beta_1: Adam's first-moment decay.
        beta_2: Adam's second-moment decay.
        label_smoothing, global_clipnorm, batch_size, device_batch_size, ema: as in :func:`compile_for_finetuning`.
        jit_compile, ema_momentum, from_logits, sparse_labels, layer_decay: as in :func:`compile_for_finetuning`.
        **compile_kwargs: passed to ``model.compile`` (not ``optimizer`` or ``loss``).

    Returns:
        the same model, compiled.
    """
    optimizer_class = _optimizer(keras.optimizers.AdamW, LayerDecayAdamW, model, layer_decay)
    accumulation = gradient_accumulation_steps(batch_size, device_batch_size)
    schedule = pretrain_schedule(base_lr, total_steps, warmup_steps, decay, accumulation)
    optimizer = optimizer_class(
        learning_rate=schedule,
        weight_decay=_check_positive_float("weight_decay", weight_decay, allow_zero=True),
        beta_1=float(beta_1),
        beta_2=float(beta_2),
        global_clipnorm=_clipnorm(global_clipnorm),
        gradient_accumulation_steps=accumulation if accumulation > 1 else None,
        **_ema_args(ema, ema_momentum, accumulation),
    )
    loss = _make_loss(model, from_logits, label_smoothing, sparse_labels)
    return _compile(model, optimizer, loss, jit_compile, compile_kwargs)


def _optimizer(plain, decayed, model, layer_decay):
    """A constructor of the recipe's optimizer: `plain`, or `decayed` with `model`'s per-layer rates."""
    if check_layer_decay(layer_decay) is None:
        return plain
    scales = layer_decay_scales(model, layer_decay)
    return functools.partial(decayed, scales=scales)


def _clipnorm(value):
    if value is None:
        return None
    return _check_positive_float("global_clipnorm", value)
