"""Recovered architectures: an equation + controls + a scheme, and their embeddings."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PyTree

from .._bases import AbstractBasis
from .._checks import positive_int
from .._controls import AbstractControl, Constant, PiecewiseConstant
from .._equation import AbstractPlacement, Equation, Operator, PostNorm
from .._integrate import check_dtype, check_tokens, integrate
from .._solution import Solution
from .._types import KeyMask, TokenIds, Tokens
from ..schemes._splitting import AbstractSplittingScheme, LieTrotter
from ..terms._activations import relu
from ..terms._attention import MultiHeadAttention
from ..terms._feedforward import FeedForward
from ..terms._mask import check_mask
from ..terms._projections import LayerNormProjection

_SCHEME_CHOICES = (
    "wb.schemes.LieTrotter(), wb.schemes.Strang(), wb.schemes.Yoshida4() or wb.schemes.Suzuki4()"
)


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
    - `scheme`: a splitting scheme object, `LieTrotter()` by default (`Strang()`, `Yoshida4()`,
      `Suzuki4()`; a name such as `"strang"` is rejected).
    - `steps_per_layer`: steps per unit of time, 1 by default.

    Call it on one sequence `u` of shape `(n, d)`; batch with `jax.vmap`. A key-padding `mask`
    marks real tokens True (or 1), padding False (or 0): Hugging Face's `attention_mask`
    convention, the opposite of torch's `src_key_padding_mask` (pass `~mask`).
    """

    equation: Equation
    scheme: AbstractSplittingScheme = LieTrotter()
    steps_per_layer: int = eqx.field(static=True, default=1)

    def __check_init__(self):
        positive_int("steps_per_layer", self.steps_per_layer)
        scheme = self.scheme
        if not isinstance(scheme, AbstractSplittingScheme):
            if isinstance(scheme, str):
                hint = f" (a name such as {scheme!r} is not accepted: pass the object)"
            elif _is_diffrax_solver(scheme):
                hint = (
                    "; a diffrax solver integrates the continuous equation: "
                    "wb.integrate(m.equation, u, solver, num_steps=k * m.num_layers)"
                )
            else:
                hint = ""
            raise ValueError(
                f"scheme={scheme!r} is not a splitting scheme; pass one of {_SCHEME_CHOICES}{hint}."
            )

    @property
    def num_layers(self) -> int:
        return self.equation.num_pieces

    @property
    def d(self) -> int:
        """The model width d, read off the terms."""
        return self.equation.width

    @property
    def is_post_norm(self) -> bool:
        """Whether the constraints act on the state (`PostNorm` with at least one projection)."""
        return isinstance(self.equation.placement, PostNorm) and any(
            op.projection is not None for op in self.equation.operators
        )

    @property
    def expected_order(self) -> int:
        """The convergence order in `steps_per_layer` one can expect to observe.

        The scheme's order, except: on a post-norm model every "sub-flow, then project"
        composition converges at order 1 (Strang and Yoshida4 too); on a pre-norm model with a
        ReLU feed-forward the field is Lipschitz but not C¹ (kinks where a hidden unit changes
        sign), so no scheme shows more than about 2.
        """
        order = self.scheme.order()
        if self.is_post_norm:
            return 1
        if _has_relu(self.equation):
            return min(order, 2)
        return order

    def solve(self, u: Tokens, *, mask: KeyMask | None = None, **kwargs) -> Solution:
        """Integrate from `u`, returning the full `Solution` (states, counts, diagnostics)."""
        check_tokens(u, "u", self.d)
        check_dtype(self.equation, u, "u")
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
        """The final hidden state `(n, d)` (the output map applied at `T`).

        **Arguments:**

        - `u`: one sequence `(n, d)` in the weights' floating dtype: a float32 `u` for float64
          weights (or the reverse, with x64 on) is a `ValueError` naming both dtypes, not a
          silent promotion; cast with `u.astype(...)`.
        - `mask`: optional key-padding mask `(n,)`, True (or 1) = attend to the token, False
          (or 0) = padding: Hugging Face's `attention_mask` convention, the OPPOSITE of torch's
          `src_key_padding_mask` (True = padding; pass `~src_key_padding_mask`). Float
          (additive) masks, other shapes and masks with no real token are rejected.
        """
        return self.solve(u, mask=mask).y

    def rediscretize(
        self, scheme: AbstractSplittingScheme | None = None, steps_per_layer: int | None = None
    ) -> "Transformer":
        """The same equation and controls, solved with another scheme and/or step count.

        `scheme` must be a scheme object (`wb.schemes.Strang()`, not `"strang"`): anything else
        is a `ValueError` at once.

        What order to expect as `steps_per_layer` grows (also `expected_order`):

        - pre-norm, smooth activation (GELU): the scheme's order (Strang 2, Yoshida4 4);
        - post-norm: order 1 whatever the scheme, since each sub-flow is followed by a
          projection and "sub-flow, then project" compositions lose their order. A scheme of
          order > 1 then emits a `UserWarning`. For a high order solve the projected ODE
          instead, `wb.integrate(m.equation, u, wb.solvers.ClassicalRK4(),
          num_steps=k * m.num_layers, formulation=wb.Projected())` (any diffrax solver; it is
          wrapped in `wb.solvers.ProjectedSolver`, which keeps its order). Note that this is
          the continuous equation on the constraint set of the last operator's LayerNorm;
          with two different norms per layer it is not the limit of the splitting itself;
        - a ReLU feed-forward (Lipschitz, not a C¹ field): no more than about order 2 (1–2),
          even from fourth-order schemes.
        """
        out = Transformer(
            self.equation,
            self.scheme if scheme is None else scheme,
            self.steps_per_layer if steps_per_layer is None else steps_per_layer,
        )
        order = out.scheme.order()
        if out.is_post_norm and order > 1:
            warnings.warn(
                f"rediscretize: this is a post-norm model (a projection after every sub-flow), so "
                f"{type(out.scheme).__name__} (order {order}) will converge at order 1 as "
                "steps_per_layer grows: 'sub-flow, then project' compositions lose their order. "
                "For a high order solve the projected ODE: wb.integrate(m.equation, u, "
                "wb.solvers.ClassicalRK4(), num_steps=k * m.num_layers, "
                "formulation=wb.Projected()) (any diffrax solver, wrapped in "
                "wb.solvers.ProjectedSolver). The model's expected_order is 1.",
                UserWarning,
                stacklevel=_user_stacklevel(),
            )
        return out


def _is_diffrax_solver(x) -> bool:
    import diffrax

    return isinstance(x, diffrax.AbstractSolver)


def _has_relu(equation: Equation) -> bool:
    for op in equation.operators:
        values = op.term.value if isinstance(op.term, Constant) else op.term.values
        if isinstance(values, FeedForward) and values.activation is relu:
            return True
    return False


def _user_stacklevel() -> int:
    """The stack level of the first frame outside this module (BERT/GPT-2 forward to here)."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_globals.get("__name__") == __name__
        or str(frame.f_globals.get("__name__")).startswith("equinox")
    ):
        frame, level = frame.f_back, level + 1
    return level


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
        """`last_hidden_state` of one sequence, `(n, d)`.

        `attention_mask`: Hugging Face's, shape `(n,)` like `input_ids`, integer 1 (or True) =
        token, 0 (or False) = padding. Another length, float (additive) masks, integers other
        than 0/1 and all-padding masks are rejected before any compute.
        """
        n = _check_ids(input_ids, "input_ids", self.embeddings.position.shape[0])
        mask = check_mask(attention_mask, n, name="attention_mask")
        u = self.embeddings(input_ids, token_type_ids)
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


def to_basis(tree: PyTree, basis: AbstractBasis) -> PyTree:
    r"""`tree` (a model, a `Transformer`, an `Equation`) with every control projected onto
    `basis` (`AbstractBasis.project`): a network's layers mapped into a smooth basis, or a
    trained model compressed onto fewer functions, without data.

    A `Transformer` keeps its total number of steps over `[0, T]` where the new basis allows
    (`steps_per_layer · num_layers` steps, on the new pieces), else the nearest multiple of its
    new layer count (a tie goes to the larger: 6 steps onto 4 layers are 8, 10 are 12).
    """
    if not isinstance(basis, AbstractBasis):
        raise ValueError(
            f"basis={basis!r} is not a control basis; pass wb.PiecewiseConstantBasis(L), "
            "wb.PiecewiseLinearBasis(L), wb.LegendreBasis(degree) or wb.HypernetworkBasis(K, key=...)."
        )

    def is_node(x):
        return isinstance(x, (AbstractControl, Transformer))

    def convert(x):
        if isinstance(x, AbstractControl):
            return basis.project(x)
        if isinstance(x, Transformer):
            total = x.num_layers * x.steps_per_layer
            equation = to_basis(x.equation, basis)
            pieces = equation.num_pieces
            steps = max(1, (2 * total + pieces) // (2 * pieces))  # half up, not to even
            return Transformer(equation, x.scheme, steps)
        return x

    return jax.tree.map(convert, tree, is_leaf=is_node)
