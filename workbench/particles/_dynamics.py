r"""Interacting-particle dynamics on the unit sphere (docs/particles.md, paper B).

Tokens `x_i ∈ S^{d−1}` are the rows of `x` with shape `(n, d)`. Every dynamics returns an
unprojected *field* `F(x)` and the tangent *velocity* `P⊥_{x_i} F_i(x) = F_i − ⟨x_i, F_i⟩ x_i`,
row by row.
"""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import boolean, finite_float, positive_float
from .._types import Scalar, Tokens
from ..terms._activations import relu

_MATRIX_NAMES = ("Q", "K", "V")


def tangent(x: Tokens, y: Tokens) -> Tokens:
    r"""The tangent projection `P⊥_{x_i} y_i = y_i − ⟨x_i, y_i⟩ x_i`, row by row.

    The same map as `workbench.terms.SphereProjection().tangent`: one rowwise dot, no `(d, d)`
    projector is formed.
    """
    return y - jnp.sum(x * y, axis=-1, keepdims=True) * x


def _is_traced(value) -> bool:
    return isinstance(value, jax.core.Tracer)


def _optional_array(value):
    return None if value is None else jnp.asarray(value)


def _check_beta(owner: str, beta) -> None:
    if _is_traced(beta):
        # Built under jit / vmap (e.g. `eqx.filter_vmap(SA)(betas)`): the value is unknown here.
        if jnp.ndim(beta) != 0:
            raise ValueError(f"{owner}.beta must be a scalar; got shape {jnp.shape(beta)}.")
        return
    b = np.asarray(beta)
    if b.ndim != 0:
        raise ValueError(
            f"{owner}.beta must be a scalar; got shape {b.shape}. To sweep β, build the batch with "
            f"`eqx.filter_vmap({owner})(betas)` or construct {owner}(beta) inside `jax.vmap`."
        )
    finite_float(f"{owner}.beta", b, arrays=True)


def _check_matrices(owner: str, Q, K, V) -> None:
    """Construction-time consistency of optional `Q, K` `(d_k, d)` and `V` `(d, d)` matrices.

    Each may carry a leading head axis; every 3-D matrix must then have the same head count (a
    2-D matrix, or `None` = identity, is shared by all heads).
    """
    given = {name: m for name, m in zip(_MATRIX_NAMES, (Q, K, V)) if m is not None}
    if not given:
        return
    shapes = ", ".join(f"{name} has shape {tuple(m.shape)}" for name, m in given.items())
    for name, m in given.items():
        if m.ndim not in (2, 3):
            raise ValueError(
                f"{owner}.{name} must have shape (d_k, d) or (heads, d_k, d); got {tuple(m.shape)}."
            )
        if not jnp.issubdtype(m.dtype, jnp.floating):
            raise ValueError(f"{owner}.{name} must be a floating array; got dtype {m.dtype}.")
    if len({m.shape[-1] for m in given.values()}) > 1:
        raise ValueError(
            f"{owner}: {shapes}; Q, K and V must all act on the same d features (same last axis)."
        )
    d = next(iter(given.values())).shape[-1]
    if V is not None and V.shape[-2] != d:
        raise ValueError(f"{owner}.V must be square (d, d) (or (heads, d, d)); got {V.shape}.")
    if Q is not None and K is not None and Q.shape[-2] != K.shape[-2]:
        raise ValueError(
            f"{owner}: {shapes}; ⟨Q x, K y⟩ needs Q and K with the same number of rows d_k."
        )
    for name, m in (("Q", Q), ("K", K)):
        other = "K" if name == "Q" else "Q"
        if m is not None and given.get(other) is None and m.shape[-2] != d:
            raise ValueError(
                f"{owner}: {shapes}; with {other}=None (the identity) {name} must be square (d, d)."
            )
    heads = {m.shape[0] for m in given.values() if m.ndim == 3}
    if len(heads) > 1:
        raise ValueError(
            f"{owner}: {shapes}; the head axes (leading axis of the 3-D matrices) must agree."
        )


def _check_matrix_dimension(owner: str, d: int, Q, K, V) -> None:
    for name, m in zip(_MATRIX_NAMES, (Q, K, V)):
        if m is not None and m.shape[-1] != d:
            raise ValueError(
                f"{owner}.{name} has shape {tuple(m.shape)} (acting on {m.shape[-1]} features) but the "
                f"points have d = {d}; pass matrices whose last axis is d."
            )


def _apply(x: Tokens, m) -> Array:
    """Rows `m x_i`, i.e. `x mᵀ` (with a head axis when `m` has one); `None` is the identity."""
    if m is None:
        return x
    return x @ jnp.swapaxes(m.astype(x.dtype), -1, -2)


def _scores(x: Tokens, Q, K) -> Array:
    """`⟨Q x_i, K x_j⟩` as one matmul, shape `(n, n)` or `(heads, n, n)`."""
    return _apply(x, Q) @ jnp.swapaxes(_apply(x, K), -1, -2)


def _sum_heads(y: Array) -> Tokens:
    return y if y.ndim == 2 else jnp.sum(y, axis=0)


def _attention_field(x: Tokens, beta, Q, K, V, *, normalized: bool, repulsive: bool) -> Tokens:
    # One Gram/score matmul, a max-shifted softmax (SA) or exp/n (USA), one matmul with the values.
    s = jnp.asarray(beta, x.dtype) * _scores(x, Q, K)
    if normalized:
        # Shifting by the row max leaves the softmax unchanged and keeps exp ≤ 1 at large β.
        w = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
        w = w / jnp.sum(w, axis=-1, keepdims=True)
    else:
        w = jnp.exp(s) / float(x.shape[0])
    y = _sum_heads(w @ _apply(x, V))
    return -y if repulsive else y


class AbstractDynamics(eqx.Module):
    r"""A particle dynamics `ẋ_i = P⊥_{x_i} F_i(x)` on the product of unit spheres `(S^{d−1})^n`.

    Subclasses give the unprojected field `F` (`field`) and check their parameters against the
    dimension `d` of the points (`check_dimension`); `velocity` is the tangent projection.
    """

    @abc.abstractmethod
    def field(self, x: Tokens) -> Tokens:
        """The unprojected field `F(x)`, shape `(n, d)` (the sum inside `P⊥`)."""

    @abc.abstractmethod
    def check_dimension(self, d: int) -> None:
        """Raise `ValueError` (naming the field and its shape) if the parameters do not fit `d`."""

    def velocity(self, x: Tokens) -> Tokens:
        r"""The tangent velocity `ẋ_i = F_i − ⟨x_i, F_i⟩ x_i`, shape `(n, d)`.

        Off the sphere (inside a Runge–Kutta stage) this is the same smooth formula, whose flow
        leaves the sphere invariant: `d/dt ‖x_i‖² = 2⟨x_i, F_i⟩(1 − ‖x_i‖²)`.
        """
        return tangent(x, self.field(x))


class SA(AbstractDynamics):
    r"""Self-attention dynamics (SA), docs/particles.md:

    $$\dot x_i = P^\perp_{x_i}\Big(\frac{1}{Z_i}\sum_j e^{\beta\langle Q x_i, K x_j\rangle} V x_j\Big),
      \qquad Z_i = \sum_k e^{\beta\langle Q x_i, K x_k\rangle},$$

    or, with `normalized=False`, the unnormalized dynamics USA (`Z_i = n`; built by `USA(beta)`).

    `Q = K = V = I` by default (applied without forming identity matrices). A leading head axis
    `(h, ·, ·)` on any of `Q, K, V` sums the SA term over heads (2-D matrices and `None` are shared
    by the heads). The softmax is shifted by its row maximum, so large β does not overflow (USA's
    weights are not normalized: large β can overflow, `e^β`).

    **Arguments:**

    - `beta`: the inverse temperature β, a finite scalar (negative β is allowed).
    - `Q`, `K`: `(d_k, d)` or `(h, d_k, d)`, or `None` (identity).
    - `V`: `(d, d)` or `(h, d, d)`, or `None` (identity).
    - `repulsive`: negate the field, i.e. `V → −V` (`V = −I` by default): the interaction energy
      then decreases. Equivalent to `SA(beta, V=-jnp.eye(d))`.
    - `normalized`: `True` (SA, the softmax `Z_i`) or `False` (USA, `Z_i = n`); `USA(beta, ...)`
      is `SA(beta, ..., normalized=False)`.

    **Example:** `SA(beta=4.0)`, `SA(1.0, Q=q, K=k, V=v)`, `SA(1.0, repulsive=True)`, `USA(1.0)`.

    Reference: Geshkovski, Letrouit, Polyanskiy, Rigollet, arXiv 2312.10794, §2.
    """

    beta: float | Scalar
    Q: Float[Array, "... dk d"] | None = eqx.field(default=None, converter=_optional_array)
    K: Float[Array, "... dk d"] | None = eqx.field(default=None, converter=_optional_array)
    V: Float[Array, "... d d"] | None = eqx.field(default=None, converter=_optional_array)
    repulsive: bool = eqx.field(default=False, static=True)
    normalized: bool = eqx.field(default=True, static=True)

    def __check_init__(self):
        boolean("SA.normalized", self.normalized, hint="True: SA, False: USA")
        _check_beta(self.name, self.beta)
        _check_matrices(self.name, self.Q, self.K, self.V)

    @property
    def name(self) -> str:
        """`"SA"` or `"USA"` (`normalized=False`): the dynamics' name in messages and in the
        theory curves' `kind`."""
        return "SA" if self.normalized else "USA"

    def check_dimension(self, d: int) -> None:
        _check_matrix_dimension(self.name, d, self.Q, self.K, self.V)

    def field(self, x: Tokens) -> Tokens:
        return _attention_field(
            x,
            self.beta,
            self.Q,
            self.K,
            self.V,
            normalized=self.normalized,
            repulsive=self.repulsive,
        )


def USA(beta, Q=None, K=None, V=None, repulsive: bool = False) -> SA:
    r"""Unnormalized self-attention dynamics (USA), docs/particles.md: SA with `Z_i` replaced by `n`,

    $$\dot x_i = P^\perp_{x_i}\Big(\frac1n\sum_j e^{\beta\langle Q x_i, K x_j\rangle} V x_j\Big).$$

    With `Q = K = V = I` it is exactly the gradient ascent `Ẋ = n ∇E_β` of `interaction_energy` on
    the product of spheres. Large `β` can overflow (`e^β`): the weights are not normalized.

    **Arguments:** as for `SA` (`beta`, `Q`, `K`, `V`, `repulsive`).

    **Returns:** `SA(beta, Q, K, V, repulsive=repulsive, normalized=False)`, an `SA` whose `name`
    is `"USA"`; batches over β as `SA`'s do (`eqx.filter_vmap(USA)(betas)`).
    """
    return SA(beta, Q, K, V, repulsive=repulsive, normalized=False)


class Hardmax(AbstractDynamics):
    r"""The β → ∞ limit of SA (hardmax, paper B §9.3): each token moves toward the average of the
    value vectors of the tokens maximizing `⟨Q x_i, K x_j⟩`,

    $$\dot x_i = P^\perp_{x_i}\Big(\frac{1}{|C_i|}\sum_{j\in C_i} V x_j\Big),\qquad
      C_i = \{j : \langle Q x_i, K x_j\rangle \ge \max_k \langle Q x_i, K x_k\rangle - \text{tol}\}.$$

    The field is discontinuous, solutions are Filippov and not unique; a fixed-step integrator
    gives one of them. Ties (within `tol`) share the weight equally. With `Q = K = I` the maximizer
    is `x_i` itself (and any token at the same place), so every configuration is at rest: the
    interesting cases have `QᵀK` not a positive multiple of the identity.

    **Arguments:**

    - `Q`, `K`, `V`: as for `SA` (heads sum).
    - `tol`: the tie tolerance on the scores; `None` means `100 ε max(1, |max_k s_ik|)` with the
      machine epsilon ε of the points' dtype.
    """

    Q: Float[Array, "... dk d"] | None = eqx.field(default=None, converter=_optional_array)
    K: Float[Array, "... dk d"] | None = eqx.field(default=None, converter=_optional_array)
    V: Float[Array, "... d d"] | None = eqx.field(default=None, converter=_optional_array)
    tol: float | None = eqx.field(default=None, static=True)

    def __check_init__(self):
        _check_matrices("Hardmax", self.Q, self.K, self.V)
        if self.tol is not None:
            positive_float("Hardmax.tol", self.tol, allow_zero=True, arrays=True, hint="or None")

    def check_dimension(self, d: int) -> None:
        _check_matrix_dimension("Hardmax", d, self.Q, self.K, self.V)

    def field(self, x: Tokens) -> Tokens:
        s = _scores(x, self.Q, self.K)
        m = jnp.max(s, axis=-1, keepdims=True)
        if self.tol is None:
            tol = 100.0 * float(jnp.finfo(x.dtype).eps) * jnp.maximum(1.0, jnp.abs(m))
        else:
            tol = float(self.tol)
        w = (s >= m - tol).astype(x.dtype)
        w = w / jnp.sum(w, axis=-1, keepdims=True)
        return _sum_heads(w @ _apply(x, self.V))


class FFNAugmented(AbstractDynamics):
    r"""A dynamics plus a feed-forward term inside the tangent projection (docs/particles.md):

    $$\dot x_i = P^\perp_{x_i}\big(F_i(x) + w\,\sigma(a x_i + b)\big).$$

    **Arguments:**

    - `dynamics`: the inner dynamics (`SA`, `USA`, `Hardmax`, ...) giving `F`.
    - `w`: `(d, m)`; `a`: `(m, d)`; `b`: `(m,)`.
    - `activation`: the pointwise σ (default `workbench.terms.relu`).
    """

    dynamics: AbstractDynamics
    w: Float[Array, "d m"] = eqx.field(converter=jnp.asarray)
    a: Float[Array, "m d"] = eqx.field(converter=jnp.asarray)
    b: Float[Array, " m"] = eqx.field(converter=jnp.asarray)
    activation: Callable = eqx.field(default=relu, static=True)

    def __check_init__(self):
        if not isinstance(self.dynamics, AbstractDynamics):
            raise ValueError(
                f"FFNAugmented.dynamics={self.dynamics!r} must be a particle dynamics (SA, USA, ...)."
            )
        if self.a.ndim != 2:
            raise ValueError(f"FFNAugmented.a must have shape (m, d); got {self.a.shape}.")
        m, d = self.a.shape
        if self.b.shape != (m,) or self.w.shape != (d, m):
            raise ValueError(
                f"FFNAugmented: a has shape {self.a.shape}, b {self.b.shape}, w {self.w.shape}; "
                f"expected a (m, d) = {(m, d)}, b (m,) = {(m,)}, w (d, m) = {(d, m)}."
            )

    def check_dimension(self, d: int) -> None:
        if self.a.shape[1] != d:
            raise ValueError(
                f"FFNAugmented.a has shape {self.a.shape} (acting on {self.a.shape[1]} features) but "
                f"the points have d = {d}."
            )
        self.dynamics.check_dimension(d)

    def field(self, x: Tokens) -> Tokens:
        h = x @ self.a.astype(x.dtype).T + self.b.astype(x.dtype)
        return self.dynamics.field(x) + self.activation(h) @ self.w.astype(x.dtype).T


class AngleUSA(eqx.Module):
    r"""USA with `Q = K = V = I` in dimension `d = 2`, in angles `x_i = (cos θ_i, sin θ_i)` (§7):

    $$\dot\theta_i = -\frac1n\sum_j e^{\beta\cos(\theta_i-\theta_j)}\sin(\theta_i-\theta_j),$$

    the gradient flow of `E_β(θ) = (1/(2βn²)) Σ_i Σ_j exp(β cos(θ_i − θ_j))` scaled by `n`
    (β = 0: Kuramoto with unit coupling and no natural frequencies). Integrate it with any ODE
    solver, e.g. `diffrax.ODETerm(lambda t, th, args: AngleUSA(beta).velocity(th))`.

    **Arguments:** `beta`, a finite scalar.
    """

    beta: float | Scalar

    def __check_init__(self):
        _check_beta("AngleUSA", self.beta)

    def velocity(self, theta: Float[Array, " n"]) -> Float[Array, " n"]:
        """`θ̇`, shape `(n,)`."""
        diff = theta[:, None] - theta[None, :]
        beta = jnp.asarray(self.beta, theta.dtype)
        return -jnp.mean(jnp.exp(beta * jnp.cos(diff)) * jnp.sin(diff), axis=-1)

    def energy(self, theta: Float[Array, " n"]) -> Scalar:
        """`E_β(θ)`, equal to `interaction_energy(from_angles(θ), β)`."""
        return interaction_energy(from_angles(theta), self.beta)


def to_angles(x: Float[Array, "n 2"]) -> Float[Array, " n"]:
    """Angles `θ_i = atan2(x_i2, x_i1) ∈ (−π, π]` of points on the circle, shape `(n,)`."""
    if x.ndim != 2 or x.shape[-1] != 2:
        raise ValueError(f"to_angles needs points of shape (n, 2); got {x.shape}.")
    return jnp.arctan2(x[:, 1], x[:, 0])


def from_angles(theta: Float[Array, " n"]) -> Float[Array, "n 2"]:
    """Points `(cos θ_i, sin θ_i)` on the circle, shape `(n, 2)`."""
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)


def interaction_energy(x: Tokens, beta, *, shifted: bool = False) -> Scalar:
    r"""The interaction energy `E_β(x) = (1/(2βn²)) Σ_i Σ_j exp(β⟨x_i, x_j⟩)` (docs/particles.md).

    It grows along SA and USA (USA is the ascent `Ẋ = n ∇E_β`) and decreases with `V = −I`.
    `E_β` blows up like `1/(2β)` as `β → 0`; `shifted=True` returns

    $$E_\beta - \frac{1}{2\beta} = \frac{1}{2\beta n^2}\sum_{i,j}\operatorname{expm1}(\beta\langle x_i,x_j\rangle),$$

    which has the same gradient, is accurate at small β, and at `β = 0` equals its limit
    `(1/(2n²)) Σ_i Σ_j ⟨x_i, x_j⟩ = ‖mean_i x_i‖²/2`.

    **Arguments:**

    - `x`: points `(n, d)`.
    - `beta`: a scalar; a concrete `beta = 0` is rejected unless `shifted=True`.
    - `shifted`: subtract the constant `1/(2β)`.

    **Returns:** the scalar energy.
    """
    if x.ndim != 2:
        raise ValueError(f"interaction_energy needs points of shape (n, d); got {x.shape}.")
    if not _is_traced(beta):
        b = np.asarray(beta)
        if b.ndim != 0 or not np.isfinite(b):
            raise ValueError(f"interaction_energy: beta={beta!r} must be a finite scalar.")
        if b == 0 and not shifted:
            raise ValueError(
                "interaction_energy: E_β = (1/(2βn²)) Σ exp(β⟨x_i, x_j⟩) diverges as β → 0 "
                "(like 1/(2β)); pass shifted=True for E_β − 1/(2β), whose β = 0 limit is "
                "(1/(2n²)) Σ ⟨x_i, x_j⟩."
            )
    n = x.shape[0]
    g = x @ x.T
    beta = jnp.asarray(beta, x.dtype)
    if not shifted:
        return jnp.sum(jnp.exp(beta * g)) / (2.0 * n * n * beta)
    # expm1(βg)/β → g as β → 0; the double `where` keeps gradients finite at β = 0.
    nonzero = beta != 0
    safe = jnp.where(nonzero, beta, 1.0)
    terms = jnp.where(nonzero, jnp.expm1(safe * g) / safe, g)
    return jnp.sum(terms) / (2.0 * n * n)


def mean_field_velocity(
    points: Float[Array, "m d"],
    weights: Float[Array, " m"],
    at: Float[Array, "p d"],
    beta,
    kind: str = "SA",
) -> Float[Array, "p d"]:
    r"""The mean-field velocity `X[μ](x)` of the weighted empirical measure `μ = Σ_j w_j δ_{y_j}`:

    $$X[\mu](x) = P^\perp_x\Big(\frac{\int e^{\beta\langle x,y\rangle} y\,d\mu(y)}
      {\int e^{\beta\langle x,y\rangle}\,d\mu(y)}\Big)\ \text{(SA)},\qquad
      X[\mu](x) = P^\perp_x\Big(\int e^{\beta\langle x,y\rangle} y\,d\mu(y)\Big)\ \text{(USA)},$$

    with `Q = K = V = I`. With `w_j = 1/n` and `at = points` it equals `SA(beta).velocity(points)`
    (resp. `USA`): the particle system is the mean-field equation for `μ = (1/n) Σ δ_{x_i}`.

    **Arguments:**

    - `points`: the atoms `y_j`, shape `(m, d)`.
    - `weights`: `w_j ≥ 0` summing to 1, shape `(m,)` (checked when concrete).
    - `at`: where to evaluate, shape `(p, d)` (points on the sphere).
    - `beta`: the inverse temperature.
    - `kind`: `"SA"` (normalized) or `"USA"`.

    **Returns:** the velocities, shape `(p, d)`.
    """
    if kind not in ("SA", "USA"):
        raise ValueError(f"mean_field_velocity: kind={kind!r} is not valid; choose 'SA' or 'USA'.")
    if points.ndim != 2 or at.ndim != 2 or points.shape[1] != at.shape[1]:
        raise ValueError(
            f"mean_field_velocity: points {points.shape} and at {at.shape} must be (m, d) and (p, d)."
        )
    if weights.shape != (points.shape[0],):
        raise ValueError(
            f"mean_field_velocity: weights has shape {weights.shape}; expected {(points.shape[0],)}."
        )
    if not _is_traced(weights):
        w = np.asarray(weights, dtype=float)
        if np.any(w < 0) or not np.isclose(w.sum(), 1.0, rtol=0, atol=1e-6):
            raise ValueError(
                f"mean_field_velocity: weights must be >= 0 and sum to 1; got sum {w.sum()!r}, "
                f"min {w.min()!r}."
            )
    _check_beta("mean_field_velocity", beta)
    dtype = at.dtype
    s = jnp.asarray(beta, dtype) * (at @ points.astype(dtype).T)
    w = weights.astype(dtype)
    if kind == "SA":
        # log-weights inside the max-shifted softmax; w_j = 0 atoms get weight exactly 0.
        logits = s + jnp.log(w)
        e = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)))
        e = e / jnp.sum(e, axis=-1, keepdims=True)
    else:
        e = jnp.exp(s) * w
    return tangent(at, e @ points.astype(dtype))
