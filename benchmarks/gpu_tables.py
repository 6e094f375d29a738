"""The tables of a GPU session, rendered from its JSON: `results_table` (every row), the README's `model.fit`
table (`render_readme`) and benchmarks/README.md's block (`render_benchmarks`), written between the
gpu-session markers of both files by `update_tables`. The standard library only."""

import os
import re

from gpu_session import BACKENDS, FULL, POLICIES

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "gpu-session.json")
README_POLICY = "mixed_bfloat16"  # the README's table: a Keras row in another policy says so in its cell
BEGIN, END = "<!-- gpu-session: begin", "<!-- gpu-session: end -->"


def on_gpu(record):
    """Whether `record` is a full session measured on a GPU: the only kind the README tables take."""
    return not record.get("quick") and (record.get("rate") or {}).get("device", "").startswith("cuda")


def _variant(name):
    return re.sub(r"^ViT_(\w)(\d+)$", r"ViT-\1/\2", name)


def _speed(r):
    if "not_run" in r:
        return "not run: " + r["not_run"].replace("|", "/")[:120]
    latency = f" ({r['latency_ms']:.1f} ms)" if "latency_ms" in r else ""
    return f"{r['images_per_s']:,.0f}{latency}"


def _ratio(r, key):
    return f"{r[key]:.2f}" if key in r else ""


def results_table(record):
    """The session's rows as one markdown table (the levers with their ratio to the base row)."""
    head = "| library | backend | variant | batch | mode | policy | img/s | x timm | x timm compiled | peak GB | MFU |"
    lines = [head, "|" + "---|" * 11]
    for r in record["results"]:
        lever = f"{r['lever']}" + (f" ({r['x_base']:.2f}x base)" if "x_base" in r else "") if "lever" in r else ""
        mode = ", ".join(m for m in (r["mode"], lever) if m)
        peak = f"{r['peak_mb'] / 1024:.1f}{'' if r.get('memory') == 'device' else ' (RSS)'}" if "peak_mb" in r else ""
        mfu = f"{100 * r['mfu']:.0f}%" if r.get("mfu") else ""
        lines.append(f"| {r['library']} | {r.get('backend', '')} | {r.get('variant', '')} | {r.get('batch', '')} | "
                     f"{mode} | {r.get('policy', '')} | {_speed(r)} | {_ratio(r, 'x_timm')} | {_ratio(r, 'x_timm-compile')} | {peak} | {mfu} |")
    return "\n".join(lines)


def _describe(record):
    rate = record["rate"] or {}
    versions = ", ".join(f"{d} {v}" for d, v in record["versions"].items() if v)
    note = f" {record['note']}" if record.get("note") else ""
    return (f"{record['date']}, {rate.get('device', 'device not measured')}; bfloat16 matmul "
            f"{rate.get('gflops', float('nan')) / 1e3:.0f} TFLOP/s; Python {record['python']}, {versions}.{note}")


def render_benchmarks(record):
    """The GPU-session block of benchmarks/README.md (`record` None: the block that waits for one)."""
    if record is None:
        return "No GPU session is recorded yet: every figure of this section waits for one (the steps below)."
    parts = ", ".join(f"{k} {v['seconds']:.0f} s" for k, v in record["parts"].items() if v["status"] == "done")
    return "\n".join([f"Measured {_describe(record)}", "", f"    {record['command']}", "", results_table(record), "",
                      f"Wheels: {'; '.join(record['install'])}.", "", f"Parts (seconds): {parts}."])


def render_readme(record):
    """The README's GPU table: `model.fit` under the pretraining recipe (AdamW, timm's counterpart) per
    library and backend, one column per case (`record` None: the rows a session fills, waiting)."""
    cases = record["cases"] if record else FULL["cases"]
    fits = {}
    for r in record["results"] if record else []:
        key = (r["library"], r["backend"], r["variant"])
        # a part the budget stopped after its fit keeps the figure, not the line that says it was stopped
        fit = r["mode"] in ("fit (pretraining)", "fit (AdamW)", "") and "lever" not in r
        if fit and "images_per_s" not in fits.get(key, {}):
            fits[key] = r
    names = {"timm": "timm, eager", "timm-compile": "timm, `torch.compile`"}
    lines = [f"| `model.fit`, `{README_POLICY}`, AdamW | " + " | ".join(f"{_variant(v)}, batch {b}" for v, b in cases)
             + " |", "|---|" + "---|" * len(cases)]
    order = [("keras-vit", b) for b in BACKENDS] + [("timm", "torch"), ("timm-compile", "torch")]
    for library, backend in order + [("keras-hub", b) for b in BACKENDS]:
        cells = []
        for variant, _ in cases:
            r = fits.get((library, backend, variant))
            if r is None:
                cells.append("waits" if record is None else "")
            elif "images_per_s" in r:
                peer = next((f" ({r[k]:.2f}x timm {name})" for k, name in (("x_timm-compile", "compiled"),
                                                                         ("x_timm", "eager")) if k in r), "")
                other = f" in {r['policy']}" if r.get("policy") in POLICIES and r["policy"] != README_POLICY else ""
                cells.append(f"{r['images_per_s']:,.0f} img/s{other}{peer}")
            else:
                cells.append(_speed(r))
        if any(cells):
            lines.append(f"| {names.get(library) or f'{library}, {backend}'} | " + " | ".join(cells) + " |")
    what = (f"Measured {_describe(record)}" if record else
            "No GPU session is recorded yet: every cell waits for one.")
    return what + "\n\n" + "\n".join(lines)


def replace_block(text, block, where):
    """`text` with the block between the gpu-session markers replaced by `block`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{where} has no '{BEGIN} ... {END}' block to rewrite")
    start = text.index("-->", start) + 3
    return text[:start] + "\n" + block + "\n" + text[end:]


def update_tables(record, root=ROOT):
    """Rewrites the GPU blocks of README.md and benchmarks/README.md under `root` from `record` (None:
    the blocks that wait for a session)."""
    for rel, render in (("README.md", render_readme), (os.path.join("benchmarks", "README.md"), render_benchmarks)):
        path = os.path.join(root, rel)
        with open(path) as f:
            text = replace_block(f.read(), render(record), rel)
        with open(path + ".part", "w") as f:
            f.write(text)
        os.replace(path + ".part", path)

