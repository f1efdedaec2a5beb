"""Is a regularized Transformer cheaper to integrate? The kinetic cost λ_K ∫(1/n)‖u_t‖² dt (the
optimal-transport view of a continuous-depth Transformer) and the smoothness cost λ_s ∫‖θ'‖² dt
against held-out accuracy **and** against the steps a discretization plan needs for a tolerance.

Model: the digits equation (pre-norm, GELU, 2×2 patches: 16 tokens and a class token) with
controls interpolated in depth (`wb.Interpolated`; `controls="piecewise"` for the network's own
piecewise-constant weights), trained for `epochs` at one step per layer with every pair
(λ_K, λ_s) of `kinetic_weights` × `smoothness_weights`, same seed, same batches.

For every trained model:

- held-out accuracy at the trained discretization;
- the kinetic energy ∫(1/n)‖u_t‖² dt of its held-out trajectories (unweighted, mean);
- its error against its own equation: the max-abs error of `u(T)` for `plan_scheme` at each
  `ladder` entry of steps per layer against a Dopri8 solve (float64, `examples` held-out
  images), the smallest ladder entry whose error is below `tolerance` (what a plan would choose,
  measured, not predicted) and the observed order.

The verdict compares the cheapest regularized model whose accuracy stays within `max_drop`
points of the unregularized one against the unregularized model's steps.

Durable: every training checkpoints into its own subfolder and resumes.

Figures: `cost` (held-out accuracy against the steps needed, one point per (λ_K, λ_s)),
`errors` (error against steps per layer, per model).
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_choices, check_positive, check_seed
from studies._toolkit.fields import Epochs, Ladder, Patch, TrainingFields, WeightDecay, defaults

NAME = "regularization-cost"
SUMMARY = "Kinetic and smoothness costs vs held-out accuracy and the steps a plan needs."


def _weights_ok(values) -> bool:
    return (
        len(values) >= 1
        and all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in values)
        and 0 in values
    )


@dataclasses.dataclass(frozen=True)
@defaults(
    d=32,
    num_heads=2,
    hidden=64,
    warmup=50,
    checkpoint_every=200,
    epochs=20,
    ladder=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
)
class Config(Ladder, Patch, Epochs, WeightDecay, TrainingFields):
    kinetic_weights: tuple[float, ...] = (0.0, 1e-3, 1e-2)
    """λ_K values (must include 0)."""
    smoothness_weights: tuple[float, ...] = (0.0, 1e-3)
    """λ_s values (must include 0)."""
    plan_scheme: str = "strang"
    """The scheme whose steps are counted."""
    tolerance: float = 1e-2
    """Max-abs error of u(T) the plan must reach."""
    max_drop: float = 1.0
    """Accuracy points a regularized model may lose and still count as cheaper."""

    def __post_init__(self):
        T.check_model_fields(self)
        check_seed(self)
        check_positive(self, "epochs", "tolerance", "examples", "max_drop")
        check_positive(self, "weight_decay", allow_zero=True)
        check_choices(self, "controls", T.CONTROLS)
        check_choices(self, "plan_scheme", wb.registry.SPLITTING_SCHEMES)
        check(self, "patch", self.patch in (1, 2, 4, 8), "one of 1, 2, 4, 8 (divides 8)")
        check(self, "batch_size", self.batch_size <= 1347, "at most 1347 (the training split)")
        for field in ("kinetic_weights", "smoothness_weights"):
            check(self, field, _weights_ok(getattr(self, field)), "numbers >= 0 including 0")
        check(
            self,
            "ladder",
            len(self.ladder) >= 2
            and all(isinstance(k, int) and k >= 1 for k in self.ladder)
            and list(self.ladder) == sorted(set(self.ladder)),
            "at least two increasing positive integers",
        )

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory.digits_training_bytes`, float32), one
        trained model at a time: the parameters with their gradient and AdamW copies, and the
        larger of the training step's stored activations (`batch_size` images of `(8 / patch)²
        + 1` tokens × the scheme's operator evaluations over `num_layers · steps_per_layer`
        steps) and a forward pass over the 450 held-out images (the evaluation and the kinetic
        energy). The float64 error ladder of `examples` images is small beside them."""
        from studies._toolkit import memory as M

        tokens = (8 // self.patch) ** 2 + 1
        return M.digits_training_bytes(self, tokens=tokens, patch_inputs=self.patch**2)


run_identity = T.fingerprint
"""What makes two runs of this study the same run (for its run folder and its checkpoints):
the fields that decide the trained trajectories, not those evaluated afterwards."""


def smoke_config() -> Config:
    return Config(
        epochs=3,
        d=16,
        num_layers=2,
        hidden=32,
        warmup=10,
        kinetic_weights=(0.0, 1e-2),
        smoothness_weights=(0.0,),
        ladder=(1, 2, 4, 8),
        examples=1,
        tolerance=1e-2,
        checkpoint_every=50,
    )


@dataclasses.dataclass
class Results:
    config: Config
    kinetic_weight: np.ndarray
    """(model,): λ_K of each trained model (all pairs, λ_K major)."""
    smoothness_weight: np.ndarray
    test_accuracy: np.ndarray
    kinetic_energy: np.ndarray
    """(model,): ∫(1/n)‖u_t‖² dt on the held-out set (unweighted mean)."""
    errors: np.ndarray
    """(model, ladder): max-abs error of u(T) for `plan_scheme`."""
    steps_needed: np.ndarray
    """(model,): smallest ladder entry with error ≤ tolerance (0: none on the ladder)."""
    observed_order: np.ndarray
    """(model,): fitted order (NaN when no window fits)."""
    reference: int
    """Index of the unregularized model."""
    cheapest: int
    """Index of the model with the fewest steps among those within `max_drop` points of the
    unregularized accuracy (the unregularized model itself when none is cheaper)."""
    wall_time_s: float


@eqx.filter_jit
def _kinetic(model, xs):
    cost = wbc.KineticEnergy(1.0).step_cost
    return jnp.mean(jax.vmap(lambda x: model.solve(x, running_cost=cost).running_cost)(xs))


def _needed(errors, ladder, tolerance) -> int:
    ok = [k for k, e in zip(ladder, errors) if e <= tolerance]
    return ok[0] if ok else 0


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    pairs = list(itertools.product(config.kinetic_weights, config.smoothness_weights))
    acc, energy, errors, needed, orders = [], [], [], [], []
    with jax.enable_x64(False):
        task = wbc.digits(config.seed)
        steps = config.epochs * (len(task.train) // config.batch_size)
        scheme = wb.registry.SPLITTING_SCHEMES[config.scheme]
        plan_scheme = wb.registry.SPLITTING_SCHEMES[config.plan_scheme]
        for lam_k, lam_s in pairs:
            model = T.digits_model(
                config,
                jax.random.key(config.seed),
                scheme,
                config.steps_per_layer,
                kernel_size=config.patch,
                stride=config.patch,
            )
            model = T.with_controls(model, config.controls)
            objective = wbc.Objective(
                wbc.CrossEntropy(),
                wbc.KineticEnergy(lam_k) if lam_k else None,
                (wbc.ControlSmoothness(lam_s),) if lam_s else (),
            )
            optimizer = wbc.default_optimizer(
                config.learning_rate,
                steps=steps,
                warmup=config.warmup,
                weight_decay=config.weight_decay,
                clip=config.clip,
            )
            result = wbc.train(
                wbc.TrainStep(optimizer, objective=objective),
                model,
                task.train,
                steps=steps,
                batch_size=config.batch_size,
                seed=config.seed,
                eval_data=task.test,
                eval_every=steps,
                log_every=10,
                run_dir=T.subfolder(run_dir, f"kinetic-{lam_k:g}-smoothness-{lam_s:g}"),
                checkpoint_every=config.checkpoint_every,
                fingerprint={**T.fingerprint(config), "kinetic": lam_k, "smoothness": lam_s},
            )
            acc.append(wbc.evaluate(result.model, task.test))
            energy.append(float(_kinetic(result.model, jnp.asarray(task.test.inputs))))
            lad = T.refinement_ladder(
                result.model, task.test.inputs[: config.examples], config.ladder, scheme=plan_scheme
            )
            errors.append(lad["errors"])
            needed.append(_needed(lad["errors"], config.ladder, config.tolerance))
            orders.append(np.nan if lad["observed_order"] is None else lad["observed_order"])
    acc, needed = np.asarray(acc), np.asarray(needed)
    ref = pairs.index((0, 0)) if (0, 0) in pairs else 0
    cost = np.where(needed == 0, np.inf, needed)
    eligible = [i for i in range(len(pairs)) if 100 * (acc[ref] - acc[i]) <= config.max_drop]
    cheapest = min(eligible, key=lambda i: (cost[i], -acc[i], i != ref))
    return Results(
        config=config,
        kinetic_weight=np.asarray([p[0] for p in pairs], float),
        smoothness_weight=np.asarray([p[1] for p in pairs], float),
        test_accuracy=acc,
        kinetic_energy=np.asarray(energy),
        errors=np.stack(errors),
        steps_needed=needed,
        observed_order=np.asarray(orders, float),
        reference=ref,
        cheapest=cheapest,
        wall_time_s=time.perf_counter() - start,
    )


def _steps_text(k: int, config: Config) -> str:
    return f"> {config.ladder[-1]}" if k == 0 else str(k)


def _name(r: Results, i: int) -> str:
    return f"λ_K = {r.kinetic_weight[i]:g}, λ_s = {r.smoothness_weight[i]:g}"


def verdict(results: Results) -> str:
    c, r = results.config, results
    i, j = r.reference, r.cheapest
    base = (
        f"the unregularized model needs {_steps_text(r.steps_needed[i], c)} {c.plan_scheme} "
        f"step(s) per layer for a max-abs error ≤ {c.tolerance:g} at "
        f"{100 * r.test_accuracy[i]:.2f} % held-out accuracy"
    )
    if j == i or r.steps_needed[j] == r.steps_needed[i]:
        return (
            f"No. No regularized model within {c.max_drop:g} point(s) of its accuracy needs "
            f"fewer steps: {base}."
        )
    return (
        f"Yes. With {_name(r, j)} the model needs {_steps_text(r.steps_needed[j], c)} step(s) "
        f"per layer at {100 * r.test_accuracy[j]:.2f} % held-out accuracy; {base}."
    )


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    c, r = results.config, results
    rows = []
    for i in range(len(r.test_accuracy)):
        order = r.observed_order[i]
        rows.append(
            (
                f"{r.kinetic_weight[i]:g}",
                f"{r.smoothness_weight[i]:g}",
                f"{100 * r.test_accuracy[i]:.2f} %",
                f"{r.kinetic_energy[i]:.3g}",
                f"{r.errors[i, 0]:.2e}",
                _steps_text(r.steps_needed[i], c),
                "n/a" if np.isnan(order) else f"{order:.2f}",
            )
        )
    head = [
        "λ_K",
        "λ_s",
        "held-out accuracy",
        "kinetic energy",
        f"error at 1 step/layer ({c.plan_scheme})",
        f"steps/layer for {c.tolerance:g}",
        "observed order",
    ]
    return "\n".join(
        [
            f"Digits, {c.d}-wide pre-norm equation with {c.controls} controls, {c.num_layers} "
            f"layers, trained {c.epochs} epochs ({c.scheme}, {c.steps_per_layer} step(s) per "
            f"layer, float32); errors in float64 on {c.examples} held-out image(s) against "
            f"Dopri8; steps counted on the ladder {list(c.ladder)}.",
            "",
            markdown_table(head, rows),
            "",
            f"Wall time {r.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    c, r = results.config, results
    fig, ax = new_figure(figsize=(6.5, 4.2))
    cost = np.where(r.steps_needed == 0, 2 * c.ladder[-1], r.steps_needed)
    for i in range(len(cost)):
        ax.scatter(cost[i], 100 * r.test_accuracy[i], color=f"C{i}", label=_name(r, i))
    ax.set_xscale("log", base=2)
    ax.set(
        xlabel=f"{c.plan_scheme} steps per layer for error ≤ {c.tolerance:g}",
        ylabel="held-out accuracy (%)",
        title="regularization-cost: accuracy vs steps",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig2, ax2 = new_figure(figsize=(6.5, 4.2))
    for i in range(len(cost)):
        ax2.loglog(c.ladder, r.errors[i], "o-", color=f"C{i}", label=_name(r, i))
    ax2.axhline(c.tolerance, color="gray", ls="--", lw=1, label="tolerance")
    ax2.set(
        xlabel="steps per layer",
        ylabel="max-abs error of u(T) vs Dopri8",
        title=f"trained models against their equation ({c.plan_scheme})",
    )
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8)
    return {"cost": fig, "errors": fig2}
