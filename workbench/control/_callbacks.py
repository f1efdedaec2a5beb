r"""What happens around the training steps, as callbacks: checkpoints and resume, the metrics log,
held-out evaluation and the progress bar. `train` runs the steps and calls, in the order given,

- `on_start(run)` once before the first step (checks first, then a `Checkpoints` restores the
  run; a `MetricsCSV` after it reads back the rows up to the restored step);
- `on_log(run, row)` on every logged step with the metrics row (a dict of `METRICS`; an
  `Evaluate` fills in `eval_accuracy`, a `MetricsCSV` writes it);
- `on_step(run)` after every applied step (a `Checkpoints` saves when due, and when a signal
  asked the run to stop);
- `on_end(run)` once at the end, however the run ends (files are closed there).

A callback reads and may change the `Run`: the current state, the step count, the timings, the
history. `standard_callbacks(run_dir, ...)` is what `train(run_dir=..., eval_data=...)` uses.
Several processes (`jax.distributed`) run every callback; process 0 alone writes files
(`run.writes`).
"""

import abc
import contextlib
import csv
import dataclasses
import io
import json
import pathlib
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import positive_int
from .._progress import progress_bar
from .._sharding import on_host
from ..io import atomic_write_json, atomic_write_text
from ._checkpoint import (
    CheckpointManager,
    CheckpointMismatch,
    differences,
    mismatch_message,
    params_sha256,
)
from ._data import Dataset, check_data, even_batches
from ._objective import accuracy
from ._saved_models import MANIFEST, save_model
from ._train_step import TrainState, TrainStep

__all__ = [
    "METRICS",
    "AbstractCallback",
    "Checkpoints",
    "Evaluate",
    "MetricsCSV",
    "Progress",
    "Run",
    "SaveModel",
    "standard_callbacks",
]

METRICS = (
    "step",
    "objective",
    "loss",
    "kinetic",
    "control",
    "train_accuracy",
    "eval_accuracy",
    "learning_rate",
    "elapsed_s",
)
"""The columns of `metrics.csv` and the keys of `TrainResult.history` rows. `elapsed_s` is the
run's cumulative training time at that step, in seconds: the wall time of the steps (dispatch to
the step's result on the host, the next batch prepared meanwhile), without each process's first
step (compilation) and without evaluation, logging and checkpoint writing; it continues across a
kill and resume (the checkpoint stores it), so it never decreases along the file."""


@dataclasses.dataclass(eq=False)
class Run:
    """The training run as the callbacks see it (made by `train`).

    - `train_step`, `data`, `seed`, `batch_size`, `steps` (the total): what `train` was given;
    - `state`: the current `TrainState`; `done`: the steps done (an int on the host); `start`:
      the step this process started from (after a restore);
    - `history`: the metrics rows so far (restored ones included);
    - `train_seconds`, `timed_steps`, `compile_time`: the whole run's training time (each
      process's first step left out), timed steps and first compile time, continued across
      resumes by `Checkpoints`;
    - `identity`: what determines the trajectory (`train`'s fingerprint), for `Checkpoints`;
    - `stopping`: the signal number when SIGINT/SIGTERM asked the run to stop, else `None`;
    - `last_checkpoint`: `(step, folder)` of the newest checkpoint on disk, where one is kept;
    - `writes`: whether this process writes files (process 0).
    """

    train_step: TrainStep
    data: Dataset
    seed: int
    batch_size: int
    steps: int
    state: TrainState
    identity: dict
    done: int = 0
    start: int = 0
    history: list = dataclasses.field(default_factory=list)
    train_seconds: float = 0.0
    timed_steps: int = 0
    compile_time: float | None = None
    stopping: int | None = None
    last_checkpoint: tuple | None = None
    writes: bool = True

    @property
    def model(self) -> eqx.Module:
        return self.state.model

    def account(self, index: int, seconds: float) -> None:
        """Count step `index`'s wall time: the training time, or the compile time of the run's
        very first step (each process's first step is compilation, not training)."""
        if index > self.start:
            self.timed_steps, self.train_seconds = (
                self.timed_steps + 1,
                self.train_seconds + seconds,
            )
        elif self.compile_time is None:
            self.compile_time = seconds

    def steps_per_second(self) -> float:
        return self.timed_steps / self.train_seconds if self.train_seconds > 0 else float("nan")


class AbstractCallback(abc.ABC):
    """Hooks around the training steps (see the module docstring). Every callback implements
    all four (a hook it does not need does nothing), as equinox's abstract/final rule has it: an
    abstract class declares, a final one implements, nothing is overridden."""

    @abc.abstractmethod
    def on_start(self, run: Run) -> None:
        """Once, before the first step."""

    @abc.abstractmethod
    def on_log(self, run: Run, row: dict) -> None:
        """On every logged step, with its metrics row (which it may fill in)."""

    @abc.abstractmethod
    def on_step(self, run: Run) -> None:
        """After every applied step."""

    @abc.abstractmethod
    def on_end(self, run: Run) -> None:
        """Once at the end, however the run ends."""


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


class Checkpoints(AbstractCallback):
    """Durable training in `folder`: a checkpoint every `every` steps, at the last step and when
    a signal stops the run (the `keep` newest are kept); on start, the newest valid checkpoint
    is restored (a damaged one is skipped with a warning for the previous one), so a killed run
    started again with the same arguments ends with the same parameters.

    The folder belongs to one run: its identity (`fingerprint.json`, written at the start, and
    every checkpoint's manifest) is `train`'s fingerprint of what determines the trajectory,
    extended by `fingerprint` (e.g. a study's configuration). Started with anything else, it
    raises `CheckpointMismatch` naming what differs (old -> new) before writing anything. A
    checkpoint holds host arrays: a run restores on any device count and layout."""

    def __init__(self, folder, *, every: int = 100, keep: int = 3, fingerprint: dict | None = None):
        self.folder = pathlib.Path(folder)
        self.every = _positive("checkpoint_every", every)
        self.keep = _positive("keep", keep)
        self.fingerprint = json.loads(json.dumps(fingerprint or {}))
        self.manager = None

    def on_start(self, run: Run) -> None:
        identity = {"fingerprint": self.fingerprint, "trainer": run.identity}
        # Every check comes before the first write: a refused call leaves the folder as it was.
        # `fingerprint.json` covers a run killed before its first checkpoint.
        identity_path = self.folder / "fingerprint.json"
        if identity_path.exists():
            try:
                recorded = json.loads(identity_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:  # left as it is; the manifests still decide
                warnings.warn(
                    f"{identity_path} is unreadable ({type(e).__name__}: {e}); checking the "
                    "run against its checkpoints only.",
                    UserWarning,
                    stacklevel=2,
                )
            else:
                changed = differences(recorded, identity)
                if changed:
                    raise CheckpointMismatch(mismatch_message(self.folder.parent, changed))
        self.manager = CheckpointManager(self.folder, fingerprint=self.fingerprint, keep=self.keep)
        params, static = eqx.partition(run.state.model, eqx.is_inexact_array)
        restored = self.manager.restore((params, run.state.opt_state))
        if restored is not None:
            done, (params, opt_state), metadata = restored
            if "trainer" not in metadata:
                raise CheckpointMismatch(
                    f"the checkpoints in {self.manager.folder} record no trainer fingerprint "
                    "(written by an older version of workbench): whether they belong to this run "
                    "cannot be checked, and nothing of the old run was changed. Resume them with "
                    "the version that wrote them, or use a new run folder."
                )
            changed = differences(metadata["trainer"], run.identity, "trainer")
            if changed:
                raise CheckpointMismatch(mismatch_message(self.folder.parent, changed))
            model = eqx.combine(params, static)
            run.state = TrainState(model, opt_state, jnp.asarray(done), run.state.key)
            run.done = run.start = done
            run.train_seconds = float(metadata.get("train_seconds", 0.0))
            run.timed_steps = int(metadata.get("timed_steps", 0))
            run.compile_time = metadata.get("compile_time_s")
            run.last_checkpoint = (done, self.manager.folder)
        if run.writes:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not identity_path.exists():
                atomic_write_json(identity_path, identity)

    def on_step(self, run: Run) -> None:
        if run.done % self.every and run.done != run.steps and run.stopping is None:
            return
        params = eqx.filter(run.state.model, eqx.is_inexact_array)
        host_params, host_state = on_host((params, run.state.opt_state))  # on every process
        if run.writes:
            metadata = {
                "params_sha256": params_sha256(host_params),
                "trainer": run.identity,
                "train_seconds": run.train_seconds,
                "timed_steps": run.timed_steps,
                "compile_time_s": run.compile_time,
            }
            self.manager.save(run.done, (host_params, host_state), metadata)
        run.last_checkpoint = (run.done, self.manager.folder)

    def on_log(self, run: Run, row: dict) -> None:
        del run, row

    def on_end(self, run: Run) -> None:
        del run


# --------------------------------------------------------------------------------------------
# Metrics, evaluation, progress
# --------------------------------------------------------------------------------------------


class MetricsCSV(AbstractCallback):
    """The metrics rows in the CSV file `path` (columns `METRICS`), one line per logged step,
    flushed as it is written. On start the rows after the restored step (a killed run's) are
    dropped, and the ones before it read back into the run's history."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.file = None
        self.writer = None

    def on_start(self, run: Run) -> None:
        run.history = _read_metrics(self.path, run.done)
        if run.writes:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, _csv_text(run.history))
            self.file = open(self.path, "a", newline="", encoding="utf-8")
            self.writer = csv.DictWriter(self.file, fieldnames=METRICS, lineterminator="\n")

    def on_log(self, run: Run, row: dict) -> None:
        if self.writer is not None:
            self.writer.writerow({k: ("" if row[k] is None else row[k]) for k in METRICS})
            self.file.flush()

    def on_step(self, run: Run) -> None:
        del run

    def on_end(self, run: Run) -> None:
        if self.file is not None:
            self.file.close()
            self.file = self.writer = None


class Evaluate(AbstractCallback):
    """The held-out accuracy on `data`, in the `eval_accuracy` column of the logged rows whose
    step is a multiple of `every`, and of the last step. `data` is checked against the model
    once, at the start (`check_data`)."""

    def __init__(self, data: Dataset, *, every: int):
        if not isinstance(data, Dataset):
            raise ValueError(
                f"eval_data must be a workbench.control.Dataset, got {type(data).__name__}."
            )
        self.data = data
        self.every = _positive("eval_every", every)

    def on_start(self, run: Run) -> None:
        check_data(run.model, self.data, "eval_data")

    def on_log(self, run: Run, row: dict) -> None:
        if row["step"] % self.every == 0 or row["step"] == run.steps:
            row["eval_accuracy"] = held_out_accuracy(run.model, self.data)

    def on_step(self, run: Run) -> None:
        del run

    def on_end(self, run: Run) -> None:
        del run


class Progress(AbstractCallback):
    """A progress bar over the steps (`tqdm` where installed) with the loss and the steps per
    second; `show`: `True`, `False`, or `None` for "on a terminal" (`WORKBENCH_PROGRESS=0`
    hides it)."""

    def __init__(self, show: bool | None = None):
        self.show = show
        self.stack = None
        self.bar = None

    def on_start(self, run: Run) -> None:
        self.stack = contextlib.ExitStack()
        disable = None if self.show is None else not self.show
        self.bar = self.stack.enter_context(
            progress_bar(run.steps, desc="train", disable=disable, initial=run.done)
        )

    def on_log(self, run: Run, row: dict) -> None:
        self.bar.set_postfix(loss=f"{row['loss']:.4f}", steps_per_s=f"{run.steps_per_second():.1f}")

    def on_step(self, run: Run) -> None:
        self.bar.update(1)

    def on_end(self, run: Run) -> None:
        if self.stack is not None:
            self.stack.close()
            self.stack = self.bar = None


def standard_callbacks(
    run_dir=None,
    *,
    eval_data: Dataset | None = None,
    eval_every: int | None = None,
    checkpoint_every: int = 100,
    keep: int = 3,
    fingerprint: dict | None = None,
    progress: bool | None = None,
) -> list[AbstractCallback]:
    """The callbacks of `train`'s keywords, in their order: `Evaluate(eval_data)` with held-out
    data (it checks the data at the start, before anything is written, and fills the rows'
    `eval_accuracy` before they are written), `Checkpoints(run_dir/checkpoints)` and
    `MetricsCSV(run_dir/metrics.csv)` and `SaveModel(run_dir)` (the finished model, for
    `load_run`) with a `run_dir`, and `Progress(progress)`."""
    callbacks: list[AbstractCallback] = []
    if eval_data is not None:
        if eval_every is None or eval_every == 0:
            raise ValueError(
                f"eval_every={eval_every!r} with eval_data given: pass eval_every=N, a positive "
                "integer (the held-out accuracy is measured on the logged steps that are "
                "multiples of N, and at the last step), or leave eval_data=None."
            )
        callbacks.append(Evaluate(eval_data, every=eval_every))
    elif eval_every is not None and eval_every != 0:
        _positive("eval_every", eval_every)
    if run_dir is not None:
        run_dir = pathlib.Path(run_dir)
        callbacks.append(
            Checkpoints(
                run_dir / "checkpoints", every=checkpoint_every, keep=keep, fingerprint=fingerprint
            )
        )
    if run_dir is not None:
        callbacks.append(MetricsCSV(run_dir / "metrics.csv"))
        held_out = None if eval_data is None else eval_data.inputs
        callbacks.append(SaveModel(run_dir, inputs=held_out))
    callbacks.append(Progress(progress))
    return callbacks


class SaveModel(AbstractCallback):
    """At the end of a finished run, `save_model(folder, model, inputs=...)` with the first
    `examples` inputs of `inputs` (default: of the training data) (process 0 writes; every
    process gathers sharded parameters). A run that stopped early (a signal, a divergence)
    saves nothing; a finished run called again leaves identical files as they are."""

    def __init__(self, folder, *, inputs=None, examples: int = 8):
        self.folder = pathlib.Path(folder)
        self.inputs = inputs
        self.examples = int(examples)

    def on_start(self, run: Run) -> None:
        del run

    def on_log(self, run: Run, row: dict) -> None:
        del run, row

    def on_step(self, run: Run) -> None:
        del run

    def on_end(self, run: Run) -> None:
        if run.done != run.steps:
            return
        model = on_host(run.model)  # a collective where sharded: every process
        if not run.writes:
            return
        manifest = self.folder / MANIFEST
        if manifest.exists():
            try:
                same = json.loads(manifest.read_text(encoding="utf-8")).get(
                    "params_sha256"
                ) == params_sha256(model)
            except (OSError, ValueError):
                same = False
            if same:
                return
        held_out = self.inputs is not None
        inputs = (self.inputs if held_out else run.data.inputs)[: self.examples]
        save_model(
            self.folder,
            model,
            inputs=inputs,
            metadata={
                "steps": run.steps,
                "seed": run.seed,
                "inputs": "held-out" if held_out else "training",
            },
        )


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _positive(name: str, value: Any) -> int:
    """`value` as an int when it is a positive Python or NumPy integer (not a bool)."""
    return positive_int(name, value)


@eqx.filter_jit
def _predict(model, xs):
    return jax.vmap(model)(xs)


def held_out_accuracy(model, data: Dataset, *, batch_size: int = 512, predict=None) -> float:
    """Accuracy of `model` on `data`, unchecked (see `evaluate`); `predict(model, xs)` gives
    the logits of a batch (default: `vmap` of the model, compiled once per model)."""
    predict = _predict if predict is None else predict
    hits, count = 0.0, 0
    for indices, length in even_batches(len(data), batch_size):  # one batch shape
        xs, ys = data.inputs[indices], data.targets[indices[:length]]
        logits = predict(model, jnp.asarray(xs))[:length]
        keep = np.asarray(ys) >= 0
        hits += float(accuracy(logits, jnp.asarray(ys))) * keep.sum()
        count += keep.sum()
    return hits / max(count, 1)


def _read_metrics(path: pathlib.Path, upto: int) -> list[dict]:
    """Rows of `metrics.csv` with `step <= upto` (later or torn rows are dropped)."""
    if not path.exists():
        return []
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                step = int(row["step"])
                parsed = {k: (float(v) if v not in ("", None) else None) for k, v in row.items()}
            except (TypeError, ValueError, KeyError):
                continue
            if step <= upto and all(k in parsed for k in METRICS):
                parsed["step"] = step
                rows.append(parsed)
    return rows


def _csv_text(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=METRICS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in METRICS})
    return buffer.getvalue()
