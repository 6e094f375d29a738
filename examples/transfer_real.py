"""The paper's central claim, offline: a pretrained ViT transfers to a new task from few examples.

    python examples/transfer_real.py             # a few minutes on a 2-core CPU
    python examples/transfer_real.py --quick     # seconds: what the test runs

The real DINOv2 ViT-S/14 backbone (examples/real_dinov2.py) against the same architecture from
fresh weights, on a task neither has seen: telling scikit-image's textures apart (brick, grass,
gravel; crops of the left half of each photograph to learn from, of the right half to test on).
For each: few-shot accuracy of the frozen features (paper 4.1: a regularised least-squares map to
{-1, 1} targets), then fine-tuning with the paper's recipe (`compile_for_finetuning`: SGD with
momentum, warm-up and cosine decay, clipping) for the same number of steps, and the test accuracy.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its helpers beside it

import real_dinov2  # noqa: E402

TEXTURES = ("brick", "grass", "gravel")  # 512x512 grey photographs shipped with scikit-image


def crops(per_class, size, half, seed):
    """uint8 (per_class * 3, size, size, 3) random square crops (side 96 to 192 px) of the `half`
    ("left" or "right") of each texture, resized to `size`, and their labels."""
    from PIL import Image
    from skimage import data

    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, name in enumerate(TEXTURES):
        texture = getattr(data, name)()
        width = texture.shape[1] // 2
        part = texture[:, :width] if half == "left" else texture[:, width:]
        for _ in range(per_class):
            side = int(rng.integers(96, 193))
            top, left = rng.integers(0, part.shape[0] - side + 1), rng.integers(0, part.shape[1] - side + 1)
            crop = Image.fromarray(part[top:top + side, left:left + side]).resize((size, size), Image.BICUBIC)
            images.append(np.repeat(np.asarray(crop)[..., None], 3, -1))
            labels.append(label)
    return np.stack(images), np.asarray(labels, "int32")


def transfer(model, train, test, steps, batch, shots, seed):
    """(few-shot accuracies of the frozen representation {k: acc}, test accuracy after fine-tuning)."""
    import keras

    import keras_vit
    from keras_vit import recipes
    from keras_vit.fewshot import fewshot_accuracy

    (x_train, y_train), (x_test, y_test) = ((keras_vit.preprocess_input(x, "imagenet"), y) for x, y in (train, test))
    features = keras.Model(model.inputs, model.get_layer("pool").output)  # the representation the head reads
    f_train, f_test = (features.predict(x, batch_size=batch, verbose=0) for x in (x_train, x_test))
    few = fewshot_accuracy(f_train, y_train, f_test, y_test, shots=shots, seed=seed, num_classes=len(TEXTURES))
    recipes.compile_for_finetuning(model, total_steps=steps, base_lr=0.01, warmup_steps=max(1, steps // 10),
                                   batch_size=batch, metrics=["accuracy"])
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(len(x_train)) for _ in range(steps * batch // len(x_train) + 1)])
    picked = order[: steps * batch]
    model.fit(x_train[picked], y_train[picked], batch_size=batch, epochs=1, shuffle=False, verbose=0)
    accuracy = float(np.mean(model.predict(x_test, batch_size=batch, verbose=0).argmax(-1) == y_test))
    return few, accuracy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny images, few crops and steps (seconds)")
    parser.add_argument("--image-size", type=int, default=112, help="pixels (a multiple of 14; default 112)")
    parser.add_argument("--crops", type=int, default=32, help="crops per class to learn from and to test on")
    parser.add_argument("--steps", type=int, default=40, help="fine-tuning steps for each model")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.image_size, args.crops, args.steps, args.batch_size = 28, 6, 2, 6
    import keras

    import keras_vit

    folder = real_dinov2.dinov2_folder()
    train = crops(args.crops, args.image_size, "left", args.seed)
    test = crops(args.crops, args.image_size, "right", args.seed + 1)
    shots = tuple(k for k in (1, 5, 10) if k <= args.crops)
    results = {}
    for init in ("pretrained", "fresh"):
        keras.utils.set_random_seed(args.seed)
        model = keras_vit.from_huggingface(folder, image_size=args.image_size, classes=len(TEXTURES))
        if init == "fresh":  # the same architecture, every weight drawn anew by its initializer
            model = keras.models.clone_model(model)
        print(f"{init} ViT-S/14: few-shot on frozen features, then {args.steps} fine-tuning steps ...", flush=True)
        results[init] = transfer(model, train, test, args.steps, args.batch_size, shots, args.seed)
    print(f"\n{len(TEXTURES)} textures, {args.crops} crops per class each side, {args.image_size} px, "
          f"{keras.backend.backend()}")
    print("| weights | " + " | ".join(f"{k}-shot (frozen)" for k in shots) + " | fine-tuned |")
    print("|---|" + "---|" * (len(shots) + 1))
    for init, (few, accuracy) in results.items():
        print(f"| {init} | " + " | ".join(f"{few[k]:.3f}" for k in shots) + f" | {accuracy:.3f} |")
    return results


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
