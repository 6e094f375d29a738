"""How the workers of benchmark.py (and gpu_workers.py) time and measure: the clock (wall or CPU
time), per-call times and their summary, the process's peak resident set size sampled in a thread,
the device allocator's peak, the float32 matmul peak that bounds what each backend can reach, and
the random batch every library is timed on. Imports numpy and the standard library only: a worker
narrows its CPU affinity before any framework starts its thread pools."""

import os
import statistics
import threading
import time

import numpy as np

# the clock every timing reads: `worker_main` sets process time for a spec with "clock": "cpu"
CLOCK = {"fn": time.perf_counter}


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


def alternate(fns, warmup, repeats):
    """{label: median wall ms} of the callables `fns` (label -> fn) timed side by side: `warmup` untimed rounds of
    each, then `repeats` rounds calling each in turn, the order flipped every round (a peer in the same run)."""
    items = list(fns.items())
    for _ in range(warmup):
        for _, fn in items:
            fn()
    times = {label: [] for label, _ in items}
    for i in range(repeats):
        for label, fn in items[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            fn()
            times[label].append((time.perf_counter() - start) * 1e3)
    return {label: statistics.median(t) for label, t in times.items()}


def summarise(times, batch):
    med = statistics.median(times)
    return {"seconds_median": med, "seconds_min": min(times), "seconds_max": max(times), "repeats": len(times),
            "images_per_s": batch / med, "images_per_s_best": batch / min(times)}


def gpu_memory(backend):
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


def measure(case, fn, warmup, repeats, batch, gpu_mem):
    """`case` with the summary of `repeats` timed calls of `fn` (after `warmup`), the peak RSS and, with
    `gpu_mem` (from `gpu_memory`), the device allocator's peak."""
    if gpu_mem:
        gpu_mem[0]()
    with PeakRSS() as rss:
        times = time_calls(fn, warmup, repeats)
    out = {**case, **summarise(times, batch), "rss_start_mb": rss.start / 2**20, "rss_peak_mb": rss.peak / 2**20}
    if gpu_mem:
        out["gpu_peak_mb"] = gpu_mem[1]() / 2**20
    return out


def random_batch(batch, image_size, classes, seed=0):
    """(images in [-1, 1), labels): the float32 batch every library of a case is timed on."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, classes, (batch,)).astype("int32")
    return x, y
