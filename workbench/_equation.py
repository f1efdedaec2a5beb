"""An equation: terms with their constraint sets, a constraint placement, and an output map."""

import abc

import equinox as eqx
import jax

from ._controls import AbstractControl, Constant
from ._types import KeyMask, Tokens
from .schemes._runge_kutta import AbstractExplicitRK
from .terms._base import AbstractProjection


class AbstractPlacement(eqx.Module):
    """Where a term's constraint sits relative to the term (post-norm or pre-norm)."""

    @abc.abstractmethod
    def subflow(self, rk, term_at, proj_at, t, u, h, mask, substeps: int = 1):
        """Advance `u` by the sub-flow of one operator over `[t, t + h]`, solved by `substeps`
        steps of `rk`."""

    @abc.abstractmethod
    def field(self, term, proj, u, mask):
        """The operator's contribution to the continuous vector field at `u`."""


class PostNorm(AbstractPlacement):
    r"""Solve `u_t = G_k(u)`, then project: `u ← P_k(φ^{G_k}_h(u))` (post-LN, BERT, Vaswani 2017).

    With Euler and h = 1: `LN(u + G(u))`. The continuous limit is the projected ODE (docs/equations.md).
    """

    def subflow(self, rk, term_at, proj_at, t, u, h, mask, substeps: int = 1):
        u = _rk_steps(rk, lambda s, v: term_at(s).vector_field(v, mask=mask), t, u, h, substeps)
        return u if proj_at is None else proj_at(t + h)(u)

    def field(self, term, proj, u, mask):
        del proj
        return term.vector_field(u, mask=mask)


class PreNorm(AbstractPlacement):
    r"""The projection sits inside the operator: `u_t = G_k(P_k(u))` (pre-LN, GPT-2, ViT).

    With Euler and h = 1: `u + G(LN(u))`. This equation is smooth wherever the feature variance is
    positive, so every scheme keeps its classical order on it.
    """

    def subflow(self, rk, term_at, proj_at, t, u, h, mask, substeps: int = 1):
        def f(s, v):
            w = v if proj_at is None else proj_at(s)(v)
            return term_at(s).vector_field(w, mask=mask)

        return _rk_steps(rk, f, t, u, h, substeps)

    def field(self, term, proj, u, mask):
        return term.vector_field(u if proj is None else proj(u), mask=mask)


def _rk_steps(rk, f, t, u, h, substeps: int):
    """`substeps` steps of `rk` over `[t, t + h]` (one step: exactly `rk.step`)."""
    if substeps == 1:
        return rk.step(f, t, u, h)
    dt = h / substeps

    def body(i, v):
        return rk.step(f, t + i * dt, v, dt)

    return jax.lax.fori_loop(0, substeps, body, u)


class Operator(eqx.Module):
    """One split piece of the equation: a term θ(t) ↦ G and its constraint θ(t) ↦ P (or None)."""

    term: AbstractControl
    projection: AbstractControl | None = None


class Equation(eqx.Module):
    r"""The Transformer equation `u_t = Σ_k G_k(u; θ(t))` with constraints, on `[0, T]`.

    **Arguments:**

    - `operators`: the split pieces, in the order of a Lie step (attention, then feed-forward).
    - `placement`: `PostNorm()` or `PreNorm()`.
    - `output`: a projection applied at `T` (GPT-2's `ln_f`, a final encoder norm), or `None`.

    All controls share the same number of pieces (layers) and piece length.
    """

    operators: tuple[Operator, ...]
    placement: AbstractPlacement
    output: AbstractProjection | None = None

    def __check_init__(self):
        if not self.operators:
            raise ValueError("Equation needs at least one operator.")
        shapes = {(c.num_pieces, c.piece_length) for c in self._controls()}
        if len(shapes) != 1:
            raise ValueError(
                f"Equation: all controls must share (num_pieces, piece_length); got {sorted(shapes)}."
            )

    def _controls(self):
        for op in self.operators:
            yield op.term
            if op.projection is not None:
                yield op.projection

    @property
    def num_pieces(self) -> int:
        return self.operators[0].term.num_pieces

    @property
    def piece_length(self) -> float:
        return self.operators[0].term.piece_length

    @property
    def t1(self) -> float:
        return self.num_pieces * self.piece_length

    @property
    def is_piecewise_constant(self) -> bool:
        return all(c.is_piecewise_constant for c in self._controls())

    @property
    def width(self) -> int | None:
        """The feature width d of the states, read off the first term that knows it (`None` if
        no term does, e.g. a custom term without a `width`)."""
        for op in self.operators:
            term = op.term.value if isinstance(op.term, Constant) else op.term.values
            width = getattr(term, "width", None)
            if width is not None:
                return int(width)
        return None

    def localize(self, piece) -> "Equation":
        """The same equation with every control restricted to piece (layer) `piece`."""
        ops = tuple(
            Operator(
                op.term.localize(piece),
                None if op.projection is None else op.projection.localize(piece),
            )
            for op in self.operators
        )
        return Equation(ops, self.placement, self.output)

    def subflow(
        self,
        k: int,
        rk: AbstractExplicitRK,
        t,
        u: Tokens,
        h,
        mask: KeyMask | None,
        *,
        clock_moves: bool = True,
        substeps: int = 1,
    ):
        """Advance `u` over `[t, t + h]` along operator `k` alone, with `substeps` steps of `rk`
        (then, for `PostNorm`, the projection).

        Splitting a non-autonomous equation is done on the autonomous system augmented by the
        clock `t' = 1`, which one operator carries (`clock_moves=True`); for the others time is
        frozen at `t` during their sub-flow, so their controls are evaluated once, at `t`.
        """
        op = self.operators[k]
        if clock_moves:
            term_at = op.term.evaluate
            proj_at = None if op.projection is None else op.projection.evaluate
        else:
            term, proj = (
                op.term.evaluate(t),
                None if op.projection is None else op.projection.evaluate(t),
            )
            term_at = lambda s: term
            proj_at = None if proj is None else (lambda s: proj)
        return self.placement.subflow(rk, term_at, proj_at, t, u, h, mask, substeps)

    def vector_field(self, t, u: Tokens, mask: KeyMask | None = None) -> Tokens:
        r"""The full field `Σ_k G_k(u; θ(t))` (pre-norm: `Σ_k G_k(P_k(u))`).

        For post-norm equations this is the unconstrained drift; the constraints act through the
        projections of the schemes (or the projected ODE of docs/equations.md).
        """
        out = None
        for op in self.operators:
            proj = None if op.projection is None else op.projection.evaluate(t)
            v = self.placement.field(op.term.evaluate(t), proj, u, mask)
            out = v if out is None else out + v
        return out

    def output_map(self, u: Tokens) -> Tokens:
        return u if self.output is None else self.output(u)
