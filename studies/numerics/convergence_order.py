"""Do the splitting schemes and diffrax solvers reach their declared orders on the Transformer
equation with a smooth (GELU) feed-forward, and which is cheapest for a given accuracy?

Model: an encoder (full size: 6 layers, d = 64, n = 32, 4 heads, GELU, float64) with `random`
weights (`wb.architectures.random_encoder_state_dict`) or `recovered` ones (PyTorch's own
initialization of `torch.nn.TransformerEncoderLayer`, one seed per layer; needs the `reference`
extra, else skipped). Equations: `pre-norm` (`u_t = A(LN u) + F(LN u)`) solved by every method, and
`post-norm` as the projected ODE on the last LayerNorm set, solved by diffrax solvers wrapped in
`ProjectedSolver`. Post-norm splittings ("sub-flow, then project") are first order whatever the
scheme (`docs/equations.md`, the constrained limit), so they are not run here.

Each (weights, equation, method) solves a ladder of 6 step counts per layer chosen by
`error_ladder(..., 'auto')` to span the method's `ERROR_RANGE`, with one compilation, against a
fixed-step Dopri8 reference (Richardson-checked). The order is `wb.analysis.fit_order` on the
asymptotic window (95 % interval; floor and pre-asymptotic points left out; `order_reduction`
judged against the declared order). Work–precision: error against evaluations and wall time.

GELU vs ReLU: the same random pre-norm model with either activation, the same schemes on the same
step ladder. ReLU makes the field only Lipschitz; a step across a kink commits a local error
O(τ²), so no scheme can show more than order 1–2. Its reference is adaptive Dopri8.

The penalty (Moreau–Yosida) form of the post-norm equation is the `penalty-form` study.
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
from studies._toolkit.report import ci_cell, markdown_table, new_figure, progress, wide_ci_note
from studies._toolkit.trained import (
    check_weights,
    equation_kind,
    is_run_folder,
    sizes,
    trained,
    weights_label,
)
from workbench.analysis._plan import declared_order

NAME = "convergence-order"
SUMMARY = "Observed orders of splitting schemes and diffrax solvers (GELU vs ReLU); work-precision."

SPLITTING = tuple(wb.registry.SPLITTING_SCHEMES)
DIFFRAX = tuple(wb.registry.ODE_SOLVERS)
# The error range each ladder spans, by declared order: inside the asymptotic range (Tsit5/Dopri5
# have small 5th-order constants, so 6th-order terms dominate down to ~1e-9) and ≥ 2 decades
# above the float64 round-off floor.
ERROR_RANGE = {
    1: (3e-1, 3e-1 / 2**5),
    2: (3e-2, 3e-2 / 4**5),
    3: (1e-3, 1e-3 / 8**5),
    4: (1e-4, 1e-9),
    5: (1e-9, 3e-13),
    8: (1e-7, 1e-12),
}
JUDGED_MAX_ORDER = 5
"""Higher declared orders (Dopri8) are reported, not judged: their error reaches the float64
round-off floor before an order-8 slope can be resolved."""
WEIGHTS = ("random", "recovered")
EQUATIONS = ("pre-norm", "post-norm")
COMPARED_ACTIVATIONS = ("gelu", "relu")
"""The GELU/ReLU comparison (names in `wb.registry.ACTIVATIONS`): smooth vs a kink."""


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 64
    """Model width d."""
    n: int = 32
    """Tokens n of the random input state."""
    num_layers: int = 6
    """Encoder layers (the equation's time span)."""
    num_heads: int = 4
    """Attention heads per layer; must divide d."""
    dim_feedforward: int = 128
    """Hidden width of the feed-forward block."""
    weights: tuple[str, ...] = WEIGHTS
    """Weight sets: `random`, `recovered` (PyTorch's initialization; needs torch), and/or a
    training run's folder (`--weights runs/train-digits`: the trained equation from its first
    saved example input; `d`, `n`, `num_layers`, `num_heads` and `dim_feedforward` are then
    the trained model's)."""
    equations: tuple[str, ...] = EQUATIONS
    """Equations to solve: `pre-norm`, and/or `post-norm` (the projected ODE)."""
    methods: tuple[str, ...] = (
        *("euler", "heun", "midpoint", "ralston", "bosh3", "rk4", "tsit5", "dopri5", "dopri8"),
        *("lie", "strang", "yoshida4"),
    )
    """Pre-norm methods (names of `wb.registry.METHODS`)."""
    post_norm_methods: tuple[str, ...] = ("euler", "heun", "rk4", "tsit5")
    """Methods for the projected post-norm equation (diffrax solvers only)."""
    activation_methods: tuple[str, ...] = ("rk4", "yoshida4", "strang", "tsit5")
    """Methods of the GELU/ReLU comparison (empty: no comparison)."""
    activation_steps_per_layer: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256)
    """The step ladder of the comparison, the same for both activations."""
    relu_reference_tolerance: float = 1e-12
    """rtol = atol of the adaptive Dopri8 reference of the ReLU model."""
    reference_steps_per_layer: int = 256
    """Steps per layer of the fixed-step Dopri8 reference (Richardson-checked at half as many)."""
    order_tolerance: float = 0.3
    """A fitted order within this of the declared one reaches it."""
    target_error: float = 1e-8
    """The accuracy at which the methods' costs (vector-field evaluations) are compared."""
    repeats: int = 2
    """Timed runs per step count (median reported)."""
    tol: float = 0.3
    """Local orders within `tol` of each other form the asymptotic window (`fit_order`)."""
    seed: int = 0
    """Seeds the random input state and weights."""

    def __post_init__(self):
        check_positive(self, "d", "n", "num_layers", "num_heads", "dim_feedforward", "repeats")
        check_divides(self, "num_heads", into="d")
        check_nonempty(self, "weights", "equations")
        check_weights(self, "weights", WEIGHTS)
        check_choices(self, "equations", EQUATIONS)
        for field in ("methods", "post_norm_methods", "activation_methods"):
            check_choices(self, field, wb.registry.METHODS)
        post = set(self.post_norm_methods) & set(SPLITTING)
        why = f"post-norm splittings are first order; choose diffrax solvers: {', '.join(DIFFRAX)}"
        check(self, "post_norm_methods", not post, why)
        if "pre-norm" in self.equations:
            check_nonempty(self, "methods")
        if "post-norm" in self.equations:
            check_nonempty(self, "post_norm_methods")
        for field in ("weights", "equations", "methods", "post_norm_methods", "activation_methods"):
            values = getattr(self, field)
            check(self, field, len(set(values)) == len(values), "the values must be distinct")
        ks = self.activation_steps_per_layer
        check_positive(self, "activation_steps_per_layer")
        ok = len(ks) >= 3 and all(a < b for a, b in zip(ks, ks[1:]))
        check(self, "activation_steps_per_layer", ok, "give at least 3 increasing step counts")
        ok = self.reference_steps_per_layer >= 2
        check(self, "reference_steps_per_layer", ok, "it must be >= 2 (Richardson halves it)")
        check_positive(self, "tol")
        check_range(self, "relu_reference_tolerance", 0.0, 1e-6, low_open=True)
        check_range(self, "order_tolerance", 0.0, 1.0, low_open=True)
        check_range(self, "target_error", 0.0, 1.0, low_open=True, high_open=True)
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the model's solves, one
        state at a time (`_memory.encoder_solve_bytes`: the parameters with the state dict's, the
        model's and, with `recovered` weights, PyTorch's copies, and the 13 stages of Dopri8), plus
        every ladder's final states (one `n × d` state per step count, per weights, equation and
        method, and the activation comparison's)."""
        from studies._toolkit import memory as M

        copies = 4 if "recovered" in self.weights else 3
        size = {
            "n": self.n,
            "d": self.d,
            "hidden": self.dim_feedforward,
            "heads": self.num_heads,
            "layers": self.num_layers,
        }
        for folder in filter(is_run_folder, self.weights):  # the largest model solved
            size = {k: max(v, sizes(folder)[k]) for k, v in size.items()}
        solve = M.encoder_solve_bytes(
            n=size["n"],
            d=size["d"],
            hidden=size["hidden"],
            heads=size["heads"],
            layers=size["layers"],
            param_copies=copies,
        )
        methods = len(self.methods) + len(self.post_norm_methods)
        ladders = len(self.weights) * methods * 8 + 2 * len(self.activation_methods) * len(
            self.activation_steps_per_layer
        )
        return solve + M.array_bytes(ladders, size["n"], size["d"])


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
        activation_methods=("rk4", "tsit5"),
        activation_steps_per_layer=(2, 4, 8, 16, 32, 64),
        reference_steps_per_layer=64,
        repeats=1,
    )


@dataclasses.dataclass(frozen=True)
class Row:
    """One (weights, equation, method) of the order table."""

    weights: str
    equation: str
    method: str
    declared: int
    order: float | None
    """The asymptotic order (`fit_order`); `None` without a window of 3 consistent points."""
    ci: list[float] | None
    points_in_fit: int
    within_tolerance: bool | None
    """`|order − declared| ≤ order_tolerance`."""
    order_reduction: bool | None
    """`fit_order`'s flag: the order is below the declared one by more than `tol`."""
    evaluations_at_target: float | None
    """Evaluations per solve that the fit predicts for `target_error` (`Ladder.evaluations_for`)."""
    ladder: dict
    """`Ladder.to_dict()`: steps, errors, evaluations, seconds, compilations, fit, Richardson."""
    constraint_violation: float | None
    """Post-norm: the largest distance of the iterates to the LayerNorm set."""


@dataclasses.dataclass(frozen=True)
class Timing:
    reference_s: float
    reference_error_estimate: float
    table_s: float
    compile_s: float
    run_s: float
    methods: int
    step_sizes_per_method: int


@dataclasses.dataclass(frozen=True)
class ActivationRow:
    """One (activation, method) of the GELU/ReLU comparison (random weights, pre-norm)."""

    activation: str
    method: str
    declared: int
    step_sizes: np.ndarray
    errors: np.ndarray
    order: float | None
    ci: list[float] | None
    order_reduction: bool | None
    preasymptotic_order: float | None
    slope_all: float
    """The least-squares slope over all points (`fit_order(..., asymptotic=False)`)."""
    reduced: bool
    """`order_reduction`, or without a fit `slope_all < declared − tol`."""


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    rows: list[Row]
    timing: dict[str, Timing]
    """By `"<weights>/<equation>"`."""
    skipped: list[str]
    """What was not run, with the reason (`recovered` without torch; a trained model's other
    equation)."""
    activation: list[ActivationRow]
    activation_reference_error: dict[str, float]
    """By activation: the reference's error estimate (`Reference.error_estimate`)."""


# --------------------------------------------------------------------------------------------
# Compute
# --------------------------------------------------------------------------------------------


def _state_dict(config: Config, weights: str):
    rng = np.random.default_rng(config.seed + 1)
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


def _equation(config: Config, sd, equation: str, activation: str = "gelu"):
    return wb.architectures.encoder_from_torch(
        sd, num_heads=config.num_heads, norm_first=equation == "pre-norm", activation=activation
    ).equation


def _constraint_violation(equation, us) -> float:
    ln = equation.operators[-1].projection.evaluate(equation.t1 - 0.5 * equation.piece_length)
    w = (np.asarray(us) - np.asarray(ln.bias)) / np.asarray(ln.weight)
    return max(float(np.max(np.abs(w.mean(-1)))), float(np.max(np.abs(w.var(-1) - 1))))


def _ladder(config: Config, equation, u0, name: str, steps, ref):
    method = wb.registry.METHODS[name]
    order = declared_order(method)
    auto = dict(error_range=ERROR_RANGE[order]) if steps == "auto" else {}
    lad = wba.error_ladder(
        equation,
        u0,
        method,
        steps,
        ref,
        declared_order=order,
        repeats=config.repeats,
        tol=config.tol,
        **auto,
    )
    return lad, order, lad.fit


def _fit_fields(fit) -> dict:
    """The fit's order, interval and `order_reduction` flag (all `None` without a fit)."""
    if fit is None:
        return dict(order=None, ci=None, order_reduction=None)
    reduction = bool(getattr(fit, "order_reduction", False))
    return dict(order=fit.order, ci=[fit.ci_low, fit.ci_high], order_reduction=reduction)


def _order_table(config: Config, u0):
    """The order rows and timings of every (weights, equation), and the random pre-norm GELU
    reference (reused by the activation comparison)."""
    rows, timing, skipped, refs = [], {}, [], {}
    initial = u0
    for weights in config.weights:
        if weights == "recovered" and not wb.architectures.have_reference():
            skipped.append("recovered weights (torch is not installed)")
            continue
        if is_run_folder(weights):
            trained_transformer, u0, _ = trained(weights)
            kind = equation_kind(trained_transformer)
        else:
            sd, u0 = _state_dict(config, weights), initial
        folder, weights = weights, weights_label(weights)
        for eq_name in config.equations:
            if is_run_folder(folder):
                if eq_name != kind:
                    skipped.append(f"{weights}/{eq_name} (the trained equation is {kind})")
                    continue
                equation = trained_transformer.equation
            else:
                equation = _equation(config, sd, eq_name)
            names = config.methods if eq_name == "pre-norm" else config.post_norm_methods
            start = time.perf_counter()
            ref = refs[(weights, eq_name)] = wba.reference_solution(
                equation, u0, steps_per_layer=config.reference_steps_per_layer
            )
            table_start, compile_s = time.perf_counter(), 0.0
            for name in progress(names, desc=f"{weights}/{eq_name}"):
                lad, order, fit = _ladder(config, equation, u0, name, "auto", ref)
                compile_s += lad.compile_seconds
                within = None if fit is None else abs(fit.order - order) <= config.order_tolerance
                post = eq_name == "post-norm"
                rows.append(
                    Row(
                        weights=weights,
                        equation=eq_name,
                        method=name,
                        declared=order,
                        points_in_fit=0 if fit is None else fit.num_used,
                        within_tolerance=within,
                        evaluations_at_target=lad.evaluations_for(config.target_error),
                        ladder=lad.to_dict(),
                        constraint_violation=(
                            _constraint_violation(equation, lad.solutions) if post else None
                        ),
                        **_fit_fields(fit),
                    )
                )
            table_s = time.perf_counter() - table_start
            timing[f"{weights}/{eq_name}"] = Timing(
                table_start - start,
                ref.error_estimate,
                table_s,
                compile_s,
                table_s - compile_s,
                len(names),
                6,
            )
    return rows, timing, skipped, refs.get(("random", "pre-norm"))


def _activation_rows(config: Config, u0, gelu_ref):
    """The GELU/ReLU comparison on the random pre-norm model (GELU reuses the table's
    reference and compiled ladders when the table ran random pre-norm)."""
    rows, ref_error = [], {}
    if not config.activation_methods:
        return rows, ref_error
    sd = _state_dict(config, "random")
    for activation in COMPARED_ACTIVATIONS:
        equation = _equation(config, sd, "pre-norm", activation)
        if activation == "relu":
            ref = wba.reference_solution(equation, u0, rtol=config.relu_reference_tolerance)
        else:
            steps = config.reference_steps_per_layer
            ref = gelu_ref or wba.reference_solution(equation, u0, steps_per_layer=steps)
        ref_error[activation] = ref.error_estimate
        for name in progress(config.activation_methods, desc=activation):
            steps = list(config.activation_steps_per_layer)
            lad, order, fit = _ladder(config, equation, u0, name, steps, ref)
            slope = wba.fit_order(lad.step_sizes, lad.errors, asymptotic=False).order
            fields = _fit_fields(fit)
            rows.append(
                ActivationRow(
                    activation=activation,
                    method=name,
                    declared=order,
                    step_sizes=lad.step_sizes,
                    errors=lad.errors,
                    preasymptotic_order=getattr(fit, "preasymptotic_order", None),
                    slope_all=slope,
                    reduced=fields["order_reduction"] if fit else slope < order - config.tol,
                    **fields,
                )
            )
    return rows, ref_error


def compute(config: Config) -> Results:
    with jax.enable_x64(True):
        u0 = jnp.asarray(np.random.default_rng(config.seed).standard_normal((config.n, config.d)))
        rows, timing, skipped, gelu_ref = _order_table(config, u0)
        activation, ref_error = _activation_rows(config, u0, gelu_ref)
    return Results(config, rows, timing, skipped, activation, ref_error)


# --------------------------------------------------------------------------------------------
# Verdict, report, figures
# --------------------------------------------------------------------------------------------


def _misses(results: Results, judged: list[Row]) -> list[Row]:
    tol = results.config.order_tolerance
    return [r for r in judged if r.order is None or abs(r.order - r.declared) > tol]


def _cheapest(results: Results) -> dict[str, Row]:
    """Per `weights/equation`: the method within tolerance with the fewest predicted
    evaluations at `target_error`."""
    best: dict[str, Row] = {}
    for r in results.rows:
        group = f"{r.weights}/{r.equation}"
        if r.evaluations_at_target is None or not r.within_tolerance:
            continue
        if group not in best or r.evaluations_at_target < best[group].evaluations_at_target:
            best[group] = r
    return best


def verdict(results: Results) -> str:
    c = results.config
    judged = [r for r in results.rows if r.declared <= JUDGED_MAX_ORDER]
    misses = _misses(results, judged)
    gelu = [a for a in results.activation if a.activation == "gelu"]
    relu = [a for a in results.activation if a.activation == "relu"]
    gelu_reduced = [a.method for a in gelu if a.reduced]
    if not judged:
        return f"No. No method of declared order ≤ {JUDGED_MAX_ORDER} ran; nothing was judged."
    word = "No" if 2 * len(misses) > len(judged) else "Partly" if misses or gelu_reduced else "Yes"
    fitted = [abs(r.order - r.declared) for r in judged if r.order is not None]
    parts = [
        f"{word}. {len(judged) - len(misses)} of {len(judged)} (weights, equation, method) "
        f"ladders of declared order ≤ {JUDGED_MAX_ORDER} reach it within ±{c.order_tolerance:g}"
        + (f" (largest deviation {max(fitted):.2f})." if fitted else ".")
    ]
    if misses:
        missed = [
            f"{r.weights}/{r.equation}/{r.method} "
            f"({'no fit' if r.order is None else f'{r.order:.2f}'} vs {r.declared})"
            for r in misses
        ]
        parts.append(f"Missing: {', '.join(missed)}.")
    if gelu_reduced:
        parts.append(
            f"The smooth GELU model also shows order reduction ({', '.join(gelu_reduced)}): the "
            "reduction is not the activation's alone."
        )
    elif gelu:
        parts.append(f"No GELU comparison ladder shows order reduction ({len(gelu)} methods).")
    high = [a for a in relu if a.declared > 2]  # a kink's O(τ²) local error caps them near 2
    if high:
        reduced = [a for a in high if a.reduced]
        orders = [a.order if a.order is not None else a.slope_all for a in high]
        parts.append(
            f"ReLU: {len(reduced)} of {len(high)} methods of declared order > 2 show order "
            f"reduction (orders {min(orders):.2f}–{max(orders):.2f} against declared "
            f"{min(a.declared for a in high)}–{max(a.declared for a in high)}), expected for a "
            "Lipschitz field, not a failure"
            + "".join(
                f"; {a.method} is not reduced ({o:.2f}), unexpected for a Lipschitz field"
                for a, o in zip(high, orders)
                if not a.reduced
            )
            + "."
        )
    for group, r in _cheapest(results).items():
        parts.append(
            f"Cheapest at error {c.target_error:g} ({group}): {r.method} "
            f"(≈ {r.evaluations_at_target:.0f} evaluations)."
        )
    return " ".join(parts)


def _order_text(order, reduced) -> str:
    if order is None:
        return "no fit"
    return f"{order:.2f}" + (" (order reduction)" if reduced else "")


def report(results: Results) -> str:
    c = results.config
    headers = "weights|equation|method|declared|observed order|95% CI|points|error range|"
    headers += f"Richardson/measured|evaluations at {c.target_error:g}|compilations"
    table = [
        (
            r.weights,
            r.equation,
            r.method,
            r.declared,
            _order_text(r.order, r.order_reduction),
            "—" if r.ci is None else ci_cell(*r.ci),
            f"{r.points_in_fit}/{len(r.ladder['errors'])}",
            f"{min(r.ladder['errors']):.1e} – {max(r.ladder['errors']):.1e}",
            None if r.ladder["richardson"] is None else f"{r.ladder['richardson']:.3f}",
            r.evaluations_at_target,
            r.ladder["compilations"],
        )
        for r in results.rows
    ]
    out = [
        f"Observed orders (float64; error = max-abs at T against Dopri8; {c.num_layers} layers, "
        f"d = {c.d}, n = {c.n}, {c.num_heads} heads, GELU"
        + "".join(
            f"; {weights_label(w)}: the trained model of `{w}`, {z['layers']} layers, d = "
            f"{z['d']}, n = {z['n']} (its first saved input), {z['heads']} heads"
            for w in c.weights
            if is_run_folder(w)
            for z in [sizes(w)]
        )
        + "). *Order reduction*: `fit_order` puts "
        f"the asymptotic order below the declared one by more than tol = {c.tol:g}.",
        "",
        markdown_table(headers.split("|"), table),
        "",
    ]
    if note := wide_ci_note(r.ci for r in results.rows):
        out += [note, ""]
    for r in results.rows:
        if r.declared > JUDGED_MAX_ORDER and r.order is not None:
            out.append(f"{r.method} ({r.weights}, {r.equation}): {r.order:.2f} before the floor.")
    post = [r.constraint_violation for r in results.rows if r.constraint_violation is not None]
    if post:
        out.append(
            f"Projected post-norm iterates lie on the LayerNorm set to {max(post):.1e}. Post-norm "
            "splittings (sub-flow, then project) are first order whatever the scheme "
            "(`docs/equations.md`, the constrained limit; the `splitting-error` study); the "
            "projected formulation used here (`wb.Projected()`, `wb.solvers.ProjectedSolver`: a "
            "p-th order step of the whole tangent field, then project) keeps order p."
        )
    out.append("")
    for key, t in results.timing.items():
        out.append(
            f"- {key}: {t.methods} methods × {t.step_sizes_per_method} step sizes in "
            f"{t.table_s:.1f} s ({t.run_s:.1f} s running, {t.compile_s:.1f} s compiling); "
            f"reference {t.reference_s:.1f} s, Richardson error estimate "
            f"{t.reference_error_estimate:.1e}."
        )
    out += [f"- skipped: {s}." for s in results.skipped]
    out += ["", "The penalty (Moreau–Yosida) form of post-norm is now the `penalty-form` study."]
    return "\n".join(out + _activation_report(results))


def _activation_report(results: Results) -> list[str]:
    if not results.activation:
        return []
    by = {(a.activation, a.method): a for a in results.activation}
    table = []
    for m in dict.fromkeys(a.method for a in results.activation):
        g, r = by[("gelu", m)], by[("relu", m)]
        table.append(
            (
                m,
                g.declared,
                _order_text(g.order, g.reduced),
                _order_text(r.order, r.reduced),
                r.preasymptotic_order,
                r.slope_all,
                float(r.errors[-1]),
            )
        )
    err = results.activation_reference_error
    ks = ", ".join(map(str, results.config.activation_steps_per_layer))
    headers = "method|declared|GELU order|ReLU order|ReLU large-step order|ReLU all-points slope"
    return [
        "",
        f"**GELU vs ReLU** (random weights, pre-norm; steps per layer {ks}; reference error: "
        f"GELU fixed-step Dopri8 {err['gelu']:.1e}, ReLU adaptive Dopri8 {err['relu']:.1e}). "
        "The ReLU field is Lipschitz, not C¹: a step across a kink of the activation commits a "
        "local error O(τ²), which bounds the observed order of any scheme near 1–2.",
        "",
        markdown_table(headers.split("|") + ["ReLU finest error"], table),
    ]


def _label(method: str, order, reduced) -> str:
    if order is None:
        return f"{method} (no fit)"
    return f"{method} (p = {order:.2f}{', order reduction' if reduced else ''})"


def figures(results: Results) -> dict:
    import matplotlib

    c, figs = results.config, {}
    colors = matplotlib.colormaps["tab20"](np.linspace(0, 1, 20))
    for weights, equation in dict.fromkeys((r.weights, r.equation) for r in results.rows):
        fig, axes = new_figure(1, 3, figsize=(17, 5.2))
        sel = [r for r in results.rows if (r.weights, r.equation) == (weights, equation)]
        for i, r in enumerate(sel):
            lad, style = r.ladder, "--o" if r.method in SPLITTING else "-o"
            kw = dict(ms=3, color=colors[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20])
            label = _label(r.method, r.order, r.order_reduction)
            axes[0].loglog(lad["step_sizes"], lad["errors"], style, label=label, **kw)
            if lad["evaluations"][0] > 0:
                axes[1].loglog(lad["evaluations"], lad["errors"], style, label=r.method, **kw)
            axes[2].loglog(lad["seconds"], lad["errors"], style, **kw)
        for ax, x, title in zip(
            axes,
            ("step size h (layer = 1)", "vector-field evaluations", "wall time per solve (s)"),
            (
                "error vs step (fitted orders)",
                "work-precision: evaluations",
                "work-precision: time",
            ),
        ):
            ax.set(xlabel=x, ylabel="max-abs error at T", title=title)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7, ncol=2)
        axes[1].legend(fontsize=7, ncol=2)
        fig.suptitle(
            f"{equation}, {weights} weights: {c.num_layers} layers, d = {c.d}, n = {c.n}, "
            "float64 (dashed: splitting schemes)"
        )
        figs[f"convergence_{weights}_{equation}"] = fig
    if results.activation:
        fig, axes = new_figure(1, 2, figsize=(12, 5), sharey=True)
        ks = c.activation_steps_per_layer
        for ax, activation in zip(axes, COMPARED_ACTIVATIONS):
            sel = [a for a in results.activation if a.activation == activation]
            for a in sel:
                style = "--o" if a.method in SPLITTING else "-o"
                label = _label(a.method, a.order, a.reduced)
                ax.loglog(a.step_sizes, a.errors, style, ms=3, label=label)
            h = np.asarray(sel[0].step_sizes)
            ax.loglog(h, sel[0].errors[0] * (h / h[0]) ** 2, "k:", lw=1, label="slope 2")
            ax.set_xticks([1.0 / k for k in ks], [f"1/{k}" for k in ks])
            ax.minorticks_off()
            title = {"gelu": "GELU", "relu": "ReLU"}[activation] + " feed-forward"
            ax.set(xlabel="step size h (layer = 1)", title=title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylabel("max-abs error at T")
        fig.suptitle(f"Same pre-norm model, GELU vs ReLU: {c.num_layers} layers, d = {c.d}")
        figs["activation"] = fig
    return figs
