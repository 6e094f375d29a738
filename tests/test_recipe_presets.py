"""Training recipes by name (`keras-vit finetune DIR --recipe NAME`, keras_vit.recipes.presets), DeiT III's
binary cross-entropy (`--bce-loss`) and smaller patches from scratch (`--patch-size`)."""

import json

import keras
import numpy as np
import pytest
from conftest import photo_folder, tiny_variant

from keras_vit import cli
from keras_vit.recipes import own_images, presets
from keras_vit.recipes.compile import BinaryCrossentropyOnTargets


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"), per_class=6)


@pytest.fixture
def tiny_ti16(monkeypatch):
    """ViT_Ti16 at TINY's size: the runs below check the flags' plumbing, which does not need the 12 layers."""
    tiny_variant(monkeypatch)


def _argv(photos, out, *more):
    return ["finetune", str(photos), "--model", "ViT_Ti16", "--weights", "none", "--image-size", "32", "--steps", "2",
            "--batch-size", "8", "--validation-split", "0.34", "--pipeline", "pydataset", "--out", str(out), "--quiet",
            *more]


class _Compiled(keras.callbacks.Callback):
    """What `fit` trains with: the optimizer's class, weight decay and clipping, the loss's class."""

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        self.seen = {"optimizer": type(optimizer).__name__, "clip": optimizer.global_clipnorm,
                     "weight_decay": getattr(optimizer, "decoupled_weight_decay", None) or optimizer.weight_decay,
                     "loss": type(self.model.loss).__name__}


@pytest.mark.one_backend  # the flags' plumbing; the optimizers and the loss are Keras' and tested below per backend
@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_each_recipe_trains_two_steps_with_its_table(photos, tiny_ti16, tmp_path, name, capsys):
    # the paper's run also takes --bce-loss: binary cross-entropy on integer labels, without MixUp (timm allows it)
    more = ("--bce-loss",) if name == "paper" else ()
    seen = _Compiled()
    summary = own_images.run(cli.parser().parse_args(_argv(photos, tmp_path / name, "--recipe", name, *more)), [seen])
    preset = presets.PRESETS[name]
    flags = json.loads((tmp_path / name / "run.json").read_text())
    assert flags["recipe"] == name and flags["lr"] is None  # None: the preset's rate, scaled to the batch
    for flag in set(presets.PRESET_FLAGS) - {"lr", "bce_loss"}:
        assert flags[flag] == preset[flag], flag
    scale = 8 / presets.LR_BATCH[name] if name in presets.LR_BATCH else 1.0
    np.testing.assert_allclose(summary["schedule"]["base_lr"], preset["lr"] * scale, rtol=1e-12)
    optimizer = {"sgd": "SGD", "adamw": "AdamW", "lamb": "Lamb"}[preset["opt"]]
    bce = preset["bce_loss"] or name == "paper"
    assert seen.seen == {"optimizer": optimizer, "clip": preset["clip_grad"],
                         "weight_decay": preset["weight_decay"] or None,
                         "loss": "BinaryCrossentropyOnTargets" if bce else seen.seen["loss"]}
    assert bce or seen.seen["loss"] != "BinaryCrossentropyOnTargets"
    said = capsys.readouterr().out
    assert ("recipe paper: your --bce-loss True (the preset's False)" in said) == (name == "paper")
    assert np.isfinite(summary["history"]["loss"]).all() and 0 <= summary["validation_accuracy"] <= 1


@pytest.mark.backend_independent
def test_a_given_flag_wins_over_the_preset_and_is_said(photos, tmp_path, capsys):
    parse = cli.parser().parse_args
    args = parse(_argv(photos, tmp_path / "a", "--recipe", "deit", "--smoothing", "0.2", "--lr", "0.001"))
    said = presets.apply(args)
    assert said == "recipe deit: your --lr 0.001 (the preset's 0.0005), --smoothing 0.2 (the preset's 0.1)"
    assert (args.smoothing, args.mixup, args.aug_repeats, args.opt) == (0.2, 0.8, 3, "adamw")  # the rest filled
    assert presets.scaled_lr(args, 64) == 0.001  # a given rate is not scaled
    args = parse(_argv(photos, tmp_path / "b", "--recipe", "deit", "--mixup", "0.8"))  # the preset's own value
    assert presets.apply(args) is None and presets.scaled_lr(args, 64) == pytest.approx(5e-4 * 64 / 512)
    args = parse(_argv(photos, tmp_path / "c"))  # no --recipe: the paper's, as before
    assert presets.apply(args) is None
    assert (args.recipe, args.opt, args.clip_grad, args.mixup) == ("paper", "sgd", 1.0, None)
    assert presets.scaled_lr(args, 64) == 0.01
    args = parse(_argv(photos, tmp_path / "d", "--recipe", "deit3", "--mixup", "0", "--cutmix", "0"))
    presets.apply(args)  # --bce-loss without MixUp or CutMix is allowed, as timm allows it
    assert (args.bce_loss, args.mixup, args.cutmix) == (True, 0.0, 0.0)


def _bce(targets, probabilities):
    p = np.clip(probabilities.astype(np.float64), 1e-7, 1 - 1e-7)
    return -(targets * np.log(p) + (1 - targets) * np.log(1 - p)).mean(axis=-1)


def test_bce_loss_equals_numpy_on_the_same_soft_targets():
    rng = np.random.default_rng(0)
    classes, smoothing = 5, 0.1
    labels, other = rng.integers(0, classes, 6), rng.integers(0, classes, 6)
    onehot = lambda y: np.eye(classes)[y] * (1 - smoothing) + smoothing / classes  # timm's smoothing
    lam = rng.uniform(size=(6, 1))
    mixed = lam * onehot(labels) + (1 - lam) * onehot(other)  # MixUp's soft targets
    logits = rng.normal(size=(6, classes)) * 3
    probabilities = (1 / (1 + np.exp(-logits))).astype("float32")
    soft = BinaryCrossentropyOnTargets(reduction=None)(mixed.astype("float32"), probabilities)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(soft), _bce(mixed, probabilities), atol=1e-6)
    sparse = BinaryCrossentropyOnTargets(sparse_labels=True, label_smoothing=smoothing, reduction=None)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(sparse(labels, probabilities)),
                               _bce(onehot(labels), probabilities), atol=1e-6)
    from_logits = BinaryCrossentropyOnTargets(from_logits=True, reduction=None)(mixed.astype("float32"),
                                                                                logits.astype("float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(from_logits), _bce(mixed, probabilities), atol=1e-6)


def test_bce_target_threshold_binarizes_the_mixed_targets_as_deit3():
    """DeiT III's training loop binarizes MixUp's targets (`targets.gt(0.0)`) before its BCE: both classes of a
    pair become positives, whatever lambda; timm's `--bce-target-thresh t` the same at t."""
    rng = np.random.default_rng(1)
    classes = 5
    labels, other = rng.integers(0, classes, 8), rng.integers(0, classes, 8)
    lam = rng.uniform(size=(8, 1))
    mixed = lam * np.eye(classes)[labels] + (1 - lam) * np.eye(classes)[other]
    probabilities = (1 / (1 + np.exp(-rng.normal(size=(8, classes)) * 3))).astype("float32")
    for threshold in (0.0, 0.3):
        loss = BinaryCrossentropyOnTargets(target_threshold=threshold, reduction=None)
        got = keras.ops.convert_to_numpy(loss(mixed.astype("float32"), probabilities))
        np.testing.assert_allclose(got, _bce((mixed > threshold).astype(float), probabilities), atol=1e-6)
        assert BinaryCrossentropyOnTargets.from_config(loss.get_config()).target_threshold == threshold
    with pytest.raises(ValueError, match="target_threshold"):
        BinaryCrossentropyOnTargets(target_threshold=1.5)


@pytest.mark.backend_independent
def test_patch_size_builds_the_variant_with_smaller_patches(photos, tmp_path):
    args = cli.parser().parse_args(_argv(photos, tmp_path / "out", "--patch-size", "4", "--recipe", "deit3"))
    own_images.own_images_args.check_args(args)
    model = own_images.build_model(args, ("a", "b", "c"))
    assert tuple(model.get_layer("embedding").output.shape) == (None, 64, 192)  # (32 / 4)^2 patches of ViT-Ti's width
    assert model.get_layer("predictions").activation.__name__ == "sigmoid"  # --bce-loss (deit3's): a sigmoid head


BAD = {  # flags -> what the message says
    ("--recipe", "deit4"): "--recipe must be one of paper, deit, deit3, augreg; got 'deit4'",
    ("--patch-size", "5"): "--patch-size 5 must divide --image-size 32",
    ("--patch-size", "4", "--weights", "imagenet21k"): "--patch-size 4 builds a model from scratch: it needs "
                                                       "--weights none (a pretrained checkpoint's patch size is fixed)",
    ("--recipe", "augreg", "--weight-decay", "-1"): "--weight-decay must be >= 0, got -1.0",
    ("--opt", "lamb", "--layer-decay", "0.75"): "--layer-decay 0.75 works with --opt sgd or adamw, got --opt lamb",
    ("--recipe", "deit3", "--bce-target-thresh", "1"): "--bce-target-thresh must be in [0, 1), got 1.0",
    ("--aa", "3a", "--color-jitter", "2"): "--color-jitter must be a number in [0, 1]",
}


@pytest.mark.backend_independent
def test_bad_recipe_flags_are_refused_and_write_nothing(photos, tmp_path, capsys):
    out = tmp_path / "out"
    for flags, message in BAD.items():
        assert cli.main(_argv(photos, out, *flags)) == 2, flags
        assert message in capsys.readouterr().err, flags
        assert not out.exists(), flags


@pytest.mark.backend_independent
def test_the_docs_show_each_presets_table_and_source():
    import pathlib

    page = (pathlib.Path(__file__).parents[1] / "docs" / "finetuning.md").read_text()
    for name in presets.PRESETS:
        assert presets.table(name) in page, name  # the table as the preset holds it, not a copy gone stale
    for source in ("Dosovitskiy et al. 2021", "Touvron et al. 2021", "Touvron et al. 2022", "Steiner et al. 2021"):
        assert source in page


@pytest.mark.backend_independent
def test_the_examples_runner_takes_the_same_presets(capsys):
    from keras_vit.recipes import FINETUNE_SETUPS
    from keras_vit.recipes.finetune_args import parse_args, run_flags

    base = ["--model", "ViT_Ti16", "--weights", "none", "--batch-size", "64", "--steps", "10"]
    paper = parse_args("cifar10", base)  # no --recipe: Table 4's run, recorded as before
    setup = FINETUNE_SETUPS["cifar10"]
    assert (paper.recipe, paper.lr, paper.opt, paper.mixup) == (None, setup.default_lr, "sgd", None)
    assert run_flags(paper)["recipe"] is None
    deit = parse_args("cifar10", [*base, "--recipe", "deit"])
    assert deit.lr == pytest.approx(5e-4 * 64 / 512) and (deit.aa, deit.aug_repeats) == ("rand-m9-mstd0.5-inc1", 3)
    assert run_flags(deit)["recipe"] == "deit"
    assert parse_args("cifar10", [*base, "--recipe", "deit", "--lr", "0.001"]).lr == 0.001
    assert "recipe deit: your --lr 0.001 (the preset's 0.0005)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parse_args("cifar10", [*base, "--recipe", "deit4"])
    assert "--recipe must be one of paper, deit, deit3, augreg; got 'deit4'" in capsys.readouterr().err


@pytest.mark.one_backend  # the runner's plumbing of a preset: LAMB, binary cross-entropy, MixUp/CutMix on tf.data
def test_the_examples_runner_trains_a_preset_two_steps(tiny_ti16, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    from keras_vit.recipes import finetune

    seen = _Compiled()
    with tfds.testing.mock_data(num_examples=16):
        metrics = finetune.main("cifar10", ["--model", "ViT_Ti16", "--weights", "none", "--image-size", "32",
                                            "--batch-size", "8", "--steps", "2", "--data-dir", "/nonexistent/tfds",
                                            "--output-dir", str(tmp_path / "run"), "--verbose", "0",
                                            "--recipe", "deit3"], callbacks=[seen])
    assert seen.seen == {"optimizer": "Lamb", "clip": 1.0, "weight_decay": 0.02, "loss": "BinaryCrossentropyOnTargets"}
    assert metrics["flags"]["recipe"] == "deit3" and metrics["flags"]["lr"] == pytest.approx(3e-3 * 8 / 2048)
    assert np.isfinite(metrics["history"]["loss"]).all()
