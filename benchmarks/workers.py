"""The timed workers of benchmark.py: each runs in its own process (one Keras backend, or timm),
reads a spec and writes a list of results. How a call is timed and measured: timing.py; timm's
model beside keras-vit's: timm_peer.py."""

import contextlib
import json
import os
import statistics
import sys
import time

import numpy as np

from flops import arch_config, model_flops
from timing import CLOCK, PeakRSS, gpu_memory, matmul_peak, measure, random_batch, summarise, time_calls
from timm_peer import timm_callable

from keras_vit.fileio import write_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


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
    return matmul_peak(libraries=tuple(spec["libraries"]), **{k: spec[k] for k in ("n",) if k in spec})



# --------------------------------------------------------------------------------------------
# workers: one process per backend (or timm); each reads a spec and writes a list of results
# --------------------------------------------------------------------------------------------
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
        x, y = random_batch(batch, case["image_size"], config["classes"])
        gpu_mem = gpu_memory(backend)
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
                results.append(measure(base, fn, spec["warmup"], spec["repeats"], batch, gpu_mem))
            else:
                # keras-vit alone first: its warm-up (compilation) and its memory
                with PeakRSS() as rss:
                    time_calls(fn, spec["warmup"], 0)
                timm_case = {**case, "mode": "train" if case["mode"] in ("train", "step") else "call"}
                timm_fn, timm_info = timm_callable(timm_case, config)
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


def timm_worker(spec):
    import torch

    if spec.get("torch_threads"):
        torch.set_num_threads(spec["torch_threads"])
    gpu_mem = gpu_memory("torch")
    results = []
    for case in spec["cases"]:
        base = {"backend": "torch", "library": "timm", **case, "jit_compile": False}
        try:
            config = arch_config(case["variant"], case["image_size"], case.get("classes", 1000))
            fn, info = timm_callable(case, config)
            base.update(info)
            results.append(measure(base, fn, spec["warmup"], spec["repeats"], case["batch"], gpu_mem))
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
    write_json(out_path, results)
