"""Explicit Runge–Kutta methods as validated Butcher tableaus, used to solve sub-flows."""

import dataclasses
from typing import ClassVar

import equinox as eqx
import numpy as np

from .._table import Table


@dataclasses.dataclass(frozen=True)
class ButcherTableau:
    r"""An explicit Butcher tableau `(A, b, c)` checked against its declared order.

    Construction asserts `c_i = Σ_j a_ij` (row sums), `Σ b = 1`, strict lower-triangularity,
    and every order condition up to `min(order, 4)`:

    - order 1: `Σ b_i = 1`; order 2: `Σ b_i c_i = 1/2`;
    - order 3: `Σ b_i c_i² = 1/3`, `Σ b_i a_ij c_j = 1/6`;
    - order 4: `Σ b c³ = 1/4`, `Σ b_i c_i a_ij c_j = 1/8`, `Σ b_i a_ij c_j² = 1/12`,
      `Σ b_i a_ij a_jk c_k = 1/24`.

    It also checks that the order condition of order `order + 1` fails (the declared order is
    the exact order), where that order is ≤ 4.
    """

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    order: int

    def __post_init__(self):
        a, b = np.asarray(self.a_matrix), np.asarray(self.b, float)
        s = len(self.b)
        if a.shape != (s, s):
            raise ValueError(f"tableau: A has shape {a.shape}, expected {(s, s)}.")
        if np.any(np.triu(a) != 0):
            raise ValueError("tableau: an explicit method needs a strictly lower-triangular A.")
        conditions = _order_conditions(a, b)
        for p in range(1, min(self.order, 4) + 1):
            bad = [
                name for name, got, want in conditions[p] if not np.isclose(got, want, atol=1e-13)
            ]
            if bad:
                raise ValueError(
                    f"tableau declared order {self.order} fails order-{p} condition(s) {bad}."
                )
        if self.order < 4:
            p = self.order + 1
            if all(np.isclose(got, want, atol=1e-13) for _, got, want in conditions[p]):
                raise ValueError(f"tableau declared order {self.order} but satisfies order {p}.")

    @property
    def a_matrix(self) -> np.ndarray:
        s = len(self.b)
        m = np.zeros((s, s))
        for i, row in enumerate(self.a):
            m[i, : len(row)] = row
        return m

    @property
    def c(self) -> np.ndarray:
        return self.a_matrix.sum(axis=1)

    @property
    def num_stages(self) -> int:
        return len(self.b)


def _order_conditions(a, b):
    c = a.sum(axis=1)
    return {
        1: [("sum b = 1", b.sum(), 1.0)],
        2: [("sum b c = 1/2", b @ c, 0.5)],
        3: [("sum b c^2 = 1/3", b @ c**2, 1 / 3), ("sum b A c = 1/6", b @ a @ c, 1 / 6)],
        4: [
            ("sum b c^3 = 1/4", b @ c**3, 0.25),
            ("sum b c A c = 1/8", (b * c) @ a @ c, 1 / 8),
            ("sum b A c^2 = 1/12", b @ a @ c**2, 1 / 12),
            ("sum b A A c = 1/24", b @ a @ a @ c, 1 / 24),
        ],
        5: [("sum b c^4 = 1/5", b @ c**4, 0.2)],
    }


class AbstractExplicitRK(eqx.Module):
    """An explicit Runge–Kutta method: its Butcher tableau plus `order()`.

    `step(f, t, y, h)` advances `y' = f(t, y)` by one step `h`; `f` returns a pytree like `y`.
    """

    tableau: ClassVar[ButcherTableau]

    def order(self) -> int:
        return self.tableau.order

    def step(self, f, t, y, h):
        import jax

        tab = self.tableau
        # Python floats, not numpy scalars: weak types keep a float32 state in float32.
        a, b, c = tab.a_matrix.tolist(), [float(x) for x in tab.b], tab.c.tolist()
        ks = []
        for i in range(tab.num_stages):
            yi = y
            for j in range(i):
                if a[i][j] != 0:
                    yi = jax.tree.map(lambda u, k, aij=a[i][j]: u + (h * aij) * k, yi, ks[j])
            ks.append(f(t + c[i] * h, yi))
        # With one stage (Euler) this is exactly `y + h * k1`: the network's residual update.
        incr = None
        for bi, k in zip(b, ks):
            if bi == 0:
                continue
            term = k if bi == 1 else jax.tree.map(lambda x, bi=bi: bi * x, k)
            incr = term if incr is None else jax.tree.map(lambda p, q: p + q, incr, term)
        return jax.tree.map(lambda u, k: u + h * k, y, incr)


class Euler(AbstractExplicitRK):
    """Explicit Euler, order 1, one stage: `y + h f(t, y)`."""

    tableau: ClassVar[ButcherTableau] = ButcherTableau(a=((),), b=(1.0,), order=1)


class Midpoint(AbstractExplicitRK):
    """Explicit midpoint, order 2, two stages."""

    tableau: ClassVar[ButcherTableau] = ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), order=2)


class Heun(AbstractExplicitRK):
    """Heun's method (explicit trapezoid), order 2, two stages."""

    tableau: ClassVar[ButcherTableau] = ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), order=2)


class RK4(AbstractExplicitRK):
    """The classical Runge–Kutta method, order 4, four stages."""

    tableau: ClassVar[ButcherTableau] = ButcherTableau(
        a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
        b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
        order=4,
    )


UNSPLIT_METHODS: Table[AbstractExplicitRK] = Table(
    "unsplit_method",
    "unsplit method",
    {
        "unsplit-euler": Euler(),
        "unsplit-heun": Heun(),
        "unsplit-midpoint": Midpoint(),
        "unsplit-rk4": RK4(),
    },
)
"""These tableaux applied to the whole (unsplit) field, by name (`workbench.registry.UNSPLIT_METHODS`).
The `unsplit-` prefix keeps them apart from the diffrax solvers of the same tableaux
(`workbench.registry.ODE_SOLVERS`, where `"rk4"` is `ClassicalRK4`), and lets one option list
hold them next to the splitting schemes (the splitting-error study's `schemes`)."""
