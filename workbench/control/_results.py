"""What a training run returns: `TrainResult`, its `RESULTS` (how the run ended) and the
`TrainingDiverged` error that `train` raises when `throw=True`."""

import dataclasses

import equinox as eqx

__all__ = ["RESULTS", "TrainResult", "TrainingDiverged"]


class TrainingDiverged(FloatingPointError):
    """The objective or its gradient became NaN/inf; the message names the step."""


class RESULTS(eqx.Enumeration):
    """How a training run ended (`TrainResult.result`), as `workbench.RESULTS` reports a solve:
    an `equinox.Enumeration` item compared with `==` (`result == RESULTS.successful`),
    `RESULTS[result]` its message. `diverged`: stopped at a step that is not finite
    (`train(throw=False)` returns it instead of raising `TrainingDiverged`)."""

    successful = ""
    diverged = (
        "A training step was not finite; TrainResult.message names the step and the arrays, and "
        "TrainResult.model is the last good one. Lower the learning rate or set max_skipped."
    )


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
    - `result`: a `RESULTS` item; with `diverged` (`train(throw=False)`), `model` is the last good
      one (before the step that is not finite) and `message` says where it diverged.
    """

    model: eqx.Module
    params_sha256: str
    history: list[dict]
    resumed_from: int
    steps_per_second: float
    compile_time_s: float
    num_devices: int
    # A factory: an enumeration item is an `equinox.Module`, which `dataclasses` counts as mutable.
    result: RESULTS = dataclasses.field(default_factory=lambda: RESULTS.successful)
    message: str = ""
