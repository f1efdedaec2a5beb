"""A diffrax solver wrapper that maps every step back onto a constraint set (projection method)."""

from collections.abc import Callable

import diffrax


class ProjectedSolver(diffrax.AbstractWrappedSolver):
    r"""Wrap any diffrax solver so that every step ends on the constraint set `S`.

    For a projected ODE `u' = P_{T_u S}(G(u))` (docs/equations.md: the continuous limit of post-norm
    models and of tokens on the sphere) one step is `u₁ = π(Φ_h(u₀))`, where `Φ_h` is a step of
    the wrapped solver and `π` maps onto `S` (the LayerNorm map, the sphere normalization). Since
    the field is tangent to `S`, `Φ_h(u₀)` is within `O(h^{p+1})` of `S` and the projection keeps
    the wrapped solver's order `p` (Hairer, Lubich, Wanner, *Geometric Numerical Integration*,
    IV.4). The error estimate of an adaptive solver is the wrapped solver's (computed before the
    projection), so `diffrax.PIDController` works unchanged. Dense output interpolates the
    unprojected step.

    **Arguments:**

    - `solver`: the diffrax solver to wrap (`diffrax.Euler()`, `diffrax.Heun()`,
      `ClassicalRK4()`, `diffrax.Tsit5()`, ...).
    - `projection`: `(t, u) -> π(u)`, a map onto the constraint set that is the identity on it.

    **Example:** `ProjectedSolver(diffrax.Heun(), lambda t, u: u / jnp.linalg.norm(u))`.
    """

    solver: diffrax.AbstractSolver
    projection: Callable

    def __check_init__(self):
        if not isinstance(self.solver, diffrax.AbstractSolver):
            raise ValueError(
                f"ProjectedSolver.solver={self.solver!r} is not a diffrax solver; pass e.g. "
                "diffrax.Heun() or diffrax.Tsit5()."
            )
        if not callable(self.projection):
            raise ValueError(
                f"ProjectedSolver.projection={self.projection!r} must be a callable (t, u) -> u."
            )

    @property
    def term_structure(self):
        return self.solver.term_structure

    @property
    def interpolation_cls(self):  # pyright: ignore
        return self.solver.interpolation_cls

    @property
    def term_compatible_contr_kwargs(self):
        return self.solver.term_compatible_contr_kwargs

    def order(self, terms):
        return self.solver.order(terms)

    def strong_order(self, terms):
        return self.solver.strong_order(terms)

    def error_order(self, terms):
        return self.solver.error_order(terms)

    def init(self, terms, t0, t1, y0, args):
        return self.solver.init(terms, t0, t1, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, y_error, dense_info, solver_state, result = self.solver.step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        # A first-same-as-last solver (Tsit5, Dopri5, Bosh3) carries f(t1, y1) of the
        # *unprojected* y1 in its state and reuses it as the next step's first stage. The two
        # points differ by O(h^{p+1}), so that slope is off by O(h^{p+1}) and the step by
        # O(h^{p+2}): the order is kept, and recomputing the stage would cost one evaluation.
        y1 = self.projection(t1, y1)
        return y1, y_error, dense_info, solver_state, result

    def func(self, terms, t0, y0, args):
        return self.solver.func(terms, t0, y0, args)


ProjectedSolver.__init__.__doc__ = """**Arguments:**

- `solver`: the solver to wrap.
- `projection`: `(t, u) -> u` onto the constraint set.
"""
