r"""Fixed-step integrators that keep particles on the unit sphere.

Each integrator maps `x_k ∈ (S^{d−1})^n` to `x_{k+1}` for the tangent ODE `ẋ = P⊥_x F(x)` of a
`workbench.particles` dynamics. The projected methods take one explicit step of the tangent field
in `R^{n×d}` and renormalize every row: a projection method (Hairer, Lubich, Wanner, *Geometric
Numerical Integration*, §IV.4), which keeps the order of the underlying step because the sphere is
invariant for the extended field and the projection is smooth near it.
"""

import abc
from typing import ClassVar

import diffrax
import equinox as eqx
import jax.numpy as jnp

from .._table import Table
from .._types import Tokens
from ..schemes._runge_kutta import RK4, AbstractExplicitRK, Euler, Heun
from ..terms._projections import SphereProjection
from ._dynamics import AbstractDynamics

_SPHERE = SphereProjection()


class AbstractSphereIntegrator(eqx.Module):
    """A one-step method on the product of unit spheres: `step(dynamics, x, dt)` and `order()`."""

    @abc.abstractmethod
    def step(self, dynamics: AbstractDynamics, x: Tokens, dt) -> Tokens:
        """Advance the points `x` `(n, d)` by one step `dt` of `dynamics`; rows stay unit vectors."""

    @abc.abstractmethod
    def order(self) -> int:
        """The global order of accuracy (what the convergence tests assert)."""


class AbstractProjectedRK(AbstractSphereIntegrator):
    """One explicit Runge–Kutta step (a `workbench.schemes` tableau) of the tangent field, then
    the row normalization `x ↦ x / ‖x‖`. The order is the tableau's order.
    """

    method: ClassVar[AbstractExplicitRK]

    def step(self, dynamics: AbstractDynamics, x: Tokens, dt) -> Tokens:
        y = self.method.step(lambda t, u: dynamics.velocity(u), 0.0, x, dt)
        return _SPHERE(y)

    def order(self) -> int:
        return self.method.order()


class ProjectedEuler(AbstractProjectedRK):
    """Explicit Euler then renormalize, `x ← (x + dt ẋ) / ‖x + dt ẋ‖` row by row: order 1, one
    evaluation per step. The authors' integrator (paper B, Fig. 3: step 0.1, float64), i.e. the Lie
    splitting of the attention term and the sphere constraint.
    """

    method: ClassVar[AbstractExplicitRK] = Euler()


class ProjectedRK2(AbstractProjectedRK):
    """Heun's method (explicit trapezoid) on the tangent field then renormalize: order 2, two
    evaluations per step.
    """

    method: ClassVar[AbstractExplicitRK] = Heun()


class ProjectedRK4(AbstractProjectedRK):
    """The classical Runge–Kutta method on the tangent field then renormalize: order 4, four
    evaluations per step.
    """

    method: ClassVar[AbstractExplicitRK] = RK4()


class GeodesicEuler(AbstractSphereIntegrator):
    r"""Euler along geodesics: the exponential map of each sphere at `x_i` applied to `dt v_i`,

    $$x_i \leftarrow \cos(\|v_i\|\,dt)\,x_i + \sin(\|v_i\|\,dt)\,\frac{v_i}{\|v_i\|},
      \qquad v_i = P^\perp_{x_i} F_i(x).$$

    Order 1, one evaluation per step. Written with `dt·sinc`, so `v_i = 0` is exact and has finite
    derivatives. The exact exponential map keeps unit norm; the final renormalization only removes
    rounding drift over long runs.
    """

    def step(self, dynamics: AbstractDynamics, x: Tokens, dt) -> Tokens:
        v = dynamics.velocity(x)
        sq = jnp.sum(v * v, axis=-1, keepdims=True)
        # Double `where`: sqrt has an infinite derivative at 0.
        positive = sq > 0
        speed = jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)
        angle = speed * dt
        y = jnp.cos(angle) * x + (dt * jnp.sinc(angle / jnp.pi)) * v
        return _SPHERE(y)

    def order(self) -> int:
        return 1


class DiffraxProjected(AbstractSphereIntegrator):
    """One fixed step of any diffrax solver on the tangent ODE, then renormalize.

    Each step calls `solver.init` and `solver.step` on `[0, dt]` (the solver state is rebuilt after
    the projection, so FSAL solvers such as `Tsit5` re-evaluate their first stage); the embedded
    error estimate is ignored. The order is the solver's order for an ODE.

    **Arguments:** `solver`, e.g. `diffrax.Tsit5()`, `diffrax.Heun()`, `diffrax.Dopri8()`.
    """

    solver: diffrax.AbstractSolver

    def __check_init__(self):
        if not isinstance(self.solver, diffrax.AbstractSolver):
            raise ValueError(
                f"DiffraxProjected.solver={self.solver!r} is not a diffrax solver; pass e.g. "
                "diffrax.Tsit5(), diffrax.Heun() or diffrax.Dopri5()."
            )

    def step(self, dynamics: AbstractDynamics, x: Tokens, dt) -> Tokens:
        term = diffrax.ODETerm(lambda t, y, args: dynamics.velocity(y))
        t0 = jnp.zeros((), x.dtype)
        t1 = t0 + dt
        state = self.solver.init(term, t0, t1, x, None)
        y, _, _, _, _ = self.solver.step(term, t0, t1, x, None, state, made_jump=False)
        return _SPHERE(y)

    def order(self) -> int:
        order = self.solver.order(diffrax.ODETerm(lambda t, y, args: y))
        if order is None:
            raise ValueError(
                f"DiffraxProjected: {type(self.solver).__name__} declares no ODE order; pick an ODE "
                "solver such as diffrax.Tsit5()."
            )
        return order


SPHERE_INTEGRATORS: Table[AbstractSphereIntegrator] = Table(
    "sphere_integrator",
    "sphere integrator",
    {
        "euler": ProjectedEuler(),
        "rk2": ProjectedRK2(),
        "rk4": ProjectedRK4(),
        "geodesic-euler": GeodesicEuler(),
    },
)
"""The sphere integrators by the names studies and the command line use (`"euler"` is the
authors' "Euler step, then renormalize"; `"rk4"` is `ProjectedRK4`, not the diffrax solver of
`workbench.registry.ODE_SOLVERS`); public as `workbench.registry.SPHERE_INTEGRATORS`."""
