r"""The sweep forms: how a sweep advances one configuration, as objects that carry it.

`ParticleForm` (the particles `X`), `ReducedForm` (`X` in an orthonormal basis of its span) and
`GramForm` (`G = X Xᵀ`) each say which inputs they accept (`check`), how a start becomes the
state (`prepare` once per batch, `initial` per trajectory), how the state advances one step
(`advance`), what is observed (`gram`, `statistic`), how a chunk is vmapped over (β, start) pairs
(`map_pairs`) and how wide the state is (`width`, for the default chunk size). The kernel
(`_phase_kernel`) only calls these methods.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._types import Tokens
from ._cluster_statistics import Gram, _pair_fraction, _pair_fraction_of_rows
from ._dynamics import SA
from ._gram_algebra import _euler_rows, _gram_advance, _gram_supported
from ._integrators import AbstractSphereIntegrator, ProjectedEuler
from ._reduction import _reduce, _reduce_all


class AbstractForm(eqx.Module):
    """How a sweep advances one configuration: `ReducedForm()`, `GramForm()` or `ParticleForm()`."""

    # Whether the kernel computes |β| once before the time loop (see `_Beta`).
    hoist_shift: ClassVar[bool] = True

    def check(self, *, matrices_given: bool, integrator: AbstractSphereIntegrator) -> None:
        """Raise `ValueError` if this form cannot run with these dynamics matrices / integrator."""

    def prepare(self, starts):
        """The starts `(S, n, d)` as the sweep feeds them to `initial` (once per start)."""
        return starts

    @abc.abstractmethod
    def initial(self, x0: Tokens):
        """The state of one trajectory from its (prepared) start."""

    @abc.abstractmethod
    def width(self, n: int, d: int) -> int:
        """The columns of the state `(n, width)` (the default chunk size scales with it)."""

    @abc.abstractmethod
    def advance(self, dynamics: type, integrator: AbstractSphereIntegrator, Q, K, V):
        """`(state, beta, dt) -> state` for one step (`beta` a `_Beta` or an array)."""

    @abc.abstractmethod
    def gram(self, state) -> Gram:
        """The Gram matrix `x xᵀ` of the state."""

    @abc.abstractmethod
    def statistic(self, state, delta):
        """`fraction_clustered` of the state."""

    def map_pairs(self, one, betas, starts):
        """`one(β, start)` over every pair, shape `(len(betas), len(starts), ...)`."""
        # Measured: for the particle and Gram forms nested vmaps are as fast or faster.
        return jax.vmap(lambda b: jax.vmap(lambda x: one(b, x))(starts))(betas)

    def _require_identity(self, matrices_given: bool) -> None:
        if matrices_given:
            raise ValueError(
                f"form={type(self).__name__}() needs Q = K = V = I (it uses rotation invariance); "
                "pass form=ParticleForm() (or None) with dynamics matrices."
            )


class _AbstractRowForm(AbstractForm):
    """A form whose state is a set of rows on the sphere (`ParticleForm`, `ReducedForm`)."""

    def _matrices(self, q, k):
        """The `(Q, K)` the step uses (`ParticleForm` may fuse them)."""
        return q, k

    def advance(self, dynamics, integrator, Q, K, V):
        normalized = dynamics is SA
        q, k, v = Q, K, V
        if q is None and k is None and v is None and isinstance(integrator, ProjectedEuler):
            return lambda x, beta, dt: _euler_rows(x, beta, dt, normalized)
        q, k = self._matrices(q, k)

        def step(x, beta, dt):
            return integrator.step(dynamics(beta.value, Q=q, K=k, V=v), x, dt)

        return step

    def gram(self, state) -> Gram:
        return state @ state.T

    def statistic(self, state, delta):
        return _pair_fraction_of_rows(state, delta)


class ParticleForm(_AbstractRowForm):
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

    def initial(self, x0: Tokens):
        return x0

    def width(self, n: int, d: int) -> int:
        return d

    def _matrices(self, q, k):
        if self.fuse_qk and q is not None and k is not None and q.ndim == k.ndim == 2:
            q, k = k.T @ q, None  # ⟨(KᵀQ) x, y⟩ = ⟨Q x, K y⟩
        return q, k


class ReducedForm(_AbstractRowForm):
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

    def check(self, *, matrices_given: bool, integrator: AbstractSphereIntegrator) -> None:
        self._require_identity(matrices_given)

    def prepare(self, starts):
        # Once per start, not once per (β block, start block).
        return _reduce_all(starts)

    def initial(self, x0: Tokens):
        return _reduce(x0)

    def width(self, n: int, d: int) -> int:
        return min(n, d)

    def map_pairs(self, one, betas, starts):
        # One vmap over the flattened (β, start) pairs: with two nested vmaps XLA:CPU materializes a
        # transposed copy of the n × n state for `x xᵀ` at every step instead of fusing it into the
        # product (measured ~1.4× slower).
        num_betas, num_starts = betas.shape[0], starts.shape[0]
        pairs_beta = jnp.repeat(betas, num_starts)
        pairs_start = jnp.tile(starts, (num_betas, 1, 1))
        values = jax.vmap(one)(pairs_beta, pairs_start)
        return values.reshape(num_betas, num_starts, -1)


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

    # The kernel leaves |β| inside the step: the Gram form measured faster without hoisting it.
    hoist_shift: ClassVar[bool] = False

    def check(self, *, matrices_given: bool, integrator: AbstractSphereIntegrator) -> None:
        self._require_identity(matrices_given)
        if not _gram_supported(integrator):
            raise ValueError(
                f"form=GramForm() has no Gram recursion for {type(integrator).__name__}; use a "
                "projected Runge–Kutta method (ProjectedEuler, ProjectedRK2, ProjectedRK4) or "
                "GeodesicEuler, or pass form=ParticleForm()."
            )

    def initial(self, x0: Tokens):
        return x0 @ x0.T

    def width(self, n: int, d: int) -> int:
        return n

    def advance(self, dynamics, integrator, Q, K, V):
        return _gram_advance(integrator, dynamics is SA)

    def gram(self, state) -> Gram:
        return state

    def statistic(self, state, delta):
        return _pair_fraction(state, delta)


def _resolve_form(form, *, matrices_given: bool, integrator) -> AbstractForm:
    if form is None:
        return ParticleForm() if matrices_given else ReducedForm()
    if not isinstance(form, AbstractForm):
        raise ValueError(
            f"form={form!r} is not a sweep form; pass None (automatic), ReducedForm(), "
            "GramForm() or ParticleForm()."
        )
    form.check(matrices_given=matrices_given, integrator=integrator)
    return form
