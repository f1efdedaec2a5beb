"""The registry: every name the command line and the studies accept for an option, by kind.

One table per kind of option maps each name to one object; names are unique within a table,
and `lookup(kind, name)` maps a name to its object once, at the edge, or raises one `ValueError`
naming the field, the bad name and the valid names (with the closest name when one is close).
A table is a read-only mapping: `SPLITTING_SCHEMES["strang"]` for a name already checked,
`list(SPLITTING_SCHEMES)` for its names.

- `SPLITTING_SCHEMES` (kind `"splitting_scheme"`): `lie`, `strang`, `yoshida4`, `suzuki4`.
- `ODE_SOLVERS` (`"ode_solver"`, diffrax): `euler`, `heun`, `midpoint`, `ralston`, `bosh3`,
  `rk4`, `tsit5`, `dopri5`, `dopri8`.
- `METHODS` (`"method"`): the ODE solvers and the splitting schemes together, the candidates of
  the `convergence-order` and `plan` studies (their names are disjoint).
- `UNSPLIT_METHODS` (`"unsplit_method"`, `workbench.schemes` tableaux on the whole field):
  `unsplit-euler`, `unsplit-heun`, `unsplit-midpoint`, `unsplit-rk4`.
- `SPHERE_INTEGRATORS` (`"sphere_integrator"`): `euler`, `rk2`, `rk4`, `geodesic-euler`.
- `QUADRATURE_RULES` (`"quadrature_rule"`): `midpoint`, `trapezoid`, `gauss`.
- `ACTIVATIONS` (`"activation"`): `gelu`, `gelu_new`, `gelu_pytorch_tanh`, `gelu_tanh`, `relu`,
  `tanh`.

A name means one thing per kind, and the kind is always known where a name is read (the option
it is given to), so `"rk4"` is `ClassicalRK4()` as an ODE solver and `ProjectedRK4()` as a sphere
integrator. Where one option list holds two kinds, their names are disjoint: the splitting schemes
and ODE solvers (`METHODS`), and the splitting schemes and the unsplit methods (the `unsplit-`
prefix: `"unsplit-rk4"` is `workbench.schemes.RK4()`, not the diffrax `"rk4"`). Each table is
defined next to the objects it names, and this module is its one public name.

**Example:**

```python
import workbench as wb

scheme = wb.registry.lookup("splitting_scheme", "strang")  # wb.schemes.Strang()
wb.registry.lookup("sphere_integrator", "rk5")  # ValueError: ... valid choices: euler, rk2, ...
```
"""

from typing import Any

from ._table import Table
from .analysis._plan import METHODS as METHODS
from .analysis._quadrature import QUADRATURE_RULES as QUADRATURE_RULES
from .particles._integrators import SPHERE_INTEGRATORS as SPHERE_INTEGRATORS
from .schemes._runge_kutta import UNSPLIT_METHODS as UNSPLIT_METHODS
from .schemes._splitting import SPLITTING_SCHEMES as SPLITTING_SCHEMES
from .solvers._table import ODE_SOLVERS as ODE_SOLVERS
from .terms._activations import ACTIVATIONS as ACTIVATIONS

__all__ = [
    "ACTIVATIONS",
    "METHODS",
    "ODE_SOLVERS",
    "QUADRATURE_RULES",
    "SPHERE_INTEGRATORS",
    "SPLITTING_SCHEMES",
    "UNSPLIT_METHODS",
    "lookup",
]

_TABLES: Table[Table] = Table(
    "kind",
    "kind of option",
    {
        t.kind: t
        for t in (
            SPLITTING_SCHEMES,
            ODE_SOLVERS,
            METHODS,
            UNSPLIT_METHODS,
            SPHERE_INTEGRATORS,
            QUADRATURE_RULES,
            ACTIVATIONS,
        )
    },
)
"""kind -> its table (the keys are the tables' `kind`s)."""


def lookup(kind: str, name: str, *, field: str | None = None) -> Any:
    """The object called `name` in the table of `kind`.

    **Arguments:**

    - `kind`: the kind of option: `"splitting_scheme"`, `"ode_solver"`, `"method"`,
      `"unsplit_method"`, `"sphere_integrator"`, `"quadrature_rule"` or `"activation"`.
    - `name`: a name in that table.
    - `field`: the argument the name came from, for the message (default: `kind`).

    **Returns:** the object (an instance, or a function for activations).

    **Raises:** `ValueError` naming the field, the bad value and the valid names (or the bad
    kind and the valid kinds), e.g. `integrator='rk5' is not a known sphere integrator; valid
    choices: euler, rk2, rk4, geodesic-euler. Did you mean 'rk4'?`.

    **Example:** `lookup("ode_solver", "rk4")` is `workbench.solvers.ClassicalRK4()`.
    """
    return _TABLES.lookup(kind, field="kind").lookup(name, field=field)
