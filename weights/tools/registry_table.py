#!/usr/bin/env python3
"""Prints the Markdown table of every registered checkpoint (pasted into weights/README.md).

Usage:
    python weights/tools/registry_table.py            # the table
    python weights/tools/registry_table.py --check weights/README.md
        # exit 1 if the README does not contain the current table

The table is generated from keras_vit/weights/registry.py, so the README never drifts
from the code: re-run this script after editing the registry.
"""

import argparse
import importlib.util
import os
import sys

REGISTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "keras_vit", "weights", "registry.py")


def _load_registry():
    # Loaded from its file so that printing the table does not import keras or a backend.
    spec = importlib.util.spec_from_file_location("_keras_vit_registry", os.path.normpath(REGISTRY))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def markdown_table():
    registry = _load_registry()
    lines = [
        "| variant | tag | source file | px | classes | pre-logits | ImageNet top-1 (source) |",
        "|---|---|---|---:|---:|:---:|---|",
    ]
    for r in registry.list_weights():
        link = f"[`{r.folder}/{r.released_name}`]({r.url})"
        accuracy = r.accuracy if r.accuracy else "not reported" if r.classes == 1000 else "n/a (21k head)"
        pre = "yes" if r.pre_logits else "no"
        lines.append(f"| `{r.variant}` | `{r.tag}` | {link} | {r.image_size} | {r.classes} | {pre} | {accuracy} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", metavar="README", help="verify that README contains the current table")
    args = parser.parse_args(argv)
    table = markdown_table()
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            if table not in f.read():
                print(f"{args.check} is out of date: re-run {sys.argv[0]} and paste its output", file=sys.stderr)
                return 1
        print(f"{args.check}: table is current")
        return 0
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
