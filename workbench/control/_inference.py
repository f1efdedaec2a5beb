r"""Adaptive inference of a trained model: its equation solved by a diffrax solver with a
step-size controller, per example, and the accuracy, work and time that takes.

A trained `ControlledModel` is `x ↦ head(u(T))` with `u` solving its equation; its own
discretization (a splitting scheme, `k` steps per layer) is one way of solving it. An adaptive
solver picks the steps per example from an error estimate: `adaptive_accuracy` reports the
held-out accuracy it reaches and the **field evaluations** it spends on each example, where one
field evaluation is one call of the whole vector field `Σ_k G_k(u; θ(t))` (every operator once:
attention and feed-forward). In those units a Lie–Trotter step is one evaluation (each operator
once), so the model's own fixed grid costs `k · L` per example, `L` the layer count.

Each example is one solve over the whole depth `[0, T]` (`workbench.integrate`), whatever the
basis of the controls. Piecewise-constant controls jump at the layer boundaries, which are
declared to the step-size controller: no step crosses one, so every layer costs at least one
step, and a first-same-as-last solver evaluates its first stage again after each. A smooth
basis (`wb.LegendreBasis`) has no jumps: the steps may span layers. The first step tried is
one piece of the basis (a layer, or the whole depth for a one-piece basis) unless `dt0` says
otherwise; the evaluations are counted during the solve (`Solution.stats`), rejected steps
included.
"""

import dataclasses
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import positive_float, positive_int
from .._integrate import integrate
from .._solution import RESULTS
from ._data import Dataset, even_batches
from ._models import ControlledModel


@dataclasses.dataclass(frozen=True)
class AdaptiveAccuracy:
    """What `adaptive_accuracy` measured.

    - `accuracy`: held-out accuracy (targets `< 0` ignored), a fraction.
    - `evaluations`: field evaluations per example (NumPy, one per input).
    - `failed`: how many examples' solves did not succeed (`max_steps` reached, non-finite);
      they count as wrong.
    - `failed_examples`: their indices into `data` (NumPy, increasing).
    - `seconds_per_example`: wall time of the solves (and the head) per example, measured
      after the program was compiled; `compile_seconds`: the time to trace and compile it
      (close to 0 when an earlier call compiled the same structure).
    - `solver`, `rtol`, `atol`, `dt0`: what was used (`dt0` the first step tried).
    - `correct`: per example (one-label tasks), whether it was classified right (a failed solve
      is wrong), in the data's order: the input of a paired comparison with a fixed grid
      (`workbench.analysis.paired_difference`); `None` for per-position targets.
    """

    accuracy: float
    evaluations: np.ndarray
    failed: int
    solver: str
    rtol: float
    atol: float
    failed_examples: np.ndarray
    seconds_per_example: float
    compile_seconds: float
    dt0: float
    correct: np.ndarray | None = None

    @property
    def mean_evaluations(self) -> float:
        return float(np.mean(self.evaluations))

    @property
    def std_evaluations(self) -> float:
        return float(np.std(self.evaluations))

    def to_dict(self) -> dict:
        e = self.evaluations
        return {
            "accuracy": self.accuracy,
            "solver": self.solver,
            "rtol": self.rtol,
            "atol": self.atol,
            "dt0": self.dt0,
            "failed": self.failed,
            "failed_examples": [int(i) for i in self.failed_examples],
            "mean_evaluations": self.mean_evaluations,
            "std_evaluations": self.std_evaluations,
            "min_evaluations": int(e.min()),
            "max_evaluations": int(e.max()),
            "seconds_per_example": self.seconds_per_example,
            "compile_seconds": self.compile_seconds,
        }


def adaptive_accuracy(
    model: ControlledModel,
    data: Dataset,
    *,
    solver=None,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    dt0: float | None = None,
    max_steps: int = 1024,
    batch_size: int = 256,
) -> AdaptiveAccuracy:
    r"""Held-out accuracy of `model` with its equation solved adaptively over `[0, T]`, the
    field evaluations per example (see the module docstring for the unit) and the time.

    **Arguments:**

    - `model`: a trained `ControlledModel`, its controls in any basis (its scheme and steps are
      not used).
    - `data`: the held-out `Dataset`.
    - `solver`: an adaptive diffrax solver with an error estimate; `diffrax.Bosh3()` (order 3,
      four stages, FSAL: three new evaluations per step, four on the first step and on the
      first step after each layer boundary) by default; `diffrax.Heun()` (order 2 with an
      Euler estimate) costs two per step, `diffrax.Tsit5()` six (seven).
    - `rtol`, `atol`: the `diffrax.PIDController` tolerances.
    - `dt0`: the first step tried; `None`: one piece of the controls' basis, `T / L` for a
      network's layers (or piecewise-linear controls), the whole depth `T` for a one-piece
      basis (`wb.LegendreBasis`).
    - `max_steps`: the most steps (accepted and rejected) of one example's solve over
      `[0, T]`; an example that needs more is reported in `failed_examples`.
    - `batch_size`: at most this many examples per compiled batch (the batches are of
      near-equal length, padded to one shape: one compilation).

    **Returns:** an `AdaptiveAccuracy`. An example whose solve fails (`max_steps` reached, a
    non-finite state) raises nothing: it counts as wrong, its index is in `failed_examples`,
    and the other examples' numbers are those they have alone.

    **Example:** `wbc.adaptive_accuracy(model, task.test, rtol=1e-3, atol=1e-3).failed_examples`.
    """
    if not isinstance(model, ControlledModel):
        raise ValueError(f"model must be a ControlledModel, got {type(model).__name__}.")
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a workbench.control.Dataset, got {type(data).__name__}.")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name}={value!r} must be a positive number.")
    equation = model.transformer.equation
    dt0 = equation.piece_length if dt0 is None else positive_float("dt0", dt0, hint="a step")
    max_steps = positive_int("max_steps", max_steps)
    solver = diffrax.Bosh3() if solver is None else solver
    if not isinstance(solver, diffrax.AbstractAdaptiveSolver):
        raise ValueError(
            f"solver={solver!r} has no error estimate; pass an adaptive diffrax solver: "
            "diffrax.Bosh3(), Tsit5(), Dopri5(), Heun()."
        )
    # The tolerances and the first step are arguments of the compiled solve, not constants of
    # it: every tolerance, and every model of the same structure, runs the same program (the
    # batches have one shape).
    options = jnp.asarray([rtol, atol, dt0])
    batches = list(even_batches(len(data), batch_size))
    args = lambda indices: (model, solver, options, jnp.asarray(data.inputs[indices]), max_steps)
    start = time.perf_counter()
    _adaptive_batch.lower(*args(batches[0][0])).compile()  # cached for the calls below
    compile_seconds = time.perf_counter() - start
    hits = count = 0
    evaluations, failed, seconds, correct = [], [], 0.0, []
    for indices, length in batches:
        start = time.perf_counter()
        out = jax.block_until_ready(_adaptive_batch(*args(indices)))
        seconds += time.perf_counter() - start
        logits, evals, ok = (np.asarray(a)[:length] for a in out)
        ys = np.asarray(data.targets[indices[:length]])
        keep = ys >= 0
        right = (logits.argmax(-1) == ys) & keep
        # a failed example scores nothing (per-position targets: at no position)
        right = right & ok.reshape(-1, *([1] * (right.ndim - 1)))
        hits += int(right.sum())
        count += int(keep.sum())
        failed.append(indices[:length][~ok])
        correct.append(right if right.ndim == 1 else None)
        evaluations.append(evals)
    failed_examples = np.concatenate(failed).astype(np.int64)
    return AdaptiveAccuracy(
        accuracy=hits / max(count, 1),
        evaluations=np.concatenate(evaluations),
        failed=len(failed_examples),
        solver=type(solver).__name__,
        rtol=float(rtol),
        atol=float(atol),
        failed_examples=failed_examples,
        seconds_per_example=seconds / max(len(data), 1),
        compile_seconds=compile_seconds,
        dt0=float(dt0),
        correct=None if any(c is None for c in correct) else np.concatenate(correct),
    )


@eqx.filter_jit
def _adaptive_batch(model, solver, options, xs, max_steps: int):
    """Logits, field evaluations and success of the adaptive solves of the batch `xs`;
    `options` is `(rtol, atol, dt0)` as an array, cast to the state's dtype as the Python
    floats it stands for would be."""
    equation = model.transformer.equation

    def one(x):
        u0 = model.embedding(x)
        rtol, atol, dt0 = options.astype(u0.dtype)
        sol = integrate(
            equation,
            u0,
            solver,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
            dt0=dt0,
            max_steps=max_steps,
            throw=False,
        )
        ok = sol.result == RESULTS.successful
        return model.head(sol.y), sol.stats["num_evaluations"], ok

    return jax.vmap(one)(xs)
