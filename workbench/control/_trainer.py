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

import collections
import contextlib
import dataclasses
import enum
import json
import signal
import time
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._callbacks import (
    METRICS as METRICS,
    AbstractCallback,
    Run,
    _positive,
    held_out_accuracy,
    on_host,
    standard_callbacks,
)
from ._checkpoint import (
    array_text,
    describe,
    params_sha256,
)
from ._data import Dataset, batch_indices, check_batch_size, check_data
from ._objective import CrossEntropy
from ._optimizer import _OPTIMIZER_ARGUMENTS
from ._train_step import TrainState, TrainStep

__all__ = [
    "Outcome",
    "TrainingDiverged",
    "TrainResult",
    "evaluate",
    "train",
]


class TrainingDiverged(FloatingPointError):
    """The objective or its gradient became NaN/inf; the message names the step."""


class Outcome(enum.Enum):
    """How a training run ended (`TrainResult.result`): every step done (`successful`), or
    stopped at a step that is not finite (`diverged`; `train(throw=False)` returns it instead of
    raising `TrainingDiverged`)."""

    successful = "successful"
    diverged = "diverged"


def _learning_rate(opt_state) -> float | None:
    """The learning rate an optimizer's state holds in `hyperparams` (`default_optimizer`'s,
    an `optax.inject_hyperparams` one's), or None (an empty cell in
    `metrics.csv`) for an optimizer without one, e.g. a plain `optax.sgd` or the MSA method's."""
    for s in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams")):
        if hasattr(s, "hyperparams") and "learning_rate" in s.hyperparams:
            return float(s.hyperparams["learning_rate"])
    return None


def _fingerprint(model, data, *, train_step, opt_state, seed, batch_size, steps) -> dict:
    """What determines a run's trajectory, as a JSON-able dict (compared on resume):

    - `model`: the model's structure — every module and static field (activation, scheme,
      steps per layer, ...) and the dtype and shape of every parameter array (not the initial
      values: a model initialized on another platform may differ in the last bits);
    - `optimizer`: the structure, dtypes and shapes of the initial state of the step's update
      rule, the values of its injected hyperparameters at step 0, and for a
      `default_optimizer` its arguments. An optax transformation is a pair of functions, which
      cannot be compared: two optimizers of the same state structure whose behaviour differs
      otherwise (`sgd(0.1)` and `sgd(0.2)`, or the peak of a schedule warming up from 0) are
      not told apart here; pass such settings in `Checkpoints`' `fingerprint`.
    - `objective`, `method`, `augment`, `discretization`, `max_skipped`: the step's, with
      every number (`describe`);
    - `data`: the number of examples, the inputs' and targets' dtype and shape and a SHA-256 of
      their contents;
    - `seed`, `batch_size`, `steps`.
    """
    hyperparams = [
        {k: describe(v) for k, v in state.hyperparams.items()}
        for state in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams"))
        if hasattr(state, "hyperparams")
    ]
    inputs, targets = np.asarray(data.inputs), np.asarray(data.targets)
    rule = train_step.method.optimizer(train_step.optimizer)
    return _json({
        "model": describe(model, array_values=False),
        "optimizer": {
            "state": describe(opt_state, array_values=False),
            "hyperparams": hyperparams,
            "arguments": _OPTIMIZER_ARGUMENTS.get(rule.init),
        },
        "objective": describe(train_step.objective),
        "method": describe(train_step.method),
        "augment": describe(train_step.augment),
        "discretization": describe(train_step.discretization),
        "max_skipped": train_step.max_skipped,
        "data": {
            "examples": len(data),
            "inputs": array_text(inputs),
            "targets": array_text(targets),
            "sha256": params_sha256((inputs, targets)),
        },
        "seed": int(seed),
        "batch_size": int(batch_size),
        "steps": int(steps),
    })  # fmt: skip


def _finite_on_host(finite) -> bool:
    """The step's finiteness flag on the host: the loop's one wait for a step's result (the next
    batch is prepared before it)."""
    return bool(finite)


def _json(value):
    """`value` as it reads back from JSON (tuples become lists), for comparisons with a file."""
    return json.loads(json.dumps(value))


@dataclasses.dataclass
class TrainResult:
    """What `train` returns.

    - `model`: the trained model; `params_sha256`: the hash of its floating arrays.
    - `history`: the metrics rows (dicts with the keys of `METRICS`), including those restored
      from an earlier, interrupted run.
    - `resumed_from`: the checkpoint step the run restarted from (0: a fresh run; `steps`: the
      run had already finished, nothing was trained).
    - `steps_per_second`: the training throughput of the whole run, across resumes: the timed
      steps over their cumulative seconds (each process's first step, the compilation, left
      out; NaN when no step was timed, e.g. `steps=1`); `compile_time_s`: the first step's time
      in the process that started the run (kept, not re-measured, when the run resumes).
    - `result`: the `Outcome`; with `diverged` (`train(throw=False)`), `model` is the last good
      one (before the step that is not finite) and `message` says where it diverged.
    """

    model: eqx.Module
    params_sha256: str
    history: list[dict]
    resumed_from: int
    steps_per_second: float
    compile_time_s: float
    num_devices: int
    result: Outcome = Outcome.successful
    message: str = ""


class _Mesh:
    """The devices of a run on a one-axis mesh: batches split along it, arrays replicated."""

    def __init__(self, devices, batch_size: int):
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devices = list(jax.devices() if devices is None else devices)
        self.size = len(devices)
        if batch_size % self.size:
            raise ValueError(
                f"batch_size={batch_size} must be a multiple of the number of devices "
                f"({self.size}) to split the batch evenly."
            )
        mesh = Mesh(np.asarray(devices), ("batch",))
        self.split = NamedSharding(mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(mesh, PartitionSpec())

    def batch(self, data: Dataset, seed: int, s: int, batch_size: int):
        """Step `s`'s batch, gathered on the host and split over the devices."""
        idx = batch_indices(seed, s, len(data), batch_size)
        xs = jax.device_put(jnp.asarray(data.inputs[idx]), self.split)
        return xs, jax.device_put(jnp.asarray(data.targets[idx]), self.split)


class _CompiledStep:
    """The step as one `jax.jit` program of arrays only (parameters, optimizer state, batch, step
    index, the augmentation's key; the model's structure and the step are closed over): unlike
    `eqx.filter_jit` it returns before the step has finished, so the host prepares the next batch
    meanwhile. The key is an argument, not a constant of the program, so runs that differ only
    in their seed compile the same program (read back from JAX's persistent compilation cache
    when one is set), and within one process a later run of the same step, model structure and
    layout reuses the program without tracing it again (`_step_program`). A step that is not
    finite is simply not assigned on the host (no select of old and new values in the
    program)."""

    def __init__(self, train_step: TrainStep, state: TrainState, mesh: _Mesh, shard_params: bool):
        params, static = eqx.partition(state.model, eqx.is_inexact_array)
        self.layouts = (
            _layout(params, mesh.replicated, shard_params),
            _layout(state.opt_state, mesh.replicated, shard_params),
        )
        self.key = state.key
        self.step = _step_program(train_step, static, self.layouts)

    def __call__(self, params, opt_state, xs, ys, index: int):
        return self.step(params, opt_state, xs, ys, jnp.asarray(index), self.key)


_PROGRAMS: "collections.OrderedDict[tuple, Callable]" = collections.OrderedDict()
_PROGRAMS_KEPT = 8
"""The jitted steps of the latest runs (at most `_PROGRAMS_KEPT`), by what they close over."""


def _step_program(train_step: TrainStep, static, layouts) -> Callable:
    """The jitted step for `train_step` on models of structure `static` placed by `layouts`:
    the one an earlier run of this process made for equal ones when there is one.

    Equal means: the same optimizer `update` function (what the step calls; `default_optimizer`
    shares one, its numbers are state, so runs of any learning rate, warm-up or length share the
    program; an optax transformation made anew, e.g. `optax.adam(1e-3)` twice, is another
    program), equal objective, gradient method, augmentation, discretization and `max_skipped`,
    and equal static parts and layouts. Anything unhashable (an array among them) makes a
    program of its own, as before."""

    def step(params, opt_state, xs, ys, index, key):
        before = TrainState(eqx.combine(params, static), opt_state, index, key)
        after, info = train_step(before, (xs, ys))
        new = (eqx.filter(after.model, eqx.is_inexact_array), after.opt_state)
        # Keep the layout from step to step (XLA would otherwise pick the outputs').
        return (*jax.lax.with_sharding_constraint(new, layouts), info)

    try:
        key = (
            train_step.optimizer.update,
            *(_flat(x) for x in (train_step.objective, train_step.method, train_step.augment,
                                 train_step.discretization, static, layouts)),
            train_step.max_skipped,
        )  # fmt: skip
        hash(key)
    except TypeError:
        return jax.jit(step)
    program = _PROGRAMS.pop(key, None)
    if program is None:
        program = jax.jit(step)
    _PROGRAMS[key] = program
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
        _PROGRAMS.popitem(last=False)
    return program


def _flat(tree) -> tuple:
    """`tree` as a hashable value that compares as the tree does: its leaves and structure
    (`TypeError` from `hash` when a leaf is an array)."""
    leaves, treedef = jax.tree.flatten(tree)
    return (tuple(leaves), treedef)


def _leaf_sharding(leaf, replicated):
    """Shard an array over the mesh along its largest axis divisible by the device count (the
    last such axis on ties); replicate it when there is none (scalars, odd sizes)."""
    from jax.sharding import NamedSharding, PartitionSpec

    count = replicated.mesh.size
    shape = getattr(leaf, "shape", ())
    axes = [a for a, n in enumerate(shape) if n % count == 0 and n >= count]
    if count == 1 or not axes:
        return replicated
    axis = max(axes, key=lambda a: (shape[a], a))
    spec = [None] * len(shape)
    spec[axis] = "batch"
    return NamedSharding(replicated.mesh, PartitionSpec(*spec))


def _layout(tree, replicated, shard_params: bool):
    """The placement of every array leaf of `tree`: replicated (data parallel), or each leaf cut
    over the devices along one axis (`shard_params`: each device holds 1/D of the parameters and
    of the optimizer state; XLA gathers a layer's weights where the step needs them)."""
    if not shard_params:
        return jax.tree.map(lambda _: replicated, tree)
    return jax.tree.map(lambda leaf: _leaf_sharding(leaf, replicated), tree)


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


class _StopRequest:
    """SIGINT/SIGTERM set a flag; the loop checkpoints and stops at the next step boundary. A
    signal the process ignores stays ignored, as Python leaves an ignored SIGINT (a shell
    script's background job has SIGINT ignored, so that Ctrl-C of the script's foreground
    command does not stop it)."""

    def __init__(self):
        self.signal = None

    @contextlib.contextmanager
    def installed(self):
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        previous = {s: h for s, h in previous.items() if h is not signal.SIG_IGN}

        def handler(signum, frame):
            del frame
            if self.signal is not None:  # a second signal: stop at once
                signal.default_int_handler(signum, None)
            self.signal = signum

        for s in previous:
            signal.signal(s, handler)
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def train(
    train_step: TrainStep,
    model: eqx.Module,
    data: Dataset,
    *,
    steps: int,
    batch_size: int,
    seed: int = 0,
    log_every: int = 10,
    callbacks: Sequence[AbstractCallback] | None = None,
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

    Callbacks (`AbstractCallback`) run in order: `standard_callbacks(run_dir, eval_data=,
    eval_every=, checkpoint_every=, fingerprint=, progress=)` — checkpoints and exact resume in
    `run_dir/checkpoints/` (another run's folder is refused: `CheckpointMismatch`),
    `run_dir/metrics.csv`, the held-out accuracy, a progress bar — then `callbacks`.

    **Returns:** a `TrainResult` (a finished run called again returns its stored model,
    history and timings, `resumed_from == steps`).
    """
    steps, batch_size, log_every = _check_arguments(
        train_step, model, data, steps=steps, batch_size=batch_size, log_every=log_every
    )
    callbacks = [*standard_callbacks(
        run_dir, eval_data=eval_data, eval_every=eval_every, checkpoint_every=checkpoint_every,
        fingerprint=fingerprint, progress=progress), *(callbacks or ())]  # fmt: skip
    mesh = _Mesh(devices, batch_size)
    run = _new_run(train_step, model, data, seed=seed, batch_size=batch_size, steps=steps)
    for callback in callbacks:
        callback.on_start(run)
    compiled = _CompiledStep(train_step, run.state, mesh, shard_params)
    params, static = eqx.partition(run.state.model, eqx.is_inexact_array)
    params, opt_state = jax.device_put((params, run.state.opt_state), compiled.layouts)
    stop, skipped, failure = _StopRequest(), 0, ""
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
                run.state = TrainState(eqx.combine(params, static), opt_state,
                                       jnp.asarray(run.done), run.state.key)  # fmt: skip
                _after_step(run, callbacks, info, log_every, stop.signal)
        if failure and throw:
            raise TrainingDiverged(failure)
    finally:
        for callback in callbacks:
            callback.on_end(run)
    return TrainResult(run.model, params_sha256(on_host(params)), run.history, run.start,
                       run.steps_per_second(), _nan_if_none(run.compile_time), mesh.size,
                       Outcome.diverged if failure else Outcome.successful, failure)  # fmt: skip


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
    check_data(model, data, "data", labels=labels, augment=train_step.augment,
               batch_size=batch_size)  # fmt: skip
    return steps, batch_size, log_every


def _new_run(train_step, model, data, *, seed, batch_size, steps) -> Run:
    """The run before its callbacks start: the step's initial state (key `key(seed)`) and the
    run's identity (`_fingerprint`); process 0 writes the files."""
    state = train_step.init(model, key=jax.random.key(seed))
    identity = _fingerprint(model, data, train_step=train_step, opt_state=state.opt_state,
                            seed=seed, batch_size=batch_size, steps=steps)  # fmt: skip
    return Run(train_step, data, int(seed), batch_size, steps, state, identity,
               writes=jax.process_index() == 0)  # fmt: skip


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
    arrays = (f"not finite in {len(where)} array(s) of the direction: {', '.join(where[:4])}"
              + (", ..." if len(where) > 4 else "")) if where else "the direction is finite"  # fmt: skip
    last = run.last_checkpoint
    kept = f"the last good checkpoint is step {last[0]} in {last[1]}" if last else (
        "no checkpoint was written")  # fmt: skip
    skipped = f" after {step.max_skipped} skipped step(s)" if step.max_skipped else ""
    return (
        f"training diverged at step {s}{skipped}: the objective is {float(info['objective'])}, "
        f"{arrays}; the update was not applied and {kept}. Lower the learning rate, clip "
        "harder, or check the data."
    )


def _nan_if_none(value) -> float:
    return float("nan") if value is None else float(value)
