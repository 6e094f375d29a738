"""Few-shot linear evaluation of frozen representations (paper section 4.1).

"Few-shot accuracies are obtained by solving a regularized least-squares
regression problem that maps the (frozen) representation of a subset of
training images to {-1, 1}^K target vectors", in closed form:

    feats_train, y_train = fewshot.extract_features(backbone, train_ds)
    feats_test, y_test = fewshot.extract_features(backbone, test_ds)
    fewshot.fewshot_accuracy(feats_train, y_train, feats_test, y_test, shots=(1, 5, 10, 25))
    # {1: 0.41, 5: 0.63, 10: 0.70, 25: 0.76}

The regression has an unregularised bias: with ``X`` the features and ``Y``
the {-1, 1} targets of the sampled images, centred by their means,

    W = (X^T X + l2_reg I)^-1 X^T Y = X^T (X X^T + l2_reg I)^-1 Y,   b = mean(Y) - mean(X) W

(the second form is used when there are fewer images than feature
dimensions) and a test image is assigned ``argmax(x W + b)``. The math is
plain numpy; only :func:`extract_features` touches Keras.
"""

import numpy as np

__all__ = ["fit_least_squares", "sample_shots", "fewshot_accuracy", "extract_features"]


def _as_features(name, x):
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D array (examples, features); got shape {x.shape}.")
    if not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"`{name}` must be numeric; got dtype {x.dtype}.")
    x = x.astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError(f"`{name}` contains nan or inf.")
    return x


def _as_labels(name, y, n):
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"`{name}` must be a 1-D array of {n} integer labels; got shape {y.shape}.")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError(f"`{name}` must hold integer class indices; got dtype {y.dtype}.")
        y = y.astype(np.int64)
    if len(y) and y.min() < 0:
        raise ValueError(f"`{name}` must be class indices >= 0; got {y.min()}.")
    return y.astype(np.int64)


def fit_least_squares(features, targets, l2_reg=1.0):
    """Closed-form ridge regression with an unregularised bias.

    Args:
        features: (n, d) array.
        targets: (n, k) array (e.g. {-1, 1} one-vs-rest codes).
        l2_reg: the ridge penalty ``l2_reg * |W|^2`` (> 0).

    Returns:
        ``(W, b)`` with shapes (d, k) and (k,), minimising
        ``|features W + b - targets|^2 + l2_reg |W|^2``.
    """
    x = _as_features("features", features)
    t = np.asarray(targets, np.float64)
    if t.ndim != 2 or t.shape[0] != x.shape[0]:
        raise ValueError(f"`targets` must be ({x.shape[0]}, k); got shape {t.shape}.")
    l2_reg = float(l2_reg)
    if not np.isfinite(l2_reg) or l2_reg <= 0:
        raise ValueError(f"`l2_reg` must be a finite number > 0; got {l2_reg}.")
    x_mean, t_mean = x.mean(0), t.mean(0)
    xc, tc = x - x_mean, t - t_mean
    n, d = xc.shape
    if n < d:  # solve the n x n system instead of the d x d one
        gram = xc @ xc.T
        gram[np.diag_indices(n)] += l2_reg
        w = xc.T @ np.linalg.solve(gram, tc)
    else:
        gram = xc.T @ xc
        gram[np.diag_indices(d)] += l2_reg
        w = np.linalg.solve(gram, xc.T @ tc)
    return w, t_mean - x_mean @ w


def sample_shots(labels, shots, num_classes=None, seed=0):
    """Indices of ``shots`` examples of each class, drawn without replacement.

    Each class's examples are put in one random order (from ``seed``), and the
    first ``shots`` are taken, so the 1-shot set is inside the 5-shot set and
    so on for the same seed.

    Raises:
        ValueError: a class has fewer than ``shots`` examples.
    """
    labels = _as_labels("labels", labels, len(np.asarray(labels)))
    if isinstance(shots, bool) or not isinstance(shots, (int, np.integer)) or shots < 1:
        raise ValueError(f"`shots` must be a positive integer; got {shots!r}.")
    num_classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    rng = np.random.default_rng(seed)
    picked = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        if len(members) < shots:
            raise ValueError(
                f"Class {c} has {len(members)} training examples; {shots}-shot "
                f"evaluation needs {shots} of each class."
            )
        picked.append(members[rng.permutation(len(members))[:shots]])
    return np.concatenate(picked)


def fewshot_accuracy(train_features, train_labels, test_features, test_labels,
                     shots=(1, 5, 10, 25), l2_reg=1.0, seed=0, trials=1, num_classes=None):
    """Few-shot linear accuracy on ``test`` for each number of ``shots`` per class.

    For each trial, ``k`` images of every class are sampled from the training
    features (:func:`sample_shots`), a regularised least-squares map to
    {-1, 1}^K targets is solved in closed form (:func:`fit_least_squares`) and
    the test accuracy of ``argmax`` is measured.

    Args:
        train_features, test_features: (n, d) frozen representations.
        train_labels, test_labels: integer labels in [0, num_classes).
        shots: the numbers of examples per class to evaluate.
        l2_reg: ridge penalty (see :func:`fit_least_squares`). The best value
            depends on the scale of the features.
        seed: seed of the sampling; trial ``t`` uses ``seed + t``.
        trials: independent samplings averaged per shot.
        num_classes: defaults to ``max(train_labels) + 1``.

    Returns:
        dict ``shots -> mean test accuracy`` (floats in [0, 1]).
    """
    x_train = _as_features("train_features", train_features)
    x_test = _as_features("test_features", test_features)
    if x_train.shape[1] != x_test.shape[1]:
        raise ValueError(
            f"train and test features differ in width: {x_train.shape[1]} vs {x_test.shape[1]}.")
    y_train = _as_labels("train_labels", train_labels, len(x_train))
    y_test = _as_labels("test_labels", test_labels, len(x_test))
    if len(x_train) == 0 or len(x_test) == 0:
        raise ValueError("Need at least one training and one test example.")
    num_classes = int(y_train.max()) + 1 if num_classes is None else int(num_classes)
    if num_classes < 2:
        raise ValueError(f"Few-shot classification needs at least 2 classes; got {num_classes}.")
    if y_train.max() >= num_classes or y_test.max() >= num_classes:
        raise ValueError(
            f"Labels must lie in [0, {num_classes}); got train max {y_train.max()}, "
            f"test max {y_test.max()}.")
    if isinstance(shots, (int, np.integer)):
        shots = (shots,)
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise ValueError(f"`trials` must be a positive integer; got {trials!r}.")
    codes = 2.0 * np.eye(num_classes) - 1.0  # class c -> +1 at c, -1 elsewhere
    result = {}
    for k in shots:
        accuracies = []
        for trial in range(trials):
            idx = sample_shots(y_train, k, num_classes, seed=seed + trial)
            w, b = fit_least_squares(x_train[idx], codes[y_train[idx]], l2_reg)
            predictions = np.argmax(x_test @ w + b, axis=1)
            accuracies.append(float(np.mean(predictions == y_test)))
        result[int(k)] = float(np.mean(accuracies))
    return result


def extract_features(model, data, batch_size=64, verbose=0):
    """Run a Keras feature extractor (e.g. a ViT with ``include_top=False``) in batches.

    Args:
        model: a Keras model returning (batch, features).
        data: a numpy array of images, or a ``tf.data.Dataset`` yielding images
            or ``(images, labels)`` batches (e.g. the eval set of
            ``keras_vit.data.load``; it must be finite).
        batch_size: batch size for arrays.

    Returns:
        float32 features (n, d) for an array or a dataset of images; the tuple
        ``(features, labels)`` for a dataset of ``(images, labels)``.
    """
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model; got {type(model).__name__}.")

    def check(features):
        features = np.asarray(keras.ops.convert_to_numpy(features), np.float32)
        if features.ndim != 2:
            raise ValueError(
                f"The model returns outputs of shape {features.shape}; expected "
                "(batch, features), e.g. a ViT built with include_top=False.")
        return features

    if isinstance(data, np.ndarray):
        if data.ndim != 4:
            raise ValueError(f"Expected images (n, height, width, channels); got shape {data.shape}.")
        return check(model.predict(data, batch_size=batch_size, verbose=verbose))

    if not hasattr(data, "as_numpy_iterator"):
        raise TypeError(
            f"`data` must be a numpy array or a tf.data.Dataset; got {type(data).__name__}.")
    cardinality = int(data.cardinality())
    if cardinality == -1:  # tf.data.INFINITE_CARDINALITY
        raise ValueError("The dataset repeats forever; pass a finite one (e.g. repeat=False).")
    features, labels, has_labels = [], [], None
    for batch in data.as_numpy_iterator():
        if isinstance(batch, tuple):
            images, batch_labels = batch[0], batch[1]
            has_labels = True
            labels.append(np.asarray(batch_labels).reshape(-1))
        else:
            images = batch
            has_labels = False
        features.append(check(model.predict_on_batch(images)))
        if verbose:
            print(f"\rfeatures: {sum(len(f) for f in features)} images", end="")
    if verbose:
        print()
    if not features:
        raise ValueError("The dataset is empty.")
    features = np.concatenate(features)
    if has_labels:
        return features, np.concatenate(labels).astype(np.int64)
    return features
