"""Training tasks: scikit-learn's bundled 8×8 digits, and a synthetic sequence task."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import int_in_range
from ._data import Dataset

__all__ = ["Task", "digits", "random_shift", "sorting"]


@dataclasses.dataclass(frozen=True)
class Task:
    """A train/test split and what a model for it needs to know.

    - `train`, `test`: `Dataset`s; `num_classes`: the size of the output (classes or vocabulary).
    - `input_shape`: the shape of one input; `description`: one line.
    """

    train: Dataset
    test: Dataset
    num_classes: int
    input_shape: tuple[int, ...]
    description: str


def digits(seed: int = 0, *, test_fraction: float = 0.25) -> Task:
    """scikit-learn's bundled 8×8 handwritten digits (1797 images, 10 classes), pixel values
    scaled to `[0, 1]`, split into train and held-out test sets stratified by class
    (`test_fraction` of each class held out, the split drawn with `seed`).

    Needs scikit-learn (`pip install "workbench[studies]"`); no download: the data ships with it.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction!r} must be in (0, 1).")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError(
            "the digits task needs scikit-learn (its bundled copy of the data): "
            'pip install "workbench[studies]" (or pip install scikit-learn).'
        ) from None
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 8, 8)
    y = y.astype(np.int32)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        held = rng.choice(members, int(round(test_fraction * len(members))), replace=False)
        test[held] = True
    return Task(
        Dataset(x[~test], y[~test]),
        Dataset(x[test], y[test]),
        10,
        (8, 8),
        f"8x8 digits, {(~test).sum()} train / {test.sum()} held-out (stratified, seed {seed})",
    )


@functools.cache
def random_shift(max_shift: int = 1):
    """An augmentation: shift each image of a batch `(B, H, W)` by a random whole number of
    pixels in `[-max_shift, max_shift]` along each axis, filling with zeros. (One function per
    `max_shift`: two calls give the same one, so training steps made with either compare equal
    and share their compiled program.)"""

    def augment(key, images):
        b, h, w = images.shape
        k1, k2 = jax.random.split(key)
        dy = jax.random.randint(k1, (b,), 0, 2 * max_shift + 1)
        dx = jax.random.randint(k2, (b,), 0, 2 * max_shift + 1)
        m = max_shift
        padded = jnp.pad(images, ((0, 0), (m, m), (m, m)))
        crop = lambda im, i, j: jax.lax.dynamic_slice(im, (i, j), (h, w))
        return jax.vmap(crop)(padded, dy, dx)

    return augment


def sorting(
    seed: int = 0,
    *,
    length: int = 8,
    vocab: int = 16,
    num_train: int = 4096,
    num_test: int = 1024,
) -> Task:
    """Sort a sequence: the input is `length` random symbols from `[0, vocab)`, a separator and
    the sorted symbols (teacher forcing); the targets are the next symbol at each position of
    the answer (`-1`, ignored, on the prompt). A causal model must attend back to the prompt to
    produce each sorted symbol. Held-out sequences are distinct from the training ones."""
    for name, value, low in (
        ("length", length, 2),
        ("vocab", vocab, 2),
        ("num_train", num_train, 1),
        ("num_test", num_test, 1),
    ):
        int_in_range(name, value, low, numpy_ints=False)
    rng = np.random.default_rng(seed)
    total = num_train + num_test
    raw = rng.integers(0, vocab, size=(4 * total, length))
    _, first = np.unique(raw, axis=0, return_index=True)
    raw = raw[np.sort(first)][:total]
    if len(raw) < total:
        raise ValueError("sorting: too few distinct sequences for the requested sizes.")
    sep = vocab
    answer = np.sort(raw, axis=1)
    inputs = np.concatenate([raw, np.full((total, 1), sep), answer[:, :-1]], axis=1)
    targets = np.concatenate([np.full((total, length), -1), answer], axis=1)
    inputs, targets = inputs.astype(np.int32), targets.astype(np.int32)
    return Task(
        Dataset(inputs[:num_train], targets[:num_train]),
        Dataset(inputs[num_train:], targets[num_train:]),
        vocab + 1,
        (2 * length,),
        f"sort {length} symbols of {vocab} (causal, teacher forcing), {num_train} train / {num_test} held-out",
    )
