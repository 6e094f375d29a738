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
- the levers on JAX, ViT-B/16: XLA's attention in training (the default takes cuDNN's fused
  kernel where it runs), `steps_per_execution=4`, a float32 feed instead of uint8, remat;
- keras-hub's ViT of the same shape under the pretraining recipe, per backend.
A part whose package is missing, that fails, or that the budget does not reach is one "not run"
line and the session goes on; the JSON is rewritten after every part, so a command stopped at its
limit hands over what it finished, and `--resume` runs the rest. On a GPU the session then
rewrites the GPU tables of README.md and benchmarks/README.md from the JSON. Per row: img/s, the
ratio to each timm peer, peak device memory (the process's peak RSS on a CPU) and the model FLOP
utilisation against the bfloat16 matrix rate measured first.

Its modules: gpu_wheels.py installs, gpu_session.py plans and runs the parts (each a process of
gpu_workers.py), gpu_tables.py renders the tables; this file is the command.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from gpu_session import BACKENDS, FULL, LEVERS, PEERS, POLICIES, QUICK, RECIPES, run_part, session  # noqa: E402
from gpu_tables import RESULTS, on_gpu, results_table, update_tables  # noqa: E402
from gpu_wheels import fetch_wheels  # noqa: E402
from gpu_workers import run_script  # noqa: E402


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
        if not on_gpu(record):
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
    if not on_gpu(record):
        print("no GPU: these figures only check that the command runs; the issue's figures need a GPU; "
              "the README tables are left as they are")
    else:
        update_tables(record)
        print(f"rewrote the GPU tables of README.md and benchmarks/README.md from {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
