"""Datasets and the seeded minibatch order: which examples make step `s`'s batch is a pure
function of `(seed, s)`, so a resumed run sees exactly the batches of an uninterrupted one."""

import dataclasses

import equinox as eqx
import jax
import numpy as np

from .._checks import positive_int

__all__ = ["Dataset", "batch_indices", "check_data"]


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Inputs and targets as NumPy arrays with one leading example axis."""

    inputs: np.ndarray
    targets: np.ndarray

    def __post_init__(self):
        x, y = np.asarray(self.inputs), np.asarray(self.targets)
        if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"Dataset: inputs {x.shape} and targets {y.shape} need the same leading "
                "(example) axis."
            )
        if x.shape[0] == 0:
            raise ValueError("Dataset: no examples.")
        object.__setattr__(self, "inputs", x)
        object.__setattr__(self, "targets", y)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def take(self, index) -> "Dataset":
        return Dataset(self.inputs[index], self.targets[index])


def _vocabulary(model) -> int | None:
    """The vocabulary size of a model whose embedding gathers rows of a token table
    `word[ids]` (`TokenEmbedding`, GPT-2's and BERT's embeddings), else None."""
    from ..architectures._model import BertEmbeddings, GPT2Embeddings
    from ._models import TokenEmbedding

    embedding = getattr(model, "embedding", None)
    if isinstance(embedding, (TokenEmbedding, GPT2Embeddings, BertEmbeddings)):
        return int(embedding.word.shape[0])
    return None


def _first(bad: np.ndarray) -> tuple[str, tuple]:
    """`"[i, j]"` of the first True entry of `bad` and that index."""
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    return "[" + ", ".join(map(str, index)) + "]", index


def check_data(
    model, data, name: str = "data", *, labels: bool = True, augment=None, batch_size: int = 1
) -> None:
    r"""Refuse data the model cannot train or be evaluated on, before any compute: one
    `TypeError` / `ValueError` naming `name` (`data`, `eval_data`), the offending value and the
    index of an example holding it.

    - Token inputs (a model whose embedding gathers `word[ids]`, vocabulary `V`): integer ids
      in `[0, V)`. The gather would otherwise clamp an out-of-range id without a word.
    - The model must accept a batch of `batch_size` inputs (after `augment(key, inputs)` if
      given); its output per example, `(C,)` or `(n, C)`, is found by `jax.eval_shape` (shapes
      only) and `C` is its number of classes.
    - With `labels` (integer class labels, as `CrossEntropy` and `evaluate` take): an integer
      dtype; one label per example shaped `(N,)` for outputs `(C,)`, one per position shaped
      `(N, n)` for outputs `(n, C)`; values in `[0, C)`. A per-position target `< 0` marks an
      ignored position (e.g. a prompt; the loss and the accuracy skip it), so any negative value
      is accepted there; a single label per example has no such convention (the loss would read
      `-1` as class `C − 1`) and must lie in `[0, C)`.
    """
    x, y = data.inputs, data.targets
    vocab = _vocabulary(model)
    if vocab is not None:
        if not np.issubdtype(x.dtype, np.integer):
            raise TypeError(
                f"{name}: inputs have dtype {x.dtype}; this model embeds token ids, so they must "
                f"be integers in [0, {vocab}) (cast with .astype(np.int32))."
            )
        bad = (x < 0) | (x >= vocab)
        if bad.any():
            where, index = _first(bad)
            raise ValueError(
                f"{name}: inputs{where} = {x[index]} is not a token id of the model's vocabulary "
                f"of {vocab}: ids must be in [0, {vocab}) ({int(bad.sum())} of {x.size} ids are "
                "out of range)."
            )

    def forward(xs):
        if augment is not None:
            xs = augment(jax.random.key(0), xs)
        return jax.vmap(model)(xs)

    spec = jax.ShapeDtypeStruct((batch_size, *x.shape[1:]), x.dtype)
    try:
        out = eqx.filter_eval_shape(forward, spec)
    except Exception as err:  # any failure to trace the model: name the data it was given
        raise ValueError(
            f"{name}: the model cannot take a batch of inputs of shape {spec.shape} "
            f"({x.dtype}){' after augment' if augment is not None else ''}: "
            f"{type(err).__name__}: {err}"
        ) from err
    if not labels:
        return
    if not (isinstance(out, jax.ShapeDtypeStruct) and len(out.shape) >= 2):
        raise ValueError(
            f"{name}: integer class labels need logits of shape (C,) or (n, C) per example; the "
            f"model returns {out!r} for a batch."
        )
    num_classes, per_example = out.shape[-1], tuple(out.shape[1:-1])
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(
            f"{name}: targets have dtype {y.dtype}; they must be integer class labels in "
            f"[0, {num_classes}) (cast with .astype(np.int32))."
        )
    if tuple(y.shape[1:]) != per_example:
        expected = (len(y), *per_example)
        hint = (
            f"; pass shape {expected} (e.g. targets.reshape({', '.join(map(str, expected))}))"
            if tuple(y.shape[1:]) == (*per_example, 1)
            else ""
        )
        raise ValueError(
            f"{name}: targets have shape {y.shape}; the model's output per example is "
            f"{tuple(out.shape[1:])}, so the targets must have shape {expected}{hint}."
        )
    sequence = bool(per_example)
    bad = (y >= num_classes) if sequence else (y < 0) | (y >= num_classes)
    if bad.any():
        where, index = _first(bad)
        rule = (
            f"in [0, {num_classes}), or negative to ignore a position"
            if sequence
            else f"in [0, {num_classes})"
        )
        raise ValueError(
            f"{name}: targets{where} = {y[index]} is not a class of the model, whose output has "
            f"{num_classes} classes: labels must be {rule} ({int(bad.sum())} of {y.size} targets "
            "are out of range)."
        )


def check_batch_size(batch_size, num_examples: int, name: str = "batch_size") -> int:
    positive_int(name, batch_size)
    if batch_size > num_examples:
        raise ValueError(
            f"{name}={batch_size} is larger than the training data ({num_examples} examples); "
            f"choose {name} <= {num_examples}."
        )
    return int(batch_size)


def batch_indices(seed: int, step: int, num_examples: int, batch_size: int) -> np.ndarray:
    """The example indices of step `step`'s batch.

    Epoch `e = step // (num_examples // batch_size)` visits a permutation drawn from
    `numpy.random.default_rng([seed, e])`, in consecutive blocks of `batch_size` (the last
    incomplete block is dropped).
    """
    per_epoch = num_examples // batch_size
    epoch, within = divmod(int(step), per_epoch)
    order = np.random.default_rng([int(seed), epoch]).permutation(num_examples)
    return order[within * batch_size : (within + 1) * batch_size]


def even_batches(num_examples: int, batch_size: int):
    """Cut `range(num_examples)` into the fewest consecutive batches of at most `batch_size`,
    of near-equal length, each padded to the longest by repeating its last index: every batch
    has one shape, so a jitted function of a batch compiles once (450 held-out images in
    batches of 256 are two batches of 225, not 256 and 194).

    **Yields:** `(indices, length)`: the batch's padded indices and how many of them are real
    (keep the first `length` outputs)."""
    count = -(-int(num_examples) // int(batch_size))
    size = -(-int(num_examples) // count)
    for start in range(0, num_examples, size):
        stop = min(start + size, num_examples)
        indices = np.arange(start, start + size)
        yield np.minimum(indices, stop - 1), stop - start
