"""DeiT's distillation (keras_vit.recipes.distill): the losses against DeiT's formula in numpy, a frozen teacher
at its own size and normalisation, the student's two heads trained and saved averaged, the refusals, and
`keras-vit finetune DIR --teacher PATH --distillation hard`."""

import json
import os

import keras
import numpy as np
import pytest
from conftest import assert_resumed_equals_whole, photo_folder

import keras_vit
from keras_vit import cli
from keras_vit.recipes import own_images
from keras_vit.recipes.distill import Distiller, check_options, two_heads

TINY = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=2, num_layers=1, classes=3)


def _randomised(model, seed):
    for i, v in enumerate(model.weights):
        v.assign(np.random.default_rng(seed + i).normal(0, 0.3, v.shape).astype("float32"))
    return model


def _student(**kw):
    options = dict(TINY, distillation_token=True, classifier_activation="softmax", input_dtype="uint8")
    return _randomised(keras_vit.VisionTransformer(**{**options, **kw}), 1)


def _teacher(image_size=32, **kw):
    options = dict(TINY, image_size=image_size, classifier_activation="softmax", input_dtype="uint8")
    return _randomised(keras_vit.VisionTransformer(**{**options, **kw}), 100)


@pytest.fixture(scope="module")
def photos():
    """Six 32 px crops of scikit-image's photographs (uint8) and their classes."""
    skimage = pytest.importorskip("skimage.data")
    from PIL import Image

    images, labels = [], []
    for label, image in enumerate((skimage.astronaut(), skimage.chelsea(), skimage.coffee())):
        for k, side in enumerate((300, 200)):
            crop = image[k * 40:k * 40 + side, k * 60:k * 60 + side]
            images.append(np.asarray(Image.fromarray(crop).resize((32, 32), Image.BILINEAR)))
            labels.append(label)
    return np.stack(images).astype("uint8"), np.asarray(labels, "int32")


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _deit_loss(cls, dist, teacher, y, mode, tau, alpha):
    """DeiT's DistillationLoss (its losses.py) in numpy: y soft targets (N, C)."""
    base = -(y * _log_softmax(cls)).sum(-1).mean()
    if mode == "hard":
        extra = -_log_softmax(dist)[np.arange(len(dist)), teacher.argmax(-1)].mean()
    else:
        log_s, log_t = _log_softmax(dist / tau), _log_softmax(teacher / tau)
        extra = (np.exp(log_t) * (log_t - log_s)).sum() * tau * tau / dist.size
    return base * (1 - alpha) + extra * alpha


@pytest.fixture(scope="module")
def pair_and_heads(photos):
    """A student and a teacher (random weights, neither changed by a Distiller's loss) and, on the photographs,
    the student's two heads' logits and the teacher's logits by plain models of their layers (float64)."""
    images, _ = photos
    student, teacher = _student(), _teacher()
    cls, dist = (np.asarray(a, np.float64) for a in two_heads(student).predict(images, verbose=0))
    logits = np.asarray(keras.Model(teacher.inputs, teacher.get_layer("head").output).predict(images, verbose=0),
                        np.float64)
    return student, teacher, (cls, dist, logits)


@pytest.mark.parametrize("mode,tau,alpha,smoothing,soft_targets", [
    ("hard", 1.0, 0.5, 0.0, False), ("hard", 1.0, 0.3, 0.1, True), ("soft", 3.0, 0.7, 0.0, False),
    ("soft", 0.5, 0.5, 0.1, True)])
def test_the_loss_equals_deits_formula(photos, pair_and_heads, mode, tau, alpha, smoothing, soft_targets):
    images, labels = photos
    student, teacher, (cls, dist, logits) = pair_and_heads
    distiller = Distiller(student, teacher, mode, tau=tau, alpha=alpha, label_smoothing=smoothing)
    onehot = np.eye(3, dtype="float32")[labels]
    y = 0.6 * onehot + 0.4 * onehot[::-1] if soft_targets else labels  # MixUp's targets of a reversed batch
    loss = distiller.compute_loss(images, y, distiller(images, training=True), training=True)
    target = (onehot if not soft_targets else y) * (1 - smoothing) + smoothing / 3
    expected = _deit_loss(cls, dist, logits, target, mode, tau, alpha)
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(loss)), expected, rtol=1e-5, atol=1e-6)


def _numpy(weights):
    return [np.array(keras.ops.convert_to_numpy(w)) for w in weights]


def test_fit_trains_both_heads_from_a_frozen_teacher_at_another_size(photos, tmp_path):
    images, labels = photos
    keras.utils.set_random_seed(0)
    student = keras_vit.VisionTransformer(**TINY, distillation_token=True, classifier_activation="softmax",
                                          input_dtype="uint8")  # heads zero-initialised, as built
    teacher = _teacher(image_size=48)
    distiller = Distiller(student, teacher, "soft", tau=2.0)
    assert tuple(distiller.teacher_input(images).shape) == (6, 48, 48, 3)
    assert len(distiller.trainable_variables) == len(student.trainable_variables)
    teacher_before, student_before = _numpy(teacher.weights), _numpy(student.weights)
    distiller.compile(optimizer=keras.optimizers.SGD(0.5), metrics=["accuracy"])
    history = distiller.fit(images, labels, epochs=3, batch_size=3, verbose=0).history
    assert np.isfinite(history["loss"]).all() and set(history) == {"loss", "accuracy"}
    for before, after in zip(teacher_before, _numpy(teacher.weights)):
        np.testing.assert_array_equal(before, after)
    changed = {w.path.split("/")[0] for w, b in zip(student.weights, student_before)
               if not np.array_equal(b, keras.ops.convert_to_numpy(w))}
    assert {"head", "head_dist", "encoderblock_0"} <= changed
    # the student saved as it is trained reloads in safe mode and averages the two heads' logits
    student.save(tmp_path / "student.keras")
    reloaded = keras.saving.load_model(tmp_path / "student.keras", safe_mode=True)
    cls, dist = (np.asarray(a, np.float64) for a in two_heads(student).predict(images, verbose=0))
    average = np.exp(_log_softmax((cls + dist) / 2))
    np.testing.assert_allclose(reloaded.predict(images, verbose=0), average, atol=1e-5)
    np.testing.assert_allclose(distiller.predict(images, verbose=0), average, atol=1e-5)  # predict: the student's


def test_the_teacher_gets_the_pixels_in_its_own_normalisation(photos):
    images, _ = photos
    # a float student taking [-1, 1] images; a uint8 teacher gets the photographs back exactly
    student = _student(input_dtype="float32")
    scaled = keras_vit.preprocess_input(images)
    distiller = Distiller(student, _teacher())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(distiller.teacher_input(scaled)), images)
    # a float teacher taking ImageNet's statistics gets them
    distiller = Distiller(student, _teacher(input_dtype="float32"), teacher_input="imagenet")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(distiller.teacher_input(scaled)),
                               keras_vit.preprocess_input(images, mode="imagenet"), atol=1e-4)
    # a teacher at another size gets the batch resized bilinearly (upsampling: as tf.image.resize computes it)
    from keras_vit.data.preprocess import resize_bilinear

    distiller = Distiller(_student(), _teacher(image_size=48))
    resized = np.stack([np.clip(np.round(resize_bilinear(i, (48, 48))), 0, 255) for i in images])
    got = keras.ops.convert_to_numpy(distiller.teacher_input(images)).astype(np.int32)
    assert np.abs(got - resized).max() <= 1


@pytest.mark.backend_independent
@pytest.mark.parametrize("student,teacher,expected", [
    (lambda: _teacher(), lambda: _teacher(), "distillation_token=True"),
    (lambda: _student(), lambda: _teacher(classes=5), "5 classes, the student 3"),
    (lambda: _student(), lambda: _teacher(include_top=False, pooling="representation"), "not a classifier"),
    (lambda: _student(), lambda: _teacher(include_top=False, pooling=None), "not a classifier"),
    (lambda: _student(classifier_activation="sigmoid"), lambda: _teacher(), "expected logits or softmax"),
    (lambda: _student(), lambda: _teacher(), "teacher_input='vit'"),
])
def test_refusals_say_what_was_expected(student, teacher, expected):
    kwargs = {"teacher_input": "vit"} if expected.startswith("teacher_input") else {}
    with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
        Distiller(student(), teacher(), **kwargs)


@pytest.mark.backend_independent
def test_bad_options_and_a_compiled_loss_are_refused():
    for args, expected in ((("warm", 1.0, 0.5), "mode must be one of"), (("soft", 0.0, 0.5), "tau .* must be > 0"),
                           (("hard", 1.0, 1.5), r"alpha .* must be in \[0, 1\]")):
        with pytest.raises(ValueError, match=expected):
            check_options(*args)
    with pytest.raises(ValueError, match="without loss"):
        Distiller(_student(), _teacher()).compile(optimizer="sgd", loss="mse")


@pytest.fixture(scope="module")
def folder_and_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    photo_folder(root / "photos", per_class=4)
    for name, model in (("student", _student()), ("teacher", _teacher(image_size=48)),
                        ("teacher5", _teacher(classes=5))):
        model.save(root / f"{name}.keras")
    return root


def _argv(root, out, *more):
    return ["finetune", str(root / "photos"), "--weights", str(root / "student.keras"), "--image-size", "32",
            "--epochs", "2", "--batch-size", "3", "--lr", "0.1", "--validation-split", "0.5", "--out", str(out), "--quiet", *more]


def _distil(root, out, *more):
    return _argv(root, out, "--teacher", str(root / "teacher.keras"), "--distillation", "hard", *more)


@pytest.fixture(scope="module")
def whole(folder_and_models, tmp_path_factory):
    """An uninterrupted `keras-vit finetune --teacher --distillation hard` run, as a user types it."""
    out = tmp_path_factory.mktemp("runs") / "whole"
    assert cli.main(_distil(folder_and_models, out)) == 0
    return out


def test_finetune_distils_from_a_teacher(folder_and_models, whole):
    root, out = folder_and_models, whole
    report = json.loads((out / "report.json").read_text())
    assert report["flags"]["distillation"] == "hard" and report["flags"]["distillation_alpha"] == 0.5
    model = keras.saving.load_model(out / "model.keras", safe_mode=True)
    assert model.class_names == ("astronaut", "cat", "coffee") and model.get_layer("head_average")
    student = keras.saving.load_model(root / "student.keras")
    moved = [name for name in ("head", "head_dist")
             if not np.array_equal(_numpy(model.get_layer(name).weights)[0],
                                   _numpy(student.get_layer(name).weights)[0])]
    assert moved == ["head", "head_dist"]


def test_an_interrupted_distillation_resumes_to_the_uninterrupted_weights(folder_and_models, whole, tmp_path):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt  # after the backup of epoch 1

    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        own_images.run(cli.parser().parse_args(_distil(folder_and_models, cut)), [Interrupt()])
    resumed = own_images.run(cli.parser().parse_args(["finetune", str(folder_and_models / "photos"), "--out",
                                                      str(cut), "--resume", "--quiet"]))
    assert resumed["resumed_from_epoch"] == 1 and resumed["flags"]["teacher"].endswith("teacher.keras")
    assert_resumed_equals_whole(whole, cut, resumed)


@pytest.mark.backend_independent
@pytest.mark.parametrize("more,expected", [
    (["--teacher", "teacher5.keras", "--distillation", "hard"], "5 classes, the student 3"),
    (["--teacher", "teacher.keras"], "without --distillation"),
    (["--teacher", "teacher.keras", "--distillation", "soft", "--distillation-tau", "0"], "--distillation-tau"),
    (["--teacher", "teacher.keras", "--distillation", "hard", "--lora", "2"], "cannot be combined with --lora"),
])
def test_finetune_refuses_before_writing(folder_and_models, tmp_path, more, expected):
    root = folder_and_models
    more = [str(root / m) if m.endswith(".keras") else m for m in more]
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=expected):
        own_images.run(cli.parser().parse_args(_argv(root, out, *more)))
    assert not out.exists() or not os.listdir(out)


@pytest.mark.backend_independent
def test_finetune_refuses_a_student_without_a_distillation_token(folder_and_models, tmp_path):
    root = folder_and_models
    plain = tmp_path / "plain.keras"
    _teacher().save(plain)
    argv = _argv(root, tmp_path / "run", "--teacher", str(root / "teacher.keras"), "--distillation", "hard")
    argv[argv.index("--weights") + 1] = str(plain)
    with pytest.raises(ValueError, match="distillation_token=True"):
        own_images.run(cli.parser().parse_args(argv))
    assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")


@pytest.mark.backend_independent
def test_a_teacher_that_cannot_be_found_is_refused_by_name(tmp_path):
    from keras_vit.recipes.distill import load_teacher

    with pytest.raises(FileNotFoundError, match="teacher not found"):
        load_teacher(tmp_path / "nowhere.keras")
    with pytest.raises(ValueError, match="ViT_X99"):
        load_teacher("ViT_X99:imagenet21k")  # a registry release is VARIANT:TAG
    with pytest.raises(ValueError, match="Unknown tag 'cifar10'"):
        load_teacher("ViT_B16:cifar10")


@pytest.mark.backend_independent
def test_a_timm_teacher_gives_its_own_logits_at_its_own_normalisation(photos, tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from timm_peer import import_timm

    from keras_vit.recipes.distill import load_teacher

    timm = import_timm()
    module = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=1,
                                                               num_heads=3, num_classes=3)  # timm's Ti width: its heads known
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    safetensors_torch.save_file(module.state_dict(), str(tmp_path / "teacher.safetensors"))
    teacher = load_teacher(tmp_path / "teacher.safetensors")
    images, _ = photos
    distiller = Distiller(_student(), teacher)
    scale, offset = (np.asarray(teacher.get_layer("rescale").get_config()[k], np.float32) for k in ("scale", "offset"))
    with torch.no_grad():
        expected = module.eval()(torch.from_numpy(images * scale + offset).permute(0, 3, 1, 2)).numpy()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(distiller.teacher_logits(images)), expected, atol=1e-4)
