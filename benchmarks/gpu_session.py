"""A GPU session's parts and their run (benchmarks/gpu.py is the command): the presets, `plan` (the parts,
most telling first), `run_part` (one part in its own process, gpu_workers.py), `derive` (each row's ratio to
its timm peer, each lever's to its base row) and `session` (install, then every part not done yet within the
time budget, the JSON rewritten after each). The standard library only: Keras may not be installed yet."""

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from gpu_wheels import install_wheels, installed, missing
from gpu_workers import dump

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BACKENDS = ("jax", "torch", "tensorflow")
PEERS = ("timm", "timm-compile", "keras-hub")
RECIPES = ("pretraining", "finetuning")
LEVERS = {"XLA attention": {"attention_implementation": "standard"}, "steps_per_execution=4": {"steps_per_execution": 4},
          "float32 feed": {"input_dtype": "float32"}, "remat": {"remat": True}}
FULL = dict(cases=[["ViT_B16", 256], ["ViT_L16", 128]], image_size=224, steps=20, warmup=3, infer_batch=256,
            latency_repeats=30, budget=540)
QUICK = dict(cases=[["tiny", 8]], image_size=32, steps=3, warmup=2, infer_batch=8, latency_repeats=3, budget=900)
# the Keras dtype policies a session runs in (--policy); VERSIONS: the distributions a session records
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16", "bfloat16", "float16")
VERSIONS = ("keras", "jax", "jaxlib", "torch", "timm", "keras-hub", "tensorflow", "numpy")


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
                  versions={d: installed(d) for d in VERSIONS},
                  install=prior.get("install", []) + install, rate=prior.get("rate"), parts={}, results=[])
    parts = [dict(key="rate", kind="rate", backend="torch", needs=["torch"])]
    parts += plan(preset, backends, peers, recipes, levers)
    for n, part in enumerate(parts, 1):
        key = part["key"]
        if prior.get("parts", {}).get(key, {}).get("status") == "done":
            record["parts"][key] = prior["parts"][key]
            record["results"] += [r for r in prior["results"] if r.get("part") == key]
            continue
        reason, status, rows, start = missing(part["needs"], args.wheels), None, [], time.monotonic()
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
