"""The classical Runge–Kutta method as a diffrax solver, built from the workbench's own tableau."""

from collections.abc import Callable
from typing import ClassVar

import diffrax
import numpy as np

from ..schemes._runge_kutta import RK4 as _RK4


def _diffrax_tableau(tableau) -> diffrax.ButcherTableau:
    a = tableau.a_matrix
    s = tableau.num_stages
    return diffrax.ButcherTableau(
        c=np.asarray(tableau.c[1:]),
        b_sol=np.asarray(tableau.b, dtype=np.float64),
        # No embedded method: the error estimate is zero. Fixed steps only (checked by
        # `integrate`), like diffrax's own `Euler`.
        b_error=np.zeros(s),
        a_lower=tuple(np.asarray(a[i, :i]) for i in range(1, s)),
    )


class ClassicalRK4(diffrax.AbstractERK):
    r"""The classical 4th-order Runge–Kutta method ("RK4") as a diffrax solver.

    Order 4, four stages, no embedded error estimate: use it with fixed steps
    (`diffrax.ConstantStepSize`, or `num_steps=` in `workbench.integrate`). Its Butcher tableau
    is `workbench.schemes.RK4.tableau` (checked against the order conditions when built),
    converted to diffrax's format, so diffrax and the splitting schemes share one definition.
    Dense output: cubic Hermite.

    **Example:** `diffrax.diffeqsolve(term, ClassicalRK4(), t0, t1, dt0=0.01, y0=y0)`.
    """

    tableau: ClassVar[diffrax.ButcherTableau] = _diffrax_tableau(_RK4.tableau)
    interpolation_cls: ClassVar[Callable[..., diffrax.AbstractLocalInterpolation]] = (
        diffrax.ThirdOrderHermitePolynomialInterpolation.from_k
    )

    def order(self, terms):
        del terms
        return 4
