"""Tests for keras_vit.fewshot against scikit-learn; run under each KERAS_BACKEND."""

import keras
import numpy as np
import pytest

from keras_vit import fewshot

sklearn_linear = pytest.importorskip("sklearn.linear_model")


def clusters(n_per_class, num_classes, dim, spread, seed):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(num_classes, dim)) * 10.0
    labels = np.repeat(np.arange(num_classes), n_per_class)
    feats = centres[labels] + spread * rng.normal(size=(len(labels), dim))
    return feats, labels


@pytest.mark.backend_independent
@pytest.mark.parametrize("n, d", [(12, 40), (60, 8)])  # dual (n < d) and primal form
def test_least_squares_equals_sklearn_ridge(n, d):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, d)) * 3 + 1.5
    y = rng.integers(0, 4, size=n)
    targets = 2.0 * np.eye(4)[y] - 1.0
    for l2 in (0.01, 1.0, 100.0):
        w, b = fewshot.fit_least_squares(x, targets, l2_reg=l2)
        ridge = sklearn_linear.Ridge(alpha=l2, fit_intercept=True, solver="cholesky").fit(x, targets)
        np.testing.assert_allclose(w, ridge.coef_.T, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(b, ridge.intercept_, rtol=1e-7, atol=1e-9)


@pytest.mark.backend_independent
def test_fewshot_accuracy_equals_a_sklearn_pipeline():
    x_train, y_train = clusters(30, 5, 16, spread=12.0, seed=1)
    x_test, y_test = clusters(20, 5, 16, spread=12.0, seed=1)
    got = fewshot.fewshot_accuracy(x_train, y_train, x_test, y_test, shots=(1, 5, 10),
                                   l2_reg=3.0, seed=7)
    for k, accuracy in got.items():
        idx = fewshot.sample_shots(y_train, k, seed=7)
        ridge = sklearn_linear.Ridge(alpha=3.0).fit(x_train[idx], 2.0 * np.eye(5)[y_train[idx]] - 1)
        expected = np.mean(np.argmax(ridge.predict(x_test), 1) == y_test)
        assert accuracy == pytest.approx(expected, abs=1e-12)
    assert set(got) == {1, 5, 10}


@pytest.mark.backend_independent
def test_separated_clusters_are_classified_perfectly():
    x_train, y_train = clusters(30, 6, 32, spread=0.5, seed=2)
    x_test, y_test = clusters(25, 6, 32, spread=0.5, seed=2)
    got = fewshot.fewshot_accuracy(x_train, y_train, x_test, y_test)
    assert got == {1: 1.0, 5: 1.0, 10: 1.0, 25: 1.0}


@pytest.mark.backend_independent
def test_random_labels_score_near_chance():
    rng = np.random.default_rng(3)
    x_train, x_test = rng.normal(size=(500, 20)), rng.normal(size=(2000, 20))
    y_train, y_test = rng.integers(0, 5, 500), rng.integers(0, 5, 2000)
    got = fewshot.fewshot_accuracy(x_train, y_train, x_test, y_test, shots=(5, 25), trials=3)
    for accuracy in got.values():
        assert abs(accuracy - 0.2) < 0.05


@pytest.mark.backend_independent
def test_more_shots_help_on_noisy_clusters():
    x_train, y_train = clusters(60, 5, 32, spread=15.0, seed=4)
    x_test, y_test = clusters(60, 5, 32, spread=15.0, seed=4)
    got = fewshot.fewshot_accuracy(x_train, y_train, x_test, y_test, shots=(1, 25), trials=5)
    assert got[25] > got[1] + 0.1


@pytest.mark.backend_independent
def test_sampling_is_per_class_nested_and_seeded():
    labels = np.repeat(np.arange(3), 10)
    one = fewshot.sample_shots(labels, 1, seed=5)
    five = fewshot.sample_shots(labels, 5, seed=5)
    assert np.bincount(labels[five]).tolist() == [5, 5, 5]
    assert len(np.unique(five)) == 15
    assert set(one) <= set(five)
    np.testing.assert_array_equal(five, fewshot.sample_shots(labels, 5, seed=5))
    assert not np.array_equal(five, fewshot.sample_shots(labels, 5, seed=6))
    with pytest.raises(ValueError, match="Class 0 has 10 training examples; 25-shot"):
        fewshot.sample_shots(labels, 25)


@pytest.mark.backend_independent
def test_trials_average_independent_draws():
    x_train, y_train = clusters(30, 4, 8, spread=10.0, seed=6)
    x_test, y_test = clusters(30, 4, 8, spread=10.0, seed=6)
    singles = [fewshot.fewshot_accuracy(x_train, y_train, x_test, y_test, shots=(2,), seed=s)[2]
                for s in (10, 11, 12)]
    got = fewshot.fewshot_accuracy(x_train, y_train, x_test, y_test, shots=(2,), seed=10, trials=3)
    assert got[2] == pytest.approx(np.mean(singles))


@pytest.mark.parametrize("change, match", [
    (dict(test_features=np.zeros((4, 3))), "differ in width"),
    (dict(test_labels=np.array([0, 1, 9, 0])), r"\[0, 2\)"),
    (dict(train_features=np.full((8, 5), np.nan)), "nan"),
    (dict(train_labels=np.zeros(8, int)), "at least 2 classes"),
    (dict(train_labels=np.zeros(7, int)), "1-D array of 8"),
    (dict(train_features=np.zeros((8, 5, 1))), "2-D array"),
    (dict(shots=(5,)), "Class 0 has 4"),
    (dict(l2_reg=0.0), "l2_reg"),
])
@pytest.mark.backend_independent
def test_bad_input(change, match):
    args = dict(train_features=np.random.default_rng(0).normal(size=(8, 5)),
                train_labels=np.array([0, 1] * 4),
                test_features=np.zeros((4, 5)), test_labels=np.array([0, 1, 1, 0]),
                shots=(1,))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        fewshot.fewshot_accuracy(**args)


# ------------------------------------------------------------ extraction
def extractor():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 4, strides=4),
        keras.layers.GlobalAveragePooling2D(),
    ])


def test_extract_features_from_arrays_and_datasets():
    tf = pytest.importorskip("tensorflow")
    model = extractor()
    images = np.random.default_rng(0).uniform(-1, 1, size=(10, 8, 8, 3)).astype("float32")
    labels = np.arange(10) % 3
    reference = np.asarray(keras.ops.convert_to_numpy(model(images)))
    from_array = fewshot.extract_features(model, images, batch_size=4)
    assert from_array.shape == (10, 4) and from_array.dtype == np.float32
    np.testing.assert_allclose(from_array, reference, rtol=1e-5, atol=1e-6)

    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(4)
    feats, got_labels = fewshot.extract_features(model, ds)
    np.testing.assert_allclose(feats, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_labels, labels)

    only_images = tf.data.Dataset.from_tensor_slices(images).batch(3)
    np.testing.assert_allclose(fewshot.extract_features(model, only_images), reference,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="repeats forever"):
        fewshot.extract_features(model, ds.repeat())


def test_extract_features_refuses_unpooled_outputs():
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 4, strides=4)])
    with pytest.raises(ValueError, match=r"expected \(batch, features\)"):
        fewshot.extract_features(model, np.zeros((2, 8, 8, 3), "float32"))
    with pytest.raises(TypeError, match="keras.Model"):
        fewshot.extract_features(lambda x: x, np.zeros((2, 8, 8, 3)))
