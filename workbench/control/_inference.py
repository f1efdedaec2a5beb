r"""Adaptive inference of a trained model: its equation solved by a diffrax solver with a
step-size controller, per example, and the accuracy and work that takes.

A trained `ControlledModel` is `x ↦ head(u(T))` with `u` solving its equation; its own
discretization (a splitting scheme, `k` steps per layer) is one way of solving it. An adaptive
solver picks the steps per example from an error estimate: `adaptive_accuracy` reports the
held-out accuracy it reaches and the **field evaluations** it spends on each example, where one
field evaluation is one call of the whole vector field `Σ_k G_k(u; θ(t))` (every operator once:
attention and feed-forward). In those units a Lie–Trotter step is one evaluation (each operator
once), so the model's own fixed grid costs `k · L` per example, `L` the layer count. The
piecewise-constant controls jump at the layer boundaries, so the solver restarts on each layer
(`workbench.integrate`), which costs every layer at least one accepted step; the first step
tried on each layer is the whole layer (`dt0 = h`), so no evaluations go to guessing it.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._integrate import integrate
from .._solution import RESULTS
from ._data import Dataset, even_batches
from ._models import ControlledModel


@dataclasses.dataclass(frozen=True)
class AdaptiveAccuracy:
    """What `adaptive_accuracy` measured.

    - `accuracy`: held-out accuracy (targets `< 0` ignored), a fraction.
    - `evaluations`: field evaluations per example (NumPy, one per input).
    - `failed`: examples whose solve did not succeed (`max_steps` reached, non-finite); they
      count as wrong.
    - `solver`, `rtol`, `atol`: what was used.
    """

    accuracy: float
    evaluations: np.ndarray
    failed: int
    solver: str
    rtol: float
    atol: float

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
            "failed": self.failed,
            "mean_evaluations": self.mean_evaluations,
            "std_evaluations": self.std_evaluations,
            "min_evaluations": int(e.min()),
            "max_evaluations": int(e.max()),
        }


def adaptive_accuracy(
    model: ControlledModel,
    data: Dataset,
    *,
    solver=None,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    max_steps: int = 256,
    batch_size: int = 256,
) -> AdaptiveAccuracy:
    r"""Held-out accuracy of `model` with its equation solved adaptively, and the field
    evaluations per example (see the module docstring for the unit).

    **Arguments:**

    - `model`: a trained `ControlledModel` (its scheme and steps are not used).
    - `data`: the held-out `Dataset`.
    - `solver`: an adaptive diffrax solver with an error estimate; `diffrax.Bosh3()` (order 3,
      four stages, FSAL: three new evaluations per step, four on the first step of a layer)
      by default; `diffrax.Heun()` (order 2 with an Euler estimate) costs two per step.
    - `rtol`, `atol`: the `diffrax.PIDController` tolerances.
    - `max_steps`: the most steps per layer; an example that needs more counts as failed.
    - `batch_size`: at most this many examples per compiled batch (the batches are of
      near-equal length, padded to one shape: one compilation).
    """
    if not isinstance(model, ControlledModel):
        raise ValueError(f"model must be a ControlledModel, got {type(model).__name__}.")
    if not isinstance(data, Dataset):
        raise ValueError(f"data must be a workbench.control.Dataset, got {type(data).__name__}.")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name}={value!r} must be a positive number.")
    solver = diffrax.Bosh3() if solver is None else solver
    if not isinstance(solver, diffrax.AbstractAdaptiveSolver):
        raise ValueError(
            f"solver={solver!r} has no error estimate; pass an adaptive diffrax solver: "
            "diffrax.Bosh3(), Tsit5(), Dopri5(), Heun()."
        )
    # The tolerances are arguments of the compiled solve, not constants of it: every tolerance,
    # and every model of the same structure, runs the same program (the batches have one shape).
    tolerances = jnp.asarray([rtol, atol])
    hits = count = failed = 0
    evaluations = []
    for indices, length in even_batches(len(data), batch_size):
        xs = jnp.asarray(data.inputs[indices])
        ys = np.asarray(data.targets[indices[:length]])
        out = _adaptive_batch(model, solver, tolerances, xs, max_steps)
        logits, evals, ok = (np.asarray(a)[:length] for a in out)
        keep = ys >= 0
        right = (logits.argmax(-1) == ys) & keep
        if right.ndim > 1:  # per-position targets: a failed example scores nothing
            right = right & ok.reshape(-1, *([1] * (right.ndim - 1)))
        else:
            right = right & ok
        hits += int(right.sum())
        count += int(keep.sum())
        failed += int((~ok).sum())
        evaluations.append(evals)
    return AdaptiveAccuracy(
        accuracy=hits / max(count, 1),
        evaluations=np.concatenate(evaluations),
        failed=failed,
        solver=type(solver).__name__,
        rtol=float(rtol),
        atol=float(atol),
    )


@eqx.filter_jit
def _adaptive_batch(model, solver, tolerances, xs, max_steps: int):
    """Logits, field evaluations and success of the adaptive solves of the batch `xs`; the
    tolerances `(rtol, atol)` are an array, cast to the state's dtype as the Python floats they
    stand for would be."""
    equation = model.transformer.equation

    def one(x):
        u0 = model.embedding(x)
        rtol, atol = tolerances.astype(u0.dtype)
        controller = diffrax.PIDController(rtol=rtol, atol=atol)
        sol = integrate(
            equation,
            u0,
            solver,
            stepsize_controller=controller,
            dt0=equation.piece_length,
            max_steps=max_steps,
            throw=False,
        )
        ok = sol.result == RESULTS.successful
        return model.head(sol.y), sol.stats["num_evaluations"], ok

    return jax.vmap(one)(xs)
