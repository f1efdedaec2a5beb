"""Does the extended method of successive approximations (Pontryagin's principle, Li, Chen, Tai &
E 2018) train a Transformer equation as well as Adam on the exact gradient, for the same wall
time?

One digits model (a pre-norm ViT-style equation on 2×2 patches: 16 tokens and a class token),
one split, one batch order, three trainings of `steps` iterations each:

- **Adam**: the exact gradient of the discrete model (discretize-then-optimize), Adam with
  gradient clipping and a warm-up + cosine schedule;
- **extended MSA** (`msa_rho > 0`): forward state, backward costate, then for every layer at
  once `msa_inner_steps` Adam steps on the layer's extended Hamiltonian (the embedding and head
  take a gradient step of size `msa_outer_learning_rate`);
- **basic MSA** (`rho = 0`, with `include_basic`): the same without the penalties.

The measure is the training objective (cross-entropy of the batch, averaged over the last
`window` logged values, i.e. `10 · window` steps) against the iteration and against the
training seconds (compilation excluded), plus the held-out accuracy at the end. The question is
answered at equal wall time: the time of the faster method's last iteration, where extended
MSA's objective must be within `max_excess` (10 %) of Adam's.

Durable: with an output folder every training checkpoints into its own subfolder (`adam/`,
`emsa/`, `msa/`) and resumes. The training seconds are the trainer's cumulative `elapsed_s`:
they continue across a kill and resume (each process's compilation left out), so a resumed
method's curve keeps its time axis increasing and the equal-time comparison holds.

Figures: `curves` (objective against the iteration and against seconds, one line per method).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
import optax

import workbench as wb
import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_positive, check_seed
from studies._toolkit.fields import Patch, Steps, TrainingFields, defaults

NAME = "msa-vs-gradient"
SUMMARY = "Extended MSA (Pontryagin) vs Adam on digits: objective per iteration and per second."


@dataclasses.dataclass(frozen=True)
@defaults(d=32, num_heads=2, hidden=64, warmup=20, checkpoint_every=200, steps=600)
class Config(Patch, Steps, TrainingFields):
    msa_rho: float = 0.01
    """The extended MSA's penalty weight ρ (> 0)."""
    msa_inner_steps: int = 5
    """Adam steps on each layer's Hamiltonian per MSA iteration (both MSA variants)."""
    msa_inner_learning_rate: float = 1e-3
    """Learning rate of those inner Adam steps."""
    msa_outer_learning_rate: float = 0.1
    """Gradient step of the embedding and head under MSA."""
    include_basic: bool = True
    """Also train with the basic MSA (ρ = 0)."""
    window: int = 5
    """Logged values (every 10 steps) averaged into one objective value."""
    max_excess: float = 0.10
    """Extended MSA's objective may exceed Adam's by this fraction at equal wall time."""

    def __post_init__(self):
        T.check_model_fields(self)
        check_seed(self)
        check_positive(
            self,
            "steps",
            "msa_rho",
            "msa_inner_steps",
            "msa_inner_learning_rate",
            "msa_outer_learning_rate",
            "window",
            "max_excess",
        )
        check(self, "patch", self.patch in (1, 2, 4, 8), "one of 1, 2, 4, 8 (divides 8)")
        check(
            self,
            "steps",
            self.steps >= 10 * self.window,
            f"at least 10 · window = {10 * self.window} (one averaged value)",
        )
        check(self, "batch_size", self.batch_size <= 1347, "at most 1347 (the training split)")

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory.digits_training_bytes`, float32), one
        training at a time: the parameters with their gradient and optimizer copies, and the
        larger of an iteration's stored activations (`batch_size` images of `(8 / patch)² + 1`
        tokens × the scheme's operator evaluations over `num_layers · steps_per_layer` steps;
        the MSA's forward states and costates take about as much) and the held-out
        evaluation's (450 images)."""
        from studies._toolkit import memory as M

        tokens = (8 // self.patch) ** 2 + 1
        return M.digits_training_bytes(self, tokens=tokens, patch_inputs=self.patch**2)


run_identity = T.fingerprint
"""What makes two runs of this study the same run (for its run folder and its checkpoints):
the fields that decide the trained trajectories, not those evaluated afterwards."""


def smoke_config() -> Config:
    return Config(
        steps=60, d=16, num_heads=2, num_layers=2, hidden=32, window=2, checkpoint_every=30
    )


METHODS = ("adam", "emsa", "msa")
LABELS = {"adam": "Adam (exact gradient)", "emsa": "extended MSA", "msa": "basic MSA"}


@dataclasses.dataclass
class Results:
    config: Config
    methods: list
    """The methods trained, in order (`adam`, `emsa`, then `msa` with `include_basic`)."""
    steps: np.ndarray
    """Logged iterations, shared by all methods."""
    seconds: np.ndarray
    """(method, logged iteration): cumulative training seconds at that iteration (the trainer's
    `elapsed_s`, compilation excluded, across resumes; non-decreasing)."""
    objective: np.ndarray
    """(method, logged iteration): the logged batch objective."""
    test_accuracy: np.ndarray
    """(method,): held-out accuracy at the end."""
    steps_per_second: np.ndarray
    compile_time_s: np.ndarray
    equal_time_s: float
    """The wall time of the comparison: the faster method's training time."""
    objective_at_equal_time: np.ndarray
    """(method,): the averaged objective at `equal_time_s`."""
    objective_at_end: np.ndarray
    """(method,): the averaged objective after `steps` iterations."""
    emsa_over_adam_at_equal_time: float
    wall_time_s: float


def _averaged(seconds, objective, t, window):
    """Mean of the last `window` logged objectives at times ≤ t (the first one if none)."""
    last = max(int(np.searchsorted(seconds, t, side="right")), 1)
    return float(np.mean(objective[max(last - window, 0) : last]))


def _adam(config: Config) -> wbc.TrainStep:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        config.learning_rate,
        min(config.warmup, config.steps - 1),
        config.steps,
        config.learning_rate * 0.01,
    )
    return wbc.TrainStep(optax.chain(optax.clip_by_global_norm(config.clip), optax.adam(schedule)))


def _successive_approximations(config: Config, rho: float) -> wbc.TrainStep:
    # The method applies its own update (sgd(1.0)): the optimizer given here is not used.
    return wbc.TrainStep(
        optax.sgd(1.0),
        method=wbc.SuccessiveApproximations(
            rho=rho,
            inner_steps=config.msa_inner_steps,
            inner_learning_rate=config.msa_inner_learning_rate,
            outer_learning_rate=config.msa_outer_learning_rate,
        ),
    )


STEPS = {
    "adam": _adam,
    "emsa": lambda config: _successive_approximations(config, config.msa_rho),
    "msa": lambda config: _successive_approximations(config, 0.0),
}
"""The training step of each method by name (`METHODS`)."""


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    methods = list(METHODS if config.include_basic else METHODS[:2])
    curves, accuracy, rates, compiles = [], [], [], []
    with jax.enable_x64(False):
        task = wbc.digits(config.seed)
        scheme, k = wb.registry.SPLITTING_SCHEMES[config.scheme], config.steps_per_layer
        for name in methods:
            model = T.digits_model(
                config,
                jax.random.key(config.seed),
                scheme,
                k,
                kernel_size=config.patch,
                stride=config.patch,
            )
            result = wbc.train(
                STEPS[name](config),
                model,
                task.train,
                steps=config.steps,
                batch_size=config.batch_size,
                seed=config.seed,
                eval_data=task.test,
                eval_every=config.steps,
                log_every=10,
                run_dir=T.subfolder(run_dir, name),
                checkpoint_every=config.checkpoint_every,
                fingerprint={**T.fingerprint(config), "method": name},
            )
            curves.append(T.curve(result))
            accuracy.append(wbc.evaluate(result.model, task.test))
            rates.append(result.steps_per_second)
            compiles.append(result.compile_time_s)
    seconds = np.stack([c["seconds"] for c in curves])
    objective = np.stack([c["objective"] for c in curves])
    equal = float(np.min(seconds[:, -1]))
    at_equal = np.asarray(
        [_averaged(s, o, equal, config.window) for s, o in zip(seconds, objective)]
    )
    at_end = np.mean(objective[:, -config.window :], axis=1)
    return Results(
        config=config,
        methods=methods,
        steps=curves[0]["steps"],
        seconds=seconds,
        objective=objective,
        test_accuracy=np.asarray(accuracy),
        steps_per_second=np.asarray(rates),
        compile_time_s=np.asarray(compiles),
        equal_time_s=equal,
        objective_at_equal_time=at_equal,
        objective_at_end=at_end,
        emsa_over_adam_at_equal_time=float(at_equal[1] / at_equal[0]),
        wall_time_s=time.perf_counter() - start,
    )


def verdict(results: Results) -> str:
    c, r = results.config, results
    ratio = r.emsa_over_adam_at_equal_time
    answer = "Yes" if ratio <= 1 + c.max_excess else "No"
    return (
        f"{answer}. At equal wall time ({r.equal_time_s:.1f} s of training) extended MSA's "
        f"objective is {r.objective_at_equal_time[1]:.3f} against Adam's "
        f"{r.objective_at_equal_time[0]:.3f} ({ratio:.2f}×; the goal is ≤ {1 + c.max_excess:.2f}×); "
        f"per iteration it runs {r.steps_per_second[0] / r.steps_per_second[1]:.1f}× slower "
        f"than an Adam step, and after {c.steps} iterations each its objective is "
        f"{r.objective_at_end[1]:.3f} against {r.objective_at_end[0]:.3f}."
    )


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    c, r = results.config, results
    rows = [
        (
            LABELS[m],
            f"{r.steps_per_second[i]:.1f}",
            f"{r.compile_time_s[i]:.1f}",
            f"{r.objective_at_equal_time[i]:.3f}",
            f"{r.objective_at_end[i]:.3f}",
            f"{100 * r.test_accuracy[i]:.1f} %",
        )
        for i, m in enumerate(r.methods)
    ]
    return "\n".join(
        [
            f"Digits, {c.num_layers} layers of width {c.d} ({c.num_heads} heads, feed-forward "
            f"{c.hidden}), {64 // c.patch**2 + 1} tokens, batch {c.batch_size}, {c.steps} "
            f"iterations per method, float32. Objective: the batch cross-entropy averaged over "
            f"{c.window} logged values ({10 * c.window} steps). Extended MSA: ρ = {c.msa_rho}, "
            f"{c.msa_inner_steps} inner Adam steps of {c.msa_inner_learning_rate} per layer, "
            f"embedding and head step {c.msa_outer_learning_rate}.",
            "",
            markdown_table(
                [
                    "method",
                    "iterations/s",
                    "compile (s)",
                    f"objective at {r.equal_time_s:.1f} s",
                    f"objective at {c.steps} it.",
                    "held-out accuracy",
                ],
                rows,
            ),
            "",
            f"Wall time {r.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    r = results
    fig, (a, b) = new_figure(ncols=2, figsize=(11, 4.2))
    for i, m in enumerate(r.methods):
        a.semilogy(r.steps, r.objective[i], color=f"C{i}", label=LABELS[m])
        b.semilogy(r.seconds[i], r.objective[i], color=f"C{i}", label=LABELS[m])
    b.axvline(r.equal_time_s, color="gray", ls="--", lw=1, label="equal wall time")
    a.set(xlabel="iteration", ylabel="objective (train batch)", title="per iteration")
    b.set(xlabel="training seconds (compilation excluded)", title="per second")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"msa-vs-gradient: digits, seed {r.config.seed}")
    return {"curves": fig}
