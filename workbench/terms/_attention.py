"""Multi-head self-attention: a nonlocal integral operator in the token variable."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._checks import positive_int
from .._types import KeyMask, Tokens
from ._base import AbstractTerm
from ._mask import check_mask


class MultiHeadAttention(AbstractTerm):
    r"""Multi-head self-attention as the vector field of the attention term (docs/equations.md).

    $$A(u)_i = \sum_h \sum_{j \in J(i)} \gamma^h_{ij}\, (u_j W_V^h + b_V^h)\, W_O^h + b_O,\qquad
      \gamma^h_{ij} = \operatorname{softmax}_{j \in J(i)}\big(s\,(u_i W_Q^h + b_Q^h)\cdot(u_j W_K^h + b_K^h)\big)$$

    The softmax is the discrete form of the normalized kernel $\gamma(x, \tilde x)$: token quadrature
    weights cancel inside it. $J(i)$ is every token (a Fredholm operator), or only $j \le i$ when
    `causal` (a Volterra operator), minus padding tokens when a key mask is given: `mask[j]` True
    (or 1) = attend to token j, False (or 0) = padding, as Hugging Face's `attention_mask` and the
    opposite of torch's `src_key_padding_mask` (pass `~mask`); see `check_mask` for what is
    rejected. The concatenation of heads followed by $W_O$ equals the sum over heads of $W_O^h$,
    the head variable's integral.

    Weights use the `x @ W` convention: `query` has shape `(d, d_qk)`, `output` `(d_v, d)`.

    **Arguments:**

    - `query`, `key`, `value`, `output`: the kernels; `*_bias` the biases (or `None`).
    - `num_heads`: number of heads; must divide `d_qk` and `d_v`.
    - `scale`: the factor $s$ in front of the scores; `None` means `1/sqrt(d_qk / num_heads)`,
      the discrete $|\Omega_y|^{-1/2}$ per head.
    - `causal`: restrict the integral to $\tilde x \le x$.
    """

    query: Float[Array, "d dqk"]
    key: Float[Array, "d dqk"]
    value: Float[Array, "d dv"]
    output: Float[Array, "dv d"]
    query_bias: Float[Array, " dqk"] | None
    key_bias: Float[Array, " dqk"] | None
    value_bias: Float[Array, " dv"] | None
    output_bias: Float[Array, " d"] | None
    num_heads: int = eqx.field(static=True)
    scale: float = eqx.field(static=True)
    causal: bool = eqx.field(static=True)

    def __init__(
        self,
        query,
        key,
        value,
        output,
        query_bias=None,
        key_bias=None,
        value_bias=None,
        output_bias=None,
        *,
        num_heads: int,
        scale: float | None = None,
        causal: bool = False,
    ):
        self.query, self.key, self.value, self.output = query, key, value, output
        self.query_bias, self.key_bias = query_bias, key_bias
        self.value_bias, self.output_bias = value_bias, output_bias
        positive_int("num_heads", num_heads, numpy_ints=False)
        self.num_heads = num_heads
        d_qk = query.shape[-1]
        if d_qk % num_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} does not divide the query/key width {d_qk}; "
                f"choose num_heads among the divisors of {d_qk}: {_divisors(d_qk)}."
            )
        self.scale = float(1.0 / math.sqrt(d_qk // num_heads) if scale is None else scale)
        self.causal = bool(causal)

    def __check_init__(self):
        q, k, v, o = self.query, self.key, self.value, self.output
        # Stacked controls carry a leading layer axis; check the trailing (per-layer) shapes.
        d, d_qk, d_v = q.shape[-2], q.shape[-1], v.shape[-1]
        checks = (
            ("key", tuple(k.shape[-2:]), (d, d_qk)),
            ("value", tuple(v.shape[-2:-1]), (d,)),
            ("output", tuple(o.shape[-2:]), (d_v, d)),
        )
        for name, got, want in checks:
            if got != want:
                raise ValueError(f"MultiHeadAttention.{name} has shape {got}; expected {want}.")
        if d_v % self.num_heads != 0:
            raise ValueError(f"num_heads={self.num_heads} does not divide the value width {d_v}.")
        for name, width in (
            ("query_bias", d_qk),
            ("key_bias", d_qk),
            ("value_bias", d_v),
            ("output_bias", d),
        ):
            b = getattr(self, name)
            if b is not None and b.shape[-1] != width:
                raise ValueError(
                    f"MultiHeadAttention.{name} has width {b.shape[-1]}; expected {width}."
                )

    @property
    def width(self) -> int:
        """The model width d."""
        return self.query.shape[-2]

    def _logits(self, u: Tokens, mask: KeyMask | None) -> Float[Array, "heads n n"]:
        """The scores `s q_i·k_j`, `-inf` where `j` is not admissible."""
        n = u.shape[0]
        mask = check_mask(mask, n, causal=self.causal, traced=False)
        q = _heads(_affine(u, self.query, self.query_bias), self.num_heads)
        k = _heads(_affine(u, self.key, self.key_bias), self.num_heads)
        s = self.scale * jnp.einsum("hik,hjk->hij", q, k)
        allowed = None
        if self.causal:
            allowed = jnp.tril(jnp.ones((n, n), dtype=bool))
        if mask is not None:
            key_ok = jnp.broadcast_to(mask[None, :], (n, n))
            allowed = key_ok if allowed is None else allowed & key_ok
        return s if allowed is None else jnp.where(allowed, s, -jnp.inf)

    def scores(self, u: Tokens, *, mask: KeyMask | None = None) -> Float[Array, "heads n n"]:
        """The attention weights `γ^h_{ij}` (rows sum to one over the admissible `j`).

        `mask`: optional key-padding mask `(n,)`, True/1 = attend (checked by `check_mask`: its
        values at once when concrete; under `jit` the entry points `integrate` and the models
        check them once per call).
        """
        return jax.nn.softmax(self._logits(u, mask), axis=-1)

    def vector_field(self, u: Tokens, *, mask: KeyMask | None = None) -> Tokens:
        # The softmax's normalization is applied after the value integral:
        # Σ_j γ_ij v_j = (Σ_j e_ij v_j) / Σ_j e_ij with e_ij = exp(s_ij − max_j s_ij), which
        # divides an (n, d_v / H) array instead of the (n, n) weights (a few % of a BERT forward).
        s = self._logits(u, mask)
        e = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
        v = _heads(_affine(u, self.value, self.value_bias), self.num_heads)
        # Head-major batched matmul, then one transpose: XLA:CPU fuses this better than "->ihk".
        z = jnp.einsum("hij,hjk->hik", e, v) / jnp.sum(e, axis=-1, keepdims=True)
        z = z.transpose(1, 0, 2).reshape(u.shape[0], -1)
        return _affine(z, self.output, self.output_bias)


def _affine(x, w, b):
    y = x @ w
    return y if b is None else y + b


def _heads(x, num_heads):
    n, width = x.shape
    return x.reshape(n, num_heads, width // num_heads).transpose(1, 0, 2)


def _divisors(m: int) -> list[int]:
    return [k for k in range(1, m + 1) if m % k == 0]
