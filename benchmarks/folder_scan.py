"""How long `keras_vit.scan` takes before the first step, on folders of 10,000 to 1,000,000 JPEGs (issue 46):
the first scan with each check ("full" decodes every file, "header" reads headers), the second start (the
scan cache: a listing and a `stat` per file), a plain listing, timm's folder reader (which lists and reads
nothing), and the memory the scanned folder takes per file.

The folders are made of hard links to 256 distinct JPEGs of 500x375 (ImageNet's typical size; see
photo_folder.py), 1,000 classes, so that a million files cost no disk space and no inode each; each scan
reads every link as a file of its own, from the page cache (a warm disk: a network file system is slower).

    .venv/bin/python benchmarks/folder_scan.py --files 10000 100000 1000000
"""

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from photo_folder import cpu_name, load_average, write_folder  # noqa: E402

DISTINCT = 256
CLASSES = 1000


def make_folder(root, n):
    """`n` hard links to DISTINCT JPEGs, in CLASSES class folders under `root` (made once, kept)."""
    done = os.path.join(root, f".complete-{n}")
    if os.path.exists(done):
        return os.path.join(root, "images")
    sources = write_folder(os.path.join(root, "sources"), DISTINCT)
    originals = sorted(os.path.join(top, f) for top, _, files in os.walk(sources) for f in files)
    images = os.path.join(root, "images")
    for c in range(CLASSES):
        os.makedirs(os.path.join(images, f"n{c:08d}"), exist_ok=True)
    for i in range(n):
        os.link(originals[i % DISTINCT], os.path.join(images, f"n{i % CLASSES:08d}", f"{i:07d}.jpg"))
    open(done, "w").close()
    return images


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def timm_listing(images, python):
    """Seconds timm's `ImageDataset` takes to read the folder, in the interpreter `python` (None: not
    measured; timm's data package needs torchvision, which keras-vit's environment does not install)."""
    if python is None:
        return None
    code = ("import time, sys; from timm.data import ImageDataset; t = time.perf_counter(); "
            "d = ImageDataset(sys.argv[1]); print(time.perf_counter() - t, len(d))")
    run = subprocess.run([python, "-c", code, images], capture_output=True, text=True)
    return float(run.stdout.split()[0]) if run.returncode == 0 else None


def one_size(n, work, full_limit, timm_python):
    from keras_vit.data import folder, scan_cache

    images = make_folder(os.path.join(work, f"f{n}"), n)
    row = {"files": n}
    _, row["listing_s"] = timed(lambda: folder.image_files(images))
    _, row["header_s"] = timed(lambda: folder.scan(images, verify="header", cache=False, validation_split=0))
    if n <= full_limit:
        _, row["full_s"] = timed(lambda: folder.scan(images, verify="full", cache=False, validation_split=0))
    # the cached start: the first scan writes the cache, the second reads it (files older than RACY_SECONDS)
    time.sleep(scan_cache.RACY_SECONDS)
    folder.scan(images, verify="header", validation_split=0)
    _, row["second_start_s"] = timed(lambda: folder.scan(images, verify="header", validation_split=0))
    gc.collect()
    tracemalloc.start()  # again, for its memory alone: tracing slows every allocation several times
    scanned = folder.scan(images, verify="header", validation_split=0)
    row["bytes_per_file"] = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    del scanned
    row["timm_listing_s"] = timm_listing(images, timm_python)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--full-limit", type=int, default=100_000,
                   help="the full check (a decode a file) only up to this many files (default 100000)")
    p.add_argument("--timm-python", default=None, help="an interpreter with timm and torchvision, for timm's "
                   "folder reader beside (default: not measured)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "keras_vit_folder_scan"))
    args = p.parse_args()
    os.environ.setdefault("KERAS_HOME", os.path.join(args.work, "keras_home"))
    print(f"{cpu_name()}; load average {load_average()}")
    print(f"{'files':>9} {'listing':>8} {'header':>8} {'full':>8} {'2nd start':>9} {'timm':>8} "
          f"{'header files/s':>14} {'full files/s':>12} {'bytes/file':>10}")
    for n in args.files:
        r = one_size(n, args.work, args.full_limit, args.timm_python)
        full = r.get("full_s")
        timm = r["timm_listing_s"]
        print(f"{n:>9} {r['listing_s']:>7.2f}s {r['header_s']:>7.2f}s "
              f"{(f'{full:.2f}s' if full else '-'):>8} {r['second_start_s']:>8.2f}s "
              f"{(f'{timm:.2f}s' if timm else '-'):>8} {n / r['header_s']:>14,.0f} "
              f"{(f'{n / full:,.0f}' if full else '-'):>12} {r['bytes_per_file']:>10.0f}", flush=True)


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
