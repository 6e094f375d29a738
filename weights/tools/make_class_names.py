#!/usr/bin/env python3
"""Rebuilds the ImageNet class-name lists shipped in keras_vit/resources/ from a timm wheel.

Usage:
    pip download --no-deps timm -d /tmp/timm
    python weights/tools/make_class_names.py /tmp/timm/timm-*.whl [--out keras_vit/resources]

Reads three data files from the wheel (timm/data/_info/):
    imagenet_synsets.txt          1,000 ImageNet-1k synsets in the standard (sorted) order
    imagenet21k_goog_synsets.txt  21,843 synsets in Google's ImageNet-21k order, the
                                  label order of the official imagenet21k ViT checkpoints
    imagenet_synset_to_lemma.txt  synset<TAB>WordNet lemmas ("tench, Tinca tinca")
and writes:
    imagenet1k.txt        1,000 lines  synset<TAB>name
    imagenet21k.txt.gz   21,843 lines  synset<TAB>name (gzip, mtime 0: same bytes on every run)

Counts, synset format, uniqueness and lemma coverage are checked before anything is
written; each output is written to a temporary file and then moved into place.
"""

import argparse
import gzip
import io
import os
import re
import sys
import zipfile

from keras_vit.fileio import atomic_write

INFO_DIR = "timm/data/_info/"
SYNSET_RE = re.compile(r"^n\d{8}$")
EXPECTED = {"imagenet1k.txt": 1000, "imagenet21k.txt.gz": 21843}
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "keras_vit", "resources")


def _read(wheel, name):
    try:
        return wheel.read(INFO_DIR + name).decode("utf-8")
    except KeyError:
        raise SystemExit(f"{wheel.filename}: no {INFO_DIR}{name} inside; is this a timm wheel (>= 0.9)?")


def _synsets(text, source, expected):
    synsets = [line.strip() for line in text.splitlines() if line.strip()]
    bad = [s for s in synsets if not SYNSET_RE.match(s)]
    if bad:
        raise SystemExit(f"{source}: malformed synset ids, e.g. {bad[:3]}")
    if len(synsets) != expected:
        raise SystemExit(f"{source}: expected {expected} synsets, found {len(synsets)}")
    if len(set(synsets)) != len(synsets):
        raise SystemExit(f"{source}: duplicate synsets")
    return synsets


def _lemmas(text):
    lemmas = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        synset, sep, name = line.partition("\t")
        if not sep or not SYNSET_RE.match(synset) or not name.strip() or "\t" in name:
            raise SystemExit(f"imagenet_synset_to_lemma.txt line {number}: expected 'synset<TAB>name', got {line!r}")
        lemmas[synset] = name.strip()
    return lemmas


def build(wheel_path):
    """Returns {output file name: text} built from the wheel at `wheel_path`."""
    with zipfile.ZipFile(wheel_path) as wheel:
        in1k = _synsets(_read(wheel, "imagenet_synsets.txt"), "imagenet_synsets.txt", 1000)
        in21k = _synsets(_read(wheel, "imagenet21k_goog_synsets.txt"), "imagenet21k_goog_synsets.txt", 21843)
        lemmas = _lemmas(_read(wheel, "imagenet_synset_to_lemma.txt"))
    outputs = {}
    for out_name, synsets in (("imagenet1k.txt", in1k), ("imagenet21k.txt.gz", in21k)):
        missing = [s for s in synsets if s not in lemmas]
        if missing:
            raise SystemExit(f"{out_name}: no name for synsets {missing[:5]}")
        outputs[out_name] = "".join(f"{s}\t{lemmas[s]}\n" for s in synsets)
        if outputs[out_name].count("\n") != EXPECTED[out_name]:
            raise SystemExit(f"{out_name}: expected {EXPECTED[out_name]} lines")
    return outputs


def _gzip_bytes(text):
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        f.write(text.encode("utf-8"))
    return buffer.getvalue()


def write(outputs, out_dir):
    for name, text in outputs.items():
        data = _gzip_bytes(text) if name.endswith(".gz") else text.encode("utf-8")
        with atomic_write(os.path.join(out_dir, name)) as tmp, open(tmp, "wb") as f:
            f.write(data)
        print(f"wrote {os.path.join(out_dir, name)}: {text.count(chr(10))} lines, {len(data)} bytes")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("wheel", help="path to a timm .whl file")
    parser.add_argument("--out", default=os.path.normpath(DEFAULT_OUT), help="output folder (default: keras_vit/resources)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.wheel):
        raise SystemExit(f"{args.wheel}: no such file")
    write(build(args.wheel), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
