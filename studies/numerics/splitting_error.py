"""Does the splitting error of the Transformer equation follow the theory: is the Lie local error
(τ²/2)[A, F](u) to leading order, in size and sign, and does every pre-norm scheme (Lie, Strang,
a fourth-order composition, unsplit RK4) converge at its classical order? The post-norm placement
(the projection after every sub-flow) is measured alongside.

Model: a random pre-norm GELU encoder (`encoder_from_torch(..., norm_first=True)`), float64. Its
equation `u_t = A(u) + F(u)` has attention `A = MHA∘LN_1` and feed-forward `F = FFN∘LN_2`. For the
Lie step (A first, then F) with exact sub-flows,

    φ^F_τ ∘ φ^A_τ(u) − φ^{A+F}_τ(u) = (τ²/2) [A, F](u) + O(τ³),   [A, F] = F'A − A'F,

with `[A, F](u)` computed by two JVPs. The sub-flows are made (nearly) exact with
`subflow_substeps` RK4 steps each, so the measured error is the splitting error alone; the
"network" rows instead use one step of each scheme's own inner method (Euler for Lie, midpoint
for Strang, RK4 for the compositions), as `workbench.integrate` runs them. The exact flow is RK4
with many steps (`reference_substeps` per local step, `reference_steps_per_layer` per layer).
Scheme names: `lie`, `strang`, `yoshida4`, `suzuki4` are the splittings of
`workbench.registry.SPLITTING_SCHEMES`; `unsplit-rk4` is `workbench.schemes.RK4()` applied to the
whole field (`workbench.registry.UNSPLIT_METHODS`; not the diffrax solver `rk4` of `ODE_SOLVERS`).

Post-norm variant: the same terms, each sub-flow followed by the projection onto one LayerNorm
set S1(0, 1) (no affine; BERT instead alternates two different affine LayerNorms, which have no
common continuous limit). Its continuous limit is the projected ODE `u' = P_{T_u S}(A + F)` on S1
(docs/equations.md), the reference there (RK4 on the tangent field, projected after every step); the
unsplit RK4 row is that projection method. Theory: for u on S, `P(u + hG + O(h²)) = u + h P_T G +
O(h²)` with an h² term that depends on the *normal* part of G, which the projected flow does not
see; "sub-flow, then project" then matches the projected sub-flow only to first order, and
compositions of such steps are expected at order 1 whatever their symmetry. The verdict reports
the measured post-norm orders against that expectation.
"""

from __future__ import annotations

import dataclasses

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
from studies._toolkit.report import (
    ci_cell,
    markdown_table,
    new_figure,
    progress,
    reduction_note,
    wide_ci_note,
)
from studies._toolkit.trained import check_weights, is_run_folder, sizes, trained

NAME = "splitting-error"
SUMMARY = "Lie/Strang/4th-order/RK splitting error vs τ; Lie error vs the commutator [A, F]."

SPLITTINGS = tuple(wb.registry.SPLITTING_SCHEMES)
MEASURED = (*SPLITTINGS, "unsplit-rk4")
"""The valid `schemes`: every splitting scheme of the registry, and the unsplit RK4 (a name of
`wb.registry.UNSPLIT_METHODS`; the names of the two tables are disjoint)."""
PLACEMENTS = ("pre", "post")
LABELS = dict(zip(MEASURED, ("Lie", "Strang", "Yoshida 4", "Suzuki 4", "unsplit RK4")))


def _method(name: str):
    """The scheme called `name`: a splitting scheme or `unsplit-rk4` (`wb.schemes.RK4()`)."""
    table = wb.registry.SPLITTING_SCHEMES if name in SPLITTINGS else wb.registry.UNSPLIT_METHODS
    return table[name]


def _order(name: str) -> int:
    """The classical (global) order of a scheme: the object's own `order()`."""
    return _method(name).order()


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 16
    """Model width d."""
    num_heads: int = 2
    """Attention heads per layer; must divide d."""
    num_layers: int = 3
    """Encoder layers (the equation's time span T, one unit per layer)."""
    dim_feedforward: int = 32
    """Hidden width of the feed-forward block."""
    n: int = 8
    """Tokens in the input sequence."""
    schemes: tuple[str, ...] = ("lie", "strang", "yoshida4", "unsplit-rk4")
    """Must include `lie` (the commutator check)."""
    placements: tuple[str, ...] = PLACEMENTS
    """Must include `pre`."""
    local_taus: tuple[float, ...] = tuple(2.0**-k for k in range(1, 11))
    """Step sizes τ of the local error: one step from the input on layer 0 (at least 3)."""
    steps_per_layer: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    """Steps per layer of the global error at T, for the order fit (at least 3)."""
    subflow_substeps: int = 8
    """RK4 steps per sub-flow for the "exact sub-flow" rows."""
    reference_substeps: int = 64
    """RK4 steps of the exact flow over one local step τ."""
    reference_steps_per_layer: int = 1024
    """RK4 steps per layer of the exact flow (at least 4 × the largest of steps_per_layer)."""
    network_subflows: bool = True
    """Also measure the global error with each scheme's own inner method (one step per sub-flow)."""
    commutator_tolerance: float = 0.05
    """Accepted |‖e‖ / ((τ²/2)‖[A,F](u)‖) − 1| and relative vector deviation at the smallest τ."""
    order_tolerance: float = 0.3
    """Accepted |fitted global order − classical order|."""
    seed: int = 0
    """Seeds the random weights and input state."""
    weights: str = "random"
    """The pre-norm equation: `random` (a random encoder of the sizes above, a random input) or a
    training run's folder (`--weights runs/train-digits`: the trained equation from its first
    saved example input embedded; `d`, `num_heads`, `num_layers`, `dim_feedforward` and `n` are
    then the trained model's). The post-norm variant puts the S1 projection on its terms."""

    def __post_init__(self):
        check_positive(self, "d", "num_heads", "num_layers", "dim_feedforward", "n")
        check_positive(self, "subflow_substeps", "reference_substeps", "reference_steps_per_layer")
        check_positive(self, "local_taus", "steps_per_layer", "order_tolerance")
        check_divides(self, "num_heads", into="d")
        check_nonempty(self, "schemes", "placements")
        check_choices(self, "schemes", MEASURED)
        check_choices(self, "placements", PLACEMENTS)
        check(self, "schemes", "lie" in self.schemes, "include 'lie' (the commutator check)")
        check(self, "placements", "pre" in self.placements, "include 'pre'")
        for field in ("schemes", "placements", "local_taus", "steps_per_layer"):
            values = getattr(self, field)
            check(self, field, len(set(values)) == len(values), "the values must be distinct")
        for field in ("local_taus", "steps_per_layer"):
            check(self, field, len(getattr(self, field)) >= 3, "give at least 3 (an order fit)")
        check(
            self,
            "reference_steps_per_layer",
            self.reference_steps_per_layer >= 4 * max(self.steps_per_layer),
            f"it must be at least 4 × max(steps_per_layer) = {4 * max(self.steps_per_layer)}",
        )
        check_range(self, "commutator_tolerance", 0.0, 1.0, low_open=True, high_open=True)
        check_seed(self)
        check_weights(self, "weights", ("random",))

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the model (state dict and
        equations: `_memory.encoder_solve_bytes`), and the local errors, computed for every τ at
        once (vmapped): per τ the scheme's and the reference's RK4 stages of an `n × d` state,
        the error vector and one operator evaluation's activations (three more for the
        commutator's two JVPs). The global errors run one step count at a time."""
        from studies._toolkit import memory as M

        n, d, hidden, heads, layers = (
            self.n,
            self.d,
            self.dim_feedforward,
            self.num_heads,
            self.num_layers,
        )
        if is_run_folder(self.weights):
            z = sizes(self.weights)
            n, d, hidden, heads, layers = z["n"], z["d"], z["hidden"], z["heads"], z["layers"]
        solve = M.encoder_solve_bytes(n=n, d=d, hidden=hidden, heads=heads, layers=layers, stages=6)
        evaluation = M.attention_layer_floats(n, d, hidden, heads)
        per_tau = 14 * n * d + 4 * evaluation
        return solve + M.array_bytes(len(self.local_taus), per_tau)


def smoke_config() -> Config:
    return Config(
        d=8,
        num_heads=2,
        num_layers=2,
        dim_feedforward=16,
        n=4,
        local_taus=(2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-10),
        steps_per_layer=(4, 8, 16, 32),
        subflow_substeps=4,
        reference_substeps=32,
        reference_steps_per_layer=256,
        network_subflows=False,
    )


@dataclasses.dataclass(frozen=True)
class Row:
    """One scheme at one placement: local errors over τ, global errors over steps per layer."""

    placement: str
    scheme: str
    subflows: str
    """`exact` (RK4 sub-flows), `network` (one inner step per sub-flow) or `-` (unsplit)."""
    local_taus: np.ndarray
    local_errors: np.ndarray
    """Frobenius norms of the local error vectors."""
    local_fit: wba.OrderFit | None
    global_taus: np.ndarray
    global_errors: np.ndarray
    global_fit: wba.OrderFit | None
    expected_local: int
    """The classical local order (global order + 1)."""


@dataclasses.dataclass(frozen=True)
class Commutator:
    """The Lie local error (pre-norm, exact sub-flows) against (τ²/2)[A, F](u)."""

    commutator_norm: float
    taus: np.ndarray
    measured: np.ndarray
    predicted: np.ndarray
    ratio: np.ndarray
    vector_relative_deviation: np.ndarray
    """‖e − (τ²/2)[A,F](u)‖ / ‖(τ²/2)[A,F](u)‖; the opposite sign convention would give ≈ 2."""
    vector_deviation_fit: wba.OrderFit | None
    ratio_deviation_fit: wba.OrderFit | None
    """Fit of |ratio − 1| against τ."""
    smallest_tau_ratio: float


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    rows: list[Row]
    commutator: Commutator


def _fit(steps, errors, roundoff, expected=None) -> wba.OrderFit | None:
    """`fit_order` on the asymptotic range (judged against `expected`), or `None` where the
    ladder admits no fit."""
    fit = wba.fit_order(steps, errors, roundoff=roundoff, expected=expected, throw=False)
    return fit if fit.success else None


def _equations(config: Config, rng):
    """`({"pre", "post"} equations, u0)`: the random encoder and a random input, or the trained
    equation and its first saved input embedded (`weights` a run folder)."""
    if is_run_folder(config.weights):
        transformer, u0, _ = trained(config.weights)
        pre = transformer.equation
    else:
        sd = wb.architectures.random_encoder_state_dict(
            rng, d=config.d, num_layers=config.num_layers, dim_feedforward=config.dim_feedforward
        )
        model = wb.architectures.encoder_from_torch(
            sd, num_heads=config.num_heads, norm_first=True, activation="gelu"
        )
        pre = model.equation
        u0 = jnp.asarray(rng.standard_normal((config.n, config.d)))
    d, layers = u0.shape[-1], pre.num_pieces
    s1 = wb.terms.LayerNormProjection.onto_s1(d, dtype=jnp.float64)
    proj = wb.PiecewiseConstant(wb.stack([s1] * layers), pre.piece_length)
    post = wb.Equation(tuple(wb.Operator(op.term, proj) for op in pre.operators), wb.PostNorm())
    return {"pre": pre, "post": post}, u0


def compute(config: Config) -> Results:
    with jax.enable_x64(True):
        rng = np.random.default_rng(config.seed)
        equations, u0 = _equations(config, rng)
        num_layers = equations["pre"].num_pieces
        taus = np.asarray(sorted(config.local_taus, reverse=True), float)
        ks = np.asarray(sorted(config.steps_per_layer))
        global_taus = equations["pre"].piece_length / ks
        size = float(np.linalg.norm(np.asarray(u0)))
        local_roundoff = wba.roundoff_level(np.float64, size, config.reference_substeps)
        global_roundoff = wba.roundoff_level(np.float64, size, ks * num_layers)
        rk4 = wb.schemes.RK4()
        variants = [("exact", rk4, config.subflow_substeps)]
        if config.network_subflows:
            variants.append(("network", None, 1))
        jobs = [
            (placement, name, variant)
            for placement in config.placements
            for name in config.schemes
            for variant in (variants if name in SPLITTINGS else variants[:1])
        ]
        references, rows, lie_vectors = {}, [], None
        for placement, name, (subflows, solver, m) in progress(jobs, desc=NAME):
            eq = equations[placement]
            if placement not in references:
                references[placement] = wba.splitting_flow(
                    eq, u0, None, config.reference_steps_per_layer
                )
            method = _method(name)
            sub = dict(subflow_solver=solver, subflow_substeps=m)
            local = wba.local_errors(
                eq, u0, taus, method, reference_substeps=config.reference_substeps, **sub
            )
            local_norm = np.linalg.norm(local.reshape(len(taus), -1), axis=1)
            glob = wba.global_errors(eq, u0, ks, method, reference=references[placement], **sub)
            rows.append(
                Row(
                    placement=placement,
                    scheme=name,
                    subflows=subflows if name in SPLITTINGS else "-",
                    local_taus=taus,
                    local_errors=local_norm,
                    local_fit=_fit(taus, local_norm, local_roundoff, _order(name) + 1),
                    global_taus=global_taus,
                    global_errors=np.asarray(glob),
                    global_fit=_fit(global_taus, glob, global_roundoff, _order(name)),
                    expected_local=_order(name) + 1,
                )
            )
            if (placement, name, subflows) == ("pre", "lie", "exact"):
                lie_vectors = local
        c = np.asarray(wba.vector_field_commutator(equations["pre"].localize(0), u0))
    return Results(config, rows, _commutator(c, lie_vectors, taus))


def _commutator(c: np.ndarray, vectors: np.ndarray, taus: np.ndarray) -> Commutator:
    cn = float(np.linalg.norm(c))
    measured = np.linalg.norm(vectors.reshape(len(taus), -1), axis=1)
    predicted = taus**2 / 2 * cn
    deviation = np.asarray(
        [np.linalg.norm(vectors[i] - taus[i] ** 2 / 2 * c) / predicted[i] for i in range(len(taus))]
    )
    ratio = measured / predicted
    off = np.abs(ratio - 1.0)
    return Commutator(
        commutator_norm=cn,
        taus=taus,
        measured=measured,
        predicted=predicted,
        ratio=ratio,
        vector_relative_deviation=deviation,
        vector_deviation_fit=_fit(taus, deviation, None),
        ratio_deviation_fit=_fit(taus, off, None) if np.all(off > 0) else None,
        smallest_tau_ratio=float(ratio[-1]),
    )


# ---------------------------------------------------------------------------------------------
# Verdict and report


def _pre_judged(results: Results) -> list[Row]:
    """The rows whose order the question asks about: pre-norm, exact sub-flows or unsplit."""
    return [r for r in results.rows if r.placement == "pre" and r.subflows != "network"]


def _keeps_order(r: Row, tol: float) -> bool:
    fit = r.global_fit
    return (
        fit is not None
        and abs(fit.order - (r.expected_local - 1)) <= tol
        and not getattr(fit, "order_reduction", False)
    )


def _commutator_ok(results: Results) -> tuple[bool, float, float]:
    com, tol = results.commutator, results.config.commutator_tolerance
    off = abs(com.smallest_tau_ratio - 1)
    dev = float(com.vector_relative_deviation[-1])
    return bool(off <= tol and dev <= tol), off, dev


def _short(fit: wba.OrderFit | None) -> str:
    return "no fit" if fit is None else f"{fit.order:.2f}"


def _orders(rows: list[Row], classical: str = "") -> str:
    return ", ".join(
        f"{LABELS[r.scheme]} {_short(r.global_fit)} "
        f"({classical}{r.expected_local - 1}{reduction_note(r.global_fit)})"
        for r in rows
    )


def verdict(results: Results) -> str:
    config, com = results.config, results.commutator
    tol = config.order_tolerance
    ok_com, off, dev = _commutator_ok(results)
    pre = _pre_judged(results)
    missed = [LABELS[r.scheme] for r in pre if not _keeps_order(r, tol)]
    word = "Yes" if ok_com and not missed else "Partly" if ok_com or not missed else "No"
    parts = [
        f"{word}. Lie local error against (τ²/2)‖[A,F](u)‖ = {com.commutator_norm:.4g}·τ²/2 at the "
        f"smallest τ = {com.taus[-1]:.3g}: norm ratio {com.smallest_tau_ratio:.5f} (|ratio − 1| "
        f"= {off:.1e}) and relative vector deviation {dev:.1e}, tolerance "
        f"{config.commutator_tolerance:g} for both (the opposite sign would give ≈ 2): "
        + ("size and sign confirmed." if ok_com else "NOT confirmed."),
        f"Pre-norm global orders (classical order ± {tol:g}, no order reduction): {_orders(pre)}: "
        + (f"not at their classical order: {', '.join(missed)}." if missed else "all kept."),
    ]
    post = [r for r in results.rows if r.placement == "post" and r.subflows != "network"]
    split = [r for r in post if r.scheme in SPLITTINGS]
    if split:
        fits = [r.global_fit for r in split]
        if all(f is not None and abs(f.order - 1) <= tol for f in fits):
            lost = [LABELS[r.scheme] for r in split if r.expected_local > 2]
            finding = f"all at order 1 ± {tol:g}" + (
                f", so {', '.join(lost)} lose their classical order" if lost else ""
            )
        else:
            finding = f"not all at order 1 ± {tol:g}"
        parts.append(f"Post-norm splittings (measured): {_orders(split, 'classical ')}: {finding}.")
    for r in (r for r in post if r.scheme not in SPLITTINGS):
        kept = "keeps" if _keeps_order(r, tol) else "does NOT keep"
        parts.append(
            f"Post-norm {LABELS[r.scheme]} (the projection method): order "
            f"{_short(r.global_fit)}{reduction_note(r.global_fit)}, {kept} order {r.expected_local - 1}."
        )
    return " ".join(parts)


def _ci(fit: wba.OrderFit | None) -> str:
    if fit is None:
        return "no fit"
    return f"{fit.order:.2f} {ci_cell(fit.ci_low, fit.ci_high)}{reduction_note(fit)}"


def report(results: Results) -> str:
    config, com = results.config, results.commutator
    headers = "placement|scheme|sub-flows|local slope [95% CI]|classical|global order [95% CI]"
    table = markdown_table(
        [*headers.split("|"), "classical", "global error at smallest τ"],
        [
            [
                "pre-norm" if r.placement == "pre" else "post-norm",
                LABELS[r.scheme],
                r.subflows,
                _ci(r.local_fit),
                r.expected_local,
                _ci(r.global_fit),
                r.expected_local - 1,
                float(r.global_errors[-1]),
            ]
            for r in results.rows
        ],
        floatfmt=".2e",
    )
    ratio_table = markdown_table(
        "τ|‖Lie local error‖|(τ²/2)‖[A,F](u)‖|ratio|‖e − (τ²/2)[A,F]‖ / ‖(τ²/2)[A,F]‖".split("|"),
        zip(com.taus, com.measured, com.predicted, com.ratio, com.vector_relative_deviation),
        floatfmt=".4g",
    )
    strang = next(
        (r for r in _pre_judged(results) if r.scheme == "strang" and r.local_fit is not None),
        None,
    )
    if is_run_folder(config.weights):
        z = sizes(config.weights)
        layers = z["layers"]
        model = (
            f"Trained pre-norm equation of the run folder `{config.weights}`: d = {z['d']}, "
            f"{z['heads']} heads, {layers} layers, d_ff = {z['hidden']}, n = {z['n']} tokens "
            "(its first saved input embedded), float64"
        )
    else:
        layers = config.num_layers
        model = (
            f"Random pre-norm GELU encoder: d = {config.d}, {config.num_heads} heads, "
            f"{layers} layers, d_ff = {config.dim_feedforward}, n = {config.n} tokens, "
            f"float64, seed {config.seed}"
        )
    lines = [
        f"{model}. Local error: one step from the input on layer 0, τ ∈ "
        f"[{min(config.local_taus):.3g}, {max(config.local_taus):.3g}]; global error at T = "
        f"{layers}, {min(config.steps_per_layer)}–{max(config.steps_per_layer)} steps "
        f"per layer. 'exact' sub-flows: {config.subflow_substeps} RK4 steps each (splitting error "
        "alone); 'network': one step of the scheme's inner method (Euler / midpoint / RK4). "
        "Post-norm: each sub-flow followed by the projection onto S1(0, 1) (no affine), against "
        "the projected ODE u' = P_T(A + F). Errors are Frobenius norms; orders are `fit_order` "
        "slopes on the asymptotic range (round-off level ε·‖u₀‖·steps).",
        "",
        table,
        "",
        wide_ci_note(
            (f.ci_low, f.ci_high)
            for r in results.rows
            for f in (r.local_fit, r.global_fit)
            if f is not None
        ),
        "",
        "**Lie local error vs the commutator** (pre-norm, exact sub-flows, A = attention first): "
        f"‖[A, F](u)‖ = {com.commutator_norm:.4g}, computed by two JVPs.",
        "",
        ratio_table,
        "",
        f"- Ratio at the smallest τ = {com.taus[-1]:.3g}: **{com.smallest_tau_ratio:.5f}**; the "
        "relative deviation of the *vector* e from (τ²/2)[A, F](u) falls with slope "
        f"{_short(com.vector_deviation_fit)} in τ (1 expected from the O(τ³) remainder).",
    ]
    if strang is not None:
        lines.append(
            f"- Strang local-error slope (pre-norm, exact sub-flows): "
            f"**{strang.local_fit.order:.3f}** (classical 3)."
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Figures

MARKERS = dict(zip(MEASURED, "os^vD"))
COLORS = dict(zip(MEASURED, ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red")))


def _label(r: Row, local: bool) -> str:
    sub = "" if r.subflows in ("exact", "-") else f", {r.subflows}"
    what, fit = ("slope", r.local_fit) if local else ("order", r.global_fit)
    return f"{LABELS[r.scheme]}{sub} ({what} {_short(fit)}{reduction_note(fit)})"


def _curve(ax, r: Row, local: bool, dotted: bool = False, prefix: str = "") -> None:
    x, y = (r.local_taus, r.local_errors) if local else (r.global_taus, r.global_errors)
    color = COLORS[r.scheme]
    style = MARKERS[r.scheme] + (":" if dotted else "-")
    label = prefix + _label(r, local)
    ax.loglog(
        x, np.maximum(y, 1e-18), style, color=color, mfc="white" if dotted else color, label=label
    )


def _finish(ax, title: str, ylabel: str, xlabel: str = "step τ", **legend) -> None:
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize=legend.pop("fontsize", 7), **legend)
    ax.grid(True, which="both", alpha=0.3)
    # Tick the steps themselves (τ = 1/k), not the log axis's crowded minor labels.
    taus = sorted({float(x) for line in ax.get_lines() for x in line.get_xdata() if x > 0})
    if 1 < len(taus) <= 8:
        ax.set_xticks(taus, [_tau_label(t) for t in taus])
        ax.set_xticks([], minor=True)


def _tau_label(tau: float) -> str:
    k = round(1 / tau)
    return f"1/{k}" if abs(k * tau - 1) < 1e-9 else f"{tau:.2g}"


def figures(results: Results) -> dict:
    com, tol = results.commutator, results.config.commutator_tolerance
    fig_local, axes = new_figure(1, 2, figsize=(11, 4.2))
    for r in _pre_judged(results):
        _curve(axes[0], r, local=True)
    axes[0].loglog(com.taus, com.predicted, "k--", label="(τ²/2)‖[A,F](u)‖ (Lie prediction)")
    _finish(axes[0], "Local error, pre-norm, exact sub-flows", "local error ‖Φ_τ(u) − φ_τ(u)‖")
    fit = com.ratio_deviation_fit
    slope = "" if fit is None else f" (slope {_short(fit)})"
    off = np.maximum(np.abs(com.ratio - 1), 1e-18)
    axes[1].loglog(com.taus, off, "o-", label="|‖e‖ / (τ²/2)‖[A,F](u)‖ − 1|" + slope)
    deviation = np.maximum(com.vector_relative_deviation, 1e-18)
    axes[1].loglog(com.taus, deviation, "s:", label="‖e − (τ²/2)[A,F](u)‖ / ‖(τ²/2)[A,F](u)‖")
    axes[1].axhline(tol, color="tab:red", lw=0.8, ls="--", label=f"tolerance {tol:g}")
    _finish(
        axes[1], "Lie local error e vs (τ²/2)[A, F](u)", "relative deviation from the leading term"
    )

    fig_global, ax = new_figure(figsize=(6, 4.4))
    for r in results.rows:
        if r.placement == "pre":
            _curve(ax, r, local=False, dotted=r.subflows == "network")
    title = "Global error, pre-norm (dotted: network inner solvers)"
    _finish(ax, title, "global error ‖u_τ(T) − u(T)‖", "step τ (1 / steps per layer)")
    out = {"splitting_local_error": fig_local, "splitting_global_error": fig_global}
    if len(results.config.placements) > 1:
        fig, axes = new_figure(1, 2, figsize=(11, 5.6))
        for r in results.rows:
            if r.subflows != "network":
                for ax, local in zip(axes, (True, False)):
                    _curve(ax, r, local, dotted=r.placement == "post", prefix=f"{r.placement}: ")
        for ax, what in zip(axes, ("Local", "Global")):
            title = f"{what} error: pre-norm (solid) vs post-norm (dotted)"
            _finish(
                ax,
                title,
                f"{what.lower()} error",
                fontsize=6,
                ncol=2,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.16),
            )
        out["splitting_placement"] = fig
    return out
