"""The teacher of the training-recipes ablation's distillation row (recipes_ablation.py): a small convnet,
as DeiT distils from a convnet, trained with Keras on the same training crops through keras-vit's folder
feed (its Inception crop and flip, the same 10% validation split), the best epoch kept, saved as a `.keras`
classifier of the folder's classes that `keras-vit finetune --teacher` takes."""

import math
import os
import tempfile

WIDTHS = (32, 64, 128)  # the three stages' channels


def convnet(image_size, classes):
    """A small VGG-like convnet (two 3x3 convolutions with batch norm a stage, max pooling between stages,
    global average pooling, a softmax head) taking uint8 images of `image_size`.

    Args:
        image_size: the input side.
        classes: the number of classes.
    """
    import keras

    inputs = keras.Input((image_size, image_size, 3), dtype="uint8")
    h = keras.layers.Rescaling(1 / 127.5, offset=-1.0)(keras.ops.cast(inputs, "float32"))
    for i, width in enumerate(WIDTHS):
        if i:
            h = keras.layers.MaxPooling2D()(h)
        for _ in range(2):
            h = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(h)
            h = keras.layers.Activation("relu")(keras.layers.BatchNormalization(momentum=0.9)(h))
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(h)
    return keras.Model(inputs, outputs, name="convnet_teacher")


def train_teacher(train_dir, test, size, path, seed=0):
    """Trains `convnet` on `train_dir` for size["teacher_epochs"] epochs (AdamW 1e-3, weight decay 0.05,
    cosine decay) and saves its best epoch to `path`; returns (`path`, its accuracy on `test`).

    Args:
        train_dir: the training crops' folder.
        test: (uint8 images, labels) of the test crops.
        size: the benchmark's sizes (image_size, batch, teacher_epochs).
        path: the `.keras` file to write.
        seed: the weights', the split's and the feed's seed.
    """
    import keras
    import numpy as np

    from keras_vit import data

    keras.utils.set_random_seed(seed)
    batch, epochs = size["batch"], size["teacher_epochs"]
    train, validation = data.from_directory(train_dir, size["image_size"], batch, validation_split=0.1, seed=seed,
                                            image_dtype="uint8")
    steps = math.ceil(len(train.image_folder.train) / batch)
    model = convnet(size["image_size"], len(train.class_names))
    schedule = keras.optimizers.schedules.CosineDecay(1e-3, epochs * steps)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.05),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    with tempfile.TemporaryDirectory() as tmp:
        best = os.path.join(tmp, "best.weights.h5")
        keep = keras.callbacks.ModelCheckpoint(best, monitor="val_accuracy", save_best_only=True,
                                               save_weights_only=True)
        model.fit(train, steps_per_epoch=steps, epochs=epochs, validation_data=validation, callbacks=[keep],
                  verbose=0)
        model.load_weights(best)
    model.save(path)
    scores = model.predict(test[0], batch_size=64, verbose=0)
    return path, float(np.mean(np.argmax(scores, axis=-1) == test[1]))


__all__ = ["WIDTHS", "convnet", "train_teacher"]
