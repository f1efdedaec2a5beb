"""Input validation shared by the sweep entry points (`phase_diagram`, `clustering_curve`,
`gram_trajectory`, `random_starts`, `gram_step`): each check raises `ValueError` naming its
caller (`owner`) and returns the normalized value.

**How a sweep reads its dynamics object** (`_sweep_dynamics`): an `SA` / `USA` instance with a
scalar β is one dynamics (B = 1); one whose β has shape `(B,)` is a batch over β, as
`eqx.filter_vmap(SA)(betas)` builds it. Such a batch carries its matrices either with the batch
axis — `eqx.filter_vmap(lambda b: SA(b, Q=Q, K=K, V=V))(betas)` broadcasts every array leaf, so
`Q` becomes `(B, d_k, d)` — or without it (a batch built with `out_axes`, or `eqx.tree_at` on the
β leaf). A matrix is read as carrying the batch axis when it has at least 3 axes and its leading
axis has length B (the `filter_vmap` convention; a 2-D matrix, or a head axis of another length,
is shared as it is). A sweep shares the matrices across β: a batched matrix must be the same for
every β, and its first entry is used. (A matrix with `h = B` heads and no batch axis is read as
batched: give such matrices the batch axis, as `filter_vmap` does.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import number_in_range, positive_int
from ._dynamics import _MATRIX_NAMES, SA, USA
from ._integrators import AbstractSphereIntegrator
from ._simulate import _sphere_tolerance

_DYNAMICS = (SA, USA)
"""The constructors of the attention dynamics (the class `SA`; `USA` builds an `SA`)."""


def _check_dynamics_type(owner: str, dynamics) -> None:
    """An `SA` instance (`SA(...)` or `USA(...)`; not a constructor, not another dynamics)."""
    if isinstance(dynamics, type) or dynamics in _DYNAMICS:
        raise ValueError(
            f"{owner}: dynamics={dynamics.__name__} is a constructor; pass an instance, e.g. "
            f"{dynamics.__name__}(beta=1.0), or a batch over β, eqx.filter_vmap("
            f"{dynamics.__name__})(betas)."
        )
    if not isinstance(dynamics, SA):
        raise ValueError(
            f"{owner}: dynamics of type {type(dynamics).__name__} is not supported; valid "
            "choices: a wb.particles.SA or wb.particles.USA instance (one β) or a batch of them "
            "over β (eqx.filter_vmap(SA)(betas))."
        )


def _rebuilt(owner: str, cls: type, beta, matrices: dict, repulsive: bool, d: int | None):
    """`cls(beta, **matrices, repulsive=...)` (its `__check_init__` checks the matrices), checked
    against `d`; errors are prefixed by `owner`."""
    try:
        dynamics = cls(beta, **matrices, repulsive=repulsive)
        if d is not None:
            dynamics.check_dimension(d)
    except ValueError as e:
        raise ValueError(f"{owner}: {e}") from None
    return dynamics


def _sweep_dynamics(owner: str, dynamics) -> tuple[SA, np.ndarray]:
    """The sweep's dynamics: one `SA` / `USA` or a batch over β (module docstring).

    **Returns:** `(member, betas)`: `member` a dynamics of the same type with the shared matrices
    (and β = 0, a placeholder; check it against `d` with `_check_dimension`), `betas` the `(B,)`
    inverse temperatures (B = 1 for one instance).
    """
    _check_dynamics_type(owner, dynamics)
    cls = SA if dynamics.normalized else USA  # the constructor, for messages and the rebuild
    leaves = [dynamics.beta] + [getattr(dynamics, name) for name in _MATRIX_NAMES]
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        raise ValueError(
            f"{owner}: the dynamics must be concrete, not traced (do not jit {owner}; build the "
            f"batch outside, e.g. eqx.filter_vmap({cls.__name__})(betas))."
        )
    beta = np.asarray(dynamics.beta)
    if beta.ndim > 1:
        raise ValueError(
            f"{owner}: dynamics.beta has shape {beta.shape}; pass one {cls.__name__} (β a "
            f"scalar) or a batch over β (β of shape (B,), e.g. eqx.filter_vmap({cls.__name__})"
            "(betas))."
        )
    betas = _check_betas(owner, np.atleast_1d(beta), name="dynamics.beta")
    matrices = {}
    for name in _MATRIX_NAMES:
        m = getattr(dynamics, name)
        if m is not None and beta.ndim == 1 and m.ndim >= 3 and m.shape[0] == betas.size:
            if not bool(jnp.all(m == m[:1])):
                raise ValueError(
                    f"{owner}: dynamics.{name} has shape {tuple(m.shape)}, read as one {name} per "
                    f"β (leading axis B = {betas.size}), and it differs across the batch; a sweep "
                    "shares Q, K, V across β: give every β the same matrices, e.g. "
                    f"eqx.filter_vmap(lambda b: {cls.__name__}(b, Q=Q, K=K, V=V))(betas). (With "
                    f"{betas.size} heads and no batch axis the head axis cannot be told from the "
                    "batch axis: give the matrices the batch axis, as eqx.filter_vmap does.)"
                )
            m = m[0]
        matrices[name] = m
    return _rebuilt(owner, cls, 0.0, matrices, dynamics.repulsive, None), betas


def _check_dimension(owner: str, dynamics: SA, d: int) -> None:
    try:
        dynamics.check_dimension(d)
    except ValueError as e:
        raise ValueError(f"{owner}: {e}") from None


def _single_dynamics(owner: str, dynamics, d: int) -> SA:
    """One `SA` / `USA` (β a scalar, possibly traced) whose matrices fit `d`."""
    _check_dynamics_type(owner, dynamics)
    if jnp.ndim(dynamics.beta) != 0:
        raise ValueError(
            f"{owner}: dynamics.beta must be a scalar (one trajectory); got shape "
            f"{jnp.shape(dynamics.beta)}. For many β use phase_diagram, or jax.vmap over the "
            "β leaf."
        )
    _check_dimension(owner, dynamics, d)
    return dynamics


def _check_integrator(owner: str, integrator) -> None:
    if not isinstance(integrator, AbstractSphereIntegrator):
        raise ValueError(
            f"{owner}: integrator={integrator!r} is not a sphere integrator; pass e.g. "
            "ProjectedEuler(), ProjectedRK4() or GeodesicEuler()."
        )


def _check_delta(owner: str, delta) -> float:
    return number_in_range(
        "delta",
        delta,
        0,
        2,
        include_high=True,
        owner=owner,
        arrays=True,
        hint="pairs with ⟨x_i, x_j⟩ ≥ 1 − δ",
    )


def _check_starts(owner: str, starts, *, batched: bool):
    if isinstance(starts, jax.core.Tracer):
        raise ValueError(f"{owner}: starts must be concrete (a NumPy or JAX array), not traced.")
    x = jnp.asarray(starts)
    want = "(S, n, d)" if batched else "(n, d)"
    if x.ndim != (3 if batched else 2):
        hint = " (one start: starts[None])" if batched and x.ndim == 2 else ""
        raise ValueError(f"{owner}: starts must have shape {want}; got {x.shape}{hint}.")
    n, d = x.shape[-2:]
    if n < 2:
        raise ValueError(f"{owner}: n = {n} particle(s); the statistic needs pairs, n >= 2.")
    if d < 2:
        raise ValueError(f"{owner}: d = {d}; the sphere S^(d-1) needs d >= 2.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{owner}: starts must be a floating array; got dtype {x.dtype}.")
    tol = _sphere_tolerance(x.dtype)
    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=-1)
    dev = np.where(np.isfinite(norms), np.abs(norms - 1.0), np.inf)
    if not np.all(dev <= tol):
        where = np.unravel_index(int(np.argmax(dev)), dev.shape)
        raise ValueError(
            f"{owner}: the rows of starts must be unit vectors (| ‖x_i‖ − 1 | <= {tol:g} for "
            f"{x.dtype}); row {tuple(int(i) for i in where)} has norm {norms[where]!r}. Normalize, "
            "e.g. x / jnp.linalg.norm(x, axis=-1, keepdims=True), or use random_starts."
        )
    return x


def _check_optional_count(owner: str, name: str, value) -> None:
    """`None` or a positive integer (`chunk_size`, `in_flight`)."""
    positive_int(name, value, owner=owner, allow_none=True)


def _check_betas(owner: str, betas, name: str = "betas") -> np.ndarray:
    """A non-empty 1-D array of finite real inverse temperatures, as a NumPy array."""
    b = np.asarray(betas)
    if b.ndim != 1 or b.size == 0:
        raise ValueError(
            f"{owner}: {name} must be a non-empty 1-D array of inverse temperatures, shape (B,); "
            f"got shape {b.shape}."
        )
    if not np.issubdtype(b.dtype, np.number) or np.iscomplexobj(b) or not np.all(np.isfinite(b)):
        raise ValueError(f"{owner}: {name} must be finite real numbers; got {b!r}.")
    return b
