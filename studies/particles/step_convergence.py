"""Is the authors' step dt = 0.1 converged for the phase diagram of Fig. 3 (Euler-then-renormalize),
and how fast do Euler and RK4 projection converge in the statistic and in the particles?

The phase-diagram statistic (fraction of pairs with ⟨x_i, x_j⟩ ≥ 1 − δ, averaged over random
starts; SA, n = 32, t ∈ [0, 30], float64) is computed with projected Euler and projected RK4 at
dt = 0.1, 0.05, 0.025, 0.0125, 0.00625 from the same starts, and compared with a reference: RK4
at `reference_dt` (default 0.00625 / 4). Reported per (integrator, dt): the mean and max absolute
error of the averaged statistic over the whole (β, t) grid, the mean per-start disagreement, the
shift of the 0.5-level curve t_½(β), and the values at a few (β, t) points; then the error of the
Gram matrix of the particles at a fixed time (max over β and starts), with the observed order
from `wb.analysis.fit_order` (expected: the integrator's order, 1 for Euler, 4 for RK4). The
statistical error of the diagram itself (the standard error over starts) is given for scale.
Integrators are `wb.registry.SPHERE_INTEGRATORS` by name; the reference is always `"rk4"`.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
from studies._toolkit.config import (
    check,
    check_choices,
    check_devices,
    check_multiple,
    check_nonempty,
    check_positive,
    check_range,
    check_seed,
    chosen_devices,
    steps_in,
)
from studies._toolkit.fields import (
    Betas,
    Delta,
    Dimension,
    ParticleFields,
    Particles,
    SaveEvery,
    TMax,
    defaults,
)
from studies._toolkit.report import markdown_table, new_figure, progress
from workbench.particles._starts import half_time

NAME = "step-convergence"
SUMMARY = "Phase-diagram statistic and Gram matrices vs dt for Euler vs RK4 projection."

AUTHORS_DT = 0.1
"""The authors' step (paper B, Fig. 3): the step the question is about."""
PAPER_STARTS = 1024
"""Starts per β in the paper's diagram: its statistical error sets the scale for "converged"."""
ORDER_TOL = 0.3
"""A fitted Gram-matrix order within this of the integrator's order counts as the expected one."""


@dataclasses.dataclass(frozen=True)
@defaults(num_starts=128, betas=tuple(0.5 * k for k in range(1, 19)))
class Config(TMax, Dimension, Delta, SaveEvery, Betas, Particles, ParticleFields):
    dts: tuple[float, ...] = (0.1, 0.05, 0.025, 0.0125, 0.00625)
    """Steps Δt compared with the reference, for each integrator; must include the authors' 0.1."""
    reference_dt: float = 0.0015625
    """Step Δt of the RK4 reference run; smaller than every step in `dts`."""
    integrators: tuple[str, ...] = ("euler", "rk4")
    """Names in `wb.registry.SPHERE_INTEGRATORS`; must include "euler" (the authors')."""
    point_betas: tuple[float, ...] = (1.0, 3.0, 5.0, 9.0)
    """β of the (β, t) points reported individually, paired with `point_ts`; each one of `betas`."""
    point_ts: tuple[float, ...] = (6.0, 8.0, 15.0, 30.0)
    """(β, t) points reported individually, paired with `point_betas`."""
    order_betas: tuple[float, ...] = (1.0, 4.0, 9.0)
    """β at which the Gram-matrix error of the particles is measured."""
    order_starts: int = 8
    """Random starts of the Gram-matrix error measurement (drawn apart from the diagram's)."""
    order_ts: tuple[float, ...] = (2.0, 30.0)
    """Times at which the Gram-matrix error is measured (the order fit uses the first)."""

    def __post_init__(self):
        check_devices(self)
        check_range(self, "n", 2)
        check_range(self, "d", 2)
        check_nonempty(self, "betas", "dts", "integrators", "order_betas", "order_ts")
        check_positive(self, "betas", "t_max", "save_every", "dts", "reference_dt")
        check(self, "dts", len(set(self.dts)) == len(self.dts), "each step at most once")
        check(
            self,
            "dts",
            any(math.isclose(h, AUTHORS_DT) for h in self.dts),
            f"must include the authors' dt = {AUTHORS_DT:g} (the question)",
        )
        check(
            self,
            "reference_dt",
            self.reference_dt < min(self.dts),
            f"must be smaller than every step in dts={self.dts!r}",
        )
        steps = (*self.dts, self.reference_dt)
        for field in ("t_max", "save_every", "order_ts"):
            value = getattr(self, field)
            values = value if isinstance(value, tuple) else (value,)
            check(
                self,
                field,
                all(steps_in(v, h) is not None for v in values for h in steps),
                f"every value must be a positive whole multiple of each step in dts={self.dts!r} "
                f"and of reference_dt={self.reference_dt!r}",
            )
        check_multiple(self, "t_max", of="save_every")
        check_range(self, "num_starts", 1)
        check_choices(self, "integrators", wb.registry.SPHERE_INTEGRATORS)
        check(
            self,
            "integrators",
            len(set(self.integrators)) == len(self.integrators) and "euler" in self.integrators,
            "each name at most once, and 'euler' (the authors' integrator) among them",
        )
        check_range(self, "delta", 0.0, 2.0, low_open=True)
        check(
            self,
            "point_ts",
            len(self.point_ts) == len(self.point_betas),
            f"must pair with point_betas={self.point_betas!r} (the same length)",
        )
        check(
            self,
            "point_betas",
            all(any(math.isclose(p, b) for b in self.betas) for p in self.point_betas),
            f"every value must be one of betas={self.betas!r}",
        )
        check_multiple(self, "point_ts", of="save_every")
        check_range(self, "point_ts", 0.0, self.t_max)
        check_positive(self, "order_betas")
        check_range(self, "order_starts", 1)
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): one phase diagram with
        every start's values (`_memory.phase_diagram_bytes(..., per_start=True)`: the starts, the
        compiled chunks, `(betas, num_starts, T)` values) while the reference's per-start values and
        their difference are kept too, and the Gram matrices `(order_betas, order_starts, order_ts,
        n, n)` of the reference, of the current run and their difference, with the compiled call
        that makes them (per trajectory its state, stages and attention and its saved Gram
        matrices)."""
        from studies._toolkit import memory as M

        times = round(self.t_max / self.save_every) + 1
        nb, ns, n, d = len(self.betas), self.num_starts, self.n, self.d
        diagram = M.phase_diagram_bytes(nb, ns, n, d, times, per_start=True)
        kept = 2 * M.array_bytes(nb, ns, times)
        trajectories = len(self.order_betas) * self.order_starts
        saved = M.array_bytes(len(self.order_ts), n, n)
        grams = trajectories * (3 * saved + M.particle_trajectory_bytes(n, min(n, d)) + saved)
        starts = M.array_bytes(self.order_starts, n, d)
        return diagram + kept + grams + starts


def smoke_config() -> Config:
    return Config(
        n=16,
        d=16,
        betas=(1.0, 5.0),
        num_starts=4,
        t_max=8.0,
        save_every=2.0,
        dts=(0.1, 0.05),
        reference_dt=0.0125,
        point_betas=(1.0,),
        point_ts=(8.0,),
        order_betas=(4.0,),
        order_starts=2,
        order_ts=(1.0,),
    )


@dataclasses.dataclass(frozen=True)
class Point:
    beta: float
    t: float
    value: float
    reference: float


@dataclasses.dataclass(frozen=True)
class Row:
    """One (integrator, dt) against the reference."""

    integrator: str
    dt: float
    mean_abs_error: float
    """Mean over the (β, t) grid of |F̄ − F̄_ref| (F̄: the start-averaged statistic)."""
    max_abs_error: float
    per_start_mean_abs_disagreement: float
    t_half_mean_abs_shift: float
    """Mean |t½ − t½_ref| over the β where both reach 0.5 (NaN if none)."""
    t_half_defined_mismatch: int
    """β where exactly one of the two reaches 0.5 by t_max."""
    points: list[Point]
    gram_max_error: dict[str, float]
    """Max |G − G_ref| over β, starts and entries, by order time (key f"{t:g}")."""


@dataclasses.dataclass(frozen=True)
class Order:
    gram_order_at_t: str
    expected_order: int
    observed_order: float
    """Fitted order of the Gram-matrix error (NaN when no fit)."""
    order_reduction: bool
    """`fit_order` flags order reduction (fitted against `expected_order`)."""
    statistic_order: float
    """Fitted order of the mean diagram error (NaN when no fit: often exactly 0 errors)."""


@dataclasses.dataclass(frozen=True)
class StandardError:
    max: float
    mean: float
    max_at_1024_starts: float
    mean_at_1024_starts: float


@dataclasses.dataclass(frozen=True)
class Reference:
    integrator: str
    dt: float
    fraction: np.ndarray
    standard_error_over_starts: StandardError


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    betas: np.ndarray
    ts: np.ndarray
    reference: Reference
    rows: list[Row]
    orders: dict[str, Order]
    num_devices_used: int = 1
    """Devices the starts were spread over (the phase diagrams and the Gram matrices; the numbers
    do not depend on it)."""


def _grams(integrator, dt, betas, starts, ts, devices) -> np.ndarray:
    """Gram matrices `(B, S, T, n, n)` from `gram_trajectory`: vmap over β and starts, the
    starts spread over `devices` (`wb.map_cells`)."""

    def one(b, x):
        return wb.particles.gram_trajectory(
            wb.particles.SA(b), x, dt=dt, save_ts=ts, integrator=integrator
        )

    run = jax.vmap(jax.vmap(one, (None, 0)), (0, None))
    # The starts (axis 1 of the result) cut over the devices.
    return wb.map_cells(run, cells=(False, True), devices=devices, out_axis=1)(betas, starts)


def _fit(dts, errors, expected=None):
    """`fit_order` on the ladder (two points suffice for a two-step ladder, as in the smoke run),
    or None when no slope can be fitted (one step, zero errors, no consistent window)."""
    if len(dts) < 2:
        return None
    fit = wb.analysis.fit_order(
        dts, errors, min_points=min(3, len(dts)), tol=ORDER_TOL, expected=expected, throw=False
    )
    return fit if fit.success else None


def compute(config: Config) -> Results:
    c = config
    betas = np.asarray(c.betas, float)
    ts = c.save_every * np.arange(round(c.t_max / c.save_every) + 1)
    order_ts = np.asarray(c.order_ts, float)
    rk4 = wb.registry.SPHERE_INTEGRATORS["rk4"]
    point_index = [
        (int(np.argmin(np.abs(betas - b))), int(np.argmin(np.abs(ts - t))))
        for b, t in zip(c.point_betas, c.point_ts)
    ]
    with jax.enable_x64(True):
        key_diagram, key_order = jax.random.split(jax.random.key(c.seed))
        starts = wb.particles.random_starts(key_diagram, c.num_starts, c.n, c.d, jnp.float64)
        order_starts = wb.particles.random_starts(key_order, c.order_starts, c.n, c.d, jnp.float64)
        devices = chosen_devices(c.devices)

        sa = eqx.filter_vmap(wb.particles.SA)(jnp.asarray(betas))  # one SA per β

        def diagram(integrator, dt):
            return wb.particles.phase_diagram(
                sa,
                starts,
                dt=dt,
                save_ts=ts,
                integrator=integrator,
                delta=c.delta,
                per_start=True,
                devices=devices,
            )

        ref = diagram(rk4, c.reference_dt)
        ref_half = np.asarray(half_time(ts, ref.fraction), float)
        ref_grams = _grams(rk4, c.reference_dt, c.order_betas, order_starts, order_ts, devices)
        runs = [(name, dt) for name in c.integrators for dt in c.dts]
        rows = []
        for name, dt in progress(runs, desc="step convergence"):
            integrator = wb.registry.SPHERE_INTEGRATORS[name]
            pd = diagram(integrator, dt)
            err = np.abs(pd.fraction - ref.fraction)
            half = np.asarray(half_time(ts, pd.fraction), float)
            both = ~np.isnan(half) & ~np.isnan(ref_half)
            grams = _grams(integrator, dt, c.order_betas, order_starts, order_ts, devices)
            gram_err = np.abs(grams - ref_grams).max(axis=(0, 1, 3, 4))  # per order time
            rows.append(
                Row(
                    integrator=name,
                    dt=float(dt),
                    mean_abs_error=float(err.mean()),
                    max_abs_error=float(err.max()),
                    per_start_mean_abs_disagreement=float(
                        np.abs(pd.per_start - ref.per_start).mean()
                    ),
                    t_half_mean_abs_shift=float(np.abs(half - ref_half)[both].mean())
                    if both.any()
                    else math.nan,
                    t_half_defined_mismatch=int((np.isnan(half) != np.isnan(ref_half)).sum()),
                    points=[
                        Point(
                            float(betas[i]),
                            float(ts[k]),
                            float(pd.fraction[i, k]),
                            float(ref.fraction[i, k]),
                        )
                        for i, k in point_index
                    ],
                    gram_max_error={f"{t:g}": float(e) for t, e in zip(order_ts, gram_err)},
                )
            )

    first = f"{order_ts[0]:g}"
    orders = {}
    for name in c.integrators:
        sub = [r for r in rows if r.integrator == name]
        dts = [r.dt for r in sub]
        expected = int(wb.registry.SPHERE_INTEGRATORS[name].order())
        gram_fit = _fit(dts, [r.gram_max_error[first] for r in sub], expected)
        stat_fit = _fit(dts, [r.mean_abs_error for r in sub])
        orders[name] = Order(
            gram_order_at_t=first,
            expected_order=expected,
            observed_order=math.nan if gram_fit is None else gram_fit.order,
            order_reduction=bool(gram_fit is not None and gram_fit.order_reduction),
            statistic_order=math.nan if stat_fit is None else stat_fit.order,
        )
    # The paper averages over 2^10 starts: its standard error is ours × sqrt(S / 1024).
    scale = math.sqrt(c.num_starts / PAPER_STARTS)
    sem = StandardError(
        max=float(ref.sem.max()),
        mean=float(ref.sem.mean()),
        max_at_1024_starts=float(ref.sem.max() * scale),
        mean_at_1024_starts=float(ref.sem.mean() * scale),
    )
    reference = Reference("rk4", c.reference_dt, np.asarray(ref.fraction), sem)
    return Results(c, betas, ts, reference, rows, orders, num_devices_used=len(devices))


def _row(results: Results, name: str, dt: float) -> Row | None:
    return next((r for r in results.rows if r.integrator == name and math.isclose(r.dt, dt)), None)


def _answers(results: Results):
    """(curve converged, cells converged, orders as expected) for Euler at the authors' dt."""
    authors = _row(results, "euler", AUTHORS_DT)
    sem = results.reference.standard_error_over_starts
    curve_ok = (
        authors.t_half_mean_abs_shift < results.config.save_every
        and authors.t_half_defined_mismatch == 0
    )
    cells_ok = authors.max_abs_error <= max(sem.max_at_1024_starts, 1e-12)
    orders_ok = all(
        abs(o.observed_order - o.expected_order) <= ORDER_TOL and not o.order_reduction
        for o in results.orders.values()
    )
    return authors, curve_ok, cells_ok, orders_ok


def verdict(results: Results) -> str:
    authors, curve_ok, cells_ok, orders_ok = _answers(results)
    sem = results.reference.standard_error_over_starts
    c = results.config
    word = (
        "Yes"
        if curve_ok and cells_ok and orders_ok
        else "No"
        if not (curve_ok or cells_ok)
        else "Partly"
    )
    orders = ", ".join(
        f"{name} {o.observed_order:.2f} (expected {o.expected_order}"
        + (", order reduction flagged" if o.order_reduction else "")
        + ")"
        for name, o in results.orders.items()
    )
    first = next(iter(results.orders.values())).gram_order_at_t
    return (
        f"{word}. At the authors' dt = {AUTHORS_DT:g}, Euler moves the ½-level curve by "
        f"{authors.t_half_mean_abs_shift:.3g} time units on average ("
        + ("below" if curve_ok else "not below")
        + f" the save spacing {c.save_every:g}, with {authors.t_half_defined_mismatch} β reaching "
        f"½ in only one of the two) and the statistic by at most {authors.max_abs_error:.2e} "
        f"(mean {authors.mean_abs_error:.2e}), "
        + ("within" if cells_ok else "above")
        + f" the {sem.max_at_1024_starts:.2e} statistical error of a {PAPER_STARTS}-start "
        f"diagram (max s.e.m.; reference RK4 at dt = {c.reference_dt:g}). Gram-matrix orders at "
        f"t = {first}: {orders}; "
        + ("all" if orders_ok else "not all")
        + f" within ±{ORDER_TOL:g} of the expected order. Euler's Gram error at "
        f"dt = {AUTHORS_DT:g} is {authors.gram_max_error[first]:.1e}."
    )


def report(results: Results) -> str:
    c = results.config
    rows = results.rows
    sem = results.reference.standard_error_over_starts
    first = f"{c.order_ts[0]:g}"
    table = markdown_table(
        [
            "integrator",
            "dt",
            "mean |ΔF̄|",
            "max |ΔF̄|",
            "per-start mean |ΔF|",
            "mean |Δt½|",
            "t½ defined in one only",
            *[f"|ΔG| t={t:g}" for t in c.order_ts],
        ],
        [
            [
                r.integrator,
                r.dt,
                r.mean_abs_error,
                r.max_abs_error,
                r.per_start_mean_abs_disagreement,
                r.t_half_mean_abs_shift,
                r.t_half_defined_mismatch,
                *[r.gram_max_error[f"{t:g}"] for t in c.order_ts],
            ]
            for r in rows
        ],
        floatfmt=".2e",
    )
    points = markdown_table(
        ["integrator", "dt", *[f"F̄(β={p.beta:g}, t={p.t:g})" for p in rows[0].points]],
        [[r.integrator, r.dt, *[p.value for p in r.points]] for r in rows]
        + [["reference rk4", c.reference_dt, *[p.reference for p in rows[0].points]]],
        floatfmt=".4f",
    )
    orders = markdown_table(
        [
            "integrator",
            f"Gram order at t = {first}",
            "expected",
            "order reduction",
            "diagram slope",
        ],
        [
            [name, o.observed_order, o.expected_order, o.order_reduction, o.statistic_order]
            for name, o in results.orders.items()
        ],
        floatfmt=".2f",
    )
    rk4 = _row(results, "rk4", AUTHORS_DT)
    lines = [
        f"SA, n = {c.n}, d = {c.d}, {len(c.betas)} β in [{min(c.betas):g}, {max(c.betas):g}], "
        f"{c.num_starts} starts (the same for every dt), t ∈ [0, {c.t_max:g}] saved every "
        f"{c.save_every:g}, δ = {c.delta:g}, float64. Reference: RK4 at dt = {c.reference_dt:g}. "
        "ΔF̄: error of the start-averaged statistic over the (β, t) grid; per-start: mean over "
        "(β, start, t) of |ΔF|; Δt½: shift of the 0.5-level curve; ΔG: max |Gram − reference| "
        f"over {len(c.order_betas)} β × {c.order_starts} starts.",
        "",
        table,
        "",
        points,
        "",
        "Observed orders (`wb.analysis.fit_order`; diagram slope: the same fit on mean |ΔF̄|, "
        "nan when no slope can be fitted, e.g. errors exactly zero):",
        "",
        orders,
        "",
        f"Statistical error of the diagram itself (s.e.m. over {c.num_starts} starts): max "
        f"{sem.max:.3g}, mean {sem.mean:.3g}; scaled to the paper's {PAPER_STARTS} starts: max "
        f"{sem.max_at_1024_starts:.3g}, mean {sem.mean_at_1024_starts:.3g}.",
    ]
    if rk4 is not None:
        lines += [
            "",
            f"RK4 at dt = {AUTHORS_DT:g}: max |ΔF̄| = {rk4.max_abs_error:.2e}, Gram error "
            f"{rk4.gram_max_error[first]:.1e}, at four times Euler's cost per step.",
        ]
    return "\n".join(lines) + "\n"


def figures(results: Results) -> dict:
    c = results.config
    fig, axes = new_figure(1, 2, figsize=(10, 4))
    floor = 1e-17
    for name, marker in zip(results.orders, "os^vD"):
        sub = [r for r in results.rows if r.integrator == name]
        dts = [r.dt for r in sub]
        axes[0].loglog(
            dts, [max(r.mean_abs_error, floor) for r in sub], marker + "-", label=f"{name}: mean"
        )
        axes[0].loglog(
            dts, [max(r.max_abs_error, floor) for r in sub], marker + ":", label=f"{name}: max"
        )
        o = results.orders[name]
        for t in c.order_ts:
            label = f"{name}, t = {t:g}"
            if f"{t:g}" == o.gram_order_at_t and not math.isnan(o.observed_order):
                label += f" (order {o.observed_order:.2f}" + (
                    ", order reduction)" if o.order_reduction else ")"
                )
            axes[1].loglog(
                dts,
                [max(r.gram_max_error[f"{t:g}"], floor) for r in sub],
                marker + "-",
                label=label,
            )
    axes[0].set_xlabel("dt")
    axes[0].set_ylabel("|F̄ − F̄_ref| over the (β, t) grid")
    axes[0].set_title("phase-diagram statistic")
    axes[1].set_xlabel("dt")
    axes[1].set_ylabel("max |G − G_ref|")
    axes[1].set_title("Gram matrix of the particles")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    return {"step_convergence": fig}
