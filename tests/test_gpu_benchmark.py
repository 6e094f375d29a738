"""benchmarks/gpu.py end to end in its --quick mode (a tiny model on the CPU), on the current backend."""

import importlib.util
import json
import os
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.one_backend
def test_quick_run_times_fit_and_inference_beside_timm(tmp_path):
    if importlib.util.find_spec("timm") is None:  # timm itself imports torchvision, which gpu.py stands in for
        pytest.importorskip("timm")
    backend = keras.backend.backend()
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--quick", "--backends", backend,
         "--peers", "timm", "--recipes", "pretraining", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the issue's figures need a GPU" in proc.stdout  # says so where it ran without one
    rows = json.loads(out.read_text())["results"]
    assert not [r for r in rows if "error" in r], rows
    ours = {r["mode"]: r for r in rows if r["library"] == "keras-vit"}
    assert set(ours) == {"fit (pretraining)", "predict", "latency"}, rows
    fit = ours["fit (pretraining)"]
    assert fit["backend"] == backend and fit["images_per_s"] > 0 and fit["peak_mb"] > 0 and fit["mfu"] > 0
    assert fit["x_timm"] > 0 and ours["predict"]["x_timm"] > 0 and ours["latency"]["latency_ms"] > 0
    assert {r["mode"] for r in rows if r["library"] == "timm"} == {"fit (AdamW)", "predict", "latency"}


def test_unknown_peer_is_refused():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import gpu

    with pytest.raises(SystemExit):
        gpu.main(["--quick", "--peers", "hf"])
