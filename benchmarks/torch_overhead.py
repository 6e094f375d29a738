#!/usr/bin/env python
"""Where the torch backend's time goes against timm eager, on this CPU, per model and batch: the eager
latency of `model(x, training=False)` under `torch.no_grad()` against timm's same architecture in the same
process (calls alternating, medians), the torch ops each forward dispatches (torch's profiler: top-level aten
ops) against timm's, and the host time of a forward outside those ops (Python: Keras' layer calls, timm's
modules), in all and per layer call.

    python benchmarks/torch_overhead.py --models ViT_Ti16 ViT_S16 ViT_B16 --batches 1 8

Random weights (speed does not depend on them), 224 px, tanh GELU in both (timm's built as keras-vit's).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from timing import alternate  # noqa: E402  (numpy and the standard library only)

# the Keras backend it runs on (set before Keras is imported)
BACKEND = "torch"


def profiled(fn):
    """(top-level aten ops one call of `fn` dispatches, their CPU milliseconds, the call's wall milliseconds)
    under torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = (time.perf_counter() - start) * 1e3
    top = [e for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return len(top), sum(e.cpu_time_total for e in top) / 1e3, wall


def layer_calls(fn):
    """How many Keras layer calls one call of `fn` makes."""
    import keras

    count, call = [0], keras.layers.Layer.__call__

    def counted(self, *args, **kwargs):
        count[0] += 1
        return call(self, *args, **kwargs)

    keras.layers.Layer.__call__ = counted
    try:
        fn()
    finally:
        keras.layers.Layer.__call__ = call
    return count[0]


def module_calls(model, fn):
    """How many torch module forwards one call of `fn` makes on `model` (timm's)."""
    count = [0]
    hooks = [m.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1)) for m in model.modules()]
    try:
        fn()
    finally:
        for hook in hooks:
            hook.remove()
    return count[0]


def measure(name, batch, repeats, warmup=3):
    """The row of `name` (a variant) at `batch`: latencies, ops, host time of keras-vit and timm."""
    import numpy as np
    import torch

    import keras_vit
    from flops import arch_config
    from timm_peer import timm_model

    config = arch_config(name, 224)
    torch.manual_seed(0)
    ours = keras_vit.VisionTransformer(**{k: v for k, v in config.items() if k != "resnet"})
    peer = timm_model(config).eval()
    x = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    x_ours = torch.from_numpy(x)
    x_peer = x_ours.permute(0, 3, 1, 2).contiguous()

    def run_ours():
        with torch.no_grad():
            return ours(x_ours, training=False)

    def run_peer():
        with torch.no_grad():
            return peer(x_peer)

    medians = alternate({"keras-vit": run_ours, "timm": run_peer}, warmup, repeats)
    row = {"model": name, "batch": batch}
    for label, fn, calls in (("keras-vit", run_ours, layer_calls(run_ours)),
                             ("timm", run_peer, module_calls(peer, run_peer))):
        ops, op_ms, wall = min((profiled(fn) for _ in range(3)), key=lambda r: r[2])
        host = max(wall - op_ms, 0.0)
        row[label] = {"median_ms": medians[label], "ops": ops, "op_ms": op_ms,
                      "host_ms": host, "calls": calls, "host_us_per_call": 1e3 * host / max(calls, 1)}
    row["x_timm"] = row["timm"]["median_ms"] / row["keras-vit"]["median_ms"]
    return row


def table(rows):
    """The rows as a Markdown table."""
    lines = ["| model | batch | keras-vit ms | timm ms | x timm | ops keras-vit / timm | host ms keras-vit / timm "
             "| layer calls / modules | host us per call keras-vit / timm |", "|" + "---|" * 9]
    for r in rows:
        a, b = r["keras-vit"], r["timm"]
        lines.append(f"| {r['model']} | {r['batch']} | {a['median_ms']:.1f} | {b['median_ms']:.1f} | "
                     f"{r['x_timm']:.2f}x | {a['ops']} / {b['ops']} | {a['host_ms']:.1f} / {b['host_ms']:.1f} | "
                     f"{a['calls']} / {b['calls']} | {a['host_us_per_call']:.0f} / {b['host_us_per_call']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["ViT_Ti16", "ViT_S16", "ViT_B16"],
                        help="variants (or 'tiny', the tests' configuration)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls of each library per case")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (1: the CPU time is the work)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = BACKEND
    import keras
    import torch

    if keras.backend.backend() != "torch":
        raise SystemExit(f"error: the torch backend is measured here; Keras runs on {keras.backend.backend()!r} "
                         "(set before this script: unset KERAS_BACKEND or set it to torch)")
    torch.set_num_threads(args.threads)
    from benchmark import machine

    rows = [measure(name, batch, args.repeats) for name in args.models for batch in args.batches]
    print(f"torch {torch.__version__}, keras {keras.__version__}, {args.threads} thread(s), {machine().get('cpu', 'CPU not named')}")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
