r"""Clustering diagnostics for particles on the sphere (docs/particles.md).

Every function here is a pure function of arrays. One configuration is `x` of shape `(n, d)` whose
rows are unit vectors $x_i \in S^{d-1}$ (assumed, not checked: the diagnostics read only the Gram
matrix $G_{ij} = \langle x_i, x_j\rangle$). A trajectory `(T, n, d)` or a batch of starts is handled
with `jax.vmap`; thresholds are plain keyword arguments, usually Python floats.

- `gram`, `pair_inner_products`, `inner_product_histogram`: the raw statistics (Fig. 1 of the paper
  histograms the pairwise inner products of hidden states layer by layer).
- `fraction_clustered`: the phase-diagram statistic of Fig. 3.
- `cluster_count_rank`: the authors' cluster count (rank of the thresholded Gram matrix);
  `cluster_count` / `cluster_labels`: connected components of the same graph.

Summaries of these statistics over time (plateaus, time to one cluster, exponential rates) are in
`_time_series.py`.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .._checks import number_in_range, positive_int
from .._types import Tokens

__all__ = [
    "cluster_count",
    "cluster_count_rank",
    "cluster_labels",
    "fraction_clustered",
    "gram",
    "inner_product_histogram",
    "pair_inner_products",
]


# ----------------------------------------------------------------------------------------------
# checks (trace time: shapes and concrete Python thresholds only)


def _check_config(x, name: str = "x", min_n: int = 1) -> None:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(
            f"{name} must be one configuration of shape (n, d) (rows = particles on the sphere); "
            f"got shape {shape}. Batch over trajectories or starts with jax.vmap."
        )
    if shape[0] < min_n:
        raise ValueError(
            f"{name} has n={shape[0]} particles; this statistic needs at least {min_n} "
            "(it is defined over pairs i != j)."
        )


def _check_threshold(name: str, value, *, upper: float = 2.0) -> None:
    """Check a threshold when it is a concrete number; traced values pass unchecked."""
    if isinstance(value, bool | int | float | np.bool_ | np.integer | np.floating):
        number_in_range(
            name,
            value,
            0,
            upper,
            include_high=True,
            hint=f"pairs count as close when <x_i, x_j> exceeds 1 - {name}, and inner products "
            "of unit vectors lie in [-1, 1]",
        )


def _check_series(ts, counts) -> None:
    ts_shape, c_shape = getattr(ts, "shape", None), getattr(counts, "shape", None)
    if ts_shape is None or len(ts_shape) != 1 or ts_shape[0] < 1:
        raise ValueError(f"ts must be a non-empty 1-D array of times; got shape {ts_shape}.")
    if c_shape != ts_shape:
        raise ValueError(
            f"counts has shape {c_shape}; expected {ts_shape}, one cluster count per time in ts. "
            "Compute counts with jax.vmap(cluster_count)(xs) on the saved trajectory."
        )


# ----------------------------------------------------------------------------------------------
# raw statistics


def gram(x: Tokens) -> Float[Array, "n n"]:
    r"""The Gram matrix $G_{ij} = \langle x_i, x_j\rangle$ of one configuration.

    **Arguments:**

    - `x`: particles, shape `(n, d)`, rows of unit norm.

    **Returns:**

    The symmetric `(n, n)` matrix `x @ x.T` (unit diagonal on the sphere).
    """
    _check_config(x)
    return x @ x.T


def pair_inner_products(x: Tokens) -> Float[Array, " pairs"]:
    r"""The $n(n-1)/2$ inner products $\langle x_i, x_j\rangle$ over pairs $i < j$.

    The pairs are in row-major order of the strict upper triangle, `(0, 1), (0, 2), …, (0, n-1),
    (1, 2), …` (NumPy's `triu_indices(n, 1)`); the index set depends only on the static `n`, so the
    function is jit- and vmap-compatible.

    **Arguments:**

    - `x`: particles, shape `(n, d)`.

    **Returns:**

    Shape `(n (n - 1) / 2,)`.
    """
    _check_config(x)
    n = x.shape[0]
    rows, cols = np.triu_indices(n, k=1)
    return jnp.einsum("pd,pd->p", x[rows], x[cols])


def inner_product_histogram(
    x: Tokens, bins: int = 50
) -> tuple[Int[Array, " bins"], Float[Array, " bins+1"]]:
    r"""Histogram of the pairwise inner products $\langle x_i, x_j\rangle$, $i \ne j$, on $[-1, 1]$.

    The statistic of Fig. 1 of the paper (mass piling up at 1 as depth grows). Ordered pairs are
    counted, so the counts sum to $n(n-1)$ and `counts / (n (n - 1))` is the empirical distribution
    that `fraction_clustered` integrates. Bins are `bins` equal intervals of $[-1, 1]$, half-open
    `[e_k, e_{k+1})` except the last, which is closed (as `numpy.histogram`). Unlike NumPy, values
    outside $[-1, 1]$ by rounding (e.g. $1 + 10^{-16}$) are put in the end bins rather than dropped.

    **Arguments:**

    - `x`: particles, shape `(n, d)`.
    - `bins`: number of bins (a static positive integer).

    **Returns:**

    `(counts, edges)`: integer counts of shape `(bins,)` and the `bins + 1` edges.
    """
    _check_config(x)
    bins = positive_int("bins", bins, hint="the number of equal bins")
    v = pair_inner_products(x)
    idx = jnp.clip(jnp.floor((v + 1.0) * (bins / 2.0)).astype(jnp.int32), 0, bins - 1)
    # Each unordered pair i < j stands for the two ordered pairs (i, j) and (j, i).
    counts = jnp.zeros((bins,), dtype=jnp.int32).at[idx].add(2)
    edges = jnp.linspace(-1.0, 1.0, bins + 1, dtype=x.dtype)
    return counts, edges


# ----------------------------------------------------------------------------------------------
# clustering statistics


def fraction_clustered(x: Tokens, delta: float = 1e-3) -> Float[Array, ""]:
    r"""Fraction of pairs $i \ne j$ with $\langle x_i, x_j\rangle \ge 1 - \delta$ (Fig. 3's statistic).

    $$F_\delta(x) = \frac{1}{n(n-1)}\,\#\{(i, j) : i \ne j,\ \langle x_i, x_j\rangle \ge 1 - \delta\}.$$

    $F = 1$ when all particles sit in one cluster of angular radius about $\sqrt{2\delta}$; for $k$
    exact clusters of sizes $s_1, …, s_k$, $F = \sum_i s_i(s_i - 1) / (n(n-1))$. The paper's phase
    diagram (docs/particles.md) averages this over random starts at $t$, with $\delta = 10^{-3}$.

    **Arguments:**

    - `x`: particles, shape `(n, d)`, $n \ge 2$.
    - `delta`: the closeness tolerance $\delta \in (0, 2]$.

    **Returns:**

    A scalar in $[0, 1]$.
    """
    _check_config(x, min_n=2)
    _check_threshold("delta", delta)
    v = pair_inner_products(x)
    return jnp.sum(v >= 1.0 - delta, dtype=x.dtype) / v.shape[0]


def _adjacency(x: Tokens, threshold) -> Bool[Array, "n n"]:
    # The diagonal is <x_i, x_i> = 1 > 1 - threshold: every particle is adjacent to itself.
    return gram(x) > 1.0 - threshold


def cluster_count_rank(x: Tokens, threshold: float = 1e-4) -> Int[Array, ""]:
    r"""The authors' cluster count: the rank of the thresholded Gram matrix (docs/particles.md).

    $$A_{ij} = \mathbf 1[\langle x_i, x_j\rangle > 1 - \varepsilon], \qquad
      N_{\rm rank}(x) = \operatorname{rank} A.$$

    **What the rank counts.** Reorder particles by connected component of the graph $A$; then $A$
    is block diagonal, so $\operatorname{rank} A = \sum_c \operatorname{rank} A_c$ and every block
    has rank $\ge 1$ (its diagonal is one). A block has rank one exactly when it is all ones (a rank-one
    0/1 matrix with unit diagonal has $A_{ij}A_{ji} = A_{ii}A_{jj} = 1$). Hence

    - $\operatorname{rank} A \ge$ the number of connected components (`cluster_count`), always;
    - equality holds iff every component is a clique, i.e. closeness is transitive — the case of
      well-separated tight clusters, which is what the authors' count assumes;
    - otherwise the rank is larger: a chain $x_1 \sim x_2 \sim x_3$ with $x_1 \not\sim x_3$ is one
      component but has $\operatorname{rank} A = 3$ (the tridiagonal all-ones $3 \times 3$ matrix is
      invertible). A particle caught between two clusters inflates the count the same way.

    The rank is computed numerically (`jnp.linalg.matrix_rank`, SVD with the default relative
    tolerance), exact for 0/1 matrices of the sizes used here ($n \le$ a few hundred).

    **Arguments:**

    - `x`: particles, shape `(n, d)`.
    - `threshold`: $\varepsilon \in (0, 2]$; the authors use $10^{-4}$.

    **Returns:**

    An integer scalar in $[1, n]$.
    """
    _check_config(x)
    _check_threshold("threshold", threshold)
    a = _adjacency(x, threshold).astype(x.dtype)
    return jnp.linalg.matrix_rank(a)


def cluster_labels(x: Tokens, threshold: float = 1e-4) -> Int[Array, " n"]:
    r"""Connected-component labels of the closeness graph $\langle x_i, x_j\rangle > 1 - \varepsilon$.

    `labels[i]` is the smallest particle index in the component of $i$ (union-find semantics with
    the minimum as representative). Computed by min-label propagation with pointer jumping,

    $$\ell \leftarrow \ell \circ \ell', \qquad \ell'_i = \min_{j:\,A_{ij}} \ell_j,$$

    iterated to a fixed point in a `lax.while_loop`. The iteration keeps $\ell_i \le i$ and inside
    the component of $i$; its fixed points are constant on components, hence the component minimum.
    Each sweep costs $O(n^2)$. Both maps are monotone and the jump only lowers labels, so the loop
    takes no more sweeps than plain propagation (at most the largest component diameter plus one)
    and usually far fewer. Under `vmap` the loop runs
    until every member of the batch has converged (converged members are unchanged by a sweep).

    **Arguments:**

    - `x`: particles, shape `(n, d)`.
    - `threshold`: $\varepsilon \in (0, 2]$.

    **Returns:**

    Integer labels of shape `(n,)`.
    """
    _check_config(x)
    _check_threshold("threshold", threshold)
    return _component_labels(_adjacency(x, threshold))


@jax.jit
def _component_labels(adj: Bool[Array, "n n"]) -> Int[Array, " n"]:
    # Jitted on its own so that eager calls (a study looping over states) compile once per n,
    # not once per call (an eager `while_loop` of fresh closures recompiles every time).
    n = adj.shape[0]

    def sweep(labels):
        propagated = jnp.min(jnp.where(adj, labels[None, :], n), axis=1)
        return propagated[propagated]

    def cond(carry):
        return carry[1]

    def body(carry):
        labels, _ = carry
        new = sweep(labels)
        return new, jnp.any(new != labels)

    labels, _ = jax.lax.while_loop(cond, body, (jnp.arange(n), jnp.asarray(True)))
    return labels


def cluster_count(x: Tokens, threshold: float = 1e-4) -> Int[Array, ""]:
    r"""Number of clusters: connected components of the graph $\langle x_i, x_j\rangle > 1 - \varepsilon$.

    The transitive closure of closeness (single-linkage clustering at angle
    $\arccos(1 - \varepsilon)$). It equals the authors' `cluster_count_rank` when every component is a
    clique and is smaller otherwise (see there); it is the count to prefer when particles are
    still merging, because a chain of nearly-merged particles counts once.

    **Arguments:**

    - `x`: particles, shape `(n, d)`.
    - `threshold`: $\varepsilon \in (0, 2]$; default $10^{-4}$ as the authors' count.

    **Returns:**

    An integer scalar in $[1, n]$.
    """
    labels = cluster_labels(x, threshold)
    return jnp.sum(labels == jnp.arange(x.shape[0]))
