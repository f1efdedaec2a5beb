r"""The batched phase-diagram kernel: the clustering statistic of Fig. 3 over β × starts × time.

For inverse temperatures `betas` `(B,)` and random starts `(S, n, d)` on the sphere, every pair
(β, start) is integrated with a fixed-step sphere integrator, and at each saved time the statistic

$$F_\delta(x) = \frac{2}{n(n-1)}\,\#\{i < j : \langle x_i, x_j\rangle \ge 1 - \delta\}$$

(`fraction_clustered`) is recorded; `phase_diagram` returns its mean over starts `(B, T)` (and
optionally every start's value). The trajectories are a `jax.vmap` over β and starts of one
`lax.scan` over blocks of steps between observations, jitted once per shape; the host feeds them
in chunks (bounded memory, a progress bar), dispatched asynchronously.

Three ways to advance a configuration (`form=`), all the same algorithm in exact arithmetic:

- `ParticleForm`: the particles `X` `(n, d)` themselves, with any dynamics matrices `Q, K, V` and
  any sphere integrator: `4 n² d` flops per Euler step (`O(n d²)` more with matrices).
- `ReducedForm` (`Q = K = V = I`): the velocity rows are combinations of the current rows, so the
  particles never leave the span of the start's rows; writing `X = R Uᵀ` with `U` `(d, r)`
  orthonormal, `r = min(n, d)`, the particle form runs on the coordinates `R` `(n, r)`:
  `4 n² r` flops per Euler step, `4 n³` for `d ≥ n`, whatever `d` is. Conditioned like the
  particle form.
- `GramForm` (`Q = K = V = I`): every statistic and update depends on `X` only through
  `G = X Xᵀ`, and a projected Runge–Kutta (or geodesic) step can be advanced exactly on `G`
  (the algebra is in `GramForm`): also `4 n³` per Euler step, but it squares the conditioning
  (like normal equations), see `GramForm`.

`form=None` picks `ReducedForm` when `Q = K = V = I` and `ParticleForm` otherwise. For the
paper's sizes (`n = 32`, `d = 128 … 1024`) the reduced and Gram forms need 4–32× fewer flops than
the particle form.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._progress import Progress
from .._types import Tokens
from ._dynamics import SA, USA
from ._integrators import (
    AbstractProjectedRK,
    AbstractSphereIntegrator,
    GeodesicEuler,
    ProjectedEuler,
)
from ._simulate import _grid_index, _sphere_tolerance

__all__ = [
    "AbstractForm",
    "GramForm",
    "ParticleForm",
    "PhaseDiagram",
    "ReducedForm",
    "clustering_curve",
    "gram_step",
    "gram_trajectory",
    "phase_diagram",
    "random_starts",
]

_DYNAMICS = (SA, USA)
Gram = Float[Array, "n n"]


# ----------------------------------------------------------------------------------------------
# forms (options as objects)


class AbstractForm(eqx.Module):
    """How a sweep advances one configuration: `ReducedForm()`, `GramForm()` or `ParticleForm()`."""


class ParticleForm(AbstractForm):
    r"""Advance the particles `X` `(n, d)` (any dynamics matrices, any sphere integrator,
    multi-head included).

    With `Q = K = V = I` and `ProjectedEuler` the step is written as `x⁺ = normalize(M X)` with
    the row-scaled `M = E + diag(z/dt − e)` of `GramForm` (no softmax division; the scaling cancels
    in the normalization); otherwise it is `integrator.step(dynamics(β, Q=Q, K=K, V=V), X, dt)`.

    **Arguments:**

    - `fuse_qk`: when both `Q` and `K` are 2-D, use the single matrix `W = Kᵀ Q` `(d, d)`, i.e.
      `SA(β, Q=W, K=None, V=V)`: `⟨W x_i, x_j⟩ = ⟨Q x_i, K x_j⟩`, one `X Wᵀ` product per
      evaluation instead of two (exact up to rounding). Default `True`.
    """

    fuse_qk: bool = eqx.field(default=True, static=True)


class ReducedForm(AbstractForm):
    r"""The particle form in an orthonormal basis of the span of the start (`Q = K = V = I` only).

    With identity matrices the velocity rows `Σ_j A_ij x_j − c_i x_i` are combinations of the
    current rows, and so is every Runge–Kutta stage and the renormalization: the rows stay in the
    row space of `X(0)`, of dimension `r ≤ min(n, d)`. With `X(0)ᵀ = U C` (reduced QR, `U`
    `(d, r)` orthonormal) the coordinates `R = Cᵀ = X(0) U` `(n, r)` satisfy `X(t) = R(t) Uᵀ`, and
    `⟨x_i, x_j⟩ = ⟨r_i, r_j⟩`: the dynamics is rotation invariant, so `R` follows the same particle
    system in `R^r`. The kernel runs the particle form on `R` (any sphere integrator): `4 n² r`
    flops per Euler step instead of `4 n² d` (for `n = 32`, `d = 1024`: 32× fewer), with the
    rounding behaviour of the particle form. For `d ≤ n` nothing is reduced (`R = X`, with
    zero columns up to a multiple of 8: exact, and faster on CPU). `phase_diagram` reduces each
    start once, before the sweep over β.
    """


class GramForm(AbstractForm):
    r"""Advance the Gram matrix `G = X Xᵀ` instead of the particles (`Q = K = V = I` only).

    **Why it is exact.** With identity matrices the SA/USA velocity of row `i` is
    `v_i = Σ_j A_ij x_j − c_i x_i` with `A = softmax_rows(β G)` (SA) or `A = exp(β G)/n` (USA) and
    `c_i = ⟨x_i, Σ_j A_ij x_j⟩ = Σ_j A_ij G_ij`: the velocity rows are `Ã X` with
    `Ã = A − diag(c)`, a matrix that depends on `G` only. Hence:

    - *Projected Euler* `x_i⁺ = y_i / ‖y_i‖`, `y = X + dt Ã X = M X` with `M = I + dt Ã`:
      `Y Yᵀ = M G Mᵀ`, `‖y_i‖² = (M G Mᵀ)_ii`, so
      $$G^+ = D\,M G M^\top D,\qquad D = \operatorname{diag}\big((M G M^\top)_{ii}^{-1/2}\big).$$
      Any positive row scaling of `M` cancels in `D`. The kernel uses
      `diag(z/dt) M = E + diag(z/dt − e)` with `E = exp(β G − |β|)` (`|β| ≥ β G_ij`, so no
      overflow), `z_i = Σ_j E_ij` (SA) or `n e^{−|β|}` (USA) and `e_i = Σ_j E_ij G_ij`: no
      division by the softmax denominators is needed.
    - *Projected Runge–Kutta* (any explicit tableau): every stage point is a linear combination of
      the rows of `X`, `Y_k = N_k X` with `N_1 = I`, and the stage velocity there is
      `K_k = Ã(N_k G N_kᵀ) Y_k = L_k X` (the velocity formula off the sphere is the same smooth
      formula: `A`, `c` are computed from the stage Gram matrix `G_k = N_k G N_kᵀ`). So
      `N_k = I + dt Σ_{l<k} a_kl L_l`, `L_k = Ã(G_k) N_k`, `M = I + dt Σ_k b_k L_k`, and `G⁺` is
      as for Euler.
    - *Geodesic Euler*: `x_i⁺ = cos(‖v_i‖dt) x_i + dt sinc(‖v_i‖dt/π) v_i` with
      `‖v_i‖² = (Ã G Ãᵀ)_ii`: again `M X` with `M = diag(cos) + diag(dt sinc) Ã`, then `D`.

    **Cost.** Euler: one `n × n` exponential and two `n × n × n` products (`4 n³` flops) per step,
    independent of `d`, like `ReducedForm`; RK4 needs 14 products (`28 n³` flops) against
    `16 n³` for `ReducedForm`.

    **Conditioning.** Rounding errors of size `ε` in `G` are, seen from the particles, errors of
    size `ε / λ_min(G)` along the eigenvectors of small eigenvalues (the normal-equations effect,
    `κ(G) = κ(X)²`); as the particles cluster `λ_min(G)` decays and those errors are later mixed
    back into all entries. Agreement with the particle form is ~1e-15 while `G` is well
    conditioned and can degrade to ~1e-10 over long clustered runs (float64) — harmless for the
    statistic at `δ = 1e-3`, but `ReducedForm` (same cost, particle-form accuracy) is the default.
    """


def _gram_supported(integrator: AbstractSphereIntegrator) -> bool:
    return isinstance(integrator, (AbstractProjectedRK, GeodesicEuler))


def _resolve_form(form, *, matrices_given: bool, integrator) -> AbstractForm:
    if form is None:
        return ParticleForm() if matrices_given else ReducedForm()
    if not isinstance(form, AbstractForm):
        raise ValueError(
            f"form={form!r} is not a sweep form; pass None (automatic), ReducedForm(), "
            "GramForm() or ParticleForm()."
        )
    if isinstance(form, (GramForm, ReducedForm)) and matrices_given:
        raise ValueError(
            f"form={type(form).__name__}() needs Q = K = V = I (it uses rotation invariance); "
            "pass form=ParticleForm() (or None) with dynamics matrices."
        )
    if isinstance(form, GramForm):
        if not _gram_supported(integrator):
            raise ValueError(
                f"form=GramForm() has no Gram recursion for {type(integrator).__name__}; use a "
                "projected Runge–Kutta method (ProjectedEuler, ProjectedRK2, ProjectedRK4) or "
                "GeodesicEuler, or pass form=ParticleForm()."
            )
    return form


# ----------------------------------------------------------------------------------------------
# Gram-form steps


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


# ----------------------------------------------------------------------------------------------
# one trajectory


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


def _euler_rows(x: Tokens, beta, dt, normalized: bool) -> Tokens:
    """`ProjectedEuler` for `Q = K = V = I`: `normalize(M X)` with the row-scaled
    `M = E + diag(z/dt − e)` of `GramForm` (equal to `x + dt v` up to a positive factor per row)."""
    # (Carrying x xᵀ in the loop state to reuse it for the statistic doubles the time on XLA:CPU.)
    g = x @ x.T
    e, z = _weights_scaled(g, beta, normalized)
    diag = z / dt - jnp.sum(e * g, axis=-1)
    y = e @ x + diag[:, None] * x
    return y * jax.lax.rsqrt(jnp.sum(y * y, axis=-1, keepdims=True))


_LANES = 8  # float64 lanes of an AVX-512 register


def _reduce(x0: Tokens) -> Tokens:
    """Coordinates `R = X U` `(n, r)` in an orthonormal basis `U` of the row space, `r = min(n, d)`;
    for `d < n`, `R = X` with zero columns appended up to a multiple of 8.

    Zero columns stay zero (the velocity rows are combinations of the rows) and add exact zeros
    to every inner product; a width below one SIMD register runs ~2.5× slower on XLA:CPU at
    `d = 2` than the padded width 8 (measured).
    """
    n, d = x0.shape
    if d <= n:
        width = -(-d // _LANES) * _LANES
        return jnp.pad(x0, ((0, 0), (0, width - d))) if width > d else x0
    _, c = jnp.linalg.qr(x0.T)  # x0ᵀ = U c, U (d, n) orthonormal: x0 = cᵀ Uᵀ
    return c.T


@jax.jit
def _reduce_all(x: Float[Array, "S n d"]) -> Float[Array, "S n r"]:
    return jax.vmap(_reduce)(x)


class _Plan(NamedTuple):
    """The static part of the time grid (hashable: a jit static argument)."""

    block: int  # steps between two observations
    size: int  # number of distinct saved steps
    initial: bool  # whether t = 0 is saved (slot 0)


class _Kernel(eqx.Module):
    """What one trajectory needs besides (β, start, dt): static choices and the matrices."""

    dynamics: type = eqx.field(static=True)
    integrator: AbstractSphereIntegrator
    form: AbstractForm
    Q: Array | None
    K: Array | None
    V: Array | None

    def initial(self, x0: Tokens):
        if isinstance(self.form, GramForm):
            return x0 @ x0.T
        return _reduce(x0) if isinstance(self.form, ReducedForm) else x0

    def advance(self):
        """`(state, beta, dt) -> state` for one step (`beta` a `_Beta`)."""
        normalized = self.dynamics is SA
        if isinstance(self.form, GramForm):
            return _gram_advance(self.integrator, normalized)
        q, k, v = self.Q, self.K, self.V
        if q is None and k is None and v is None and isinstance(self.integrator, ProjectedEuler):
            return lambda x, beta, dt: _euler_rows(x, beta, dt, normalized)
        if isinstance(self.form, ParticleForm) and self.form.fuse_qk:
            if q is not None and k is not None and q.ndim == k.ndim == 2:
                q, k = k.T @ q, None  # ⟨(KᵀQ) x, y⟩ = ⟨Q x, K y⟩
        dynamics, integrator = self.dynamics, self.integrator

        def step(x, beta, dt):
            return integrator.step(dynamics(beta.value, Q=q, K=k, V=v), x, dt)

        return step

    def gram(self, state) -> Gram:
        return state if isinstance(self.form, GramForm) else state @ state.T

    def observe(self, plan: _Plan, beta, x0, dt, slots, inverse, observable):
        """`observable(state)` at the saved times of one trajectory, stacked on a leading axis.

        A scan over blocks of `plan.block` steps (a static inner loop: on XLA:CPU a loop with a
        run-time trip count costs ~25 % more here); each block's observation goes to its slot of
        a buffer of the saved values (the last slot is scratch for unsaved blocks).
        """
        advance = self.advance()
        if not isinstance(self.form, GramForm):
            # |β| before the loop (see `_Beta`). (The Gram form measured faster without.)
            beta = _as_beta(beta)
        state = self.initial(x0)
        shape = jax.eval_shape(observable, state)
        buffer = jnp.zeros((plan.size + 1, *shape.shape), shape.dtype)
        if plan.initial:
            buffer = buffer.at[0].set(observable(state))

        def block(carry, slot):
            state, buffer = carry
            state = jax.lax.fori_loop(
                0, plan.block, lambda _, s: advance(s, beta, dt), state, unroll=min(plan.block, 5)
            )
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, observable(state), slot, 0)
            return (state, buffer), None

        (_, buffer), _ = jax.lax.scan(block, (state, buffer), slots)
        return buffer[inverse]

    def curve(self, plan: _Plan, beta, x0, dt, slots, inverse, delta):
        """The statistic at the saved times of one trajectory, shape `(T,)`."""
        if isinstance(self.form, GramForm):
            observable = lambda g: _pair_fraction(g, delta)
        else:
            observable = lambda x: _pair_fraction_of_rows(x, delta)
        return self.observe(plan, beta, x0, dt, slots, inverse, observable)


@functools.partial(jax.jit, static_argnames=("static", "plan"))
def _chunk(params, static, plan: _Plan, betas, starts, dt, slots, inverse, delta):
    """`(len(betas), len(starts), T)` statistics. (`jax.jit`, not `eqx.filter_jit`: the latter
    waits for the result, and the host should prepare the next chunk meanwhile.)"""
    kernel = eqx.combine(params, static)
    one = lambda b, x: kernel.curve(plan, b, x, dt, slots, inverse, delta)
    if not isinstance(kernel.form, ReducedForm):  # measured: these are as fast or faster nested
        return jax.vmap(lambda b: jax.vmap(lambda x: one(b, x))(starts))(betas)
    # One vmap over the flattened (β, start) pairs: with two nested vmaps XLA:CPU materializes a
    # transposed copy of the n × n state for `x xᵀ` at every step instead of fusing it into the
    # product (measured ~1.4× slower).
    num_betas, num_starts = betas.shape[0], starts.shape[0]
    pairs_beta = jnp.repeat(betas, num_starts)
    pairs_start = jnp.tile(starts, (num_betas, 1, 1))
    values = jax.vmap(one)(pairs_beta, pairs_start)
    return values.reshape(num_betas, num_starts, -1)


# ----------------------------------------------------------------------------------------------
# validation


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


def _time_plan(owner: str, save_ts, dt: float):
    """The static `_Plan`, the slot of each block `(num_blocks,)`, the gather back to the order of
    `save_ts` `(T,)` and the saved times as an array."""
    ts = np.asarray(save_ts, dtype=np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(
            f"{owner}: save_ts must be a non-empty 1-D array of times; got shape {ts.shape}."
        )
    if not np.all(np.isfinite(ts)) or np.any(ts < -1e-9 * dt):
        raise ValueError(f"{owner}: save_ts must be finite and >= 0; got min {ts.min()!r}.")
    try:
        index = np.array([_grid_index(float(t), dt, "save_ts entry") for t in ts], dtype=np.int64)
    except ValueError as e:
        raise ValueError(f"{owner}: {str(e).removeprefix('simulate: ')}") from None
    unique, inverse = np.unique(index, return_inverse=True)
    # Observe every `block` steps, block = gcd of the saved steps (5 for saves every 0.5 at
    # dt = 0.1); blocks whose end is not saved write to the scratch slot.
    block = int(np.gcd.reduce(unique)) or 1
    num_blocks = int(unique[-1]) // block
    slots = np.full(num_blocks, unique.size, dtype=np.int32)
    later = unique[unique > 0]
    slots[later // block - 1] = np.searchsorted(unique, later)
    plan = _Plan(block=block, size=int(unique.size), initial=bool(unique[0] == 0))
    return plan, slots, inverse.reshape(-1).astype(np.int32), ts


# ----------------------------------------------------------------------------------------------
# public entry points


def random_starts(key, num_starts: int, n: int, d: int, dtype=None) -> Float[Array, "S n d"]:
    """`num_starts` configurations of `n` i.i.d. uniform points on `S^{d−1}`, shape `(S, n, d)`
    (normalized Gaussians; `dtype` defaults to JAX's default float)."""
    for name, value, low in (("num_starts", num_starts, 1), ("n", n, 2), ("d", d, 2)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"random_starts: {name}={value!r} must be an integer >= {low}.")
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64 if dtype is None else dtype)
    x = jax.random.normal(key, (num_starts, n, d), dtype=dtype)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _single(owner, beta, x0, dt, save_ts, dynamics, Q, K, V, integrator, delta, form):
    """Checks and setup shared by `clustering_curve` and `gram_trajectory`."""
    _check_dynamics(owner, dynamics)
    _check_integrator(owner, integrator)
    if jnp.ndim(beta) != 0:
        raise ValueError(
            f"{owner}: beta must be a scalar; got shape {jnp.shape(beta)}. For many β use "
            "phase_diagram or jax.vmap."
        )
    if isinstance(x0, jax.core.Tracer):
        if x0.ndim != 2:
            raise ValueError(f"{owner}: x0 must have shape (n, d); got {x0.shape}.")
    else:
        x0 = _check_starts(owner, x0, batched=False)
    d = x0.shape[1]
    dt = _check_scalar(owner, "dt", dt, positive=True)
    delta = _check_delta(owner, delta)
    Q, K, V = _check_matrices(owner, dynamics, d, Q, K, V)
    form = _resolve_form(
        form, matrices_given=any(m is not None for m in (Q, K, V)), integrator=integrator
    )
    plan, slots, inverse, _ = _time_plan(owner, save_ts, dt)
    kernel = _Kernel(dynamics, integrator, form, Q, K, V)
    dtype = x0.dtype
    args = (
        plan,
        jnp.asarray(beta, dtype),
        x0,
        jnp.asarray(dt, dtype),
        jnp.asarray(slots),
        jnp.asarray(inverse),
    )
    return kernel, args, jnp.asarray(delta, dtype)


def clustering_curve(
    beta,
    x0: Tokens,
    *,
    dt,
    save_ts,
    dynamics: type = SA,
    Q=None,
    K=None,
    V=None,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    delta: float = 1e-3,
    form: AbstractForm | None = None,
) -> Float[Array, " T"]:
    r"""The statistic `fraction_clustered(x(t), delta)` at `save_ts` along one trajectory.

    Equals `vmap(fraction_clustered)(simulate(dynamics(beta, Q=Q, K=K, V=V), x0, dt=dt,
    integrator=integrator, save_ts=save_ts))` without storing the states, in the form
    `phase_diagram` would use (`ReducedForm` with identity matrices). `beta` and `x0` may be
    traced: jit it, or `jax.vmap` it over β and starts (what `phase_diagram` does, chunk by
    chunk). Concrete `x0` is checked to lie on the sphere; traced `x0` is not.

    **Arguments:** as for `phase_diagram`, with one `beta` (a scalar) and one start `x0` `(n, d)`.

    **Returns:** shape `(len(save_ts),)`, values in `[0, 1]`.
    """
    kernel, args, delta = _single(
        "clustering_curve", beta, x0, dt, save_ts, dynamics, Q, K, V, integrator, delta, form
    )
    return kernel.curve(*args, delta)


def gram_trajectory(
    beta,
    x0: Tokens,
    *,
    dt,
    save_ts,
    dynamics: type = SA,
    Q=None,
    K=None,
    V=None,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    form: AbstractForm | None = None,
) -> Float[Array, "T n n"]:
    r"""The Gram matrices `x(t) x(t)ᵀ` at `save_ts` along one trajectory, shape `(T, n, n)`.

    The same run as `clustering_curve` (same forms: with identity matrices the particles are
    advanced in `n`-dimensional coordinates, so this costs `O(n³)` per step for any `d ≥ n`),
    returning the rotation-invariant state instead of the statistic. jit- and vmap-able like
    `clustering_curve`. Use it for step-size studies and for comparisons with `gamma_beta`.

    **Arguments:** as for `clustering_curve` (no `delta`).
    """
    kernel, args, _ = _single(
        "gram_trajectory", beta, x0, dt, save_ts, dynamics, Q, K, V, integrator, 1e-3, form
    )
    return kernel.observe(*args, kernel.gram)


@dataclasses.dataclass(frozen=True)
class PhaseDiagram:
    """The result of `phase_diagram` (NumPy arrays on the host).

    - `betas` `(B,)`, `ts` `(T,)`: the grid (`ts` = `save_ts` in the given order).
    - `fraction` `(B, T)`: the statistic averaged over the starts.
    - `sem` `(B, T)`: its standard error over the starts (sample std / sqrt(S); 0 when S = 1).
    - `per_start` `(B, S, T)` or `None`: every start's value (with `per_start=True`).
    - `form`: the form that ran (`ReducedForm()`, `GramForm()` or `ParticleForm()`).
    - `num_steps`, `dt`: the steps taken (to `max(ts)`).
    """

    betas: np.ndarray
    ts: np.ndarray
    fraction: np.ndarray
    sem: np.ndarray
    per_start: np.ndarray | None
    form: AbstractForm
    num_steps: int
    dt: float


def _split(total: int, size: int) -> int:
    """The block size that cuts `total` into `ceil(total / size)` nearly equal blocks."""
    return -(-total // -(-total // size))


def phase_diagram(
    betas: Float[ArrayLike, " B"],
    starts: Float[ArrayLike, "S n d"],
    *,
    dt,
    save_ts,
    dynamics: type = SA,
    Q=None,
    K=None,
    V=None,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    delta: float = 1e-3,
    form: AbstractForm | None = None,
    chunk_size: int | None = None,
    in_flight: int | None = None,
    per_start: bool = False,
    progress: bool | None = None,
) -> PhaseDiagram:
    r"""The phase diagram of Fig. 3: the fraction of pairs `i ≠ j` with `⟨x_i, x_j⟩ ≥ 1 − δ`,
    averaged over random starts, for every β and saved time.

    $$\bar F(\beta, t) = \frac1S \sum_{s=1}^S F_\delta\big(x^{(s)}_\beta(t)\big),\qquad
      F_\delta(x) = \frac{2}{n(n-1)}\#\{i<j : \langle x_i,x_j\rangle \ge 1-\delta\},$$

    with `x_β^{(s)}` the solution from `starts[s]` of `dynamics(β, Q=Q, K=K, V=V)` by
    `integrator` with fixed step `dt` (the paper: SA, `n = 32`, Euler-then-renormalize, `dt = 0.1`,
    `δ = 1e-3`, float64). Every start is used for every β (common random numbers: the diagram is
    smooth in β). The precision is that of `starts`.

    **How.** `jax.vmap` over β and starts of one jitted trajectory (`clustering_curve`), run in
    chunks of about `chunk_size` trajectories, dispatched asynchronously (up to `in_flight` at a
    time) so that the host prepares the next chunk while one runs. XLA:CPU runs the chunks of one
    device one after the other, with its threads inside each chunk. (Several CPU devices via
    `JAX_NUM_CPU_DEVICES` hung with several chunks in flight on jax 0.10.2: not used.) With `form=None` and `Q = K = V = I` the particles are advanced in an
    orthonormal basis of their span (`ReducedForm`: cost `O(n² min(n, d))` per step, independent
    of `d` beyond `n`); with matrices, as they are (`ParticleForm`).

    **Arguments:**

    - `betas`: `(B,)` finite inverse temperatures.
    - `starts`: `(S, n, d)` starts with unit rows (`random_starts`), `n ≥ 2`, `d ≥ 2`.
    - `dt`: the step `> 0`.
    - `save_ts`: `(T,)` times, multiples of `dt`, `≥ 0`, any order; the run stops at the last.
    - `dynamics`: the class `SA` (default) or `USA`.
    - `Q`, `K`, `V`: optional matrices as for `SA` (`None` = identity; heads allowed).
    - `integrator`: `ProjectedEuler()` (default), `ProjectedRK4()`, ...
    - `delta`: the tolerance `δ ∈ (0, 2]`.
    - `form`: `None` (automatic), `ReducedForm()`, `GramForm()` or `ParticleForm()`.
    - `chunk_size`: trajectories per compiled call (default on CPU: about 4 MiB of
      per-trajectory arrays, 256 trajectories for `n = 32`, `d ≥ n` in the reduced form,
      float64; on an accelerator about 256 MiB, 16 384 trajectories there).
    - `in_flight`: chunks dispatched before waiting for the oldest (default 2).
    - `per_start`: also return every start's values `(B, S, T)`.
    - `progress`: show a progress bar over chunks (`None`: unless `WORKBENCH_PROGRESS=0`).

    **Returns:** a `PhaseDiagram` (`fraction`, `sem`, `per_start`, `form`, ...).

    **Example:**

    ```python
    starts = wb.particles.random_starts(jax.random.key(0), 1024, 32, 128, jnp.float64)
    pd = wb.particles.phase_diagram(jnp.linspace(0.1, 9, 90), starts, dt=0.1,
                                    save_ts=np.arange(61) * 0.5)
    pd.fraction.shape   # (90, 61)
    ```

    Reference: Geshkovski, Letrouit, Polyanskiy, Rigollet, arXiv 2312.10794, Fig. 3 and 5.
    """
    owner = "phase_diagram"
    _check_dynamics(owner, dynamics)
    _check_integrator(owner, integrator)
    b = np.asarray(betas)
    if b.ndim != 1 or b.size == 0:
        raise ValueError(
            f"{owner}: betas must be a non-empty 1-D array of inverse temperatures, shape (B,); "
            f"got shape {b.shape}."
        )
    if not np.issubdtype(b.dtype, np.number) or np.iscomplexobj(b) or not np.all(np.isfinite(b)):
        raise ValueError(f"{owner}: betas must be finite real numbers; got {b!r}.")
    x = _check_starts(owner, starts, batched=True)
    num_starts, n, d = x.shape
    dtype = x.dtype
    dt = _check_scalar(owner, "dt", dt, positive=True)
    delta = _check_delta(owner, delta)
    Q, K, V = _check_matrices(owner, dynamics, d, Q, K, V)
    form = _resolve_form(
        form, matrices_given=any(m is not None for m in (Q, K, V)), integrator=integrator
    )
    plan, slots, inverse, ts = _time_plan(owner, save_ts, dt)
    num_steps = plan.block * slots.size
    for name, value in (("chunk_size", chunk_size), ("in_flight", in_flight)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise ValueError(f"{owner}: {name}={value!r} must be a positive integer (or None).")

    # ---- chunking: (β block) × (start block), padded to full blocks (one compilation) ----
    workers = in_flight or 2
    if chunk_size is None:
        width = (
            d if isinstance(form, ParticleForm) else n if isinstance(form, GramForm) else min(n, d)
        )
        trajectory_bytes = n * (n + width) * jnp.dtype(dtype).itemsize
        if next(iter(x.devices())).platform == "cpu":
            # About 4 MiB of per-trajectory arrays (the state and the n × n attention matrices)
            # per call: larger batches leave the caches and run slower per step.
            budget, cap = 4 << 20, 1024
        else:  # accelerators want wide batches: about 256 MiB per call
            budget, cap = 256 << 20, 1 << 16
        chunk_size = int(min(cap, max(8, budget // trajectory_bytes)))
    start_block = _split(num_starts, min(num_starts, chunk_size))
    beta_block = _split(b.size, max(1, chunk_size // start_block))
    num_beta_blocks = -(-b.size // beta_block)
    num_start_blocks = -(-num_starts // start_block)
    b_pad = np.concatenate([b, np.full(num_beta_blocks * beta_block - b.size, b[-1])])
    missing = num_start_blocks * start_block - num_starts
    if isinstance(form, ReducedForm):  # once per start, not once per (β block, start block)
        x = _reduce_all(x)
    x_pad = (
        x if not missing else jnp.concatenate([x, jnp.broadcast_to(x[:1], (missing, *x.shape[1:]))])
    )

    params, static = eqx.partition(_Kernel(dynamics, integrator, form, Q, K, V), eqx.is_array)
    args = (
        jnp.asarray(dt, dtype),
        jnp.asarray(slots),
        jnp.asarray(inverse),
        jnp.asarray(delta, dtype),
    )
    T = ts.size
    sums = np.zeros((b.size, T))
    squares = np.zeros((b.size, T))
    every = np.zeros((b.size, num_starts, T)) if per_start else None

    def collect(task):
        i, j, result = task
        values = np.asarray(result, dtype=np.float64)
        rows = slice(i * beta_block, min((i + 1) * beta_block, b.size))
        cols = slice(j * start_block, min((j + 1) * start_block, num_starts))
        values = values[: rows.stop - rows.start, : cols.stop - cols.start]
        sums[rows] += values.sum(axis=1)
        squares[rows] += (values**2).sum(axis=1)
        if every is not None:
            every[rows, cols] = values

    blocks = [(i, j) for i in range(num_beta_blocks) for j in range(num_start_blocks)]
    pending: collections.deque = collections.deque()
    disable = None if progress is None else not progress
    with Progress(
        len(blocks), desc=f"phase diagram ({type(form).__name__})", disable=disable
    ) as bar:
        for i, j in blocks:
            betas_block = jnp.asarray(b_pad[i * beta_block : (i + 1) * beta_block], dtype)
            starts_block = x_pad[j * start_block : (j + 1) * start_block]
            # Dispatch is asynchronous: the host slices the next chunk while this one runs.
            result = _chunk(params, static, plan, betas_block, starts_block, *args)
            pending.append((i, j, result))
            while len(pending) >= workers:
                collect(pending.popleft())
                bar.update()
        while pending:
            collect(pending.popleft())
            bar.update()

    mean = sums / num_starts
    if num_starts > 1:
        var = np.maximum(squares - num_starts * mean**2, 0.0) / (num_starts - 1)
        sem = np.sqrt(var / num_starts)
    else:
        sem = np.zeros_like(mean)
    return PhaseDiagram(
        betas=b.astype(np.float64),
        ts=ts,
        fraction=mean,
        sem=sem,
        per_start=every,
        form=form,
        num_steps=num_steps,
        dt=dt,
    )
