"""Is the network trained in continuous depth a discretization of its equation in the sense of
numerical analysis, where the network trained at one Lie step per layer is not? The analyses of
the workbench applied to both trained digits networks: observed orders, Jacobian spectra over
the stability region of the trained step, Lyapunov exponents of the layer maps against the
refined flow's, and the discretization plan each needs.

Networks (`recipes`, each a `train-digits` run folder in `DIR/<recipe>/`, as in
`continuous-depth`, whose folders can be copied in): `one-step` (one Lie step per layer, no
running cost) and `multi-resolution` (steps per layer drawn from `resolutions` for every batch,
kinetic cost λ_K = `kinetic`; `train-digits`' default). Both keep one Lie step per layer as their
own discretization. Everything below is float64, on the first `certificate_examples` held-out
images embedded by the trained embedding (spectra and Lyapunov exponents on the first).

- **Orders**: the certificate (`wbc.certify`) of the network at its own scheme and of the same
  controls solved by Strang: error at one step per layer against a Dopri8 reference, the
  observed order of the ladder 1–16 steps per layer (`fit_order`, order reduction flagged).
- **Spectra**: all eigenvalues of the Jacobian of the full field at the state entering every
  layer along the network's own trajectory, scaled by the trained step `h` and set against the
  stability region of the trained scheme (`wb.analysis.stability_function`; for a splitting the
  commuting-operator estimate): the share of decaying modes with `|R(hλ)| > 1`, and the largest
  stable step `τ*` against `h`.
- **Lyapunov exponents** (`wb.analysis.lyapunov_exponents`, QR method, the `num_exponents`
  largest): of the trained layer maps (one step per layer) and of the same layers solved with
  `fine_factor` steps each; a discretization of a flow has the flow's exponents.
- **Plan** (`workbench run plan --weights <recipe folder>`): the cheapest of `plan_methods` that
  meets `tolerance` (max-abs at T) and the steps per layer every candidate needs.

The question: is the multi-resolution network faithful (an observed order at its own scheme
with no order reduction, and Lyapunov exponents of its layer maps within `lyapunov_tolerance`
of the refined flow's) where the one-step network is not? The spectra are measured and reported,
not judged: attention's Jacobian has nearly imaginary modes, outside the region of an explicit
one-step method at every step size (τ* shrinks with their decay rate), so "every decaying mode
inside" holds for no trained network; the Lyapunov exponents measure what those modes do to the
nonlinear layer maps.

Figures: `spectra` (hλ over the stability region, one panel per network), `lyapunov` (the
exponents of the trained layer maps against the refined flow's).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wa
import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_positive, check_seed
from studies._toolkit.fields import (
    Costs,
    Epochs,
    Method,
    Smoothness,
    TrainingFields,
    WeightDecay,
    defaults,
)
from studies.numerics import plan as P
from studies.training import continuous_depth as CD, train_digits

NAME = "trained-model-analysis"
SUMMARY = (
    "The one-step and the continuous-depth digits networks under the analyses: orders, "
    "Jacobian spectra over the stability region, Lyapunov exponents, plans."
)


@dataclasses.dataclass(frozen=True)
@defaults(kinetic=0.05, smoothness=0.1, epochs=60)
class Config(Method, Costs, Smoothness, Epochs, WeightDecay, TrainingFields):
    resolutions: tuple[int, ...] = (1, 2, 4)
    """Steps per layer drawn (uniformly) for each batch by the multi-resolution recipe."""
    coarsen: tuple[int, ...] = (2,)
    """Depth factors of the multi-resolution recipe's coarse-basis draws (`train-digits
    --coarsen`; '' for none)."""
    coarse_weight: float = 1.0
    """The weight of each coarse-basis draw against one step count (`train-digits
    --coarse-weight`; 1: every draw equally likely)."""
    recipes: tuple[str, ...] = ("one-step", "multi-resolution")
    """Trained networks analysed (recipes of `continuous-depth`)."""
    num_exponents: int = 8
    """Largest Lyapunov exponents computed (the QR frame's columns)."""
    fine_factor: int = 16
    """Steps per layer of the refined flow, as a multiple of the network's own."""
    lyapunov_tolerance: float = 0.1
    """Largest |λ_i(layer maps) − λ_i(refined flow)| for which the layer maps count as the
    flow's."""
    tolerance: float = 1e-3
    """The plan's max-abs error at T."""
    plan_methods: tuple[str, ...] = ("lie", "strang", "yoshida4", "rk4", "dopri5")
    """The plan's candidates (names of `wb.registry.METHODS`)."""

    def __post_init__(self):
        T.check_training_fields(self)
        check_seed(self)
        check_positive(
            self, "epochs", "num_exponents", "fine_factor", "lyapunov_tolerance", "tolerance"
        )
        check(
            self,
            "recipes",
            len(self.recipes) >= 1
            and set(self.recipes) <= set(CD.RECIPES)
            and len(set(self.recipes)) == len(self.recipes),
            f"distinct names of {', '.join(CD.RECIPES)}",
        )
        check(self, "fine_factor", self.fine_factor >= 2, "an integer >= 2")
        check(
            self,
            "certificate_examples",
            self.certificate_examples >= 1,
            "an integer >= 1 (the analyses run on that many held-out images)",
        )
        check(self, "batch_size", self.batch_size <= 1347, "at most 1347 (the training split)")
        T.check_resolutions(self)
        T.check_coarsen(self)
        P.Config(tolerance=self.tolerance, methods=self.plan_methods)  # the plan's own checks

    def digits_config(self, recipe: str) -> train_digits.Config:
        """The `train-digits` config of one recipe."""
        return CD.recipe_config(self, recipe)

    def estimated_peak_bytes(self) -> int:
        """The largest of the recipes' `train-digits` peaks and of the analyses' dense Jacobian
        (`N = n · d` unknowns, its `N × N` matrix and eigendecomposition, about `10 · N²`
        float64, n = 17 tokens of the patch embedding)."""
        from studies._toolkit import memory as M

        train = max(self.digits_config(r).estimated_peak_bytes() for r in self.recipes)
        size = 17 * self.d
        return max(train, M.array_bytes(10, size, size))


run_identity = T.fingerprint
"""What makes two runs of this study the same run: the fields that decide the trained
trajectories (not the analyses' fields)."""


def smoke_config() -> Config:
    return Config(
        epochs=6,
        d=16,
        num_heads=2,
        num_layers=2,
        hidden=32,
        warmup=10,
        checkpoint_every=50,
        certificate_examples=1,
        max_spread=0.05,
        target_accuracy=0.5,
        num_exponents=4,
        tolerance=1e-2,
        plan_methods=("lie", "rk4"),
    )


@dataclasses.dataclass
class Results:
    config: Config
    networks: list
    """One dict per recipe: `scheme` (its training scheme's name), `accuracy`, `spread`, `consistent` (the training certificate);
    `orders` (per scheme: `error`, `observed_order`, `expected_order`, `order_reduced`);
    `step`, `layers` (per layer: `spectral_radius`, `max_real`, `num_decaying`,
    `outside_fraction`, `largest_stable_step`), `eigenvalues_real` / `_imag` (per layer);
    `lyapunov_own`, `lyapunov_fine`, `lyapunov_difference`; `plan` (the plan's dict or None)
    and `plan_candidates` (method, steps per layer, evaluations, measured error, meets)."""
    wall_time_s: float


def layer_maps(transformer, steps_per_layer: int) -> list:
    """The layer maps `u ↦ u(l + 1)` of `transformer`'s equation solved by its scheme with
    `steps_per_layer` steps in each layer."""

    def step(local, u):
        return wb.integrate(local, u, transformer.scheme, num_steps=steps_per_layer, throw=False).u1

    eq = transformer.equation
    return [jax.tree_util.Partial(step, eq.localize(i)) for i in range(eq.num_pieces)]


def spectra(transformer, u0) -> list[np.ndarray]:
    """All eigenvalues of the full field's Jacobian at the state entering every layer, along
    the network's own trajectory."""
    eq = transformer.equation
    states = wa.layer_inputs(transformer, u0)
    return [
        wa.jacobian_spectrum(wa.term_fields(eq, i + 0.5)["full"], u) for i, u in enumerate(states)
    ]


def _layer_row(eigs: np.ndarray, scheme, h: float) -> dict:
    cutoff = 1e-8 * max(1.0, float(np.abs(eigs).max()))
    decaying = eigs[eigs.real < -cutoff]
    region = wa.stability_function(scheme)
    outside = np.abs(region(h * decaying)) > 1 + 1e-12
    return {
        "spectral_radius": float(np.abs(eigs).max()),
        "max_real": float(eigs.real.max()),
        "num_decaying": int(decaying.size),
        "outside_fraction": float(outside.mean()) if decaying.size else 0.0,
        "largest_stable_step": float(wa.max_stable_step(scheme, decaying)),
    }


def _order(transformer, states, name: str) -> dict:
    cert = wbc.certify(transformer, states)
    return {
        "scheme": name,
        "error": float(cert.error),
        "observed_order": cert.observed_order,
        "expected_order": int(cert.expected_order),
        "order_reduced": bool(cert.order_reduced),
        "ladder_errors": list(map(float, cert.ladder_errors)),
    }


def _plan(config: Config, folder) -> tuple[dict | None, list]:
    if folder is None:
        return None, []
    r = P.compute(
        P.Config(weights=str(folder), tolerance=config.tolerance, methods=config.plan_methods)
    )
    rows = [
        {
            "method": c.method,
            "steps_per_layer": c.steps_per_layer,
            "evaluations": c.evaluations,
            "measured_error": c.measured_error,
            "meets": bool(c.meets_tolerance),
            "over_cap": bool(c.over_cap),
            "predicted_steps_per_layer": int(c.predicted_steps_per_layer),
        }
        for c in r.candidates
    ]
    return r.plan, rows


def _network(config: Config, recipe: str, run_dir) -> dict:
    folder = T.subfolder(run_dir, recipe)
    results, trained = train_digits.train(config.digits_config(recipe), run_dir=folder)
    model, cert = trained.model, results.certificate
    task = wbc.digits(config.seed)
    with jax.enable_x64(True):
        m64 = T.to_float64(model)
        tr = m64.transformer
        xs = jnp.asarray(np.asarray(task.test.inputs[: config.certificate_examples]))
        states = jax.vmap(m64.embedding)(xs)
        own = type(tr.scheme).__name__
        second = (
            wb.schemes.LieTrotter()
            if isinstance(tr.scheme, wb.schemes.Strang)
            else wb.schemes.Strang()
        )
        orders = [
            _order(tr, states, own),
            _order(tr.rediscretize(second, tr.steps_per_layer), states, type(second).__name__),
        ]
        u0 = states[0]
        eigs = spectra(tr, u0)
        h = float(tr.equation.piece_length) / tr.steps_per_layer
        layers = [_layer_row(e, tr.scheme, h) for e in eigs]
        k = min(config.num_exponents, u0.size)
        lam_own, _ = wa.lyapunov_exponents(layer_maps(tr, tr.steps_per_layer), u0, num_exponents=k)
        lam_fine, _ = wa.lyapunov_exponents(
            layer_maps(tr, config.fine_factor * tr.steps_per_layer), u0, num_exponents=k
        )
    plan, candidates = _plan(config, folder)
    return {
        "recipe": recipe,
        "scheme": config.digits_config(recipe).scheme,
        "accuracy": float(results.test_accuracy),
        "spread": None if cert is None else float(cert["accuracy"]["spread"]),
        "consistent": None if cert is None else bool(cert["consistent"]),
        "orders": orders,
        "step": h,
        "layers": layers,
        "eigenvalues_real": [np.asarray(e.real) for e in eigs],
        "eigenvalues_imag": [np.asarray(e.imag) for e in eigs],
        "lyapunov_own": np.asarray(lam_own),
        "lyapunov_fine": np.asarray(lam_fine),
        "lyapunov_difference": float(np.max(np.abs(lam_own - lam_fine))),
        "plan": plan,
        "plan_candidates": candidates,
    }


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    with jax.enable_x64(False):
        networks = [_network(config, recipe, run_dir) for recipe in config.recipes]
    return Results(config=config, networks=networks, wall_time_s=time.perf_counter() - start)


def faithful(config: Config, net: dict) -> list[str]:
    """Why `net` is not a faithful discretization of its equation (empty when it is)."""
    own = net["orders"][0]
    why = []
    if own["observed_order"] is None or own["order_reduced"]:
        order = "none fitted" if own["observed_order"] is None else f"{own['observed_order']:.2f}"
        why.append(f"observed order {order} < {own['expected_order']} − 0.3")
    if net["lyapunov_difference"] > config.lyapunov_tolerance:
        why.append(
            f"Lyapunov exponents {net['lyapunov_difference']:.4f} from the refined "
            f"flow's (> {config.lyapunov_tolerance:g})"
        )
    return why


def verdict(results: Results) -> str:
    c = results.config
    parts, reasons = [], {}
    for net in results.networks:
        why = faithful(c, net)
        reasons[net["recipe"]] = why
        own = net["orders"][0]
        order = "n/a" if own["observed_order"] is None else f"{own['observed_order']:.2f}"
        parts.append(
            f"{net['recipe']}: order {order} (expected {own['expected_order']}), "
            f"Lyapunov gap {net['lyapunov_difference']:.4f}, "
            + ("faithful" if not why else "not faithful: " + "; ".join(why))
        )
    detail = ". ".join(parts)
    if "multi-resolution" not in reasons:
        return f"No answer: the multi-resolution network was not analysed ({detail})."
    if reasons["multi-resolution"]:
        answer = "No"
    elif not reasons.get("one-step", ["not analysed"]):
        answer = "Partly (the one-step network passes too)"
    else:
        answer = "Yes"
    return f"{answer}. {detail}."


def _plan_cell(row: dict | None) -> str:
    if row is None:
        return "n/a"
    if row["over_cap"]:
        return f"over the cap (predicted {row['predicted_steps_per_layer']})"
    if row["steps_per_layer"] is None or not row["meets"]:
        return "misses it"
    return f"{row['steps_per_layer']} ({row['evaluations']} evals)"


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    r, c = results, results.config
    lines = [
        f"Digits, {c.d}-wide pre-norm equation, {c.num_layers} layers, {c.epochs} epochs, seed "
        f"{c.seed}; float64 analyses on {c.certificate_examples} held-out image(s).",
        "",
    ]
    head = [
        "network",
        "held-out accuracy",
        "spread",
        "scheme",
        "error at own step",
        "observed order (expected)",
        "order reduced",
    ]
    rows = []
    for net in r.networks:
        for o in net["orders"]:
            order = "none" if o["observed_order"] is None else f"{o['observed_order']:.2f}"
            rows.append(
                (
                    net["recipe"],
                    f"{100 * net['accuracy']:.2f} %",
                    "n/a" if net["spread"] is None else f"{100 * net['spread']:.2f}",
                    o["scheme"],
                    f"{o['error']:.3g}",
                    f"{order} ({o['expected_order']})",
                    str(o["order_reduced"]),
                )
            )
    lines += [
        "Orders (error against Dopri8 at T, ladder 1–16 steps per layer):",
        "",
        markdown_table(head, rows),
        "",
    ]
    head = [
        "network",
        "layer",
        "spectral radius",
        "max Re λ",
        "decaying modes",
        "outside the region at h",
        "τ* (h)",
    ]
    rows = []
    for net in r.networks:
        for i, x in enumerate(net["layers"]):
            rows.append(
                (
                    net["recipe"],
                    str(i),
                    f"{x['spectral_radius']:.3g}",
                    f"{x['max_real']:.3g}",
                    str(x["num_decaying"]),
                    f"{100 * x['outside_fraction']:.1f} %",
                    f"{x['largest_stable_step']:.3g} ({net['step']:g})",
                )
            )
    lines += [
        "Jacobian spectra of the full field entering each layer:",
        "",
        markdown_table(head, rows),
        "",
    ]
    head = [
        "network",
        f"largest {c.num_exponents} exponents: layer maps",
        f"refined flow ({c.fine_factor}× steps)",
        "largest difference",
    ]
    rows = [
        (
            net["recipe"],
            ", ".join(f"{v:.3f}" for v in net["lyapunov_own"]),
            ", ".join(f"{v:.3f}" for v in net["lyapunov_fine"]),
            f"{net['lyapunov_difference']:.3f}",
        )
        for net in r.networks
    ]
    lines += ["Lyapunov exponents (per layer):", "", markdown_table(head, rows), ""]
    head = ["network", "plan", *c.plan_methods]
    rows = []
    for net in r.networks:
        by = {x["method"]: x for x in net["plan_candidates"]}
        best = net["plan"]
        rows.append(
            (
                net["recipe"],
                "no run folder"
                if not by
                else "none meets it"
                if best is None
                else f"{best['method']}, {best['steps_per_layer']} steps/layer",
                *(_plan_cell(by.get(m)) for m in c.plan_methods),
            )
        )
    lines += [
        f"The plan for tolerance {c.tolerance:g} (steps per layer each method needs):",
        "",
        markdown_table(head, rows),
        "",
        f"Wall time {r.wall_time_s:.0f} s.",
    ]
    return "\n".join(lines)


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    r = results
    n = len(r.networks)
    fig, axes = new_figure(1, n, figsize=(5.2 * n, 4.4), squeeze=False)
    for ax, net in zip(axes[0], r.networks):
        h = net["step"]
        re = np.concatenate(net["eigenvalues_real"]) * h
        im = np.concatenate(net["eigenvalues_imag"]) * h
        span = max(2.5, 1.1 * float(np.max(np.abs(re + 1j * im))))
        x, y = np.meshgrid(np.linspace(-span, span / 2, 300), np.linspace(-span, span, 300))
        scheme = wb.registry.SPLITTING_SCHEMES[net["scheme"]]
        ax.contour(
            x,
            y,
            np.abs(wa.stability_function(scheme)(x + 1j * y)),
            levels=[1.0],
            colors="k",
            linewidths=1,
        )
        ax.plot(re, im, ".", ms=2, alpha=0.5)
        ax.set(xlabel="Re hλ", ylabel="Im hλ", title=f"{net['recipe']}: hλ and |R| = 1")
        ax.grid(True, alpha=0.3)
    fig2, ax2 = new_figure(figsize=(6, 4.2))
    for i, net in enumerate(r.networks):
        k = np.arange(1, len(net["lyapunov_own"]) + 1)
        ax2.plot(k, net["lyapunov_own"], "o-", color=f"C{i}", label=f"{net['recipe']}: layers")
        ax2.plot(
            k, net["lyapunov_fine"], "x--", color=f"C{i}", label=f"{net['recipe']}: refined flow"
        )
    ax2.set(
        xlabel="index i",
        ylabel="Lyapunov exponent λ_i (per layer)",
        title="trained layer maps against the refined flow",
    )
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    return {"spectra": fig, "lyapunov": fig2}
