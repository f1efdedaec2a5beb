"""The trained network against its equation, in float64: the certificate (`wbc.certify`), its
table and words in a report, and the error ladder of a trained model under refinement."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench.analysis as wba
import workbench.control as wbc


def to_float64(tree):
    """The tree with its floating arrays cast to float64 (call inside `jax.enable_x64(True)`)."""
    return jax.tree.map(lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, tree)


def certificate(
    model: wbc.ControlledModel, held_out, examples: int, plan, *, max_spread: float = 0.005
) -> dict:
    """`wbc.certify` of the trained model: its held-out accuracy under refinement (in its own
    dtype, on all of `held_out`) and, in float64 on the first `examples` held-out inputs
    embedded, its error ladder, order, stability and plan check."""
    accuracy = wbc.refinement_accuracy(model, held_out)
    with jax.enable_x64(True):
        m64 = to_float64(model)
        states = jax.vmap(m64.embedding)(jnp.asarray(np.asarray(held_out.inputs[:examples])))
        cert = wbc.certify(
            m64.transformer, states, plan=plan, accuracy=accuracy, max_accuracy_spread=max_spread
        ).to_dict()
    cert["step_unit"] = step_unit(model)
    return cert


def step_unit(model: wbc.ControlledModel) -> str:
    """What a model's step counts count: steps per layer, or steps over the whole depth for
    controls in one piece (a smooth basis such as Legendre)."""
    return "steps per layer" if model.transformer.equation.num_pieces > 1 else "steps in all"


def unit_of(cert: dict) -> str:
    """The certificate's step unit (`step_unit`; certificates written before it: per layer)."""
    return cert.get("step_unit", "steps per layer")


def certificate_artifacts(results: Any) -> dict:
    """`certificate.json`: the trained network against its equation (when computed)."""
    return {} if results.certificate is None else {"certificate.json": results.certificate}


def order_verdict(cert: dict) -> str:
    """The words "as expected", "reduced" or "raised": the certificate's observed order against the
    scheme's, within its `order_tolerance` (a certificate without `order_raised` says only
    whether the order was reduced)."""
    if cert.get("order_reduced"):
        return "reduced"
    return "raised" if cert.get("order_raised") else "as expected"


def certificate_lines(cert: dict | None) -> list[str]:
    """The certificate as a markdown table (no lines without one)."""
    from ..report import markdown_table

    if cert is None:
        return []
    order = "none fitted" if cert["observed_order"] is None else f"{cert['observed_order']:.2f}"
    plan = "no plan" if cert["plan_holds"] is None else str(cert["plan_holds"])
    acc = cert.get("accuracy")
    unit = unit_of(cert)
    rows = [("consistent discretization", consistency_text(cert))]
    if acc is not None:
        rows.append(
            (
                f"held-out accuracy at own / refined {unit}",
                " / ".join(
                    [f"{100 * acc['accuracy']:.2f} % ({acc['steps_per_layer']})"]
                    + [
                        f"{100 * a:.2f} % ({k})"
                        for k, a in zip(acc["refined_steps_per_layer"], acc["refined_accuracies"])
                    ]
                ),
            )
        )
        rows.append(
            (
                f"{acc['second_scheme']} at {acc['second_steps_per_layer']} {unit}",
                f"{100 * acc['second_accuracy']:.2f} %",
            )
        )
        rows.append(
            (
                "accuracy spread (threshold)",
                f"{100 * acc['spread']:.2f} points ({100 * cert['max_accuracy_spread']:.2f})",
            )
        )
        if acc.get("paired"):
            rows.append(paired_row(acc["paired"]))
    rows += [
        ("discretization", f"{cert['scheme']}, {cert['steps_per_layer']} {unit}"),
        ("max-abs error vs Dopri8 reference", f"{cert['error']:.3g}"),
        (
            "observed order (expected)",
            f"{order} ({cert['expected_order']} ± "
            f"{cert.get('order_tolerance', 0.3):g}: {order_verdict(cert)})",
        ),
        (
            "largest stable step (trained step)",
            f"{cert['largest_stable_step']:.3g} ({cert['step']:.3g})",
        ),
        ("plan holds", plan),
    ]
    return [
        "",
        "**Certificate** (float64, the trained weights against their equation):",
        "",
        markdown_table(["quantity", "value"], rows),
    ]


def paired_row(paired: list[dict]) -> tuple[str, str]:
    """The certificate's paired comparisons as one table row: for each refinement (and the second
    scheme) the change of held-out accuracy against the model's own discretization on the same
    examples, in points, with its Newcombe interval and the exact McNemar p-value."""
    confidence = 100 * paired[0]["confidence"]
    cells = [
        f"{p['scheme']} {p['steps_per_layer']}: {p['difference']:+.2f} "
        f"[{p['low']:+.2f}, {p['high']:+.2f}] (p {p['p_value']:.2g})"
        for p in paired
    ]
    return (
        f"paired change vs own, points [{confidence:g} % interval] (McNemar p)",
        " / ".join(cells),
    )


def consistency_text(cert: dict | None) -> str:
    """`consistent` in words: "yes", "no (reasons)", or "not decided"."""
    if cert is None or cert.get("consistent") is None:
        return "not decided (no certificate with held-out accuracies)"
    if cert["consistent"]:
        return "yes"
    return "no: " + "; ".join(cert["reasons"])


def refinement_ladder(
    model: wbc.ControlledModel, inputs, ladder, *, scheme=None, reference_steps: int = 64
) -> dict:
    """How far the trained model's solve is from its equation's exact flow (float64).

    For every input (embedded), the max-abs error of the state at `T` with `scheme` (default: the
    model's) at each `ladder` entry of steps per layer, against a Dopri8 reference with
    `reference_steps` per layer; the worst input per entry, and `fit_order` on them.
    **Returns:** `{"steps_per_layer", "errors", "observed_order", "order_ci"}` (order `None` when
    no window fits)."""
    with jax.enable_x64(True):
        m64 = to_float64(model)
        tr = m64.transformer
        scheme = tr.scheme if scheme is None else scheme
        states = jax.vmap(m64.embedding)(jnp.asarray(np.asarray(inputs), jnp.float64))
        steps = sorted(int(s) for s in ladder)
        errors = np.zeros(len(steps))
        for u0 in states:
            ref = wba.reference_solution(tr.equation, u0, steps_per_layer=reference_steps)
            lad = wba.error_ladder(tr.equation, u0, scheme, steps, ref, min_points=1, repeats=1)
            errors = np.maximum(errors, lad.errors)
        h = tr.equation.piece_length / np.asarray(steps, float)
        fit = wba.fit_order(h, errors, expected=scheme.order(), throw=False)
        fit = fit if fit.success else None
    return {
        "steps_per_layer": steps,
        "errors": errors,
        "observed_order": None if fit is None else float(fit.order),
        "order_ci": None if fit is None else (float(fit.ci_low), float(fit.ci_high)),
    }
