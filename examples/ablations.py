#!/usr/bin/env python
"""The paper's ablations at small scale, offline, on scikit-learn's digits.

    KERAS_BACKEND=jax python examples/ablations.py --out runs/ablations --overwrite
    python examples/ablations.py --quick --out /tmp/ablations      # a smoke test

Three experiments, every model trained under the same budget (epochs, batch, recipe) on the
digits 0-9 upsampled to RGB (all 10 classes, a stratified 75/25 train/test split):

1. Position embeddings (appendix D.4, Table 8): none, learned 1-D, learned 2-D and relative,
   added once after the stem, at every layer, or at every layer shared; each scored by its test
   accuracy and, as Table 8, by the 5-shot linear accuracy of its frozen representation.
2. Classifier (appendix D.3, Figure 9): [class] token against global average pooling, each at
   several learning rates (Figure 9: they work alike, but need different learning rates).
3. Self-supervision (section 4.6, B.1.2): masked patch prediction (3-bit mean colour of 50%
   corrupted patches) on the training images without labels, then fine-tuning on a fraction of
   the labels, against the same fine-tuning budget from scratch.

Writes into --out: table.md (the tables), results.json (every number, per seed), ablations.png.
Each file is written to a temporary name and renamed.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from _digits import make_batches, split_digits, to_rgb  # noqa: E402
from keras_vit.extras import require_or_exit  # noqa: E402
from keras_vit.fileio import atomic_write, write_json  # noqa: E402

POSITION_ROWS = (("none", "No Pos. Emb."), ("learned_1d", "1-D Pos. Emb."), ("learned_2d", "2-D Pos. Emb."),
                 ("relative", "Rel. Pos. Emb."))
PLACEMENTS = (("once", "Default/Stem"), ("every_layer", "Every Layer"), ("every_layer_shared", "Every Layer-Shared"))
# Table 8 (ViT-B/16, ImageNet 5-shot linear); None where the paper has N/A
PAPER_TABLE_8 = {
    "none": (0.61382, None, None), "learned_1d": (0.64206, 0.63964, 0.64292),
    "learned_2d": (0.64001, 0.64046, 0.64022), "relative": (0.64032, None, None),
}

FULL = dict(
    hidden_size=64, mlp_dim=128, num_heads=4, num_layers=4, patch_size=4, image_size=16, batch_size=64,
    epochs=20, lr=1e-3, weight_decay=0.1, classifier_lrs=(3e-4, 1e-3, 3e-3), seeds=(0,),
    ssl_epochs=30, ssl_lr=1e-3, finetune_epochs=20, finetune_lr=0.03, label_fraction=0.1,
    placements=tuple(p for p, _ in PLACEMENTS), shots=5, few_shot_trials=5,
)
# --quick: a tiny model, one epoch each, the placements and learning rates cut to one (tests)
QUICK = dict(FULL, hidden_size=16, mlp_dim=32, num_heads=2, num_layers=2, epochs=1, classifier_lrs=(1e-3,),
             ssl_epochs=1, finetune_epochs=1, few_shot_trials=2, placements=("once", "every_layer_shared"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("runs", "ablations"), help="output folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to average over (default: 0)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs of every supervised run")
    parser.add_argument("--quick", action="store_true", help="tiny model, one epoch each (a smoke test)")
    parser.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier run")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=0, help="Keras fit verbosity")
    args = parser.parse_args(argv)
    config = dict(QUICK if args.quick else FULL)
    if args.seeds:
        config["seeds"] = tuple(args.seeds)
    if args.epochs:
        if args.epochs < 1:
            parser.error(f"--epochs must be >= 1, got {args.epochs}")
        config["epochs"] = args.epochs
    return args, config


# --------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------
def build(config, classes=10, **kwargs):
    from keras_vit import VisionTransformer

    return VisionTransformer(
        image_size=config["image_size"], patch_size=config["patch_size"], hidden_size=config["hidden_size"],
        mlp_dim=config["mlp_dim"], num_heads=config["num_heads"], num_layers=config["num_layers"],
        classes=classes, classifier_activation=None, **kwargs)


def few_shot(model, data, config, seed):
    """5-shot linear accuracy of the frozen pooled representation (Table 8's metric)."""
    import keras

    from keras_vit import fewshot

    extractor = keras.Model(model.inputs, model.get_layer("pool").output)
    images = np.concatenate([data["x_train"], data["x_test"]])  # one batch: one compiled shape
    feats = np.split(fewshot.extract_features(extractor, images, batch_size=len(images)), [len(data["x_train"])])
    result = fewshot.fewshot_accuracy(feats[0], data["y_train"], feats[1], data["y_test"], shots=(config["shots"],),
                                      trials=config["few_shot_trials"], seed=seed)
    return float(result[config["shots"]])


def train(model, data, config, seed, epochs, lr, recipe="pretrain", verbose=0):
    """Fit `model` on the training split; returns test accuracy, 5-shot accuracy and the loss curve."""
    from keras_vit import recipes

    bs = min(config["batch_size"], len(data["x_train"]))
    batches = make_batches(data["x_train"], data["y_train"], bs, seed)
    steps = len(batches) * epochs
    common = dict(total_steps=steps, base_lr=lr, warmup_steps=max(1, steps // 10), batch_size=bs)
    if recipe == "pretrain":
        recipes.compile_for_pretraining(model, weight_decay=config["weight_decay"], **common)
    else:
        recipes.compile_for_finetuning(model, **common)
    history = model.fit(batches, epochs=epochs, verbose=verbose, callbacks=[recipes.NonFiniteLossStop()])
    test = model.evaluate(data["x_test"], data["y_test"], batch_size=len(data["x_test"]), verbose=0,
                          return_dict=True)
    return dict(test_accuracy=float(test["accuracy"]), few_shot=few_shot(model, data, config, seed),
                loss=[float(v) for v in history.history["loss"]])


def load_data(config, seed):
    split = split_digits(range(10), seed)
    size = config["image_size"]
    return dict(split, x_train=to_rgb(split["x_train"], size), x_test=to_rgb(split["x_test"], size))


# --------------------------------------------------------------------------
# the three experiments
# --------------------------------------------------------------------------
def position_ablation(config, data, seed, bar, verbose):
    import keras

    results = {}
    for kind, _ in POSITION_ROWS:
        for placement in config["placements"]:
            if placement != "once" and not kind.startswith("learned"):
                continue
            keras.utils.set_random_seed(seed)
            model = build(config, position_embedding=kind, position_placement=placement)
            run = train(model, data, config, seed, config["epochs"], config["lr"], verbose=verbose)
            results[f"{kind}/{placement}"] = dict(run, params=int(model.count_params()))
            bar.set_postfix_str(f"{kind}/{placement}: {run['test_accuracy']:.3f}")
            bar.update()
    return results


def classifier_ablation(config, data, seed, bar, verbose):
    import keras

    results = {}
    for classifier in ("token", "gap"):
        for lr in config["classifier_lrs"]:
            keras.utils.set_random_seed(seed)
            model = build(config, classifier=classifier)
            results[f"{classifier}/{lr:g}"] = train(model, data, config, seed, config["epochs"], lr, verbose=verbose)
            bar.set_postfix_str(f"{classifier} lr {lr:g}: {results[f'{classifier}/{lr:g}']['test_accuracy']:.3f}")
            bar.update()
    return results


def self_supervision(config, data, seed, staging, bar, verbose):
    """Masked patch prediction on all training images, then fine-tuning on `label_fraction` of the
    labels; against the same fine-tuning from scratch."""
    import keras

    from keras_vit import load_weights, recipes
    from keras_vit.masked_patch import MaskedPatchPredictor, compile_for_masked_patch_prediction, masked_accuracy
    from keras_vit.weights import save_npz

    rng = np.random.default_rng(seed)
    labelled = np.concatenate([rng.permutation(np.flatnonzero(data["y_train"] == c))[
        : max(1, round(config["label_fraction"] * np.sum(data["y_train"] == c)))] for c in range(10)])
    few = dict(data, x_train=data["x_train"][labelled], y_train=data["y_train"][labelled])

    keras.utils.set_random_seed(seed)
    model = MaskedPatchPredictor(build(config, include_top=False), target="mean_color", seed=seed)
    bs = config["batch_size"]
    steps = len(data["x_train"]) // bs * config["ssl_epochs"]
    compile_for_masked_patch_prediction(model, total_steps=steps, base_lr=config["ssl_lr"],
                                        warmup_steps=max(1, steps // 10), batch_size=bs)
    images = data["x_train"][: len(data["x_train"]) // bs * bs]
    history = model.fit(images, batch_size=bs, epochs=config["ssl_epochs"], shuffle=True, verbose=verbose,
                        callbacks=[recipes.NonFiniteLossStop()])
    accuracy = masked_accuracy(model(data["x_test"]))
    checkpoint = os.path.join(staging, f"ssl_encoder_seed{seed}.npz")
    save_npz(model.encoder, checkpoint)
    bar.update()

    runs = {}
    for name, weights in (("ssl_finetuned", checkpoint), ("scratch", None)):
        keras.utils.set_random_seed(seed)
        classifier = build(config)
        if weights:
            load_weights(classifier, weights)
        runs[name] = train(classifier, few, config, seed, config["finetune_epochs"], config["finetune_lr"],
                           recipe="finetune", verbose=verbose)
        bar.update()
    return dict(runs, labelled_images=int(len(labelled)), ssl_loss=[float(v) for v in history.history["loss"]],
                ssl_test_masked_accuracy=accuracy, ssl_steps=steps)


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------
def _mean(runs, key):
    values = [r[key] for r in runs]
    return float(np.mean(values)), float(np.std(values))


def summarise(per_seed, config):
    """Mean and standard deviation over seeds of every number."""
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    out = {}
    for section in ("position", "classifier"):
        out[section] = {}
        for name in first[section]:
            runs = [per_seed[s][section][name] for s in seeds]
            out[section][name] = {k: _mean(runs, k) for k in ("test_accuracy", "few_shot")}
            if "params" in runs[0]:
                out[section][name]["params"] = runs[0]["params"]
    out["ssl"] = {name: {k: _mean([per_seed[s]["ssl"][name] for s in seeds], k) for k in ("test_accuracy", "few_shot")}
                  for name in ("ssl_finetuned", "scratch")}
    out["ssl"]["masked_accuracy"] = _mean([per_seed[s]["ssl"] for s in seeds], "ssl_test_masked_accuracy")
    out["ssl"]["labelled_images"] = per_seed[seeds[0]]["ssl"]["labelled_images"]
    return out


def _cell(value, n_seeds):
    mean, std = value
    return f"{mean:.3f}" + (f" ± {std:.3f}" if n_seeds > 1 else "")


def markdown(summary, config, backend, seconds):
    n = len(config["seeds"])
    shown = [(p, t) for p, t in PLACEMENTS if p in config["placements"]]
    lines = [
        f"Digits 0-9 at {config['image_size']} px, ViT D={config['hidden_size']}, {config['num_layers']} layers, "
        f"{config['num_heads']} heads, patch {config['patch_size']}; {config['epochs']} epochs of AdamW "
        f"(lr {config['lr']:g}, wd {config['weight_decay']:g}) each; seeds {list(config['seeds'])}; "
        f"KERAS_BACKEND={backend}; {seconds:.0f} s.",
        "",
        f"Position embeddings (Table 8): test accuracy / {config['shots']}-shot linear accuracy of the frozen "
        "representation; the paper's ViT-B/16 ImageNet 5-shot in brackets",
        "",
        "| Pos. Emb. | " + " | ".join(t for _, t in shown) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for kind, title in POSITION_ROWS:
        cells = []
        for placement, _ in shown:
            result = summary["position"].get(f"{kind}/{placement}")
            paper = PAPER_TABLE_8[kind][[p for p, _ in PLACEMENTS].index(placement)]
            if result is None:
                cells.append("N/A")
            else:
                cells.append(f"{_cell(result['test_accuracy'], n)} / {_cell(result['few_shot'], n)} "
                             f"[{paper:.3f}]")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    lines += ["", "Classifier (D.3, Figure 9): test accuracy / 5-shot by learning rate", "",
              "| classifier | " + " | ".join(f"lr {lr:g}" for lr in config["classifier_lrs"]) + " |",
              "|---|" + "---|" * len(config["classifier_lrs"])]
    for classifier, title in (("token", "[class] token"), ("gap", "global average pooling")):
        cells = [f"{_cell(summary['classifier'][f'{classifier}/{lr:g}']['test_accuracy'], n)} / "
                 f"{_cell(summary['classifier'][f'{classifier}/{lr:g}']['few_shot'], n)}"
                 for lr in config["classifier_lrs"]]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    ssl = summary["ssl"]
    lines += [
        "", f"Self-supervision (B.1.2): masked patch prediction ({config['ssl_epochs']} epochs, Adam lr "
        f"{config['ssl_lr']:g}, cosine), then {config['finetune_epochs']} epochs of SGD fine-tuning (lr "
        f"{config['finetune_lr']:g}) on {ssl['labelled_images']} labelled images "
        f"({config['label_fraction']:.0%} of the training split)", "",
        "| initialisation | test accuracy | 5-shot |", "|---|---|---|",
        f"| masked patch prediction | {_cell(ssl['ssl_finetuned']['test_accuracy'], n)} | "
        f"{_cell(ssl['ssl_finetuned']['few_shot'], n)} |",
        f"| from scratch | {_cell(ssl['scratch']['test_accuracy'], n)} | {_cell(ssl['scratch']['few_shot'], n)} |",
        "", f"Masked mean-colour accuracy on corrupted test patches after pre-training: "
        f"{_cell(ssl['masked_accuracy'], n)}",
    ]
    return "\n".join(lines) + "\n"


def plot(path, summary, per_seed, config, title):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    ax = axes[0]
    shown = [(p, t) for p, t in PLACEMENTS if p in config["placements"]]
    width = 0.8 / len(shown)
    for j, (placement, label) in enumerate(shown):
        xs, ys, es = [], [], []
        for i, (kind, _) in enumerate(POSITION_ROWS):
            result = summary["position"].get(f"{kind}/{placement}")
            if result:
                xs.append(i + (j - (len(shown) - 1) / 2) * width)
                ys.append(result["test_accuracy"][0])
                es.append(result["test_accuracy"][1])
        ax.bar(xs, ys, width, yerr=es if len(config["seeds"]) > 1 else None, label=label, color=f"C{j}")
    ax.set_xticks(range(len(POSITION_ROWS)), [t for _, t in POSITION_ROWS])
    low = min(r["test_accuracy"][0] for r in summary["position"].values())
    ax.set_ylim(max(0.0, low - 0.1), 1.08)
    ax.set_ylabel("test accuracy")
    ax.set_title("position embeddings (Table 8)")
    ax.legend(fontsize=8, loc="upper left", ncol=len(shown))
    ax.grid(axis="y", alpha=0.3)

    ax = axes[1]
    lrs = config["classifier_lrs"]
    for classifier, label, colour in (("token", "[class] token", "C0"), ("gap", "global average pooling", "C1")):
        means = [summary["classifier"][f"{classifier}/{lr:g}"]["test_accuracy"] for lr in lrs]
        ax.errorbar(lrs, [m for m, _ in means], yerr=[s for _, s in means], marker="o", color=colour, label=label,
                    capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (AdamW)")
    ax.set_ylabel("test accuracy")
    ax.set_title("classifier (D.3, Figure 9)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)

    ax = axes[2]
    for name, label, colour in (("ssl_finetuned", "masked patch prediction + fine-tuning", "C2"),
                                ("scratch", "from scratch", "C3")):
        for s, seed in enumerate(per_seed):
            loss = per_seed[seed]["ssl"][name]["loss"]
            ax.plot(np.arange(1, len(loss) + 1), loss, "o-", ms=3, color=colour, alpha=0.8,
                    label=f"{label}: test acc {summary['ssl'][name]['test_accuracy'][0]:.3f}" if s == 0 else None)
    ax.set_xlabel("fine-tuning epoch")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.set_title(f"self-supervision (B.1.2), {summary['ssl']['labelled_images']} labelled images")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    with atomic_write(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def write_text(path, text):
    with atomic_write(path) as tmp, open(tmp, "w") as f:
        f.write(text)


def main(argv=None):
    args, config = parse_args(argv)
    require_or_exit("the digits examples")
    import keras
    from tqdm.auto import tqdm

    out = os.path.abspath(args.out)
    names = ("table.md", "results.json", "ablations.png")
    if os.path.exists(out) and not os.path.isdir(out):
        raise SystemExit(f"error: --out {out!r} exists and is not a folder")
    if not args.overwrite and any(os.path.exists(os.path.join(out, n)) for n in names):
        raise SystemExit(f"error: {out!r} already holds ablation results; pass --overwrite or another --out")
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    positions = sum(1 for k, _ in POSITION_ROWS for p in config["placements"]
                    if p == "once" or k.startswith("learned"))
    per_run = positions + 2 * len(config["classifier_lrs"]) + 3
    per_seed = {}
    with tqdm(total=per_run * len(config["seeds"]), desc="ablations", unit="run") as bar:
        for seed in config["seeds"]:
            data = load_data(config, seed)
            per_seed[seed] = dict(
                position=position_ablation(config, data, seed, bar, args.verbose),
                classifier=classifier_ablation(config, data, seed, bar, args.verbose),
                ssl=self_supervision(config, data, seed, out, bar, args.verbose),
            )
    seconds = time.perf_counter() - start
    summary = summarise(per_seed, config)
    backend = keras.backend.backend()
    table = markdown(summary, config, backend, seconds)
    results = dict(config={k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
                   backend=backend, keras_version=keras.__version__, seconds=round(seconds, 1), quick=args.quick,
                   summary=summary, per_seed={str(s): r for s, r in per_seed.items()},
                   paper_table_8=PAPER_TABLE_8)
    write_text(os.path.join(out, "table.md"), table)
    write_json(os.path.join(out, "results.json"), results)
    plot(os.path.join(out, "ablations.png"), summary, per_seed, config,
         f"ViT ablations on digits ({backend}, seeds {list(config['seeds'])}, {seconds:.0f} s)")
    print(table)
    print(f"outputs in {out}: {', '.join(names)}")
    return results


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
