"""Is the authors' step dt = 0.1 converged for the phase diagram of Fig. 3 (Euler-then-renormalize),
and how fast do Euler and RK4 projection converge in the statistic and in the particles?

The phase-diagram statistic (fraction of pairs with ⟨x_i, x_j⟩ ≥ 1 − δ, averaged over random
starts; SA, n = 32, t ∈ [0, 30], float64) is computed with projected Euler and projected RK4 at
dt = 0.1, 0.05, 0.025, 0.0125, 0.00625 from the same starts, and compared with a reference: RK4
at `reference_dt` (default 0.00625 / 4). Reported per (integrator, dt): the mean and max absolute
error of the averaged statistic over the whole (β, t) grid, the mean per-start disagreement, the
shift of the 0.5-level curve t_½(β), and the values at a few (β, t) points; then the error of the
Gram matrix of the particles at a fixed time (max over β and starts), with the observed order
from a log-log fit (expected 1 for Euler, 4 for RK4). The statistical error of the diagram
itself (the standard error over starts) is given for scale.
"""

import dataclasses
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb

NAME = "step-convergence"
SUMMARY = "Phase-diagram statistic and Gram matrices vs dt for Euler vs RK4 projection."

INTEGRATORS = ("euler", "rk4")


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 32
    d: int = 32
    """Dimension (any d ≥ n costs the same: the reduced form runs in n coordinates)."""
    betas: tuple[float, ...] = tuple(0.5 * k for k in range(1, 19))
    num_starts: int = 128
    t_max: float = 30.0
    save_every: float = 0.5
    dts: tuple[float, ...] = (0.1, 0.05, 0.025, 0.0125, 0.00625)
    reference_dt: float = 0.0015625
    integrators: tuple[str, ...] = INTEGRATORS
    delta: float = 1e-3
    point_betas: tuple[float, ...] = (1.0, 3.0, 5.0, 9.0)
    point_ts: tuple[float, ...] = (6.0, 8.0, 15.0, 30.0)
    """(β, t) points reported individually, paired with `point_betas`."""
    order_betas: tuple[float, ...] = (1.0, 4.0, 9.0)
    order_starts: int = 8
    order_ts: tuple[float, ...] = (2.0, 30.0)
    """Times at which the Gram-matrix error is measured (the order fit uses the first)."""
    seed: int = 0


def smoke_config() -> Config:
    return Config(
        n=16,
        d=16,
        betas=(1.0, 5.0),
        num_starts=4,
        t_max=8.0,
        save_every=2.0,
        dts=(0.1, 0.05),
        reference_dt=0.025,
        point_betas=(1.0,),
        point_ts=(8.0,),
        order_betas=(4.0,),
        order_starts=2,
        order_ts=(1.0,),
    )


def _integrator(name: str):
    return {"euler": wb.particles.ProjectedEuler(), "rk4": wb.particles.ProjectedRK4()}[name]


def _check(config: Config) -> None:
    for name in config.integrators:
        if name not in INTEGRATORS:
            raise ValueError(
                f"integrators: {name!r} is not known; valid: {', '.join(INTEGRATORS)}."
            )
    if not jax.config.jax_enable_x64:
        raise ValueError("the convergence study runs in float64; run via `workbench run`.")
    if len(config.point_betas) != len(config.point_ts):
        raise ValueError("point_betas and point_ts must have the same length (they are paired).")
    for dt in (*config.dts, config.reference_dt):
        for t in (config.t_max, config.save_every, *config.order_ts, *config.point_ts):
            if abs(t / dt - round(t / dt)) > 1e-9:
                raise ValueError(f"time {t} is not a multiple of dt = {dt}.")


def _half_times(ts, fraction) -> np.ndarray:
    out = np.full(fraction.shape[0], np.nan)
    for i, row in enumerate(fraction):
        above = np.nonzero(row >= 0.5)[0]
        if above.size:
            k = int(above[0])
            if k == 0:
                out[i] = ts[0]
            else:
                f0, f1 = row[k - 1], row[k]
                out[i] = ts[k - 1] + (0.5 - f0) * (ts[k] - ts[k - 1]) / (f1 - f0)
    return out


def _grams(integrator, dt, betas, starts, ts):
    """Gram matrices `(B, S, T, n, n)` from `gram_trajectory`, jit + vmap over β and starts."""

    def one(b, x):
        return wb.particles.gram_trajectory(b, x, dt=dt, save_ts=ts, integrator=integrator)

    run = jax.jit(jax.vmap(jax.vmap(one, (None, 0)), (0, None)))
    return np.asarray(run(jnp.asarray(betas), starts))


def _fit_order(dts, errors) -> float | None:
    dts, errors = np.asarray(dts), np.asarray(errors)
    ok = errors > 1e-13  # above the float64 floor
    if ok.sum() < 2:
        return None
    return float(np.polyfit(np.log(dts[ok]), np.log(errors[ok]), 1)[0])


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    betas = np.asarray(config.betas, float)
    ts = config.save_every * np.arange(round(config.t_max / config.save_every) + 1)
    key_diagram, key_order = jax.random.split(jax.random.key(config.seed))
    starts = wb.particles.random_starts(
        key_diagram, config.num_starts, config.n, config.d, jnp.float64
    )
    order_starts = wb.particles.random_starts(
        key_order, config.order_starts, config.n, config.d, jnp.float64
    )
    order_ts = np.asarray(config.order_ts, float)

    def diagram(integrator, dt):
        return wb.particles.phase_diagram(
            betas,
            starts,
            dt=dt,
            save_ts=ts,
            integrator=integrator,
            delta=config.delta,
            per_start=True,
        )

    rk4 = wb.particles.ProjectedRK4()
    ref = diagram(rk4, config.reference_dt)
    ref_half = _half_times(ts, ref.fraction)
    ref_grams = _grams(rk4, config.reference_dt, config.order_betas, order_starts, order_ts)
    point_index = [
        (int(np.argmin(np.abs(betas - b))), int(np.argmin(np.abs(ts - t))))
        for b, t in zip(config.point_betas, config.point_ts)
    ]

    rows = []
    for name in config.integrators:
        integrator = _integrator(name)
        for dt in config.dts:
            pd = diagram(integrator, dt)
            err = np.abs(pd.fraction - ref.fraction)
            half = _half_times(ts, pd.fraction)
            both = ~np.isnan(half) & ~np.isnan(ref_half)
            grams = _grams(integrator, dt, config.order_betas, order_starts, order_ts)
            gram_err = np.abs(grams - ref_grams).max(axis=(0, 1, 3, 4))  # per order time
            rows.append(
                {
                    "integrator": name,
                    "dt": dt,
                    "mean_abs_error": float(err.mean()),
                    "max_abs_error": float(err.max()),
                    "per_start_mean_abs_disagreement": float(
                        np.abs(pd.per_start - ref.per_start).mean()
                    ),
                    "t_half_mean_abs_shift": float(np.abs(half - ref_half)[both].mean())
                    if both.any()
                    else None,
                    "t_half_defined_mismatch": int((np.isnan(half) != np.isnan(ref_half)).sum()),
                    "points": [
                        {
                            "beta": float(betas[i]),
                            "t": float(ts[k]),
                            "value": float(pd.fraction[i, k]),
                            "reference": float(ref.fraction[i, k]),
                        }
                        for i, k in point_index
                    ],
                    "gram_max_error": {f"{t:g}": float(e) for t, e in zip(order_ts, gram_err)},
                }
            )

    orders = {}
    for name in config.integrators:
        sub = [r for r in rows if r["integrator"] == name]
        first = f"{order_ts[0]:g}"
        orders[name] = {
            "gram_order_at_t": first,
            "observed_order": _fit_order(
                [r["dt"] for r in sub], [r["gram_max_error"][first] for r in sub]
            ),
            "statistic_order": _fit_order(
                [r["dt"] for r in sub], [r["mean_abs_error"] for r in sub]
            ),
        }
    # The paper averages over 2^10 starts: its standard error is ours × sqrt(S / 1024).
    scale = math.sqrt(config.num_starts / 1024)
    sem = {
        "max": float(ref.sem.max()),
        "mean": float(ref.sem.mean()),
        "max_at_1024_starts": float(ref.sem.max() * scale),
        "mean_at_1024_starts": float(ref.sem.mean() * scale),
    }
    if wb.report.have_matplotlib():
        _plot(rows, config, out / "step_convergence.png")
    return {
        "betas": betas.tolist(),
        "ts": ts.tolist(),
        "reference": {
            "integrator": "rk4",
            "dt": config.reference_dt,
            "fraction": np.round(ref.fraction, 6).tolist(),
            "standard_error_over_starts": sem,
        },
        "rows": rows,
        "orders": orders,
        "report": _report(rows, orders, sem, config),
    }


def _report(rows, orders, sem, config: Config) -> str:
    first = f"{config.order_ts[0]:g}"
    table = wb.report.markdown_table(
        [
            "integrator",
            "dt",
            "mean |ΔF̄|",
            "max |ΔF̄|",
            "per-start mean |ΔF|",
            "mean |Δt½|",
            *[f"|ΔG| t={t:g}" for t in config.order_ts],
        ],
        [
            [
                r["integrator"],
                r["dt"],
                r["mean_abs_error"],
                r["max_abs_error"],
                r["per_start_mean_abs_disagreement"],
                r["t_half_mean_abs_shift"],
                *[r["gram_max_error"][f"{t:g}"] for t in config.order_ts],
            ]
            for r in rows
        ],
        floatfmt=".2e",
    )
    points = wb.report.markdown_table(
        ["integrator", "dt", *[f"F̄(β={p['beta']:g}, t={p['t']:g})" for p in rows[0]["points"]]],
        [[r["integrator"], r["dt"], *[p["value"] for p in r["points"]]] for r in rows]
        + [["reference rk4", config.reference_dt, *[p["reference"] for p in rows[0]["points"]]]],
        floatfmt=".4f",
    )
    order_lines = [
        f"- {name}: Gram-matrix order at t = {first}: "
        + ("n/a" if o["observed_order"] is None else f"**{o['observed_order']:.2f}**")
        + " (expected "
        + ("1" if name == "euler" else "4")
        + "); log-log slope of the diagram error: "
        + ("n/a" if o["statistic_order"] is None else f"{o['statistic_order']:.2f}")
        for name, o in orders.items()
    ]
    authors = next(
        (r for r in rows if r["integrator"] == "euler" and math.isclose(r["dt"], 0.1)), None
    )
    lines = [
        f"SA, n = {config.n}, d = {config.d}, {len(config.betas)} β in "
        f"[{min(config.betas):g}, {max(config.betas):g}], {config.num_starts} starts (the same for "
        f"every dt), t ∈ [0, {config.t_max:g}] saved every {config.save_every:g}, δ = "
        f"{config.delta:g}, float64. Reference: RK4 at dt = {config.reference_dt:g}. ΔF̄: error "
        "of the start-averaged statistic over the (β, t) grid; per-start: mean over (β, start, t) "
        "of |ΔF|; Δt½: shift of the 0.5-level curve; ΔG: max |Gram − reference| over "
        f"{len(config.order_betas)} β × {config.order_starts} starts.",
        "",
        table,
        "",
        points,
        "",
        *order_lines,
        f"- Statistical error of the diagram itself (s.e.m. over {config.num_starts} starts): "
        f"max {sem['max']:.3g}, mean {sem['mean']:.3g}; scaled to the paper's 1024 starts: max "
        f"{sem['max_at_1024_starts']:.3g}, mean {sem['mean_at_1024_starts']:.3g}.",
    ]
    if authors is not None:
        shift = authors["t_half_mean_abs_shift"]
        curve_ok = shift is not None and shift < config.save_every
        cells_ok = authors["max_abs_error"] <= max(sem["max_at_1024_starts"], 1e-12)
        rk4 = next(
            (r for r in rows if r["integrator"] == "rk4" and math.isclose(r["dt"], 0.1)), None
        )
        lines.append(
            "- **Is the authors' dt = 0.1 (Euler) converged?** Transition curve: "
            + ("**yes**" if curve_ok else "**no**")
            + " — the 0.5-level curve moves by "
            + ("n/a" if shift is None else f"{shift:.3g}")
            + f" time units on average (saved every {config.save_every:g}). Cell by cell: "
            + ("**yes**" if cells_ok else "**no**")
            + f" — max |ΔF̄| = {authors['max_abs_error']:.2e} (mean "
            f"{authors['mean_abs_error']:.2e}) against a statistical error of "
            f"{sem['max_at_1024_starts']:.2e} (max s.e.m. of a 1024-start diagram); the largest "
            "errors sit on the steep front, where a small shift in time changes the value a lot. "
            f"The particles themselves are off by {authors['gram_max_error'][first]:.1e} in the "
            f"Gram matrix at t = {first} (observed orders above)."
            + (
                ""
                if rk4 is None
                else f" RK4 at dt = 0.1 gives max |ΔF̄| = {rk4['max_abs_error']:.2e} (Gram "
                f"error {rk4['gram_max_error'][first]:.1e}) at four times the cost per step."
            )
        )
    return "\n".join(lines) + "\n"


def _plot(rows, config: Config, path: pathlib.Path) -> None:
    fig, axes = wb.report.new_figure(1, 2, figsize=(10, 4))
    for name, marker in (("euler", "o"), ("rk4", "s")):
        sub = [r for r in rows if r["integrator"] == name]
        if not sub:
            continue
        dts = [r["dt"] for r in sub]
        floor = 1e-17
        axes[0].loglog(
            dts, [max(r["mean_abs_error"], floor) for r in sub], marker + "-", label=f"{name}: mean"
        )
        axes[0].loglog(
            dts, [max(r["max_abs_error"], floor) for r in sub], marker + ":", label=f"{name}: max"
        )
        for t in config.order_ts:
            axes[1].loglog(
                dts,
                [max(r["gram_max_error"][f"{t:g}"], floor) for r in sub],
                marker + "-",
                label=f"{name}, t = {t:g}",
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
    wb.report.save_figure(fig, path)
