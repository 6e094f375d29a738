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
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BACKENDS = ("jax", "tensorflow", "torch")
MODES = ("predict", "call", "train", "step")

# name: (patch_size, hidden_size, mlp_dim, num_heads, num_layers, resnet); as keras_vit.variants
_R50 = {"num_layers": (3, 4, 9), "width_factor": 1}
ARCHS = {
    "tiny": (8, 32, 64, 2, 2, None),
    "ViT_Ti16": (16, 192, 768, 3, 12, None),
    "ViT_S16": (16, 384, 1536, 6, 12, None),
    "ViT_S32": (32, 384, 1536, 6, 12, None),
    "ViT_B8": (8, 768, 3072, 12, 12, None),
    "ViT_B16": (16, 768, 3072, 12, 12, None),
    "ViT_B32": (32, 768, 3072, 12, 12, None),
    "ViT_L16": (16, 1024, 4096, 16, 24, None),
    "ViT_L32": (32, 1024, 4096, 16, 24, None),
    "ViT_H14": (14, 1280, 5120, 16, 32, None),
    "R26_ViT_S32": (1, 384, 1536, 6, 12, {"num_layers": (2, 2, 2, 2), "width_factor": 1}),
    "R26_ViT_B32": (1, 768, 3072, 12, 12, {"num_layers": (2, 2, 2, 2), "width_factor": 1}),
    "R50_ViT_B16": (1, 768, 3072, 12, 12, _R50),
    "R50_ViT_L32": (1, 1024, 4096, 16, 24, {"num_layers": (3, 4, 6, 3), "width_factor": 1}),
}


def arch_config(variant, image_size, classes=1000):
    """Builder arguments of `variant` at `image_size` (a dict for `keras_vit.VisionTransformer`)."""
    if variant not in ARCHS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(ARCHS)}")
    patch, dim, mlp, heads, depth, resnet = ARCHS[variant]
    return dict(image_size=int(image_size), patch_size=patch, hidden_size=dim, mlp_dim=mlp, num_heads=heads,
                num_layers=depth, classes=classes, resnet=None if resnet is None else dict(resnet))


# --------------------------------------------------------------------------------------------
# FLOPs, from the configuration alone (a pure function; 1 multiply-add = 2 FLOPs; matmuls and
# convolutions only: norms, softmax, GELU and adds are O(T * D) and left out, as is customary)
# --------------------------------------------------------------------------------------------
def _resnet_macs(h, w, num_layers, width_factor=1):
    """MACs of the BiT-style stem (StdConv 7x7/2, max-pool 3x3/2, bottleneck stages) and its output."""
    width = 64 * width_factor
    h, w = -(-h // 2), -(-w // 2)
    macs = h * w * 7 * 7 * 3 * width
    h, w = -(-h // 2), -(-w // 2)
    cin = width
    for i, count in enumerate(num_layers):
        f = width * 2**i
        for j in range(count):
            s = 2 if (i > 0 and j == 0) else 1
            ho, wo = -(-h // s), -(-w // s)
            macs += h * w * cin * f  # conv1 1x1 at the input resolution
            macs += ho * wo * 9 * f * f  # conv2 3x3, stride s
            macs += ho * wo * f * 4 * f  # conv3 1x1
            if s != 1 or cin != 4 * f:
                macs += ho * wo * cin * 4 * f  # projection
            h, w, cin = ho, wo, 4 * f
    return macs, (h, w, cin)


def model_flops(image_size=224, patch_size=16, hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12,
                classes=1000, classifier="token", representation_size=None, resnet=None, **_):
    """Forward FLOPs per image of a ViT configuration, by component (dict; "total" is the sum).

    Per encoder block with T tokens of width D and MLP width M: q/k/v projections 3 T D^2, attention
    logits T^2 D, attention-weighted values T^2 D, output projection T D^2, MLP 2 T D M (MACs).
    """
    h, w = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    c, flops = 3, {}
    if resnet:
        macs, (h, w, c) = _resnet_macs(h, w, tuple(resnet["num_layers"]), resnet.get("width_factor", 1))
        flops["resnet"] = 2 * macs
    n = (h // patch_size) * (w // patch_size)
    t = n + (1 if classifier == "token" else 0)
    d, m = hidden_size, mlp_dim
    flops["patch_embedding"] = 2 * n * patch_size * patch_size * c * d
    flops["qkv_projection"] = 2 * num_layers * 3 * t * d * d
    flops["attention"] = 2 * num_layers * 2 * t * t * d
    flops["out_projection"] = 2 * num_layers * t * d * d
    flops["mlp"] = 2 * num_layers * 2 * t * d * m
    width = d
    if representation_size:
        flops["pre_logits"] = 2 * d * representation_size
        width = representation_size
    flops["head"] = 2 * width * classes
    flops["total"] = sum(flops.values())
    return flops


def train_flops(forward_flops):
    """Training-step FLOPs: forward + backward (2x forward: gradients of inputs and of weights)."""
    return 3 * forward_flops


# --------------------------------------------------------------------------------------------
# machine: matmul peak and memory
# --------------------------------------------------------------------------------------------
def matmul_peak(n=2048, repeats=7, libraries=("numpy", "torch")):
    """Measured float32 (n x n) @ (n x n) rate in GFLOP/s, per library, best of `repeats` after 2 warm-ups.

    `gflops` is the best library's: the machine's float32 matmul peak. jax (XLA:CPU) and tensorflow
    (oneDNN or Eigen) are measured when listed and importable: how fast each backend's own matmul
    is bounds what it can reach.
    """
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    clock = CLOCK["fn"]

    def best(fn):
        fn(), fn()
        times = []
        for _ in range(repeats):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return 2 * n**3 / min(times) / 1e9

    rates = {}
    gpu = {}
    try:
        import torch

        if torch.cuda.is_available():
            for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
                m = 8192
                ga = torch.randn(m, m, device="cuda", dtype=dtype)
                gb = torch.randn(m, m, device="cuda", dtype=dtype)
                torch.backends.cuda.matmul.allow_tf32 = False

                def run():
                    for _ in range(10):
                        ga @ gb
                    torch.cuda.synchronize()

                run()
                t0 = time.perf_counter()
                run()
                gpu[f"cuda_{name}"] = 10 * 2 * m**3 / (time.perf_counter() - t0) / 1e9
                del ga, gb
    except ImportError:
        pass
    for lib in libraries:
        try:
            if lib == "numpy":
                rates[lib] = best(lambda: a @ b)
            elif lib == "torch":
                import torch

                ta, tb = torch.from_numpy(a), torch.from_numpy(b)
                rates[lib] = best(lambda: ta @ tb)
            elif lib == "jax":
                import jax

                cpu = jax.devices("cpu")[0]  # the CPU's peak, also where a GPU is the default device
                ja, jb = jax.device_put(a, cpu), jax.device_put(b, cpu)
                mm = jax.jit(lambda x, y: x @ y)
                rates[lib] = best(lambda: mm(ja, jb).block_until_ready())
            elif lib == "tensorflow":
                import tensorflow as tf

                with tf.device("/CPU:0"):
                    fa, fb = tf.constant(a), tf.constant(b)
                    rates[lib] = best(lambda: tf.linalg.matmul(fa, fb).numpy())
                    xla = tf.function(lambda x, y: tf.linalg.matmul(x, y), jit_compile=True)
                    rates["tensorflow_xla"] = best(lambda: xla(fa, fb).numpy())
        except ImportError:
            pass
    return {"gflops": max(rates.values()), "by_library": rates, "n": n, "gpu_gflops": gpu}


def env_worker(spec):
    """Devices and whether the fused (flash) attention kernel runs, on this process's backend."""
    import keras

    backend = keras.backend.backend()
    out = {"backend": backend, "keras": keras.__version__}
    q = keras.random.normal((2, 197, 12, 64), dtype="bfloat16")
    try:
        keras.ops.dot_product_attention(q, q, q, flash_attention=True)
        out["flash_attention"] = True
    except Exception as e:  # noqa: BLE001
        out["flash_attention"] = f"no: {type(e).__name__}: {str(e)[:200]}"
    if backend == "jax":
        import jax

        out["devices"] = [str(d) for d in jax.devices()]
        out["jax"] = jax.__version__
    elif backend == "torch":
        import torch

        out["devices"] = [torch.cuda.get_device_name(0)] if torch.cuda.is_available() else ["cpu"]
        out["torch"] = torch.__version__
    print(json.dumps(out), flush=True)
    return out


def flops_worker(spec):
    """`model_flops` against XLA's own count (cost analysis of the lowered JAX forward, batch 1).

    XLA also counts elementwise operations, so its figure is a little (< 1%) higher.
    """
    import jax
    import keras

    sys.path.insert(0, ROOT)
    import keras_vit

    out = []
    for variant in spec["variants"]:
        for size in spec["image_sizes"]:
            config = arch_config(variant, size)
            model = keras_vit.VisionTransformer(**config, classifier_activation=None)
            tv = [w.value for w in model.trainable_variables]
            ntv = [w.value for w in model.non_trainable_variables]
            x = jax.ShapeDtypeStruct((1, size, size, 3), "float32")
            lowered = jax.jit(lambda tv, ntv, x: model.stateless_call(tv, ntv, x, training=False)[0]).lower(
                tv, ntv, x)
            cost = lowered.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            mine = model_flops(**config)["total"]
            out.append({"variant": variant, "image_size": size, "model_flops": mine, "xla_flops": cost["flops"],
                        "ratio": cost["flops"] / mine})
            print(json.dumps(out[-1]), flush=True)
            keras.backend.clear_session()
    return out


def peak_worker(spec):
    return matmul_peak(libraries=tuple(spec["libraries"]))


class PeakRSS:
    """Samples this process's resident set size in a thread; `.peak` is the maximum seen (bytes)."""

    def __init__(self, interval=0.002):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def _rss(self):
        try:
            import psutil

            return psutil.Process().memory_info().rss
        except ImportError:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(self.interval)

    def __enter__(self):
        self.start = self._rss()
        self.peak = self.start
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


CLOCK = {"fn": time.perf_counter}


def time_calls(fn, warmup, repeats):
    """Runs `fn` `warmup` times untimed, then `repeats` times timed; returns seconds per call."""
    for _ in range(warmup):
        fn()
    clock = CLOCK["fn"]
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def summarise(times, batch):
    med = statistics.median(times)
    return {"seconds_median": med, "seconds_min": min(times), "seconds_max": max(times), "repeats": len(times),
            "images_per_s": batch / med, "images_per_s_best": batch / min(times)}


# --------------------------------------------------------------------------------------------
# workers: one process per backend (or timm); each reads a spec and writes a list of results
# --------------------------------------------------------------------------------------------
def _gpu_memory(backend):
    """(reset, read) callables for the device allocator's peak in bytes, or None on CPU."""
    try:
        if backend == "torch":
            import torch

            if torch.cuda.is_available():
                return torch.cuda.reset_peak_memory_stats, torch.cuda.max_memory_allocated
        elif backend == "jax":
            import jax

            dev = jax.devices()[0]
            if dev.platform == "gpu" and dev.memory_stats():
                return (lambda: None), (lambda: dev.memory_stats().get("peak_bytes_in_use"))
        elif backend == "tensorflow":
            import tensorflow as tf

            if tf.config.list_physical_devices("GPU"):
                return (lambda: tf.config.experimental.reset_memory_stats("GPU:0"),
                        lambda: tf.config.experimental.get_memory_info("GPU:0")["peak"])
    except Exception:  # noqa: BLE001 - memory stats are best effort
        pass
    return None


def _measure(case, fn, warmup, repeats, batch, gpu_mem):
    if gpu_mem:
        gpu_mem[0]()
    with PeakRSS() as rss:
        times = time_calls(fn, warmup, repeats)
    out = {**case, **summarise(times, batch), "rss_start_mb": rss.start / 2**20, "rss_peak_mb": rss.peak / 2**20}
    if gpu_mem:
        out["gpu_peak_mb"] = gpu_mem[1]() / 2**20
    return out


def _inputs(batch, image_size, classes, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, classes, (batch,)).astype("int32")
    return x, y


def keras_worker(spec):
    """Measures keras-vit on the backend of this process (KERAS_BACKEND) for every case of `spec`.

    With `spec["paired"]`, timm's model of the same case is built in this process after keras-vit's
    memory was read, and the timed calls alternate between the two (A B B A ...), so both see the
    same machine load; `ratio_to_timm` is then the median of the per-pair ratios.
    """
    import gc

    import keras

    sys.path.insert(0, spec.get("source") or ROOT)
    import keras_vit

    backend = keras.backend.backend()
    label = "keras-vit" + (f"[{spec['source_name']}]" if spec.get("source_name") else "")
    if spec.get("torch_threads") and (backend == "torch" or spec.get("paired")):
        with contextlib.suppress(ImportError):
            import torch

            torch.set_num_threads(spec["torch_threads"])
    results = []
    for case in spec["cases"]:
        keras.config.set_dtype_policy(case["dtype"])
        keras.utils.set_random_seed(0)
        config = arch_config(case["variant"], case["image_size"], case.get("classes", 1000))
        kwargs = {"remat": True} if case.get("remat") else {}
        batch = case["batch"]
        x, y = _inputs(batch, case["image_size"], config["classes"])
        gpu_mem = _gpu_memory(backend)
        base = {"backend": backend, "library": label, **case}
        model = timm_fn = None
        try:
            model = keras_vit.VisionTransformer(**config, classifier_activation=None, **kwargs)
            if case["mode"] == "predict":
                jit = _jit_value(case["jit"])
                if jit is not None:
                    model.jit_compile = jit
                base["jit_compile"] = bool(model.jit_compile)
                fn = lambda: model.predict_on_batch(x)  # noqa: E731
            elif case["mode"] == "call":
                fn, base["jit_compile"] = _compiled_call(model, x, backend, case)
            elif case["mode"] == "step":
                fn, base["jit_compile"] = _jax_step(model, x, y)
            else:
                jit = _jit_value(case["jit"])
                jit = _default_jit(keras_vit) if jit is None else jit
                if case.get("recipe") == "pretrain":  # the recipe's defaults, with no gradient accumulation
                    from keras_vit.recipes import compile_for_pretraining

                    compile_for_pretraining(model, total_steps=10**6, batch_size=batch, jit_compile=jit)
                else:
                    model.compile(
                        optimizer=keras.optimizers.AdamW(1e-4),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        jit_compile=jit,
                    )
                base["jit_compile"] = bool(model.jit_compile)
                fn = lambda: model.train_on_batch(x, y)  # noqa: E731
            paired = spec.get("paired") and config["resnet"] is None
            if not paired:
                results.append(_measure(base, fn, spec["warmup"], spec["repeats"], batch, gpu_mem))
            else:
                # keras-vit alone first: its warm-up (compilation) and its memory
                with PeakRSS() as rss:
                    time_calls(fn, spec["warmup"], 0)
                timm_case = {**case, "mode": "train" if case["mode"] in ("train", "step") else "call"}
                timm_fn, timm_info = _timm_fn(timm_case, config)
                with PeakRSS() as timm_rss:
                    time_calls(timm_fn, spec["warmup"], 0)
                tk, tt = [], []
                for r in range(spec["repeats"]):
                    order = ((fn, tk), (timm_fn, tt)) if r % 2 == 0 else ((timm_fn, tt), (fn, tk))
                    for f, out in order:
                        time.sleep(0.2)  # let the other framework's spinning pool threads go idle
                        out += time_calls(f, 0, 1)
                ratios = [t / k for k, t in zip(tk, tt)]
                results.append({**base, **summarise(tk, batch), "rss_start_mb": rss.start / 2**20,
                                "rss_peak_mb": rss.peak / 2**20, "ratio_to_timm": statistics.median(ratios),
                                "ratio_to_timm_pairs": ratios, "paired": True})
                results.append({**base, **timm_case, **timm_info, **summarise(tt, batch), "jit_compile": False,
                                "rss_delta_mb": (timm_rss.peak - timm_rss.start) / 2**20, "paired": True,
                                "paired_with": f"{backend}/{case['mode']}"})
                print(json.dumps(_short(results[-1])), flush=True)
                results[-1], results[-2] = results[-2], results[-1]
        except Exception as e:  # noqa: BLE001 - report, keep going (OOM at a large batch, say)
            results.append({**base, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        del model, timm_fn
        keras.backend.clear_session()
        gc.collect()
        print(json.dumps(_short(results[-1] if "paired_with" not in results[-1] else results[-2])), flush=True)
    return results


def _default_jit(keras_vit):
    """The package's own training default (`jit_compile_default`), or Keras' "auto" in a tree without it."""
    fn = getattr(keras_vit, "jit_compile_default", None)
    return fn(training=True) if fn else "auto"


def _jax_train_step(model):
    """A pure JAX training step (forward, backward, AdamW) of `model`, and its initial state.

    Returns (step, state): `step(tv, ntv, ov, x, y) -> (loss, tv, ntv, ov)` over trainable,
    non-trainable and optimizer values; `state` is [tv, ntv, ov] from the model and a built AdamW.
    """
    import jax
    import keras

    opt = keras.optimizers.AdamW(1e-4)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step(tv, ntv, ov, x, y):
        def loss(tv):
            logits, ntv2 = model.stateless_call(tv, ntv, x, training=True)
            return loss_fn(y, logits), ntv2

        (value, ntv2), grads = jax.value_and_grad(loss, has_aux=True)(tv)
        tv2, ov2 = opt.stateless_apply(ov, grads, tv)
        return value, tv2, ntv2, ov2

    state = [[v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in opt.variables]]
    return step, state


def _jax_step(model, x, y):
    """A jitted JAX training step (forward, backward, AdamW) on donated state; returns (fn, True)."""
    import jax
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError("mode 'step' is the JAX backend's compiled training step; use 'train' elsewhere")
    step, state = _jax_train_step(model)
    compiled = jax.jit(step, donate_argnums=(0, 1, 2))
    xj, yj = jax.device_put(x), jax.device_put(y)

    def fn():
        value, *state[:] = compiled(*state, xj, yj)
        return float(value)

    return fn, True


def _jit_value(jit):
    return {"auto": None, "on": True, "off": False}[jit]


def _compiled_call(model, x, backend, case):
    if backend == "jax":
        import jax

        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]
        fwd = jax.jit(lambda tv, ntv, x: model.stateless_call(tv, ntv, x, training=False)[0])
        xj = jax.device_put(x)
        return (lambda: fwd(tv, ntv, xj).block_until_ready()), True
    if backend == "tensorflow":
        import tensorflow as tf

        jit = _jit_value(case["jit"])
        jit = True if jit is None else jit  # a compiled call: XLA unless told otherwise
        fwd = tf.function(lambda x: model(x, training=False), jit_compile=jit)
        xt = tf.constant(x)
        return (lambda: fwd(xt).numpy()), jit
    import torch

    xt = torch.from_numpy(x)
    if torch.cuda.is_available():
        xt = xt.cuda()
    fwd = model
    if case.get("torch_compile"):
        fwd = torch.compile(model)

    def run():
        with torch.no_grad():
            out = fwd(xt, training=False)
        if out.is_cuda:
            torch.cuda.synchronize()
        return out

    return run, bool(case.get("torch_compile"))


def _import_timm():
    """Imports timm; without torchvision installed, stands in an empty `torchvision` module.

    timm imports torchvision at module level in a few norm helpers that a ViT never uses; an empty
    stand-in avoids installing torchvision (whose wheels pin another torch build).
    """
    import importlib.abc
    import importlib.machinery
    import types

    try:
        import torchvision  # noqa: F401
    except ImportError:
        class _Meta(type):
            def __getattr__(cls, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return f"{cls.__name__}.{name}"

        class _Stub(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return _Meta(name, (), {"__init__": lambda self, *a, **k: None})

        class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, fullname, path, target=None):
                if fullname == "torchvision" or fullname.startswith("torchvision."):
                    return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
                return None

            def create_module(self, spec):
                return _Stub(spec.name)

            def exec_module(self, module):
                module.__path__ = []

        sys.meta_path.insert(0, _Finder())
    import timm

    return timm


def timm_model(config):
    """timm's VisionTransformer of the same configuration (tanh-GELU, LayerNorm eps 1e-6, qkv bias)."""
    import functools

    import torch

    _import_timm()
    from timm.models.vision_transformer import VisionTransformer

    if config["resnet"]:
        raise ValueError("no timm counterpart is built for hybrids here")
    return VisionTransformer(
        img_size=config["image_size"], patch_size=config["patch_size"], embed_dim=config["hidden_size"],
        depth=config["num_layers"], num_heads=config["num_heads"], mlp_ratio=config["mlp_dim"] / config["hidden_size"],
        num_classes=config["classes"], qkv_bias=True, class_token=True, global_pool="token",
        act_layer=functools.partial(torch.nn.GELU, approximate="tanh"),
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
    )


def _timm_fn(case, config):
    """A callable running timm's model for `case` (forward, or a training step), and its info."""
    import torch

    timm = _import_timm()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    model = timm_model(config).to(device)
    x, y = _inputs(case["batch"], case["image_size"], config["classes"])
    xt = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().to(device)
    yt = torch.from_numpy(y).long().to(device)
    bf16 = case["dtype"] == "mixed_bfloat16"
    autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fwd = torch.compile(model) if case.get("torch_compile") else model
    if case["mode"] == "train":
        model.train()
        pretrain = case.get("recipe") == "pretrain"  # as compile_for_pretraining: decay 0.1, clipping at norm 1
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1 if pretrain else 0.004)

        def fn():
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = torch.nn.functional.cross_entropy(fwd(xt), yt)
            loss.backward()
            if pretrain:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sync()
            return loss.item()
    else:
        model.eval()

        def fn():
            with torch.inference_mode(), autocast():
                out = fwd(xt)
            sync()
            return out

    return fn, {"library": f"timm {timm.__version__}", "backend": "torch"}


def timm_worker(spec):
    import torch

    if spec.get("torch_threads"):
        torch.set_num_threads(spec["torch_threads"])
    gpu_mem = _gpu_memory("torch")
    results = []
    for case in spec["cases"]:
        base = {"backend": "torch", "library": "timm", **case, "jit_compile": False}
        try:
            config = arch_config(case["variant"], case["image_size"], case.get("classes", 1000))
            fn, info = _timm_fn(case, config)
            base.update(info)
            results.append(_measure(base, fn, spec["warmup"], spec["repeats"], case["batch"], gpu_mem))
        except Exception as e:  # noqa: BLE001
            results.append({**base, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(json.dumps(_short(results[-1])), flush=True)
    return results


def jax_memory_worker(spec):
    """Largest trainable batch on JAX from XLA's compiled memory analysis of the training step.

    The step (forward, backward, AdamW) is lowered and compiled at a few batch sizes, never run;
    the argument + temporary + output bytes XLA plans for it are fitted linearly in the batch and
    solved for the memory budget. Remat (`remat=True`) is the builder's per-block rematerialisation.
    """
    import jax
    import keras

    sys.path.insert(0, ROOT)
    import keras_vit

    results = []
    for case in spec["cases"]:
        try:
            results.append(_jax_memory_case(case, jax, keras, keras_vit))
        except Exception as e:  # noqa: BLE001 - report, keep going
            results.append({**case, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        keras.backend.clear_session()
    return results


def _jax_memory_case(case, jax, keras, keras_vit):
    keras.config.set_dtype_policy(case["dtype"])
    config = arch_config(case["variant"], case["image_size"])
    kwargs = {"remat": True} if case["remat"] else {}
    model = keras_vit.VisionTransformer(**config, classifier_activation=None, **kwargs)
    step, (tv, ntv, ov) = _jax_train_step(model)
    points = []
    for batch in case["batches"]:
        x = jax.ShapeDtypeStruct((batch, case["image_size"], case["image_size"], 3), "float32")
        y = jax.ShapeDtypeStruct((batch,), "int32")
        t0 = time.perf_counter()
        compiled = jax.jit(step, donate_argnums=(0, 1, 2)).lower(tv, ntv, ov, x, y).compile()
        mem = compiled.memory_analysis()
        total = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
                 - mem.alias_size_in_bytes)
        points.append({"batch": batch, "bytes": int(total), "temp_bytes": int(mem.temp_size_in_bytes),
                       "argument_bytes": int(mem.argument_size_in_bytes),
                       "compile_s": time.perf_counter() - t0})
        print(json.dumps({"variant": case["variant"], "remat": case["remat"], **points[-1]}), flush=True)
    bs = np.array([p["batch"] for p in points], float)
    by = np.array([p["bytes"] for p in points], float)
    slope, intercept = np.polyfit(bs, by, 1)
    budget = case["budget_bytes"]
    return {
        "library": "keras-vit", "backend": "jax", "variant": case["variant"], "image_size": case["image_size"],
        "dtype": case["dtype"], "remat": case["remat"], "points": points,
        "bytes_per_image": slope, "fixed_bytes": intercept, "budget_bytes": budget,
        "max_batch": int(max(0, (budget - intercept) // slope)),
        "device": str(jax.devices()[0]),
    }


def _short(r):
    keys = ("library", "backend", "variant", "image_size", "batch", "dtype", "mode", "jit_compile", "remat",
            "images_per_s", "rss_peak_mb", "gpu_peak_mb", "error")
    return {k: (round(r[k], 3) if isinstance(r.get(k), float) else r[k]) for k in keys if k in r}


def worker_main(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    threads = spec.get("threads")
    if threads and hasattr(os, "sched_setaffinity") and threads < len(os.sched_getaffinity(0)):
        # before any framework starts its pools: XLA:CPU sizes its pool from the affinity mask and
        # has no flag that caps it (intra_op_parallelism_threads leaves the thunk executor's pool)
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
    if spec.get("clock") == "cpu":
        CLOCK["fn"] = time.process_time
    kind = spec["kind"]
    fn = {"keras": keras_worker, "timm": timm_worker, "jax_memory": jax_memory_worker, "peak": peak_worker,
          "env": env_worker, "flops": flops_worker}[kind]
    results = fn(spec)
    _write_json(out_path, results)


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------
def _write_json(path, obj):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, default=float)
    os.replace(tmp, path)


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
        if ARCHS[c["variant"]][5] is not None:
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


def main(argv=None):
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
    p.add_argument("--tiny", action="store_true", help="a seconds-long smoke run on the tiny config")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    p.add_argument("--out", default=None, help="JSON output file")
    p.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(*args.worker)

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
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    common = {"warmup": args.warmup, "repeats": args.repeats, "torch_threads": args.threads, "clock": args.clock,
              "threads": args.threads}
    peak = run_worker({"kind": "peak", "libraries": ["numpy", "torch", *args.backends], **common}, "jax",
                      timeout=600)
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
                for case in bcases:  # one process per case: its peak memory is its own
                    for name, src in [(None, None)] + sources:
                        results += run_worker({"kind": "keras", "cases": [case], **common, "source": src,
                                               "source_name": name, "paired": have_timm and args.timm == "paired"},
                                              backend, timeout=args.timeout)
            rounds.append(results)
        report["results"] = merge_rounds(rounds)
        gpu = peak.get("gpu_gflops") or {}
        peaks = ({"float32": gpu.get("cuda_float32"), "mixed_bfloat16": gpu.get("cuda_bfloat16")} if gpu
                 else peak["gflops"])
        add_derived(report["results"], peaks)
        print()
        print(table(report["results"]))
    report["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.out:
        _write_json(args.out, report)
        print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
