"""Which method and how many steps per layer meet a given accuracy most cheaply for this model,
and is that step inside the linear stability limit? Writes `plan.json`, the discretization plan
that training reads (`wb.analysis.DiscretizationPlan.load`).

For each candidate method a short pilot ladder (3 step counts, one compilation) against a Dopri8
reference fits `e(h) ≈ C h^p` (`fit_order`); the fit predicts the steps per layer that meet
`tolerance` (max-abs error at T), which are then checked by solving, and raised by 25 % until the
measured error meets it. The cheapest candidate by vector-field evaluations wins (ties: wall
time). The largest stable step is predicted from the method's stability function
(`max_stable_step`) on the decaying part (`Re λ < 0`) of the full field's Jacobian spectra
(largest-modulus eigenvalues by Arnoldi) at the start of every layer along the trajectory; for
splitting schemes this is the commuting-operator estimate. Model: as in `convergence-order`
(random weights; pre-norm, or post-norm as the projected ODE with diffrax solvers).
"""

import dataclasses
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba

NAME = "plan"
SUMMARY = "Cheapest method and steps per layer meeting a tolerance; writes plan.json for training."

EQUATIONS = ("pre-norm", "post-norm")
_PILOT_START = {1: 8, 2: 4, 3: 4, 4: 2, 5: 2, 8: 1}


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 64
    n: int = 32
    num_layers: int = 6
    num_heads: int = 4
    dim_feedforward: int = 128
    equation: str = "pre-norm"
    tolerance: float = 1e-6
    methods: tuple[str, ...] = (
        "euler",
        "heun",
        "bosh3",
        "rk4",
        "tsit5",
        "dopri5",
        "dopri8",
        "lie",
        "strang",
        "yoshida4",
    )
    max_refinements: int = 6
    max_steps_per_layer: int = 4096
    """Candidates predicted to need more steps per layer are reported but not run."""
    reference_steps_per_layer: int = 256
    krylov_dim: int = 40
    num_eigenvalues: int = 12
    seed: int = 0


def smoke_config() -> Config:
    return Config(
        d=16,
        n=8,
        num_layers=2,
        num_heads=2,
        dim_feedforward=32,
        tolerance=1e-5,
        methods=("heun", "rk4", "strang"),
        reference_steps_per_layer=64,
        krylov_dim=16,
        num_eigenvalues=6,
    )


def _check(config: Config) -> None:
    if not jax.config.jax_enable_x64:
        raise ValueError("the plan study runs in float64; run it via `workbench run`.")
    if config.equation not in EQUATIONS:
        raise ValueError(
            f"equation={config.equation!r} is not known; valid: {', '.join(EQUATIONS)}."
        )
    if not config.tolerance > 0:
        raise ValueError(f"tolerance={config.tolerance!r} must be > 0 (a max-abs error).")
    if not config.methods:
        raise ValueError(f"methods is empty; choose from {', '.join(wba.METHODS)}.")
    for name in config.methods:
        if name not in wba.METHODS:
            raise ValueError(f"methods: {name!r} is not known; valid: {', '.join(wba.METHODS)}.")
        if config.equation == "post-norm" and wba.METHODS[name][2] == "splitting":
            raise ValueError(
                f"methods: {name!r} is a splitting scheme; the projected post-norm equation is "
                "solved by diffrax solvers only."
            )
    for field in (
        "d",
        "n",
        "num_layers",
        "num_heads",
        "dim_feedforward",
        "max_refinements",
        "max_steps_per_layer",
    ):
        if getattr(config, field) < 1:
            raise ValueError(f"{field}={getattr(config, field)!r} must be >= 1.")
    if config.num_eigenvalues > config.krylov_dim:
        raise ValueError(
            f"num_eigenvalues={config.num_eigenvalues} must be <= krylov_dim={config.krylov_dim}."
        )
    if config.d % config.num_heads:
        valid = [h for h in range(1, config.d + 1) if config.d % h == 0]
        raise ValueError(
            f"num_heads={config.num_heads} does not divide d={config.d}; valid head counts: {valid}."
        )


def _spectra(equation, u0, config: Config) -> np.ndarray:
    """Largest-modulus Jacobian eigenvalues of the full field at the start of every layer."""
    per = 8
    if config.equation == "pre-norm":
        states = wb.integrate(
            equation, u0, wb.schemes.Strang(), num_steps=per * config.num_layers, save_steps=True
        ).us
        starts = [u0] + [states[per * (layer + 1) - 1] for layer in range(config.num_layers - 1)]
    else:
        u = wb.Projected().initial(equation, u0)
        starts = [u]
        for layer in range(config.num_layers - 1):
            sub = equation.localize(layer)
            u = wb.integrate(sub, u, wb.solvers.ClassicalRK4(), num_steps=per).u1
            starts.append(u)
    eigs = []
    for layer, u in enumerate(starts):
        fields = wba.term_fields(equation, layer + 0.5)
        f = fields["full"]
        if config.equation == "post-norm":
            ln = equation.operators[-1].projection.evaluate(layer + 0.5)
            f = jax.tree_util.Partial(lambda g, p, v: jax.jvp(p.retract, (v,), (g(v),))[1], f, ln)
        eigs.append(
            wba.arnoldi_eigenvalues(
                f, u, num_eigenvalues=config.num_eigenvalues, krylov_dim=config.krylov_dim
            )
        )
    return np.concatenate(eigs)


def _stability_method(name: str):
    obj = wba.method_from_name(name)
    # diffrax's Euler carries no Butcher tableau; its stability function is the workbench's.
    return wb.schemes.Euler() if name == "euler" else obj


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    rng = np.random.default_rng(config.seed)
    u0 = jnp.asarray(rng.standard_normal((config.n, config.d)))
    sd = wb.architectures.random_encoder_state_dict(
        np.random.default_rng(config.seed + 1),
        d=config.d,
        num_layers=config.num_layers,
        dim_feedforward=config.dim_feedforward,
    )
    model = wb.architectures.encoder_from_torch(
        sd, num_heads=config.num_heads, norm_first=config.equation == "pre-norm", activation="gelu"
    )
    equation = model.equation
    start = time.perf_counter()
    ref = wba.reference_solution(equation, u0, steps_per_layer=config.reference_steps_per_layer)
    eigs = _spectra(equation, u0, config)
    decaying = eigs[eigs.real < -1e-9 * max(1.0, float(np.max(np.abs(eigs))))]
    candidates = []
    for name in config.methods:
        _, order, _ = wba.METHODS[name]
        method = wba.method_from_name(name)
        k0 = _PILOT_START[order]
        pilot = wba.error_ladder(
            equation, u0, method, [k0, 2 * k0, 4 * k0], ref, declared_order=order, repeats=1
        )
        fit = pilot.fit
        if fit is None:
            # No consistent slope yet (pre-asymptotic pilot): the declared order through the
            # finest pilot point, e = C h^p.
            h, e = pilot.step_sizes[-1], max(float(pilot.errors[-1]), 1e-300)
            fit = wba.OrderFit(
                order,
                e / h**order,
                *([float("nan")] * 3),
                0.95,
                pilot.step_sizes,
                pilot.errors,
                np.ones(3, bool),
                np.zeros(2),
                None,
                0,
            )
        k = predicted = wba.steps_for_tolerance(fit, config.tolerance, equation.piece_length)
        # Check the prediction by solving; raise by 25 % until the measured error meets it.
        check = None
        for _ in range(config.max_refinements + 1):
            if k > config.max_steps_per_layer:
                break  # too expensive: not a candidate (recorded as such)
            lad = wba.error_ladder(equation, u0, method, [k], ref, min_points=1, repeats=3)
            check = lad
            if lad.errors[0] <= config.tolerance:
                break
            k = max(k + 1, int(np.ceil(1.25 * k)))
        if check is None or k > config.max_steps_per_layer:
            candidates.append(
                {
                    "method": name,
                    "declared_order": order,
                    "pilot_order": None if pilot.fit is None else pilot.fit.order,
                    "predicted_steps_per_layer": predicted,
                    "steps_per_layer": None,
                    "measured_error": None,
                    "meets_tolerance": False,
                    "evaluations": None,
                    "seconds": None,
                    "largest_stable_step": float(
                        wba.max_stable_step(_stability_method(name), decaying)
                    ),
                    "step": None,
                    "stable": None,
                    "why": f"needs more than max_steps_per_layer={config.max_steps_per_layer}",
                }
            )
            continue
        met = bool(check.errors[0] <= config.tolerance)
        tau_star = float(wba.max_stable_step(_stability_method(name), decaying))
        step = equation.piece_length / k
        candidates.append(
            {
                "method": name,
                "declared_order": order,
                "pilot_order": None if pilot.fit is None else pilot.fit.order,
                "predicted_steps_per_layer": predicted,
                "steps_per_layer": k,
                "measured_error": float(check.errors[0]),
                "meets_tolerance": met,
                "evaluations": int(check.evaluations[0]),
                "seconds": float(check.seconds[0]),
                "largest_stable_step": tau_star,
                "step": step,
                "stable": step <= tau_star,
            }
        )
    feasible = [c for c in candidates if c["meets_tolerance"]]
    if not feasible:
        raise RuntimeError(
            f"plan: no candidate met tolerance={config.tolerance} within "
            f"{config.max_refinements} refinements; loosen it or add higher-order methods."
        )
    best = min(feasible, key=lambda c: (c["evaluations"], c["seconds"]))
    plan = wba.DiscretizationPlan(
        method=best["method"],
        steps_per_layer=int(best["steps_per_layer"]),
        tolerance=config.tolerance,
        measured_error=best["measured_error"],
        evaluations=best["evaluations"],
        largest_stable_step=best["largest_stable_step"],
        step=best["step"],
        stable=bool(best["stable"]),
        candidates=tuple(candidates),
        model={
            "d": config.d,
            "n": config.n,
            "num_layers": config.num_layers,
            "num_heads": config.num_heads,
            "dim_feedforward": config.dim_feedforward,
            "equation": config.equation,
            "weights": "random",
            "seed": config.seed,
            "error": "max-abs at T against Dopri8 "
            f"({config.reference_steps_per_layer} steps per layer)",
        },
    )
    plan.save(out / "plan.json")
    if wb.report.have_matplotlib():
        _plot(candidates, best, config, out)
    elapsed = time.perf_counter() - start
    return {
        "plan": plan.to_dict(),
        "spectrum": {
            "num_eigenvalues": int(eigs.size),
            "num_decaying": int(decaying.size),
            "max_real": float(np.max(eigs.real)),
            "max_modulus": float(np.max(np.abs(eigs))),
        },
        "reference_error_estimate": ref.error_estimate,
        "seconds": elapsed,
        "report": _report(candidates, best, config, out, elapsed),
    }


def _plot(candidates, best, config: Config, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for c in candidates:
        if c["evaluations"] is None:
            continue
        marker = "*" if c is best else "o"
        ax.loglog(c["evaluations"], c["measured_error"], marker, ms=12 if c is best else 7)
        ax.annotate(
            f"{c['method']} (k = {c['steps_per_layer']})",
            (c["evaluations"], c["measured_error"]),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
    ax.axhline(config.tolerance, color="k", ls="--", lw=1, label=f"tolerance {config.tolerance:g}")
    ax.set(
        xlabel="vector-field evaluations per solve",
        ylabel="measured max-abs error at T",
        title=f"Discretization plan ({config.equation}): cheapest meeting the tolerance = {best['method']}",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    wb.report.save_figure(fig, out / "plan.png")
    plt.close(fig)


def _report(candidates, best, config: Config, out: pathlib.Path, elapsed: float) -> str:
    lines = [
        f"Tolerance {config.tolerance:g} (max-abs at T), {config.equation}, {config.num_layers} "
        f"layers, d = {config.d}, n = {config.n}.",
        "",
        f"**Plan: `{best['method']}` with {best['steps_per_layer']} steps per layer** "
        f"(error {best['measured_error']:.2e}, {best['evaluations']} evaluations; step "
        f"{best['step']:.3g}, predicted largest stable step {best['largest_stable_step']:.3g}: "
        f"{'stable' if best['stable'] else 'BEYOND the linear stability limit'}). "
        f"Written to `{out / 'plan.json'}`.",
        "",
        "| method | pilot order | steps/layer | error | meets | evaluations | time (ms) | τ* | stable |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in candidates:
        p = "—" if c["pilot_order"] is None else f"{c['pilot_order']:.2f}"
        if c["evaluations"] is None:
            lines.append(
                f"| {c['method']} | {p} | {c['predicted_steps_per_layer']} predicted (over "
                "the cap; not run) | — | no | — | — | "
                f"{c['largest_stable_step']:.3g} | — |"
            )
            continue
        lines.append(
            f"| {c['method']} | {p} | {c['steps_per_layer']} | {c['measured_error']:.2e} | "
            f"{'yes' if c['meets_tolerance'] else 'no'} | {c['evaluations']} | "
            f"{1e3 * c['seconds']:.2f} | {c['largest_stable_step']:.3g} | "
            f"{'yes' if c['stable'] else 'no'} |"
        )
    lines.append("")
    lines.append(f"Total {elapsed:.1f} s.")
    return "\n".join(lines)
