"""DeiT's distillation (Touvron et al. 2021, section 4): a student with a distillation token learns its
class head from the labels and its distillation head from a frozen teacher.

    student = keras_vit.ViT_Ti16(weights=None, image_size=224, classes=100, distillation_token=True)
    teacher = keras.saving.load_model("teacher.keras")     # any Keras classifier of the same classes
    distiller = Distiller(student, teacher, mode="hard")
    distiller.compile(optimizer="adamw", metrics=["accuracy"])
    distiller.fit(images, labels, ...)
    student.save("student.keras")                         # trained: the two heads' logits averaged

The losses are DeiT's (`DistillationLoss` of its `losses.py`), with `alpha` its `--distillation-alpha`
and `tau` its `--distillation-tau`:

- hard: (1 - alpha) CE(class head, y) + alpha CE(distillation head, argmax of the teacher's logits);
  DeiT's alpha 0.5 is 1/2 and 1/2;
- soft: (1 - alpha) CE(class head, y) + alpha tau^2 KL(softmax(teacher / tau) || softmax(dist / tau)),
  the KL summed over the batch and the classes and divided by their product, as DeiT does.

The labels `y` are integer classes (N,) or soft targets (N, classes) (MixUp's, with their label
smoothing); `label_smoothing` smooths them for the class head only. The teacher is frozen: not
trainable, called with `training=False`, its output outside the gradient.

The student's batch is what the student takes; the teacher gets the same images as it takes them:
first back to [0, 255] pixels (a uint8 model takes them as they are and scales them itself, with the
normalisation its "rescale" layer records: what keras-vit builds for a file's own statistics with
`input_dtype="uint8"`; a float32 model is assumed to take `keras_vit.preprocess_input(pixels, mode)`,
mode "vit" ([-1, 1]) unless `student_input` / `teacher_input` name another mode, or "pixels" for a
model that takes [0, 255] floats), then resized (bilinear; antialiased when the teacher's size is smaller,
except under XLA on TensorFlow, which has no kernel for it) to the teacher's input size when it has one
that differs, then scaled for the teacher. The teacher's logits are its output,
or the input of its last layer when that is a softmax `Activation` (keras-vit's "predictions"); a
softmax inside its last `Dense` is undone by a logarithm.
"""

import os

import keras
from keras import ops

from keras_vit.calls import TracesOnce
from keras_vit.preprocessing import NORMALIZATIONS, input_scaling
from keras_vit.structure import output_kind

MODES = ("hard", "soft")
PIXELS = "pixels"  # a float model that takes [0, 255] images
DEFAULT_TAU, DEFAULT_ALPHA = 1.0, 0.5  # DeiT's main.py defaults
HOW_TO_BUILD = ("build it with distillation_token=True (e.g. keras_vit.ViT_Ti16(weights=None, classes=..., "
                "distillation_token=True); keras-vit finetune --distillation does it)")


# --------------------------------------------------------------------------
# the two views: the student's two heads, the teacher's logits
# --------------------------------------------------------------------------
def two_heads(student):
    """A functional `keras.Model` over `student`'s own layers (the same weights: training it trains
    `student`) that outputs the logits of its class head and of its distillation head, (cls, dist),
    where `student` averages them.

    Args:
        student: a keras-vit classifier built with `distillation_token=True` (layers "head" and
            "head_dist").

    Raises:
        ValueError: `student` has no distillation head, or takes more than one image input.
    """
    names = {layer.name for layer in student.layers}
    if "head_dist" not in names or "head" not in names:
        raise ValueError(f"the student {student.name!r} has no distillation token (no 'head_dist' layer): "
                         f"{HOW_TO_BUILD}")
    if len(student.inputs) != 1 or len(student.input_shape) != 4:
        raise ValueError(f"the student {student.name!r} takes {len(student.inputs)} input(s) of shape "
                         f"{student.input_shape}; distillation expects one batch of images (N, H, W, 3)")
    heads = [student.get_layer(n).output for n in ("head", "head_dist")]
    return keras.Model(student.inputs, heads, name=f"{student.name}_two_heads")


def _softmax_layer(layer):
    return layer.get_config().get("activation") == "softmax"


def teacher_logits(teacher, classes):
    """(a model of `teacher`'s layers that outputs its logits, whether those come as probabilities and
    need a logarithm).

    Args:
        teacher: a Keras classifier, functional or of another kind (then assumed to output logits).
        classes: the student's number of classes, which the teacher's head must have.

    Raises:
        ValueError: the teacher outputs embeddings or features (no classifier head), more than one
            output or not (N, classes) scores.
    """
    kind = output_kind(teacher) if hasattr(teacher, "outputs") else None
    shape = teacher.output_shape if getattr(teacher, "outputs", None) else None
    if kind in ("embeddings", "features") or (shape is not None and (not isinstance(shape, tuple)
                                                                     or len(shape) != 2)):
        raise ValueError(f"the teacher {teacher.name!r} is not a classifier: it outputs "
                         f"{kind or f'shape {shape}'}; expected a model with a classifier head giving "
                         f"(N, {classes}) logits or probabilities")
    if shape is not None and shape[-1] != classes:
        raise ValueError(f"the teacher {teacher.name!r} has {shape[-1]} classes, the student {classes}: "
                         "expected a teacher of the student's classes, in the same order")
    if kind == "scores":
        raise ValueError(f"the teacher {teacher.name!r} ends in an activation other than softmax; expected "
                         "logits or softmax probabilities")
    last = teacher.outputs[0]._keras_history.operation if shape is not None else None
    if isinstance(last, keras.layers.Activation) and _softmax_layer(last):
        return keras.Model(teacher.inputs, last.input, name=f"{teacher.name}_logits"), False
    return teacher, last is not None and _softmax_layer(last)


def _scaling(model, mode, who):
    """(scale, offset) with `model`'s input == pixels * scale + offset, for [0, 255] pixels."""
    if model.inputs[0].dtype == "uint8":
        if mode not in (None, PIXELS):
            raise ValueError(f"{who}_input={mode!r}: the {who} takes uint8 images and scales them itself; "
                             "leave it None")
        return 1.0, 0.0
    mode = "vit" if mode is None else mode
    if mode == PIXELS:
        return 1.0, 0.0
    if mode not in NORMALIZATIONS:
        raise ValueError(f"{who}_input={mode!r}: expected None, {PIXELS!r} or one of {tuple(NORMALIZATIONS)}")
    return input_scaling(mode)  # per channel


def _static_size(model):
    size = tuple(model.input_shape[1:3]) if len(model.inputs) == 1 and len(model.input_shape) == 4 else None
    if size is None:
        raise ValueError(f"the teacher {model.name!r} takes {model.input_shape}; expected one batch of images")
    return None if None in size else size


# --------------------------------------------------------------------------
# the losses, on per-image values
# --------------------------------------------------------------------------
def targets(y, classes, label_smoothing=0.0):
    """(N, classes) float32 targets of integer labels (N,) or (N, 1), or of soft targets (N, classes),
    smoothed by `label_smoothing` (`y * (1 - s) + s / classes`).

    Args:
        y: the labels.
        classes: the number of classes.
        label_smoothing: in [0, 1).
    """
    if len(y.shape) == 1 or (len(y.shape) == 2 and y.shape[-1] == 1 and classes != 1):
        y = ops.one_hot(ops.cast(ops.reshape(y, (-1,)), "int32"), classes)
    y = ops.cast(y, "float32")
    return y * (1.0 - label_smoothing) + label_smoothing / classes if label_smoothing else y


def cross_entropy(y, logits):
    """Per-image cross-entropy of `logits` (N, C) against the target distributions `y` (N, C)."""
    return -ops.sum(y * ops.log_softmax(ops.cast(logits, "float32"), axis=-1), axis=-1)


def soft_distillation(dist_logits, teacher, tau):
    """Per-image tau^2 KL(softmax(teacher / tau) || softmax(dist / tau)) / classes: its batch mean is
    DeiT's soft term (the KL summed over batch and classes, divided by their product).

    Args:
        dist_logits: the distillation head's logits (N, C).
        teacher: the teacher's logits (N, C).
        tau: the temperature.
    """
    log_student = ops.log_softmax(ops.cast(dist_logits, "float32") / tau, axis=-1)
    log_teacher = ops.log_softmax(ops.cast(teacher, "float32") / tau, axis=-1)
    kl = ops.sum(ops.exp(log_teacher) * (log_teacher - log_student), axis=-1)
    return kl * (tau * tau) / dist_logits.shape[-1]


def hard_distillation(dist_logits, teacher):
    """Per-image CE(distillation head, the teacher's argmax).

    Args:
        dist_logits: the distillation head's logits (N, C).
        teacher: the teacher's logits (N, C).
    """
    hard = ops.one_hot(ops.argmax(teacher, axis=-1), dist_logits.shape[-1])
    return cross_entropy(hard, dist_logits)


# --------------------------------------------------------------------------
# the trainer
# --------------------------------------------------------------------------
class Distiller(TracesOnce, keras.Model):
    """Trains `student`'s two heads with DeiT's distillation (see the module's docstring): `fit` it
    and save `student`, which shares its weights and keeps averaging its heads.

    Called in training it gives the two heads' logits (cls, dist); in evaluation and prediction,
    what `student` gives (its averaged output), so `evaluate`, `predict` and the compiled metrics
    read the student as it is saved (in training the metrics see the average of the two heads).
    The evaluation loss is the class cross-entropy of that output. `compile` takes no `loss`.

    Args:
        student: a keras-vit classifier with a distillation token (`distillation_token=True`),
            giving logits or softmax probabilities.
        teacher: a Keras classifier of the student's classes (logits or softmax probabilities),
            frozen here (`trainable` set to False).
        mode: "hard" or "soft".
        tau: the soft mode's temperature, > 0 (DeiT's 1.0).
        alpha: the distillation term's weight in [0, 1]; the class term gets 1 - alpha (DeiT's 0.5).
        label_smoothing: in [0, 1), for the class head's targets.
        student_input: how a float32 student's input is scaled: None ("vit"), "pixels" or a
            `keras_vit.preprocess_input` mode; None for a uint8 student.
        teacher_input: the same for the teacher.
        **kwargs: passed to `keras.Model` (e.g. `name`).

    Raises:
        ValueError: no distillation token in `student` (said how to build one), a teacher that is
            not a classifier or has other classes, or a bad `mode`, `tau`, `alpha` or input mode.
    """

    def __init__(self, student, teacher, mode="hard", tau=DEFAULT_TAU, alpha=DEFAULT_ALPHA, label_smoothing=0.0,
                 student_input=None, teacher_input=None, **kwargs):
        check_options(mode, tau, alpha)
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        view = two_heads(student)
        classes = view.outputs[0].shape[-1]
        kind = output_kind(student)
        if kind not in ("logits", "probabilities"):
            raise ValueError(f"the student {student.name!r} outputs {kind}; expected logits or softmax "
                             "probabilities (classifier_activation None or 'softmax')")
        logits, probabilities = teacher_logits(teacher, classes)
        _static_size(teacher)
        super().__init__(**kwargs)
        self.student, self.teacher = student, teacher
        teacher.trainable = False
        self._view, self._teacher_logits, self._teacher_probabilities = view, logits, probabilities
        self.mode, self.tau, self.alpha, self.classes = mode, float(tau), float(alpha), classes
        self.label_smoothing = float(label_smoothing)
        self._student_probabilities = kind == "probabilities"
        self._from_student = _scaling(student, student_input, "student")
        self._to_teacher = _scaling(teacher, teacher_input, "teacher")
        self._teacher_size, self._teacher_uint8 = _static_size(teacher), teacher.inputs[0].dtype == "uint8"
        self.built = True

    def compile(self, optimizer="rmsprop", loss=None, **kwargs):
        """As `keras.Model.compile`; the loss is DeiT's, so `loss` must be None.

        Args:
            optimizer: the optimizer.
            loss: must be None.
            **kwargs: passed to `keras.Model.compile` (metrics, jit_compile, ...).
        """
        if loss is not None:
            raise ValueError(f"Distiller computes DeiT's loss itself; compile it without loss, got loss={loss!r}")
        super().compile(optimizer=optimizer, **kwargs)

    def call(self, images, training=False):
        if training:
            cls, dist = self._view(images, training=True)
            return cls, dist
        return self.student(images, training=False)

    def teacher_input(self, images):
        """The student's batch `images` as the teacher takes them (see the module's docstring).

        Args:
            images: a batch as the student takes it.
        """
        scale, offset = (ops.convert_to_tensor(v, "float32") for v in self._from_student)
        pixels = (ops.cast(images, "float32") - offset) / scale
        size = tuple(images.shape[1:3])
        if self._teacher_size is not None and size != self._teacher_size:
            smaller = None in size or any(t < s for t, s in zip(self._teacher_size, size))
            xla_tf = keras.backend.backend() == "tensorflow" and self.jit_compile  # no XLA kernel for antialiasing
            pixels = ops.image.resize(pixels, self._teacher_size, interpolation="bilinear",
                                      antialias=smaller and not xla_tf)
        if self._teacher_uint8:
            return ops.cast(ops.clip(ops.round(pixels), 0, 255), "uint8")
        scale, offset = (ops.convert_to_tensor(v, "float32") for v in self._to_teacher)
        return pixels * scale + offset

    def teacher_logits(self, images):
        """The frozen teacher's logits (N, classes) of the student's batch `images`, outside the gradient.

        Args:
            images: a batch as the student takes it.
        """
        out = ops.cast(self._teacher_logits(self.teacher_input(images), training=False), "float32")
        if self._teacher_probabilities:
            out = ops.log(ops.maximum(out, 1e-30))
        return ops.stop_gradient(out)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if isinstance(y_pred, (tuple, list)):
            cls, dist = y_pred
            teacher = self.teacher_logits(x)
            extra = (hard_distillation(dist, teacher) if self.mode == "hard"
                     else soft_distillation(dist, teacher, self.tau))
            per_image = ((1.0 - self.alpha) * cross_entropy(targets(y, self.classes, self.label_smoothing), cls)
                         + self.alpha * extra)
        else:  # evaluation: the student's averaged output against the labels
            out = ops.cast(y_pred, "float32")
            logits = ops.log(ops.maximum(out, 1e-30)) if self._student_probabilities else out
            per_image = cross_entropy(targets(y, self.classes), logits)
        if sample_weight is not None:
            per_image = per_image * ops.reshape(ops.cast(sample_weight, "float32"), (-1,))
        loss = ops.mean(per_image)
        for extra_loss in self.losses:
            loss = loss + self._aggregate_additional_loss(extra_loss)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        if isinstance(y_pred, (tuple, list)):  # training: the heads averaged, as the student does
            y_pred = (y_pred[0] + y_pred[1]) / 2
            if self._student_probabilities:
                y_pred = ops.softmax(y_pred, axis=-1)
        return super().compute_metrics(x, y, y_pred, sample_weight)


def check_options(mode, tau, alpha, names=("mode", "tau", "alpha")):
    """Refuses a `mode` other than "hard"/"soft", a `tau` not > 0 or an `alpha` outside [0, 1].

    Args:
        mode: the distillation mode.
        tau: the temperature.
        alpha: the distillation term's weight.
        names: what the three are called in the message (the command line's flags).
    """
    if mode not in MODES:
        raise ValueError(f"{names[0]} must be one of {MODES}, got {mode!r}")
    if not tau > 0:
        raise ValueError(f"{names[1]} (the distillation temperature) must be > 0, got {tau}")
    if not 0 <= alpha <= 1:
        raise ValueError(f"{names[2]} (the distillation term's weight) must be in [0, 1], got {alpha}")


def load_teacher(path):
    """The teacher model of `path`, as it scales its own input: a `.keras` model (safe mode), a timm
    file, Hugging Face folder or keras-hub preset through the converters (`keras_vit.convert.build_from`,
    uint8 input scaled by the file's own normalisation, giving logits), or a registry release spelled
    "VARIANT:TAG" (e.g. "ViT_B16:imagenet21k+imagenet2012", at the size it was trained at, giving logits).

    Args:
        path: the `.keras` file, the timm / Hugging Face / keras-hub file or folder, or "VARIANT:TAG".

    Raises:
        FileNotFoundError: nothing at `path`. ValueError: a file of another kind, or one that cannot be read,
            or an unknown variant or tag.
    """
    path = os.fspath(path)
    if not os.path.exists(path) and is_release(path):
        return _release(*path.split(":", 1))
    if not os.path.exists(path):
        raise FileNotFoundError(f"teacher not found: {path}")
    if path.endswith(".keras"):
        from keras_vit.weights.keras_files import load_keras_model

        return load_keras_model(path)
    from keras_vit.weights.foreign import is_foreign

    if not is_foreign(path):
        raise ValueError(f"teacher {path}: expected a .keras model, a timm file, a Hugging Face folder or a "
                         "keras-hub preset folder")
    from keras_vit.convert import build_from

    return build_from(path, input_dtype="uint8", classifier_activation=None)


def is_release(spec):
    """Whether `spec` is spelled as a registry release, "VARIANT:TAG" (a name, no path).

    Args:
        spec: what was given as the teacher.
    """
    return ":" in spec and "/" not in spec.split(":", 1)[0] and os.sep not in spec.split(":", 1)[0]


def _release(variant, tag):
    """The registry's `variant` released under `tag`, at its own size, taking uint8 images, giving logits."""
    import keras_vit
    from keras_vit.configs import get_variant
    from keras_vit.weights.registry import get_weights

    name = get_variant(variant).name
    record = get_weights(name, tag)
    return getattr(keras_vit, name)(weights=tag, image_size=record.image_size, classifier_activation=None,
                                    input_dtype="uint8")


def student_of(model):
    """The student a `Distiller` trains; any other model as it is.

    Args:
        model: a `Distiller` or a model.
    """
    return model.student if isinstance(model, Distiller) else model


__all__ = ["Distiller", "check_options", "cross_entropy", "hard_distillation", "is_release", "load_teacher", "soft_distillation",
           "student_of", "targets", "teacher_logits", "two_heads"]
