r"""Convolutional attention (CvT): the attention integral with locally smoothed, coarsened
queries, keys and values.

The tokens of a CvT stage are the values of `u(x)` at the points of a 2-D grid (row-major), plus
optionally a class token that is not on the grid. Before the usual linear maps, each of Q, K, V
applies a local integral operator in the spatial variable to the grid tokens,
`(K_c u)(x) = Σ_{|x' − x| ≤ r} k_c(x' − x) u_c(x')` per feature channel `c` (a depthwise
convolution, diagonal in the feature variable), followed by batch normalization in inference
form, the per-channel affine map `γ_c (y − μ_c)/√(σ²_c + ε) + β_c`. With stride `s > 1` the
result is sampled on a grid `s` times coarser: keys and values then live on a coarser quadrature
of the token variable, so the nonlocal attention integral is computed with fewer nodes.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._types import KeyMask, Tokens
from ._attention import _affine, _divisors, _heads
from ._base import AbstractTerm


class DepthwiseConvolution(eqx.Module):
    r"""A depthwise convolution followed by batch normalization in inference form.

    `y_c = BN_c((k_c * u_c)(s·))`: for each feature channel `c` its own `(k, k)` kernel (no bias),
    zero padding `padding` on each side, stride `stride`, then
    `γ_c (y_c − μ_c) / √(σ²_c + ε) + β_c` with the running statistics `μ`, `σ²`.

    **Arguments:** `kernel` `(d, 1, k, k)` (PyTorch's `Conv2d(groups=d)` layout); `scale`,
    `shift`, `mean`, `variance` `(d,)` (BatchNorm's `weight`, `bias`, `running_mean`,
    `running_var`); `eps`; `stride`, `padding` integers.
    """

    kernel: Float[Array, "d 1 k k"]
    scale: Float[Array, " d"]
    shift: Float[Array, " d"]
    mean: Float[Array, " d"]
    variance: Float[Array, " d"]
    eps: float = eqx.field(static=True, default=1e-5)
    stride: int = eqx.field(static=True, default=1)
    padding: int = eqx.field(static=True, default=1)

    def output_grid(self, grid: tuple[int, int]) -> tuple[int, int]:
        """The grid `(rows, cols)` of the output for an input grid `grid`."""
        k = self.kernel.shape[-1]
        return tuple((g + 2 * self.padding - k) // self.stride + 1 for g in grid)

    def __call__(self, x: Float[Array, "d h w"]) -> Float[Array, "d h2 w2"]:
        p = self.padding
        y = jax.lax.conv_general_dilated(
            x[None],
            self.kernel,
            window_strides=(self.stride, self.stride),
            padding=((p, p), (p, p)),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
            feature_group_count=x.shape[0],
        )[0]
        inv = jax.lax.rsqrt(self.variance + self.eps)
        c = lambda a: a[:, None, None]
        return (y - c(self.mean)) * c(inv) * c(self.scale) + c(self.shift)


class ConvolutionalAttention(AbstractTerm):
    r"""CvT's multi-head self-attention with convolutional projections, as a term of the equation.

    With `u = [c; u_g]` (an optional class token `c`, then the grid tokens `u_g` in row-major
    order over `grid`), `q = [c; D_Q u_g] W_Q + b_Q`, `k = [c; D_K u_g] W_K + b_K`,
    `v = [c; D_V u_g] W_V + b_V` with `D_•` the `DepthwiseConvolution`s (local integral operators
    in space; the class token bypasses them), then per head
    `A(u)_i = Σ_j softmax_j(s q_i·k_j) v_j`, heads concatenated and mapped by `W_O, b_O`.
    Keys and values have as many rows as `D_K` leaves grid points (plus the class token): with a
    stride of 2 the attention integral uses a grid twice coarser in each direction.

    `scale` is the factor `s`; Hugging Face's CvT uses `d^{-1/2}` with `d` the full width, not
    the head width.

    **Arguments:** `query_conv`, `key_conv`, `value_conv`: `DepthwiseConvolution`s;
    `query`, `key`, `value`, `output` `(d, d)` in the `x @ W` convention, their biases `(d,)` or
    `None`; `num_heads`; `scale`; `grid` `(rows, cols)` of the grid tokens; `class_token`: whether
    row 0 is a class token.
    """

    query_conv: DepthwiseConvolution
    key_conv: DepthwiseConvolution
    value_conv: DepthwiseConvolution
    query: Float[Array, "d d"]
    key: Float[Array, "d d"]
    value: Float[Array, "d d"]
    output: Float[Array, "d d"]
    query_bias: Float[Array, " d"] | None
    key_bias: Float[Array, " d"] | None
    value_bias: Float[Array, " d"] | None
    output_bias: Float[Array, " d"] | None
    num_heads: int = eqx.field(static=True)
    scale: float = eqx.field(static=True)
    grid: tuple[int, int] = eqx.field(static=True)
    class_token: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        d = self.query.shape[-1]
        if d % self.num_heads != 0:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide the width d={d}; "
                f"valid: {_divisors(d)}."
            )
        for name in ("query", "key", "value", "output"):
            got = tuple(getattr(self, name).shape[-2:])
            if got != (d, d):
                raise ValueError(
                    f"ConvolutionalAttention.{name} has shape {got}; expected {(d, d)}."
                )

    @property
    def width(self) -> int:
        """The model width d."""
        return self.query.shape[-1]

    @property
    def num_tokens(self) -> int:
        """Rows of the state: grid points, plus one for the class token."""
        return self.grid[0] * self.grid[1] + int(self.class_token)

    def _project(self, conv: DepthwiseConvolution, cls, grid_tokens, w, b):
        image = grid_tokens.T.reshape(-1, *self.grid)
        y = conv(image)
        y = y.reshape(y.shape[0], -1).T
        if cls is not None:
            y = jnp.concatenate([cls, y])
        return _heads(_affine(y, w, b), self.num_heads)

    def vector_field(self, u: Tokens, *, mask: KeyMask | None = None) -> Tokens:
        if mask is not None:
            raise ValueError(
                "ConvolutionalAttention takes no key-padding mask (mask=None): every grid point "
                "is a real token."
            )
        if u.shape[0] != self.num_tokens:
            raise ValueError(
                f"ConvolutionalAttention: u has {u.shape[0]} rows; this term acts on a "
                f"{self.grid[0]}×{self.grid[1]} grid{' plus a class token' * self.class_token} "
                f"= {self.num_tokens} tokens."
            )
        cls, g = (u[:1], u[1:]) if self.class_token else (None, u)
        q = self._project(self.query_conv, cls, g, self.query, self.query_bias)
        k = self._project(self.key_conv, cls, g, self.key, self.key_bias)
        v = self._project(self.value_conv, cls, g, self.value, self.value_bias)
        gamma = jax.nn.softmax(self.scale * jnp.einsum("hik,hjk->hij", q, k), axis=-1)
        z = jnp.einsum("hij,hjk->hik", gamma, v).transpose(1, 0, 2).reshape(u.shape[0], -1)
        return _affine(z, self.output, self.output_bias)
