"""Projections onto the constraint sets of the equation: layer norm (S1), the sphere, ReLU (S2)."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._checks import positive_float
from .._types import Tokens
from ._base import AbstractProjection


class LayerNormProjection(AbstractProjection):
    r"""Layer normalization as the projection onto `S1(σ1, σ2)` (paper A, Theorem 3.1).

    For a token row `v` with mean `m` and population variance `s² > 0`,

    $$P_{S_1}(v) = \sigma_2\,\frac{v - m}{s} + \sigma_1,$$

    the Euclidean projection onto the set of rows with feature-mean σ1 and feature-variance σ2².
    `S1` is a sphere of radius `σ2 √d` centred at `σ1 1` inside the hyperplane of mean σ1; it is
    not convex and the projection is not unique when `s = 0`.

    LayerNorm's per-feature affine `γ ⊙ · + β` is a fixed change of feature coordinates after the
    projection onto `S1(0, 1)`: this module stores `weight = γ` and `bias = β` (scalar σ2, σ1 are the
    constant vectors). With `eps > 0` it divides by `sqrt(s² + eps)` — PyTorch's `LayerNorm` — which
    is *not* an exact projection.

    The affine map must be invertible, γ non-zero in every feature, for the layer to be a
    projection onto a constraint set: `retract` and `tangent` divide by γ (a zero entry gives
    NaN there; the forward map `__call__` itself is defined). The weight loaders reject zero γ
    entries.

    **Arguments:**

    - `weight`: γ, shape `(d,)`; `bias`: β, shape `(d,)`.
    - `eps`: the variance regularization (0 for the exact projection).
    """

    weight: Float[Array, " d"]
    bias: Float[Array, " d"]
    eps: float = eqx.field(static=True, default=0.0)

    def __check_init__(self):
        if self.weight.shape != self.bias.shape:
            raise ValueError(
                f"LayerNormProjection.weight {self.weight.shape} and bias {self.bias.shape} differ."
            )
        positive_float(
            "LayerNormProjection.eps", self.eps, allow_zero=True, finite=False, arrays=True
        )

    @classmethod
    def onto_s1(cls, d: int, sigma1=0.0, sigma2=1.0, *, dtype=None) -> "LayerNormProjection":
        """The exact projection onto `S1(σ1, σ2)` in `R^d` (scalar mean σ1, standard deviation σ2)."""
        positive_float("sigma2", sigma2, finite=False, arrays=True)
        return cls(jnp.full((d,), sigma2, dtype), jnp.full((d,), sigma1, dtype), 0.0)

    def normalize(self, u: Tokens) -> Tokens:
        """`(u − m) / sqrt(s² + eps)`, row by row: the projection onto `S1(0, 1)`."""
        m = jnp.mean(u, axis=-1, keepdims=True)
        c = u - m
        var = jnp.mean(c * c, axis=-1, keepdims=True)
        return c / jnp.sqrt(var + self.eps)

    def __call__(self, u: Tokens) -> Tokens:
        return self.normalize(u) * self.weight + self.bias

    def retract(self, u: Tokens) -> Tokens:
        r"""The map onto the set `{γ ⊙ w + β : w ∈ S1(0, 1)}` whose tangent spaces `tangent` uses:
        `γ ⊙ N((u − β)/γ) + β` with the exact normalization `N` (no `eps`). It is the identity
        on the set; with `γ = σ2`, `β = σ1` constant it is the Euclidean projection onto
        `S1(σ1, σ2)`. (LayerNorm itself, `γ ⊙ N(u) + β`, is not the identity on that set when γ
        is not constant.)"""
        w = (u - self.bias) / self.weight
        c = w - jnp.mean(w, axis=-1, keepdims=True)
        c = c / jnp.sqrt(jnp.mean(c * c, axis=-1, keepdims=True))
        return c * self.weight + self.bias

    def tangent(self, u: Tokens, v: Tokens) -> Tokens:
        r"""Project `v` onto the tangent space of the (affinely mapped) set at `u`.

        With `u = γ ⊙ w + β`, `w ∈ S1(0, 1)`, the tangent space is `{γ ⊙ t : t ⊥ 1, t ⊥ w}` and
        its orthogonal complement is spanned by `1/γ` and `w/γ`; we remove `v`'s component in
        that two-dimensional normal space (Gram–Schmidt, row by row).
        """
        w = (u - self.bias) / self.weight
        n1 = jnp.broadcast_to(1.0 / self.weight, u.shape)
        n2 = w / self.weight
        e1 = n1 / jnp.linalg.norm(n1, axis=-1, keepdims=True)
        n2 = n2 - jnp.sum(n2 * e1, axis=-1, keepdims=True) * e1
        e2 = n2 / jnp.linalg.norm(n2, axis=-1, keepdims=True)
        v = v - jnp.sum(v * e1, axis=-1, keepdims=True) * e1
        return v - jnp.sum(v * e2, axis=-1, keepdims=True) * e2

    def squared_distance_s1(self, u: Tokens) -> Float[Array, " n"]:
        r"""Closed-form `dist(v, S1(σ1, σ2))² = d [(σ2 − s)² + (σ1 − m)²]` for scalar σ's.

        Valid when `weight = σ2·1`, `bias = σ1·1` (see `onto_s1`) and `eps = 0`.
        """
        d = u.shape[-1]
        sigma2, sigma1 = self.weight[..., 0], self.bias[..., 0]
        m = jnp.mean(u, axis=-1)
        s = jnp.sqrt(jnp.mean((u - m[..., None]) ** 2, axis=-1))
        return d * ((sigma2 - s) ** 2 + (sigma1 - m) ** 2)


class SphereProjection(AbstractProjection):
    r"""Projection onto the unit sphere, `x ↦ x / ‖x‖` (unit-gain RMS normalization up to `√d`).

    Tangent projection `P⊥_x v = v − ⟨x, v⟩ x`. The constraint set of paper B's particles.
    """

    def __call__(self, u: Tokens) -> Tokens:
        return u / jnp.linalg.norm(u, axis=-1, keepdims=True)

    def tangent(self, u: Tokens, v: Tokens) -> Tokens:
        return v - jnp.sum(u * v, axis=-1, keepdims=True) * u


class NonnegativeProjection(AbstractProjection):
    r"""Projection onto the nonnegative orthant S2: `argmin_{w ≥ 0} ‖w − v‖² = max(v, 0)` (ReLU).

    The tangent *cone* at `u ≥ 0` leaves free the coordinates with `u > 0` and keeps only the
    nonnegative part of `v` where `u = 0`.
    """

    def __call__(self, u: Tokens) -> Tokens:
        return jnp.maximum(u, 0)

    def tangent(self, u: Tokens, v: Tokens) -> Tokens:
        return jnp.where(u > 0, v, jnp.maximum(v, 0))
