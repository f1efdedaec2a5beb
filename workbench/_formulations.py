r"""Which continuous equation a diffrax solver integrates: the natural field, the projected ODE,
or the penalty (Moreau–Yosida) form (docs/equations.md, 'The constrained limit')."""

import abc

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from ._checks import positive_float
from ._equation import Equation, PostNorm
from .solvers._projected import ProjectedSolver


class AbstractFormulation(eqx.Module):
    """How the constraints of an `Equation` enter a continuous solve (diffrax path of `integrate`)."""

    @abc.abstractmethod
    def check(self, equation: Equation) -> None:
        """Trace-time check that this formulation applies to `equation`."""

    @abc.abstractmethod
    def terms(self, equation: Equation, mask, *, imex: bool):
        """The diffrax term(s): one `ODETerm`, or `MultiTerm(explicit, implicit)` when `imex`.

        The terms' functions read the equation and mask from diffrax's `args = (equation,
        mask)` (so adjoints see the controls as inputs, not closed-over constants)."""

    def solver(self, equation: Equation, solver: diffrax.AbstractSolver) -> diffrax.AbstractSolver:
        """The solver to run (possibly wrapped)."""
        del equation
        return solver

    def initial(self, equation: Equation, u0):
        """The initial state of the continuous problem."""
        del equation
        return u0

    @property
    def has_stiff_part(self) -> bool:
        return False


def _constraint(equation: Equation):
    """The constraint set's control: that of the last operator (where a layer's output lives)."""
    # (For the penalty the retraction plays P_S: for a non-constant γ, LayerNorm's map is not
    # the identity on its own image's set, the retraction is.)
    op = equation.operators[-1]
    if op.projection is None:
        raise ValueError(
            "this formulation needs a constraint set, but the equation's last operator has no "
            "projection; use formulation=Natural()."
        )
    return op.projection


def _is_post_norm(equation: Equation) -> bool:
    return isinstance(equation.placement, PostNorm) and any(
        op.projection is not None for op in equation.operators
    )


class Natural(AbstractFormulation):
    r"""The equation's own smooth field `u_t = Σ_k G_k(u; θ(t))` (pre-norm: `Σ_k G_k(P_k(u))`).

    The default for pre-norm equations, whose projections sit inside the operators. Post-norm
    equations need `Projected()` or `Penalty(ε)` (their constraints act on the state).
    """

    def check(self, equation: Equation) -> None:
        if _is_post_norm(equation):
            raise ValueError(
                "formulation=Natural() ignores the constraints of a post-norm equation; pass "
                "formulation=Projected() (the projected ODE) or Penalty(epsilon)."
            )

    def terms(self, equation: Equation, mask, *, imex: bool):
        del equation, imex
        # The equation and mask come through `args = (equation, mask)`, not a closure, so
        # diffrax's adjoints (BacksolveAdjoint) differentiate the controls.
        return diffrax.ODETerm(_natural_field)


def _natural_field(t, u, args):
    equation, mask = args
    return equation.vector_field(t, u, mask)


class Projected(AbstractFormulation):
    r"""The projected ODE `u_t = P_{T_u S}(Σ_k G_k(u))` on the constraint set `S` (docs/equations.md).

    `S` is the set of the last operator's projection (the LayerNorm set where a post-norm
    layer's output lives; for models with one norm per operator this is a modelling choice: the
    continuous limit of alternating two different sets is not a single constrained ODE). The
    tangent projection `P_{T_u S}` is the differential of the constraint's `retract` at `u`
    (orthogonal for `S1(σ1, σ2)`; oblique along the retraction's fibres for a LayerNorm with a
    non-constant γ, which is the limit of `Penalty(ε)`). The solver is wrapped in
    `ProjectedSolver`, which maps every step back onto `S` with the constraint's `retract`
    (exact, no `eps`), keeping the solver's order; the initial state is mapped onto `S` first.
    """

    def check(self, equation: Equation) -> None:
        if not _is_post_norm(equation):
            raise ValueError(
                "formulation=Projected() needs a post-norm equation (constraints on the state); "
                "pre-norm equations are smooth: use formulation=Natural() (the default)."
            )
        _constraint(equation)

    def terms(self, equation: Equation, mask, *, imex: bool):
        del equation, mask, imex

        def field(t, u, args):
            equation, mask = args
            constraint = _constraint(equation)
            # The tangent map of the retraction r at u ∈ S: a projection onto T_u S, orthogonal
            # when r is the Euclidean projection (γ, β constant), oblique along r's fibres
            # otherwise — the limit of the penalty form either way.
            v = equation.vector_field(t, u, mask)
            return jax.jvp(constraint.evaluate(t).retract, (u,), (v,))[1]

        return diffrax.ODETerm(field)

    def solver(self, equation: Equation, solver: diffrax.AbstractSolver) -> diffrax.AbstractSolver:
        constraint = _constraint(equation)
        return ProjectedSolver(solver, lambda t, u: constraint.evaluate(t).retract(u))

    def initial(self, equation: Equation, u0):
        return _constraint(equation).evaluate(0.0).retract(u0)


class Penalty(AbstractFormulation):
    r"""The penalty (Moreau–Yosida) form `u_t = Σ_k G_k(u) − (u − P_S(u))/ε`.

    It converges to the projected ODE as `ε → 0`, with distance `O(ε)`, and is stiff: the
    penalty's Jacobian has eigenvalues `≈ −1/ε` normal to `S`. Implicit solvers
    (`diffrax.Kvaerno5()`) integrate the sum; IMEX solvers (`diffrax.KenCarp4()`) take the drift
    explicitly and the penalty implicitly. The initial state is projected onto `S`. `P_S` is
    the constraint's `retract` (the Euclidean projection for `S1(σ1, σ2)`).

    Give the implicit solver a Newton root finder, e.g.
    `diffrax.Kvaerno5(root_finder=optimistix.Newton(rtol=1e-8, atol=1e-8))`: diffrax's default
    chord iteration freezes the Jacobian over a step, converges poorly on this nonlinear
    penalty and forces rejected steps (measured, one layer, ε = 1e-4, tolerance 1e-6: 2354
    steps with the chord iteration, 20 with Newton).

    **Arguments:** `epsilon > 0` (a number, or a 0-d array to sweep ε without recompiling).
    """

    epsilon: float | jax.Array

    def __check_init__(self):
        eps = self.epsilon
        if isinstance(eps, jax.Array) and eps.ndim == 0:
            # A (0-d) array is a run-time value: sweeps over ε then share one compilation.
            if not isinstance(eps, jax.core.Tracer):
                positive_float("Penalty.epsilon", eps, finite=False, arrays=True, hint="e.g. 1e-4")
            return
        positive_float("Penalty.epsilon", eps, finite=False, hint="e.g. 1e-4")

    def check(self, equation: Equation) -> None:
        if not _is_post_norm(equation):
            raise ValueError(
                "formulation=Penalty(...) needs a post-norm equation (constraints on the state); "
                "pre-norm equations are smooth: use formulation=Natural() (the default)."
            )
        _constraint(equation)

    @property
    def has_stiff_part(self) -> bool:
        return True

    def terms(self, equation: Equation, mask, *, imex: bool):
        del equation, mask
        eps = self.epsilon

        def drift(t, u, args):
            equation, mask = args
            return equation.vector_field(t, u, mask)

        def penalty(t, u, args):
            equation, _ = args
            retract = _constraint(equation).evaluate(t).retract
            return (retract(u) - u) / jnp.asarray(eps, u.dtype)

        if imex:
            return diffrax.MultiTerm(diffrax.ODETerm(drift), diffrax.ODETerm(penalty))
        return diffrax.ODETerm(lambda t, u, args: drift(t, u, args) + penalty(t, u, args))

    def initial(self, equation: Equation, u0):
        return _constraint(equation).evaluate(0.0).retract(u0)


def default_formulation(equation: Equation) -> AbstractFormulation:
    return Projected() if _is_post_norm(equation) else Natural()
