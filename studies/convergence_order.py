"""Do the splitting schemes and diffrax solvers reach their declared orders on the Transformer
equation, and which is cheapest for a given accuracy?

Model: a 6-layer encoder (d = 64, n = 32, 4 heads, GELU, float64) in two weight sets: `random`
(i.i.d. weights, `wb.architectures.random_encoder_state_dict`) and `recovered` (PyTorch's own
initialization of `torch.nn.TransformerEncoderLayer`, one independently seeded layer per depth,
loaded through `encoder_from_torch`; needs the `reference` extra, else skipped). Equations:
`pre-norm` (smooth: `u_t = A(LN u) + F(LN u)`) solved by every method, and `post-norm` as the
projected ODE on the last LayerNorm set, solved by diffrax solvers wrapped in
`ProjectedSolver` (projection after every step).

For every (weights, equation, method) a ladder of 6 step counts per layer, chosen by
`error_ladder(..., 'auto')` so that the errors span the method's `ERROR_RANGE` (inside the asymptotic range,
above the round-off floor), is solved by one compiled program (the step count is a run-time
value) and compared with a Dopri8 reference
(fixed steps, its own error estimated by Richardson); the observed order is the log-log slope on
the asymptotic window found by `wb.analysis.fit_order` (with a 95 % interval, the pre-asymptotic
points and the round-off floor left out), and Richardson's error estimate at the finest step is
compared with the measured error. Work–precision: error against vector-field evaluations and
against wall time. Compile time is reported separately.

Penalty form (with `post-norm`): on a small post-norm model, the Moreau–Yosida solution
`u_t = G(u) − (u − P_S u)/ε` (Kvaerno5 with Newton, tight tolerance) against the projected ODE as
ε shrinks (slope 1 expected), and the step counts of an implicit (Kvaerno5), an IMEX (KenCarp4:
drift explicit, penalty implicit) and an explicit (Tsit5) solver at a stiff ε with one tolerance.
"""

import dataclasses
import pathlib
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba

NAME = "convergence-order"
SUMMARY = "Observed orders of splitting schemes and diffrax solvers; work-precision diagrams."

METHODS = wba.METHODS  # name -> (constructor, declared order, family)
SPLITTING = tuple(k for k, v in METHODS.items() if v[2] == "splitting")
# The error range each ladder spans (`error_ladder(..., 'auto')`), by declared order: inside the asymptotic
# range (Tsit5/Dopri5 have small 5th-order constants, so their 6th-order terms dominate down to
# ~1e-9 errors) and ≥ 2 decades above the float64 round-off floor.
ERROR_RANGE = {
    1: (3e-1, 3e-1 / 2**5),
    2: (3e-2, 3e-2 / 4**5),
    3: (1e-3, 1e-3 / 8**5),
    4: (1e-4, 1e-9),
    5: (1e-9, 3e-13),
    8: (1e-7, 1e-12),
}
WEIGHTS = ("random", "recovered")
PENALTY_SOLVERS = ("kvaerno5", "kencarp4")
EQUATIONS = ("pre-norm", "post-norm")


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 64
    n: int = 32
    num_layers: int = 6
    num_heads: int = 4
    dim_feedforward: int = 128
    weights: tuple[str, ...] = WEIGHTS
    equations: tuple[str, ...] = EQUATIONS
    methods: tuple[str, ...] = (
        "euler",
        "heun",
        "midpoint",
        "ralston",
        "bosh3",
        "rk4",
        "tsit5",
        "dopri5",
        "dopri8",
        "lie",
        "strang",
        "yoshida4",
    )
    post_norm_methods: tuple[str, ...] = ("euler", "heun", "rk4", "tsit5")
    """Methods for the projected post-norm equation (diffrax solvers only)."""
    reference_steps_per_layer: int = 256
    penalty_epsilons: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4)
    """Penalty form: ε values for the distance to the projected solution (slope 1 expected)."""
    stiff_epsilon: float = 1e-6
    """Penalty form: ε at which implicit/IMEX and Tsit5 step counts are compared."""
    penalty_tolerance: float = 1e-6
    """rtol = atol of the PID controller in the step-count comparison."""
    penalty_solvers: tuple[str, ...] = ("kvaerno5", "kencarp4")
    """Implicit/IMEX solvers compared with Tsit5; the first also solves the ε ladder."""
    penalty_accuracy: float = 1e-9
    """rtol = atol for the ε ladder (far below the distances it measures)."""
    repeats: int = 2
    """Timed runs per step count (median reported)."""
    tol: float = 0.3
    """Local orders within `tol` of each other form the asymptotic window (`fit_order`)."""
    seed: int = 0


def smoke_config() -> Config:
    return Config(
        d=16,
        n=8,
        num_layers=2,
        num_heads=2,
        dim_feedforward=32,
        weights=("random",),
        methods=("rk4", "tsit5", "strang"),
        post_norm_methods=("heun",),
        reference_steps_per_layer=64,
        penalty_epsilons=(1e-1, 1e-2, 1e-3),
        stiff_epsilon=1e-4,
        penalty_solvers=("kencarp4",),
        penalty_accuracy=1e-7,
        repeats=1,
    )


def _check(config: Config) -> None:
    if not jax.config.jax_enable_x64:
        raise ValueError("the convergence-order study runs in float64; run it via `workbench run`.")
    for field, valid in (("weights", WEIGHTS), ("equations", EQUATIONS)):
        values = getattr(config, field)
        if not values:
            raise ValueError(f"{field} is empty; choose from {', '.join(valid)}.")
        for v in values:
            if v not in valid:
                raise ValueError(f"{field}: {v!r} is not known; valid: {', '.join(valid)}.")
    for field in ("methods", "post_norm_methods"):
        for v in getattr(config, field):
            if v not in METHODS:
                raise ValueError(f"{field}: {v!r} is not known; valid: {', '.join(METHODS)}.")
    for v in config.post_norm_methods:
        if v in SPLITTING:
            raise ValueError(
                f"post_norm_methods: {v!r} is a splitting scheme; the projected post-norm "
                "equation is solved by diffrax solvers (see the splitting-error study for "
                "post-norm splitting)."
            )
    for field in (
        "d",
        "n",
        "num_layers",
        "num_heads",
        "dim_feedforward",
        "repeats",
    ):
        if getattr(config, field) < 1:
            raise ValueError(f"{field}={getattr(config, field)!r} must be >= 1.")
    if config.reference_steps_per_layer < 2:
        raise ValueError(
            f"reference_steps_per_layer={config.reference_steps_per_layer!r} must be >= 2."
        )
    if len(config.penalty_epsilons) < 3 or any(not e > 0 for e in config.penalty_epsilons):
        raise ValueError(
            f"penalty_epsilons={config.penalty_epsilons!r} needs at least 3 values > 0 "
            "(an order fit needs 3)."
        )
    if not config.penalty_solvers:
        raise ValueError(f"penalty_solvers is empty; choose from {', '.join(PENALTY_SOLVERS)}.")
    for v in config.penalty_solvers:
        if v not in PENALTY_SOLVERS:
            raise ValueError(
                f"penalty_solvers: {v!r} is not known; valid: {', '.join(PENALTY_SOLVERS)}."
            )
    for field in ("stiff_epsilon", "penalty_tolerance", "penalty_accuracy"):
        if not getattr(config, field) > 0:
            raise ValueError(f"{field}={getattr(config, field)!r} must be > 0.")
    if not config.tol > 0:
        raise ValueError(f"tol={config.tol!r} must be > 0.")
    if config.d % config.num_heads:
        valid = [h for h in range(1, config.d + 1) if config.d % h == 0]
        raise ValueError(
            f"num_heads={config.num_heads} does not divide d={config.d}; valid head counts: {valid}."
        )


def _state_dict(config: Config, weights: str, rng):
    if weights == "random":
        return wb.architectures.random_encoder_state_dict(
            rng, d=config.d, num_layers=config.num_layers, dim_feedforward=config.dim_feedforward
        )
    import torch

    sd = {}
    for i in range(config.num_layers):
        torch.manual_seed(config.seed * 1000 + i)
        layer = torch.nn.TransformerEncoderLayer(
            config.d, config.num_heads, config.dim_feedforward, dropout=0.0, activation="gelu"
        )
        for k, v in layer.state_dict().items():
            sd[f"layers.{i}.{k}"] = v.detach().numpy().astype(np.float64)
    return sd


def _equation(config: Config, sd, equation: str):
    model = wb.architectures.encoder_from_torch(
        sd, num_heads=config.num_heads, norm_first=equation == "pre-norm", activation="gelu"
    )
    return model.equation


def _constraint_violation(equation, us) -> float:
    ln = equation.operators[-1].projection.evaluate(equation.t1 - 0.5 * equation.piece_length)
    worst = 0.0
    for u in us:
        w = (np.asarray(u) - np.asarray(ln.bias)) / np.asarray(ln.weight)
        worst = max(worst, float(np.max(np.abs(w.mean(-1)))), float(np.max(np.abs(w.var(-1) - 1))))
    return worst


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    rng = np.random.default_rng(config.seed)
    u0 = jnp.asarray(rng.standard_normal((config.n, config.d)))
    have_torch = wb.architectures.have_reference()
    rows, skipped, timing = [], [], {}
    for weights in config.weights:
        if weights == "recovered" and not have_torch:
            skipped.append("recovered weights: torch is not installed (the `reference` extra)")
            continue
        sd = _state_dict(config, weights, np.random.default_rng(config.seed + 1))
        for equation_name in config.equations:
            equation = _equation(config, sd, equation_name)
            names = config.methods if equation_name == "pre-norm" else config.post_norm_methods
            start = time.perf_counter()
            ref = wba.reference_solution(
                equation, u0, steps_per_layer=config.reference_steps_per_layer
            )
            table_start = time.perf_counter()
            compile_total = 0.0
            for name in names:
                make, order, _ = METHODS[name]
                res = wba.error_ladder(
                    equation,
                    u0,
                    make(),
                    "auto",
                    ref,
                    error_range=ERROR_RANGE[order],
                    declared_order=order,
                    repeats=config.repeats,
                    tol=config.tol,
                )
                compile_total += res.compile_seconds
                fit = res.fit
                row = {
                    "weights": weights,
                    "equation": equation_name,
                    "method": name,
                    "declared": order,
                    "order": None if fit is None else fit.order,
                    "ci": None if fit is None else [fit.ci_low, fit.ci_high],
                    "points_in_fit": 0 if fit is None else fit.num_used,
                    "within_0.3": None if fit is None else abs(fit.order - order) <= 0.3,
                    "ladder": res.to_dict(),
                }
                if equation_name == "post-norm":
                    row["constraint_violation"] = _constraint_violation(equation, res.solutions)
                rows.append(row)
            table_s = time.perf_counter() - table_start
            timing[f"{weights}/{equation_name}"] = {
                "reference_s": table_start - start,
                "reference_error_estimate": ref.error_estimate,
                "table_s": table_s,
                "compile_s": compile_total,
                "run_s": table_s - compile_total,
                "methods": len(names),
                "step_sizes_per_method": 6,
            }

    penalty = _penalty(config) if "post-norm" in config.equations else None
    if wb.report.have_matplotlib():
        _plot(rows, config, out)
        if penalty is not None:
            _plot_penalty(penalty, out)
    return {
        "rows": rows,
        "timing": timing,
        "skipped": skipped,
        "penalty": penalty,
        "report": _report(rows, timing, skipped, config) + _penalty_report(penalty),
    }


def _penalty(config: Config) -> dict:
    """The penalty form on a small post-norm model (1 layer, d = 8, n = 4): distance to the
    projected ODE vs ε, and step counts of implicit, IMEX and explicit solvers at stiff ε."""
    import optimistix as optx

    rng = np.random.default_rng(config.seed + 7)
    sd = wb.architectures.random_encoder_state_dict(rng, d=8, num_layers=1, dim_feedforward=8)
    equation = wb.architectures.encoder_from_torch(
        sd, num_heads=2, norm_first=False, activation="gelu"
    ).equation
    u0 = jnp.asarray(rng.standard_normal((4, 8)))
    ref = wba.reference_solution(equation, u0, steps_per_layer=64).u1
    eps = np.asarray(config.penalty_epsilons, dtype=np.float64)
    # Array tolerances and ε: the solves of each ladder below share one compilation.
    acc = config.penalty_accuracy
    accurate = diffrax.PIDController(rtol=jnp.asarray(acc), atol=jnp.asarray(acc))
    # One Newton for both parts (each solver compiles once): 1e-8 is tight enough for the ε
    # ladder (distances ≥ 1e-4) and loose enough to converge at ε = 1e-6, where the penalty
    # amplifies rounding by 1/ε (a much tighter Newton rejects every step there).
    newton = optx.Newton(rtol=1e-8, atol=1e-8)
    implicit = {
        "kvaerno5": ("Kvaerno5 (implicit)", diffrax.Kvaerno5(root_finder=newton)),
        "kencarp4": ("KenCarp4 (IMEX)", diffrax.KenCarp4(root_finder=newton)),
    }
    chosen = [implicit[k] for k in config.penalty_solvers]
    max_steps = 4_000_000  # one value for every solve: max_steps is a compile-time constant
    dist = []
    for e in eps:
        sol = wb.integrate(
            equation,
            u0,
            chosen[0][1],
            formulation=wb.Penalty(jnp.asarray(e)),  # an array: one compilation for all ε
            stepsize_controller=accurate,
            max_steps=max_steps,
        )
        dist.append(float(np.max(np.abs(np.asarray(sol.u1) - ref))))
    fit = wba.fit_order(eps, dist, asymptotic=False)
    tol = config.penalty_tolerance
    pid = diffrax.PIDController(rtol=jnp.asarray(tol), atol=jnp.asarray(tol))
    counts = {}
    for name, solver in (*chosen, ("Tsit5 (explicit)", diffrax.Tsit5())):
        start = time.perf_counter()
        sol = wb.integrate(
            equation,
            u0,
            solver,
            formulation=wb.Penalty(jnp.asarray(config.stiff_epsilon)),
            stepsize_controller=pid,
            max_steps=max_steps,
            throw=False,
        )
        counts[name] = {
            "num_steps": int(sol.stats["num_steps"]),
            "num_rejected_steps": int(sol.stats["num_rejected_steps"]),
            "result": int(sol.stats["result"]),
            "distance": float(np.max(np.abs(np.asarray(sol.u1) - ref))),
            "seconds": time.perf_counter() - start,
        }
    best = min(v["num_steps"] for k, v in counts.items() if "Tsit5" not in k)
    return {
        "epsilons": eps.tolist(),
        "distance": dist,
        "slope": fit.order,
        "stiff_epsilon": config.stiff_epsilon,
        "tolerance": tol,
        "counts": counts,
        "tsit5_over_best_implicit": counts["Tsit5 (explicit)"]["num_steps"] / best,
    }


def _plot_penalty(p: dict, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.loglog(p["epsilons"], p["distance"], "o-", label=f"measured (slope {p['slope']:.2f})")
    e = np.asarray(p["epsilons"])
    ax.loglog(e, p["distance"][0] * e / e[0], "k--", lw=1, label="slope 1")
    ax.set(
        xlabel="penalty ε",
        ylabel="max-abs distance to the projected solution at T",
        title="Penalty (Moreau–Yosida) form → projected ODE",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    wb.report.save_figure(fig, out / "penalty.png")
    plt.close(fig)


def _penalty_report(p: dict | None) -> str:
    if p is None:
        return ""
    lines = [
        "",
        "",
        f"Penalty form (1 layer, d = 8, n = 4): distance to the projected ODE vs ε = "
        f"{', '.join(f'{e:g}' for e in p['epsilons'])}: "
        f"{', '.join(f'{d:.2e}' for d in p['distance'])} — slope {p['slope']:.3f} (expected 1).",
        f"At ε = {p['stiff_epsilon']:g}, PID rtol = atol = {p['tolerance']:g}:",
    ]
    for name, c in p["counts"].items():
        ok = "" if c["result"] == 0 else " (FAILED)"
        lines.append(
            f"- {name}: {c['num_steps']} steps ({c['num_rejected_steps']} rejected), "
            f"{c['seconds']:.1f} s, distance {c['distance']:.1e}{ok}"
        )
    lines.append(
        f"Tsit5 needs {p['tsit5_over_best_implicit']:.0f}× the steps of the best implicit/IMEX "
        "solver (Newton root finder)."
    )
    return "\n".join(lines)


def _label(row) -> str:
    o = row["order"]
    return f"{row['method']} (p = {o:.2f})" if o is not None else f"{row['method']} (no fit)"


def _plot(rows, config: Config, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["weights"], r["equation"]) for r in rows})
    for weights, equation in groups:
        sel = [r for r in rows if r["weights"] == weights and r["equation"] == equation]
        fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
        colors = plt.cm.tab20(np.linspace(0, 1, 20))
        for i, r in enumerate(sel):
            lad = r["ladder"]
            style = "--" if r["method"] in SPLITTING else "-"
            line = axes[0].loglog(
                lad["step_sizes"],
                lad["errors"],
                style + "o",
                ms=3,
                color=colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20],
                label=_label(r),
            )
            color = line[0].get_color()
            if lad["evaluations"][0] > 0:
                axes[1].loglog(
                    lad["evaluations"],
                    lad["errors"],
                    style + "o",
                    ms=3,
                    color=color,
                    label=r["method"],
                )
            axes[2].loglog(
                lad["seconds"], lad["errors"], style + "o", ms=3, color=color, label=r["method"]
            )
        axes[0].set(
            xlabel="step size h (layer = 1)",
            ylabel="max-abs error at T",
            title="error vs step (fitted orders)",
        )
        axes[1].set(
            xlabel="vector-field evaluations", ylabel="error", title="work-precision: evaluations"
        )
        axes[2].set(xlabel="wall time per solve (s)", ylabel="error", title="work-precision: time")
        for ax in axes:
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7, ncol=2)
        axes[1].legend(fontsize=7, ncol=2)
        fig.suptitle(
            f"{equation}, {weights} weights: {config.num_layers} layers, d = {config.d}, "
            f"n = {config.n}, float64 (dashed: splitting schemes)"
        )
        fig.tight_layout()
        wb.report.save_figure(fig, out / f"convergence_{weights}_{equation}.png")
        plt.close(fig)


def _report(rows, timing, skipped, config: Config) -> str:
    lines = [
        "| weights | equation | method | declared | observed order [95% CI] | points | "
        "error range | Richardson/measured | compilations |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lad = r["ladder"]
        o = (
            "no fit"
            if r["order"] is None
            else f"{r['order']:.3f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
        )
        rich = "—" if lad["richardson"] is None else f"{lad['richardson']:.3f}"
        lines.append(
            f"| {r['weights']} | {r['equation']} | {r['method']} | {r['declared']} | {o} | "
            f"{r['points_in_fit']}/6 | {min(lad['errors']):.1e} – {max(lad['errors']):.1e} | "
            f"{rich} | {lad['compilations']} |"
        )
    out = ["Observed orders (float64; error = max-abs at T against Dopri8):", "", *lines, ""]
    bad = [r for r in rows if r["order"] is None or (r["declared"] < 8 and not r["within_0.3"])]
    eight = [r for r in rows if r["method"] == "dopri8" and r["order"] is not None]
    if bad:
        out.append(
            "Outside ±0.3 of the declared order: "
            + ", ".join(f"{r['weights']}/{r['equation']}/{r['method']}" for r in bad)
            + "."
        )
    else:
        out.append("Every method with declared order ≤ 5 is within ±0.3 of it.")
    for r in eight:
        out.append(f"Dopri8 ({r['weights']}, {r['equation']}): {r['order']:.2f} before the floor.")
    post = [r for r in rows if "constraint_violation" in r]
    if post:
        out.append(
            "Projected post-norm iterates on the LayerNorm set to "
            f"{max(r['constraint_violation'] for r in post):.1e} (max over all runs)."
        )
    out.append("")
    for key, t in timing.items():
        out.append(
            f"- {key}: {t['methods']} methods × 6 step sizes in {t['table_s']:.1f} s "
            f"({t['run_s']:.1f} s running, {t['compile_s']:.1f} s compiling; one compilation "
            f"per method); reference {t['reference_s']:.1f} s, its Richardson error estimate "
            f"{t['reference_error_estimate']:.1e}."
        )
    for s in skipped:
        out.append(f"- skipped: {s}.")
    return "\n".join(out)
