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
(random weights, GELU; pre-norm, or post-norm as the projected ODE with diffrax solvers).
"""

from __future__ import annotations

import dataclasses
import time

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
from studies._toolkit.trained import check_weights, is_run_folder, sizes, trained
from workbench.analysis._plan import declared_order

NAME = "plan"
SUMMARY = "Cheapest method and steps per layer meeting a tolerance; writes plan.json for training."

ACTIVATION = "gelu"
"""The feed-forward activation of the planned model (recorded in `plan.json`'s `model`; training
refuses a plan made for another activation)."""
SPLITTING = tuple(wb.registry.SPLITTING_SCHEMES)
PILOT_START = {1: 8, 2: 4, 3: 4, 4: 2, 5: 2, 8: 1}
"""Steps per layer of the first pilot point, by declared order."""
STABILITY_STAND_INS = {"euler": wb.schemes.Euler}
"""Methods whose `wb.registry.METHODS` object carries no Butcher tableau (diffrax's `Euler`),
mapped to a workbench method with the same stability function (`R(z) = 1 + z`), which
`max_stable_step` reads. Every other method is its own `wb.registry.METHODS` object."""


def stability_method(name: str):
    """The object whose stability function stands for the method `name` (see
    `STABILITY_STAND_INS`)."""
    stand_in = STABILITY_STAND_INS.get(name)
    return stand_in() if stand_in is not None else wb.registry.METHODS[name]


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 64
    """Model width d."""
    n: int = 32
    """Tokens n of the random input state."""
    num_layers: int = 6
    """Encoder layers (the equation's time span T)."""
    num_heads: int = 4
    """Attention heads per layer; must divide d."""
    dim_feedforward: int = 128
    """Hidden width of the feed-forward block."""
    equation: str = "pre-norm"
    """`pre-norm` or `post-norm` (the projected ODE)."""
    tolerance: float = 1e-6
    """The max-abs error at T the plan must meet."""
    methods: tuple[str, ...] = (
        *("euler", "heun", "bosh3", "rk4", "tsit5", "dopri5", "dopri8"),
        *("lie", "strang", "yoshida4"),
    )
    """Candidates (names of `wb.registry.METHODS`)."""
    max_refinements: int = 6
    """Times the step count is raised by 25 % when the measured error misses the tolerance."""
    max_steps_per_layer: int = 4096
    """Candidates predicted to need more steps per layer are reported but not run."""
    reference_steps_per_layer: int = 256
    """Steps per layer of the fixed-step Dopri8 reference (Richardson-checked at half as many)."""
    krylov_dim: int = 40
    """Krylov subspace dimension of the Arnoldi iteration for the Jacobian spectra."""
    num_eigenvalues: int = 12
    """Largest-modulus Jacobian eigenvalues computed per layer; at most `krylov_dim`."""
    seed: int = 0
    """Seeds the random input state and weights."""
    weights: str = "random"
    """`random` (a random encoder of the sizes above and a random input) or a training run's
    folder (`--weights runs/train-digits`: the plan of the trained equation, from its first
    saved example input embedded; `d`, `n`, `num_layers`, `num_heads` and `dim_feedforward`
    are then the trained model's, and `equation` must be its placement)."""

    def __post_init__(self):
        check_positive(self, "d", "n", "num_layers", "num_heads", "dim_feedforward")
        check_divides(self, "num_heads", into="d")
        check_choices(self, "equation", ("pre-norm", "post-norm"))
        check_range(self, "tolerance", 0.0, 1.0, low_open=True, high_open=True)
        check_nonempty(self, "methods")
        check_choices(self, "methods", wb.registry.METHODS)
        distinct = len(set(self.methods)) == len(self.methods)
        check(self, "methods", distinct, "the values must be distinct")
        splitting = self.equation == "post-norm" and set(self.methods) & set(SPLITTING)
        why = "post-norm splittings are first order; the post-norm plan uses diffrax solvers"
        check(self, "methods", not splitting, why)
        check_range(self, "max_refinements", 0)
        check_positive(self, "max_steps_per_layer", "krylov_dim", "num_eigenvalues")
        ok = self.reference_steps_per_layer >= 2
        check(self, "reference_steps_per_layer", ok, "it must be >= 2 (Richardson halves it)")
        ok = self.num_eigenvalues <= self.krylov_dim
        check(self, "num_eigenvalues", ok, f"it must be <= krylov_dim={self.krylov_dim}")
        check_seed(self)
        check_weights(self, "weights", ("random",))
        if is_run_folder(self.weights):
            kind = sizes(self.weights)["equation"]
            check(
                self,
                "equation",
                self.equation == kind,
                f"{kind!r}, the placement of the trained equation in {self.weights}",
            )

    def model_sizes(self) -> dict:
        """`{"n", "d", "layers", "heads", "hidden"}`: the config's, or the trained model's."""
        if is_run_folder(self.weights):
            return sizes(self.weights)
        return {
            "n": self.n,
            "d": self.d,
            "layers": self.num_layers,
            "heads": self.num_heads,
            "hidden": self.dim_feedforward,
        }

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the model's solves
        (`_memory.encoder_solve_bytes`: parameters and the 13 stages of Dopri8, one state at a
        time; a candidate's steps are not stored), the states saved along the trajectory for
        the spectra (8 steps per layer) and the Arnoldi basis (`krylov_dim + 1` vectors of `n ·
        d`) with its Hessenberg matrix and one Jacobian-vector product's activations."""
        from studies._toolkit import memory as M

        z = self.model_sizes()
        n, d, hidden, heads, layers = z["n"], z["d"], z["hidden"], z["heads"], z["layers"]
        size = n * d
        solve = M.encoder_solve_bytes(n=n, d=d, hidden=hidden, heads=heads, layers=layers)
        saved = M.array_bytes(8 * layers + 1, size)
        krylov = M.array_bytes(self.krylov_dim + 1, size + self.krylov_dim)
        jvp = M.array_bytes(2, M.attention_layer_floats(n, d, hidden, heads))
        return solve + saved + krylov + jvp


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


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One method: its pilot fit, the checked step count and the stability prediction."""

    method: str
    declared_order: int
    pilot_order: float | None
    """The pilot ladder's fitted order (`None`: no consistent slope; the declared one is used)."""
    predicted_steps_per_layer: int
    steps_per_layer: int | None
    """The checked step count; `None` when the prediction exceeds `max_steps_per_layer`."""
    measured_error: float | None
    meets_tolerance: bool
    evaluations: int | None
    seconds: float | None
    largest_stable_step: float
    step: float | None
    stable: bool | None
    over_cap: bool
    """Predicted to need more than `max_steps_per_layer` (not run)."""


@dataclasses.dataclass(frozen=True)
class Spectrum:
    num_eigenvalues: int
    num_decaying: int
    max_real: float
    max_modulus: float


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    candidates: list[Candidate]
    plan: dict | None
    """`DiscretizationPlan.to_dict()` of the cheapest candidate meeting the tolerance (what
    `artifacts` writes as `plan.json`); `None` if no candidate met it."""
    spectrum: Spectrum
    reference_error_estimate: float
    seconds: float


# --------------------------------------------------------------------------------------------
# Compute
# --------------------------------------------------------------------------------------------


def _spectra(equation, u0, config: Config) -> np.ndarray:
    """Largest-modulus Jacobian eigenvalues of the full field at the start of every layer."""
    per, layers = 8, equation.num_pieces
    if config.equation == "pre-norm":
        states = wb.integrate(
            equation, u0, wb.schemes.Strang(), num_steps=per * layers, save_steps=True
        ).us
        starts = [u0] + [states[per * (layer + 1) - 1] for layer in range(layers - 1)]
    else:
        u = wb.Projected().initial(equation, u0)
        starts = [u]
        for layer in range(layers - 1):
            sub = equation.localize(layer)
            u = wb.integrate(sub, u, wb.solvers.ClassicalRK4(), num_steps=per).u1
            starts.append(u)
    eigs = []
    for layer, u in enumerate(starts):
        t = (layer + 0.5) * equation.piece_length
        f = wba.term_fields(equation, t)["full"]
        if config.equation == "post-norm":
            ln = equation.operators[-1].projection.evaluate(t)
            f = jax.tree_util.Partial(lambda g, p, v: jax.jvp(p.retract, (v,), (g(v),))[1], f, ln)
        eigs.append(
            wba.arnoldi_eigenvalues(
                f, u, num_eigenvalues=config.num_eigenvalues, krylov_dim=config.krylov_dim
            )
        )
    return np.asarray(np.concatenate(eigs))


def _pilot_fit(pilot, order: int):
    """The pilot's fit, or without a consistent slope (pre-asymptotic pilot) the declared order
    through the finest pilot point, `e = C h^p`."""
    if pilot.fit is not None:
        return pilot.fit
    h, e = pilot.step_sizes[-1], max(float(pilot.errors[-1]), 1e-300)
    n, nan = len(pilot.step_sizes), float("nan")
    return wba.OrderFit(
        order=float(order),
        constant=e / h**order,
        stderr=nan,
        ci_low=nan,
        ci_high=nan,
        confidence=0.95,
        steps=pilot.step_sizes,
        errors=pilot.errors,
        used=np.ones(n, bool),
        local_orders=np.zeros(n - 1),
        floor=None,
        pre_asymptotic=0,
    )


def _candidate(config: Config, equation, u0, ref, name: str, decaying) -> Candidate:
    method = wb.registry.METHODS[name]
    order = declared_order(method)
    k0 = PILOT_START[order]
    pilot = wba.error_ladder(
        equation, u0, method, [k0, 2 * k0, 4 * k0], ref, declared_order=order, repeats=1
    )
    k = predicted = wba.steps_for_tolerance(
        _pilot_fit(pilot, order), config.tolerance, equation.piece_length
    )
    # Check the prediction by solving; raise by 25 % until the measured error meets it.
    check = None
    for _ in range(config.max_refinements + 1):
        if k > config.max_steps_per_layer:
            break
        check = wba.error_ladder(equation, u0, method, [k], ref, min_points=1, repeats=3)
        if check.errors[0] <= config.tolerance:
            break
        k = max(k + 1, int(np.ceil(1.25 * k)))
    tau_star = float(wba.max_stable_step(stability_method(name), decaying))
    pilot_order = None if pilot.fit is None else pilot.fit.order
    common = dict(
        method=name,
        declared_order=order,
        pilot_order=pilot_order,
        predicted_steps_per_layer=predicted,
        largest_stable_step=tau_star,
    )
    if check is None or k > config.max_steps_per_layer:
        return Candidate(
            **common,
            steps_per_layer=None,
            measured_error=None,
            meets_tolerance=False,
            evaluations=None,
            seconds=None,
            step=None,
            stable=None,
            over_cap=True,
        )
    step, error = equation.piece_length / k, float(check.errors[0])
    return Candidate(
        **common,
        steps_per_layer=k,
        measured_error=error,
        evaluations=int(check.evaluations[0]),
        meets_tolerance=error <= config.tolerance,
        seconds=float(check.seconds[0]),
        step=step,
        stable=step <= tau_star,
        over_cap=False,
    )


def _best(candidates: list[Candidate]) -> Candidate | None:
    feasible = [c for c in candidates if c.meets_tolerance]
    return min(feasible, key=lambda c: (c.evaluations, c.seconds)) if feasible else None


def compute(config: Config) -> Results:
    start = time.perf_counter()
    with jax.enable_x64(True):
        if is_run_folder(config.weights):
            transformer, u0, _ = trained(config.weights)
            equation = transformer.equation
        else:
            u0 = jnp.asarray(
                np.random.default_rng(config.seed).standard_normal((config.n, config.d))
            )
            sd = wb.architectures.random_encoder_state_dict(
                np.random.default_rng(config.seed + 1),
                d=config.d,
                num_layers=config.num_layers,
                dim_feedforward=config.dim_feedforward,
            )
            norm_first = config.equation == "pre-norm"
            equation = wb.architectures.encoder_from_torch(
                sd, num_heads=config.num_heads, norm_first=norm_first, activation=ACTIVATION
            ).equation
        ref = wba.reference_solution(equation, u0, steps_per_layer=config.reference_steps_per_layer)
        eigs = _spectra(equation, u0, config)
        decaying = eigs[eigs.real < -1e-9 * max(1.0, float(np.max(np.abs(eigs))))]
        candidates = [
            _candidate(config, equation, u0, ref, name, decaying)
            for name in progress(config.methods, desc="plan candidates")
        ]
    best = _best(candidates)
    plan = None
    z = config.model_sizes()
    if best is not None:
        plan = wba.DiscretizationPlan(
            method=best.method,
            steps_per_layer=int(best.steps_per_layer),
            tolerance=config.tolerance,
            measured_error=best.measured_error,
            evaluations=best.evaluations,
            largest_stable_step=best.largest_stable_step,
            step=best.step,
            stable=bool(best.stable),
            candidates=tuple(dataclasses.asdict(c) for c in candidates),
            model={
                "d": z["d"],
                "n": z["n"],
                "num_layers": z["layers"],
                "num_heads": z["heads"],
                "dim_feedforward": z["hidden"],
                "equation": config.equation,
                "activation": ACTIVATION if config.weights == "random" else "trained",
                "weights": config.weights,
                "seed": config.seed,
                "error": "max-abs at T against Dopri8 "
                f"({config.reference_steps_per_layer} steps per layer)",
            },
        ).to_dict()
    spectrum = Spectrum(
        int(eigs.size),
        int(decaying.size),
        float(np.max(eigs.real)),
        float(np.max(np.abs(eigs))),
    )
    elapsed = time.perf_counter() - start
    return Results(config, candidates, plan, spectrum, ref.error_estimate, elapsed)


def artifacts(results: Results) -> dict:
    """`{"plan.json": the plan}` (what `DiscretizationPlan.save` writes; training reads it with
    `DiscretizationPlan.load`); nothing when no candidate met the tolerance."""
    return {} if results.plan is None else {"plan.json": results.plan}


# --------------------------------------------------------------------------------------------
# Verdict, report, figures
# --------------------------------------------------------------------------------------------


def verdict(results: Results) -> str:
    c, best = results.config, _best(results.candidates)
    tried = len(results.candidates)
    if best is None:
        over = sum(x.over_cap for x in results.candidates)
        return (
            f"No. None of the {tried} candidates met tolerance {c.tolerance:g} within "
            f"{c.max_refinements} refinements and {c.max_steps_per_layer} steps per layer "
            f"({over} predicted over the cap)."
        )
    feasible = sum(x.meets_tolerance for x in results.candidates)
    plan = (
        f"{best.method} with {best.steps_per_layer} steps per layer meets tolerance "
        f"{c.tolerance:g} (measured {best.measured_error:.2e}) with {best.evaluations} "
        f"evaluations, the fewest of the {feasible} of {tried} candidates that meet it"
    )
    if best.stable:
        return (
            f"Yes. {plan}; its step {best.step:.3g} is inside the predicted largest stable step "
            f"{best.largest_stable_step:.3g}."
        )
    return (
        f"Partly. {plan}, but its step {best.step:.3g} exceeds the predicted largest stable step "
        f"{best.largest_stable_step:.3g} (linear stability limit)."
    )


def report(results: Results) -> str:
    c, best = results.config, _best(results.candidates)
    s, z = results.spectrum, c.model_sizes()
    weights = "random weights" if c.weights == "random" else f"trained weights of `{c.weights}`"
    lines = [
        f"Tolerance {c.tolerance:g} (max-abs at T), {c.equation}, {weights}, {z['layers']} "
        f"layers, d = {z['d']}, n = {z['n']}; reference Richardson error {results.reference_error_estimate:.1e}"
        f"; Jacobian spectra: {s.num_eigenvalues} eigenvalues, {s.num_decaying} decaying, "
        f"max Re λ {s.max_real:.3g}, max |λ| {s.max_modulus:.3g}.",
        "",
    ]
    if best is not None:
        lines += [
            f"**Plan: `{best.method}` with {best.steps_per_layer} steps per layer** (error "
            f"{best.measured_error:.2e}, {best.evaluations} evaluations; step {best.step:.3g}, "
            f"predicted largest stable step {best.largest_stable_step:.3g}); written to "
            "`plan.json`.",
            "",
        ]
    rows = []
    for x in results.candidates:
        steps = f"{x.predicted_steps_per_layer} predicted (over the cap; not run)"
        rows.append(
            (
                x.method,
                "no fit" if x.pilot_order is None else f"{x.pilot_order:.2f}",
                steps if x.over_cap else x.steps_per_layer,
                x.measured_error,
                "yes" if x.meets_tolerance else "no",
                x.evaluations,
                None if x.seconds is None else 1e3 * x.seconds,
                x.largest_stable_step,
                None if x.stable is None else "yes" if x.stable else "no",
            )
        )
    headers = "method|pilot order|steps/layer|error|meets|evaluations|time (ms)|τ*|stable"
    lines += [markdown_table(headers.split("|"), rows), "", f"Total {results.seconds:.1f} s."]
    return "\n".join(lines)


def figures(results: Results) -> dict:
    c, best = results.config, _best(results.candidates)
    fig, ax = new_figure(figsize=(8, 5))
    for x in results.candidates:
        if x.evaluations is None:
            continue
        chosen = best is not None and x.method == best.method
        ax.loglog(x.evaluations, x.measured_error, "*" if chosen else "o", ms=12 if chosen else 7)
        ax.annotate(
            f"{x.method} (k = {x.steps_per_layer})",
            (x.evaluations, x.measured_error),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
    ax.axhline(c.tolerance, color="k", ls="--", lw=1, label=f"tolerance {c.tolerance:g}")
    name = "none" if best is None else best.method
    ax.set(
        xlabel="vector-field evaluations per solve",
        ylabel="measured max-abs error at T",
        title=f"Discretization plan ({c.equation}): cheapest meeting the tolerance = {name}",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return {"plan": fig}
