"""The diffrax solvers by the names the command line uses (`workbench.registry.ODE_SOLVERS`)."""

import diffrax

from .._table import Table
from ._rk4 import ClassicalRK4

ODE_SOLVERS: Table[diffrax.AbstractSolver] = Table(
    "ode_solver",
    "ODE solver",
    {
        "euler": diffrax.Euler(),
        "heun": diffrax.Heun(),
        "midpoint": diffrax.Midpoint(),
        "ralston": diffrax.Ralston(),
        "bosh3": diffrax.Bosh3(),
        "rk4": ClassicalRK4(),
        "tsit5": diffrax.Tsit5(),
        "dopri5": diffrax.Dopri5(),
        "dopri8": diffrax.Dopri8(),
    },
)
"""Explicit diffrax solvers for the whole field of an ODE, by name. `"rk4"` is the classical
tableau as a diffrax solver (`ClassicalRK4`); the same tableau stepping the field itself is
`"unsplit-rk4"` of `workbench.registry.UNSPLIT_METHODS`, and on the sphere `"rk4"` of
`workbench.registry.SPHERE_INTEGRATORS` (a different kind, so a different table)."""
