"""What a fine-tuning run on an image folder reports: accuracy per class, the confusion matrix, the
worst mistakes and the curves, as numbers (pure numpy) and as PNGs."""

import csv
import os

import numpy as np

from keras_vit.fileio import atomic_write

# the mistakes drawn in mistakes.png: the most confident wrong predictions
WORST = 16
THUMBNAIL = 256  # pixels, the longer side of each photograph drawn there


def confusion_matrix(labels, predictions, num_classes):
    """(num_classes, num_classes) int64 counts: row the true class, column the predicted one."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (np.asarray(labels), np.asarray(predictions)), 1)
    return matrix


def per_class_accuracy(matrix):
    """Each class's share of its images predicted right (None for a class without images)."""
    totals = matrix.sum(axis=1)
    return [float(matrix[i, i] / t) if t else None for i, t in enumerate(totals)]


def worst_mistakes(labels, probabilities, k=WORST):
    """Indices of up to `k` wrong predictions, the most confident first."""
    predicted = probabilities.argmax(axis=1)
    wrong = np.flatnonzero(predicted != labels)
    return wrong[np.argsort(-probabilities[wrong, predicted[wrong]], kind="stable")][:k]


def evaluate(model, validation, folder, left_out=()):
    """The model's predictions on the validation split, in the folder's order, and what follows from them;
    `left_out`: `(path, reason)`s of the files the feed could not read (left out of their batches; read after
    predicting, as the feed fills it), whose records are skipped. ``result["records"]`` holds the index in
    `folder.validation` of each prediction."""
    probabilities = np.asarray(model.predict(validation, verbose=0), np.float64)
    gone = {path for path, _ in left_out}
    records = [i for i, r in enumerate(folder.validation) if r[0] not in gone]
    labels = np.asarray([folder.validation[i][1] for i in records])
    if len(probabilities) != len(labels):
        raise RuntimeError(f"{len(probabilities)} predictions for {len(labels)} validation images")
    matrix = confusion_matrix(labels, probabilities.argmax(axis=1), len(folder.class_names))
    return {"accuracy": float(np.trace(matrix) / max(1, matrix.sum())), "confusion": matrix.tolist(),
            "per_class": dict(zip(folder.class_names, per_class_accuracy(matrix))),
            "labels": labels, "probabilities": probabilities, "records": records}


def write_per_class(path, result, counts):
    """per_class.csv: class, training images, validation images, validation accuracy."""
    with atomic_write(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["class", "train_images", "validation_images", "validation_accuracy"])
        for name, accuracy in result["per_class"].items():
            writer.writerow([name, *counts[name], "" if accuracy is None else f"{accuracy:.4f}"])


def write_figures(out, history, result, folder, photograph=None):
    """curves.png, confusion_matrix.png and mistakes.png in `out`, of the run on `folder` (its `class_names` and
    `validation` records) whose `history` and evaluation `result` (`evaluate`) they draw; `photograph`: the
    validation image of an index (uint8 RGB), default read from its file under `folder.root`."""
    from keras_vit.inspection.plots import _figure, save_figure

    fig = _figure((10, 4))
    for ax, key in zip(fig.subplots(1, 2), ("loss", "accuracy")):
        for prefix, style, label in (("", "o-", "training"), ("val_", "s--", "validation")):
            values = history.get(prefix + key, [])
            ax.plot(range(1, len(values) + 1), values, style, label=label)
        ax.set(xlabel="epoch", ylabel=key)
        ax.grid(alpha=0.3)
        ax.legend()
    save_figure(fig, os.path.join(out, "curves.png"))

    names, matrix = folder.class_names, np.asarray(result["confusion"])
    side = min(20, 2 + 0.45 * len(names))
    fig = _figure((side + 1, side))
    ax = fig.subplots()
    shown = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(shown, ax=ax, shrink=0.8)
    ax.set(xticks=range(len(names)), yticks=range(len(names)), xlabel="predicted", ylabel="true",
           title=f"validation: {result['accuracy']:.1%} right")
    ax.set_xticklabels(names, rotation=90)
    ax.set_yticklabels(names)
    if len(names) <= 30:
        for (i, j), count in np.ndenumerate(matrix):
            ax.text(j, i, str(count), ha="center", va="center", fontsize=8,
                    color="white" if count > matrix.max() / 2 else "black")
    save_figure(fig, os.path.join(out, "confusion_matrix.png"))

    from PIL import Image

    from keras_vit.data.folder import read_image

    worst = worst_mistakes(result["labels"], result["probabilities"])
    columns = min(4, max(1, len(worst)))
    rows = max(1, -(-len(worst) // columns))
    fig = _figure((3 * columns, 3.3 * rows))
    axes = np.asarray(fig.subplots(rows, columns)).ravel()
    for ax in axes:
        ax.axis("off")
    for ax, index in zip(axes, worst):
        index = result["records"][index]
        path, label, *_ = folder.validation[index]
        image = Image.fromarray(photograph(index) if photograph else read_image(os.path.join(folder.root, path)))
        image.thumbnail((THUMBNAIL, THUMBNAIL))  # the photograph as it is, not as the model saw it
        guess = int(result["probabilities"][index].argmax())
        ax.imshow(np.asarray(image))
        ax.set_title(f"{os.path.basename(path)}\ntrue {names[label]}\nsaid {names[guess]} "
                     f"({result['probabilities'][index, guess]:.0%})", fontsize=8)
    if not len(worst):
        axes[0].text(0.5, 0.5, "no mistakes on the validation images", ha="center", va="center")
    save_figure(fig, os.path.join(out, "mistakes.png"))
