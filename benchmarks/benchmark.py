"""Throughput, memory and FLOP-utilisation benchmark of keras-vit, side by side with timm.

A script, not a test. Each Keras backend runs in its own subprocess (KERAS_BACKEND is fixed per
process), timm runs in another, all in one invocation, so ratios hold on a noisy machine.

    .venv/bin/python benchmarks/benchmark.py --variants ViT_B16 --batch-sizes 8 --out b16.json
    .venv/bin/python benchmarks/benchmark.py --variants ViT_S16 --batch-sizes 32 --modes train
    .venv/bin/python benchmarks/benchmark.py --cost-curve            # ViT-B/16 at 224, 384, 512
    .venv/bin/python benchmarks/benchmark.py --max-batch             # largest trainable batch
    .venv/bin/python benchmarks/benchmark.py --tiny                  # a seconds-long smoke run

Measured per (backend, variant, resolution, batch, dtype policy, jit setting):
- `predict`: `model.predict_on_batch(x)`;
- `call`: the compiled forward: `jax.jit(model.stateless_call)` on JAX, `tf.function(model,
  jit_compile=...)` on TensorFlow, eager `model(x)` under `torch.no_grad()` on torch
  (`torch.compile` with `--torch-compile`);
- `train`: `model.train_on_batch` after `model.compile(AdamW, sparse cross-entropy from logits,
  jit_compile=...)`: forward, backward and the optimizer update;
- `step` (JAX): the same training step as `jax.jit` of `model.stateless_call` + `jax.value_and_grad`
  + `optimizer.stateless_apply` with donated state and device-resident data: what `model.fit`
  runs per batch, without `train_on_batch`'s per-call state sync (matters on a GPU).
timm: eager forward under `torch.inference_mode()`, and forward + backward + `torch.optim.AdamW`.

Every measurement warms up `--warmup` calls (>= 2: the first compiles), then times `--repeats`
calls and reports the median (min and max too). Peak memory is the largest resident set size
sampled during the measurement (and the GPU allocator's peak on a GPU). FLOPs per image come from
the configuration alone (`model_flops`); achieved GFLOP/s are compared with the float32 matmul peak
measured at start. JSON goes to `--out` (written atomically), a table to stdout.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile


from flops import ARCHS, arch_config, model_flops, train_flops
from workers import worker_main

from keras_vit.fileio import write_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BACKENDS = ("jax", "tensorflow", "torch")
MODES = ("predict", "call", "train", "step")


def thread_env(threads):
    """Environment variables that cap every framework's CPU threads at `threads` (None: no cap)."""
    if not threads:
        return {}
    n = str(int(threads))
    xla = f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'} intra_op_parallelism_threads={n}"
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "TF_NUM_INTRAOP_THREADS": n,
            "TF_NUM_INTEROP_THREADS": "1", "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + xla).strip()}


def run_worker(spec, env_backend=None, timeout=None):
    """Runs one worker subprocess; returns its list of results."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        if env_backend:
            env["KERAS_BACKEND"] = env_backend
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(thread_env(spec.get("threads")))
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", spec_path, out_path]
        proc = subprocess.run(cmd, env=env, timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                print("   ", line, flush=True)
        if proc.returncode or not os.path.exists(out_path):
            tail = "\n".join(proc.stdout.splitlines()[-15:])
            print(f"worker {spec['kind']}/{env_backend} failed (exit {proc.returncode}):\n{tail}", flush=True)
            return [{"kind": spec["kind"], "backend": env_backend, "error": f"worker exit {proc.returncode}: "
                     + tail[-500:]}]
        with open(out_path) as f:
            return json.load(f)



def versions():
    out = {"python": platform.python_version()}
    for name in ("keras", "jax", "jaxlib", "tensorflow", "torch", "timm", "numpy"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # noqa: BLE001
            pass
    return out


def machine():
    info = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["memory_gb"] = int(f.readline().split()[1]) / 2**20
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            info["gpu"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def merge_rounds(rounds):
    """One result per case: the round with the median throughput (all rounds' figures kept)."""
    if len(rounds) == 1:
        return rounds[0]
    merged = []
    for i, first in enumerate(rounds[0]):
        same = [r[i] for r in rounds if i < len(r) and "images_per_s" in r[i]]
        if not same:
            merged.append(first)
            continue
        same.sort(key=lambda r: r["images_per_s"])
        pick = dict(same[(len(same) - 1) // 2])
        pick["images_per_s_rounds"] = [r["images_per_s"] for r in same]
        if all(r.get("ratio_to_timm") for r in same):
            pick["ratio_to_timm_rounds"] = [r["ratio_to_timm"] for r in same]
            pick["ratio_to_timm"] = statistics.median(pick["ratio_to_timm_rounds"])
        merged.append(pick)
    return merged


def add_derived(results, peak_gflops):
    for r in results:
        if "error" in r or "images_per_s" not in r or "mode" not in r:
            continue
        flops = model_flops(**arch_config(r["variant"], r["image_size"]))["total"]
        per_image = train_flops(flops) if r["mode"] in ("train", "step") else flops
        r["gflop_per_image"] = per_image / 1e9
        r["achieved_gflops"] = per_image * r["images_per_s"] / 1e9
        ref = peak_gflops
        if isinstance(peak_gflops, dict):
            ref = peak_gflops.get(r.get("dtype"), peak_gflops.get("float32"))
        r["fraction_of_peak"] = r["achieved_gflops"] / ref if ref else None
    # ratio to timm of the same (variant, size, batch, dtype, mode class)
    ref = {}
    for r in results:
        if r.get("library", "").startswith("timm") and "images_per_s" in r:
            kind = "train" if r["mode"] in ("train", "step") else "infer"
            ref[(r["variant"], r["image_size"], r["batch"], r["dtype"], kind, bool(r.get("torch_compile")))] = \
                r["images_per_s"]
    for r in results:
        if "images_per_s" in r and not r.get("library", "").startswith("timm") and not r.get("paired"):
            kind = "train" if r["mode"] in ("train", "step") else "infer"
            key = (r["variant"], r["image_size"], r["batch"], r["dtype"], kind)
            t, tc = ref.get((*key, False)), ref.get((*key, True))
            r["ratio_to_timm"] = r["images_per_s"] / t if t else None
            if tc:
                r["ratio_to_timm_compile"] = r["images_per_s"] / tc


def table(results):
    head = ["library", "backend", "variant", "size", "batch", "dtype", "mode", "jit", "img/s", "GFLOP/s",
            "%peak", "x timm", "peak RSS MB"]
    rows = []
    for r in results:
        if "mode" not in r:
            continue
        if "error" in r:
            rows.append([r.get("library", ""), r.get("backend", ""), r.get("variant", ""), str(r.get("image_size", "")),
                         str(r.get("batch", "")), r.get("dtype", ""), r.get("mode", ""), "", "error: "
                         + r["error"][:60].replace("\n", " "), "", "", "", ""])
            continue
        mem = r.get("gpu_peak_mb")
        mem = (f"{r['rss_peak_mb']:.0f}" if "rss_peak_mb" in r else f"+{r.get('rss_delta_mb', 0):.0f}") + (
            f" (GPU {mem:.0f})" if mem else "")
        rows.append([
            r["library"].split()[0], r["backend"], r["variant"], str(r["image_size"]), str(r["batch"]), r["dtype"],
            r["mode"] + ("+remat" if r.get("remat") else "") + ("+compile" if r.get("torch_compile") else "")
            + (f" (with {r['paired_with']})" if r.get("paired_with") else ""),
            ("compile" if r["backend"] == "torch" else "xla") if r.get("jit_compile") else "-",
            f"{r['images_per_s']:.2f}", f"{r['achieved_gflops']:.0f}",
            f"{100 * r['fraction_of_peak']:.0f}" if r.get("fraction_of_peak") else "",
            (f"{r['ratio_to_timm']:.2f}" if r.get("ratio_to_timm") else "")
            + (f" ({r['ratio_to_timm_compile']:.2f} compiled)" if r.get("ratio_to_timm_compile") else ""), mem,
        ])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def build_cases(args):
    cases = []
    for variant in args.variants:
        for size in args.image_sizes:
            for dtype in args.dtypes:
                for mode in args.modes:
                    training = mode in ("train", "step")
                    batches = args.train_batch_sizes if (training and args.train_batch_sizes) else args.batch_sizes
                    for batch in batches:
                        for jit in args.jit:
                            for remat in ([False, True] if args.remat == "both" else [args.remat == "on"]):
                                if remat and not training:
                                    continue
                                cases.append({"variant": variant, "image_size": size, "batch": batch, "dtype": dtype,
                                              "mode": mode, "jit": jit, "remat": remat,
                                              "torch_compile": args.torch_compile, "recipe": args.recipe})
    return cases


def backend_cases(cases, backend):
    """The cases a backend runs: XLA is always on for JAX (eager JAX is not a mode anyone trains in);
    on torch, jit means torch.compile and runs only with --torch-compile; TensorFlow runs each."""
    out, seen = [], set()
    for c in cases:
        if c["mode"] == "step" and backend != "jax":
            continue
        if backend == "jax":
            if c["jit"] == "off":
                continue
            c = {**c, "jit": "on"}
        if backend == "torch":
            c = {**c, "jit": "on" if c.get("torch_compile") and c["jit"] == "on" else "auto"}
            if c["mode"] == "train":  # compiled by Keras' jit_compile=True, so only with --jit on
                c["torch_compile"] = c["jit"] == "on"
        else:
            c = {**c, "torch_compile": False}
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _dedupe_timm(cases):
    seen, out = set(), []
    for c in cases:
        if ARCHS[c["variant"]]["resnet"] is not None:
            continue
        kind = "train" if c["mode"] in ("train", "step") else "infer"
        for compiled in (False, True) if c.get("torch_compile") else (False,):
            key = (c["variant"], c["image_size"], c["batch"], c["dtype"], kind, compiled)
            if key not in seen:
                seen.add(key)
                out.append({**c, "mode": "train" if kind == "train" else "call", "jit": "off", "remat": False,
                            "torch_compile": compiled})
    return out


def max_batch_search(args, peak):
    """Largest trainable batch of ViT-B/16 and ViT-L/16, with and without remat."""
    budget = args.memory_budget_gb * 2**30 if args.memory_budget_gb else None
    if budget is None:
        info = machine()
        budget = 0.9 * info.get("memory_gb", 16) * 2**30
    cases = [{"variant": v, "image_size": 224, "dtype": args.dtypes[0], "remat": r, "batches": [1, 2, 4],
              "budget_bytes": budget} for v in ("ViT_B16", "ViT_L16") for r in (False, True)]
    return run_worker({"kind": "jax_memory", "cases": cases}, "jax", timeout=args.timeout)


def _parser():
    """The command line's arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--variants", default="ViT_B16")
    p.add_argument("--image-sizes", default="224")
    p.add_argument("--batch-sizes", default="8")
    p.add_argument("--train-batch-sizes", default=None, help="batch sizes of `train` (default: --batch-sizes)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--dtypes", default="float32", help="dtype policies, e.g. float32,mixed_bfloat16")
    p.add_argument("--jit", default="auto", help="auto (keras_vit.jit_compile_default: the package default per backend and mode), on, off, or a list: on,off")
    p.add_argument("--remat", default="off", choices=("off", "on", "both"), help="per-block remat for train")
    p.add_argument("--torch-compile", action="store_true",
                   help="torch.compile the torch backend's call (train: with --jit on); timm runs eager and compiled")
    p.add_argument("--recipe", default="plain", choices=("plain", "pretrain"),
                   help="train: AdamW(1e-4) (plain), or compile_for_pretraining's defaults (AdamW, weight decay "
                        "0.1, clipping at global norm 1, schedule, accuracy metric); timm's step does the same")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1,
                   help="run the whole sequence (timm, then each backend) this many times; the median round counts")
    p.add_argument("--timm", default="paired", choices=("paired", "separate", "off"),
                   help="timm in each backend's process, its calls alternating with keras-vit's (paired: for a "
                        "noisy machine), in a process of its own (separate: for a GPU), or not at all")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of every framework (torch, XLA, TensorFlow, oneDNN); default: theirs (all cores)")
    p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                   help="wall: elapsed time; cpu: this process's CPU time (all threads), which with --threads 1 "
                        "is what a quiet core would take, whatever else runs on the machine")
    p.add_argument("--cost-curve", action="store_true", help="ViT-B/16 inference at 224, 384, 512")
    p.add_argument("--max-batch", action="store_true", help="largest trainable batch, ViT-B/16 and ViT-L/16 (JAX)")
    p.add_argument("--memory-budget-gb", type=float, default=None)
    p.add_argument("--source", action="append", default=[], metavar="NAME=DIR",
                   help="also measure the keras_vit package found in DIR, labelled keras-vit[NAME] (A/B tests "
                        "of model changes in one run); repeatable")
    p.add_argument("--check-flops", action="store_true",
                   help="compare model_flops with XLA's cost analysis of the JAX forward (per variant and size)")
    p.add_argument("--env", action="store_true", help="report each backend's devices and flash attention")
    p.add_argument("--tiny", action="store_true",
                   help="a seconds-long smoke run: the tiny config, the matmul peak of small products, one process "
                        "per backend (its peak memory that of all its cases)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    p.add_argument("--out", default=None, help="JSON output file")
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return p


def _checked(p, args):
    """`args` with its lists split and checked (`p.error` on a bad one), and the --source
    packages as (name, absolute folder) pairs."""
    split = lambda s: [v for v in s.split(",") if v]  # noqa: E731
    args.backends, args.variants, args.modes = split(args.backends), split(args.variants), split(args.modes)
    args.dtypes, args.jit = split(args.dtypes), split(args.jit)
    args.image_sizes = [int(v) for v in split(args.image_sizes)]
    args.batch_sizes = [int(v) for v in split(args.batch_sizes)]
    args.train_batch_sizes = [int(v) for v in split(args.train_batch_sizes)] if args.train_batch_sizes else None
    if args.tiny:
        args.variants, args.image_sizes, args.batch_sizes = ["tiny"], [32], [4]
    if args.cost_curve:
        args.variants, args.image_sizes = ["ViT_B16"], [224, 384, 512]
    for b in args.backends:
        if b not in BACKENDS:
            p.error(f"--backends: expected some of {BACKENDS}, got {b!r}")
    for m in args.modes:
        if m not in MODES:
            p.error(f"--modes: expected some of {MODES}, got {m!r}")
    for j in args.jit:
        if j not in ("auto", "on", "off"):
            p.error(f"--jit: expected auto, on or off, got {j!r}")
    if args.warmup < 2:
        p.error("--warmup must be >= 2: the first call compiles, the second may still specialise")

    sources = []
    for item in args.source:
        name, sep, src = item.partition("=")
        if not sep or not os.path.isdir(os.path.join(src, "keras_vit")):
            p.error(f"--source: expected NAME=DIR with DIR/keras_vit a package, got {item!r}")
        sources.append((name, os.path.abspath(src)))
    return args, sources


def _measure(args, common, peak, sources):
    """The results of every case (timm's and each backend's keras-vit, over --rounds rounds, the
    median round kept), with the derived figures, and their table printed."""
    cases = build_cases(args)
    have_timm = False
    if args.timm != "off":
        try:
            import importlib.util

            have_timm = importlib.util.find_spec("timm") is not None
        except ImportError:
            pass
    rounds = []
    for k in range(args.rounds):
        results = []
        if have_timm and args.timm == "separate" and _dedupe_timm(cases):
            print(f"round {k + 1}: timm", flush=True)
            results += run_worker({"kind": "timm", "cases": _dedupe_timm(cases), **common}, "torch",
                                  timeout=args.timeout)
        for backend in args.backends:
            print(f"round {k + 1}: keras-vit on {backend}", flush=True)
            bcases = backend_cases(cases, backend)
            # one process per case: its peak memory is its own; --tiny's smoke run takes a backend's cases
            # in one process (a process start is most of its time)
            for group in [bcases] if args.tiny else [[case] for case in bcases]:
                for name, src in [(None, None)] + sources:
                    results += run_worker({"kind": "keras", "cases": group, **common, "source": src,
                                           "source_name": name, "paired": have_timm and args.timm == "paired"},
                                          backend, timeout=args.timeout)
        rounds.append(results)
    results = merge_rounds(rounds)
    gpu = peak.get("gpu_gflops") or {}
    peaks = ({"float32": gpu.get("cuda_float32"), "mixed_bfloat16": gpu.get("cuda_bfloat16")} if gpu
             else peak["gflops"])
    add_derived(results, peaks)
    print()
    print(table(results))
    return results


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)

    args, sources = _checked(p, args)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    common = {"warmup": args.warmup, "repeats": args.repeats, "torch_threads": args.threads, "clock": args.clock,
              "threads": args.threads}
    peak = run_worker({"kind": "peak", "libraries": ["numpy", "torch", *args.backends], **common,
                       **({"n": 512} if args.tiny else {})}, "jax", timeout=600)
    rates = ", ".join(f"{k} {v:.0f}" for k, v in peak["by_library"].items())
    print(f"float32 matmul peak: {peak['gflops']:.0f} GFLOP/s ({rates})", flush=True)
    if peak.get("gpu_gflops"):
        print("GPU matmul (8192^3, torch): " + ", ".join(f"{k} {v / 1e3:.0f} TFLOP/s"
                                                       for k, v in peak["gpu_gflops"].items()), flush=True)
    report = {"started": started, "threads": args.threads, "clock": args.clock, "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
              "machine": machine(), "versions": versions(), "matmul_peak": peak, "results": []}
    if args.check_flops:
        report["flops_check"] = run_worker({"kind": "flops", "variants": args.variants,
                                            "image_sizes": args.image_sizes}, "jax", timeout=args.timeout)
    if args.env:
        report["env"] = [run_worker({"kind": "env", **common}, b, timeout=300) for b in args.backends]
    if args.max_batch:
        report["max_batch"] = max_batch_search(args, peak)
        for r in report["max_batch"]:
            if "error" not in r:
                print(f"{r['variant']} remat={r['remat']}: {r['bytes_per_image'] / 2**20:.0f} MiB/image + "
                      f"{r['fixed_bytes'] / 2**20:.0f} MiB -> max batch {r['max_batch']} in "
                      f"{r['budget_bytes'] / 2**30:.1f} GiB")
    else:
        report["results"] = _measure(args, common, peak, sources)
    report["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
