#!/usr/bin/env python
"""How many of transformers' ViT-family model classes keras-vit loads exactly, on this backend (issue 54's measure,
for Hugging Face folders as `timm_coverage.py` is for timm files).

Every model class of transformers' ViT-family modules (`MODULES`, their vision classes) is made small (2 blocks of
width 32, 32 px images of 8 px patches; a two-tower model with a 1-block text tower) with every parameter moved off
its initial value, saved with `save_pretrained`, read by `keras_vit.from_huggingface(folder)` with no other argument,
as a user reads a folder, and compared with transformers' own output on 2 random images: what the class returns by
default (`keras_vit/weights/heads.py`: a classifier's logits, a projection's image embedding, a backbone's
`pooler_output`), and where a class pools nothing (a `pooler_output` of None, a `*Backbone`'s feature maps), its
final patch tokens against the model built with `pooling=None`. A class is "exact" within 1e-5 of the output's
scale (at least 1), "differs" past it, or "refused" with the first line of the error; a class transformers cannot
make this small, or whose outputs are no image representation (a text tower), is left out and listed.

    python benchmarks/hf_coverage.py                      # every class (a few minutes on 2 cores)
    python benchmarks/hf_coverage.py --names ViTModel     # one
"""

import argparse
import collections
import importlib
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# transformers' modules of ViT-family vision models (transformers 5)
MODULES = ("vit", "deit", "dinov2", "dinov2_with_registers", "dinov3_vit", "clip", "siglip", "siglip2", "beit",
           "data2vec", "aimv2", "vit_mae", "vit_msn", "ijepa")
TOLERANCE = 1e-5  # of the output's scale (at least 1), the project's float32 standard
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
              patch_size=8, num_patches=16, num_labels=3, projection_dim=24, use_relative_position_bias=True,
              mask_ratio=0.0, decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
              decoder_intermediate_size=32)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=64,
            bos_token_id=0, eos_token_id=1, pad_token_id=1)
SKIPPED = ("PreTrainedModel", "Text", "Audio", "ForMaskedImageModeling", "ForSemanticSegmentation")
# what keras-vit builds otherwise, on purpose (docs/families.md's table of what each class returns)
DOCUMENTED = {
    "DeiTModel": "its pooler (Dense + tanh on the class token) beside a distillation token is not built: keras-vit "
                 "returns the class token",
    "DeiTForImageClassification": "its classifier on the class token alone beside the distillation token is not "
                                  "built: keras-vit returns the class token (logged)",
}


def classes(module):
    """The model classes of transformers' `module` this script covers: its vision models (no text or audio tower
    alone, no base class; masked-image and segmentation heads are listed as left out by `main`)."""
    import transformers

    mod = importlib.import_module(f"transformers.models.{module}")
    names = [n for n in getattr(mod, "__all__", dir(mod)) if isinstance(getattr(mod, n, None), type)]
    return [n for n in sorted(set(names)) if issubclass(getattr(mod, n), transformers.PreTrainedModel)
            and not n.endswith("PreTrainedModel") and not any(s in n for s in ("Text", "Audio"))]


def _config(cls):
    """A small config of `cls`: a two-tower model's vision and text configs as dicts, else the vision one."""
    config_class = cls.config_class
    if "vision_config" in getattr(config_class, "sub_configs", {}):
        vision = {k: v for k, v in VISION.items() if k not in ("num_labels", "projection_dim")}
        return config_class(vision_config=vision, text_config=TEXT, projection_dim=VISION["projection_dim"])
    return config_class(**VISION)


def _images():
    import numpy as np

    return np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")


def _theirs(ref, x, naflex):
    """(the default output, the final tokens or None) of transformers' `ref` on images `x` (NHWC)."""
    import numpy as np
    import torch

    from keras_vit.naflex import patchify_images

    if naflex:  # SigLIP 2: patches in keras-vit's layout, which is its own
        batch = patchify_images(x, VISION["patch_size"])
        kwargs = dict(pixel_values=torch.from_numpy(batch["patches"]),
                      pixel_attention_mask=torch.from_numpy(batch["patch_valid"]).long(),
                      spatial_shapes=torch.tensor([[4, 4]] * len(x)))
    else:
        kwargs = dict(pixel_values=torch.from_numpy(x).permute(0, 3, 1, 2))
    if type(ref).__name__.startswith("ViTMAE"):  # its forward masks at random: no token masked (mask_ratio 0), in order
        ref = getattr(ref, "vit", ref)  # ViTMAEForPreTraining: its encoder (the decoder reconstructs pixels)
        kwargs["noise"] = torch.arange(x.shape[1] * x.shape[2] // VISION["patch_size"] ** 2,
                                       dtype=torch.float32).expand(len(x), -1)
    with torch.no_grad():
        if hasattr(ref, "get_image_features"):  # a two-tower model: its image embedding
            out = ref.get_image_features(**kwargs)
            return np.asarray(getattr(out, "pooler_output", out)), None
        out = ref(**kwargs)
    if getattr(out, "logits", None) is not None:
        return out.logits.numpy(), None
    if getattr(out, "image_embeds", None) is not None:  # a tower with its projection
        return out.image_embeds.numpy(), None
    if getattr(out, "feature_maps", None) is not None:  # a backbone: its last stage's map (B, D, h, w)
        return None, out.feature_maps[-1].permute(0, 2, 3, 1).numpy()
    tokens = out.last_hidden_state.numpy()
    pooled = getattr(out, "pooler_output", None)
    return (None if pooled is None else pooled.numpy()), tokens


def _compare(got, expected):
    import numpy as np

    if got.shape != expected.shape:
        return {"status": "differs", "why": f"shape {got.shape}, transformers' {expected.shape}"}
    error, scale = float(np.abs(got - expected).max()), float(np.abs(expected).max())
    return {"status": "exact" if error <= TOLERANCE * max(1.0, scale) else "differs", "error": error, "scale": scale}


def check(module, name, folder):
    """{"module", "name", "status": "exact" | "differs" | "refused" | "left out", "error", "scale" or "why"}."""
    import keras
    import torch
    import transformers

    import keras_vit
    from keras_vit.naflex import is_naflex, patchify_images

    row = {"module": module, "name": name}
    if any(s in name for s in SKIPPED):
        return {**row, "status": "left out", "why": "no image representation (a pre-training or dense head)"}
    cls = getattr(transformers, name)
    torch.manual_seed(0)
    try:
        ref = cls(_config(cls)).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.3 * torch.randn(p.shape))
        ref.save_pretrained(folder)
    except Exception as err:  # transformers' own: not this project's to count
        return {**row, "status": "left out", "why": _first_line(err)[:200]}
    x = _images()
    try:
        ours = keras_vit.from_huggingface(folder, classifier_activation=None)
        naflex = is_naflex(ours)
        expected, tokens = _theirs(ref, x, naflex)
        feed = patchify_images(x, VISION["patch_size"]) if naflex else x
        if expected is not None:
            row |= _compare(keras.ops.convert_to_numpy(ours(feed)), expected)
        if expected is None and not naflex:  # a class that pools nothing: its final tokens
            grid = keras.ops.convert_to_numpy(keras_vit.from_huggingface(folder, pooling=None)(x))
            flat = grid.reshape(len(x), -1, grid.shape[-1])
            row |= _compare(flat, tokens[:, -flat.shape[1]:].reshape(flat.shape))
        if row["status"] == "differs" and name in DOCUMENTED:
            row["why"] = DOCUMENTED[name]
    except Exception as err:  # the reason, without the folder's place (the same for every class)
        return {**row, "status": "refused", "why": _first_line(err).replace(folder, "the folder")[:200]}
    finally:
        keras.backend.clear_session()
    return row


def _first_line(err):
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def table(rows):
    """The markdown table of `rows` by module, then the refusals by reason."""
    lines = ["| module | exact | of read | differs | refused | left out |", "|---|---|---|---|---|---|"]
    total = collections.Counter()
    for module in MODULES:
        counts = collections.Counter(r["status"] for r in rows if r["module"] == module)
        if counts:
            total.update(counts)
            read = counts["exact"] + counts["differs"] + counts["refused"]
            lines.append(f"| {module} | {counts['exact']} | {read} | {counts['differs']} | {counts['refused']} | "
                         f"{counts['left out']} |")
    read = total["exact"] + total["differs"] + total["refused"]
    lines.append(f"| **all** | **{total['exact']}** | {read} | {total['differs']} | {total['refused']} | "
                 f"{total['left out']} |")
    others = [r for r in rows if r["status"] in ("refused", "differs", "left out")]
    if others:
        lines += ["", "| class | status | why |", "|---|---|---|"]
        lines += [f"| `{r['name']}` | {r['status']} | {r.get('why', '')[:140]} |" for r in others]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", default=list(MODULES), choices=MODULES, help="modules to cover")
    parser.add_argument("--names", nargs="+", default=None, help="only these classes")
    parser.add_argument("--json", default=None, help="also write every class's row to this JSON file")
    args = parser.parse_args(argv)
    import keras
    import transformers

    rows, start = [], time.perf_counter()
    for module in args.modules:
        for name in classes(module):
            if args.names is not None and name not in args.names:
                continue
            with tempfile.TemporaryDirectory() as folder:
                row = check(module, name, folder)
            rows.append(row)
            detail = row.get("why") or f"max abs error {row['error']:.1e} (scale {row['scale']:.1f})"
            print(f"{module:22s} {name:45s} {row['status']}: {detail}", flush=True)
    print(f"\ntransformers {transformers.__version__}, keras-vit on {keras.backend.backend()}, "
          f"{time.perf_counter() - start:.0f} s\n")
    print(table(rows))
    if args.json:
        from keras_vit.fileio import write_json

        write_json(args.json, {"transformers": transformers.__version__, "backend": keras.backend.backend(),
                               "rows": rows})
    return rows


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
