"""Which training makes a Transformer a discretization of its equation? Training recipes side by
side on the digits task: held-out accuracy when the trained controls are solved with 1, 2, 4,
8 and 16 steps per layer and with a second scheme, training time, the observed order of each
trained network against its equation, and what the continuous-depth network allows at inference:
fewer steps (compression) and adaptive steps.

Recipes (`recipes`; each is `train-digits` with these fields, the rest of the config shared):

- `one-step` — the usual networks: every batch at one Lie–Trotter step per layer, no running or
  smoothness cost (`--depth fixed --kinetic 0 --smoothness 0`);
- `multi-resolution` — every batch solved with k steps per layer drawn from `resolutions`, or
  on the controls projected onto `1/f` of the layers for `f` in `coarsen`
  (`wbc.MultiResolution`), the kinetic cost λ_K = `kinetic` and the smoothness cost in depth
  λ_s = `smoothness` (`train-digits`' default);
- `one-step-kinetic` — one step per layer with λ_K = `kinetic` (the cost alone, λ_s = 0);
- `strang` — one Strang step per layer (FFN½–attention–FFN½, Macaron's layout), no running or
  smoothness cost.

Every trained model keeps its training scheme with one step per layer as its own
discretization. For each: `wbc.refinement_accuracy` (accuracy at its own discretization, at 2–16×
its steps, and with the other scheme at 16×) and its spread, the certificate (float64, on
`certificate_examples` held-out images: observed order, `consistent`), and

- **compression** (warm, measured in interleaved rounds, `timing_repeats` of them): the
  network solved with 2 steps per layer against 1 step
  (half the steps: accuracy lost and time ratio), and `wbc.coarsen_depth(model, 2)` (half the
  layers' basis, each coarse layer one step of twice the size) against the model at its own
  discretization;
- **adaptive inference**: `wbc.adaptive_accuracy` (each of `adaptive_solvers`, Heun and Bosh3
  by default, with a PID controller at each of `tolerances`): accuracy and field evaluations per
  example (mean, spread), against the fixed Lie grids of k steps per layer (k · L evaluations):
  the cheapest fixed grid within `adaptive_margin` points of the 16× grid, and the cheapest
  adaptive solve (solver and tolerance) that is too. A solve whose every step is the whole layer
  (a spread of 0 evaluations at the solver's per-layer cost) is that solver on a fixed grid of
  one step per layer: the report says so, since then the saving comes from the solver's order
  on the unsplit field, not from adapting the step.

The question: is the `multi-resolution` network accurate (`target_accuracy`) and consistent
(every refinement and the second scheme within `max_spread` of its own accuracy, no order
reduction) where the `one-step` network is not? The compression and adaptive lines state their
own measured answers.

Durable: every training checkpoints into its own subfolder (`<recipe>/`, a `train-digits` run
folder: `wbc.load_run` and `--weights` read it) and resumes.

Figures: `refinement` (held-out accuracy against steps per layer, one line per recipe, the
second scheme at 16× as a marker), `adaptive` (accuracy against mean field evaluations: fixed
grids and adaptive tolerances, per recipe).
"""

from __future__ import annotations

import dataclasses
import math
import time

import diffrax
import jax
import jax.numpy as jnp
import numpy as np

import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_choices, check_nonempty, check_positive, check_seed
from studies._toolkit.fields import (
    Costs,
    Epochs,
    Method,
    Smoothness,
    TrainingFields,
    WeightDecay,
    defaults,
)
from studies.training import train_digits
from workbench.registry import ODE_SOLVERS

NAME = "continuous-depth"
SUMMARY = (
    "Training recipes side by side: accuracy under refinement, orders, compression and "
    "adaptive inference of the trained networks."
)

RECIPES = {
    "one-step": {"depth": "fixed", "kinetic": 0.0, "smoothness": 0.0, "coarsen": ()},
    "multi-resolution": {"depth": "multi-resolution"},
    "one-step-kinetic": {"depth": "fixed", "smoothness": 0.0, "coarsen": ()},
    "strang": {
        "depth": "fixed",
        "kinetic": 0.0,
        "smoothness": 0.0,
        "scheme": "strang",
        "coarsen": (),
    },
}
"""Recipe name -> the `train-digits` fields it sets (the others come from the config)."""


def recipe_config(config, recipe: str) -> train_digits.Config:
    """The `train-digits` config of one recipe: the fields `config` shares with `train-digits`,
    then the recipe's (`RECIPES`)."""
    names = {f.name for f in dataclasses.fields(train_digits.Config)}
    shared = {k: v for k, v in dataclasses.asdict(config).items() if k in names}
    return train_digits.Config(**{**shared, **RECIPES[recipe]})


ADAPTIVE_SOLVERS = tuple(
    name
    for name, solver in ODE_SOLVERS.items()
    if isinstance(solver, diffrax.AbstractAdaptiveSolver)
)
"""Names of `workbench.registry.ODE_SOLVERS` with an error estimate (`adaptive_solvers`)."""

FACTORS = (1, 2, 4, 8, 16)
"""Steps per layer, as multiples of the model's own, at which every model is evaluated."""


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
    """Trainings compared: one-step, multi-resolution, one-step-kinetic, strang."""
    tolerances: tuple[float, ...] = (1e-1, 1e-2, 1e-3)
    """rtol = atol of the adaptive solves (PID controller)."""
    adaptive_solvers: tuple[str, ...] = ("heun", "bosh3")
    """diffrax solvers of the adaptive solves, by name (`workbench.registry.ODE_SOLVERS` with an
    error estimate: heun, midpoint, ralston, bosh3, rk4, tsit5, dopri5, dopri8)."""
    adaptive_margin: float = 0.003
    """Accuracy (a fraction) within which a grid counts as accurate as the 16× grid."""
    timing_repeats: int = 15
    """Warm rounds of the timed held-out solves (each round runs every compared model once; the
    median is reported)."""

    def __post_init__(self):
        T.check_training_fields(self)
        check_seed(self)
        check_positive(self, "epochs", "timing_repeats", "adaptive_margin")
        check(
            self,
            "recipes",
            len(self.recipes) >= 1
            and set(self.recipes) <= set(RECIPES)
            and len(set(self.recipes)) == len(self.recipes),
            f"distinct names of {', '.join(RECIPES)}",
        )
        check(
            self,
            "tolerances",
            len(self.tolerances) >= 1
            and all(isinstance(t, (int, float)) and 0 < t < 1 for t in self.tolerances),
            "numbers in (0, 1)",
        )
        check_nonempty(self, "adaptive_solvers")
        check_choices(self, "adaptive_solvers", ADAPTIVE_SOLVERS)
        check(
            self,
            "adaptive_solvers",
            len(set(self.adaptive_solvers)) == len(self.adaptive_solvers),
            "distinct names",
        )
        check(
            self,
            "num_layers",
            self.num_layers % 2 == 0,
            "an even number (the compression halves the layers)",
        )
        check(
            self,
            "steps_per_layer",
            self.steps_per_layer == 1,
            "1 (every recipe's network keeps one step per layer as its own)",
        )
        check(self, "batch_size", self.batch_size <= 1347, "at most 1347 (the training split)")
        T.check_resolutions(self)
        T.check_coarsen(self)

    def digits_config(self, recipe: str) -> train_digits.Config:
        """The `train-digits` config of one recipe."""
        return recipe_config(self, recipe)

    def estimated_peak_bytes(self) -> int:
        """The largest of the recipes' `train-digits` peaks (trained one after the other)."""
        return max(self.digits_config(r).estimated_peak_bytes() for r in self.recipes)


run_identity = T.fingerprint
"""What makes two runs of this study the same run: the fields that decide the trained
trajectories (not `tolerances`, `adaptive_solvers`, `adaptive_margin`, `timing_repeats` or
the certificate's)."""


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
        tolerances=(1e-1, 1e-2),
        timing_repeats=3,
    )


@dataclasses.dataclass
class Results:
    config: Config
    accuracy: np.ndarray
    """(recipe, factor): held-out accuracy at `FACTORS[f]` steps per layer (training scheme)."""
    second_scheme: list
    """(recipe,): the other scheme's name (Strang for Lie, Lie for Strang)."""
    second_accuracy: np.ndarray
    """(recipe,): held-out accuracy with the second scheme at 16 steps per layer."""
    spread: np.ndarray
    """(recipe,): largest distance of the refined and second-scheme accuracies from the own."""
    consistent: np.ndarray
    """(recipe,): the certificate's `consistent` (NaN without a certificate)."""
    observed_order: np.ndarray
    """(recipe,): the certificate's observed order of the error against the fine reference."""
    expected_order: np.ndarray
    training_time_s: np.ndarray
    """(recipe,): cumulative training seconds of each run plus its first step's compilation."""
    compression: list
    """(recipe,): dicts: half steps (2 → 1 step per layer) and half basis (`coarsen_depth`):
    accuracies, median seconds of the held-out solve, time ratios, and the held-out images
    lost and gained with their exact McNemar p-value (`mcnemar_p`)."""
    adaptive: list
    """(recipe,): dicts: per solver and tolerance the `AdaptiveAccuracy.to_dict()` (with
    `whole_layer_steps`: every step was the whole layer); fixed-grid evaluations and
    accuracies; the cheapest equally accurate fixed grid and adaptive solve."""
    wall_time_s: float


def mcnemar_p(lost: int, gained: int) -> float:
    r"""Exact two-sided McNemar p-value of a paired comparison: `lost` examples right before and
    wrong after, `gained` the reverse. Under "no change" each of the `n = lost + gained`
    discordant examples falls either way with probability 1/2, so
    $p = \min(1, 2 \sum_{i \le \min(lost, gained)} \binom{n}{i} 2^{-n})$ (1 when `n = 0`)."""
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(lost, gained) + 1))
    return min(1.0, 2 * tail / 2**n)


def _paired(before, after, test) -> dict:
    """Images the logits `before` classify right and `after` wrong (`images_lost`), the
    reverse (`images_gained`), and their exact McNemar p-value: whether the accuracy lost is
    more than the held-out set can resolve."""
    ys = np.asarray(test.targets)
    b, a = (np.argmax(logits, -1) == ys for logits in (before, after))
    lost, gained = int(np.sum(b & ~a)), int(np.sum(~b & a))
    return {"images_lost": lost, "images_gained": gained, "mcnemar_p": mcnemar_p(lost, gained)}


def _compression(model, test, repeats: int) -> dict:
    xs = jnp.asarray(test.inputs)
    two, one = model.rediscretize(None, 2), model.rediscretize(None, 1)
    coarse = wbc.coarsen_depth(model.rediscretize(None, 1), 2)
    # The timed solves' own outputs give the paired comparisons (no program compiled again).
    (t2, t1, tc), (l2, l1, lc) = T.solve_seconds_side_by_side(
        (two, one, coarse), xs, repeats, outputs=True
    )
    a2, a1, ac = (wbc.evaluate(m, test) for m in (two, one, coarse))
    return {
        "half_steps": {
            "from_steps_per_layer": 2,
            "to_steps_per_layer": 1,
            "accuracy_from": a2,
            "accuracy_to": a1,
            "points_lost": 100 * (a2 - a1),
            "seconds_from": t2,
            "seconds_to": t1,
            "speedup": t2 / t1,
            **_paired(l2, l1, test),
        },
        "half_basis": {
            "layers_from": model.transformer.num_layers,
            "layers_to": coarse.transformer.num_layers,
            "accuracy_from": a1,
            "accuracy_to": ac,
            "points_lost": 100 * (a1 - ac),
            "seconds_from": t1,
            "seconds_to": tc,
            "speedup": t1 / tc,
            **_paired(l1, lc, test),
        },
    }


def _whole_layer_evaluations(solver, layers: int) -> int | None:
    """Field evaluations of one step per layer on every layer (each layer's first step pays
    every stage, FSAL or not): the solver on a fixed grid of one step per layer; None for a
    solver without a Butcher tableau."""
    tableau = getattr(solver, "tableau", None)
    return None if tableau is None else layers * (len(tableau.c) + 1)


def _adaptive(
    model, test, accuracy_by_factor, tolerances, margin: float, solvers=("heun", "bosh3")
) -> dict:
    layers = model.transformer.num_layers
    fixed_evals = [k * layers for k in FACTORS]  # Lie: each operator once per step
    reference = accuracy_by_factor[-1]
    ok = [i for i, a in enumerate(accuracy_by_factor) if abs(a - reference) <= margin]
    cheapest_fixed = fixed_evals[min(ok)] if ok else None
    runs = []
    for name in solvers:
        solver = ODE_SOLVERS[name]
        whole = _whole_layer_evaluations(solver, layers)
        for t in tolerances:
            run = wbc.adaptive_accuracy(model, test, solver=solver, rtol=t, atol=t).to_dict()
            run["whole_layer_steps"] = bool(
                run["min_evaluations"] == run["max_evaluations"] == whole
            )
            runs.append(run)
    good = [r for r in runs if abs(r["accuracy"] - reference) <= margin]
    best = min(good, key=lambda r: r["mean_evaluations"]) if good else None
    ratio = (
        best["mean_evaluations"] / cheapest_fixed if best is not None and cheapest_fixed else None
    )
    return {
        "runs": runs,
        "fixed_steps_per_layer": list(FACTORS),
        "fixed_evaluations": fixed_evals,
        "fixed_accuracy": list(map(float, accuracy_by_factor)),
        "reference_accuracy": float(reference),
        "cheapest_fixed_evaluations": cheapest_fixed,
        "cheapest_adaptive": best,
        "evaluations_ratio": ratio,
    }


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    rows = {
        k: []
        for k in (
            "acc",
            "second",
            "names",
            "spread",
            "consistent",
            "order",
            "expected",
            "time",
            "compression",
            "adaptive",
        )
    }
    with jax.enable_x64(False):
        task = wbc.digits(config.seed)
        for recipe in config.recipes:
            results, trained = train_digits.train(
                config.digits_config(recipe), run_dir=T.subfolder(run_dir, recipe)
            )
            model = trained.model
            cert = results.certificate or {}
            refined = cert.get("accuracy") or dataclasses.asdict(
                wbc.refinement_accuracy(model, task.test)
            )
            acc = [refined["accuracy"], *refined["refined_accuracies"]]
            rows["acc"].append(acc)
            rows["names"].append(refined["second_scheme"])
            rows["second"].append(refined["second_accuracy"])
            rows["spread"].append(refined["spread"])
            rows["consistent"].append(float(cert["consistent"]) if cert else np.nan)
            order = cert.get("observed_order")
            rows["order"].append(np.nan if order is None else order)
            rows["expected"].append(model.transformer.expected_order)
            rows["time"].append(T.training_seconds(trained, results))
            rows["compression"].append(_compression(model, task.test, config.timing_repeats))
            rows["adaptive"].append(
                _adaptive(
                    model,
                    task.test,
                    acc,
                    config.tolerances,
                    config.adaptive_margin,
                    config.adaptive_solvers,
                )
            )
    return Results(
        config=config,
        accuracy=np.asarray(rows["acc"], float),
        second_scheme=rows["names"],
        second_accuracy=np.asarray(rows["second"], float),
        spread=np.asarray(rows["spread"], float),
        consistent=np.asarray(rows["consistent"], float),
        observed_order=np.asarray(rows["order"], float),
        expected_order=np.asarray(rows["expected"], float),
        training_time_s=np.asarray(rows["time"], float),
        compression=rows["compression"],
        adaptive=rows["adaptive"],
        wall_time_s=time.perf_counter() - start,
    )


def _faithful(r: Results, i: int) -> bool:
    c = r.config
    return bool(
        r.accuracy[i, 0] >= c.target_accuracy
        and r.spread[i] <= c.max_spread
        and r.consistent[i] == 1.0
    )


def verdict(results: Results) -> str:
    r, c = results, results.config
    parts = []
    for i, name in enumerate(c.recipes):
        parts.append(
            f"{name}: {100 * r.accuracy[i, 0]:.2f} % at its own discretization, spread "
            f"{100 * r.spread[i]:.2f} points, "
            + ("consistent" if r.consistent[i] == 1.0 else "not consistent")
        )
    detail = "; ".join(parts)
    if "multi-resolution" not in c.recipes:
        return f"No answer: the multi-resolution recipe was not trained ({detail})."
    mr = c.recipes.index("multi-resolution")
    others = [i for i, n in enumerate(c.recipes) if n == "one-step"]
    if not _faithful(r, mr):
        answer = "No"
    elif others and _faithful(r, others[0]):
        answer = "Partly (the one-step network is consistent too)"
    else:
        answer = "Yes"
    return (
        f"{answer}. Target ≥ {100 * c.target_accuracy:.1f} % and spread ≤ "
        f"{100 * c.max_spread:.2f} points: {detail}."
    )


def _discordant(d: dict) -> str:
    if "images_lost" not in d:  # a results.json without the counts
        return "n/a"
    return f"{d['images_lost']} / {d['images_gained']} ({d['mcnemar_p']:.3g})"


def _fmt(x, spec=".2f", none="n/a") -> str:
    return none if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    r, c = results, results.config
    head = [
        "recipe",
        *(f"{k}×" for k in FACTORS),
        "second scheme at 16×",
        "spread (points)",
        "consistent",
        "observed order (expected)",
        "training time",
    ]
    rows = []
    for i, name in enumerate(c.recipes):
        rows.append(
            (
                name,
                *(f"{100 * a:.2f} %" for a in r.accuracy[i]),
                f"{r.second_scheme[i]} {100 * r.second_accuracy[i]:.2f} %",
                f"{100 * r.spread[i]:.2f}",
                "n/a" if np.isnan(r.consistent[i]) else str(bool(r.consistent[i])),
                f"{_fmt(r.observed_order[i])} ({r.expected_order[i]:g})",
                f"{r.training_time_s[i]:.0f} s",
            )
        )
    chead = [
        "recipe",
        "2 → 1 step/layer: points lost",
        "images lost / gained (McNemar p)",
        "speedup",
        f"{c.num_layers} → {c.num_layers // 2} layers (coarsen): points lost",
        "images lost / gained (McNemar p)",
        "speedup",
    ]
    crows = []
    for i, name in enumerate(c.recipes):
        h, b = r.compression[i]["half_steps"], r.compression[i]["half_basis"]
        crows.append(
            (
                name,
                f"{h['points_lost']:+.2f}",
                _discordant(h),
                f"{h['speedup']:.2f}×",
                f"{b['points_lost']:+.2f}",
                _discordant(b),
                f"{b['speedup']:.2f}×",
            )
        )
    ahead = [
        "recipe",
        "solver",
        "tolerance",
        "accuracy",
        "evaluations per example (mean ± std, range)",
    ]
    arows, lines = [], []
    for i, name in enumerate(c.recipes):
        a = r.adaptive[i]
        for run in a["runs"]:
            arows.append(
                (
                    name,
                    run["solver"],
                    f"{run['rtol']:g}",
                    f"{100 * run['accuracy']:.2f} %",
                    f"{run['mean_evaluations']:.1f} ± {run['std_evaluations']:.1f} "
                    f"({run['min_evaluations']}–{run['max_evaluations']})"
                    + (" (one step per layer)" if run.get("whole_layer_steps") else ""),
                )
            )
        best = a["cheapest_adaptive"]
        lines.append(
            f"- {name}: 16× grid {100 * a['reference_accuracy']:.2f} %; cheapest fixed grid "
            f"within {100 * c.adaptive_margin:.1f} points: "
            f"{_fmt(a['cheapest_fixed_evaluations'], 'd', 'none')} evaluations; cheapest "
            "adaptive one: "
            + (
                "none"
                if best is None
                else f"{best['mean_evaluations']:.1f} ({best['solver']}, rtol {best['rtol']:g}"
                + (
                    ", every step the whole layer: a fixed one-step grid of that solver)"
                    if best.get("whole_layer_steps")
                    else ")"
                )
            )
            + f"; ratio {_fmt(a['evaluations_ratio'])}."
        )
    return "\n".join(
        [
            f"Digits, {c.d}-wide pre-norm equation, {c.num_layers} layers, {c.epochs} epochs, "
            f"seed {c.seed}; multi-resolution draws {list(c.resolutions)} steps per layer, "
            f"λ_K = {c.kinetic:g} and λ_s = {c.smoothness:g} where the recipe has those costs. "
            "Held-out accuracy (450 "
            "images) at k× the model's own steps per layer (its training scheme):",
            "",
            markdown_table(head, rows),
            "",
            "Compression (warm median of the jitted held-out solve):",
            "",
            markdown_table(chead, crows),
            "",
            "Adaptive inference (PID controller; one field evaluation = attention and "
            "feed-forward once; a Lie step per layer is one):",
            "",
            markdown_table(ahead, arows),
            "",
            *lines,
            "",
            f"Wall time {r.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    r, c = results, results.config
    fig, ax = new_figure(figsize=(6.5, 4.2))
    for i, name in enumerate(c.recipes):
        ax.plot(FACTORS, 100 * r.accuracy[i], "o-", color=f"C{i}", label=name)
        ax.plot(
            [FACTORS[-1]],
            [100 * r.second_accuracy[i]],
            "s",
            color=f"C{i}",
            mfc="none",
            label=f"{name}, {r.second_scheme[i]} at 16×",
        )
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="steps per layer at inference",
        ylabel="held-out accuracy (%)",
        title=f"continuous-depth: trained at one step per layer, seed {c.seed}",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig2, ax2 = new_figure(figsize=(6.5, 4.2))
    for i, name in enumerate(c.recipes):
        a = r.adaptive[i]
        ax2.plot(
            a["fixed_evaluations"],
            100 * np.asarray(a["fixed_accuracy"]),
            "o-",
            color=f"C{i}",
            label=f"{name}, fixed Lie grids",
        )
        for j, solver in enumerate(c.adaptive_solvers):
            runs = [x for x in a["runs"] if x["solver"] == type(ODE_SOLVERS[solver]).__name__]
            ax2.plot(
                [x["mean_evaluations"] for x in runs],
                [100 * x["accuracy"] for x in runs],
                "^v<>sd"[j % 6] + "--",
                color=f"C{i}",
                label=f"{name}, adaptive ({solver})",
            )
    ax2.set_xscale("log", base=2)
    ax2.set(
        xlabel="field evaluations per example",
        ylabel="held-out accuracy (%)",
        title="adaptive against fixed grids",
    )
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    return {"refinement": fig, "adaptive": fig2}
