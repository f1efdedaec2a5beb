r"""The training loop: optax on the optimal-control objective, with seeded batches, metrics,
checkpoints, exact resume, a NaN guard and data parallelism over devices.

Exact resume rests on three facts: the batch of step `s` is a function of `(seed, s)`
(`batch_indices`), the augmentation key of step `s` is `fold_in(key(seed), s)`, and a checkpoint
holds the parameters and the optimizer state bit for bit. A run killed at any point and started
again with the same arguments therefore ends with the same parameters as an uninterrupted run.
Started with other arguments on the same folder it refuses (`CheckpointMismatch`), see `train`.
"""

import contextlib
import csv
import dataclasses
import io
import json
import math
import pathlib
import signal
import time
import warnings
import weakref
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._progress import progress_bar
from .._sharding import to_host
from ..io import atomic_write_json, atomic_write_text
from ._checkpoint import (
    CheckpointManager,
    CheckpointMismatch,
    array_text,
    describe,
    differences,
    mismatch_message,
    params_sha256,
)
from ._data import Dataset, batch_indices, check_batch_size
from ._gradients import AbstractGradientMethod, DiscretizeThenOptimize
from ._objective import Objective, accuracy

__all__ = ["TrainingDiverged", "TrainResult", "default_optimizer", "evaluate", "train"]

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


class TrainingDiverged(FloatingPointError):
    """The objective or its gradient became NaN/inf; the message names the step."""


# The arguments of the optimizers `default_optimizer` made, by their `update` function (weak
# keys: an entry goes with its optimizer).
_OPTIMIZER_ARGUMENTS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def default_optimizer(
    learning_rate: float = 3e-3,
    *,
    steps: int,
    warmup: int = 100,
    weight_decay: float = 0.05,
    clip: float = 1.0,
    final_fraction: float = 0.01,
) -> optax.GradientTransformation:
    """AdamW with a linear warm-up to `learning_rate` over `warmup` steps, then cosine decay to
    `final_fraction · learning_rate` at `steps`, after clipping the global gradient norm to
    `clip`. The learning rate is injected (`optax.inject_hyperparams`) so it is logged."""
    for name, value in (("learning_rate", learning_rate), ("clip", clip)):
        if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
            raise ValueError(f"{name}={value!r} must be a finite number > 0.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive integer.")
    warmup = min(int(warmup), max(steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, warmup, max(steps, warmup + 1), learning_rate * final_fraction
    )
    optimizer = optax.chain(
        optax.clip_by_global_norm(clip),
        optax.inject_hyperparams(optax.adamw)(learning_rate=schedule, weight_decay=weight_decay),
    )
    # An optax transformation is a pair of functions that cannot be compared; the arguments
    # that made this one can, and join the run's fingerprint (`_fingerprint`).
    _OPTIMIZER_ARGUMENTS[optimizer.update] = {
        "default_optimizer": {
            "learning_rate": float(learning_rate), "steps": int(steps), "warmup": int(warmup),
            "weight_decay": float(weight_decay), "clip": float(clip),
            "final_fraction": float(final_fraction),
        }
    }  # fmt: skip
    return optimizer


def _learning_rate(opt_state) -> float | None:
    """The learning rate an `optax.inject_hyperparams` optimizer holds, or None (an empty cell in
    `metrics.csv`) for an optimizer without one, e.g. a plain `optax.sgd` or the MSA method's."""
    for s in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams")):
        if hasattr(s, "hyperparams") and "learning_rate" in s.hyperparams:
            return float(s.hyperparams["learning_rate"])
    return None


def _fingerprint(model, data, *, objective, optimizer, opt_state, method, augment, seed,
                 batch_size, steps) -> dict:  # fmt: skip
    """What determines a run's trajectory, as a JSON-able dict (compared on resume):

    - `model`: the model's structure — every module and static field (activation, scheme,
      steps per layer, ...) and the dtype and shape of every parameter array (not the initial
      values: a model initialized on another platform may differ in the last bits);
    - `optimizer`: the structure, dtypes and shapes of its initial state, the values of its
      injected hyperparameters at step 0, and for a `default_optimizer` its arguments. An optax
      transformation is a pair of functions, which cannot be compared: two optimizers of the
      same state structure whose behaviour differs otherwise (`sgd(0.1)` and `sgd(0.2)`, or the
      peak of a schedule warming up from 0) are not told apart here; pass such settings in
      `train`'s `fingerprint`.
    - `objective`, `method`, `augment`: their descriptions with every number (`describe`);
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
    return {
        "model": describe(model, array_values=False),
        "optimizer": {
            "state": describe(opt_state, array_values=False),
            "hyperparams": hyperparams,
            "arguments": _OPTIMIZER_ARGUMENTS.get(optimizer.update),
        },
        "objective": describe(objective),
        "method": describe(method),
        "augment": describe(augment),
        "data": {
            "examples": len(data),
            "inputs": array_text(inputs),
            "targets": array_text(targets),
            "sha256": params_sha256((inputs, targets)),
        },
        "seed": int(seed),
        "batch_size": int(batch_size),
        "steps": int(steps),
    }


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
    """

    model: eqx.Module
    params_sha256: str
    history: list[dict]
    resumed_from: int
    steps_per_second: float
    compile_time_s: float
    num_devices: int


def _mesh(devices):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = list(jax.devices() if devices is None else devices)
    mesh = Mesh(np.asarray(devices), ("batch",))
    return (
        len(devices),
        NamedSharding(mesh, PartitionSpec("batch")),
        NamedSharding(mesh, PartitionSpec()),
    )


def _on_host(tree):
    """The array leaves as host NumPy arrays, gathered across processes where sharded
    (`to_host`: a collective, so every process calls this at the same points)."""
    return jax.tree.map(lambda x: to_host(x) if isinstance(x, jax.Array) else x, tree)


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


@eqx.filter_jit
def _predict(model, xs):
    return jax.vmap(model)(xs)


def evaluate(model, data: Dataset, *, batch_size: int = 512) -> float:
    """Accuracy of `model` on `data` (argmax of the predictions against integer targets; a
    per-position target `< 0` is ignored). One compilation per model structure and batch shape.

    `data` is checked first (`check_data`): labels outside the model's classes, float or
    mis-shaped labels and token ids outside its vocabulary raise, naming `data`, before any
    prediction."""
    from ._data import check_data

    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a workbench.control.Dataset, got {type(data).__name__}.")
    check_data(model, data, "data")
    hits, count = 0.0, 0
    for i in range(0, len(data), batch_size):
        xs, ys = data.inputs[i : i + batch_size], data.targets[i : i + batch_size]
        logits = _predict(model, jnp.asarray(xs))
        keep = np.asarray(ys) >= 0
        hits += float(accuracy(logits, jnp.asarray(ys))) * keep.sum()
        count += keep.sum()
    return hits / max(count, 1)


class _StopRequest:
    """SIGINT/SIGTERM set a flag; the loop checkpoints and stops at the next step boundary."""

    def __init__(self):
        self.signal = None

    @contextlib.contextmanager
    def installed(self):
        import threading

        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

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


def train(
    model: eqx.Module,
    data: Dataset,
    *,
    steps: int,
    batch_size: int,
    objective: Objective | None = None,
    optimizer: optax.GradientTransformation | None = None,
    method: AbstractGradientMethod | None = None,
    seed: int = 0,
    augment: Callable | None = None,
    eval_data: Dataset | None = None,
    eval_every: int | None = None,
    log_every: int = 10,
    run_dir=None,
    checkpoint_every: int = 100,
    keep: int = 3,
    fingerprint: dict | None = None,
    devices=None,
    shard_params: bool = False,
    progress: bool | None = None,
) -> TrainResult:
    r"""Train `model` on `data` by minimizing `objective` with `optimizer`.

    Every step takes the batch `batch_indices(seed, step, len(data), batch_size)`, applies
    `augment(key, inputs)` (if given; `key = fold_in(key(seed), step)`), computes the objective
    and a direction with `method` and applies `optimizer`. Steps whose objective or direction
    is not finite are not applied: training stops with `TrainingDiverged` naming the step
    (the checkpoints on disk are all from finite steps).

    With `run_dir`, the run is durable: `run_dir/checkpoints/` receives a checkpoint every
    `checkpoint_every` steps, at the end, and when SIGINT/SIGTERM arrives (then the process
    stops with `KeyboardInterrupt`); `run_dir/metrics.csv` receives a row every `log_every`
    steps (`elapsed_s`: the cumulative training time, see `METRICS`). Called again with the
    same arguments on the same `run_dir`, `train` resumes from the newest valid checkpoint (a
    corrupted one — damaged, truncated, unreadable — is skipped with a warning for the previous
    one), drops the metrics rows after it, and finishes with the same parameters as an
    uninterrupted run; on a run that already reached `steps` it trains nothing and returns the
    stored model, history and timings (`resumed_from == steps`).

    A run folder belongs to one run. Its identity (`checkpoints/fingerprint.json`, written at
    the start, and every checkpoint's manifest) is what determines the trajectory — the
    model's structure and dtypes, the optimizer's state structure and injected
    hyperparameters, the objective, the gradient method, the augmentation, the data (size and
    a hash of its contents), `seed`, `batch_size`, `steps` (see `_fingerprint` for what cannot
    be compared: optax functions) — extended by the caller's `fingerprint` dict (e.g. a
    study's configuration); not the logging, evaluation and checkpoint settings, the devices
    or the layout. Called with anything else on the same folder, `train` raises
    `CheckpointMismatch` naming what differs (old -> new) before writing anything: the old
    run's checkpoints and `metrics.csv` stay byte for byte as they were. Use a new `run_dir`.

    The batch is split over `devices` (default: all visible devices) along a one-axis mesh;
    parameters and optimizer state are replicated, or with `shard_params` cut over the same
    devices (each array along its largest axis divisible by the device count: a fully sharded
    data-parallel layout for models larger than one device's memory). `batch_size` must be a
    multiple of the device count. Checkpoints hold host arrays: a run restores on any device
    count and layout.

    **Returns:** a `TrainResult`.
    """
    objective = Objective() if objective is None else objective
    method = DiscretizeThenOptimize() if method is None else method
    if not isinstance(objective, Objective):
        raise ValueError(f"objective={objective!r} must be a workbench.control.Objective.")
    if not isinstance(method, AbstractGradientMethod):
        raise ValueError(
            f"method={method!r} is not a gradient method; pass DiscretizeThenOptimize()."
        )
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a workbench.control.Dataset, got {type(data).__name__}.")
    from ._data import check_data
    from ._objective import CrossEntropy

    def whole(value):  # Python and NumPy integers; not bools (True is no count)
        return not isinstance(value, bool) and isinstance(value, (int, np.integer))

    for name, value in (
        ("steps", steps),
        ("log_every", log_every),
        ("checkpoint_every", checkpoint_every),
    ):
        if not whole(value) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer.")
    steps, log_every, checkpoint_every = int(steps), int(log_every), int(checkpoint_every)
    batch_size = check_batch_size(batch_size, len(data))
    if eval_data is not None:
        if not isinstance(eval_data, Dataset):
            raise ValueError(
                f"eval_data must be a workbench.control.Dataset or None, got "
                f"{type(eval_data).__name__}."
            )
        if eval_every is None or not whole(eval_every) or eval_every < 1:
            raise ValueError(
                f"eval_every={eval_every!r} with eval_data given: pass eval_every=N, a positive "
                "integer (the held-out accuracy is measured on the logged steps that are "
                "multiples of N, and at the last step), or leave eval_data=None."
            )
        eval_every = int(eval_every)
    elif eval_every is not None and (not whole(eval_every) or eval_every < 0):
        raise ValueError(f"eval_every={eval_every!r} must be a positive integer or None.")
    # The data against the model, before any step: labels in range for the model's classes,
    # token ids in its vocabulary (shapes by jax.eval_shape; no compute).
    labels = isinstance(objective.terminal, CrossEntropy)  # a custom loss chooses its targets
    check_data(model, data, "data", labels=labels, augment=augment, batch_size=batch_size)
    if eval_data is not None:
        check_data(model, eval_data, "eval_data")
    optimizer = default_optimizer(steps=int(steps)) if optimizer is None else optimizer
    num_devices, batch_sharding, replicated = _mesh(devices)
    if batch_size % num_devices:
        raise ValueError(
            f"batch_size={batch_size} must be a multiple of the number of devices "
            f"({num_devices}) to split the batch evenly."
        )

    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt_state = optimizer.init(params)
    start, history = 0, []
    manager = None
    metrics_path = None
    # The timings of the whole run: training seconds and timed steps (each process's first step,
    # its compilation, left out) and the first process's compile time; a resume continues them.
    train_seconds, timed_steps, compile_time = 0.0, 0, None
    # Several processes (jax.distributed) run this same loop; process 0 alone writes the files.
    writes = jax.process_index() == 0
    if run_dir is not None:
        run_dir = pathlib.Path(run_dir)
        identity = {
            "fingerprint": _json(fingerprint or {}),
            "trainer": _json(
                _fingerprint(model, data, objective=objective, optimizer=optimizer,
                             opt_state=opt_state, method=method, augment=augment, seed=seed,
                             batch_size=batch_size, steps=steps)
            ),
        }  # fmt: skip
        # Every check comes before the first write: a refused call leaves the folder as it was.
        # `fingerprint.json` (the run's identity from its start) covers a run killed before its
        # first checkpoint; the manifests cover folders without it.
        identity_path = run_dir / "checkpoints" / "fingerprint.json"
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
                    raise CheckpointMismatch(mismatch_message(run_dir, changed))
        run_dir.mkdir(parents=True, exist_ok=True)
        manager = CheckpointManager(
            run_dir / "checkpoints", fingerprint=identity["fingerprint"], keep=keep
        )
        restored = manager.restore((params, opt_state))
        if restored is not None:
            start, (params, opt_state), metadata = restored
            if "trainer" not in metadata:
                raise CheckpointMismatch(
                    f"the checkpoints in {manager.folder} record no trainer fingerprint (written "
                    "by an older version of workbench): whether they belong to this run cannot "
                    "be checked, and nothing of the old run was changed. Resume them with the "
                    "version that wrote them, or use a new run folder."
                )
            changed = differences(metadata["trainer"], identity["trainer"], "trainer")
            if changed:
                raise CheckpointMismatch(mismatch_message(run_dir, changed))
            train_seconds = float(metadata.get("train_seconds", 0.0))
            timed_steps = int(metadata.get("timed_steps", 0))
            compile_time = metadata.get("compile_time_s")
        metrics_path = run_dir / "metrics.csv"
        history = _read_metrics(metrics_path, start)
        if writes:
            if not identity_path.exists():
                atomic_write_json(identity_path, identity)
            atomic_write_text(metrics_path, _csv_text(history))
    params_layout = _layout(params, replicated, shard_params)
    state_layout = _layout(opt_state, replicated, shard_params)
    params = jax.device_put(params, params_layout)
    opt_state = jax.device_put(opt_state, state_layout)
    base_key = jax.random.key(seed)

    # Plain `jax.jit` (every argument is an array; the structure is closed over): unlike
    # `eqx.filter_jit` it returns before the step has finished, so the host prepares the next
    # batch meanwhile. A non-finite step is simply not assigned on the host (no select of old
    # and new values in the compiled step).
    @jax.jit
    def train_step(params, opt_state, xs, ys, step):
        if augment is not None:
            xs = augment(jax.random.fold_in(base_key, step), xs)
        model = eqx.combine(params, static)
        (value, aux), direction = method.value_and_direction(objective, model, xs, ys)
        direction = eqx.filter(direction, eqx.is_inexact_array)
        finite = jnp.isfinite(value) & jnp.all(
            jnp.asarray([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(direction)])
        )
        updates, new_state = optimizer.update(direction, opt_state, params)
        new_params = eqx.apply_updates(params, updates)
        # Keep the layout from step to step (XLA would otherwise pick the outputs' placement).
        new_params = jax.lax.with_sharding_constraint(new_params, params_layout)
        new_state = jax.lax.with_sharding_constraint(new_state, state_layout)
        return new_params, new_state, finite, value, aux

    def batch(s):
        """Step `s`'s batch, gathered on the host and placed on the devices."""
        idx = batch_indices(seed, s, len(data), batch_size)
        xs = jax.device_put(jnp.asarray(data.inputs[idx]), batch_sharding)
        ys = jax.device_put(jnp.asarray(data.targets[idx]), batch_sharding)
        return xs, ys

    def save(step):
        if manager is not None:
            host_params, host_state = _on_host((params, opt_state))  # on every process
            if writes:
                metadata = {
                    "params_sha256": params_sha256(host_params),
                    "trainer": identity["trainer"],
                    "train_seconds": train_seconds,
                    "timed_steps": timed_steps,
                    "compile_time_s": compile_time,
                }
                manager.save(step, (host_params, host_state), metadata)

    def rate():
        return timed_steps / train_seconds if train_seconds > 0 else float("nan")

    stop = _StopRequest()
    log_file = None
    try:
        if metrics_path is not None and writes:
            log_file = open(metrics_path, "a", newline="", encoding="utf-8")
            writer = csv.DictWriter(log_file, fieldnames=METRICS, lineterminator="\n")
        with (
            stop.installed(),
            progress_bar(
                int(steps),
                desc="train",
                disable=None if progress is None else not progress,
                initial=start,
            ) as bar,
        ):
            upcoming = batch(start) if start < steps else None
            for s in range(start, int(steps)):
                xs, ys = upcoming
                t0 = time.perf_counter()
                params_new, state_new, finite, value, aux = train_step(
                    params, opt_state, xs, ys, jnp.asarray(s)
                )
                # The step runs asynchronously: gather and place the next batch meanwhile, then
                # wait for this step's result.
                upcoming = batch(s + 1) if s + 1 < steps else None
                finite = _finite_on_host(finite)
                elapsed = time.perf_counter() - t0
                if s > start:
                    timed_steps, train_seconds = timed_steps + 1, train_seconds + elapsed
                elif compile_time is None:  # the run's very first step
                    compile_time = elapsed
                if not finite:
                    last = manager.steps()[0] if manager is not None and manager.steps() else None
                    where = (
                        f"the last good checkpoint is step {last} in {manager.folder}"
                        if last is not None
                        else "no checkpoint was written"
                    )
                    raise TrainingDiverged(
                        f"training diverged at step {s}: the objective or its gradient is not "
                        f"finite (objective = {float(value)}); the update was not applied and "
                        f"{where}. Lower the learning rate, clip harder, or check the data."
                    )
                params, opt_state = params_new, state_new
                done = s + 1
                if done % log_every == 0 or done == steps:
                    row = {
                        "step": done,
                        "objective": float(value),
                        "loss": float(aux["loss"]),
                        "kinetic": float(aux["kinetic"]),
                        "control": float(aux["control"]),
                        "train_accuracy": float(aux["accuracy"]),
                        "eval_accuracy": None,
                        "learning_rate": _learning_rate(opt_state),
                        "elapsed_s": train_seconds,
                    }
                    if (
                        eval_data is not None
                        and eval_every
                        and (done % eval_every == 0 or done == steps)
                    ):
                        row["eval_accuracy"] = evaluate(eqx.combine(params, static), eval_data)
                    history.append(row)
                    if log_file is not None:
                        writer.writerow({k: ("" if row[k] is None else row[k]) for k in METRICS})
                        log_file.flush()
                    bar.set_postfix(loss=f"{row['loss']:.4f}", steps_per_s=f"{rate():.1f}")
                if done % checkpoint_every == 0 or done == steps:
                    save(done)
                bar.update(1)
                if stop.signal is not None:
                    save(done)
                    raise KeyboardInterrupt(
                        f"stopped by signal {signal.Signals(stop.signal).name} after step {done}; "
                        f"checkpoint written, rerun the same command to resume."
                    )
    finally:
        if log_file is not None:
            log_file.close()
    trained = eqx.combine(params, static)
    return TrainResult(
        model=trained,
        params_sha256=params_sha256(_on_host(params)),
        history=history,
        resumed_from=start,
        steps_per_second=rate(),
        compile_time_s=float("nan") if compile_time is None else float(compile_time),
        num_devices=num_devices,
    )
