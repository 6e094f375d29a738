"""The parts of a GPU session (benchmarks/gpu.py), each run in its own process: one Keras backend
and one library, or timm, or the matrix-rate probe.

    python benchmarks/gpu_workers.py KIND SPEC.json OUT.json

A part writes its rows to OUT.json as it goes (each write atomic), so a part stopped by the
session's time budget still hands over the rows it finished. Module level imports the standard
library only: the session imports this file before it has installed Keras.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def dump(path, obj):
    """Writes `obj` as JSON to `path` atomically (keras_vit.fileio needs Keras, which may be missing here)."""
    tmp = f"{path}.part"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _uint8_batch(batch, size, classes, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (batch, size, size, 3)).astype("uint8"),
            rng.integers(0, classes, (batch,)).astype("int32"))


def _pipeline(x, y):
    """An endless stream of the batch (x, y): tf.data with prefetching, or a PyDataset without TensorFlow."""
    try:
        import tensorflow as tf
    except ImportError:
        import keras

        class Batches(keras.utils.PyDataset):
            @property
            def num_batches(self):  # endless (a length would be shuffled as a list of every index)
                return None

            def __getitem__(self, index):
                return x, y

        return Batches(), "PyDataset"
    return tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(tf.data.AUTOTUNE), "tf.data"


def _device_peak(backend):
    """The device allocator's peak bytes (None on a CPU) and a reset for it."""
    from timing import gpu_memory

    mem = gpu_memory(backend)
    return mem if mem else (lambda: None, lambda: None)


def _peak_mb(read):
    peak = read()
    if peak is not None:
        return peak / 2**20, "device"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10, "rss"


def _mfu(config, images_per_s, training, rate_gflops):
    """Model FLOP utilisation against the measured bfloat16 matrix rate (None where it was not measured)."""
    from flops import model_flops, train_flops

    if not rate_gflops:
        return None
    flops = model_flops(**config)["total"]
    return (train_flops(flops) if training else flops) * images_per_s / 1e9 / rate_gflops


def _keras_hub_model(config, input_dtype, keras):
    import keras_hub

    size = config["image_size"]
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(size, size, 3), patch_size=config["patch_size"], num_layers=config["num_layers"],
        num_heads=config["num_heads"], hidden_dim=config["hidden_size"], mlp_dim=config["mlp_dim"])
    inputs = keras.Input((size, size, 3), dtype=input_dtype)
    x = inputs
    if input_dtype == "uint8":  # what keras-vit's input_dtype="uint8" does inside the model
        x = keras.layers.Rescaling(1 / 127.5, offset=-1.0, dtype="float32")(x)
    return keras.Model(inputs, keras_hub.models.ViTImageClassifier(backbone, config["classes"], activation=None)(x))


def keras_part(spec, emit):
    """`model.fit` of one library under each recipe on this process's Keras backend, then inference."""
    import keras
    from flops import arch_config

    import keras_vit
    from keras_vit import recipes

    backend = keras.backend.backend()
    reset, read = _device_peak(backend)
    lever = spec.get("lever") or {}
    per_execution = lever.get("steps_per_execution", 1)
    input_dtype = lever.get("input_dtype", "uint8")
    config = arch_config(spec["variant"], spec["image_size"])
    batch = spec["batch"]
    x, y = _uint8_batch(batch, spec["image_size"], config["classes"])
    feed = x if input_dtype == "uint8" else x.astype("float32") / 127.5 - 1
    data, feeder = _pipeline(feed, y)
    base = dict(library=spec["library"], backend=backend, variant=spec["variant"], batch=batch,
                feeder=f"{feeder}, {input_dtype}", policy=spec["policy"],
                **({"lever": spec["lever_name"]} if lever else {}))

    def build():  # clear_session() puts the global dtype policy back to float32: it is set after it
        keras.utils.clear_session()
        keras.mixed_precision.set_global_policy(spec["policy"])
        if spec["library"] == "keras-hub":
            return _keras_hub_model(config, input_dtype, keras)
        return keras_vit.VisionTransformer(
            **config, input_dtype=input_dtype, classifier_activation=None, remat=lever.get("remat", False),
            attention_implementation=lever.get("attention_implementation", "auto"))

    model = None
    for recipe in spec["recipes"]:
        case = {**base, "mode": f"fit ({recipe})"}
        try:
            model = build()
            case["policy"] = model.dtype_policy.name  # the policy the model was built in, read back
            getattr(recipes, f"compile_for_{recipe}")(
                model, total_steps=10_000, warmup_steps=10, batch_size=batch, from_logits=True, metrics=[],
                steps_per_execution=per_execution)
            steps = max(per_execution, spec["steps"] - spec["steps"] % per_execution)
            model.fit(data, steps_per_epoch=max(spec["warmup"], per_execution), verbose=0)  # compiles
            reset()
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=steps, verbose=0)
            speed = steps * batch / (time.perf_counter() - start)
            peak, where = _peak_mb(read)
            emit({**case, "images_per_s": speed, "peak_mb": peak, "memory": where, "steps": steps,
                  "mfu": _mfu(config, speed, True, spec.get("rate_gflops"))})
        except Exception as err:  # noqa: BLE001 - one failed case is one line; the others go on
            model = None
            emit({**case, "not_run": f"{type(err).__name__}: {str(err)[:300]}"})
    if spec.get("inference") and model is not None:
        _inference(model, {**base, "policy": model.dtype_policy.name}, spec, feed, reset, read, config, emit)


def _inference(model, base, spec, x, reset, read, config, emit):
    import numpy as np

    batch = spec["infer_batch"]
    images = np.resize(x, (batch, *x.shape[1:]))
    model.predict(images, batch_size=batch, verbose=0)
    reset()
    stack = np.concatenate([images] * max(2, spec["steps"] // 2))
    start = time.perf_counter()
    model.predict(stack, batch_size=batch, verbose=0)
    speed = len(stack) / (time.perf_counter() - start)
    peak, where = _peak_mb(read)
    emit({**base, "mode": "predict", "batch": batch, "images_per_s": speed, "peak_mb": peak, "memory": where,
          "mfu": _mfu(config, speed, False, spec.get("rate_gflops"))})
    emit(_latency_row(base, lambda: np.asarray(model.predict_on_batch(images[:1])), spec["latency_repeats"]))


def _latency_row(base, run_one, repeats):
    """The batch-1 latency row: `run_one()` (one image, its result on the host) once to warm up,
    then the median of `repeats` timed calls."""
    run_one()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_one()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {**base, "mode": "latency", "batch": 1, "latency_ms": 1e3 * median, "images_per_s": 1 / median}


def timm_part(spec, emit):
    """timm's ViT of the same configuration, eager and under `torch.compile`: AdamW, clipping at norm 1,
    bfloat16 autocast, uint8 batches from host memory scaled on the device; then inference."""
    import torch
    from flops import arch_config
    from timm_peer import timm_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    reset, read = _device_peak("torch")
    config = arch_config(spec["variant"], spec["image_size"])
    batch = spec["batch"]
    x, y = (torch.from_numpy(a) for a in _uint8_batch(batch, spec["image_size"], config["classes"]))
    if device == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    for peer in spec["peers"]:
        base = dict(library=peer, backend="torch", variant=spec["variant"], batch=batch, feeder="host uint8",
                    policy="bf16 autocast")
        case = {**base, "mode": "fit (AdamW)"}
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
            speed = spec["steps"] * batch / (time.perf_counter() - start)
            peak, where = _peak_mb(read)
            emit({**case, "images_per_s": speed, "peak_mb": peak, "memory": where, "steps": spec["steps"],
                  "mfu": _mfu(config, speed, True, spec.get("rate_gflops"))})
            _timm_inference(net, model, base, spec, x, device, sync, config, emit)
        except Exception as err:  # noqa: BLE001 - a peer that fails to compile is one line
            emit({**case, "not_run": f"{type(err).__name__}: {str(err)[:300]}"})


def _nchw(images):
    """uint8 NHWC on the device -> float32 NCHW in [-1, 1], as timm takes it."""
    return images.permute(0, 3, 1, 2).float().sub_(127.5).div_(127.5)


def _timm_inference(net, model, base, spec, x, device, sync, config, emit):
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
    speed = repeats * batch / (time.perf_counter() - start)
    emit({**base, "mode": "predict", "batch": batch, "images_per_s": speed,
          "mfu": _mfu(config, speed, False, spec.get("rate_gflops"))})
    emit(_latency_row(base, lambda: forward(images[:1]).float().cpu(), spec["latency_repeats"]))


def rate_part(spec, emit):
    """The measured bfloat16 matmul rate in GFLOP/s and where: the GPU's (torch, CUDA), else the CPU's."""
    import platform

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 8192 if device == "cuda" else (256 if spec.get("quick") else 2048)
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
    emit({"gflops": 2 * n**3 / best / 1e9, "device": f"{device}: {name}"})


def feed_part(spec, emit):
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
        emit({"library": "keras-vit", "backend": backend, "mode": f"feed ({dtype})", "batch": spec["feed_batch"],
              "host_ms_per_batch": 1e3 * statistics.median(times),
              "mb_per_batch": spec["feed_batch"] * spec["image_size"] ** 2 * 3 * (4 if dtype == "float32" else 1)
              / 2**20})


PARTS = {"keras": keras_part, "timm": timm_part, "rate": rate_part, "feed": feed_part}


def main(argv=None):
    parser = argparse.ArgumentParser(description="Runs one part of a GPU session (benchmarks/gpu.py starts them).")
    parser.add_argument("kind", choices=sorted(PARTS))
    parser.add_argument("spec", help="the part's spec (JSON)")
    parser.add_argument("out", help="where its rows are written (JSON, rewritten after each row)")
    args = parser.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    rows = []

    def emit(row):
        rows.append(row)
        dump(args.out, rows)

    dump(args.out, rows)
    PARTS[args.kind](spec, emit)


def run_script(main):
    """`keras_vit.startup.run_main` for the GPU session's scripts, which run before Keras and keras-vit are
    installed: Ctrl-C ends `main()` in one line on stderr and exit status 130, no traceback (the rows
    written so far are kept: each is written whole as it ends)."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{os.path.basename(sys.argv[0])}: interrupted: the rows written so far are kept; run the same "
              "command again", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    run_script(main)
