#!/usr/bin/env python
"""How many of timm's ViT architectures keras-vit loads exactly, on this backend (issue 54's measure).

Every architecture timm registers in its ViT modules is built by timm at depth 2 with random weights (every
parameter moved off its initial value: zero heads and unit scales would hide mistakes), its state dict written
as `<architecture>.safetensors` (the name tells `from_timm` what a state dict does not), read by
`keras_vit.from_timm(file, num_heads=...)` with the head count read off timm's model, as a user passes it (and
`pooling="avg"` where timm averages the patch tokens beside a class token, which DINOv3's files do not record),
and compared with timm's output on 2 random images at the architecture's input size. An architecture is
"exact" within 1e-5 of the output's scale (at least 1), "differs" past it, or "refused" with the first line of
the error, which names what is missing. timm's own failures to build an architecture at depth 2 are listed
apart and left out of the count.

    python benchmarks/timm_coverage.py --json coverage.json          # every module (benchmarks/README.md: its time)
    python benchmarks/timm_coverage.py --modules deit --limit 3      # a quick look
"""

import argparse
import collections
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# timm's modules of ViT architectures (timm 1.0.31)
MODULES = ("vision_transformer", "deit", "eva", "beit", "vision_transformer_relpos", "naflexvit",
           "vision_transformer_hybrid")
TOLERANCE = 1e-5  # of the output's scale (at least 1), the project's float32 standard


def _heads(model):
    """The head count of the first attention module of timm's `model`, or None where it has none to read."""
    for module in model.modules():
        if "attention" in type(module).__name__.lower() and isinstance(getattr(module, "num_heads", None), int):
            return module.num_heads
    return None


def _randomised(model, torch, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model.eval()


def _pooling(model):
    """{"pooling": "avg"} where timm's `model` averages its patch tokens beside a class token (timm's default for its
    DINOv3 models, whose state dict does not say it), else {}: the choice a user passes, as the head count."""
    averaged = getattr(model, "global_pool", None) == "avg" and getattr(model, "cls_token", None) is not None
    return {"pooling": "avg"} if averaged else {}


def _first_line(err):
    """`err` as its type and the first line of its message (a message may be empty)."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def check(name, folder, depth=2):
    """{"name", "status": "exact" | "differs" | "refused" | "not built", "error" or "why"} of one architecture."""
    import keras
    import numpy as np
    import torch
    from safetensors.torch import save_file
    from timm_peer import import_timm

    import keras_vit

    timm = import_timm()
    torch.manual_seed(0)
    try:
        model = _randomised(timm.create_model(name, pretrained=False, depth=depth), torch)
    except Exception as err:  # timm's own: not this project's to count
        return {"name": name, "status": "not built", "why": _first_line(err)[:200]}
    size = model.pretrained_cfg.get("input_size", (3, 224, 224))[1:]
    x = np.random.default_rng(0).uniform(-1, 1, (2, *size, 3)).astype("float32")
    with torch.no_grad():
        expected = model(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    path = os.path.join(folder, f"{name}.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    try:
        # timm's NaFlex models take images: so does this one, at the size compared
        naflex = {"naflex": False, "image_size": tuple(size)} if name.startswith("naflexvit") else {}
        ours = keras_vit.from_timm(path, num_heads=_heads(model), classifier_activation=None, **_pooling(model),
                                   **naflex)
        got = keras.ops.convert_to_numpy(ours(x))
    except Exception as err:  # the reason, without the file's place (the same for every architecture)
        return {"name": name, "status": "refused", "why": _first_line(err).replace(path, "the file")[:200]}
    finally:
        os.remove(path)
        keras.backend.clear_session()
    if got.shape != expected.shape:
        return {"name": name, "status": "differs", "why": f"shape {got.shape}, timm's {expected.shape}"}
    error, scale = float(np.abs(got - expected).max()), float(np.abs(expected).max())
    status = "exact" if error <= TOLERANCE * max(1.0, scale) else "differs"
    return {"name": name, "status": status, "error": error, "scale": scale}


def table(rows):
    """The markdown table of `rows` by module: exact of those timm builds, then the refusals by reason."""
    lines = ["| module | exact | of built | share | differs | refused | not built by timm |",
             "|---|---|---|---|---|---|---|"]
    total = collections.Counter()
    for module in MODULES:
        counts = collections.Counter(r["status"] for r in rows if r["module"] == module)
        if not counts:
            continue
        built = counts["exact"] + counts["differs"] + counts["refused"]
        total.update(counts)
        share = f"{counts['exact'] / built:.0%}" if built else "-"
        lines.append(f"| {module} | {counts['exact']} | {built} | {share} | {counts['differs']} | "
                     f"{counts['refused']} | {counts['not built']} |")
    built = total["exact"] + total["differs"] + total["refused"]
    if built:
        lines.append(f"| **all** | **{total['exact']}** | {built} | **{total['exact'] / built:.0%}** | "
                     f"{total['differs']} | {total['refused']} | {total['not built']} |")
    reasons = collections.Counter(r["why"].split(": ", 1)[-1][:110] for r in rows if r["status"] == "refused")
    if reasons:
        lines += ["", "| refusals | architectures |", "|---|---|"]
        lines += [f"| {why} | {n} |" for why, n in reasons.most_common()]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", default=list(MODULES), choices=MODULES, help="timm modules to cover")
    parser.add_argument("--names", nargs="+", default=None, help="only these architectures")
    parser.add_argument("--limit", type=int, default=None, help="at most this many architectures a module")
    parser.add_argument("--json", default=None, help="also write every architecture's row to this JSON file")
    args = parser.parse_args(argv)
    from timm_peer import import_timm

    import keras

    timm = import_timm()
    rows, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for module in args.modules:
            names = [n for n in timm.list_models(module=module) if args.names is None or n in args.names]
            for name in names[:args.limit]:
                row = {"module": module, **check(name, folder)}
                rows.append(row)
                detail = row.get("why") or f"max abs error {row['error']:.1e} (scale {row['scale']:.1f})"
                print(f"{module:28s} {name:60s} {row['status']}: {detail}", flush=True)
    print(f"\ntimm {timm.__version__}, keras-vit on {keras.backend.backend()}, {time.perf_counter() - start:.0f} s\n")
    print(table(rows))
    if args.json:
        from keras_vit.fileio import write_json

        write_json(args.json, {"timm": timm.__version__, "backend": keras.backend.backend(), "rows": rows})
    return rows


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
