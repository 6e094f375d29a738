"""What a user runs, timed where ViTs are trained, with the peers in the same run (issue #18).

    .venv/bin/python benchmarks/gpu.py --out gpu.json     # on a GPU machine: the full run
    .venv/bin/python benchmarks/gpu.py --quick            # a tiny model on any machine, seconds per backend

Per case (default: ViT-B/16 at batch 256 and ViT-L/16 at batch 128, 224 px, mixed_bfloat16):
- keras-vit on every Keras backend that imports (one subprocess each): `model.fit` of
  `VisionTransformer(input_dtype="uint8")` compiled by the library's recipes
  (`compile_for_pretraining`: AdamW with clipping; `compile_for_finetuning`: SGD with momentum and
  clipping), fed uint8 batches by tf.data where TensorFlow is installed (a `keras.utils.PyDataset`
  otherwise); then inference: `model.predict` throughput at `--infer-batch` and the median latency
  of `predict_on_batch` on one image;
- keras-hub's ViT of the same shape on the same backend, compiled by the same recipes, where
  keras-hub imports (behind the same uint8 input and `Rescaling`);
- timm's ViT of the same configuration, eager and under `torch.compile`, with AdamW, gradient
  clipping at norm 1 and bfloat16 autocast, fed the same uint8 batches from host memory
  and scaled on the device.
Printed per row: img/s, the ratio to each timm peer, peak device memory (the allocator's peak on a
GPU, the process's peak RSS on a CPU) and the model FLOP utilisation against the bfloat16 matrix
rate measured at start (on a CPU: torch's bfloat16 matmul on the CPU). Only the figures of a run
on a GPU answer the issue's questions; `--quick` checks that the command runs end to end.
Warm-up: `--warmup` steps (a first `fit` call: compilation), then `--steps` timed steps in a
second `fit` call; fit returns after the device has finished, so the wall time is the work done.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from flops import arch_config, model_flops, train_flops  # noqa: E402

BACKENDS = ("jax", "tensorflow", "torch")
PEERS = ("timm", "timm-compile", "keras-hub")
RECIPES = ("pretraining", "finetuning")
FULL = dict(cases=(("ViT_B16", 256), ("ViT_L16", 128)), image_size=224, steps=30, warmup=5, infer_batch=256,
            latency_repeats=50)
QUICK = dict(cases=(("tiny", 8),), image_size=32, steps=3, warmup=2, infer_batch=8, latency_repeats=3)


def _uint8_batch(batch, size, classes, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (batch, size, size, 3)).astype("uint8"),
            rng.integers(0, classes, (batch,)).astype("int32"))


def _pipeline(x, y):
    """An endless stream of the uint8 batch (x, y): tf.data with prefetching, or a PyDataset."""
    try:
        import tensorflow as tf
    except ImportError:
        import keras

        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return 2**31 - 1

            def __getitem__(self, index):
                return x, y

        return Batches(), "PyDataset"
    return tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(tf.data.AUTOTUNE), "tf.data"


def _device_peak(backend):
    """The device allocator's peak bytes (None on a CPU) and a reset for it."""
    from workers import _gpu_memory

    mem = _gpu_memory(backend)
    return mem if mem else (lambda: None, lambda: None)


def _peak_mb(read):
    peak = read()
    if peak is not None:
        return peak / 2**20, "device"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10, "rss"


def _keras_hub_model(config, keras):
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(config["image_size"], config["image_size"], 3), patch_size=config["patch_size"],
        num_layers=config["num_layers"], num_heads=config["num_heads"], hidden_dim=config["hidden_size"],
        mlp_dim=config["mlp_dim"])
    inputs = keras.Input((config["image_size"], config["image_size"], 3), dtype="uint8")
    x = keras.layers.Rescaling(1 / 127.5, offset=-1.0, dtype="float32")(inputs)
    outputs = keras_hub.models.ViTImageClassifier(backbone, config["classes"], activation=None)(x)
    return keras.Model(inputs, outputs)


def keras_worker(spec):
    """fit and inference of keras-vit (and keras-hub) on this process's Keras backend."""
    import keras

    import keras_vit
    from keras_vit import recipes

    backend = keras.backend.backend()
    keras.mixed_precision.set_global_policy(spec["policy"])
    reset, read = _device_peak(backend)
    results = []
    for variant, batch in spec["cases"]:
        config = arch_config(variant, spec["image_size"])
        x, y = _uint8_batch(batch, spec["image_size"], config["classes"])
        data, feeder = _pipeline(x, y)
        libraries = [("keras-vit", lambda: keras_vit.VisionTransformer(**config, input_dtype="uint8",
                                                                       classifier_activation=None))]
        if "keras-hub" in spec["peers"]:
            libraries.append(("keras-hub", lambda: _keras_hub_model(config, keras)))
        for library, build in libraries:
            for recipe in spec["recipes"]:
                case = dict(library=library, backend=backend, variant=variant, batch=batch, mode=f"fit ({recipe})",
                            feeder=feeder, policy=spec["policy"])
                try:
                    keras.utils.clear_session()
                    model = build()
                    compile_recipe = getattr(recipes, f"compile_for_{recipe}")
                    compile_recipe(model, total_steps=10_000, warmup_steps=10, batch_size=batch, from_logits=True,
                                   metrics=[], steps_per_execution=spec["steps_per_execution"])
                    steps = spec["steps"] - spec["steps"] % spec["steps_per_execution"] or spec["steps_per_execution"]
                    model.fit(data, steps_per_epoch=max(spec["warmup"], spec["steps_per_execution"]), verbose=0)
                    reset()
                    start = time.perf_counter()
                    model.fit(data, steps_per_epoch=steps, verbose=0)
                    seconds = time.perf_counter() - start
                    peak, where = _peak_mb(read)
                    results.append({**case, "images_per_s": steps * batch / seconds, "peak_mb": peak,
                                    "memory": where, "steps": steps})
                    if recipe != spec["recipes"][-1]:
                        continue
                    results.extend(_inference(model, case, spec, x, reset, read))
                except ImportError as err:
                    results.append({**case, "skipped": f"{library} does not import here: {err}"})
                    break
                except Exception as err:  # noqa: BLE001 - one failed case must not lose the others
                    results.append({**case, "error": f"{type(err).__name__}: {str(err)[:300]}"})
    return results


def _inference(model, case, spec, x, reset, read):
    import numpy as np

    batch = spec["infer_batch"]
    images = np.resize(x, (batch, *x.shape[1:]))
    model.predict(images, batch_size=batch, verbose=0)
    reset()
    repeats = max(2, spec["steps"] // 2)
    stack = np.concatenate([images] * repeats)
    start = time.perf_counter()
    model.predict(stack, batch_size=batch, verbose=0)
    seconds = time.perf_counter() - start
    peak, where = _peak_mb(read)
    out = [{**case, "mode": "predict", "batch": batch, "images_per_s": len(stack) / seconds, "peak_mb": peak,
            "memory": where}]
    out.append(_latency_row(case, lambda: np.asarray(model.predict_on_batch(images[:1])), spec["latency_repeats"]))
    return out


def _latency_row(case, run_one, repeats):
    """The batch-1 latency row of `case`: `run_one()` (one image, its result on the host) once to warm up,
    then the median of `repeats` timed calls."""
    run_one()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_one()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {**case, "mode": "latency", "batch": 1, "latency_ms": 1e3 * median, "images_per_s": 1 / median}


def timm_worker(spec):
    """timm's ViT, eager and compiled: AdamW + clipping + bfloat16 autocast, uint8 batches from the host."""
    import torch

    from workers import timm_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    reset, read = _device_peak("torch")
    results = []
    for variant, batch in spec["cases"]:
        config = arch_config(variant, spec["image_size"])
        x, y = (torch.from_numpy(a) for a in _uint8_batch(batch, spec["image_size"], config["classes"]))
        if device == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        for peer in [p for p in ("timm", "timm-compile") if p in spec["peers"]]:
            case = dict(library=peer, backend="torch", variant=variant, batch=batch, mode="fit (AdamW)",
                        feeder="host uint8", policy="bf16 autocast")
            try:
                torch.manual_seed(0)
                model = timm_model(config).to(device).train()
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
                net = torch.compile(model) if peer == "timm-compile" else model

                def step():
                    images = _nchw(x.to(device, non_blocking=True))
                    with torch.autocast(device, dtype=torch.bfloat16):
                        loss = torch.nn.functional.cross_entropy(net(images), y.to(device, non_blocking=True).long())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()

                for _ in range(spec["warmup"]):
                    step()
                sync()
                reset()
                start = time.perf_counter()
                for _ in range(spec["steps"]):
                    step()
                sync()
                seconds = time.perf_counter() - start
                peak, where = _peak_mb(read)
                results.append({**case, "images_per_s": spec["steps"] * batch / seconds, "peak_mb": peak,
                                "memory": where})
                results.extend(_timm_inference(net, model, case, spec, x, device, sync))
            except Exception as err:  # noqa: BLE001
                results.append({**case, "error": f"{type(err).__name__}: {str(err)[:300]}"})
    return results


def _nchw(images):
    """uint8 NHWC on the device -> float32 NCHW in [-1, 1], as timm takes it."""
    return images.permute(0, 3, 1, 2).float().sub_(127.5).div_(127.5)


def _timm_inference(net, model, case, spec, x, device, sync):
    import torch

    model.eval()
    batch = spec["infer_batch"]
    images = x.repeat((batch + len(x) - 1) // len(x), 1, 1, 1)[:batch]

    def forward(images):
        with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16):
            return net(_nchw(images.to(device, non_blocking=True)))

    forward(images)
    sync()
    repeats = max(2, spec["steps"] // 2)
    start = time.perf_counter()
    for _ in range(repeats):
        forward(images)
    sync()
    seconds = time.perf_counter() - start
    out = [{**case, "mode": "predict", "batch": batch, "images_per_s": repeats * batch / seconds}]
    out.append(_latency_row(case, lambda: forward(images[:1]).float().cpu(), spec["latency_repeats"]))
    return out


def bf16_matrix_rate(quick):
    """The measured bfloat16 matmul rate in GFLOP/s and where: the GPU's (torch, CUDA), else the CPU's."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 8192 if device == "cuda" else (256 if quick else 2048)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(3):
        a @ b
        sync()
        start = time.perf_counter()
        for _ in range(5):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - start) / 5)
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    return {"gflops": 2 * n**3 / best / 1e9, "device": f"{device}: {name}"}


def feed_worker(spec):
    """Host milliseconds per batch of the input pipeline, float32 against uint8 images: tf.data
    resizing 256 px uint8 images to the model's size (`keras_vit.data.eval_preprocess`), batching,
    then the batch handed to this backend as a device array (what `model.fit` does per step)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_vit import data

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        def to_device(batch):
            return jax.block_until_ready(jax.device_put(batch.numpy()))
    elif backend == "torch":
        import torch

        def to_device(batch):
            return torch.as_tensor(batch.numpy(), device="cuda" if torch.cuda.is_available() else "cpu")
    else:
        def to_device(batch):
            return tf.identity(batch)

    source = np.random.default_rng(0).integers(0, 256, (64, 256, 256, 3)).astype("uint8")
    results = []
    for dtype in ("float32", "uint8"):
        ds = tf.data.Dataset.from_tensor_slices(source).repeat()
        ds = ds.map(lambda im: data.eval_preprocess(im, spec["image_size"], dtype), num_parallel_calls=1)
        batches = iter(ds.batch(spec["feed_batch"]))
        for _ in range(2):
            to_device(next(batches))
        times = []
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            to_device(next(batches))
            times.append(time.perf_counter() - start)
        results.append({"library": "keras-vit", "backend": backend, "mode": f"feed ({dtype})",
                        "batch": spec["feed_batch"], "host_ms_per_batch": 1e3 * statistics.median(times),
                        "mb_per_batch": spec["feed_batch"] * spec["image_size"] ** 2 * 3
                        * (4 if dtype == "float32" else 1) / 2**20})
    return results


WORKERS = {"keras": keras_worker, "timm": timm_worker, "feed": feed_worker}


def run_worker(kind, spec, backend=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
        if backend:
            env["KERAS_BACKEND"] = backend
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", kind, json.dumps(spec), out],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode or not os.path.exists(out):
            tail = " | ".join(proc.stdout.strip().splitlines()[-5:])
            return [{"library": kind, "backend": backend, "error": f"worker exit {proc.returncode}: {tail[-500:]}"}]
        with open(out) as f:
            return json.load(f)


def add_derived(results, rate, image_size):
    """FLOP utilisation of each row, and its ratio to each timm peer of the same case."""
    def kind(mode):  # timm trains with AdamW: the pretraining recipe's fit is its counterpart
        return {"fit (AdamW)": "fit", "fit (pretraining)": "fit"}.get(mode, mode)

    timm = {(r["library"], r["variant"], kind(r["mode"]), r["batch"]): r["images_per_s"]
            for r in results if r.get("library", "").startswith("timm") and "images_per_s" in r}
    for r in results:
        if "images_per_s" not in r:
            continue
        flops = model_flops(**arch_config(r["variant"], image_size))["total"]
        if r["mode"].startswith("fit"):
            flops = train_flops(flops)
        r["mfu"] = flops * r["images_per_s"] / 1e9 / rate["gflops"]
        for peer in ("timm", "timm-compile"):
            ref = timm.get((peer, r["variant"], kind(r["mode"]), r["batch"]))
            if ref and r["library"] != peer:
                r[f"x_{peer}"] = r["images_per_s"] / ref


def table(results):
    head = ["library", "backend", "variant", "batch", "mode", "img/s", "x timm", "x timm-compile", "peak MB", "MFU"]
    rows = []
    for r in results:
        if "images_per_s" not in r:
            what = r.get("skipped") or "error: " + r.get("error", "")
            rows.append([r.get("library", ""), r.get("backend") or "", r.get("variant", ""), str(r.get("batch", "")),
                         r.get("mode", ""), what[:90], "", "", "", ""])
            continue
        speed = f"{r['images_per_s']:.1f}" + (f" ({r['latency_ms']:.1f} ms)" if "latency_ms" in r else "")
        rows.append([r["library"], r["backend"], r["variant"], str(r["batch"]), r["mode"], speed,
                     f"{r['x_timm']:.2f}" if "x_timm" in r else "",
                     f"{r['x_timm-compile']:.2f}" if "x_timm-compile" in r else "",
                     f"{r['peak_mb']:.0f} ({r['memory']})" if "peak_mb" in r else "", f"{100 * r['mfu']:.1f}%"])
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    return "\n".join("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in [head, *rows])


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model, a few steps: checks the command")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="Keras backends (those that import run)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"peers in the same run, from {','.join(PEERS)}")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="the library's recipes fit runs under")
    parser.add_argument("--policy", default="mixed_bfloat16", help="Keras dtype policy (default mixed_bfloat16)")
    parser.add_argument("--steps", type=int, default=None, help="timed fit steps")
    parser.add_argument("--steps-per-execution", type=int, default=1, help="compile(steps_per_execution=...)")
    parser.add_argument("--feed", action="store_true",
                        help="instead: host time per batch of a float32 vs a uint8 pipeline on each backend")
    parser.add_argument("--feed-batch", type=int, default=64, help="batch of --feed (default 64)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, spec, out = args.worker
        from keras_vit.fileio import write_json

        write_json(out, WORKERS[kind](json.loads(spec)))
        return 0
    preset = QUICK if args.quick else FULL
    peers = [p for p in args.peers.split(",") if p]
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = sorted(set(peers) - set(PEERS)) + sorted(set(recipes) - set(RECIPES))
    if unknown:
        parser.error(f"unknown peer or recipe {unknown}; peers: {PEERS}, recipes: {RECIPES}")
    spec = dict(preset, peers=peers, recipes=recipes, policy=args.policy, steps=args.steps or preset["steps"],
                steps_per_execution=args.steps_per_execution, feed_batch=args.feed_batch)
    if args.feed:
        rows = [r for b in args.backends.split(",") if b for r in run_worker("feed", spec, b)]
        for r in rows:
            print(r if "error" in r else f"{r['backend']:<11} {r['mode']:<15} batch {r['batch']}: "
                  f"{r['host_ms_per_batch']:.1f} ms of host time, {r['mb_per_batch']:.1f} MiB")
        return 0
    rate = bf16_matrix_rate(args.quick) if _importable("torch") else {"gflops": float("nan"), "device": "unmeasured"}
    print(f"bfloat16 matrix rate: {rate['gflops']:.0f} GFLOP/s on {rate['device']}", flush=True)
    if not rate["device"].startswith("cuda"):
        print("no GPU: these figures only check that the command runs; the issue's figures need a GPU", flush=True)
    results = []
    for backend in [b for b in args.backends.split(",") if b]:
        if not _importable({"tensorflow": "tensorflow"}.get(backend, backend)):
            results.append({"library": "keras-vit", "backend": backend, "skipped": f"{backend} is not installed"})
            continue
        print(f"keras-vit on {backend} ...", flush=True)
        results += run_worker("keras", spec, backend)
    if "keras-hub" in peers and not _importable("keras_hub"):
        results.append({"library": "keras-hub", "skipped": "keras-hub is not installed (pip install keras-hub)"})
    if {"timm", "timm-compile"} & set(peers):
        if _importable("timm") and _importable("torch"):
            print("timm ...", flush=True)
            results += run_worker("timm", spec, "torch")
        else:
            results.append({"library": "timm", "skipped": "timm or torch is not installed"})
    add_derived(results, rate, preset["image_size"])
    print(table(results))
    if args.out:
        from keras_vit.fileio import write_json

        write_json(args.out, {"rate": rate, "spec": spec, "machine": platform.platform(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
