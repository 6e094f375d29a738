"""benchmarks/recipes_ablation.py: the training-recipes table of docs/training-recipes.md, run at a tiny size."""

import argparse
import os
import sys

import numpy as np
import pytest
from conftest import tiny_variant

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import recipe_photos  # noqa: E402
import recipes_ablation  # noqa: E402

from keras_vit.cli import parser  # noqa: E402
from keras_vit.recipes import presets  # noqa: E402


def _applied(flags, batch):
    args = parser().parse_args(["finetune", "photos", *flags])
    presets.apply(args)
    args.lr = presets.scaled_lr(args, batch)
    return {flag: getattr(args, flag) or None for flag in presets.PRESET_FLAGS}  # 0, False and None: off


@pytest.mark.backend_independent
@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_spelled_out_flags_are_the_preset(preset):
    assert _applied(recipes_ablation.spelled(preset, batch=64), 64) == _applied(["--recipe", preset], 64)


@pytest.mark.backend_independent
def test_spelled_out_flags_turn_one_component_off():
    full = _applied(["--recipe", "deit"], 64)
    for component, flags in recipes_ablation.COMPONENTS.items():
        if not any(full[f] for f in flags):
            continue
        without = _applied(recipes_ablation.spelled("deit", [component], 64), 64)
        assert [f for f in presets.PRESET_FLAGS if without[f] != full[f]] == [f for f in flags if full[f]]
        assert all(without[f] is None for f in flags)


@pytest.mark.backend_independent
def test_rows_of_the_two_phases():
    published = [recipes_ablation.published(name) for name in presets.LR_BATCH]
    assert published == ["deit, --lr 0.0005", "deit3, --lr 0.003"]  # the papers' rates, not scaled to the batch
    assert list(recipes_ablation.rows()) == [*presets.PRESETS, *published, recipes_ablation.KERAS_IO]
    assert _applied(recipes_ablation.spelled("deit", ["RandAugment"], 64, lr=5e-4), 64)["lr"] == 5e-4
    assert recipes_ablation.rows(published[0])[published[0] + " without RandAugment"][1:] == ("deit", 5e-4,
                                                                                           "RandAugment")
    for preset in presets.PRESETS:
        second = recipes_ablation.rows(preset)
        used = [how[3] for how in second.values() if how[0] == "without"]
        for component, flags in recipes_ablation.COMPONENTS.items():  # those the preset sets, and only those
            assert (component in used) == any(presets.PRESETS[preset].get(f) for f in flags), (preset, component)
        assert list(second)[-1] == preset + recipes_ablation.DISTILLED
    assert "deit without dropout" not in recipes_ablation.rows("deit")  # DeiT has no dropout


@pytest.mark.backend_independent
def test_test_crops_come_from_their_own_region(tmp_path):
    rng = np.random.default_rng(0)
    photo = np.tile(np.arange(200, dtype=np.uint8)[None, :, None], (120, 1, 3))  # a pixel's value: its column
    for columns in (recipe_photos.TRAIN_COLUMNS, recipe_photos.TEST_COLUMNS):
        for crop in recipe_photos._crops(photo, columns, 20, rng):
            assert columns[0] * 200 - 1 <= crop.min() and crop.max() <= columns[1] * 200
    train, test = recipe_photos.write_split(str(tmp_path), 2, 1)
    assert sorted(os.listdir(train)) == sorted(os.listdir(test)) == sorted(recipe_photos.PHOTOS)
    images, labels = recipe_photos.test_arrays(test, 32)
    assert images.shape == (len(recipe_photos.PHOTOS), 32, 32, 3) and images.dtype == np.uint8
    assert labels.tolist() == list(range(len(recipe_photos.PHOTOS)))


@pytest.mark.one_backend
@pytest.mark.timeout(900)  # two tiny training runs, slow on busy cores
def test_quick_benchmark_writes_the_table(tmp_path, capsys, monkeypatch):
    tiny_variant(monkeypatch)  # ViT_Ti16 at TINY's size: the table's plumbing
    out = tmp_path / "result.json"
    result = recipes_ablation.main(["--quick", "--out", str(out), "--work", str(tmp_path / "work")])
    rows = recipes_ablation.QUICK["rows"]
    assert sorted(result["summary"]) == sorted(rows) and out.exists() and result["ablated"] == "deit"
    for row in result["summary"].values():
        assert 0.0 <= row["mean"] <= 1.0 and row["n"] == 1 and row["seconds"] > 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0].lstrip("| ") for line in table if line.startswith("| ") and "---" not in line][1:] \
        == list(result["summary"])
    again = recipes_ablation.main(["--quick", "--out", str(out), "--work", str(tmp_path / "work")])  # runs kept
    assert again["runs"] == result["runs"]


def test_a_variant_factory_builds_the_distillation_token_of_a_student_from_scratch():
    # what `keras-vit finetune --weights none --distillation hard` builds (it failed with a TypeError before)
    import keras_vit

    options = dict(weights=None, image_size=32, patch_size=8, classes=3, input_dtype="uint8")
    student, plain = keras_vit.ViT_Ti16(**options, distillation_token=True), keras_vit.ViT_Ti16(**options)
    names = {layer.name for layer in student.layers}
    assert {"head", "head_dist"} <= names and "head_dist" not in {layer.name for layer in plain.layers}
    # the token, its position embedding and the second head
    assert student.count_params() == plain.count_params() + 192 + 192 + 192 * 3 + 3


@pytest.mark.backend_independent
def test_differences_are_paired_by_seed():
    def run(*accuracies):
        return {str(seed): {"accuracy": a, "seconds": 1.0} for seed, a in enumerate(accuracies)}

    runs = {"a": run(0.5, 0.7, 0.4), "b": run(0.4, 0.4)}  # b has no seed 2
    diffs = 100 * (np.array([0.5, 0.7]) - [0.4, 0.4])
    mean, error = recipes_ablation.paired(runs, "a", "b")
    assert mean == pytest.approx(diffs.mean()) and error == pytest.approx(diffs.std(ddof=1) / np.sqrt(2))
    summary = recipes_ablation.summarise(runs)
    assert "| a | 53.3 | 15.3 | +20.0 ± 10.0 | 3 |" in recipes_ablation.markdown(summary, "b", runs=runs)
