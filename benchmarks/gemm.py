"""GFLOP/s of the matrix products inside a ViT training step, per library: what bounds each backend.

A script, not a test. A ViT spends most of its time in a few matmul shapes; this times each of
them, forward (x W), backward to the input (dy W^T) and to the weights (x^T dy), plus the
attention's batched q k^T, in every installed library (torch, jax, tensorflow eager, tensorflow
XLA), so a backend's distance to the others on the model can be traced to its matmul library.

    .venv/bin/python benchmarks/gemm.py                          # ViT-S/16, batch 32, 224 px
    .venv/bin/python benchmarks/gemm.py --variant ViT_B16 --batch 8 --out gemm.json
"""

import argparse
import functools
import os
import sys
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flops import ARCHS  # noqa: E402

from keras_vit.fileio import write_json  # noqa: E402


def shapes(variant, batch, image_size):
    """(name, a_shape, b_shape, form) of the step's products; form: nn (a @ b), nt (a @ b^T), tn (a^T @ b),
    bnt (batched a @ b^T over the leading axis)."""
    arch = ARCHS[variant]
    patch, d, m, heads = arch["patch_size"], arch["hidden_size"], arch["mlp_dim"], arch["num_heads"]
    if arch["resnet"]:
        raise ValueError(f"{variant}: hybrid models have convolutions; pick a plain ViT")
    t = (image_size // patch) ** 2 + 1
    rows = batch * t
    return [
        ("qkv / out projection  x W", (rows, d), (d, d), "nn"),
        ("MLP in  x W", (rows, d), (d, m), "nn"),
        ("MLP out  x W", (rows, m), (m, d), "nn"),
        ("MLP in, grad input  dy W^T", (rows, m), (d, m), "nt"),
        ("MLP out, grad input  dy W^T", (rows, d), (m, d), "nt"),
        ("projection, grad weight  x^T dy", (rows, d), (rows, d), "tn"),
        ("MLP in, grad weight  x^T dy", (rows, d), (rows, m), "tn"),
        ("attention logits  q k^T", (batch * heads, t, d // heads), (batch * heads, t, d // heads), "bnt"),
    ]


def flops(a, b, form):
    if form == "nn":
        return 2 * a[0] * a[1] * b[1]
    if form == "nt":
        return 2 * a[0] * a[1] * b[0]
    if form == "tn":
        return 2 * a[1] * a[0] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[1]


def products():
    """{library: fn(form) -> callable(a, b)} for the libraries that import."""
    libs = {}
    try:
        import torch

        def torch_fn(form):
            f = {"nn": lambda a, b: a @ b, "nt": lambda a, b: a @ b.T, "tn": lambda a, b: a.T @ b,
                 "bnt": lambda a, b: a @ b.transpose(-1, -2)}[form]

            def run(a, b):
                with torch.no_grad():
                    return f(a, b)
            return run

        libs["torch"] = (torch_fn, torch.from_numpy, lambda r: r)
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp

        def jax_fn(form):
            return jax.jit({"nn": lambda a, b: a @ b, "nt": lambda a, b: a @ b.T, "tn": lambda a, b: a.T @ b,
                            "bnt": lambda a, b: a @ jnp.swapaxes(b, -1, -2)}[form])

        libs["jax"] = (jax_fn, jnp.asarray, lambda r: r.block_until_ready())
    except ImportError:
        pass
    try:
        import tensorflow as tf

        def tf_fn(xla):
            def make(form):
                flags = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "bnt": (False, True)}[form]
                f = functools.partial(tf.matmul, transpose_a=flags[0], transpose_b=flags[1])
                return tf.function(f, jit_compile=True, autograph=False) if xla else f
            return make

        libs["tensorflow"] = (tf_fn(False), tf.constant, lambda r: r.numpy())
        libs["tensorflow_xla"] = (tf_fn(True), tf.constant, lambda r: r.numpy())
    except ImportError:
        pass
    return libs


def rate(fn, a, b, sync, n, flop):
    for _ in range(2):
        sync(fn(a, b))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sync(fn(a, b))
        times.append(time.perf_counter() - t0)
    return flop / float(np.median(times)) / 1e9


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", default="ViT_S16", choices=[v for v in ARCHS if ARCHS[v]["resnet"] is None])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=None, help="JSON output file")
    args = p.parse_args(argv)
    for name in ("batch", "image_size", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    patch = ARCHS[args.variant]["patch_size"]
    if args.image_size % patch:
        p.error(f"--image-size must be a multiple of {args.variant}'s patch size {patch}, got {args.image_size}")
    rng = np.random.default_rng(0)
    libs = products()
    rows = []
    for name, sa, sb, form in shapes(args.variant, args.batch, args.image_size):
        a = rng.standard_normal(sa, dtype=np.float32)
        b = rng.standard_normal(sb, dtype=np.float32)
        flop = flops(sa, sb, form)
        row = {"product": name, "a": list(sa), "b": list(sb), "form": form, "gflop": flop / 1e9}
        for lib, (make, convert, sync) in libs.items():
            row[lib] = rate(make(form), convert(a), convert(b), sync, args.repeats, flop)
        rows.append(row)
        print(f"{name:34s} " + "  ".join(f"{lib} {row[lib]:5.0f}" for lib in libs) + "  GFLOP/s", flush=True)
    if args.out:
        write_json(args.out, {"variant": args.variant, "batch": args.batch, "image_size": args.image_size,
                                     "rows": rows})


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
