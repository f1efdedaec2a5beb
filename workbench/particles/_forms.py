r"""The sweep forms: how a sweep advances one configuration, as objects that carry it.

`ParticleForm` (the particles `X`), `ReducedForm` (`X` in an orthonormal basis of its span) and
`GramForm` (`G = X Xᵀ`) each say which inputs they accept (`check`), how a start becomes the
state (`prepare` once per batch, `initial` per trajectory), how the state advances one step of a
dynamics (`advance`), what is observed (`gram`, `statistic`), how a chunk is vmapped over
(dynamics, start) pairs (`map_pairs`) and how wide the state is (`width`, for the default chunk
size). The kernel (`_phase_kernel`) only calls these methods.

The dynamics is an object: one `SA` / `USA` (a scalar β, traced inside the kernel) for a
trajectory, and for a chunk a batch of them, the same object with β of shape `(B,)` and the
matrices shared (`map_pairs` vmaps over the β leaf only, `_beta_axes`). Nothing is rebuilt from
(class, β, Q, K, V) inside a step.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

from .._types import Tokens
from ._cluster_statistics import Gram, _pair_fraction, _pair_fraction_of_rows
from ._dynamics import SA
from ._gram_algebra import _as_beta, _euler_rows, _gram_advance, _gram_supported
from ._integrators import AbstractSphereIntegrator, ProjectedEuler
from ._reduction import _reduce, _reduce_all


def _with_beta(dynamics: SA, beta) -> SA:
    """`dynamics` with its β leaf replaced by `beta` (a leaf swap: no constructor, no checks; at
    trace time it costs nothing). With `beta` of shape `(B,)` this is a batch over β sharing the
    matrices."""
    return eqx.tree_at(lambda dyn: dyn.beta, dynamics, beta)


def _beta_axes(dynamics: SA):
    """`in_axes` for a batch of dynamics: axis 0 on the β leaf, `None` (shared) on the matrices."""
    unbatched = jax.tree.map(lambda _: None, dynamics)
    return eqx.tree_at(lambda dyn: dyn.beta, unbatched, 0, is_leaf=lambda leaf: leaf is None)


def _is_identity(dynamics: SA) -> bool:
    """Whether the dynamics has `Q = K = V = I` (no matrices, not repulsive: `V = −I` there)."""
    return all(m is None for m in (dynamics.Q, dynamics.K, dynamics.V)) and not dynamics.repulsive


class AbstractForm(eqx.Module):
    """How a sweep advances one configuration: `ReducedForm()`, `GramForm()` or `ParticleForm()`."""

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
    def advance(self, dynamics: SA, integrator: AbstractSphereIntegrator):
        """`(state, dt) -> state`: one step of `dynamics` (one `SA` / `USA`, β a scalar, possibly
        traced). Called once per trajectory before the time loop: what it computes outside the
        returned step (e.g. `|β|`) is computed once."""

    @abc.abstractmethod
    def gram(self, state) -> Gram:
        """The Gram matrix `x xᵀ` of the state."""

    @abc.abstractmethod
    def statistic(self, state, delta):
        """`fraction_clustered` of the state."""

    def map_pairs(self, one, dynamics, starts):
        """`one(member, start)` over every pair of a member of the batch `dynamics` (β of shape
        `(B,)`, matrices shared) and a start, shape `(B, len(starts), ...)`."""
        # Measured: for the particle and Gram forms nested vmaps are as fast or faster.
        over_starts = lambda member: jax.vmap(lambda x: one(member, x))(starts)
        return jax.vmap(over_starts, in_axes=(_beta_axes(dynamics),))(dynamics)

    def _require_identity(self, matrices_given: bool) -> None:
        if matrices_given:
            raise ValueError(
                f"form={type(self).__name__}() needs Q = K = V = I (it uses rotation invariance; "
                "repulsive dynamics count as V = -I); pass form=ParticleForm() (or None) with "
                "dynamics matrices."
            )


class _AbstractRowForm(AbstractForm):
    """A form whose state is a set of rows on the sphere (`ParticleForm`, `ReducedForm`)."""

    def _stepped(self, dynamics: SA) -> SA:
        """The dynamics the step evaluates (`ParticleForm` may fuse `Q` and `K`)."""
        return dynamics

    def advance(self, dynamics, integrator):
        if _is_identity(dynamics) and isinstance(integrator, ProjectedEuler):
            # |β| once, before the time loop (see `_Beta`).
            beta = _as_beta(dynamics.beta)
            normalized = dynamics.normalized
            return lambda x, dt: _euler_rows(x, beta, dt, normalized)
        stepped = self._stepped(dynamics)
        return lambda x, dt: integrator.step(stepped, x, dt)

    def gram(self, state) -> Gram:
        return state @ state.T

    def statistic(self, state, delta):
        return _pair_fraction_of_rows(state, delta)


class ParticleForm(_AbstractRowForm):
    r"""Advance the particles `X` `(n, d)` (any dynamics matrices, any sphere integrator,
    multi-head included).

    With `Q = K = V = I` and `ProjectedEuler` the step is written as `x⁺ = normalize(M X)` with
    the row-scaled `M = E + diag(z/dt − e)` of `GramForm` (no softmax division; the scaling cancels
    in the normalization); otherwise it is `integrator.step(dynamics, X, dt)`.

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

    def _stepped(self, dynamics):
        q, k = dynamics.Q, dynamics.K
        if self.fuse_qk and q is not None and k is not None and q.ndim == k.ndim == 2:
            # ⟨(KᵀQ) x, y⟩ = ⟨Q x, K y⟩; a leaf swap (once per trajectory, before the loop).
            fused = (k.T @ q, None)
            return eqx.tree_at(lambda dyn: (dyn.Q, dyn.K), dynamics, fused)
        return dynamics


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

    def map_pairs(self, one, dynamics, starts):
        # One vmap over the flattened (β, start) pairs: with two nested vmaps XLA:CPU materializes a
        # transposed copy of the n × n state for `x xᵀ` at every step instead of fusing it into the
        # product (measured ~1.4× slower).
        num_betas, num_starts = dynamics.beta.shape[0], starts.shape[0]
        pairs = _with_beta(dynamics, jnp.repeat(dynamics.beta, num_starts))
        pairs_start = jnp.tile(starts, (num_betas, 1, 1))
        values = jax.vmap(one, in_axes=(_beta_axes(pairs), 0))(pairs, pairs_start)
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

    def advance(self, dynamics, integrator):
        step = _gram_advance(integrator, dynamics.normalized)
        # |β| stays inside the step (`_weights_scaled`): the Gram form measured faster so.
        beta = dynamics.beta
        return lambda g, dt: step(g, beta, dt)

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
