r"""The training loop: a `TrainStep` run over seeded batches on a mesh of devices, with
callbacks for checkpoints and exact resume, the metrics log, evaluation and progress, a NaN
guard and signals.

Exact resume rests on three facts: the batch of step `s` is a function of `(seed, s)`
(`batch_indices`), the augmentation key of step `s` is `fold_in(key(seed), s)`, and a checkpoint
holds the parameters and the optimizer state bit for bit. A run killed at any point and started
again with the same arguments therefore ends with the same parameters as an uninterrupted run.
Started with other arguments on the same folder it refuses (`CheckpointMismatch`, see
`Checkpoints`).
"""

import signal
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._sharding import on_host
from ._callbacks import Run, _positive, held_out_accuracy, standard_callbacks
from ._checkpoint import params_sha256
from ._data import Dataset, check_batch_size, check_data
from ._fingerprint import run_fingerprint
from ._mesh import BatchMesh, CompiledStep
from ._objective import CrossEntropy
from ._results import RESULTS, TrainingDiverged, TrainResult
from ._signals import StopRequest
from ._train_step import TrainState, TrainStep

__all__ = ["evaluate", "train"]


def _learning_rate(opt_state) -> float | None:
    """The learning rate an optimizer's state holds in `hyperparams` (`default_optimizer`'s,
    an `optax.inject_hyperparams` one's), or None (an empty cell in
    `metrics.csv`) for an optimizer without one, e.g. a plain `optax.sgd` or the MSA method's."""
    for s in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams")):
        if hasattr(s, "hyperparams") and "learning_rate" in s.hyperparams:
            return float(s.hyperparams["learning_rate"])
    return None


def _finite_on_host(finite) -> bool:
    """The step's finiteness flag on the host: the loop's one wait for a step's result (the next
    batch is prepared before it)."""
    return bool(finite)


def evaluate(model, data: Dataset, *, batch_size: int = 512) -> float:
    """Accuracy of `model` on `data` (argmax of the predictions against integer targets; a
    per-position target `< 0` is ignored). One compilation per model structure and batch shape.

    `data` is checked first (`check_data`): labels outside the model's classes, float or
    mis-shaped labels and token ids outside its vocabulary raise, naming `data`, before any
    prediction."""
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a workbench.control.Dataset, got {type(data).__name__}.")
    check_data(model, data, "data")
    return held_out_accuracy(model, data, batch_size=batch_size)


def train(
    train_step: TrainStep,
    model: eqx.Module,
    data: Dataset,
    *,
    steps: int,
    batch_size: int,
    seed: int = 0,
    log_every: int = 10,
    run_dir=None,
    eval_data: Dataset | None = None,
    eval_every: int | None = None,
    checkpoint_every: int = 100,
    fingerprint: dict | None = None,
    progress: bool | None = None,
    devices=None,
    shard_params: bool = False,
    throw: bool = True,
) -> TrainResult:
    r"""Run `train_step` on `model` for `steps` steps of `batch_size` examples of `data`.

    Step `s` takes the batch `batch_indices(seed, s, len(data), batch_size)`, split over
    `devices` (default: all visible; `batch_size` a multiple of their count); parameters and
    optimizer state are replicated or, with `shard_params`, each array is cut along its largest
    axis divisible by the device count (fully sharded data parallel). A metrics row (`METRICS`)
    is logged every `log_every` steps and at the last. A step that is not finite stops the run
    with `TrainingDiverged` naming the step and where it is not finite (or is skipped:
    `TrainStep.max_skipped`; with `throw=False` the result says `diverged` instead); SIGINT and
    SIGTERM stop it after the step's callbacks (a checkpoint is written): `KeyboardInterrupt`.
    A signal the process ignores (SIGINT in a shell script's background job) stays ignored.

    With `run_dir`, the run is durable: checkpoints and exact resume in `run_dir/checkpoints/`
    every `checkpoint_every` steps (another run's folder is refused: `CheckpointMismatch`; the
    run's identity is extended by `fingerprint`, e.g. a study's configuration), the metrics in
    `run_dir/metrics.csv`, and the finished model in `run_dir/model.json` + `model.eqx`
    (`load_run`). With `eval_data`, the held-out accuracy fills the rows of the logged steps that
    are multiples of `eval_every`. `progress`: a progress bar (`None`: on a terminal). A loop of
    one's own (other hooks, logging elsewhere) is written around `TrainStep` directly.

    **Returns:** a `TrainResult` (a finished run called again returns its stored model,
    history and timings, `resumed_from == steps`).
    """
    steps, batch_size, log_every = _check_arguments(
        train_step, model, data, steps=steps, batch_size=batch_size, log_every=log_every
    )
    callbacks = standard_callbacks(
        run_dir,
        eval_data=eval_data,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
        fingerprint=fingerprint,
        progress=progress,
    )
    mesh = BatchMesh(devices, batch_size)
    run = _new_run(train_step, model, data, seed=seed, batch_size=batch_size, steps=steps)
    for callback in callbacks:
        callback.on_start(run)
    compiled = CompiledStep(train_step, run.state, mesh, shard_params)
    params, static = eqx.partition(run.state.model, eqx.is_inexact_array)
    params, opt_state = jax.device_put((params, run.state.opt_state), compiled.layouts)
    stop, skipped, failure = StopRequest(), 0, ""
    try:
        with stop.installed():
            upcoming = mesh.batch(data, seed, run.done, batch_size) if run.done < steps else None
            for s in range(run.done, steps):
                t0, batch = time.perf_counter(), upcoming
                new_params, new_state, info = compiled(params, opt_state, *batch, s)
                # The step runs asynchronously: the next batch is placed meanwhile.
                upcoming = mesh.batch(data, seed, s + 1, batch_size) if s + 1 < steps else None
                finite = _finite_on_host(info["finite"])
                run.account(s, time.perf_counter() - t0)
                skipped = 0 if finite else skipped + 1
                if skipped > train_step.max_skipped:
                    failure = _divergence(run, s, info, params, static, batch)
                    break
                params, opt_state, run.done = new_params, new_state, s + 1
                run.state = TrainState(
                    eqx.combine(params, static), opt_state, jnp.asarray(run.done), run.state.key
                )
                _after_step(run, callbacks, info, log_every, stop.signal)
        if failure and throw:
            raise TrainingDiverged(failure)
    finally:
        for callback in callbacks:
            callback.on_end(run)
    return TrainResult(
        run.model,
        params_sha256(on_host(params)),
        run.history,
        run.start,
        run.steps_per_second(),
        _nan_if_none(run.compile_time),
        mesh.size,
        RESULTS.diverged if failure else RESULTS.successful,
        failure,
    )


def _check_arguments(train_step, model, data, *, steps, batch_size, log_every):
    """`(steps, batch_size, log_every)` as ints, after checking every argument of `train` and
    the data against the model (labels in range for its classes when the loss is
    `CrossEntropy`, token ids in its vocabulary: shapes by `jax.eval_shape`, no compute)."""
    if not isinstance(train_step, TrainStep):
        raise ValueError(
            f"train: the first argument must be a workbench.control.TrainStep, got "
            f"{type(train_step).__name__}; write train(TrainStep(optimizer, objective=..., "
            "method=...), model, data, steps=..., batch_size=...)."
        )
    if not isinstance(model, eqx.Module):
        raise ValueError(f"model must be an equinox Module, got {type(model).__name__}.")
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a workbench.control.Dataset, got {type(data).__name__}.")
    steps, log_every = _positive("steps", steps), _positive("log_every", log_every)
    batch_size = check_batch_size(batch_size, len(data))
    labels = isinstance(train_step.objective.terminal, CrossEntropy)  # a custom loss: its own
    check_data(
        model, data, "data", labels=labels, augment=train_step.augment, batch_size=batch_size
    )
    return steps, batch_size, log_every


def _new_run(train_step, model, data, *, seed, batch_size, steps) -> Run:
    """The run before its callbacks start: the step's initial state (key `key(seed)`) and the
    run's identity (`run_fingerprint`); process 0 writes the files."""
    state = train_step.init(model, key=jax.random.key(seed))
    identity = run_fingerprint(
        model,
        data,
        train_step=train_step,
        opt_state=state.opt_state,
        seed=seed,
        batch_size=batch_size,
        steps=steps,
    )
    return Run(
        train_step,
        data,
        int(seed),
        batch_size,
        steps,
        state,
        identity,
        writes=jax.process_index() == 0,
    )


def _after_step(run: Run, callbacks, info: dict, log_every: int, signal_number) -> None:
    """The callbacks after a step: a metrics row every `log_every` steps and at the last (to
    `on_log`, then the history), `on_step`; then `KeyboardInterrupt` if a signal arrived."""
    if run.done % log_every == 0 or run.done == run.steps:
        row = _row(run, info, run.state.opt_state)
        for callback in callbacks:
            callback.on_log(run, row)
        run.history.append(row)
    run.stopping = signal_number
    for callback in callbacks:
        callback.on_step(run)
    if signal_number is not None:
        raise KeyboardInterrupt(
            f"stopped by signal {signal.Signals(signal_number).name} after step {run.done}; "
            "checkpoint written, rerun the same command to resume."
        )


def _row(run: Run, info: dict, opt_state) -> dict:
    """The metrics row (`METRICS`) of the step just done."""
    return {
        "step": run.done,
        "objective": float(info["objective"]),
        "loss": float(info["loss"]),
        "kinetic": float(info["kinetic"]),
        "control": float(info["control"]),
        "train_accuracy": float(info["accuracy"]),
        "eval_accuracy": None,
        "learning_rate": _learning_rate(opt_state),
        "elapsed_s": run.train_seconds,
    }


def _divergence(run: Run, s: int, info: dict, params, static, batch) -> str:
    """The message of a step that is not finite: the step, the objective, the arrays whose
    direction is not finite (their path in the model and, for stacked per-layer controls, the
    first layer), and the last good checkpoint."""
    model = eqx.combine(params, static)
    step = run.train_step
    _, direction = eqx.filter_jit(step.value_and_direction)(model, batch, run.state.key, s)
    where = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(eqx.filter(direction, eqx.is_array)):
        bad = ~np.isfinite(np.asarray(leaf))
        if bad.any():
            first = np.argwhere(bad)[0]
            layer = f" (first at index {tuple(int(i) for i in first)})" if leaf.ndim else ""
            where.append(f"{jax.tree_util.keystr(path)}{layer}")
    arrays = (
        (
            f"not finite in {len(where)} array(s) of the direction: {', '.join(where[:4])}"
            + (", ..." if len(where) > 4 else "")
        )
        if where
        else "the direction is finite"
    )
    last = run.last_checkpoint
    kept = (
        f"the last good checkpoint is step {last[0]} in {last[1]}"
        if last
        else ("no checkpoint was written")
    )
    skipped = f" after {step.max_skipped} skipped step(s)" if step.max_skipped else ""
    return (
        f"training diverged at step {s}{skipped}: the objective is {float(info['objective'])}, "
        f"{arrays}; the update was not applied and {kept}. Lower the learning rate, clip "
        "harder, or check the data."
    )


def _nan_if_none(value) -> float:
    return float("nan") if value is None else float(value)
