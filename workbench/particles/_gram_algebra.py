r"""Gram algebra of the SA/USA step with `Q = K = V = I`: the velocity rows are `Ã X` with a
matrix `Ã` that depends on `G = X Xᵀ` only, so a projected Runge–Kutta or geodesic step is
`X⁺ = D M X` and `G⁺ = D M G Mᵀ D` (the derivation is in `GramForm`). Used by `GramForm` (on `G`),
and by the row forms for their identity-matrix Euler step (`_euler_rows`, on `X`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._types import Tokens
from ._cluster_statistics import Gram
from ._dynamics import SA
from ._integrators import (
    AbstractProjectedRK,
    AbstractSphereIntegrator,
    GeodesicEuler,
    ProjectedEuler,
)
from ._sweep_checks import _DYNAMICS


class _Beta(NamedTuple):
    """β with `shift = |β|`, computed once before the time loop: an `abs` (or `max(β, −β)`) of a
    traced β inside the loop body keeps XLA:CPU from fusing the step into one library kernel
    (measured ~1.5× slower per step)."""

    value: Array
    shift: Array


def _as_beta(beta) -> _Beta:
    return beta if isinstance(beta, _Beta) else _Beta(beta, jnp.abs(beta))


def _weights_scaled(g: Gram, beta, normalized: bool):
    """`E = exp(β G − |β|)` and the row normalizers `z` (SA: row sums; USA: `n e^{−|β|}`).
    `beta`: a scalar or a `_Beta`."""
    beta, shift = _as_beta(beta)
    e = jnp.exp(beta * g - shift)
    if normalized:
        z = jnp.sum(e, axis=-1)
    else:
        z = jnp.broadcast_to(g.shape[-1] * jnp.exp(-shift), g.shape[:-1])
    return e, z


def _velocity_matrix(g: Gram, beta, normalized: bool) -> Gram:
    """`Ã = A − diag(c)`: the velocity rows are `Ã Y` for points `Y` with Gram matrix `g`."""
    e, z = _weights_scaled(g, beta, normalized)
    a = e / z[..., :, None]
    c = jnp.sum(a * g, axis=-1)
    return a - jnp.eye(g.shape[-1], dtype=g.dtype) * c[..., :, None]


def _renormalize(h: Gram) -> Gram:
    """`D h D` with `D = diag(h_ii^{-1/2})`: the Gram matrix of the row-normalized points."""
    r = jax.lax.rsqrt(jnp.diagonal(h, axis1=-2, axis2=-1))
    return h * r[..., :, None] * r[..., None, :]


def _congruence(m: Gram, g: Gram) -> Gram:
    return (m @ g) @ jnp.swapaxes(m, -1, -2)


def _gram_euler(g: Gram, beta, dt, normalized: bool) -> Gram:
    # M scaled row-wise by z/dt (cancels in the renormalization): E + diag(z/dt − e).
    e, z = _weights_scaled(g, beta, normalized)
    diag = z / dt - jnp.sum(e * g, axis=-1)
    m = e + jnp.eye(g.shape[-1], dtype=g.dtype) * diag[..., :, None]
    return _renormalize(_congruence(m, g))


def _gram_rk(tableau, g: Gram, beta, dt, normalized: bool) -> Gram:
    a, b = tableau.a_matrix.tolist(), [float(x) for x in tableau.b]
    eye = jnp.eye(g.shape[-1], dtype=g.dtype)
    ls = []  # stage velocities K_k = L_k X
    for k in range(tableau.num_stages):
        terms = [(a[k][j], ls[j]) for j in range(k) if a[k][j] != 0]
        if not terms:  # the stage point is X itself
            ls.append(_velocity_matrix(g, beta, normalized))
            continue
        nk = eye + dt * sum(akj * lj for akj, lj in terms)
        ls.append(_velocity_matrix(_congruence(nk, g), beta, normalized) @ nk)
    m = eye + dt * sum(bk * lk for bk, lk in zip(b, ls) if bk != 0)
    return _renormalize(_congruence(m, g))


def _gram_geodesic(g: Gram, beta, dt, normalized: bool) -> Gram:
    at = _velocity_matrix(g, beta, normalized)
    sq = jnp.maximum(jnp.sum((at @ g) * at, axis=-1), 0.0)  # ‖v_i‖² = (Ã G Ãᵀ)_ii
    angle = jnp.sqrt(sq) * dt
    eye = jnp.eye(g.shape[-1], dtype=g.dtype)
    m = eye * jnp.cos(angle)[..., :, None] + (dt * jnp.sinc(angle / jnp.pi))[..., :, None] * at
    return _renormalize(_congruence(m, g))


def _gram_advance(integrator: AbstractSphereIntegrator, normalized: bool):
    """The Gram-form step `(g, beta, dt) -> g⁺` of `integrator` (dispatch by type, trace time)."""
    if isinstance(integrator, ProjectedEuler):
        return lambda g, beta, dt: _gram_euler(g, beta, dt, normalized)
    if isinstance(integrator, AbstractProjectedRK):
        tableau = integrator.method.tableau
        return lambda g, beta, dt: _gram_rk(tableau, g, beta, dt, normalized)
    if isinstance(integrator, GeodesicEuler):
        return lambda g, beta, dt: _gram_geodesic(g, beta, dt, normalized)
    raise ValueError(
        f"gram_step: {type(integrator).__name__} has no Gram form; use ProjectedEuler, "
        "ProjectedRK2, ProjectedRK4 (any AbstractProjectedRK) or GeodesicEuler."
    )


def _gram_supported(integrator: AbstractSphereIntegrator) -> bool:
    return isinstance(integrator, (AbstractProjectedRK, GeodesicEuler))


def gram_step(
    g: Gram,
    beta,
    dt,
    *,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    dynamics: type = SA,
) -> Gram:
    r"""One step of a projected integrator written on the Gram matrix (`Q = K = V = I`).

    If `g = X Xᵀ` for points `X` on the sphere, the result is `X⁺ X⁺ᵀ` with
    `X⁺ = integrator.step(dynamics(beta), X, dt)` (exactly in exact arithmetic; see `GramForm` for
    the algebra), at `O(n³)` cost independent of `d`. Batch with `jax.vmap`.

    **Arguments:**

    - `g`: the Gram matrix `(n, n)` of points on the sphere (unit diagonal).
    - `beta`: the inverse temperature (scalar, may be traced).
    - `dt`: the step `> 0` (may be traced).
    - `integrator`: `ProjectedEuler()`, `ProjectedRK2()`, `ProjectedRK4()`, any
      `AbstractProjectedRK`, or `GeodesicEuler()`.
    - `dynamics`: the class `SA` or `USA`.

    **Returns:** the next Gram matrix `(n, n)`.

    **Example:** `g1 = gram_step(x @ x.T, 4.0, 0.1)` equals
    `y @ y.T` with `y = ProjectedEuler().step(SA(4.0), x, 0.1)` to ~1e-15 in float64.
    """
    if dynamics not in _DYNAMICS:
        raise ValueError(f"gram_step: dynamics={dynamics!r}; pass the class SA or USA.")
    g = jnp.asarray(g)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ValueError(f"gram_step: g must be a square (n, n) Gram matrix; got shape {g.shape}.")
    advance = _gram_advance(integrator, dynamics is SA)
    return advance(g, _as_beta(jnp.asarray(beta, g.dtype)), jnp.asarray(dt, g.dtype))


def _euler_rows(x: Tokens, beta, dt, normalized: bool) -> Tokens:
    """`ProjectedEuler` for `Q = K = V = I`: `normalize(M X)` with the row-scaled
    `M = E + diag(z/dt − e)` of `GramForm` (equal to `x + dt v` up to a positive factor per row)."""
    # (Carrying x xᵀ in the loop state to reuse it for the statistic doubles the time on XLA:CPU.)
    g = x @ x.T
    e, z = _weights_scaled(g, beta, normalized)
    diag = z / dt - jnp.sum(e * g, axis=-1)
    y = e @ x + diag[:, None] * x
    return y * jax.lax.rsqrt(jnp.sum(y * y, axis=-1, keepdims=True))
