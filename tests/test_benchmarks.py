"""The benchmark scripts: their FLOP count against XLA's, and a real (tiny) run of each."""

import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest
from conftest import TINY, once_on_tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import benchmark  # noqa: E402
import family_speed  # noqa: E402
import flops  # noqa: E402
import folder_feed  # noqa: E402
import gemm  # noqa: E402
import hf_coverage  # noqa: E402
import keras_torch_device  # noqa: E402
import timm_coverage  # noqa: E402
import torch_overhead  # noqa: E402
import workers  # noqa: E402


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="XLA's cost analysis of the JAX forward")
def test_model_flops_matches_xla_cost_analysis():
    rows = workers.flops_worker({"variants": ["ViT_Ti16"], "image_sizes": [32, 64]})
    assert len(rows) == 2
    for row in rows:
        # XLA also counts the elementwise work that model_flops leaves out: a little more, never less
        assert 1.0 <= row["ratio"] < 1.03, row


@pytest.mark.backend_independent
def test_model_flops_grows_with_the_tokens_and_their_square():
    small, large = flops.model_flops(image_size=224), flops.model_flops(image_size=448)
    assert large["mlp"] * 197 == small["mlp"] * 785  # linear in the tokens (785 vs 197)
    assert large["attention"] * 197**2 == small["attention"] * 785**2  # quadratic


@pytest.mark.backend_independent
def test_gemm_shapes_and_flops():
    rows = {name: (a, b, form) for name, a, b, form in gemm.shapes("ViT_S16", 32, 224)}
    a, b, form = rows["MLP in  x W"]
    assert (a, b, form) == ((32 * 197, 384), (384, 1536), "nn")
    assert gemm.flops(a, b, form) == 2 * 6304 * 384 * 1536
    a, b, form = rows["attention logits  q k^T"]
    assert gemm.flops(a, b, form) == 2 * (32 * 6) * 197 * 64 * 197
    with pytest.raises(ValueError, match="hybrid"):
        gemm.shapes("R50_ViT_B16", 8, 224)


@once_on_tensorflow("the script's workers (the layers they time are tested per backend)")
def test_benchmark_tiny_run_measures_every_mode(tmp_path):
    backend = keras.backend.backend()
    # the script's own process only starts its workers: run here, it saves a start of TensorFlow and Keras
    out = tmp_path / "out.json"
    benchmark.main(["--tiny", "--backends", backend, "--timm", "off", "--repeats", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    results = report["results"]
    assert not [r for r in results if "error" in r]
    modes = {r["mode"] for r in results}
    assert modes == ({"predict", "call", "train", "step"} if backend == "jax" else {"predict", "call", "train"})
    assert all(r["images_per_s"] > 0 and r["rss_peak_mb"] > 0 for r in results)
    assert report["matmul_peak"]["gflops"] > 0 and report["versions"]["keras"] == keras.__version__


@pytest.mark.backend_independent
def test_gemm_script_measures_every_library(tmp_path):
    # in this process: the script's own would import the same three libraries (seconds of CPU) and no more
    gemm.main(["--variant", "tiny", "--batch", "2", "--repeats", "2", "--out", str(tmp_path / "out.json")])
    report = json.loads((tmp_path / "out.json").read_text())
    assert len(report["rows"]) == 8
    for row in report["rows"]:
        for lib in ("torch", "jax", "tensorflow", "tensorflow_xla"):
            assert row[lib] > 0, (row["product"], lib)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="XLA's memory analysis of the JAX step")
def test_max_batch_fits_the_memory_line_and_remat_lowers_it():
    import jax

    import keras_vit

    rows = {}
    for remat in (False, True):
        # two batches fix the line; each is a compile of the step
        case = {"variant": "tiny", "image_size": 32, "dtype": "float32", "remat": remat, "batches": [8, 16],
                "budget_bytes": 2**30}
        rows[remat] = row = workers._jax_memory_case(case, jax, keras, keras_vit)
        line = row["fixed_bytes"] + row["bytes_per_image"] * row["max_batch"]
        assert line <= row["budget_bytes"] < line + row["bytes_per_image"]
    assert rows[True]["bytes_per_image"] < rows[False]["bytes_per_image"]


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "--batch must be a positive integer, got 0"),
    (["--image-size", "100"], "--image-size must be a multiple of ViT_S16's patch size 16, got 100"),
    (["--variant", "R50_ViT_B16"], "invalid choice"),
])
@pytest.mark.backend_independent
def test_gemm_script_refuses_bad_arguments(args, message, capsys):
    with pytest.raises(SystemExit):
        gemm.main(args)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="the torch backend's cost per call")
def test_torch_overhead_counts_ops_and_host_time_beside_timm(tmp_path, capsys):
    """benchmarks/torch_overhead.py on the tiny configuration: both libraries timed, their dispatched aten ops
    and layer calls (Keras') / module forwards (timm's) counted, the host time split off, the table printed."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch_overhead.main(["--models", "tiny", "--batches", "1", "--repeats", "2", "--json", str(tmp_path / "r.json")])
    finally:
        torch.set_num_threads(threads)  # the script runs on one thread; the lane's later tests on their own
    printed = capsys.readouterr().out
    (row,) = json.loads((tmp_path / "r.json").read_text())
    # keras-vit's forward is one layer call, the model's (its nodes run their own calls: tests/test_direct_inference.py)
    assert row["keras-vit"]["calls"] == 1 and row["timm"]["calls"] > 4, row
    for library in ("keras-vit", "timm"):
        got = row[library]
        assert got["median_ms"] > 0 and got["ops"] > 20 and 0 < got["op_ms"], (library, got)
        assert got["host_ms"] >= 0 and got["host_us_per_call"] == pytest.approx(1e3 * got["host_ms"] / got["calls"])
    assert row["x_timm"] == pytest.approx(row["timm"]["median_ms"] / row["keras-vit"]["median_ms"])
    assert "| tiny | 1 |" in printed and "thread(s)" in printed.splitlines()[0]


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="timm's models beside keras-vit's: the fastest lane")
def test_family_speed_times_every_family_beside_timm(tmp_path, capsys):
    """benchmarks/family_speed.py at one block and 32 px (28 for the /14 families): each family's timm architecture
    read by from_timm and timed beside timm in both modes, the table printed and the rows written."""
    rows = family_speed.main(["--depth", "1", "--image-size", "32", "--batch", "2", "--warmup", "1", "--repeats", "1",
                              "--json", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text()) == {"backend": "torch", "rows": rows}
    assert [(r["family"], r["mode"]) for r in rows] == [(f, m) for f in family_speed.FAMILIES for m in family_speed.MODES]
    for r in rows:
        assert r["depth"] == 1 and r["image_size"] in (28, 32) and r["keras_vit_ms"] > 0 and r["timm_ms"] > 0
        assert r["x_timm"] == pytest.approx(r["timm_ms"] / r["keras_vit_ms"])
    printed = capsys.readouterr().out
    assert "| DINOv3 (`vit_small_patch16_dinov3`, 1 blocks, 32 px) | inference |" in printed and "| ViT (" in printed
    with pytest.raises(SystemExit):
        family_speed.main(["--families", "ViT-22B"])
    assert "invalid choice: 'ViT-22B'" in capsys.readouterr().err


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="Keras' torch backend's conversion")
def test_keras_torch_device_shows_the_move_of_a_tensor_already_on_the_device(tmp_path, capsys):
    """benchmarks/keras_torch_device.py, the script for Keras' tracker: the backend's device as Keras keeps it
    (a string) makes each convert_to_tensor of a CPU tensor dispatch an aten::to; as a torch.device, none; the
    global device it changes to show it is Keras' own again after."""
    from keras.src.backend.torch.core import get_device

    before = get_device()
    result = keras_torch_device.main(["--calls", "50", "--json", str(tmp_path / "r.json")])
    assert get_device() is before
    assert json.loads((tmp_path / "r.json").read_text()) == result
    assert result["differs"] and result["device"] == "'cpu'"
    assert result["string"]["ops"] == ["aten::to"] and result["torch.device"]["ops"] == []
    assert result["string"]["us_per_call"] > 0 and result["torch.device"]["us_per_call"] > 0
    assert "a tensor's device != it: True" in capsys.readouterr().out


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="timm's models beside keras-vit's: the fastest lane")
def test_timm_coverage_loads_deit_exactly_and_names_why_a_file_is_refused(tmp_path, capsys):
    """benchmarks/timm_coverage.py on one architecture of two modules: timm's DeiT-Ti built at depth 2, written, read
    by from_timm and equal to timm's output; a hybrid of timm's ResNet-D backbone refused with the reason, which the
    table groups."""
    rows = timm_coverage.main(["--modules", "deit", "vision_transformer_hybrid", "--names", "deit_tiny_patch16_224",
                               "vit_small_resnet26d_224", "--json", str(tmp_path / "c.json")])
    deit, hybrid = rows
    assert (deit["module"], deit["status"]) == ("deit", "exact") and deit["error"] <= 1e-5 * max(1.0, deit["scale"])
    assert (hybrid["module"], hybrid["status"]) == ("vision_transformer_hybrid", "refused")
    assert "a hybrid whose backbone is no ResNetV2" in hybrid["why"] and str(tmp_path) not in hybrid["why"]  # not the place
    assert json.loads((tmp_path / "c.json").read_text())["rows"] == rows
    printed = capsys.readouterr().out
    assert "| deit | 1 | 1 | 100% | 0 | 0 | 0 |" in printed and "| **all** | **1** | 2 | **50%** |" in printed


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="transformers' models beside keras-vit's: torch's lane")
def test_hf_coverage_loads_exactly_says_why_a_class_differs_and_names_a_refusal(tmp_path, capsys, monkeypatch):
    """benchmarks/hf_coverage.py on three classes: transformers' BeitModel made small, saved, read by from_huggingface
    and equal to its pooler output; DeiTModel different on purpose, with the documented reason; ViTMAEModel refused
    by a reader made to refuse it, with the reason (not the folder's place), which the table lists; the JSON rows
    are the returned ones."""
    import keras_vit

    real = keras_vit.from_huggingface

    def refusing(folder, **kwargs):
        if json.loads((pathlib.Path(folder) / "config.json").read_text())["architectures"] == ["ViTMAEModel"]:
            raise ValueError(f"{folder}: a reader made to refuse it")
        return real(folder, **kwargs)

    monkeypatch.setattr(keras_vit, "from_huggingface", refusing)
    rows = hf_coverage.main(["--modules", "beit", "deit", "vit_mae", "--names", "BeitModel", "DeiTModel", "ViTMAEModel",
                             "--json", str(tmp_path / "c.json")])
    beit, deit, mae = rows
    assert (beit["name"], beit["status"]) == ("BeitModel", "exact") and beit["error"] <= 1e-5 * max(1, beit["scale"])
    assert (deit["name"], deit["status"], deit["why"]) == ("DeiTModel", "differs", hf_coverage.DOCUMENTED["DeiTModel"])
    assert (mae["name"], mae["status"]) == ("ViTMAEModel", "refused") and "a reader made to refuse it" in mae["why"]
    assert "/tmp" not in mae["why"] and json.loads((tmp_path / "c.json").read_text())["rows"] == rows
    printed = capsys.readouterr().out
    assert "| beit | 1 | 1 | 0 | 0 | 0 |" in printed and "| **all** | **1** | 3 | 1 | 1 | 0 |" in printed


@pytest.mark.backend_independent
def test_torch_compile_times_timm_eager_and_compiled_and_ratios_each():
    args = benchmark.argparse.Namespace(
        variants=["ViT_B16"], image_sizes=[224], dtypes=["mixed_bfloat16"], modes=["train"], batch_sizes=[256],
        train_batch_sizes=None, jit=["auto", "on"], remat="off", torch_compile=True, recipe="pretrain")
    cases = benchmark.build_cases(args)
    timm = benchmark._dedupe_timm(cases)
    assert [(c["mode"], c["torch_compile"], c["recipe"]) for c in timm] == [("train", False, "pretrain"),
                                                                          ("train", True, "pretrain")]
    on_torch = benchmark.backend_cases(cases, "torch")
    assert [(c["jit"], c["torch_compile"]) for c in on_torch] == [("auto", False), ("on", True)]
    assert [c["torch_compile"] for c in benchmark.backend_cases(cases, "jax")] == [False]
    results = [{**timm[0], "library": "timm", "backend": "torch", "images_per_s": 200.0},
               {**timm[1], "library": "timm", "backend": "torch", "images_per_s": 400.0},
               {**on_torch[0], "library": "keras-vit", "backend": "torch", "images_per_s": 100.0}]
    benchmark.add_derived(results, 1e6)
    assert results[2]["ratio_to_timm"] == 0.5 and results[2]["ratio_to_timm_compile"] == 0.25
    row = benchmark.table(results).splitlines()[-1]
    assert "0.50 (0.25 compiled)" in row


@once_on_tensorflow("the command times its feeds on TensorFlow (its __main__ sets it) whichever backend the suite "
                    "runs: its main runs in this process, its fit part in a torch process as the torch lane's did")
def test_folder_feed_quick_run_measures_the_keras_vit_feeds_and_says_why_timm_did_not_run(capsys):
    backend = "torch"  # the fit part's process: a backend that takes its batch outside the compiled step
    capsys.readouterr()
    folder_feed.main(["--quick", "--backends", backend])
    printed = capsys.readouterr().out
    rows = {}
    for line in printed.splitlines():
        if line.startswith("| ") and not line.startswith("| pipeline") and not line.startswith("| backend"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    for name in (folder_feed.KERAS_VIT_TF, folder_feed.KERAS_VIT_PY, folder_feed.KERAS_IDFD):
        rate, _, ratio = rows[name]  # median, range, x timm
        assert float(rate.replace(",", "")) > 0 and ratio == "-", (name, rows[name])
    assert rows[folder_feed.TIMM][0].startswith("not run: no --timm-python given"), rows[folder_feed.TIMM]
    fit = rows[backend]  # step in memory, (step, ratio to it) per folder pipeline, ms taking the next batch
    # seconds a step printed to 1 ms (a tiny step on a quiet machine reads 0.000), ratios to the in-memory step
    assert len(fit) == 6 and all(float(fit[i]) >= 0 for i in (0, 1, 3)), fit
    assert all(fit[i].endswith("x") and float(fit[i][:-1]) > 0 for i in (2, 4)), fit
    assert all(float(ms) >= 0 for ms in fit[5].split("; ")), fit  # TensorFlow's would be inside its step
    assert printed.startswith("CPU: ") and "load average" in printed


@pytest.mark.backend_independent
def test_folder_feed_refuses_bad_arguments(capsys):
    for args, message in ((["--backends", "jax,mxnet"], "--backends: unknown mxnet"),
                          (["--images", "0"], "--images must be a positive integer, got 0")):
        with pytest.raises(SystemExit):
            folder_feed.parse(args)
        assert message in capsys.readouterr().err


@once_on_tensorflow("the script runs on TensorFlow (its default) whichever backend the suite runs")
def test_any_size_serving_benchmark_times_every_file(capsys):
    """benchmarks/any_size.py, tiny model, one size: the any-size file, a fixed file per size and the position resize
    alone (timm's dynamo export, a minute and more of tracing, is left to the benchmark's own runs). Its main runs
    in this process, the tensorflow lane's (no process start: TensorFlow, Keras and onnxruntime are imported)."""
    import any_size

    capsys.readouterr()
    any_size.main(["--model", "tiny", "--repeats", "1", "--threads", "1", "--sizes", "32x96", "--no-timm"])
    printed = capsys.readouterr().out
    report = json.loads(printed[:printed.rindex("}") + 1])
    assert [row["size"] for row in report["rows"]] == ["32x96"]
    for row in report["rows"]:
        assert row["any-size_ms_per_image"] > 0 and row["fixed_ms_per_image"] > 0 and row["resize_ms_per_call"] > 0
        assert row["any_over_fixed"] == row["any-size_ms_per_image"] / row["fixed_ms_per_image"]
    assert report["timm_export"] == "not run (--no-timm)"
    assert report["clock"] == "process CPU time"


@pytest.mark.one_backend
def test_naflex_benchmark_quick_run_trains_both_ways_on_one_token_budget(tmp_path):
    """benchmarks/naflex.py --quick: square and NaFlex fine-tuned on the same batches, each measured."""
    pytest.importorskip("skimage")
    pytest.importorskip("sklearn")
    import naflex

    # in this process: the script's own would import what this one has (Keras, its backend, TensorFlow: seconds of CPU)
    naflex.main(["--quick", "--quiet", "--out", str(tmp_path / "out.json")])
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["backend"] == keras.backend.backend() and report["cpu"]
    assert 0.5 < report["naflex_valid_token_fraction"] <= 1  # each image fills most of the 16 tokens, none more
    for way in ("square", "NaFlex"):
        result = report["ways"][way]
        assert [c["epoch"] for c in result["curve"]] == [0] and set(result["phases"]) == {"finetune"}
        phase = result["phases"]["finetune"]
        assert 0 <= phase["accuracy"] <= 1 and phase["loss"] > 0 and phase["train_images_per_s"] > 0
        assert result["inference_images_per_s"] > 0 and result["host_ms_per_image"] > 0
        assert len(report["feature_probe"][way]["scores"]) == 2


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's traces of the step")
def test_tf_first_fit_times_the_step_traced_once_and_as_keras_alone(tmp_path):
    """benchmarks/tf_first_fit.py, one round on the tiny configuration: both modes timed, in fresh processes."""
    # one block: the second trace the fact is about is the step's, whatever the depth
    model = json.dumps({**{k: v for k, v in TINY.items() if k not in ("image_size", "classes")}, "num_layers": 1})
    done = subprocess.run([sys.executable, "benchmarks/tf_first_fit.py", "--model", model, "--image-size", "32",
                           "--batch", "4", "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rounds = re.findall(r"^round 1 +(once|keras): first fit +([\d.]+) s", done.stdout, re.M)
    assert [mode for mode, _ in rounds] == ["once", "keras"] and all(float(s) > 0 for _, s in rounds), done.stdout
    assert re.search(r"first fit [\d.]+ s traced once, [\d.]+ s as Keras alone traces it \([\d.]+x\)$",
                     done.stdout.strip()), done.stdout
