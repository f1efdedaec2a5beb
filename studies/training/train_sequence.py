"""Does a causal Transformer trained as the optimal control of its equation learn to sort short
sequences to the target held-out token accuracy (99 %), and is the trained network still a
faithful discretization of its equation?

Task (`wb.control.sorting`): `length` random symbols from `[0, vocab)`, a separator, then the
sorted symbols shifted by one (teacher forcing); the model predicts the next sorted symbol at
every answer position (the prompt is not scored). Held-out sequences are distinct from the
training ones. Model: a causal pre-norm equation (the GPT-2 form, `random_transformer(...,
causal=True)`): token and position embeddings give the initial condition, layers of causal
attention + GELU feed-forward are solved by Lie–Trotter with one step per layer (or the scheme
and steps of a discretization plan, `--plan runs/plan/plan.json`), and a linear head reads every
position of the final state. Training: AdamW with warm-up and cosine decay, gradient clipping,
float32, the exact gradient of the discrete model. The baseline predicts, at each answer
position, the symbol most frequent there in the training answers.

Durable: with an output folder, checkpoints go to `checkpoints/` every `checkpoint_every` steps
and on SIGINT/SIGTERM, metrics to `metrics.csv`; rerunning the same command after a kill resumes
and ends with the same `final_params_sha256`. After training, `certificate.json` records the
trained network's error against a refined solve of its equation, its observed order, its largest
stable step and whether the plan's tolerance still holds (float64).

Figures: `training` (objective and held-out token accuracy against the step).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_seed
from studies._toolkit.fields import (
    Costs,
    Depth,
    Method,
    Smoothness,
    Sorting,
    Steps,
    TrainingFields,
    WeightDecay,
    defaults,
)

NAME = "train-sequence"
SUMMARY = (
    "Train a causal GPT-style equation to sort sequences (optax): held-out token accuracy, "
    "resumable, certified."
)


@dataclasses.dataclass(frozen=True)
@defaults(num_layers=2, target_accuracy=0.99, kinetic=0.05)
class Config(Sorting, Depth, Method, Costs, Smoothness, Steps, WeightDecay, TrainingFields):
    def __post_init__(self):
        T.check_training_fields(self)
        check_seed(self)
        for field, low in (
            ("steps", 1),
            ("length", 2),
            ("vocab", 2),
            ("num_train", 1),
            ("num_test", 1),
        ):
            value = getattr(self, field)
            check(
                self,
                field,
                isinstance(value, int) and not isinstance(value, bool) and value >= low,
                f"an integer >= {low}",
            )
        check(
            self,
            "num_train",
            self.vocab**self.length >= 2 * (self.num_train + self.num_test),
            f"num_train + num_test at most half the {self.vocab}^{self.length} distinct "
            "sequences (raise vocab or length)",
        )
        check(
            self,
            "certificate_examples",
            isinstance(self.certificate_examples, int)
            and 0 <= self.certificate_examples <= self.num_test,
            "an integer in [0, num_test]",
        )
        check(
            self,
            "batch_size",
            self.batch_size <= self.num_train,
            f"at most num_train ({self.num_train})",
        )

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory.training_bytes`, float32): the
        parameters (token and position embeddings, the equation, a `vocab + 1`-class head on every
        position) with their gradient and AdamW copies, and the larger of the training step's stored
        activations (`batch_size` sequences of `2 · length` tokens × the scheme's operator
        evaluations over `num_layers · steps_per_layer` steps, or the plan's) and a held-out
        evaluation's (512 sequences at a time); plus the task's data (`4 · (num_train + num_test)`
        drawn sequences, deduplicated, in int64)."""
        from studies._toolkit import memory as M

        tokens, classes = 2 * self.length, self.vocab + 1
        scheme, spl = M.discretization(self)
        params = (
            M.encoder_parameters(self.d, self.hidden, self.num_layers)
            + (classes + tokens) * self.d  # token and position embeddings
            + (self.d + 1) * classes
            + 2 * self.d  # head, final LayerNorm
        )
        total = self.num_train + self.num_test
        data = M.array_bytes(4 * 4 * total, self.length) + M.array_bytes(
            2, total, tokens, itemsize=4
        )
        logits = M.array_bytes(self.batch_size, tokens, classes, itemsize=M.F32)
        return (
            data
            + logits
            + M.training_bytes(
                params=params,
                batch=self.batch_size,
                tokens=tokens,
                d=self.d,
                hidden=self.hidden,
                heads=self.num_heads,
                steps=self.num_layers * spl,
                evaluations=M.scheme_evaluations(scheme),
                eval_batch=min(512, self.num_test),
            )
        )


run_identity = T.fingerprint
"""What makes two runs of this study the same run (for its run folder and its checkpoints):
the fields that decide the trained trajectories, not those evaluated afterwards."""


def smoke_config() -> Config:
    return Config(
        steps=200,
        d=32,
        num_heads=2,
        num_layers=2,
        hidden=64,
        warmup=30,
        checkpoint_every=50,
        certificate_examples=1,
        max_spread=0.03,
        target_accuracy=0.7,
    )


@dataclasses.dataclass
class Results:
    config: Config
    test_accuracy: float
    """Held-out token accuracy on the answer positions."""
    final_params_sha256: str
    baseline_accuracy: float
    """Per answer position, the symbol most frequent there in the training answers."""
    num_steps: int
    resumed_from: int
    steps_per_second: float
    compile_time_s: float
    wall_time_s: float
    num_devices: int
    history_steps: np.ndarray
    history_objective: np.ndarray
    history_eval_steps: np.ndarray
    history_eval_accuracy: np.ndarray
    certificate: dict | None


def _model(config: Config, key, num_classes: int, scheme, steps_per_layer):
    k1, k2 = jax.random.split(key)
    return wbc.ControlledModel(
        wbc.TokenEmbedding(num_classes, 2 * config.length, config.d, key=k1),
        wbc.random_transformer(
            k2,
            d=config.d,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
            hidden=config.hidden,
            activation=T.activation(config),
            causal=True,
            scheme=scheme,
            steps_per_layer=steps_per_layer,
        ),
        wbc.SequenceHead(config.d, num_classes),
    )


def _baseline(task) -> float:
    """Token accuracy of predicting, at each answer position, its most frequent training symbol."""
    train, test = np.asarray(task.train.targets), np.asarray(task.test.targets)
    hits = count = 0
    for j in range(train.shape[1]):
        seen = train[:, j][train[:, j] >= 0]
        want = test[:, j][test[:, j] >= 0]
        if len(seen) and len(want):
            hits += int(np.sum(want == np.bincount(seen).argmax()))
        count += len(want)
    return hits / max(count, 1)


def compute(config: Config, *, run_dir=None) -> Results:
    return train(config, run_dir=run_dir)[0]


def train(config: Config, *, run_dir=None) -> tuple[Results, wbc.TrainResult]:
    """`compute`'s results and `wbc.train`'s result (the trained model, float32, at its own
    discretization; the history across resumes)."""
    start = time.perf_counter()
    plan = T.load_plan(config)
    with jax.enable_x64(False):  # training in float32, whatever the caller's setting
        task = wbc.sorting(
            config.seed,
            length=config.length,
            vocab=config.vocab,
            num_train=config.num_train,
            num_test=config.num_test,
        )
        scheme, steps_per_layer = T.discretization(config, plan)
        model = _model(
            config, jax.random.key(config.seed), task.num_classes, scheme, steps_per_layer
        )
        steps = config.steps
        result = wbc.train(
            T.train_step(config, steps),
            model,
            task.train,
            steps=steps,
            batch_size=config.batch_size,
            seed=config.seed,
            eval_data=task.test,
            eval_every=max(steps // 5, 1),
            log_every=10,
            run_dir=run_dir,
            checkpoint_every=config.checkpoint_every,
            fingerprint=T.fingerprint(config),
            shard_params=config.shard_params,
        )
        accuracy = wbc.evaluate(result.model, task.test)
    results = Results(
        **T.training_results(
            config,
            result,
            task,
            plan,
            accuracy=accuracy,
            steps=steps,
            baseline=_baseline(task),
            start=start,
        )
    )
    return results, result


artifacts = T.certificate_artifacts


def verdict(results: Results) -> str:
    c = results.config
    return (
        T.training_verdict(results, "token accuracy")
        + f" (sorting {c.length} symbols of {c.vocab}, seed "
        f"{c.seed}, {results.num_steps} steps, {results.wall_time_s:.0f} s; the most frequent "
        f"symbol per position: {100 * results.baseline_accuracy:.2f} %)."
    )


def report(results: Results) -> str:
    c = results.config
    lines = [
        f"Held-out token accuracy **{100 * results.test_accuracy:.2f} %** on the answer "
        f"positions of {c.num_test} sequences (sorting {c.length} symbols of {c.vocab}) after "
        f"{results.num_steps} steps of batch {c.batch_size} ({c.num_train} training sequences); "
        f"the most frequent symbol per position gets {100 * results.baseline_accuracy:.2f} %. "
        f"Causal pre-norm equation, d = {c.d}, {c.num_heads} heads, {c.num_layers} layers, "
        f"feed-forward {c.hidden}. Throughput {results.steps_per_second:.1f} steps/s on "
        f"{results.num_devices} device(s), first step (compilation) "
        f"{results.compile_time_s:.1f} s, wall time {results.wall_time_s:.0f} s"
        + (f", resumed from step {results.resumed_from}" if results.resumed_from else "")
        + ".",
        "",
        f"Final parameters SHA-256: `{results.final_params_sha256}`.",
    ]
    lines += T.certificate_lines(results.certificate)
    return "\n".join(lines)


def figures(results: Results) -> dict:
    return {"training": T.training_figure(results, "train-sequence", "held-out token accuracy")}
