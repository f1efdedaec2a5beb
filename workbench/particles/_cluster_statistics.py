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
    `(B, S, T)`), filled block by block; `mean_sem()` gives the mean and its standard error.

    The statistic is a count of pairs over `pairs = n(n−1)/2`, so the sums are kept as exact
    integer counts: the mean and s.e.m. do not depend on how the starts were cut into blocks
    (one device or eight, any chunk size), and the variance has no cancellation error.
    """

    def __init__(
        self, num_betas: int, num_starts: int, num_times: int, per_start: bool, pairs: int
    ):
        self.num_starts = num_starts
        self.pairs = pairs
        self.sums = np.zeros((num_betas, num_times), dtype=np.int64)
        self.squares = np.zeros((num_betas, num_times), dtype=np.int64)
        self.every = np.zeros((num_betas, num_starts, num_times)) if per_start else None

    def add(self, rows: slice, cols: slice, values: np.ndarray) -> None:
        """The values `(len(rows), len(cols), T)` of the β `rows` and the start `cols`."""
        scaled = np.asarray(values, np.float64) * self.pairs
        counts = np.rint(scaled)
        if counts.size and np.max(np.abs(scaled - counts)) > 1e-3:
            raise RuntimeError("phase_diagram: a statistic is not a count of pairs over n(n-1)/2.")
        counts = counts.astype(np.int64)
        self.sums[rows] += counts.sum(axis=1)
        self.squares[rows] += (counts**2).sum(axis=1)
        if self.every is not None:
            self.every[rows, cols] = values

    def mean_sem(self) -> tuple[np.ndarray, np.ndarray]:
        """The mean over starts and its standard error (sample std / sqrt(S); 0 when S = 1)."""
        S, P = self.num_starts, self.pairs
        mean = self.sums / (S * P)
        if S > 1:
            # S² P² var = (S Σc² − (Σc)²) · S / (S − 1), in Python integers (no overflow).
            sums = self.sums.astype(object)
            numerator = (S * self.squares.astype(object) - sums * sums).astype(np.float64)
            var = numerator / (S * (S - 1)) / P**2
            sem = np.sqrt(np.maximum(var, 0.0) / S)
        else:
            sem = np.zeros_like(mean)
        return mean, sem
