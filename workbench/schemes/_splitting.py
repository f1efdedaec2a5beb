"""Splitting schemes as validated data: a sequence of (operator, fraction of the step)."""

import abc

import equinox as eqx
import numpy as np

from .._table import Table
from ._runge_kutta import RK4, AbstractExplicitRK, Euler, Midpoint

Stages = tuple[tuple[int, float], ...]


class AbstractSplittingScheme(eqx.Module):
    r"""An operator-splitting scheme for `u_t = Σ_{k<M} G_k(u)`.

    A step of size τ composes sub-flows `φ^{G_k}_{a τ}` in the order given by `stages(M)`,
    a tuple of `(k, a)` pairs, applied left to right. Each sub-flow is solved by the `inner`
    explicit Runge–Kutta method (one step), whose order must be at least the scheme's, so the
    composition keeps its declared order.
    """

    inner: eqx.AbstractVar[AbstractExplicitRK]

    @abc.abstractmethod
    def stages(self, num_operators: int) -> Stages:
        """The substeps `(operator index, fraction of τ)` of one step, applied left to right."""

    @abc.abstractmethod
    def order(self) -> int:
        """The classical order of the composition (with exact sub-flows)."""

    def __check_init__(self):
        if self.inner.order() < self.order():
            raise ValueError(
                f"{type(self).__name__}: inner solver {type(self.inner).__name__} has order "
                f"{self.inner.order()} < the scheme's order {self.order()}; use an inner method of "
                f"order >= {self.order()} (e.g. workbench.schemes.RK4())."
            )
        for m in (1, 2, 3):
            check_stages(self.stages(m), m, type(self).__name__)


def check_stages(stages: Stages, num_operators: int, name: str = "scheme") -> None:
    """Consistency: every operator's fractions sum to 1 over one step."""
    totals = np.zeros(num_operators)
    for k, a in stages:
        if not 0 <= k < num_operators:
            raise ValueError(
                f"{name}: stage operator {k} out of range for {num_operators} operators."
            )
        totals[k] += a
    if not np.allclose(totals, 1.0, atol=1e-14):
        raise ValueError(f"{name}: fractions per operator sum to {totals.tolist()}, not 1.")


class LieTrotter(AbstractSplittingScheme):
    r"""Lie–Trotter splitting, order 1: `φ^{G_{M−1}}_τ ∘ … ∘ φ^{G_0}_τ`.

    With explicit Euler sub-flows and τ = 1 this is exactly one Transformer layer.
    """

    inner: AbstractExplicitRK = Euler()

    def stages(self, num_operators: int) -> Stages:
        return tuple((k, 1.0) for k in range(num_operators))

    def order(self) -> int:
        return 1


class Strang(AbstractSplittingScheme):
    r"""Strang (symmetric) splitting, order 2:
    `φ^{G_0}_{τ/2} ∘ … ∘ φ^{G_{M−2}}_{τ/2} ∘ φ^{G_{M−1}}_τ ∘ φ^{G_{M−2}}_{τ/2} ∘ … ∘ φ^{G_0}_{τ/2}`.

    The default inner solver is the explicit midpoint rule (order 2).
    """

    inner: AbstractExplicitRK = Midpoint()

    def stages(self, num_operators: int) -> Stages:
        half = tuple((k, 0.5) for k in range(num_operators - 1))
        return half + ((num_operators - 1, 1.0),) + half[::-1]

    def order(self) -> int:
        return 2


class AbstractComposition(AbstractSplittingScheme):
    r"""A symmetric composition `S_{γ_s τ} ∘ … ∘ S_{γ_1 τ}` of Strang steps.

    Order 4 needs `Σ γ = 1`, `Σ γ³ = 0` and symmetric weights (checked at construction).
    """

    @abc.abstractmethod
    def weights(self) -> tuple[float, ...]: ...

    def __check_init__(self):
        g = np.asarray(self.weights())
        if not np.allclose(g, g[::-1], atol=1e-15):
            raise ValueError(f"{type(self).__name__}: composition weights must be symmetric.")
        if not np.isclose(g.sum(), 1.0, atol=1e-14):
            raise ValueError(f"{type(self).__name__}: weights sum to {g.sum()}, not 1.")
        if self.order() >= 4 and not np.isclose((g**3).sum(), 0.0, atol=1e-13):
            raise ValueError(f"{type(self).__name__}: Σγ³ = {(g**3).sum()} ≠ 0, so not order 4.")

    def substep_table(self, num_operators: int) -> tuple[Stages, np.ndarray]:
        """One Strang step's stages `base` and the composition's fractions of τ as a table:
        row `j`, column `i` is `γ_j a_i` (float64), the `i`-th sub-flow of the `j`-th Strang
        step. `stages(M)` reads it row by row. The solvers (the forward step and the continuous
        adjoint) scan over its rows, so a composition's sub-flows compile once, not once per
        weight (Suzuki4: the 3 sub-flows of a Strang step, not 15)."""
        base = Strang(inner=self.inner).stages(num_operators)
        table = np.asarray([[g * a for _, a in base] for g in self.weights()], np.float64)
        return base, table

    def stages(self, num_operators: int) -> Stages:
        base, table = self.substep_table(num_operators)
        return tuple((k, float(a)) for row in table for (k, _), a in zip(base, row))

    def order(self) -> int:
        return 4


class Yoshida4(AbstractComposition):
    r"""Yoshida's (triple-jump) fourth-order composition of Strang steps.

    `γ_1 = γ_3 = 1/(2 − 2^{1/3})`, `γ_2 = 1 − 2γ_1` (negative). Sub-flows use RK4 by default.
    Reference: H. Yoshida, Phys. Lett. A 150 (1990) 262–268.
    """

    inner: AbstractExplicitRK = RK4()

    def weights(self) -> tuple[float, ...]:
        g1 = 1.0 / (2.0 - 2.0 ** (1.0 / 3.0))
        return (g1, 1.0 - 2.0 * g1, g1)


class Suzuki4(AbstractComposition):
    r"""Suzuki's five-stage fourth-order ("fractal") composition of Strang steps.

    `p = 1/(4 − 4^{1/3})`, weights `(p, p, 1 − 4p, p, p)`: smaller error constant than Yoshida.
    Reference: M. Suzuki, Phys. Lett. A 146 (1990) 319–323.
    """

    inner: AbstractExplicitRK = RK4()

    def weights(self) -> tuple[float, ...]:
        p = 1.0 / (4.0 - 4.0 ** (1.0 / 3.0))
        return (p, p, 1.0 - 4.0 * p, p, p)


SPLITTING_SCHEMES: Table[AbstractSplittingScheme] = Table(
    "splitting_scheme",
    "splitting scheme",
    {"lie": LieTrotter(), "strang": Strang(), "yoshida4": Yoshida4(), "suzuki4": Suzuki4()},
)
"""The splitting schemes by the names the command line uses, each with its default inner
method (`workbench.registry.SPLITTING_SCHEMES`)."""
