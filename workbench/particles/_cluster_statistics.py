"""Statistics of the sweeps: the clustered-pair fraction `F_δ` (`fraction_clustered`) of a
configuration, from its Gram matrix or its rows, and the per-start moments (mean, standard error)
that `phase_diagram` accumulates chunk by chunk on the host."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._types import Tokens

Gram = Float[Array, "n n"]


def _at_least(a, b):
    """`1.0` where `a ≥ b` and `0.0` where `a < b`, exactly, with arithmetic only.

    `fl(a − b) ≥ 0` iff `a ≥ b` (rounding is monotone; `fl(a − b) = 0` iff `a = b`), so
    `s = sign(a − b) ∈ {−1, 0, 1}`, and `sign(2s + 1)` maps it to `{−1, 1, 1}`. (NaN gives NaN.)
    """
    s = jnp.sign(a - b)
    return (jnp.sign(2 * s + 1) + 1) * 0.5


def _pair_fraction(g: Gram, delta) -> Float[Array, ""]:
    """`fraction_clustered` from a Gram matrix: the strict upper triangle `i < j`."""
    n = g.shape[-1]
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    hits = jnp.sum(jnp.where(upper, g >= 1.0 - delta, False), axis=(-2, -1))
    return hits.astype(g.dtype) / (n * (n - 1) // 2)


def _pair_fraction_of_rows(x: Tokens, delta) -> Float[Array, ""]:
    """`fraction_clustered` of the rows of `x`: `_pair_fraction(x xᵀ, delta)`, the same count.

    Written as a masked sum of `_at_least` instead of a boolean count: on XLA:CPU the product
    `x xᵀ`, the test and the sum then form one fused library kernel, while a comparison splits
    them into separate kernels (~25 % of the phase-diagram kernel; benchmarks/phase_kernel.py).
    """
    n = x.shape[-2]
    upper = np.triu(np.ones((n, n), dtype=x.dtype), k=1)
    hits = jnp.sum(_at_least(x @ x.T, 1.0 - delta) * upper, axis=(-2, -1))
    return hits / (n * (n - 1) // 2)


class _StartMoments:
    """Running sums over the starts of the statistic `(B, T)` (and optionally every start's value
    `(B, S, T)`), filled block by block; `mean_sem()` gives the mean and its standard error."""

    def __init__(self, num_betas: int, num_starts: int, num_times: int, per_start: bool):
        self.num_starts = num_starts
        self.sums = np.zeros((num_betas, num_times))
        self.squares = np.zeros((num_betas, num_times))
        self.every = np.zeros((num_betas, num_starts, num_times)) if per_start else None

    def add(self, rows: slice, cols: slice, values: np.ndarray) -> None:
        """The values `(len(rows), len(cols), T)` of the β `rows` and the start `cols`."""
        self.sums[rows] += values.sum(axis=1)
        self.squares[rows] += (values**2).sum(axis=1)
        if self.every is not None:
            self.every[rows, cols] = values

    def mean_sem(self) -> tuple[np.ndarray, np.ndarray]:
        """The mean over starts and its standard error (sample std / sqrt(S); 0 when S = 1)."""
        num_starts = self.num_starts
        mean = self.sums / num_starts
        if num_starts > 1:
            var = np.maximum(self.squares - num_starts * mean**2, 0.0) / (num_starts - 1)
            sem = np.sqrt(var / num_starts)
        else:
            sem = np.zeros_like(mean)
        return mean, sem
