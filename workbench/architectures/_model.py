"""Recovered architectures: an equation + controls + a scheme, and their embeddings."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .._controls import PiecewiseConstant
from .._equation import AbstractPlacement, Equation, Operator
from .._integrate import Solution, check_tokens, integrate
from .._types import KeyMask, TokenIds, Tokens
from ..schemes._splitting import AbstractSplittingScheme, LieTrotter
from ..terms._attention import MultiHeadAttention
from ..terms._feedforward import FeedForward
from ..terms._projections import LayerNormProjection


def transformer_equation(
    attention: MultiHeadAttention,
    attention_norm: LayerNormProjection,
    feedforward: FeedForward,
    feedforward_norm: LayerNormProjection,
    placement: AbstractPlacement,
    output: LayerNormProjection | None = None,
) -> Equation:
    """The two-operator equation (attention, feed-forward) from per-layer stacked terms.

    Every argument but `placement` and `output` carries a leading layer axis; layer `l` acts on
    `[l, l + 1)` (piecewise-constant controls).
    """
    return Equation(
        operators=(
            Operator(PiecewiseConstant(attention), PiecewiseConstant(attention_norm)),
            Operator(PiecewiseConstant(feedforward), PiecewiseConstant(feedforward_norm)),
        ),
        placement=placement,
        output=output,
    )


class Transformer(eqx.Module):
    r"""A Transformer as a discretized equation: `equation` solved by `scheme` with
    `steps_per_layer` steps per unit of time (one layer).

    With `LieTrotter()` and one step per layer this *is* the network; `rediscretize` changes the
    scheme and the step count while keeping the equation and its controls.

    **Arguments:**

    - `equation`: the `Equation` (terms, constraints, output map).
    - `scheme`: a splitting scheme, `LieTrotter()` by default.
    - `steps_per_layer`: steps per unit of time, 1 by default.

    Call it on one sequence `u` of shape `(n, d)`; batch with `jax.vmap`.
    """

    equation: Equation
    scheme: AbstractSplittingScheme = LieTrotter()
    steps_per_layer: int = eqx.field(static=True, default=1)

    def __check_init__(self):
        s = self.steps_per_layer
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(f"steps_per_layer={s!r} must be a positive integer.")

    @property
    def num_layers(self) -> int:
        return self.equation.num_pieces

    @property
    def d(self) -> int:
        """The model width d, read off the first term."""
        term = self.equation.operators[0].term.values
        return (
            term.query.shape[-2] if isinstance(term, MultiHeadAttention) else term.hidden.shape[-2]
        )

    def solve(self, u: Tokens, *, mask: KeyMask | None = None, **kwargs) -> Solution:
        """Integrate from `u`, returning the full `Solution` (states, counts, diagnostics)."""
        check_tokens(u, "u", self.d)
        return integrate(
            self.equation,
            u,
            self.scheme,
            num_steps=self.num_layers * self.steps_per_layer,
            mask=mask,
            u0_name="(the input tokens u)",
            **kwargs,
        )

    def __call__(self, u: Tokens, *, mask: KeyMask | None = None) -> Tokens:
        """The final hidden state `(n, d)` (the output map applied at `T`)."""
        return self.solve(u, mask=mask).y

    def rediscretize(
        self, scheme: AbstractSplittingScheme | None = None, steps_per_layer: int | None = None
    ) -> "Transformer":
        """The same equation and controls, solved with another scheme and/or step count."""
        return Transformer(
            self.equation,
            self.scheme if scheme is None else scheme,
            self.steps_per_layer if steps_per_layer is None else steps_per_layer,
        )


class BertEmbeddings(eqx.Module):
    """`LN(word[ids] + position[0..n) + token_type[types])`: the initial condition `f`."""

    word: Float[Array, "vocab d"]
    position: Float[Array, "positions d"]
    token_type: Float[Array, "types d"]
    norm: LayerNormProjection

    def __call__(self, input_ids: TokenIds, token_type_ids: TokenIds | None = None) -> Tokens:
        n = _check_ids(input_ids, "input_ids", self.position.shape[0])
        ids = _check_range(input_ids, self.word.shape[0], "input_ids")
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if jnp.shape(token_type_ids) != (n,):
            raise ValueError(
                f"token_type_ids has shape {jnp.shape(token_type_ids)}; expected {(n,)} like input_ids."
            )
        types = _check_range(token_type_ids, self.token_type.shape[0], "token_type_ids")
        e = self.word[ids] + self.position[:n] + self.token_type[types]
        return self.norm(e)


class GPT2Embeddings(eqx.Module):
    """`word[ids] + position[0..n)`: the initial condition `f` of GPT-2."""

    word: Float[Array, "vocab d"]
    position: Float[Array, "positions d"]

    def __call__(self, input_ids: TokenIds) -> Tokens:
        n = _check_ids(input_ids, "input_ids", self.position.shape[0])
        ids = _check_range(input_ids, self.word.shape[0], "input_ids")
        return self.word[ids] + self.position[:n]


class BERT(eqx.Module):
    """Hugging Face `BertModel` recovered: embeddings + post-norm equation (GELU), Lie τ = 1."""

    embeddings: BertEmbeddings
    transformer: Transformer

    def __call__(
        self,
        input_ids: TokenIds,
        token_type_ids: TokenIds | None = None,
        attention_mask: Int[Array, " n"] | None = None,
    ) -> Tokens:
        """`last_hidden_state` of one sequence, `(n, d)`; `attention_mask`: 1 = token, 0 = pad."""
        u = self.embeddings(input_ids, token_type_ids)
        mask = None if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
        return self.transformer(u, mask=mask)

    def rediscretize(self, scheme=None, steps_per_layer=None) -> "BERT":
        return BERT(self.embeddings, self.transformer.rediscretize(scheme, steps_per_layer))


class GPT2(eqx.Module):
    """Hugging Face `GPT2Model` recovered: embeddings + causal pre-norm equation + `ln_f`."""

    embeddings: GPT2Embeddings
    transformer: Transformer

    def __call__(self, input_ids: TokenIds) -> Tokens:
        """`last_hidden_state` of one sequence, `(n, d)`."""
        return self.transformer(self.embeddings(input_ids))

    def rediscretize(self, scheme=None, steps_per_layer=None) -> "GPT2":
        return GPT2(self.embeddings, self.transformer.rediscretize(scheme, steps_per_layer))


def _check_ids(ids, name: str, max_positions: int) -> int:
    shape = jnp.shape(ids)
    if len(shape) != 1:
        raise ValueError(
            f"{name} must be one sequence of shape (n,); got shape {shape}. Batch with jax.vmap."
        )
    if not jnp.issubdtype(jnp.asarray(ids).dtype, jnp.integer):
        raise ValueError(f"{name} must hold integers; got dtype {jnp.asarray(ids).dtype}.")
    n = shape[0]
    if not 1 <= n <= max_positions:
        raise ValueError(f"{name} has length {n}; this model takes 1 to {max_positions} tokens.")
    return n


def _check_range(ids, size: int, name: str):
    ids = jnp.asarray(ids)
    return eqx.error_if(ids, (ids < 0) | (ids >= size), f"{name} out of range [0, {size}).")
