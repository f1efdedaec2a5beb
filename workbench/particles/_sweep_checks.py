"""Input validation shared by the sweep entry points (`phase_diagram`, `clustering_curve`,
`gram_trajectory`, `random_starts`, `gram_step`): each check raises `ValueError` naming its
caller (`owner`) and returns the normalized value."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ._dynamics import SA, USA
from ._integrators import AbstractSphereIntegrator
from ._simulate import _sphere_tolerance

_DYNAMICS = (SA, USA)


def _check_dynamics(owner: str, dynamics) -> None:
    if dynamics not in _DYNAMICS:
        raise ValueError(
            f"{owner}: dynamics={dynamics!r}; pass the class wb.particles.SA or "
            "wb.particles.USA (β comes from the sweep)."
        )


def _check_integrator(owner: str, integrator) -> None:
    if not isinstance(integrator, AbstractSphereIntegrator):
        raise ValueError(
            f"{owner}: integrator={integrator!r} is not a sphere integrator; pass e.g. "
            "ProjectedEuler(), ProjectedRK4() or GeodesicEuler()."
        )


def _check_scalar(owner: str, name: str, value, *, positive: bool) -> float:
    v = np.asarray(value)
    if v.ndim != 0 or not np.issubdtype(v.dtype, np.number) or np.iscomplexobj(v):
        raise ValueError(f"{owner}: {name}={value!r} must be a real scalar.")
    v = float(v)
    if not math.isfinite(v) or (positive and v <= 0):
        raise ValueError(
            f"{owner}: {name}={value!r} must be finite" + (" and > 0." if positive else ".")
        )
    return v


def _check_delta(owner: str, delta) -> float:
    delta = _check_scalar(owner, "delta", delta, positive=True)
    if delta > 2:
        raise ValueError(
            f"{owner}: delta={delta!r} must be in (0, 2] (pairs with ⟨x_i, x_j⟩ ≥ 1 − δ)."
        )
    return delta


def _check_matrices(owner: str, dynamics, d: int, Q, K, V):
    """Build the dynamics once with β = 0: its `__check_init__` checks the shapes."""
    Q, K, V = (None if m is None else jnp.asarray(m) for m in (Q, K, V))
    try:
        dynamics(0.0, Q=Q, K=K, V=V).check_dimension(d)
    except ValueError as e:
        raise ValueError(f"{owner}: {e}") from None
    return Q, K, V


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


def _is_count(value, low: int) -> bool:
    """Whether `value` is a Python or NumPy integer (not a bool) `>= low`."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= low


def _check_optional_count(owner: str, name: str, value) -> None:
    """`None` or a positive integer (`chunk_size`, `in_flight`)."""
    if value is not None and not _is_count(value, 1):
        raise ValueError(f"{owner}: {name}={value!r} must be a positive integer (or None).")


def _check_betas(owner: str, betas) -> np.ndarray:
    """A non-empty 1-D array of finite real inverse temperatures, as a NumPy array."""
    b = np.asarray(betas)
    if b.ndim != 1 or b.size == 0:
        raise ValueError(
            f"{owner}: betas must be a non-empty 1-D array of inverse temperatures, shape (B,); "
            f"got shape {b.shape}."
        )
    if not np.issubdtype(b.dtype, np.number) or np.iscomplexobj(b) or not np.all(np.isfinite(b)):
        raise ValueError(f"{owner}: betas must be finite real numbers; got {b!r}.")
    return b
