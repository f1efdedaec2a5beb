r"""Quadrature rules on `[0, 1]` and the grids (nodes + weights) they give.

A rule with `m` nodes approximates `∫_0^1 g(t) dt ≈ Σ_i w_i g(t_i)`. For a smooth integrand

| rule | nodes | error |
|---|---|---|
| `MidpointRule` | `(i + ½)/m` | `O(h²)`, `h = 1/m`, unless `g` is periodic |
| `TrapezoidRule` | `i/(m − 1)` | `O(h²)`, `h = 1/(m − 1)`; spectral for periodic `g` (Euler–Maclaurin) |
| `GaussLegendreRule` | zeros of `P_m` | exact to degree `2m − 1`; exponential for analytic `g` |

In the continuous Transformer (docs/equations.md) every integral over the token interval `Ω_x` or
the feature interval `Ω_y` becomes such a weighted sum; a `Grid` carries the nodes and weights, and
may append *probe* nodes with weight zero: they take no part in any integral but the equation is
evaluated at them (Nyström interpolation).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import equinox as eqx
import numpy as np

from .._checks import int_in_range
from .._table import Table


def _check_num_nodes(num, field: str) -> int:
    return int_in_range(field, num, 2, hint="the number of nodes of a quadrature grid")


class AbstractQuadratureRule(eqx.Module):
    """A quadrature rule on `[0, 1]`: nodes and weights for any number of nodes `m ≥ 2`.

    **Class attributes:**

    - `name`: the name the command line uses.
    - `order`: the algebraic order `p` of the composite rule (`error ≈ C h^p`) for smooth,
      non-periodic integrands, or `None` where the error decays faster than any power of `h`
      (Gauss: exponentially for analytic integrands).
    """

    name: ClassVar[str]
    order: ClassVar[int | None]

    @abc.abstractmethod
    def nodes_weights(self, num: int) -> tuple[np.ndarray, np.ndarray]:
        """The `num` nodes in `[0, 1]` (increasing) and their weights (float64, summing to 1)."""

    @abc.abstractmethod
    def spacing(self, num: int) -> float:
        """The mesh size `h` the order refers to."""


class MidpointRule(AbstractQuadratureRule):
    r"""Composite midpoint rule: nodes `t_i = (i + ½) h`, weights `h = 1/m`; order 2.

    With uniform weights this is the plain discrete Transformer: the weights fold into the
    weight matrices and cancel inside the softmax (docs/equations.md, 'Space discretization').
    """

    name: ClassVar[str] = "midpoint"
    order: ClassVar[int | None] = 2

    def nodes_weights(self, num: int) -> tuple[np.ndarray, np.ndarray]:
        m = _check_num_nodes(num, "num")
        return (np.arange(m) + 0.5) / m, np.full(m, 1.0 / m)

    def spacing(self, num: int) -> float:
        return 1.0 / _check_num_nodes(num, "num")


class TrapezoidRule(AbstractQuadratureRule):
    r"""Composite trapezoid rule: nodes `t_i = i h`, `h = 1/(m − 1)`, weights `h` (`h/2` at the
    ends); order 2 for non-periodic integrands."""

    name: ClassVar[str] = "trapezoid"
    order: ClassVar[int | None] = 2

    def nodes_weights(self, num: int) -> tuple[np.ndarray, np.ndarray]:
        m = _check_num_nodes(num, "num")
        h = 1.0 / (m - 1)
        w = np.full(m, h)
        w[0] = w[-1] = 0.5 * h
        return np.linspace(0.0, 1.0, m), w

    def spacing(self, num: int) -> float:
        return 1.0 / (_check_num_nodes(num, "num") - 1)


class GaussLegendreRule(AbstractQuadratureRule):
    r"""Gauss–Legendre rule mapped to `[0, 1]` (`numpy.polynomial.legendre.leggauss`): exact for
    polynomials of degree `≤ 2m − 1`, error `O(ρ^{−2m})` for integrands analytic in a Bernstein
    ellipse of parameter `ρ`. No algebraic order (`order = None`); `spacing` is the nominal `1/m`.
    """

    name: ClassVar[str] = "gauss"
    order: ClassVar[int | None] = None

    def nodes_weights(self, num: int) -> tuple[np.ndarray, np.ndarray]:
        m = _check_num_nodes(num, "num")
        t, w = np.polynomial.legendre.leggauss(m)
        return 0.5 * (t + 1.0), 0.5 * w

    def spacing(self, num: int) -> float:
        return 1.0 / _check_num_nodes(num, "num")


QUADRATURE_RULES: Table[AbstractQuadratureRule] = Table(
    "quadrature_rule",
    "quadrature rule",
    {r.name: r for r in (MidpointRule(), TrapezoidRule(), GaussLegendreRule())},
)
"""Name -> rule, for the command line (public as `workbench.registry.QUADRATURE_RULES`)."""


class Grid(eqx.Module):
    r"""Nodes and weights discretizing one interval `[0, 1]`, plus optional probe nodes.

    The first `num_nodes` entries are the rule's nodes; the next `num_probes` entries are probe
    points with weight 0; any further entries are padding (weight 0, see `padded`). An integral
    `∫ g` is `Σ_i w_i g(t_i)` over all entries (probes and padding contribute nothing), and the
    discretized equation is still evaluated at the probes: that is Nyström interpolation of the
    grid solution.

    **Fields:** `nodes`, `weights` (float64 NumPy arrays of equal length), `num_nodes`,
    `num_probes`.
    """

    nodes: np.ndarray
    weights: np.ndarray
    num_nodes: int
    num_probes: int

    @classmethod
    def from_rule(
        cls, rule: AbstractQuadratureRule, num: int, *, probes=(), field: str = "num"
    ) -> Grid:
        """The grid of `rule` with `num ≥ 2` nodes, then `probes` (points in `[0, 1]`) with
        weight 0.

        **Raises:** `ValueError` for a rule that is not an `AbstractQuadratureRule`, `num < 2`
        (naming `field`), or probes outside `[0, 1]`.
        """
        if not isinstance(rule, AbstractQuadratureRule):
            raise ValueError(
                f"rule={rule!r} is not a quadrature rule; pass one of MidpointRule(), "
                "TrapezoidRule(), GaussLegendreRule() (or workbench.registry.QUADRATURE_RULES[name], name "
                f"in {', '.join(QUADRATURE_RULES)})."
            )
        num = _check_num_nodes(num, field)
        t, w = rule.nodes_weights(num)
        p = np.asarray(probes, dtype=np.float64).ravel()
        if p.size and (not np.all(np.isfinite(p)) or p.min() < 0.0 or p.max() > 1.0):
            raise ValueError(f"probes={p.tolist()} must lie in [0, 1].")
        return cls(np.concatenate([t, p]), np.concatenate([w, np.zeros(p.size)]), num, p.size)

    @property
    def probes(self) -> np.ndarray:
        """The probe points (weight 0)."""
        return self.nodes[self.num_nodes : self.num_nodes + self.num_probes]

    @property
    def probe_slice(self) -> slice:
        """The index range of the probes in `nodes`."""
        return slice(self.num_nodes, self.num_nodes + self.num_probes)

    def padded(self, length: int) -> Grid:
        """The same grid with zero-weight nodes (at ½) appended up to `length` entries.

        Padding changes no integral, so grids of different sizes padded to one length give the
        same sums and share one compiled computation.
        """
        extra = length - self.nodes.size
        if extra < 0:
            raise ValueError(f"length={length} is shorter than the grid ({self.nodes.size}).")
        return Grid(
            np.concatenate([self.nodes, np.full(extra, 0.5)]),
            np.concatenate([self.weights, np.zeros(extra)]),
            self.num_nodes,
            self.num_probes,
        )
