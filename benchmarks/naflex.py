#!/usr/bin/env python
"""NaFlex against resize-to-square at one token budget, fine-tuning the real DINOv2 ViT-S/14 on photographs
of mixed aspect ratios (issue 37, item 4): held-out accuracy and images per second of each way.

    KERAS_BACKEND=jax .venv/bin/python benchmarks/naflex.py                 # minutes on a 2-core CPU
    .venv/bin/python benchmarks/naflex.py --quick                            # a tiny random ViT: the test

The photographs: `examples/own_images.py`'s folder (scikit-image's brick, grass and gravel textures cut into
`--per-class` pieces each that do not overlap, of different sizes and aspect ratios, each with its own
exposure and white balance, JPEG and PNG), split per class by `keras_vit.data.folder.scan` (`--validation-
split` held out). Both ways spend the same token budget T (`--tokens`, a square number) on every image:

  square: each image resized (bilinear, antialiased) to sqrt(T) * 14 px square, into the plain model built at
          that size (`from_huggingface(folder, image_size=...)`);
  NaFlex: each image resized to the largest grid of 14-px patches of its own aspect ratio within T patches
          (`naflex_feed`, `NaFlexPlan(patch_size=14, seq_lens=(T,), eval_seq_len=T, max_tokens_per_batch=
          T * batch)`: T tokens a sequence, padded), into `naflex(model)` of the model built at the file's own
          37x37 grid (each image's position embeddings resized from it; on a sqrt(T) x sqrt(T) grid they are
          the square model's). `--naflex-table square` takes `naflex()` of the square model instead.

Everything else is the same: the images of each batch and their left-right flips (the NaFlex plan's
seeded schedule drives both feeds), the zero-initialised 3-class head, the recipe
(`recipes.compile_for_finetuning`: SGD with momentum 0.9, clipping at norm 1, 5% warm-up, cosine decay),
epochs, batch and learning rates. Two phases: a linear probe (backbone frozen, `--probe-epochs` at
`--probe-lr`), then the whole network fine-tuned (`--finetune-epochs` at `--finetune-lr`); held-out loss
and accuracy after each. The batches are made before each epoch (their host time reported apart, ms per
image) and fed from memory, so the step rates are the model's. The two ways train epoch by epoch in turn,
so a drift of a shared machine's speed falls on both; training images/s counts the steps of each epoch
after its first (the first holds the compilation), summed over the phase's epochs; inference images/s
is `predict_on_batch` over the held-out batches, the ways in turn, the median of `--repeats` rounds after
a warm-up round. The last row gives NaFlex - square for accuracy and NaFlex / square for the rates.

A short SGD schedule on a few images measures where each way gets in that schedule, not what its
features allow: `--feature-probe N` also fits a logistic regression to convergence (scikit-learn) on each
way's frozen features of the pretrained weights over N random splits (`--probe-epochs 0 --finetune-epochs
0 --feature-probe 20`: that alone).

`--quick`: a tiny random ViT (patch 8), 16 tokens, 6 pieces a class, one epoch of full fine-tuning and a
2-split feature probe: the test's run.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))  # own_images (the folder), real_dinov2 (the weights)
sys.path.insert(0, HERE)
from photo_folder import cpu_name, load_average  # noqa: E402 (the machine, as the other feed benchmark reports it)

WAYS = ("square", "NaFlex")
FULL = {"model": "dinov2", "tokens": 64, "per_class": 80, "validation_split": 0.25, "batch": 16,
        "probe_epochs": 3, "finetune_epochs": 1, "repeats": 3, "feature_probe": 0}
QUICK = {"model": "tiny", "tokens": 16, "per_class": 6, "validation_split": 0.5, "batch": 3,
         "probe_epochs": 0, "finetune_epochs": 1, "repeats": 1, "feature_probe": 2}
TINY = {"patch_size": 8, "hidden_size": 32, "mlp_dim": 64, "num_heads": 2, "num_layers": 2}


# --------------------------------------------------------------------------
# the data: one plan, two feeds
# --------------------------------------------------------------------------
def read_split(folder, plan, validation_split):
    """(train images, train labels, held-out images, held-out labels, class names): the folder split by
    `plan.seed` as `naflex_feed.folder_batches` splits it, every image read once into memory."""
    from keras_vit.data import naflex_feed

    train, held_out = naflex_feed.folder_batches(folder, plan, validation_split)
    if held_out is None:
        raise SystemExit(f"--validation-split {validation_split} holds no image out of {folder}")
    read = [([batches.images[i] for i in range(len(batches.images))], list(batches.labels))
            for batches in (train, held_out)]
    return (*read[0], *read[1], train.class_names)


def feeds(images, labels, plan, training, mode):
    """{way: a PyDataset} over the same batch plan: NaFlex sequences, or the same images and flips squared."""
    from keras_vit.data import naflex_feed

    class SquareBatches(naflex_feed.NaFlexBatches):
        """The batches of `NaFlexBatches` (images, flips, order), each image resized to sqrt(T) patches a side."""

        def __getitem__(self, index):
            from keras_vit.data.naflex_sequence import resize_antialiased
            from keras_vit.preprocessing import preprocess_input

            seq_len, rows, flips = self.batch_plan(index)
            side = round(seq_len ** 0.5) * self.plan.patch_size
            out = []
            for row, flip in zip(rows, flips):
                image = resize_antialiased(np.asarray(self.images[row]), (side, side))
                out.append(image[:, ::-1] if flip else image)
            pixels = np.asarray(preprocess_input(np.stack(out), self.mode), np.float32)
            return pixels, np.asarray([self.labels[row] for row in rows], np.int32)

    return {"square": SquareBatches(images, labels, plan, training, mode=mode),
            "NaFlex": naflex_feed.NaFlexBatches(images, labels, plan, training, mode=mode)}


def in_memory(batches):
    """A PyDataset of a list of (x, y) batches already made."""
    import keras

    class Held(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()

        def __len__(self):
            return len(batches)

        def __getitem__(self, index):
            return batches[index]

    return Held()


def make_batches(dataset, seconds):
    """Every batch of `dataset` (one pass), its host time added to `seconds` [0] and its images to [1]."""
    start = time.perf_counter()
    out = [dataset[i] for i in range(len(dataset))]
    seconds[0] += time.perf_counter() - start
    seconds[1] += sum(len(y) for _, y in out)
    return out


# --------------------------------------------------------------------------
# the models
# --------------------------------------------------------------------------
def build_models(args, classes):
    """{way: model}: the square model at sqrt(T) * patch px and the NaFlex model, the same weights (the
    NaFlex one from the file's own position grid unless --naflex-table square), zero-initialised heads."""
    import keras

    import keras_vit
    from keras_vit.naflex import naflex

    side = round(args.tokens ** 0.5) * args.patch
    if args.model == "tiny":
        keras.utils.set_random_seed(args.seed)
        square = keras_vit.VisionTransformer(image_size=side, classes=classes, classifier_activation="softmax",
                                             **TINY)
        return {"square": square, "NaFlex": naflex(square)}
    import real_dinov2

    folder = real_dinov2.dinov2_folder()
    square = keras_vit.from_huggingface(folder, image_size=side, classes=classes, classifier_activation="softmax")
    source = square if args.naflex_table == "square" else \
        keras_vit.from_huggingface(folder, classes=classes, classifier_activation="softmax")
    return {"square": square, "NaFlex": naflex(source)}


def set_phase(model, phase, steps, args):
    """Compiles `model` for a phase: "probe" trains the head alone, "finetune" every weight."""
    from keras_vit import recipes

    for layer in model.layers:
        layer.trainable = phase == "finetune" or layer.name == "head"
    lr = args.probe_lr if phase == "probe" else args.finetune_lr
    recipes.compile_for_finetuning(model, total_steps=steps, base_lr=lr, warmup_steps=max(1, steps // 20),
                                   batch_size=args.batch)


def fit_epoch(model, batches, epoch):
    """One epoch of `model.fit` on batches in memory: (images, seconds) of its steps after the first, and the
    epoch's training loss and accuracy."""
    import keras

    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch in (0, len(batches) - 1):
                float(keras.ops.convert_to_numpy(logs["loss"]))  # the step done, not only dispatched
                marks[batch] = time.perf_counter()

    history = model.fit(in_memory(batches), epochs=epoch + 1, initial_epoch=epoch, shuffle=False, verbose=0,
                        callbacks=[Clock()])
    seconds = marks[len(batches) - 1] - marks[0]
    images = sum(len(y) for _, y in batches[1:])
    return images, seconds, history.history["loss"][-1], history.history["accuracy"][-1]


def evaluate(model, batches):
    loss, accuracy = model.evaluate(in_memory(batches), verbose=0)[:2]
    return {"loss": float(loss), "accuracy": float(accuracy)}


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------
def feature_probe(args, models, images, labels, mode):
    """Each way's frozen pooled features of the pretrained weights (every image, unflipped), and the held-out
    accuracy of a logistic regression fitted on them to convergence (scikit-learn, L2, C=1) over
    `--feature-probe` random stratified splits (`--validation-split` held out): what the features allow,
    apart from how far a short SGD schedule gets."""
    import keras
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedShuffleSplit
    from tqdm import tqdm

    from keras_vit.data import naflex_feed
    from keras_vit.data.naflex_sequence import resize_antialiased
    from keras_vit.preprocessing import preprocess_input

    side = round(args.tokens ** 0.5) * args.patch

    def square(image):
        return np.asarray(preprocess_input(resize_antialiased(np.asarray(image), (side, side)), mode), np.float32)

    def sequence(image):
        return naflex_feed.patchify(image, args.patch, args.tokens, args.tokens, mode=mode)

    features = {}
    for way, prepare in (("square", square), ("NaFlex", sequence)):
        pooled = keras.Model(models[way].inputs, models[way].get_layer("pool").output)
        rows = []
        for k in tqdm(range(0, len(images), args.batch), desc=f"frozen features, {way}", disable=args.quiet):
            x = [prepare(image) for image in images[k:k + args.batch]]
            x = {key: np.stack([v[key] for v in x]) for key in x[0]} if way == "NaFlex" else np.stack(x)
            rows.append(keras.ops.convert_to_numpy(pooled.predict_on_batch(x)))
        features[way] = np.concatenate(rows)
    labels = np.asarray(labels)
    splits = StratifiedShuffleSplit(args.feature_probe, test_size=args.validation_split, random_state=args.seed)
    scores = {way: [] for way in WAYS}
    for fit_rows, test_rows in splits.split(features["square"], labels):
        for way in WAYS:
            probe = LogisticRegression(max_iter=5000).fit(features[way][fit_rows], labels[fit_rows])
            scores[way].append(float(probe.score(features[way][test_rows], labels[test_rows])))
    gain = np.asarray(scores["NaFlex"]) - np.asarray(scores["square"])
    return {**{way: {"mean": float(np.mean(v)), "std": float(np.std(v)), "min": float(np.min(v)), "scores": v}
               for way, v in scores.items()},
            "naflex_minus_square": {"mean": float(gain.mean()), "wins": int((gain > 0).sum()),
                                    "ties": int((gain == 0).sum()), "losses": int((gain < 0).sum())}}


def train_both(args, models, train, held_batches, steps, host):
    """The two phases, the ways epoch by epoch in turn: {way: {"phases": {phase: held-out loss, accuracy,
    training images/s}, "curve": [per epoch]}}."""
    from tqdm import tqdm

    result = {way: {"phases": {}, "curve": []} for way in WAYS}
    epoch = 0
    phases = [(phase, epochs) for phase, epochs in (("probe", args.probe_epochs), ("finetune", args.finetune_epochs))
              if epochs]
    bar = tqdm(total=sum(n for _, n in phases) * len(WAYS), desc="epochs (both ways)", unit="epoch",
               disable=args.quiet)
    for phase, epochs in phases:
        for way in WAYS:
            set_phase(models[way], phase, steps * epochs, args)
        tally = {way: [0, 0.0] for way in WAYS}
        for _ in range(epochs):
            for way in (WAYS if epoch % 2 == 0 else WAYS[::-1]):  # who goes first alternates
                batches = make_batches(train[way], host[way])
                train[way].on_epoch_end()
                images, seconds, loss, accuracy = fit_epoch(models[way], batches, epoch)
                tally[way][0] += images
                tally[way][1] += seconds
                result[way]["curve"].append({"epoch": epoch, "phase": phase, "loss": float(loss),
                                             "accuracy": float(accuracy)})
                bar.update()
            epoch += 1
        for way in WAYS:
            result[way]["phases"][phase] = {**evaluate(models[way], held_batches[way]),
                                            "train_images_per_s": tally[way][0] / tally[way][1]}
    bar.close()
    return result


def time_inference(args, models, held_batches):
    """{way: median images/s of `predict_on_batch` over the held-out batches}, the ways in turn each round."""
    import keras
    from tqdm import tqdm

    rates = {way: [] for way in WAYS}
    images = sum(len(y) for _, y in held_batches["square"])
    for r in tqdm(range(args.repeats + 1), desc="inference rounds", disable=args.quiet):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            start = time.perf_counter()
            for x, _ in held_batches[way]:
                keras.ops.convert_to_numpy(models[way].predict_on_batch(x))
            if r:  # round 0 warms up
                rates[way].append(images / (time.perf_counter() - start))
    return {way: statistics.median(v) for way, v in rates.items()}


def run(args, folder):
    import keras

    from keras_vit.data.naflex_feed import NaFlexPlan

    plan = NaFlexPlan(patch_size=args.patch, seq_lens=(args.tokens,), eval_seq_len=args.tokens,
                      max_tokens_per_batch=args.tokens * args.batch, seed=args.seed)
    train_x, train_y, held_x, held_y, class_names = read_split(folder, plan, args.validation_split)
    mode = "vit" if args.model == "tiny" else "imagenet"  # DINOv2's input scaling: ImageNet's statistics
    train, held = feeds(train_x, train_y, plan, True, mode), feeds(held_x, held_y, plan, False, mode)
    host = {way: [0.0, 0] for way in WAYS}
    held_batches = {way: make_batches(held[way], host[way]) for way in WAYS}
    steps = plan.steps_per_epoch(len(train_x))
    if steps < 2:
        raise SystemExit(f"{len(train_x)} training images make {steps} batch of {args.batch} an epoch; the step "
                         "rate needs 2 or more (more images or a smaller --batch)")
    models = build_models(args, len(class_names))
    naflex_tokens = [int(np.sum(x["patch_valid"])) for x, _ in held_batches["NaFlex"]]
    info = {"cpu": cpu_name(), "backend": keras.backend.backend(), "keras": keras.__version__,
            "images": {"train": len(train_x), "held_out": len(held_x)}, "classes": list(class_names),
            "steps_per_epoch": steps, "naflex_valid_token_fraction": sum(naflex_tokens) / (len(held_x) * args.tokens)}
    if args.feature_probe:  # before any training changes the backbone
        info["feature_probe"] = feature_probe(args, models, train_x + held_x, train_y + held_y, mode)
    result = {}
    if args.probe_epochs + args.finetune_epochs:
        result = train_both(args, models, train, held_batches, steps, host)
        for way, rate in time_inference(args, models, held_batches).items():
            result[way]["inference_images_per_s"] = rate
            result[way]["host_ms_per_image"] = 1e3 * host[way][0] / host[way][1]
    info["load_average_end"] = load_average()
    return result, info


def table(result, args):
    """The markdown table of both ways and their ratio."""
    side = round(args.tokens ** 0.5) * args.patch
    rows = [f"| way ({args.tokens} tokens) | " + " | ".join(
        f"{phase} held-out acc (loss) | {phase} train img/s" for phase in result["square"]["phases"])
        + " | inference img/s | host ms/img |", "|---" * (2 * len(result["square"]["phases"]) + 3) + "|"]
    names = {"square": f"square {side}x{side}", "NaFlex": f"NaFlex (<= {args.tokens} patches)"}
    for way in WAYS:
        r = result[way]
        cells = [f"{p['accuracy']:.3f} ({p['loss']:.3f}) | {p['train_images_per_s']:.2f}" for p in r["phases"].values()]
        rows.append(f"| {names[way]} | " + " | ".join(cells)
                    + f" | {r['inference_images_per_s']:.2f} | {r['host_ms_per_image']:.2f} |")
    a, b = result["NaFlex"], result["square"]
    cells = [f"{pa['accuracy'] - pb['accuracy']:+.3f} acc | {pa['train_images_per_s'] / pb['train_images_per_s']:.2f}x"
             for pa, pb in zip(a["phases"].values(), b["phases"].values())]
    rows.append("| NaFlex - square (acc), NaFlex / square (rates) | " + " | ".join(cells)
                + f" | {a['inference_images_per_s'] / b['inference_images_per_s']:.2f}x"
                + f" | {a['host_ms_per_image'] / b['host_ms_per_image']:.2f}x |")
    return "\n".join(rows)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random ViT, a few images: the test's run")
    parser.add_argument("--model", choices=["dinov2", "tiny"], help="the real DINOv2 ViT-S/14 or a tiny random ViT")
    parser.add_argument("--tokens", type=int, help="the token budget T, a square number (default 64: 112 px square)")
    parser.add_argument("--per-class", type=int, help="pieces of each texture (default 80)")
    parser.add_argument("--validation-split", type=float, help="fraction of each class held out (default 0.25)")
    parser.add_argument("--folder", help="an image folder of your own instead of the textures")
    parser.add_argument("--batch", type=int, help="images a batch (default 16)")
    parser.add_argument("--probe-epochs", type=int, help="epochs of the linear probe, backbone frozen (default 3)")
    parser.add_argument("--finetune-epochs", type=int, help="epochs of full fine-tuning after it (default 1)")
    parser.add_argument("--probe-lr", type=float, default=0.1)
    parser.add_argument("--finetune-lr", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, help="timed inference rounds after a warm-up round (default 3)")
    parser.add_argument("--naflex-table", choices=["native", "square"], default="native",
                        help="the NaFlex model's position table: the file's own grid (default) or the square model's")
    parser.add_argument("--feature-probe", type=int, metavar="SPLITS",
                        help="also fit a logistic regression on each way's frozen features over this many random "
                             "splits (scikit-learn; default 0: not run; --quick: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("tokens", "per_class", "batch", "repeats"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be a positive integer, got {getattr(args, key)}")
    for key in ("probe_epochs", "finetune_epochs"):
        if getattr(args, key) < 0:
            parser.error(f"--{key.replace('_', '-')} must be an integer >= 0, got {getattr(args, key)}")
    if args.feature_probe < 0:
        parser.error(f"--feature-probe must be an integer >= 0, got {args.feature_probe}")
    if args.probe_epochs + args.finetune_epochs + args.feature_probe < 1:
        parser.error("--probe-epochs, --finetune-epochs and --feature-probe are all 0: nothing to measure")
    if round(args.tokens ** 0.5) ** 2 != args.tokens:
        parser.error(f"--tokens must be a square number (the square way's grid), got {args.tokens}")
    if not 0 < args.validation_split < 1:
        parser.error(f"--validation-split must be in (0, 1), got {args.validation_split}")
    args.patch = TINY["patch_size"] if args.model == "tiny" else 14
    return args


def main(argv=None):
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="naflex_bench_") as tmp:
        folder = args.folder
        if folder is None:
            import own_images

            folder = own_images.write_folder(os.path.join(tmp, "photos"), args.per_class, args.seed)
        start = time.perf_counter()
        result, info = run(args, folder)
        info["minutes"] = (time.perf_counter() - start) / 60
    model = "tiny random ViT (patch 8)" if args.model == "tiny" else "DINOv2 ViT-S/14 (real weights)"
    print(f"CPU: {info['cpu']}; backend {info['backend']} (keras {info['keras']}); load average at the end "
          f"{info['load_average_end']}")
    source = "your folder" if args.folder else f"{args.per_class} texture pieces a class"
    print(f"{model}; {info['images']['train']} training + {info['images']['held_out']} held-out images of "
          f"{len(info['classes'])} classes ({source}); NaFlex fills {100 * info['naflex_valid_token_fraction']:.1f}% "
          f"of its {args.tokens} tokens on the held-out images; {info['minutes']:.1f} minutes")
    if result:
        print(f"batch {args.batch}, {info['steps_per_epoch']} steps an epoch; linear probe {args.probe_epochs} "
              f"epochs at lr {args.probe_lr}, then full fine-tuning {args.finetune_epochs} epochs at lr "
              f"{args.finetune_lr}")
        print(table(result, args))
    if "feature_probe" in info:
        probe = info["feature_probe"]
        gain = probe["naflex_minus_square"]
        print(f"frozen features + logistic regression, {args.feature_probe} random splits ({args.validation_split} "
              "held out): " + "; ".join(f"{way} {probe[way]['mean']:.3f} +- {probe[way]['std']:.3f} (worst "
                                        f"{probe[way]['min']:.3f})" for way in WAYS)
              + f"; NaFlex - square {gain['mean']:+.3f}: better on {gain['wins']}, equal on {gain['ties']}, worse on "
                f"{gain['losses']} splits")
    if args.out:  # written whole, then moved into place: a Ctrl-C leaves no half file
        from keras_vit.fileio import write_json

        write_json(args.out, {**info, "args": vars(args), "ways": result})
    return result


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
