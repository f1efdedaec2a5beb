"""Datasets and the seeded minibatch order: which examples make step `s`'s batch is a pure
function of `(seed, s)`, so a resumed run sees exactly the batches of an uninterrupted one."""

import dataclasses

import numpy as np

__all__ = ["Dataset", "batch_indices"]


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


def check_batch_size(batch_size, num_examples: int, name: str = "batch_size") -> int:
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or batch_size < 1
    ):
        raise ValueError(f"{name}={batch_size!r} must be a positive integer.")
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
