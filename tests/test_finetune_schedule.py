"""`keras-vit finetune DIR`'s schedule swept over the flags that decide it (square or --naflex, --batch-size,
--device-batch-size, --epochs or --steps, --lora, --layer-decay) on folders just below, at and above a
multiple of the batch: each run either trains its first step with every epoch a whole number of updates,
or is refused before anything is written into --out. The schedule does not depend on the backend."""

import json
import os

import keras
import numpy as np
import pytest

from keras_vit import cli
from keras_vit.recipes import folder_plan, own_images

SCHEDULES = {
    "accumulated": ("--batch-size", "8", "--device-batch-size", "4", "--epochs", "1", "--layer-decay", "0.75"),
    "batch over the folder": ("--batch-size", "48", "--steps", "2"),  # 2 steps of 24, more than a pass
    "steps past a pass": ("--batch-size", "16", "--device-batch-size", "4", "--steps", "5"),
    "default batch, lora": ("--epochs", "1", "--lora", "2"),
}
SIZES = (15, 16, 17)  # training images: one below, at and one above a multiple of 8 and 16
# (schedule, size): the sizes that straddle each schedule's batch (48 is past every folder: two suffice)
CASES = [(k, n) for k in SCHEDULES for n in ((15, 17) if k == "batch over the folder" else (16,) if "lora" in k
                                             else SIZES)]


class FirstStep(Exception):
    """Raised after the first train step: the run got through its start."""


class StopAfterFirstStep(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.steps = self.params["steps"]
        raise FirstStep


def _digits_folder(root, n_train, validation_split=0.2):
    """Two classes of scikit-learn's handwritten digits (0 and 1) as 24x24 PNGs, sized so that the split
    leaves `n_train` training images."""
    from PIL import Image
    from sklearn.datasets import load_digits

    def train(m):
        return m - -(-m * validation_split // 1)

    sizes = next((a, b) for a in range(2, 40) for b in range(2, 40) if train(a) + train(b) == n_train)
    digits = load_digits()
    for label, count in enumerate(sizes):
        os.makedirs(root / str(label))
        for i, image in enumerate(digits.images[digits.target == label][:count]):
            pixels = (image / 16 * 255).astype(np.uint8)
            Image.fromarray(pixels).resize((24, 24), Image.Resampling.BICUBIC).save(root / str(label) / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {n: _digits_folder(tmp_path_factory.mktemp(f"digits{n}"), n) for n in SIZES}


@pytest.mark.backend_independent
@pytest.mark.parametrize("naflex", [False, True], ids=["square", "naflex"])
@pytest.mark.parametrize("schedule, size", CASES)
def test_every_schedule_trains_or_is_refused_before_writing(folders, start, tmp_path, capsys, naflex, schedule, size):
    out = tmp_path / "run"
    argv = ["finetune", str(folders[size]), "--weights", start, "--image-size", "32", "--validation-split", "0.2",
            "--out", str(out), "--quiet", *SCHEDULES[schedule], *(("--naflex", "4") if naflex else ())]
    args = cli.parser().parse_args(argv)
    stop = StopAfterFirstStep()
    if naflex and "--lora" in argv:
        with pytest.raises(ValueError, match="--naflex 4 cannot be combined with --lora"):
            own_images.run(args, [stop])
        assert not out.exists()  # refused before writing
        return
    with pytest.raises(FirstStep):
        own_images.run(args, [stop])
    sched = folder_plan.plan(size, args.batch_size, args.device_batch_size, args.epochs, args.steps)
    assert stop.steps == sched.steps_per_epoch and stop.steps % sched.accumulation == 0  # whole updates
    assert sched.updates_per_epoch == -(-size // sched.batch_size)  # an epoch: a pass, rounded up to updates
    assert json.loads((out / "run.json").read_text())["naflex"] == (4 if naflex else None)
    said = capsys.readouterr().out
    assert f"batch {sched.batch_size} ({sched.accumulation} x {sched.device_batch_size} on the device)" in said


@pytest.mark.backend_independent
def test_the_plan_rule():
    assert folder_plan.plan(17, 48) == folder_plan.Plan(48, 24, 2, 1, 10, 1)  # the largest divisor at most 32
    assert folder_plan.plan(803) == folder_plan.Plan(128, 32, 4, 7, 10, 4)  # the digits: 7 updates of 4 steps
    assert folder_plan.plan(803).steps_per_epoch == 28
    assert folder_plan.plan(40, 7).device_batch_size == 7
    with pytest.raises(ValueError, match=r"`batch_size` \(8\) must be a multiple of `device_batch_size` \(3\)"):
        folder_plan.plan(16, 8, 3)
    with pytest.raises(ValueError, match=r"`device_batch_size` \(16\) must not exceed `batch_size` \(8\)"):
        folder_plan.plan(16, 8, 16)
