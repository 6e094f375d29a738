"""The feed benchmarks of issues 45 and 46 at a tiny size: benchmarks/augmented_feed.py (the folder feed with
RandAugment, random erasing and MixUp/CutMix) and benchmarks/shard_throughput.py (tar shards beside the
folder), each run as its command runs, its table read back. A command times its feeds on the TensorFlow backend
whatever KERAS_BACKEND says (its `__main__` sets it), and its fit part in processes of the backends it is given:
its `main` runs in the tensorflow lane's process (no start of TensorFlow and Keras), its fits on torch as before."""

import os
import sys

import pytest
from conftest import once_on_tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import augmented_feed  # noqa: E402
import shard_throughput  # noqa: E402


def _rows(stdout):
    """{first cell: other cells} of the markdown tables a benchmark printed (header rows left out)."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("| ") and not line.startswith(("| pipeline", "| backend")):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def _run(capsys, script, *args):
    """The rows `script`'s main printed run with --quick and `args`."""
    capsys.readouterr()
    script.main(["--quick", *args])
    printed = capsys.readouterr().out
    assert printed.startswith("CPU: ") and "load average" in printed
    return _rows(printed)


ON_TENSORFLOW = once_on_tensorflow("the command times its feeds on TensorFlow whichever backend the suite runs")


@ON_TENSORFLOW
def test_augmented_feed_quick_run_times_the_mixed_feeds_and_fits_on_them(capsys):
    backend = "torch"  # the fit part's process (the lane that ran this command in a process of its own)
    # one round of one timed batch (--quick's are 2 of 2): each of the six pipelines still times its batches
    rows = _run(capsys, augmented_feed, "--backends", backend, "--repeats", "1", "--batches", "1")
    names = [template.format(dtype) for dtype in augmented_feed.DTYPES
             for template in (augmented_feed.TF, augmented_feed.PY, augmented_feed.PY_THREADS)]
    for name in names:
        rate, _, ratio = rows[name]  # median, range, x timm
        assert float(rate.replace(",", "")) > 0 and ratio == "-", (name, rows[name])
    for dtype in augmented_feed.DTYPES:
        assert rows[augmented_feed.TIMM.format(dtype)][0].startswith("not run: no --timm-python given")
    fit = rows[backend]  # step in memory, (step, ratio to it) per folder pipeline, ms taking the next batch
    # seconds a step printed to 1 ms (a tiny step on a quiet machine reads 0.000), ratios to the in-memory step
    assert len(fit) == 6 and all(float(fit[i]) >= 0 for i in (0, 1, 3)), fit
    assert all(fit[i].endswith("x") and float(fit[i][:-1]) > 0 for i in (2, 4)), fit


@ON_TENSORFLOW
def test_shard_throughput_quick_run_times_the_folder_and_the_shards(capsys, tmp_path, monkeypatch):
    # the scan cache's home: main's setdefault would leave this process's KERAS_HOME at its deleted temporary folder
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    rows = _run(capsys, shard_throughput)
    for name in (shard_throughput.FOLDER_TF, shard_throughput.FOLDER_PY, shard_throughput.SHARDS_TF,
                 shard_throughput.SHARDS_PY):
        rate, _, ratio = rows[name]
        assert float(rate.replace(",", "")) > 0 and ratio == "-", (name, rows[name])
    for name in shard_throughput.TIMM.values():
        assert rows[name][0].startswith("not run: no --timm-python given"), rows[name]


@pytest.mark.backend_independent
def test_the_feed_benchmarks_refuse_bad_arguments(capsys):
    for parse, args, message in (
            (shard_throughput.parse, ["--shard-size", "0"], "--shard-size must be a positive integer, got 0"),
            (shard_throughput.parse, ["--images", "-3"], "--images must be a positive integer, got -3"),
            (augmented_feed.folder_feed.parse, ["--batches", "0"], "--batches must be a positive integer, got 0")):
        with pytest.raises(SystemExit):
            parse(args)
        assert message in capsys.readouterr().err


@pytest.mark.backend_independent
def test_each_augmented_row_is_compared_with_timms_row_of_its_dtype():
    rates = {augmented_feed.TF.format("uint8"): [300.0, 500.0, 400.0],
             augmented_feed.TF.format("float32"): [90.0, 110.0, 100.0],
             augmented_feed.TIMM.format("uint8"): [200.0, 200.0, 250.0],
             augmented_feed.TIMM.format("float32"): [50.0, 40.0, 60.0]}
    rows = _rows(augmented_feed.pipeline_table(rates, {}))
    medians = {name: sorted(values)[1] for name, values in rates.items()}
    for name, (rate, spread, ratio) in rows.items():
        peer = medians[augmented_feed.TIMM.format(name.rsplit(", ", 1)[1])]
        assert float(rate) == medians[name] and spread == f"{min(rates[name]):.0f}-{max(rates[name]):.0f}"
        assert ratio == f"{medians[name] / peer:.2f}x", (name, ratio)
