"""Does a Transformer trained as the optimal control of its equation converge to an ODE as its
depth is refined? Trained at N steps, is it still accurate at 2N and 4N, and does the smoothness
cost ∫‖θ'‖² make the difference?

Model: the digits equation (pre-norm, GELU, 2×2 patches: 16 tokens and a class token) with
controls **interpolated** in depth (θ(t) piecewise linear through the layer values at the layer
midpoints, `wb.Interpolated`), so it can be solved on any grid. Two trainings, identical except
for the smoothness weight (`0` and `smoothness`):

1. train `epochs` at N = `num_layers` steps (one per layer);
2. refine the controls to 2N pieces (`wb.control.refine_depth`: θ sampled at the new
   midpoints) and continue `continue_epochs` at 2N steps;
3. refine again and continue at 4N.

After every stage: held-out accuracy with 1, 2 and 4 steps per piece (stage 1: N, 2N, 4N
inference steps), and the trained network against its own equation (float64, a few held-out
images): the max-abs error of `u(T)` at 1, 2, 4, 8 steps per piece against a Dopri8 solve, with
the observed order (`fit_order`; the scheme's order is expected if the trained network is a
consistent discretization of an ODE).

The question (the acceptance figure): with the smoothness cost, does the held-out accuracy of the
network trained at N change by less than `max_change` points when it is solved with 4N steps?
The same is reported without the cost.

Durable: every training checkpoints into its own subfolder and resumes.

Figures: `accuracy` (held-out accuracy against inference steps, per stage and variant),
`errors` (error against the reference against steps per piece, per stage and variant).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

import workbench as wb
import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_choices, check_positive, check_seed
from studies._toolkit.fields import (
    Epochs,
    Ladder,
    Patch,
    Smoothness,
    TrainingFields,
    WeightDecay,
    defaults,
)

NAME = "depth-refinement"
SUMMARY = "Train at N steps, continue at 2N and 4N: does a trained Transformer converge to an ODE?"

FACTORS = (1, 2, 4)
"""Inference steps per piece at which every stage is evaluated."""
STAGES = (1, 2, 4)
"""Pieces per layer of the original model at the three stages (N, 2N, 4N)."""
VARIANTS = ("without", "with")
"""Without and with the smoothness cost."""


@dataclasses.dataclass(frozen=True)
@defaults(
    d=32, num_heads=2, hidden=64, warmup=50, checkpoint_every=200, epochs=30, smoothness=0.001
)
class Config(Ladder, Smoothness, Patch, Epochs, WeightDecay, TrainingFields):
    continue_epochs: int = 5
    """Epochs of each continuation (2N, then 4N steps)."""
    continue_learning_rate: float = 1e-3
    """Peak AdamW learning rate of each continuation (2N, then 4N steps)."""
    max_change: float = 1.0
    """Accuracy points the network trained at N may lose or gain at 4N."""

    def __post_init__(self):
        T.check_model_fields(self)
        check_seed(self)
        check_positive(
            self,
            "epochs",
            "continue_epochs",
            "continue_learning_rate",
            "smoothness",
            "examples",
            "max_change",
        )
        check_positive(self, "weight_decay", allow_zero=True)
        check_choices(self, "controls", T.CONTROLS)
        check(self, "patch", self.patch in (1, 2, 4, 8), "one of 1, 2, 4, 8 (divides 8)")
        check(self, "batch_size", self.batch_size <= 1347, "at most 1347 (the training split)")
        check(
            self,
            "ladder",
            len(self.ladder) >= 2
            and all(isinstance(k, int) and k >= 1 for k in self.ladder)
            and list(self.ladder) == sorted(set(self.ladder)),
            "at least two increasing positive integers",
        )

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory.digits_training_bytes`, float32) at its
        largest stage, 4N: controls refined twice to `4 · num_layers` pieces, with their
        gradient and AdamW copies, and the larger of the training step's stored activations
        (`batch_size` images of `(8 / patch)² + 1` tokens × the scheme's operator evaluations
        over `4 · num_layers · steps_per_layer` steps) and the held-out evaluation's (450
        images, one step at a time)."""
        from studies._toolkit import memory as M

        tokens = (8 // self.patch) ** 2 + 1
        layers = STAGES[-1] * self.num_layers
        return M.digits_training_bytes(
            self, tokens=tokens, patch_inputs=self.patch**2, layers=layers
        )


run_identity = T.fingerprint
"""What makes two runs of this study the same run (for its run folder and its checkpoints):
the fields that decide the trained trajectories, not those evaluated afterwards."""


def smoke_config() -> Config:
    return Config(
        epochs=4,
        continue_epochs=1,
        d=16,
        num_layers=2,
        hidden=32,
        warmup=10,
        ladder=(1, 2, 4),
        examples=1,
        checkpoint_every=50,
    )


@dataclasses.dataclass
class Results:
    config: Config
    accuracy: np.ndarray
    """(variant, stage, factor): held-out accuracy of the stage's trained network with
    `FACTORS[f]` steps per piece (variant 0 without, 1 with the smoothness cost)."""
    refined_accuracy: np.ndarray
    """(variant, stage): accuracy right after the refinement, before the stage trained (stage 0:
    the first stage's trained network)."""
    errors: np.ndarray
    """(variant, stage, ladder): max-abs error of u(T) against the reference."""
    observed_order: np.ndarray
    """(variant, stage): fitted order of `errors` (NaN when no window fits)."""
    smoothness: np.ndarray
    """(variant, stage): ∫‖θ'‖² dt of the trained controls (unweighted)."""
    accuracy_change: np.ndarray
    """(variant,): points gained from N to 4N inference steps by the network trained at N."""
    expected_order: int
    wall_time_s: float


def _optimizer(config: Config, steps: int, first: bool):
    lr = config.learning_rate if first else config.continue_learning_rate
    warmup = config.warmup if first else max(config.warmup // 5, 1)
    return wbc.default_optimizer(
        lr, steps=steps, warmup=warmup, weight_decay=config.weight_decay, clip=config.clip
    )


def _smoothness(model) -> float:
    return float(wbc.ControlSmoothness(1.0)(model.transformer))


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    nv, ns, nf = len(VARIANTS), len(STAGES), len(FACTORS)
    accuracy = np.zeros((nv, ns, nf))
    refined = np.zeros((nv, ns))
    errors = np.zeros((nv, ns, len(config.ladder)))
    orders = np.full((nv, ns), np.nan)
    smooth = np.zeros((nv, ns))
    with jax.enable_x64(False):
        task = wbc.digits(config.seed)
        per_epoch = len(task.train) // config.batch_size
        scheme = wb.registry.SPLITTING_SCHEMES[config.scheme]
        for v, variant in enumerate(VARIANTS):
            weight = config.smoothness if variant == "with" else 0.0
            objective = wbc.Objective(
                wbc.CrossEntropy(), None, (wbc.ControlSmoothness(weight),) if weight else ()
            )
            model = T.digits_model(
                config,
                jax.random.key(config.seed),
                scheme,
                config.steps_per_layer,
                kernel_size=config.patch,
                stride=config.patch,
            )
            model = T.with_controls(model, config.controls)
            for s, factor in enumerate(STAGES):
                if s:
                    model = wbc.refine_depth(model, 2)
                    refined[v, s] = wbc.evaluate(model, task.test)
                steps = (config.epochs if s == 0 else config.continue_epochs) * per_epoch
                result = wbc.train(
                    wbc.TrainStep(_optimizer(config, steps, s == 0), objective=objective),
                    model,
                    task.train,
                    steps=steps,
                    batch_size=config.batch_size,
                    seed=config.seed + s,
                    eval_data=task.test,
                    eval_every=steps,
                    log_every=10,
                    run_dir=T.subfolder(run_dir, f"{variant}-smoothness/{factor}N"),
                    checkpoint_every=config.checkpoint_every,
                    fingerprint={**T.fingerprint(config), "variant": variant, "stage": factor},
                )
                model = result.model
                for f, k in enumerate(FACTORS):
                    accuracy[v, s, f] = wbc.evaluate(
                        model.rediscretize(steps_per_layer=k * config.steps_per_layer), task.test
                    )
                if s == 0:
                    refined[v, 0] = accuracy[v, 0, 0]
                smooth[v, s] = _smoothness(model)
                lad = T.refinement_ladder(model, task.test.inputs[: config.examples], config.ladder)
                errors[v, s] = lad["errors"]
                if lad["observed_order"] is not None:
                    orders[v, s] = lad["observed_order"]
    change = 100 * (accuracy[:, 0, FACTORS.index(4)] - accuracy[:, 0, 0])
    return Results(
        config=config,
        accuracy=accuracy,
        refined_accuracy=refined,
        errors=errors,
        observed_order=orders,
        smoothness=smooth,
        accuracy_change=change,
        expected_order=scheme.order(),
        wall_time_s=time.perf_counter() - start,
    )


def verdict(results: Results) -> str:
    c, r = results.config, results
    without, with_ = r.accuracy_change
    answer = "Yes" if abs(with_) < c.max_change else "No"
    orders = ", ".join("n/a" if np.isnan(o) else f"{o:.2f}" for o in r.observed_order[:, 0])
    return (
        f"{answer}. Trained at N = {c.num_layers} steps with the smoothness cost "
        f"(λ_s = {c.smoothness:g}), the held-out accuracy changes by {with_:+.2f} points at "
        f"4N steps (goal: less than {c.max_change:g} in size); without it by {without:+.2f}. "
        f"Observed orders of the trained networks against their equation (without, with): "
        f"{orders} (expected {r.expected_order})."
    )


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    c, r = results.config, results
    n = c.num_layers
    rows = []
    for v, variant in enumerate(VARIANTS):
        for s, factor in enumerate(STAGES):
            order = r.observed_order[v, s]
            rows.append(
                (
                    f"{variant} smoothness",
                    f"{factor}N = {factor * n}",
                    "—" if s == 0 else f"{100 * r.refined_accuracy[v, s]:.2f} %",
                    *(f"{100 * a:.2f} %" for a in r.accuracy[v, s]),
                    f"{r.errors[v, s, 0]:.2e}",
                    "n/a" if np.isnan(order) else f"{order:.2f}",
                    f"{r.smoothness[v, s]:.3g}",
                )
            )
    head = ["variant", "trained at (pieces)", "accuracy after refinement"]
    head += [f"accuracy, {k} step(s)/piece" for k in FACTORS]
    head += ["error at 1 step/piece", f"observed order (expected {r.expected_order})", "∫‖θ'‖²"]
    return "\n".join(
        [
            f"Digits, {c.d}-wide pre-norm equation with {c.controls} controls, {n} layers, "
            f"{c.scheme} with {c.steps_per_layer} step(s) per piece in training; first stage "
            f"{c.epochs} epochs, each continuation {c.continue_epochs}; λ_s = {c.smoothness:g} "
            f"in the `with` variant. Accuracy change N → 4N of the first stage: "
            f"{r.accuracy_change[0]:+.2f} points without, {r.accuracy_change[1]:+.2f} with the "
            f"smoothness cost. Errors: max-abs of u(T) against Dopri8, {c.examples} held-out "
            "image(s), float64.",
            "",
            markdown_table(head, rows),
            "",
            f"Wall time {r.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    c, r = results.config, results
    n = c.num_layers
    fig, ax = new_figure(figsize=(6.5, 4.2))
    styles = {"without": "--", "with": "-"}
    for v, variant in enumerate(VARIANTS):
        for s, factor in enumerate(STAGES):
            ax.plot(
                [factor * k * n for k in FACTORS],
                100 * r.accuracy[v, s],
                styles[variant],
                marker="o",
                color=f"C{s}",
                label=f"trained at {factor}N, {variant} smoothness",
            )
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel="inference steps",
        ylabel="held-out accuracy (%)",
        title=f"depth-refinement: N = {n}, seed {c.seed}",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig2, ax2 = new_figure(figsize=(6.5, 4.2))
    for v, variant in enumerate(VARIANTS):
        for s, factor in enumerate(STAGES):
            ax2.loglog(
                [factor * k * n for k in c.ladder],
                r.errors[v, s],
                styles[variant],
                marker="o",
                color=f"C{s}",
                label=f"trained at {factor}N, {variant} smoothness",
            )
    ax2.set(
        xlabel="steps",
        ylabel="max-abs error of u(T) vs Dopri8",
        title=f"trained networks against their equation ({c.scheme})",
    )
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    return {"accuracy": fig, "errors": fig2}
