"""One command for a GPU session: what a user runs, timed where ViTs are trained, with the peers in
the same run (issues #18, #27).

    python3 benchmarks/gpu.py --wheels .whl --out gpu-session.json   # a bare GPU machine: the whole session
    python3 benchmarks/gpu.py --resume gpu-session.json ...          # a second command: what the first left
    .venv/bin/python benchmarks/gpu.py --render gpu-session.json     # here: the README tables from its JSON
    .venv/bin/python benchmarks/gpu.py --fetch-wheels .whl           # here, before: the wheels to bring along
    .venv/bin/python benchmarks/gpu.py --quick                       # a tiny model on any machine: a rehearsal

On a GPU machine with Python, JAX, torch and timm but no Keras, no TensorFlow and no network, it
first installs what is missing from the wheels folder (pip, no index, no dependencies), then runs
its parts one process each, most telling first, within `--budget` seconds:
- keras-vit's `model.fit` of `VisionTransformer(input_dtype="uint8")` under both recipes
  (`compile_for_pretraining`: AdamW with clipping; `compile_for_finetuning`: SGD with momentum and
  clipping) on a uint8 feed (tf.data, or a `PyDataset` without TensorFlow), then `predict` at
  `--infer-batch` and the batch-1 latency of `predict_on_batch`, per Keras backend: ViT-B/16 at
  batch 256, then ViT-L/16 at batch 128, 224 px, `mixed_bfloat16`;
- timm's ViT of the same configuration, eager and under `torch.compile`, AdamW with clipping and
  bfloat16 autocast, fed the same uint8 batches, beside each;
- the levers on JAX, ViT-B/16: cuDNN's fused attention in training, `steps_per_execution=4`, a
  float32 feed instead of uint8, remat;
- keras-hub's ViT of the same shape under the pretraining recipe, per backend.
A part whose package is missing, that fails, or that the budget does not reach is one "not run"
line and the session goes on; the JSON is rewritten after every part, so a command stopped at its
limit hands over what it finished, and `--resume` runs the rest. On a GPU the session then
rewrites the GPU tables of README.md and benchmarks/README.md from the JSON. Per row: img/s, the
ratio to each timm peer, peak device memory (the process's peak RSS on a CPU) and the model FLOP
utilisation against the bfloat16 matrix rate measured first.
"""

import argparse
import datetime
import glob
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from gpu_workers import dump  # noqa: E402  (the standard library only: Keras may not be installed yet)

BACKENDS = ("jax", "torch", "tensorflow")
PEERS = ("timm", "timm-compile", "keras-hub")
RECIPES = ("pretraining", "finetuning")
LEVERS = {"flash attention": {"attention_implementation": "flash"}, "steps_per_execution=4": {"steps_per_execution": 4},
          "float32 feed": {"input_dtype": "float32"}, "remat": {"remat": True}}
FULL = dict(cases=[["ViT_B16", 256], ["ViT_L16", 128]], image_size=224, steps=20, warmup=3, infer_batch=256,
            latency_repeats=30, budget=540)
QUICK = dict(cases=[["tiny", 8]], image_size=32, steps=3, warmup=2, infer_batch=8, latency_repeats=3, budget=900)
# module -> distribution, for what a part needs; WHEELS: what --fetch-wheels brings for a bare GPU machine
DISTRIBUTIONS = {"keras": "keras", "jax": "jax", "torch": "torch", "tensorflow": "tensorflow", "keras_hub": "keras-hub",
                 "timm": "timm"}
WHEELS = ("keras", "namex", "optree", "keras-hub", "kagglehub", "kagglesdk")
VERSIONS = ("keras", "jax", "jaxlib", "torch", "timm", "keras-hub", "tensorflow", "numpy")
RESULTS = os.path.join(HERE, "results", "gpu-session.json")
README_POLICY = "mixed_bfloat16"  # the README's table: a Keras row in another policy says so in its cell
BEGIN, END = "<!-- gpu-session: begin", "<!-- gpu-session: end -->"


# -- installing from the wheels folder ----------------------------------------------------------
def _installed(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_wheels(folder, site):
    """Installs into `site` each wheel of `folder` whose distribution is not installed here (pip, no
    index, no dependencies: the folder brings them), and puts `site` on this process's path.
    Returns one line per wheel."""
    if not folder or not os.path.isdir(folder):
        return [f"no wheels folder {folder!r}: nothing installed"]
    os.makedirs(site, exist_ok=True)
    sys.path.insert(0, site)
    importlib.invalidate_caches()
    lines = []
    for path in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        name, version = os.path.basename(path).split("-")[:2]
        name = re.sub(r"[-_.]+", "-", name).lower()
        have = _installed(name)
        if have:
            lines.append(f"kept {name} {have} (already here; the folder's {version} not used)")
            continue
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                               "--no-compile", "--disable-pip-version-check", "--upgrade", "--target", site, path],
                              capture_output=True, text=True)
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        done = f"installed {name} {version}"
        lines.append(f"not {done}: {last[:200]}" if proc.returncode else done)
        importlib.invalidate_caches()
    return lines


def fetch_wheels(folder, python_version):
    """Downloads WHEELS for a Linux x86-64 CPython `python_version` machine into `folder`, at the
    versions installed here where they are (what the tests ran); one line per wheel."""
    os.makedirs(folder, exist_ok=True)
    tags = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    lines = []
    for dist in WHEELS:
        version = _installed(dist)
        pin = f"{dist}=={version}" if version else dist
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "--python-version", python_version, "--implementation",
                               "cp", *[a for t in tags for a in ("--platform", t)], "-d", folder, pin],
                              capture_output=True, text=True)
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        lines.append(f"not fetched {pin}: {last[:200]}" if proc.returncode else f"fetched {pin}")
    return lines


def _missing(modules, wheels):
    """Why a part needing `modules` cannot run here, or None."""
    absent = [DISTRIBUTIONS[m] for m in modules if importlib.util.find_spec(m) is None]
    if not absent:
        return None
    where = ""
    if wheels and os.path.isdir(wheels):
        where = f" and {wheels} holds no wheel for {'it' if len(absent) == 1 else 'them'}"
    return f"{', '.join(absent)} not installed{where}"


# -- the parts -----------------------------------------------------------------------------------
def plan(preset, backends, peers, recipes, levers):
    """The session's parts, most telling first: per case keras-vit on the first backend, timm, the
    other backends, the JAX levers (first case); then keras-hub."""
    parts = []
    timm = [p for p in ("timm", "timm-compile") if p in peers]
    for i, (variant, batch) in enumerate(preset["cases"]):
        case = dict(variant=variant, batch=batch)
        ours = [dict(case, key=f"keras-vit/{b}/{variant}", kind="keras", library="keras-vit", backend=b,
                     recipes=recipes, inference=True, needs=["keras", b]) for b in backends]
        parts += ours[:1]
        if timm:
            parts.append(dict(case, key=f"timm/{variant}", kind="timm", backend="torch", library="timm", peers=timm,
                              needs=["keras", "torch", "timm"]))  # keras: the configuration comes from keras_vit
        parts += ours[1:]
        if i == 0 and "jax" in backends:
            parts += [dict(case, key=f"lever {name}/jax/{variant}", kind="keras", library="keras-vit", backend="jax",
                           recipes=["pretraining"], inference=False, lever=LEVERS[name], lever_name=name,
                           needs=["keras", "jax"]) for name in levers]
    if "keras-hub" in peers:
        parts += [dict(variant=v, batch=n, key=f"keras-hub/{b}/{v}", kind="keras", library="keras-hub", backend=b,
                       recipes=recipes[:1], inference=True, needs=["keras", b, "keras_hub"])
                  for v, n in preset["cases"] for b in backends]
    return parts


def _head(part):
    keys = ("backend", "variant", "batch")
    return {"library": part.get("library", part["key"]), **{k: part[k] for k in keys if k in part}, "mode": "",
            "part": part["key"],
            **({"lever": part["lever_name"]} if "lever_name" in part else {})}


def run_part(part, spec, env, timeout):
    """Runs one part in its own process; returns (rows, status). A part stopped at `timeout` keeps
    the rows it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "rows.json")
        dump(spec_path, spec)
        cmd = [sys.executable, os.path.join(HERE, "gpu_workers.py"), part["kind"], spec_path, out]
        try:
            proc = subprocess.run(cmd, env=dict(env, KERAS_BACKEND=part["backend"]), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=timeout)
            status, log = ("done" if proc.returncode == 0 else f"worker exit {proc.returncode}"), proc.stdout
        except subprocess.TimeoutExpired as err:
            status, log = "timed out", err.stdout or ""
        log = log.decode(errors="replace") if isinstance(log, bytes) else log
        rows = []
        if os.path.exists(out):
            with open(out) as f:
                rows = json.load(f)
    if status == "timed out":
        rows.append({**_head(part), "not_run": "the session's time budget ran out during this part; --resume runs it"})
    elif status != "done" and not rows:
        tail = " | ".join(log.strip().splitlines()[-4:])
        rows.append({**_head(part), "not_run": f"{status}: {tail[-400:]}"})
    return [{**r, "part": part["key"]} for r in rows], status


def derive(results):
    """Each row's ratio to each timm peer of the same case, and each lever's to its base row."""
    def kind(mode):  # timm trains with AdamW: the pretraining recipe's fit is its counterpart
        return "fit" if mode in ("fit (AdamW)", "fit (pretraining)") else mode

    done = [r for r in results if "images_per_s" in r]
    timm = {(r["library"], r["variant"], kind(r["mode"]), r["batch"]): r["images_per_s"]
            for r in done if r["library"].startswith("timm")}
    base = {(r["backend"], r["variant"]): r["images_per_s"] for r in done
            if r["library"] == "keras-vit" and r["mode"] == "fit (pretraining)" and "lever" not in r}
    for r in done:
        if "lever" in r:
            if (r["backend"], r["variant"]) in base:
                r["x_base"] = r["images_per_s"] / base[r["backend"], r["variant"]]
            continue
        for peer in ("timm", "timm-compile"):
            ref = timm.get((peer, r["variant"], kind(r["mode"]), r["batch"]))
            if ref and r["library"] != peer:
                r[f"x_{peer}"] = r["images_per_s"] / ref
    return results


def session(args, preset, backends, peers, recipes, levers):
    """Installs, runs every part not done yet within the budget, writes the JSON after each; returns it."""
    budget = args.budget or preset["budget"]
    deadline = time.monotonic() + budget
    install = install_wheels(args.wheels, args.site)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, args.site, os.environ.get("PYTHONPATH")) if p))
    prior = {}
    if args.resume:
        with open(args.resume) as f:
            prior = json.load(f)
    record = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), quick=args.quick,
                  command=" ".join(["python3 benchmarks/gpu.py", *sys.argv[1:]]), cases=preset["cases"],
                  budget_s=budget, python=platform.python_version(), machine=platform.platform(),
                  versions={d: _installed(d) for d in VERSIONS},
                  install=prior.get("install", []) + install, rate=prior.get("rate"), parts={}, results=[])
    parts = [dict(key="rate", kind="rate", backend="torch", needs=["torch"])]
    parts += plan(preset, backends, peers, recipes, levers)
    for n, part in enumerate(parts, 1):
        key = part["key"]
        if prior.get("parts", {}).get(key, {}).get("status") == "done":
            record["parts"][key] = prior["parts"][key]
            record["results"] += [r for r in prior["results"] if r.get("part") == key]
            continue
        reason, status, rows, start = _missing(part["needs"], args.wheels), None, [], time.monotonic()
        if reason:
            status, rows = "not installed", [{**_head(part), "not_run": reason}]
        elif deadline - time.monotonic() <= 0:
            status, rows = "budget", [{**_head(part), "not_run": f"the time budget ({budget:.0f} s) was spent "
                                                               "before this part; --resume runs it"}]
        else:
            print(f"[{n}/{len(parts)}] {key} ...", flush=True)
            spec = dict(preset, **part, policy=args.policy, quick=args.quick,
                        rate_gflops=(record["rate"] or {}).get("gflops"))
            rows, status = run_part(part, spec, env, deadline - time.monotonic())
            print(f"    {status} in {time.monotonic() - start:.0f} s", flush=True)
        if key == "rate":
            record["rate"] = next((r for r in rows if "gflops" in r), None)
            rows = [r for r in rows if "not_run" in r]
        record["parts"][key] = {"status": status, "seconds": round(time.monotonic() - start, 1)}
        record["results"] += rows
        derive(record["results"])
        if args.out:
            dump(args.out, record)
    return record


# -- tables --------------------------------------------------------------------------------------
def _on_gpu(record):
    return not record.get("quick") and (record.get("rate") or {}).get("device", "").startswith("cuda")


def _variant(name):
    return re.sub(r"^ViT_(\w)(\d+)$", r"ViT-\1/\2", name)


def _speed(r):
    if "not_run" in r:
        return "not run: " + r["not_run"].replace("|", "/")[:120]
    latency = f" ({r['latency_ms']:.1f} ms)" if "latency_ms" in r else ""
    return f"{r['images_per_s']:,.0f}{latency}"


def _ratio(r, key):
    return f"{r[key]:.2f}" if key in r else ""


def results_table(record):
    """The session's rows as one markdown table (the levers with their ratio to the base row)."""
    head = "| library | backend | variant | batch | mode | policy | img/s | x timm | x timm compiled | peak GB | MFU |"
    lines = [head, "|" + "---|" * 11]
    for r in record["results"]:
        lever = f"{r['lever']}" + (f" ({r['x_base']:.2f}x base)" if "x_base" in r else "") if "lever" in r else ""
        mode = ", ".join(m for m in (r["mode"], lever) if m)
        peak = f"{r['peak_mb'] / 1024:.1f}{'' if r.get('memory') == 'device' else ' (RSS)'}" if "peak_mb" in r else ""
        mfu = f"{100 * r['mfu']:.0f}%" if r.get("mfu") else ""
        lines.append(f"| {r['library']} | {r.get('backend', '')} | {r.get('variant', '')} | {r.get('batch', '')} | "
                     f"{mode} | {r.get('policy', '')} | {_speed(r)} | {_ratio(r, 'x_timm')} | {_ratio(r, 'x_timm-compile')} | {peak} | {mfu} |")
    return "\n".join(lines)


def _describe(record):
    rate = record["rate"] or {}
    versions = ", ".join(f"{d} {v}" for d, v in record["versions"].items() if v)
    note = f" {record['note']}" if record.get("note") else ""
    return (f"{record['date']}, {rate.get('device', 'device not measured')}; bfloat16 matmul "
            f"{rate.get('gflops', float('nan')) / 1e3:.0f} TFLOP/s; Python {record['python']}, {versions}.{note}")


def render_benchmarks(record):
    """The GPU-session block of benchmarks/README.md (`record` None: the block that waits for one)."""
    if record is None:
        return "No GPU session is recorded yet: every figure of this section waits for one (the steps below)."
    parts = ", ".join(f"{k} {v['seconds']:.0f} s" for k, v in record["parts"].items() if v["status"] == "done")
    return "\n".join([f"Measured {_describe(record)}", "", f"    {record['command']}", "", results_table(record), "",
                      f"Wheels: {'; '.join(record['install'])}.", "", f"Parts (seconds): {parts}."])


def render_readme(record):
    """The README's GPU table: `model.fit` under the pretraining recipe (AdamW, timm's counterpart) per
    library and backend, one column per case (`record` None: the rows a session fills, waiting)."""
    cases = record["cases"] if record else FULL["cases"]
    fits = {}
    for r in record["results"] if record else []:
        key = (r["library"], r["backend"], r["variant"])
        # a part the budget stopped after its fit keeps the figure, not the line that says it was stopped
        fit = r["mode"] in ("fit (pretraining)", "fit (AdamW)", "") and "lever" not in r
        if fit and "images_per_s" not in fits.get(key, {}):
            fits[key] = r
    names = {"timm": "timm, eager", "timm-compile": "timm, `torch.compile`"}
    lines = [f"| `model.fit`, `{README_POLICY}`, AdamW | " + " | ".join(f"{_variant(v)}, batch {b}" for v, b in cases)
             + " |", "|---|" + "---|" * len(cases)]
    order = [("keras-vit", b) for b in BACKENDS] + [("timm", "torch"), ("timm-compile", "torch")]
    for library, backend in order + [("keras-hub", b) for b in BACKENDS]:
        cells = []
        for variant, _ in cases:
            r = fits.get((library, backend, variant))
            if r is None:
                cells.append("waits" if record is None else "")
            elif "images_per_s" in r:
                peer = next((f" ({r[k]:.2f}x timm {name})" for k, name in (("x_timm-compile", "compiled"),
                                                                         ("x_timm", "eager")) if k in r), "")
                other = f" in {r['policy']}" if r.get("policy") in POLICIES and r["policy"] != README_POLICY else ""
                cells.append(f"{r['images_per_s']:,.0f} img/s{other}{peer}")
            else:
                cells.append(_speed(r))
        if any(cells):
            lines.append(f"| {names.get(library) or f'{library}, {backend}'} | " + " | ".join(cells) + " |")
    what = (f"Measured {_describe(record)}" if record else
            "No GPU session is recorded yet: every cell waits for one.")
    return what + "\n\n" + "\n".join(lines)


def replace_block(text, block, where):
    """`text` with the block between the gpu-session markers replaced by `block`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{where} has no '{BEGIN} ... {END}' block to rewrite")
    start = text.index("-->", start) + 3
    return text[:start] + "\n" + block + "\n" + text[end:]


def update_tables(record, root=ROOT):
    """Rewrites the GPU blocks of README.md and benchmarks/README.md under `root` from `record` (None:
    the blocks that wait for a session)."""
    for rel, render in (("README.md", render_readme), (os.path.join("benchmarks", "README.md"), render_benchmarks)):
        path = os.path.join(root, rel)
        with open(path) as f:
            text = replace_block(f.read(), render(record), rel)
        with open(path + ".part", "w") as f:
            f.write(text)
        os.replace(path + ".part", path)


def _positive(kind):
    """An argparse type: a finite number of `kind` above 0, else the error that names what came. (The finetune
    command's own_images._positive does the same; this script imports nothing of keras_vit, which needs Keras,
    not installed yet on a bare GPU machine.)"""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive {'integer' if kind is int else 'number'}, "
                                             f"got {text!r}")
        return value
    return parse


def _session_json(text):
    """An argparse type: the path of a session's JSON object, read."""
    try:
        with open(text) as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise argparse.ArgumentTypeError(f"expected a session JSON written by gpu.py --out, got {text!r}: {err}")
    if not isinstance(record, dict):
        raise argparse.ArgumentTypeError(f"expected a session JSON object, {text!r} holds a {type(record).__name__}")
    return text


POLICIES = ("float32", "mixed_bfloat16", "mixed_float16", "bfloat16", "float16")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, a few steps: a rehearsal on any machine")
    parser.add_argument("--wheels", default=os.path.join(ROOT, ".whl"),
                        help="folder of wheels to install what is missing from (default: .whl in the repository)")
    parser.add_argument("--site", default=os.path.join(tempfile.gettempdir(), "keras-vit-gpu-site"),
                        help="where the wheels are installed (pip --target)")
    parser.add_argument("--out", default="gpu-session.json", help="the session's JSON (rewritten after each part)")
    parser.add_argument("--resume", metavar="JSON", type=_session_json, help="keep the parts this session JSON has done, run the rest")
    parser.add_argument("--budget", type=_positive(float), default=None,
                        help=f"seconds for all parts (default {FULL['budget']}; --quick {QUICK['budget']})")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="Keras backends (those installed run)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"peers in the same run, from {','.join(PEERS)}")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="the recipes fit runs under")
    parser.add_argument("--levers", default=",".join(LEVERS), help=f"JAX levers, from {','.join(LEVERS)}")
    parser.add_argument("--policy", default="mixed_bfloat16", choices=POLICIES,
                        help="Keras dtype policy (default mixed_bfloat16)")
    parser.add_argument("--steps", type=_positive(int), default=None, help="timed fit steps")
    parser.add_argument("--render", metavar="JSON", type=_session_json, help="instead: rewrite the README tables from a session's JSON")
    parser.add_argument("--fetch-wheels", metavar="DIR", help="instead: download the wheels a bare GPU machine needs")
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for --fetch-wheels")
    parser.add_argument("--feed", action="store_true",
                        help="instead: host time per batch of a float32 vs a uint8 pipeline on each backend")
    parser.add_argument("--feed-batch", type=_positive(int), default=64, help="batch of --feed (default 64)")
    args = parser.parse_args(argv)
    if args.fetch_wheels:
        print("\n".join(fetch_wheels(args.fetch_wheels, args.python_version)))
        return 0
    if args.render:
        with open(args.render) as f:
            record = json.load(f)
        if not _on_gpu(record):
            parser.error(f"{args.render} is not a full session on a GPU (quick={record.get('quick')}, device "
                         f"{(record.get('rate') or {}).get('device')!r}): the README's GPU tables take only those")
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        if not (os.path.exists(RESULTS) and os.path.samefile(args.render, RESULTS)):  # re-rendering the kept one
            shutil.copyfile(args.render, RESULTS)
        update_tables(record)
        print(f"rewrote README.md and benchmarks/README.md from {args.render}; kept it as {RESULTS}")
        return 0
    listed = {"peer": (args.peers, PEERS), "recipe": (args.recipes, RECIPES), "lever": (args.levers, LEVERS),
              "backend": (args.backends, BACKENDS)}
    chosen = {}
    for what, (value, known) in listed.items():
        chosen[what] = [v for v in value.split(",") if v]
        unknown = sorted(set(chosen[what]) - set(known))
        if unknown:
            parser.error(f"unknown {what} {unknown}; expected some of {', '.join(known)}")
    preset = dict(QUICK if args.quick else FULL)
    preset["steps"] = args.steps or preset["steps"]
    if args.feed:
        spec = dict(preset, feed_batch=args.feed_batch, steps=args.steps or 20)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
        for backend in chosen["backend"]:
            rows, _ = run_part(dict(key=f"feed/{backend}", kind="feed", backend=backend), spec, env, None)
            for r in rows:
                print(r.get("not_run") or f"{r['backend']:<11} {r['mode']:<15} batch {r['batch']}: "
                      f"{r['host_ms_per_batch']:.1f} ms of host time, {r['mb_per_batch']:.1f} MiB")
        return 0
    record = session(args, preset, chosen["backend"], chosen["peer"], chosen["recipe"], chosen["lever"])
    print(results_table(record))
    if not _on_gpu(record):
        print("no GPU: these figures only check that the command runs; the issue's figures need a GPU; "
              "the README tables are left as they are")
    else:
        update_tables(record)
        print(f"rewrote the GPU tables of README.md and benchmarks/README.md from {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
