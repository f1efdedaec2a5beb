"""Abstract bases: smooth terms of the equation and the projections onto constraint sets."""

import abc

import equinox as eqx
from jaxtyping import Array, Float

from .._types import KeyMask, Tokens


class AbstractTerm(eqx.Module):
    """A smooth term `G(u; θ)` of the Transformer equation `u_t = Σ_k G_k(u; θ(t))`.

    A term holds its own parameters θ (its controls at one instant). Its vector field
    maps a state `u` of shape `(n, d)` to a velocity of the same shape; its substep map is
    one explicit Euler step `u + τ G(u)`, which with `τ = 1` is the residual branch of a
    Transformer layer.
    """

    @property
    def width(self) -> int | None:
        """The feature width d of the states this term acts on (`None` when it cannot tell)."""
        return None

    @abc.abstractmethod
    def vector_field(self, u: Tokens, *, mask: KeyMask | None = None) -> Tokens:
        """The velocity `G(u; θ)`; `mask`: optional key-padding mask `(n,)`, True/1 = attend."""

    def substep(self, u: Tokens, tau, *, mask: KeyMask | None = None) -> Tokens:
        """One explicit Euler step `u + τ G(u)` (the layer's residual update when τ = 1)."""
        return u + tau * self.vector_field(u, mask=mask)


class AbstractProjection(eqx.Module):
    """A projection `P_C` onto a constraint set `C` (the resolvent of the normal cone).

    `(I + τ ∂I_C)^{-1} = P_C` for every τ > 0, so the substep map of a constraint does not
    depend on the step size.
    """

    @abc.abstractmethod
    def __call__(self, u: Tokens) -> Tokens:
        """The projection `P_C(u)`, row by row."""

    @abc.abstractmethod
    def tangent(self, u: Tokens, v: Tokens) -> Tokens:
        """Orthogonal projection of a velocity `v` onto the tangent space (or cone) of `C` at `u ∈ C`."""

    def retract(self, u: Tokens) -> Tokens:
        """A smooth map onto `C` that is the identity on `C` (a retraction), used by projection
        methods for the projected ODE (`Projected()`). By default the projection itself."""
        return self(u)

    def substep(self, u: Tokens, tau=None) -> Tokens:
        """The constraint's substep map, `P_C(u)` for any step size."""
        del tau
        return self(u)

    def distance(self, u: Tokens) -> Float[Array, " n"]:
        """Euclidean distance of each row of `u` to `C` (by default `‖u − P_C(u)‖`)."""
        import jax.numpy as jnp

        return jnp.linalg.norm(u - self(u), axis=-1)
