"""The feed-forward block: integral operators in the feature variable plus a pointwise projection."""

from collections.abc import Callable

import equinox as eqx
from jaxtyping import Array, Float

from .._types import KeyMask, Tokens
from ._activations import relu
from ._base import AbstractTerm


class FeedForward(AbstractTerm):
    r"""The feed-forward term `F(u) = σ(u W_1 + b_1) W_2 + b_2` (docs/equations.md).

    For a hidden width `m ≠ d` the whole block is one integral-operator term whose inner
    integral runs over a hidden feature domain of size `m`. With `σ = relu` the activation is the
    projection onto the nonnegative orthant S2.

    **Arguments:**

    - `hidden`: `W_1`, shape `(d, m)`; `hidden_bias`: `b_1`, shape `(m,)` or `None`.
    - `output`: `W_2`, shape `(m, d)`; `output_bias`: `b_2`, shape `(d,)` or `None`.
    - `activation`: a pointwise function (`workbench.terms.relu`, `gelu`, `gelu_tanh`, ...).
    """

    hidden: Float[Array, "d m"]
    hidden_bias: Float[Array, " m"] | None
    output: Float[Array, "m d"]
    output_bias: Float[Array, " d"] | None
    activation: Callable = eqx.field(static=True, default=relu)

    def __check_init__(self):
        d, m = self.hidden.shape[-2:]
        if tuple(self.output.shape[-2:]) != (m, d):
            raise ValueError(
                f"FeedForward.output has shape {tuple(self.output.shape[-2:])}; expected {(m, d)} "
                f"to match hidden of shape {(d, m)}."
            )
        for name, width in (("hidden_bias", m), ("output_bias", d)):
            b = getattr(self, name)
            if b is not None and b.shape[-1] != width:
                raise ValueError(f"FeedForward.{name} has width {b.shape[-1]}; expected {width}.")

    @property
    def width(self) -> int:
        """The model width d."""
        return self.hidden.shape[-2]

    def vector_field(self, u: Tokens, *, mask: KeyMask | None = None) -> Tokens:
        del mask
        h = u @ self.hidden
        if self.hidden_bias is not None:
            h = h + self.hidden_bias
        y = self.activation(h) @ self.output
        return y if self.output_bias is None else y + self.output_bias


class LinearKernel(AbstractTerm):
    r"""Paper A's width-`d` linear term `⟨W_j, u⟩_{Ω_y} + b_j`, discretely `u W_j + b_j`.

    Its explicit Euler substep with τ = 1 is `u (I + W_j) + b_j`: the paper's feed-forward
    substeps carry the identity, so a standard layer's weight is `W̃_j = I + W_j`.
    """

    weight: Float[Array, "d d"]
    bias: Float[Array, " d"] | None

    def __check_init__(self):
        if self.weight.shape[-1] != self.weight.shape[-2]:
            raise ValueError(f"LinearKernel.weight must be square (d, d); got {self.weight.shape}.")

    @property
    def width(self) -> int:
        """The model width d."""
        return self.weight.shape[-1]

    def vector_field(self, u: Tokens, *, mask: KeyMask | None = None) -> Tokens:
        del mask
        y = u @ self.weight
        return y if self.bias is None else y + self.bias
