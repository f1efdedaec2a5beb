"""Is the Transformer a discretization of a model continuous in the token index *and* the
feature dimension (paper A), i.e. do its outputs converge as the token grid (n) and the feature
grid (d) are refined, at the order of the quadrature rule?

A random continuous model (`wb.analysis.ContinuousTransformer`: smooth, non-periodic,
non-polynomial kernels `W(ξ, y)` on the feature interval, a few pre-norm layers of Euler steps with
a smooth activation) is applied to a smooth input `f(x, y)`. Every integral is a quadrature sum:
midpoint and trapezoid (order 2) and Gauss–Legendre (exponential for analytic integrands). The
feature grid is refined with the token grid held fixed (Gauss), and vice versa; the error is the
largest deviation of `u(T)` at 3 × 3 fixed probe points `(x_p, y_q)` (Nyström values: the equation
evaluated off the grid) from a Gauss reference with many more nodes, plus the error of the
functional `J = ∫∫ u(T) ψ`. Observed orders come from `wb.analysis.fit_order` over the grid
spacings; Gauss errors are measured by their exponential rate (`exponential_rate`,
decades per node), not forced into an order. Two checks frame it: a uniform (midpoint) grid
should be exactly the standard pre-LN Transformer with folded weights `diag(w) W(ξ_i, y_j)`; and
ReLU instead of a smooth activation puts a kink into the integrand of the hidden variable, which
is expected to cost Gauss its exponential convergence.
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
from workbench.analysis._exponential import exponential_rate

NAME = "resolution"
SUMMARY = "Token- and feature-grid refinement of the continuous Transformer at the rule's order."

DIRECTIONS = ("features", "tokens")


@dataclasses.dataclass(frozen=True)
class Config:
    rules: tuple[str, ...] = ("midpoint", "trapezoid", "gauss")
    """Quadrature rules refined in each direction (midpoint, trapezoid, gauss)."""
    sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    """Grid sizes for the order-2 rules (at least 4 distinct, each >= 2)."""
    gauss_sizes: tuple[int, ...] = (3, 4, 6, 8, 10, 12, 16, 20, 24, 32)
    """Node counts for the Gauss–Legendre rule (at least 4 distinct, each >= 2)."""
    fixed_size: int = 24
    """Gauss nodes in the variable that is held fixed."""
    reference_size: int = 64
    """Gauss nodes of the reference in the refined variable (more than the largest Gauss size)."""
    num_layers: int = 3
    """Pre-norm layers of the continuous model, one Euler step each."""
    tau: float = 1.0
    """Euler step τ per layer (T = τ · num_layers)."""
    rank: int = 3
    """Rank of the random separable kernels W(ξ, y) and of the input f(x, y)."""
    max_frequency: float = 3.0
    """Kernel frequencies are drawn from [1, max_frequency]."""
    activation: str = "gelu"
    """Pointwise activation of the feed-forward part, a name in `wb.registry.ACTIVATIONS` (smooth,
    e.g. gelu or tanh, for the convergence study)."""
    norm: bool = True
    """Apply the layer-norm projections (off: the uniform-grid equivalence check is skipped)."""
    probes: tuple[float, ...] = (0.13, 0.5, 0.91)
    """Probe coordinates in [0, 1]; the error is measured at every pair (x_p, y_q) of them."""
    relu_check: bool = True
    """Repeat the feature refinement with ReLU (same kernels) to show the kink's effect."""
    tolerance: float = 0.3
    """Acceptance: |observed order − rule order| ≤ tolerance."""
    min_gauss_rate: float = 0.3
    """Acceptance for Gauss: at least this many decades of error per added node."""
    equivalence_tolerance: float = 1e-10
    """Acceptance: max |continuous on uniform grids − discrete Transformer|."""
    seed: int = 0
    """Seeds the random kernels, the input f and the test function ψ."""

    def __post_init__(self):
        check_nonempty(self, "rules", "probes")
        check_choices(self, "rules", wb.registry.QUADRATURE_RULES)
        check(self, "rules", len(set(self.rules)) == len(self.rules), "the rules must be distinct")
        for field in ("sizes", "gauss_sizes"):
            check_range(self, field, 2)
            check(
                self, field, len(set(getattr(self, field))) >= 4, "give at least 4 distinct sizes"
            )
        check_range(self, "fixed_size", 2)
        check_range(self, "reference_size", 2)
        check(
            self,
            "reference_size",
            self.reference_size > max(self.gauss_sizes),
            f"it must exceed the largest of gauss_sizes ({max(self.gauss_sizes)})",
        )
        check_positive(self, "num_layers", "tau", "rank", "tolerance", "min_gauss_rate")
        check_positive(self, "equivalence_tolerance")
        check_range(self, "max_frequency", 1.0)
        check_choices(self, "activation", wb.registry.ACTIVATIONS)
        check_range(self, "probes", 0.0, 1.0)
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): one layer of the continuous
        model on the largest grid, every refined grid padded to `m = max(sizes, gauss_sizes,
        reference_size) + len(probes)` nodes and the fixed one of `f = fixed_size +
        len(probes)`: the kernel matrices on the feature grid and the attention matrices on the
        token grid (`m × m` in the refined variable, three at a time; `f × f` in the fixed one,
        five), and the states, queries, keys, values and hidden layer (`m × f`, eight)."""
        from studies._toolkit import memory as M

        p = len(self.probes)
        m = max(*self.sizes, *self.gauss_sizes, self.reference_size) + p
        f = self.fixed_size + p
        return M.array_bytes(3 * m * m + 8 * m * f + 5 * f * f)


def smoke_config() -> Config:
    return Config(
        sizes=(8, 16, 32, 64),
        gauss_sizes=(3, 4, 6, 8, 10, 12),
        fixed_size=12,
        reference_size=40,
        num_layers=2,
    )


@dataclasses.dataclass(frozen=True)
class Ladder:
    """One refinement ladder: a rule, the refined variable, and the errors per grid size."""

    rule: str
    refine: str
    activation: str
    declared_order: int | None
    """The rule's algebraic order; `None` for Gauss (exponential)."""
    sizes: np.ndarray
    spacings: np.ndarray
    errors: np.ndarray
    """max |u(T) − u_ref(T)| at the probes."""
    functional_errors: np.ndarray
    """|J − J_ref|."""
    reference_values: np.ndarray
    fit: wba.OrderFit | None
    """Order fit of the probe errors (rules with an order, and every ReLU ladder)."""
    functional_fit: wba.OrderFit | None
    decades_per_node: float | None
    """Exponential rate (Gauss only)."""


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    rows: list[Ladder]
    relu_rows: list[Ladder]
    equivalence_max_abs_difference: float | None
    """Uniform midpoint grids (n = 7, d = 10) against the folded discrete encoder."""
    equivalence_n: int = 7
    equivalence_d: int = 10


def _fit(spacings, errors, expected) -> wba.OrderFit | None:
    """`fit_order` (judged against `expected`), or `None` where the ladder admits no fit."""
    fit = wba.fit_order(spacings, errors, expected=expected, throw=False)
    return fit if fit.success else None


def _ladder(model, f, psi, rule_name, refine, activation, config, pad_to) -> Ladder:
    rule = wb.registry.QUADRATURE_RULES[rule_name]
    gauss = wba.GaussLegendreRule()
    fixed = wba.Grid.from_rule(gauss, config.fixed_size, probes=config.probes)
    reference = wba.Grid.from_rule(gauss, config.reference_size, probes=config.probes)
    sizes = config.gauss_sizes if rule.order is None else config.sizes
    res = wba.refinement_errors(
        model,
        f,
        rule,
        sizes,
        refine=refine,
        fixed=fixed,
        reference=reference,
        probes=config.probes,
        psi=psi,
        pad_to=pad_to,
    )
    h, e, je = (np.asarray(res[k]) for k in ("spacings", "errors", "functional_errors"))
    algebraic = rule.order is not None or activation == "relu"
    rate = None
    if rule.order is None:
        try:
            rate = exponential_rate(sizes, e)
        except ValueError:
            pass
    return Ladder(
        rule=rule_name,
        refine=refine,
        activation=activation,
        declared_order=rule.order,
        sizes=np.asarray(sizes),
        spacings=h,
        errors=e,
        functional_errors=je,
        reference_values=np.asarray(res["reference_values"]),
        fit=_fit(h, e, rule.order) if algebraic else None,
        functional_fit=_fit(h, je, rule.order) if rule.order is not None else None,
        decades_per_node=rate,
    )


def _equivalence(model, f) -> float:
    """Uniform midpoint grids = the standard pre-LN encoder with folded weights (GELU)."""
    twin = wba.ContinuousTransformer(
        model.layers, tau=model.tau, activation=wb.terms.gelu, norm=True
    )
    rule = wba.MidpointRule()
    tokens, features = wba.Grid.from_rule(rule, 7), wba.Grid.from_rule(rule, 10)
    u_cont = np.asarray(twin(f, tokens, features))
    sd = wba.folded_encoder_state_dict(twin, features)
    enc = wb.architectures.encoder_from_torch(
        sd, num_heads=1, norm_first=True, activation="gelu", layer_norm_eps=0.0
    )
    u_disc = np.asarray(enc(f(jnp.asarray(tokens.nodes), jnp.asarray(features.nodes))))
    return float(np.max(np.abs(u_cont - u_disc)))


def compute(config: Config) -> Results:
    with jax.enable_x64(True):
        kmodel, kf, kpsi = jax.random.split(jax.random.key(config.seed), 3)
        model = wba.ContinuousTransformer.random(
            key=kmodel,
            num_layers=config.num_layers,
            rank=config.rank,
            max_frequency=config.max_frequency,
            tau=config.tau,
            activation=wb.registry.ACTIVATIONS[config.activation],
            norm=config.norm,
        )
        f = wba.SmoothKernel.random(key=kf, rank=config.rank, max_frequency=config.max_frequency)
        psi = wba.SmoothKernel.random(key=kpsi, rank=2, max_frequency=config.max_frequency)
        pad_to = max(*config.sizes, *config.gauss_sizes, config.reference_size)
        relu = wba.ContinuousTransformer(
            model.layers, tau=model.tau, activation=wb.terms.relu, norm=model.norm
        )
        jobs = [(r, refine, config.activation) for refine in DIRECTIONS for r in config.rules]
        if config.relu_check and config.activation != "relu":
            jobs += [(r, "features", "relu") for r in ("midpoint", "gauss")]
        rows, relu_rows = [], []
        for rule_name, refine, activation in progress(jobs, desc=NAME):
            m = relu if activation != config.activation else model
            ladder = _ladder(m, f, psi, rule_name, refine, activation, config, pad_to)
            (rows if activation == config.activation else relu_rows).append(ladder)
        equivalence = _equivalence(model, f) if config.norm else None
    return Results(config, rows, relu_rows, equivalence)


# ---------------------------------------------------------------------------------------------
# Verdict and report


def _order_ok(fit: wba.OrderFit | None, order: int, tol: float) -> bool:
    return (
        fit is not None
        and abs(fit.order - order) <= tol
        and not getattr(fit, "order_reduction", False)
    )


def _row_ok(r: Ladder, config: Config) -> bool:
    if r.declared_order is None:
        return r.decades_per_node is not None and r.decades_per_node >= config.min_gauss_rate
    return _order_ok(r.fit, r.declared_order, config.tolerance) and _order_ok(
        r.functional_fit, r.declared_order, config.tolerance
    )


def _order(fit: wba.OrderFit | None) -> str:
    return "no fit" if fit is None else f"{fit.order:.2f}{reduction_note(fit)}"


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:.2f}"


def verdict(results: Results) -> str:
    config = results.config
    low = [r for r in results.rows if r.declared_order is not None]
    gauss = [r for r in results.rows if r.declared_order is None]
    claims, parts = [], []
    if low:
        ok = all(_row_ok(r, config) for r in low)
        claims.append(ok)
        orders = "; ".join(
            f"{r.rule} refining {r.refine}: {_order(r.fit)} (J: {_order(r.functional_fit)})"
            for r in low
        )
        parts.append(
            f"the order-{'/'.join(sorted({str(r.declared_order) for r in low}))} rules "
            + ("converge" if ok else "do NOT all converge")
            + f" at their order ± {config.tolerance:g} without order reduction ({orders})"
        )
    if gauss:
        ok = all(_row_ok(r, config) for r in gauss)
        claims.append(ok)
        rates = ", ".join(f"{_rate(r.decades_per_node)} ({r.refine})" for r in gauss)
        parts.append(
            "Gauss–Legendre "
            + ("converges" if ok else "does NOT converge")
            + f" exponentially, at {rates} decades per node (threshold "
            f"{config.min_gauss_rate:g})"
        )
    converge = list(claims)
    diff = results.equivalence_max_abs_difference
    if diff is not None:
        ok = diff <= config.equivalence_tolerance
        claims.append(ok)
        parts.append(
            f"uniform midpoint grids give the discrete pre-LN Transformer to max |Δ| = "
            f"{diff:.1e} (tolerance {config.equivalence_tolerance:g}"
            + ("" if ok else ", NOT met")
            + ")"
        )
    word = "Yes" if all(claims) else "No" if not any(converge) else "Partly"
    text = f"{word}. Refining the feature and token grids, " + "; ".join(parts) + "."
    relu_g = next((r for r in results.relu_rows if r.rule == "gauss"), None)
    smooth_g = next((r for r in gauss if r.refine == "features"), None)
    if relu_g is not None:
        text += (
            f" With ReLU, Gauss on the features reaches {relu_g.errors[-1]:.1e} at "
            f"{relu_g.sizes[-1]} nodes ({_rate(relu_g.decades_per_node)} decades per node, "
            f"log-log slope {_order(relu_g.fit)})"
            + (
                f", against {smooth_g.errors[-1]:.1e} with {config.activation}"
                if smooth_g is not None
                else ""
            )
            + "."
        )
    return text


def _ci(fit: wba.OrderFit | None) -> str:
    if fit is None:
        return "no fit"
    return f"{fit.order:.2f} {ci_cell(fit.ci_low, fit.ci_high)}{reduction_note(fit)}"


def report(results: Results) -> str:
    config = results.config
    lines = [
        f"Continuous pre-norm Transformer on [0, 1]², {config.num_layers} layers of Euler steps "
        f"(τ = {config.tau:g}), activation {config.activation}, layer norm "
        f"{'on' if config.norm else 'off'}, kernels of rank {config.rank} with frequencies in "
        f"[1, {config.max_frequency:g}] (smooth, not periodic, not polynomial); float64. Error: "
        f"max |u(T) − u_ref(T)| at the {len(config.probes)}² probe points "
        f"{tuple(config.probes)}² (Nyström values) and |J − J_ref| for J = ∫∫ u(T) ψ. The other "
        f"variable is held on a Gauss grid of {config.fixed_size} nodes; the reference is Gauss "
        f"with {config.reference_size} nodes. Orders: `fit_order` on the spacing h (95 % CI); "
        "Gauss: `exponential_rate` (decades of error per added node).",
        "",
    ]
    table = []
    for r in results.rows + results.relu_rows:
        gauss = r.declared_order is None
        table.append(
            [
                r.refine,
                r.rule if r.activation == config.activation else f"{r.rule} ({r.activation})",
                "exp." if gauss else r.declared_order,
                f"{r.sizes[0]}–{r.sizes[-1]}",
                f"{r.errors[0]:.2e} → {r.errors[-1]:.2e}",
                _ci(r.fit) if r.fit is not None else "—",
                _rate(r.decades_per_node) if gauss else "—",
                _ci(r.functional_fit) if r.functional_fit is not None else "—",
                "—"
                if r.activation != config.activation
                else "**pass**"
                if _row_ok(r, config)
                else "**FAIL**",
            ]
        )
    headers = "refined|rule|rule order|sizes|probe error (first → last)|observed order (probes)"
    lines.append(
        markdown_table(
            [*headers.split("|"), "decades / node", "order of J", "acceptance"],
            table,
        )
    )
    fits = [f for r in results.rows + results.relu_rows for f in (r.fit, r.functional_fit)]
    lines += [
        "",
        wide_ci_note((f.ci_low, f.ci_high) for f in fits if f is not None),
        "",
        f"Acceptance: order-2 rules within ±{config.tolerance:g} (probes and J, no order "
        f"reduction); Gauss at least {config.min_gauss_rate:g} decades per node. ReLU rows "
        "(same kernels, feature refinement) are shown for comparison.",
        "",
    ]
    for r in results.rows + results.relu_rows:
        if r.declared_order is None:
            errs = ", ".join(f"{m}: {e:.1e}" for m, e in zip(r.sizes, r.errors))
            lines.append(f"- Gauss, {r.refine}, {r.activation} (nodes: error): {errs}.")
    if results.equivalence_max_abs_difference is not None:
        lines.append(
            f"- **Uniform grid vs the discrete Transformer**: on midpoint grids (n = "
            f"{results.equivalence_n}, d = {results.equivalence_d}) the continuous model against "
            "`encoder_from_torch(norm_first=True, layer_norm_eps=0)` with the folded weights "
            "`diag(w) W(ξ_i, y_j)` (query × scale · w · √d): max |Δ| = "
            f"{results.equivalence_max_abs_difference:.1e}."
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Figures


def figures(results: Results) -> dict:
    config, rows = results.config, results.rows
    fig, axes = new_figure(1, 3, figsize=(15, 4.5))
    floor = 1e-17
    markers = {"midpoint": "o", "trapezoid": "s", "gauss": "^"}
    for ax, refine in zip(axes[:2], DIRECTIONS):
        for r in (r for r in rows if r.refine == refine):
            if r.declared_order is None:
                label = f"{r.rule}: exponential, {_rate(r.decades_per_node)} decades/node"
            else:
                label = f"{r.rule}: p = {_order(r.fit)}"
            ax.loglog(r.sizes, np.maximum(r.errors, floor), markers[r.rule] + "-", label=label)
        anchor = [r for r in rows if r.refine == refine and r.declared_order is not None]
        if anchor:
            sizes = anchor[0].sizes.astype(float)
            e0 = 0.25 * min(r.errors[0] for r in anchor)
            ax.loglog(sizes, e0 * (sizes / sizes[0]) ** -2.0, "k:", label="slope −2")
        top = max(float(r.errors.max()) for r in rows if r.refine == refine)
        ax.set_ylim(top=1e4 * top)  # room for the legend above the curves
        ticks = sorted({*config.sizes, min(config.gauss_sizes)})
        ax.set_xticks(ticks, [str(m) for m in ticks])
        ax.tick_params(axis="x", which="minor", labelbottom=False)
        ax.set_xlabel(f"{'feature' if refine == 'features' else 'token'} grid size")
        ax.set_ylabel("max |u(T) − u_ref(T)| at probes")
        ax.set_title(f"refining {refine} (the other: Gauss {config.fixed_size})")
    for r in rows + results.relu_rows:
        if r.rule == "gauss":
            relu = r.activation == "relu"
            axes[2].semilogy(
                r.sizes,
                np.maximum(r.errors, floor),
                "v--" if relu else "^-",
                label=f"gauss, {r.refine}, {r.activation}{' (kink)' if relu else ''}: "
                f"{_rate(r.decades_per_node)} decades/node",
            )
    axes[2].set_xlabel("Gauss nodes")
    axes[2].set_ylabel("max |u(T) − u_ref(T)| at probes")
    axes[2].set_title(f"Gauss–Legendre: {config.activation} vs ReLU")
    for ax, loc in zip(axes, ("upper right", "upper right", "lower left")):
        ax.legend(fontsize=8, loc=loc)
        ax.grid(True, which="both", alpha=0.3)
    return {"resolution": fig}
