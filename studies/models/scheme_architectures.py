"""Schemes as architectures: at equal parameters and the same data, which splitting scheme,
used as the network's layer, gives the best held-out accuracy at equal training cost?

Task: the `train-sequence` sorting task, made hard enough that the schemes can differ (by
default one layer of width 16 sorting 16 symbols of 32, where the one-step Lie–Trotter network
stays well below 95 %). Every network has the same parameters: one layer's attention and
feed-forward controls, the same embedding and head; only the layer's scheme differs, each at
one step per layer, with no running cost:

- `lie` — Lie–Trotter, `u + MHA(LN u)` then `+ FFN(LN ·)`: the usual Transformer layer;
- `strang` — Strang, FFN½–attention–FFN½ (Macaron's layout; sub-flows by the midpoint rule, so
  the layer has order 2);
- `yoshida4` — Yoshida's fourth-order composition of three Strang steps (sub-flows by RK4);
- `suzuki4` — Suzuki's five-step fourth-order composition (optional).

Training cost is counted in operator evaluations (attention or feed-forward applied once) per
training step and layer, `e(s)`: Lie–Trotter 2, Strang 6, Yoshida4 36, Suzuki4 60 (the
backward pass costs a fixed multiple of the forward one). Two arms, each with `num_seeds`
seeds (`seed`, `seed + 1`, ...; a seed fixes the data, the initialization and the batches):

- **equal steps**: every scheme trained for `steps` steps (the same batches);
- **equal cost**: every scheme trained for `round(steps · e(scheme) / e(s))` steps, the
  operator evaluations of `steps` steps of the reference `scheme` (the warm-up scaled alike).

For every network: held-out token accuracy at its own discretization, its refinement spread
(`wbc.refinement_accuracy`: 2–16× its steps and the second scheme at 16×), the certificate
(float64: observed order, `consistent`), the seeds reaching `target_accuracy`, the measured
training time and inference cost (field
evaluations per example, `L · e(s) / 2`, and the warm median time of the held-out solve).

The question: does a scheme of higher order than the reference `scheme` win at equal training
cost? A scheme wins an arm when it has the highest mean accuracy and its worst seed beats the
runner-up's best seed; the verdict names the winner of both arms (or says that no scheme wins
clearly) and is Yes only when the equal-cost winner has the higher order.

Durable: every training is a `train-sequence` run folder in `<scheme>-<steps>steps-seed<k>/`
(`wbc.load_run` and `--weights` read it), checkpointed and resumed.

Figures: `cost` (held-out accuracy against training time and against inference evaluations,
one point per network).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import SEED_MAX, check, check_choices, check_positive, check_seed
from studies._toolkit.fields import (
    Costs,
    Method,
    Smoothness,
    Sorting,
    Steps,
    TrainingFields,
    WeightDecay,
    defaults,
)
from studies._toolkit.memory import scheme_evaluations as evaluations
from studies.training import train_sequence

NAME = "scheme-architectures"
SUMMARY = (
    "Lie, Strang and a fourth-order composition as the layer: accuracy at equal training "
    "cost and equal steps, inference cost, refinement spread (3 seeds)."
)

ARMS = ("equal-cost", "equal-steps")
"""The two training budgets: the operator evaluations of `steps` steps of the reference
scheme, and `steps` steps each."""


@dataclasses.dataclass(frozen=True)
@defaults(d=16, num_heads=2, num_layers=1, hidden=32, length=16, vocab=32, target_accuracy=0.95)
class Config(Sorting, Method, Costs, Smoothness, Steps, WeightDecay, TrainingFields):
    schemes: tuple[str, ...] = ("lie", "strang", "yoshida4")
    """Schemes compared as the layer (names of `wb.registry.SPLITTING_SCHEMES`)."""
    num_seeds: int = 3
    """Seeds per scheme and arm: `seed`, `seed + 1`, ... (each fixes the data, the
    initialization and the batches)."""
    timing_repeats: int = 5
    """Warm repeats of each timed held-out solve (the median is reported)."""

    def __post_init__(self):
        T.check_training_fields(self)
        check_seed(self)
        check_choices(self, "schemes", wb.registry.SPLITTING_SCHEMES)
        check(
            self,
            "schemes",
            len(self.schemes) >= 1 and len(set(self.schemes)) == len(self.schemes),
            "distinct scheme names",
        )
        check_positive(self, "num_seeds", "timing_repeats", "steps")
        check(
            self,
            "steps_per_layer",
            self.steps_per_layer == 1,
            "1 (every scheme is compared as one step per layer: the layer itself)",
        )
        check(
            self,
            "plan",
            self.plan is None,
            "None (each scheme is trained at one step per layer; a plan would replace it)",
        )
        for recipe in self.trainings():  # the sequence task's own checks, naming its fields
            self.sequence_config(*recipe)

    def seeds(self) -> list[int]:
        """The seeds of every scheme and arm: `seed, seed + 1, ...` (mod 2^32, so every one is
        a valid seed)."""
        return [(self.seed + k) % (SEED_MAX + 1) for k in range(self.num_seeds)]

    def equal_cost_steps(self, scheme: str) -> int:
        """Training steps of `scheme` with the operator evaluations of `steps` steps of the
        reference `scheme`."""
        return max(1, round(self.steps * evaluations(self.scheme) / evaluations(scheme)))

    def arm_steps(self, arm: str, scheme: str) -> int:
        return self.equal_cost_steps(scheme) if arm == "equal-cost" else self.steps

    def trainings(self) -> list[tuple[str, int, int]]:
        """The distinct `(scheme, seed, steps)` trainings of both arms."""
        out = []
        for scheme in self.schemes:
            for seed in self.seeds():
                for arm in ARMS:
                    key = (scheme, seed, self.arm_steps(arm, scheme))
                    if key not in out:
                        out.append(key)
        return out

    def sequence_config(self, scheme: str, seed: int, steps: int) -> train_sequence.Config:
        """The `train-sequence` config of one training (fixed depth, one step per layer; the
        warm-up scaled with the steps)."""
        names = {f.name for f in dataclasses.fields(train_sequence.Config)}
        shared = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        warmup = min(round(self.warmup * steps / self.steps), max(steps - 1, 0))
        return train_sequence.Config(
            **{
                **shared,
                "scheme": scheme,
                "seed": seed,
                "steps": steps,
                "warmup": warmup,
                "depth": "fixed",
            }
        )

    def estimated_peak_bytes(self) -> int:
        """The largest of the trainings' `train-sequence` peaks (trained one after the
        other)."""
        return max(self.sequence_config(*t).estimated_peak_bytes() for t in self.trainings())


run_identity = T.fingerprint
"""What makes two runs of this study the same run: the fields that decide the trained
trajectories (not `timing_repeats` or the certificate's)."""


def smoke_config() -> Config:
    return Config(
        steps=40,
        d=8,
        num_heads=2,
        hidden=16,
        length=4,
        vocab=8,
        num_train=256,
        num_test=64,
        batch_size=32,
        warmup=4,
        checkpoint_every=50,
        num_seeds=2,
        certificate_examples=1,
        max_spread=0.05,
        timing_repeats=2,
    )


@dataclasses.dataclass
class Results:
    config: Config
    runs: list
    """One dict per (arm, scheme, seed): `steps`, `accuracy`, `refined_accuracies` (2–16×),
    `second_scheme`, `second_accuracy`, `spread`, `consistent` (None without a certificate),
    `observed_order`, `expected_order`, `training_time_s`, `training_evaluations` (operator
    evaluations per layer and training example of a batch, over the whole training: steps ·
    e(s)), `inference_evaluations`
    (field evaluations per example: L · e(s) / 2), `inference_s`, `folder`."""
    wall_time_s: float


def _folder(scheme: str, seed: int, steps: int) -> str:
    return f"{scheme}-{steps}steps-seed{seed}"


def _evaluate(config: Config, scheme: str, seed: int, steps: int, run_dir) -> dict:
    sub = config.sequence_config(scheme, seed, steps)
    folder = _folder(scheme, seed, steps)
    results, trained = train_sequence.train(sub, run_dir=T.subfolder(run_dir, folder))
    model, cert = trained.model, results.certificate or {}
    task = wbc.sorting(
        seed,
        length=config.length,
        vocab=config.vocab,
        num_train=config.num_train,
        num_test=config.num_test,
    )
    refined = cert.get("accuracy") or dataclasses.asdict(wbc.refinement_accuracy(model, task.test))
    order = cert.get("observed_order")
    e = evaluations(scheme)
    return {
        "scheme": scheme,
        "seed": seed,
        "steps": steps,
        "accuracy": float(results.test_accuracy),
        "refined_accuracies": list(map(float, refined["refined_accuracies"])),
        "second_scheme": refined["second_scheme"],
        "second_accuracy": float(refined["second_accuracy"]),
        "spread": float(refined["spread"]),
        "consistent": bool(cert["consistent"]) if cert else None,
        "observed_order": None if order is None else float(order),
        "expected_order": int(model.transformer.expected_order),
        "training_time_s": T.training_seconds(trained, results),
        "training_evaluations": steps * e,
        "inference_evaluations": config.num_layers * e / 2,
        "inference_s": T.solve_seconds(model, jnp.asarray(task.test.inputs), config.timing_repeats),
        "folder": folder,
    }


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    done: dict[tuple, dict] = {}
    with jax.enable_x64(False):
        for key in config.trainings():
            done[key] = _evaluate(config, *key, run_dir)
    runs = []
    for arm in ARMS:
        for scheme in config.schemes:
            for seed in config.seeds():
                runs.append({"arm": arm, **done[(scheme, seed, config.arm_steps(arm, scheme))]})
    return Results(config=config, runs=runs, wall_time_s=time.perf_counter() - start)


def table(results: Results, arm: str, key: str) -> np.ndarray:
    """`(scheme, seed)` array of one run field in one arm (NaN for None)."""
    c = results.config
    out = np.full((len(c.schemes), c.num_seeds), np.nan)
    for r in results.runs:
        if r["arm"] == arm and r[key] is not None:
            out[c.schemes.index(r["scheme"]), c.seeds().index(r["seed"])] = float(r[key])
    return out


def winner(results: Results, arm: str) -> tuple[str | None, list[str]]:
    """`(scheme, ranking)`: the schemes by decreasing mean accuracy in `arm`, and the first
    one when its worst seed beats the runner-up's best seed (None otherwise, or with one
    scheme)."""
    acc = table(results, arm, "accuracy")
    order = list(np.argsort(-acc.mean(axis=1), kind="stable"))
    names = [results.config.schemes[i] for i in order]
    if len(order) < 2:
        return None, names
    best, second = order[0], order[1]
    return (names[0] if acc[best].min() > acc[second].max() else None), names


def _summary(results: Results, arm: str) -> str:
    acc = 100 * table(results, arm, "accuracy")
    spread = 100 * table(results, arm, "spread")
    parts = []
    for i, name in enumerate(results.config.schemes):
        parts.append(
            f"{name} {acc[i].mean():.2f} % ({acc[i].min():.2f}–{acc[i].max():.2f}), "
            f"spread ≤ {np.nanmax(spread[i]):.2f} points"
        )
    return "; ".join(parts)


def _answer(results: Results, arm: str) -> str:
    best, names = winner(results, arm)
    if len(names) < 2:
        return "one scheme only"
    if best is not None:
        return f"{best} wins"
    return f"no scheme wins clearly ({names[0]} and {names[1]}: the seeds' ranges overlap)"


def verdict(results: Results) -> str:
    """Yes when a scheme of higher order than the reference `scheme` wins at equal training
    cost (its worst seed above every other scheme's best), No when the reference or another
    scheme of no higher order wins, or when no scheme wins clearly."""
    c = results.config
    if len(c.schemes) < 2:
        return f"No answer: one scheme trained ({_summary(results, 'equal-cost')})."
    best, names = winner(results, "equal-cost")
    order = {s: wb.registry.SPLITTING_SCHEMES[s].order() for s in (*c.schemes, c.scheme)}
    if best is None:
        head = (
            f"No: no scheme wins clearly at equal training cost ({names[0]} and "
            f"{names[1]}: the seeds' ranges overlap)"
        )
    elif order[best] > order[c.scheme]:
        head = f"Yes: {best} (order {order[best]}) wins at equal training cost"
    else:
        head = f"No: {best} (order {order[best]}) wins at equal training cost"
    time_ratio = table(results, "equal-steps", "training_time_s").mean(axis=1)
    ref = c.schemes.index(c.scheme) if c.scheme in c.schemes else 0
    ratios = ", ".join(
        f"{n} {time_ratio[i] / time_ratio[ref]:.2f}×" for i, n in enumerate(c.schemes)
    )
    return (
        f"{head}, the operator evaluations of {c.steps} {c.scheme} steps ({c.num_seeds} seeds, "
        f"mean (min–max)): {_summary(results, 'equal-cost')}. At equal steps ({c.steps}): "
        f"{_answer(results, 'equal-steps')}; {_summary(results, 'equal-steps')}; measured "
        f"training time per run against {c.schemes[ref]}: {ratios}."
    )


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    r, c = results, results.config
    lines = [
        f"Sorting {c.length} symbols of {c.vocab} ({c.num_train} training, {c.num_test} "
        f"held-out sequences), causal pre-norm equation, d = {c.d}, {c.num_heads} heads, "
        f"{c.num_layers} layer(s), feed-forward {c.hidden}, one step per layer, λ_K = "
        f"{c.kinetic:g}; seeds {', '.join(map(str, c.seeds()))}. Equal cost: the operator "
        f"evaluations of {c.steps} {c.scheme} steps (e(s) per step and layer: "
        + ", ".join(f"{s} {evaluations(s)}" for s in c.schemes)
        + ").",
        "",
    ]
    head = [
        "scheme",
        "steps",
        "held-out accuracy, mean (min–max)",
        f"seeds ≥ {100 * c.target_accuracy:g} %",
        "spread, max (points)",
        "consistent",
        "observed order (expected)",
        "training time",
        "inference: evaluations per example",
        "inference time (held-out set)",
    ]
    for arm in ARMS:
        rows = []
        for name in c.schemes:
            mine = [x for x in r.runs if x["arm"] == arm and x["scheme"] == name]
            acc = 100 * np.asarray([x["accuracy"] for x in mine])
            spread = 100 * max(x["spread"] for x in mine)
            cons = [x["consistent"] for x in mine if x["consistent"] is not None]
            orders = [x["observed_order"] for x in mine if x["observed_order"] is not None]
            rows.append(
                (
                    name,
                    str(mine[0]["steps"]),
                    f"{acc.mean():.2f} % ({acc.min():.2f}–{acc.max():.2f})",
                    f"{int((acc >= 100 * c.target_accuracy).sum())}/{len(acc)}",
                    f"{spread:.2f}",
                    f"{sum(cons)}/{len(cons)}" if cons else "n/a",
                    (f"{np.mean(orders):.2f}" if orders else "n/a")
                    + f" ({mine[0]['expected_order']})",
                    f"{np.mean([x['training_time_s'] for x in mine]):.1f} s",
                    f"{mine[0]['inference_evaluations']:g}",
                    f"{1e3 * np.median([x['inference_s'] for x in mine]):.1f} ms",
                )
            )
        lines += [f"**{arm}** ({_answer(r, arm)}):", "", markdown_table(head, rows), ""]
    lines.append(
        f"Run folders: {', '.join(sorted({x['folder'] for x in r.runs}))}. Wall time "
        f"{r.wall_time_s:.0f} s."
    )
    return "\n".join(lines)


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    r, c = results, results.config
    fig, (ax1, ax2) = new_figure(1, 2, figsize=(11, 4.2))
    markers = {"equal-cost": "o", "equal-steps": "s"}
    for arm in ARMS:
        for i, name in enumerate(c.schemes):
            mine = [x for x in r.runs if x["arm"] == arm and x["scheme"] == name]
            acc = [100 * x["accuracy"] for x in mine]
            kw = {
                "color": f"C{i}",
                "marker": markers[arm],
                "ls": "none",
                "mfc": "none" if arm == "equal-steps" else f"C{i}",
                "label": f"{name}, {arm}",
            }
            ax1.plot([x["training_time_s"] for x in mine], acc, **kw)
            ax2.plot([x["inference_evaluations"] for x in mine], acc, **kw)
    ax1.set(
        xlabel="training time (s)",
        ylabel="held-out token accuracy (%)",
        title=f"{NAME}: accuracy against training cost",
    )
    ax2.set(
        xlabel="field evaluations per example (inference)",
        xscale="log",
        title="accuracy against inference cost",
    )
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    ax1.legend(fontsize=7)
    return {"cost": fig}
