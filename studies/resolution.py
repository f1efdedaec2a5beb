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
spacings; Gauss errors are reported as they are (with an exponential rate), not forced into an
order. Two checks frame it: a uniform (midpoint) grid is exactly the standard pre-LN Transformer
with folded weights `diag(w) W(ξ_i, y_j)`; and with ReLU instead of a smooth activation Gauss
loses its exponential convergence (the kink), while the order-2 rules keep order 2.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba

NAME = "resolution"
SUMMARY = "Token- and feature-grid refinement of the continuous Transformer at the rule's order."

ACTIVATIONS = {"gelu": wb.terms.gelu, "tanh": jnp.tanh, "relu": wb.terms.relu}
DIRECTIONS = ("features", "tokens")


@dataclasses.dataclass(frozen=True)
class Config:
    rules: tuple[str, ...] = ("midpoint", "trapezoid", "gauss")
    sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    """Grid sizes for the order-2 rules (at least 4 for the order fit)."""
    gauss_sizes: tuple[int, ...] = (3, 4, 6, 8, 10, 12, 16, 20, 24, 32)
    fixed_size: int = 24
    """Gauss nodes in the variable that is held fixed."""
    reference_size: int = 64
    """Gauss nodes of the reference in the refined variable."""
    num_layers: int = 3
    tau: float = 1.0
    rank: int = 3
    max_frequency: float = 3.0
    activation: Literal["gelu", "tanh", "relu"] = "gelu"
    norm: bool = True
    probes: tuple[float, ...] = (0.13, 0.5, 0.91)
    relu_check: bool = True
    """Repeat the feature refinement with ReLU (same kernels) to show the kink's effect."""
    tolerance: float = 0.3
    """Acceptance: |observed order − rule order| ≤ tolerance."""
    seed: int = 0


def smoke_config() -> Config:
    return Config(
        sizes=(8, 16, 32, 64),
        gauss_sizes=(3, 4, 6, 8, 10, 12),
        fixed_size=12,
        reference_size=40,
        num_layers=2,
    )


def _check(config: Config) -> None:
    if not jax.config.jax_enable_x64:
        raise ValueError("the resolution study runs in float64; run it via `workbench run`.")
    if not config.rules:
        raise ValueError(f"rules=(): give at least one of {', '.join(wba.QUADRATURE_RULES)}.")
    for name in config.rules:
        wba.quadrature_rule(name, field="rules")
    for field in ("sizes", "gauss_sizes"):
        sizes = getattr(config, field)
        for m in sizes:
            if isinstance(m, bool) or not isinstance(m, int) or m < 2:
                raise ValueError(f"{field}: grid size {m!r} must be an integer >= 2.")
        if len(set(sizes)) < 4:
            raise ValueError(
                f"{field}={sizes!r}: an order fit needs at least 4 distinct grid sizes."
            )
    for field in ("fixed_size", "reference_size"):
        m = getattr(config, field)
        if isinstance(m, bool) or not isinstance(m, int) or m < 2:
            raise ValueError(f"{field}={m!r} must be an integer >= 2.")
    if config.reference_size <= max(config.gauss_sizes):
        raise ValueError(
            f"reference_size={config.reference_size} must exceed the largest of gauss_sizes "
            f"({max(config.gauss_sizes)}): the reference must be far more accurate."
        )
    if config.activation not in ACTIVATIONS:
        raise ValueError(
            f"activation={config.activation!r} is not known; valid: {', '.join(ACTIVATIONS)}."
        )
    if not (config.tau > 0 and math.isfinite(config.tau)):
        raise ValueError(f"tau={config.tau!r} must be a finite number > 0.")
    if isinstance(config.num_layers, bool) or config.num_layers < 1:
        raise ValueError(f"num_layers={config.num_layers!r} must be an integer >= 1.")
    if not config.probes or min(config.probes) < 0 or max(config.probes) > 1:
        raise ValueError(f"probes={config.probes!r} must be a non-empty tuple of points in [0, 1].")


def _exponential_rate(sizes, errors, floor=1e-13):
    """Slope `c` of `log10 e ≈ a − c m` over the errors above `floor` (decades per node)."""
    m, e = np.asarray(sizes, float), np.asarray(errors, float)
    ok = e > floor
    if ok.sum() < 2:
        return None
    return float(-np.polyfit(m[ok], np.log10(e[ok]), 1)[0])


def _fit(spacings, errors):
    try:
        return wba.fit_order(spacings, errors)
    except ValueError:
        return None


def _ladder(model, f, psi, rule_name, refine, config, pad_to):
    rule = wba.quadrature_rule(rule_name)
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
    row = {"rule": rule_name, "refine": refine, "declared_order": rule.order, **res}
    if rule.order is None:
        row["decades_per_node"] = _exponential_rate(sizes, res["errors"])
        row["fit"] = row["functional_fit"] = None
    else:
        fit, jfit = (
            _fit(res["spacings"], res["errors"]),
            _fit(res["spacings"], res["functional_errors"]),
        )
        row["fit"] = None if fit is None else fit.to_dict()
        row["functional_fit"] = None if jfit is None else jfit.to_dict()
        row["within_tolerance"] = fit is not None and fit.within(rule.order, config.tolerance)
    return row


def _equivalence(model, f, config) -> dict:
    """Uniform midpoint grids = the standard pre-LN encoder with folded weights (GELU)."""
    twin = wba.ContinuousTransformer(
        model.layers, tau=model.tau, activation=wb.terms.gelu, norm=True
    )
    rule = wba.MidpointRule()
    n, d = 7, 10
    tokens, features = wba.Grid.from_rule(rule, n), wba.Grid.from_rule(rule, d)
    u_cont = np.asarray(twin(f, tokens, features))
    sd = wba.folded_encoder_state_dict(twin, features)
    enc = wb.architectures.encoder_from_torch(
        sd, num_heads=1, norm_first=True, activation="gelu", layer_norm_eps=0.0
    )
    u0 = f(jnp.asarray(tokens.nodes), jnp.asarray(features.nodes))
    u_disc = np.asarray(enc(u0))
    return {"n": n, "d": d, "max_abs_difference": float(np.max(np.abs(u_cont - u_disc)))}


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    kmodel, kf, kpsi = jax.random.split(jax.random.key(config.seed), 3)
    model = wba.ContinuousTransformer.random(
        key=kmodel,
        num_layers=config.num_layers,
        rank=config.rank,
        max_frequency=config.max_frequency,
        tau=config.tau,
        activation=ACTIVATIONS[config.activation],
        norm=config.norm,
    )
    f = wba.SmoothKernel.random(key=kf, rank=config.rank, max_frequency=config.max_frequency)
    psi = wba.SmoothKernel.random(key=kpsi, rank=2, max_frequency=config.max_frequency)
    pad_to = max(*config.sizes, *config.gauss_sizes, config.reference_size)

    jobs = [(r, refine) for refine in DIRECTIONS for r in config.rules]
    rows = []
    with wb.report.Progress(total=len(jobs) + 2, desc="resolution") as bar:
        for rule_name, refine in jobs:
            rows.append(_ladder(model, f, psi, rule_name, refine, config, pad_to))
            bar.update(1)
        relu_rows = []
        if config.relu_check and config.activation != "relu":
            relu_model = wba.ContinuousTransformer(
                model.layers, tau=model.tau, activation=wb.terms.relu, norm=model.norm
            )
            for rule_name in ("midpoint", "gauss"):
                row = _ladder(relu_model, f, psi, rule_name, "features", config, pad_to)
                row["activation"] = "relu"
                relu_rows.append(row)
        bar.update(1)
        equivalence = _equivalence(model, f, config) if config.norm else None
        bar.update(1)

    if wb.report.have_matplotlib():
        _plot(rows, relu_rows, config, out / "resolution.png")
    return {
        "rows": rows,
        "relu_rows": relu_rows,
        "equivalence": equivalence,
        "probes": list(config.probes),
        "report": _report(rows, relu_rows, equivalence, config),
    }


def _order_text(fit: dict | None) -> str:
    if fit is None:
        return "no fit"
    return f"{fit['order']:.2f} [{fit['ci'][0]:.2f}, {fit['ci'][1]:.2f}]"


def _report(rows, relu_rows, equivalence, config: Config) -> str:
    lines = [
        f"Continuous pre-norm Transformer on [0, 1]², {config.num_layers} layers of Euler steps "
        f"(τ = {config.tau:g}), activation {config.activation}, layer norm "
        f"{'on' if config.norm else 'off'}, kernels of rank {config.rank} with frequencies in "
        f"[1, {config.max_frequency:g}] (smooth, not periodic, not polynomial); float64. Error: "
        f"max |u(T) − u_ref(T)| at the {len(config.probes)}² probe points "
        f"{tuple(config.probes)}² (Nyström values) and |J − J_ref| for J = ∫∫ u(T) ψ. The other "
        f"variable is held on a Gauss grid of {config.fixed_size} nodes; the reference is Gauss "
        f"with {config.reference_size} nodes. Orders: `fit_order` on the spacing h (95 % CI).",
        "",
    ]
    table = []
    for r in rows:
        if r["declared_order"] is None:
            rate = r["decades_per_node"]
            observed = "exponential: " + ("n/a" if rate is None else f"{rate:.2f} decades/node")
            verdict = "—"
        else:
            observed = _order_text(r["fit"])
            verdict = "**pass**" if r["within_tolerance"] else "**FAIL**"
        table.append(
            [
                r["refine"],
                r["rule"],
                "exp." if r["declared_order"] is None else r["declared_order"],
                f"{min(r['sizes'])}–{max(r['sizes'])}",
                f"{r['errors'][0]:.2e} → {r['errors'][-1]:.2e}",
                observed,
                "—" if r["functional_fit"] is None else _order_text(r["functional_fit"]),
                verdict,
            ]
        )
    lines.append(
        wb.report.markdown_table(
            [
                "refined",
                "rule",
                "rule order",
                "sizes",
                "probe error (first → last)",
                "observed order (probes)",
                "order of J",
                f"±{config.tolerance:g}",
            ],
            table,
        )
    )
    lines.append("")
    for r in rows:
        if r["declared_order"] is None:
            errs = ", ".join(f"{m}: {e:.1e}" for m, e in zip(r["sizes"], r["errors"]))
            lines.append(f"- Gauss, {r['refine']} (nodes: error): {errs}.")
    low = [r for r in rows if r["declared_order"] is not None]
    if low:
        ok = all(r["within_tolerance"] for r in low)
        lines.append(
            f"- **Acceptance** (feature- and token-grid refinement at the rule's order "
            f"±{config.tolerance:g}): " + ("**met**" if ok else "**not met**") + "."
        )
    if relu_rows:
        g = next(r for r in relu_rows if r["rule"] == "gauss")
        m = next(r for r in relu_rows if r["rule"] == "midpoint")
        fit = _fit(g["spacings"], g["errors"])
        lines.append(
            "- **ReLU instead of a smooth activation** (feature refinement, same kernels): the "
            "kink of max(h(z), 0) in the hidden variable z keeps midpoint at O(h²) in size but "
            "makes it erratic (the kink moves within its cell as the grid changes; fitted order "
            f"{_order_text(m['fit'])}), and Gauss drops from exponential to algebraic "
            f"convergence: errors {g['errors'][0]:.1e} → {g['errors'][-1]:.1e} over "
            f"{min(g['sizes'])}–{max(g['sizes'])} nodes"
            + ("" if fit is None else f" (log-log slope {fit.order:.2f})")
            + ". A smooth activation (GELU, tanh) is needed for Gauss's rate."
        )
    if equivalence is not None:
        lines.append(
            f"- **Uniform grid = the discrete Transformer**: on midpoint grids (n = "
            f"{equivalence['n']}, d = {equivalence['d']}) the continuous model equals "
            "`encoder_from_torch(norm_first=True, layer_norm_eps=0)` with the folded weights "
            "`diag(w) W(ξ_i, y_j)` (query × scale · w · √d) to max |Δ| = "
            f"{equivalence['max_abs_difference']:.1e}."
        )
    return "\n".join(lines) + "\n"


def _plot(rows, relu_rows, config: Config, path: pathlib.Path) -> None:
    fig, axes = wb.report.new_figure(1, 3, figsize=(15, 4.5))
    floor = 1e-17
    markers = {"midpoint": "o", "trapezoid": "s", "gauss": "^"}
    for ax, refine in zip(axes[:2], DIRECTIONS):
        for r in rows:
            if r["refine"] != refine:
                continue
            if r["declared_order"] is None:
                rate = r["decades_per_node"]
                label = f"{r['rule']}: exponential" + (
                    "" if rate is None else f", {rate:.2f} decades/node"
                )
            else:
                label = f"{r['rule']}: p = " + (
                    "n/a" if r["fit"] is None else f"{r['fit']['order']:.2f}"
                )
            ax.loglog(
                r["sizes"],
                [max(e, floor) for e in r["errors"]],
                markers[r["rule"]] + "-",
                label=label,
            )
        anchor = [r for r in rows if r["refine"] == refine and r["declared_order"] is not None]
        if anchor:
            sizes = np.asarray(anchor[0]["sizes"], float)
            e0 = 0.25 * min(r["errors"][0] for r in anchor)
            ax.loglog(sizes, e0 * (sizes / sizes[0]) ** -2.0, "k:", label="slope −2")
        top = max(e for r in rows if r["refine"] == refine for e in r["errors"])
        ax.set_ylim(top=1e4 * top)  # room for the legend above the curves
        ticks = sorted({*config.sizes, min(config.gauss_sizes)})
        ax.set_xticks(ticks, [str(m) for m in ticks])
        ax.tick_params(axis="x", which="minor", labelbottom=False)
        ax.set_xlabel(f"{'feature' if refine == 'features' else 'token'} grid size")
        ax.set_ylabel("max |u(T) − u_ref(T)| at probes")
        ax.set_title(f"refining {refine} (the other: Gauss {config.fixed_size})")
    for r in rows:
        if r["declared_order"] is None:
            axes[2].semilogy(
                r["sizes"],
                [max(e, floor) for e in r["errors"]],
                "^-",
                label=f"gauss, {r['refine']}, {config.activation}",
            )
    for r in relu_rows:
        if r["rule"] == "gauss":
            axes[2].semilogy(
                r["sizes"],
                [max(e, floor) for e in r["errors"]],
                "v--",
                label="gauss, features, relu (kink)",
            )
    axes[2].set_xlabel("Gauss nodes")
    axes[2].set_ylabel("max |u(T) − u_ref(T)| at probes")
    axes[2].set_title("Gauss–Legendre: exponential for smooth σ")
    for ax, loc in zip(axes, ("upper right", "upper right", "lower left")):
        ax.legend(fontsize=8, loc=loc)
        ax.grid(True, which="both", alpha=0.3)
    wb.report.save_figure(fig, path)
