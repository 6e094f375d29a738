"""One checkpoint at three resolutions and two patch sizes: the attention rollout of the demo model.

The fine-tuned demo model (`make demo` writes runs/demo/model.keras: 32 px digits, 4 px patches)
is rebuilt once per patch size as a model that takes any resolution (`input_shape=(None, None, 3)`:
position embeddings resized at call time) and, for 8 px patches, loads its checkpoint through
FlexiViT's pseudo-inverse patch-embedding resize. Each takes the same test digits at 32, 48 and
64 px; the figure shows the class token's attention rollout over the first digit and, in the titles,
the test accuracy of each (resolution, patch size) pair.

    KERAS_BACKEND=jax python examples/any_size.py --run runs/demo --out docs/img/any_size_rollout.png
"""

import argparse
import os
import tempfile

import numpy as np


RESOLUTIONS = (32, 48, 64)
PATCH_SIZES = (4, 8)


def rebuild(model, patch_size, image_size):
    """The ViT of `model` as a model taking any size, with `patch_size` patches, from its weights."""
    import keras_vit
    from keras_vit.weights import model_config, save_npz

    config = model_config(model)
    classes = int(model.get_layer("head").kernel.shape[-1])
    with tempfile.TemporaryDirectory() as tmp:
        path = save_npz(model, os.path.join(tmp, "ckpt.npz"))
        config.update(patch_size=patch_size, image_size=image_size)
        return keras_vit.VisionTransformer(**config, classes=classes, classifier_activation=None,
                                           input_shape=(None, None, 3), weights=path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=os.path.join("runs", "demo"), help="a `make demo` output folder")
    parser.add_argument("--out", default=os.path.join("docs", "img", "any_size_rollout.png"))
    parser.add_argument("--images", type=int, default=200, help="test digits for the accuracies")
    args = parser.parse_args(argv)

    import keras
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from demo import load_digit_splits, to_rgb
    from keras_vit.extras import require_or_exit
    from keras_vit.fileio import atomic_write
    from keras_vit.inspection import attention_maps, attention_rollout, upsample_map

    require_or_exit("the digits examples")
    trained = keras.models.load_model(os.path.join(args.run, "model.keras"), safe_mode=True)
    train_size = int(trained.input_shape[1])
    split = load_digit_splits(seed=0)["finetune"]
    digits, labels = split["x_test"][: args.images], split["y_test"][: args.images]

    fig, axes = plt.subplots(len(PATCH_SIZES), len(RESOLUTIONS), figsize=(3.2 * len(RESOLUTIONS),
                                                                          3.8 * len(PATCH_SIZES)))
    for row, patch in enumerate(PATCH_SIZES):
        model = rebuild(trained, patch, train_size * patch // PATCH_SIZES[0])
        for col, size in enumerate(RESOLUTIONS):
            x = to_rgb(digits, size)
            accuracy = float(np.mean(np.argmax(model.predict(x, verbose=0), -1) == labels))
            grid = (size // patch, size // patch)
            rollout = attention_rollout(attention_maps(model, x[:1]), 1, grid)[0]
            heat = upsample_map(rollout, (size, size), normalize=True)
            ax = axes[row, col]
            ax.imshow((x[0, ..., 0] + 1) / 2, cmap="gray", extent=(0, size, size, 0))
            ax.imshow(heat, cmap="inferno", alpha=0.55, extent=(0, size, size, 0))
            ax.set_title(f"{size} px, {patch} px patches ({grid[0]}x{grid[1]})\ntest accuracy {accuracy:.0%}",
                         fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            print(f"patch {patch}, {size} px: accuracy {accuracy:.3f} on {len(labels)} test digits")
    fig.suptitle(f"one checkpoint ({train_size} px, {PATCH_SIZES[0]} px patches): attention rollout", fontsize=10)
    fig.tight_layout(h_pad=1.5)
    with atomic_write(args.out) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    from keras_vit.startup import run_main

    run_main(main)
