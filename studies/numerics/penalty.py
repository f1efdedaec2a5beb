"""Does the Moreau–Yosida penalty form converge to the projected (post-norm) equation as ε → 0,
and do implicit/IMEX solvers handle its stiffness with far fewer steps than an explicit one?

The penalty form `u_t = G(u) − (u − P_S u)/ε` (`wb.Penalty(ε)`, `docs/equations.md`) replaces
the post-norm constraint `u ∈ S` (the last LayerNorm set) by a pull of strength 1/ε towards it.
It should approach the projected ODE (`wb.Projected()`) at distance O(ε), and it is stiff: its
Jacobian has eigenvalues ≈ −1/ε normal to S, so an explicit solver's step is capped near ε.

Model: a small random post-norm GELU encoder (full size: 1 layer, d = 8, n = 4, 2 heads; float64).
Reference: the projected ODE solved by fixed-step Dopri8 (`wb.analysis.reference_solution`,
Richardson-checked). Part 1, the ε ladder: the penalty form solved by the first of `solvers`
(adaptive, rtol = atol = `ladder_accuracy`, far below the distances measured) for each ε; the
max-abs distance at T to the reference, and its slope in ε on log-log axes (`fit_order` over all
points; 1 expected). Part 2, stiffness: at `stiff_epsilon`, the steps taken by Kvaerno5
(implicit) and KenCarp4 (IMEX: the drift explicit, the penalty implicit), both with a Newton root
finder, against Tsit5 (explicit), all with the same PID tolerance.

Figures: `distance` (distance to the projected solution against ε, with slope 1), `steps` (the
solvers' accepted and rejected steps at `stiff_epsilon`).
"""

from __future__ import annotations

import dataclasses
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba
from studies._toolkit.config import (
    check,
    check_choices,
    check_divides,
    check_nonempty,
    check_positive,
    check_range,
    check_seed,
)
from studies._toolkit.report import markdown_table, new_figure, progress

NAME = "penalty-form"
SUMMARY = "Moreau–Yosida penalty form: O(ε) distance to post-norm; implicit/IMEX vs Tsit5 steps."

SOLVERS = {"kvaerno5": "Kvaerno5 (implicit)", "kencarp4": "KenCarp4 (IMEX)"}
EXPLICIT = "tsit5"
LABELS = {**SOLVERS, EXPLICIT: "Tsit5 (explicit)"}


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 8
    """Model width d."""
    n: int = 4
    """Tokens n of the random input state."""
    num_layers: int = 1
    """Encoder layers (the equation's time span)."""
    num_heads: int = 2
    """Attention heads per layer; must divide d."""
    dim_feedforward: int = 8
    """Hidden width of the feed-forward block."""
    epsilons: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4)
    """The ε ladder: distance to the projected solution at each (slope 1 expected)."""
    ladder_accuracy: float = 1e-9
    """rtol = atol of the ε ladder's solves (far below the distances they measure)."""
    stiff_epsilon: float = 1e-6
    """ε at which the implicit/IMEX solvers' and Tsit5's step counts are compared."""
    tolerance: float = 1e-6
    """rtol = atol of the PID controller in the step-count comparison."""
    solvers: tuple[str, ...] = ("kvaerno5", "kencarp4")
    """Implicit/IMEX solvers compared with Tsit5; the first also solves the ε ladder."""
    newton_tolerance: float = 1e-8
    """rtol = atol of the Newton root finder: tight enough for the ε ladder, loose enough to
    converge at a stiff ε, where the penalty amplifies rounding by 1/ε."""
    reference_steps_per_layer: int = 64
    """Fixed Dopri8 steps per layer of the projected-ODE reference."""
    max_steps: int = 4_000_000
    """The most steps per layer of any solve (Tsit5 needs ≈ 1/ε)."""
    slope_tolerance: float = 0.3
    """The verdict: the fitted slope of distance vs ε within this of 1."""
    min_step_ratio: float = 10.0
    """The verdict: Tsit5 takes at least this many times the steps of each implicit/IMEX solver."""
    seed: int = 0
    """Seeds the random weights and input state."""

    def __post_init__(self):
        check_positive(self, "d", "n", "num_layers", "num_heads", "dim_feedforward", "max_steps")
        check_divides(self, "num_heads", into="d")
        check_nonempty(self, "epsilons", "solvers")
        check_choices(self, "solvers", SOLVERS)
        for field in ("epsilons", "solvers"):
            values = getattr(self, field)
            check(self, field, len(set(values)) == len(values), "the values must be distinct")
        check(self, "epsilons", len(self.epsilons) >= 3, "give at least 3")
        check_range(self, "epsilons", 0.0, 1.0, low_open=True)
        check_range(self, "stiff_epsilon", 0.0, 1.0, low_open=True)
        ok = self.stiff_epsilon <= min(self.epsilons)
        check(self, "stiff_epsilon", ok, f"it must be <= min(epsilons)={min(self.epsilons)!r}")
        check_range(self, "ladder_accuracy", 0.0, 1e-4, low_open=True)
        check_range(self, "tolerance", 0.0, 1e-2, low_open=True)
        check_range(self, "newton_tolerance", 0.0, 1e-4, low_open=True)
        ok = self.reference_steps_per_layer >= 2
        check(self, "reference_steps_per_layer", ok, "it must be >= 2 (Richardson halves it)")
        check_range(self, "slope_tolerance", 0.0, 1.0, low_open=True)
        check_range(self, "min_step_ratio", 1.0)
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64), dominated by the implicit
        solvers' Newton iterations on the flattened state, `N = n · d` unknowns: the dense
        Jacobian by forward differentiation (`N` tangents through one evaluation, the `N × N`
        matrix) with its LU factors and a copy (`4·N²`), plus the model's solve
        (`_memory.encoder_solve_bytes`: parameters and the 13 stages of the Dopri8 reference).
        Steps are not stored (only the final state is saved), so `max_steps` does not count."""
        from studies._toolkit import memory as M

        size = self.n * self.d
        evaluation = M.attention_layer_floats(self.n, self.d, self.dim_feedforward, self.num_heads)
        newton = M.array_bytes(size, evaluation) + M.array_bytes(4, size, size)
        solve = M.encoder_solve_bytes(
            n=self.n,
            d=self.d,
            hidden=self.dim_feedforward,
            heads=self.num_heads,
            layers=self.num_layers,
        )
        return newton + solve


def smoke_config() -> Config:
    return Config(epsilons=(1e-1, 1e-2, 1e-3), stiff_epsilon=1e-4, ladder_accuracy=1e-7)


@dataclasses.dataclass(frozen=True)
class SolverCount:
    """One solve at `stiff_epsilon`."""

    num_steps: int
    """Steps taken, accepted and rejected."""
    num_rejected_steps: int
    ok: bool
    """The solve succeeded (`Solution.result == wb.RESULTS.successful`)."""
    failure: str
    """Why it failed (the `wb.RESULTS` message); empty when `ok`."""
    distance: float
    """Max-abs distance at T to the projected solution."""
    seconds: float
    """Wall time of the solve, compilation included."""


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    epsilons: np.ndarray
    distances: np.ndarray
    """Max-abs distance at T of the penalty solution to the projected one, per ε."""
    ladder_ok: list[bool]
    """Whether each ε-ladder solve succeeded."""
    slope: float
    """Least-squares slope of log distance against log ε (all points)."""
    slope_ci: list[float]
    reference_error_estimate: float
    counts: dict[str, SolverCount]
    """By solver name: the implicit/IMEX `solvers`, then `tsit5`."""
    step_ratios: dict[str, float]
    """By implicit/IMEX solver: Tsit5's steps over its steps."""


# --------------------------------------------------------------------------------------------
# Compute
# --------------------------------------------------------------------------------------------


def _model(config: Config):
    rng = np.random.default_rng(config.seed)
    sd = wb.architectures.random_encoder_state_dict(
        rng, d=config.d, num_layers=config.num_layers, dim_feedforward=config.dim_feedforward
    )
    equation = wb.architectures.encoder_from_torch(
        sd, num_heads=config.num_heads, norm_first=False, activation="gelu"
    ).equation
    return equation, jnp.asarray(rng.standard_normal((config.n, config.d)))


def compute(config: Config) -> Results:
    """The ε ladder and the step counts at `stiff_epsilon` (float64)."""
    import optimistix as optx

    with jax.enable_x64(True):
        equation, u0 = _model(config)
        ref = wba.reference_solution(equation, u0, steps_per_layer=config.reference_steps_per_layer)
        newton = optx.Newton(rtol=config.newton_tolerance, atol=config.newton_tolerance)
        implicit = {"kvaerno5": diffrax.Kvaerno5, "kencarp4": diffrax.KenCarp4}
        chosen = {k: implicit[k](root_finder=newton) for k in config.solvers}

        def solve(solver, epsilon, tol):
            # Array ε and tolerances, throw=False and one max_steps: every solve of a solver
            # shares one compilation.
            pid = diffrax.PIDController(rtol=jnp.asarray(tol), atol=jnp.asarray(tol))
            start = time.perf_counter()
            sol = wb.integrate(
                equation,
                u0,
                solver,
                formulation=wb.Penalty(jnp.asarray(epsilon)),
                stepsize_controller=pid,
                max_steps=config.max_steps,
                throw=False,
            )
            distance = float(np.max(np.abs(np.asarray(sol.u1) - np.asarray(ref.u1))))
            return sol, distance, time.perf_counter() - start

        first = chosen[config.solvers[0]]
        distances, ladder_ok = [], []
        for eps in progress(config.epsilons, desc="penalty ε"):
            sol, distance, _ = solve(first, eps, config.ladder_accuracy)
            distances.append(distance)
            ladder_ok.append(bool(sol.result == wb.RESULTS.successful))
        counts = {}
        for name, solver in progress([*chosen.items(), (EXPLICIT, diffrax.Tsit5())], desc="ε*"):
            sol, distance, seconds = solve(solver, config.stiff_epsilon, config.tolerance)
            ok = bool(sol.result == wb.RESULTS.successful)
            counts[name] = SolverCount(
                int(sol.stats["num_steps"]),
                int(sol.stats["num_rejected_steps"]),
                ok,
                "" if ok else wb.RESULTS[sol.result],
                distance,
                seconds,
            )
    fit = wba.fit_order(config.epsilons, distances, asymptotic=False)
    ratios = {k: counts[EXPLICIT].num_steps / max(counts[k].num_steps, 1) for k in chosen}
    return Results(
        config=config,
        epsilons=np.asarray(config.epsilons, dtype=np.float64),
        distances=np.asarray(distances),
        ladder_ok=ladder_ok,
        slope=float(fit.order),
        slope_ci=[float(fit.ci_low), float(fit.ci_high)],
        reference_error_estimate=float(ref.error_estimate),
        counts=counts,
        step_ratios=ratios,
    )


# --------------------------------------------------------------------------------------------
# Verdict, report, figures
# --------------------------------------------------------------------------------------------


def _slope_ok(results: Results) -> bool:
    c = results.config
    return all(results.ladder_ok) and abs(results.slope - 1.0) <= c.slope_tolerance


def _slow_solvers(results: Results) -> list[str]:
    """The implicit/IMEX solvers that failed or took more than Tsit5 / `min_step_ratio` steps."""
    c = results.config
    return [
        k
        for k, ratio in results.step_ratios.items()
        if not results.counts[k].ok or ratio < c.min_step_ratio
    ]


def verdict(results: Results) -> str:
    """Yes if the slope of the distance in ε is within `slope_tolerance` of 1 and every
    implicit/IMEX solver takes at least `min_step_ratio` times fewer steps than Tsit5; Partly if
    one of the two holds; No otherwise."""
    c = results.config
    slope_ok, slow = _slope_ok(results), _slow_solvers(results)
    word = "Yes" if slope_ok and not slow else "No" if not slope_ok and slow else "Partly"
    failed = sum(not ok for ok in results.ladder_ok)
    ratios = ", ".join(
        f"{r:.0f}× those of {LABELS[k]}" + ("" if results.counts[k].ok else " (whose solve failed)")
        for k, r in results.step_ratios.items()
    )
    parts = [
        f"{word}. The distance to the projected solution falls with slope {results.slope:.2f} in "
        f"ε (1 expected, tolerance ±{c.slope_tolerance:g})"
        + (f", but {failed} ε-ladder solve(s) failed" if failed else "")
        + ".",
        f"At ε = {c.stiff_epsilon:g} Tsit5 takes {results.counts[EXPLICIT].num_steps} steps, "
        f"{ratios} (at least {c.min_step_ratio:g}× required)"
        + (f": too few for {', '.join(LABELS[k] for k in slow)}." if slow else "."),
    ]
    return " ".join(parts)


def report(results: Results) -> str:
    c = results.config
    ladder = markdown_table(
        ["ε", "distance to projected", "solve"],
        [
            (f"{e:g}", f"{d:.3e}", "ok" if ok else "failed")
            for e, d, ok in zip(results.epsilons, results.distances, results.ladder_ok)
        ],
    )
    steps = markdown_table(
        ["solver", "steps", "rejected", "Tsit5 steps / steps", "seconds", "distance", "solve"],
        [
            (
                LABELS[k],
                v.num_steps,
                v.num_rejected_steps,
                "—" if k == EXPLICIT else round(results.step_ratios[k], 1),
                f"{v.seconds:.2f}",
                f"{v.distance:.2e}",
                "ok" if v.ok else v.failure,
            )
            for k, v in results.counts.items()
        ],
    )
    return "\n".join(
        [
            f"Random post-norm GELU encoder: {c.num_layers} layer(s), d = {c.d}, n = {c.n}, "
            f"{c.num_heads} heads, float64. Reference: the projected ODE by fixed-step Dopri8, "
            f"{c.reference_steps_per_layer} steps per layer (Richardson error estimate "
            f"{results.reference_error_estimate:.1e}). Distances are max-abs at T.",
            "",
            f"**ε ladder** ({LABELS[c.solvers[0]]}, Newton rtol = atol = {c.newton_tolerance:g}, "
            f"PID rtol = atol = {c.ladder_accuracy:g}): slope {results.slope:.3f}, 95 % CI "
            f"[{results.slope_ci[0]:.2f}, {results.slope_ci[1]:.2f}] (expected 1).",
            "",
            ladder,
            "",
            f"**Stiffness** at ε = {c.stiff_epsilon:g} (PID rtol = atol = {c.tolerance:g}; the "
            "implicit/IMEX solvers with a Newton root finder; seconds are wall time including "
            f"compilation, which {LABELS[c.solvers[0]]} did in the ε ladder):",
            "",
            steps,
        ]
    )


def figures(results: Results) -> dict:
    c, e, dist = results.config, results.epsilons, results.distances
    fig, ax = new_figure(figsize=(6, 4.5))
    ax.loglog(e, dist, "o-", label=f"measured (slope {results.slope:.2f})")
    ax.loglog(e, dist[0] * e / e[0], "k--", lw=1, label="slope 1")
    ax.set(xlabel="penalty ε", ylabel="max-abs distance to the projected solution at T")
    ax.set_title("Penalty (Moreau–Yosida) form → projected ODE")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    figs = {"distance": fig}
    fig, ax = new_figure(figsize=(6, 4.5))
    names = list(results.counts)
    x = np.arange(len(names))
    accepted = [results.counts[k].num_steps - results.counts[k].num_rejected_steps for k in names]
    rejected = [results.counts[k].num_rejected_steps for k in names]
    ax.bar(x, accepted, label="accepted")
    ax.bar(x, rejected, bottom=accepted, label="rejected")
    ax.set_yscale("log")
    ax.set_ylim(bottom=1)
    ax.set_xticks(x, [LABELS[k] for k in names])
    ax.set(ylabel="steps", title=f"Steps at ε = {c.stiff_epsilon:g}, rtol = atol = {c.tolerance:g}")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend()
    figs["steps"] = fig
    return figs
