"""benchmarks/gpu.py, the one-command GPU session, rehearsed on the CPU as it runs on a bare GPU
machine: an interpreter that lacks Keras (this environment with keras, keras-hub, TensorFlow,
scikit-learn and matplotlib taken out), the keras wheel fetched into a wheels folder by
`--fetch-wheels` from a local index and installed by the session, a time budget that stops it,
`--resume` that finishes it, and the README tables rewritten from its JSON."""

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import python_without

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU = os.path.join(ROOT, "benchmarks", "gpu.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu  # noqa: E402  (the standard library only)
import gpu_session  # noqa: E402
import gpu_tables  # noqa: E402

# what a bare GPU machine lacks: Keras and what needs it, TensorFlow; and what Keras imports at its start only where
# installed (scikit-learn, matplotlib), which each part's process would import for nothing
HIDDEN = re.compile(r"^(keras|tensorflow|tf_keras|sklearn|scikit_learn|matplotlib)([-_.].*)?$", re.IGNORECASE)


def _wheel_of_installed(dist_name, folder):
    """A wheel of the installed distribution `dist_name`, packed from its installed files."""
    dist = importlib.metadata.distribution(dist_name)
    info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    path = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files:
            if "__pycache__" in f.parts or f.parts[0] == ".." or f.name == "RECORD" or f.suffix == ".pth":
                continue
            data = dist.locate_file(f).read_bytes()
            z.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{f},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The session as a GPU machine runs it, on the CPU: a first command stopped by its budget, a
    second that resumes it. Returns (first JSON, second JSON, fetch output, the folder)."""
    tmp = tmp_path_factory.mktemp("gpu-session")
    python = python_without(tmp, HIDDEN)
    probe = subprocess.run([python, "-c", "import keras"], capture_output=True, text=True)
    assert "No module named 'keras'" in probe.stderr  # the rehearsal starts where a bare GPU machine does
    (tmp / "index").mkdir()
    _wheel_of_installed("keras", tmp / "index")
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp / "index"))
    env.pop("PYTHONPATH", None)
    fetch = subprocess.run([python, GPU, "--fetch-wheels", str(tmp / "wheels")], env=env, capture_output=True,
                           text=True, timeout=300)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    common = ["--quick", "--wheels", str(tmp / "wheels"), "--site", str(tmp / "site"), "--backends",
              "jax,torch,tensorflow", "--peers", "timm,keras-hub"]
    runs = []
    for extra in (["--out", str(tmp / "first.json"), "--budget", "15"],
                  ["--out", str(tmp / "second.json"), "--resume", str(tmp / "first.json")]):
        proc = subprocess.run([python, GPU, *common, *extra], cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs.append(proc.stdout)
    assert "the issue's figures need a GPU" in runs[1]  # says so where it ran without one
    load = lambda name: json.loads((tmp / name).read_text())  # noqa: E731
    return load("first.json"), load("second.json"), fetch.stdout, tmp


@pytest.mark.slow
@pytest.mark.one_backend
@pytest.mark.timeout(900)  # the first one sets the rehearsal up: two session commands
def test_the_keras_wheel_is_fetched_then_installed_where_keras_is_missing(rehearsal):
    first, second, fetched, tmp = rehearsal
    keras = importlib.metadata.version("keras")
    assert "fetched keras\n" in fetched + "\n" and "not fetched optree" in fetched  # optree: not in the index
    assert f"installed keras {keras}" in first["install"]
    assert f"kept keras {keras} (already here; the folder's {keras} not used)" in second["install"]
    assert second["versions"]["keras"] == keras and second["versions"]["tensorflow"] is None
    assert os.path.isdir(tmp / "site" / "keras")


@pytest.mark.slow
@pytest.mark.one_backend
@pytest.mark.timeout(900)  # the first one sets the rehearsal up: two session commands
def test_the_budget_stops_a_session_and_resume_finishes_it(rehearsal):
    first, second, _, _ = rehearsal
    cut = {k for k, v in first["parts"].items() if v["status"] in ("timed out", "budget")}
    assert cut and all("--resume" in r["not_run"] for r in first["results"] if r["part"] in cut and "not_run" in r)
    assert {k for k, v in second["parts"].items() if v["status"] not in ("done", "not installed")} == set()
    done_first = {k for k, v in first["parts"].items() if v["status"] == "done"}
    assert all(second["parts"][k] == first["parts"][k] for k in done_first)  # kept, not run again


@pytest.mark.slow
@pytest.mark.one_backend
@pytest.mark.timeout(900)  # the first one sets the rehearsal up: two session commands
def test_every_part_is_figures_or_one_line_saying_why_not(rehearsal):
    _, second, _, _ = rehearsal
    rows = second["results"]
    assert second["rate"]["gflops"] > 0 and second["rate"]["device"].startswith("cpu")
    for backend in ("jax", "torch"):
        ours = {r["mode"]: r for r in rows if r["library"] == "keras-vit" and r["backend"] == backend
                and "lever" not in r}
        assert set(ours) == {"fit (pretraining)", "fit (finetuning)", "predict", "latency"}, rows
        assert all(r["images_per_s"] > 0 for r in ours.values()), ours
        assert ours["fit (pretraining)"]["x_timm"] > 0 and ours["predict"]["x_timm"] > 0
        assert ours["fit (pretraining)"]["peak_mb"] > 0 and ours["latency"]["latency_ms"] > 0
        # the policy each model was built in, read back from it (clear_session() once reset it to float32)
        assert {r["policy"] for r in ours.values() if r["mode"] != "latency"} == {"mixed_bfloat16"}, ours
    assert {r["mode"] for r in rows if r["library"] == "timm"} == {"fit (AdamW)", "predict", "latency"}
    levers = {r["lever"]: r for r in rows if "lever" in r}
    assert set(levers) == set(gpu_session.LEVERS)
    assert all(r["x_base"] > 0 for r in levers.values()), levers
    missing = {r["part"]: r["not_run"] for r in rows if r["part"].startswith(("keras-vit/tensorflow", "keras-hub"))}
    assert set(missing) == {"keras-vit/tensorflow/tiny", "keras-hub/jax/tiny", "keras-hub/torch/tiny",
                            "keras-hub/tensorflow/tiny"}, missing
    assert all("not installed and" in why and "holds no wheel for" in why for why in missing.values()), missing


@pytest.mark.slow
@pytest.mark.one_backend
@pytest.mark.timeout(900)  # the first one sets the rehearsal up: two session commands
def test_the_tables_are_rewritten_from_the_json_and_a_cpu_session_is_refused(rehearsal):
    _, second, _, tmp = rehearsal
    (tmp / "repo" / "benchmarks").mkdir(parents=True)
    for rel in ("README.md", "benchmarks/README.md"):
        shutil.copyfile(os.path.join(ROOT, rel), tmp / "repo" / rel)
    gpu_tables.update_tables(second, root=tmp / "repo")
    readme = (tmp / "repo" / "README.md").read_text()
    fit = next(r for r in second["results"] if r["part"] == "keras-vit/jax/tiny" and r["mode"] == "fit (pretraining)")
    assert f"| keras-vit, jax | {fit['images_per_s']:,.0f} img/s (" in readme
    assert "| keras-vit, tensorflow | not run: tensorflow not installed" in readme
    bench = (tmp / "repo" / "benchmarks" / "README.md").read_text()
    assert gpu_tables.results_table(second) in bench and "Wheels: installed keras" in bench
    for rel, text in (("README.md", readme), ("benchmarks/README.md", bench)):  # nothing outside the block moved
        with open(os.path.join(ROOT, rel)) as f:
            original = f.read()
        assert text.split(gpu_tables.BEGIN)[0] == original.split(gpu_tables.BEGIN)[0]
        assert text.split(gpu_tables.END)[1] == original.split(gpu_tables.END)[1]
    with pytest.raises(SystemExit):
        gpu.main(["--render", str(tmp / "second.json")])


@pytest.mark.backend_independent
def test_the_committed_tables_are_those_of_the_recorded_session():
    record = None
    if os.path.exists(gpu_tables.RESULTS):
        with open(gpu_tables.RESULTS) as f:
            record = json.load(f)
    for rel, render in (("README.md", gpu_tables.render_readme),
                        ("benchmarks/README.md", gpu_tables.render_benchmarks)):
        with open(os.path.join(ROOT, rel)) as f:
            text = f.read()
        assert gpu_tables.replace_block(text, render(record), rel) == text, f"{rel}: run benchmarks/gpu.py --render"


@pytest.mark.backend_independent
@pytest.mark.parametrize("argv", [["--peers", "hf"], ["--levers", "fp8"], ["--backends", "mxnet"]])
def test_unknown_names_are_refused(argv):
    with pytest.raises(SystemExit):
        gpu.main(["--quick", *argv])
