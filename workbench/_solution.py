"""What `integrate` returns: the `Solution` and its typed `RESULTS`.

In a module of its own so that the splitting path (`_integrate.py`) and the diffrax path
(`_integrate_diffrax.py`) both build it without importing each other.
"""

import equinox as eqx
from jaxtyping import Array, Float, Int

from ._types import Tokens

__all__ = ["RESULTS", "Solution"]


class RESULTS(eqx.Enumeration):
    """How a solve ended, as `diffrax.RESULTS` and `lineax.RESULTS` do it: a value that `vmap`
    carries and `==` compares (`sol.result == wb.RESULTS.successful`)."""

    successful = ""
    nonfinite_state = (
        "The state became NaN or inf; Solution.first_nonfinite_step names the step (splitting) "
        "or layer (diffrax). Check the inputs and weights for NaN, or reduce the step."
    )
    max_steps_reached = (
        "The diffrax solver reached max_steps in one layer (Solution.stats['failed_piece']); "
        "raise max_steps or loosen the tolerances."
    )
    solver_failed = (
        "The diffrax solver failed in one layer (Solution.stats['failed_piece']): a failed "
        "implicit (Newton) solve or a step below the controller's minimum."
    )
    invalid_num_steps = (
        "num_steps (given at run time) is not a multiple of the number of layers, so steps "
        "straddle the jumps of the piecewise-constant controls; pass a multiple."
    )


class Solution(eqx.Module):
    """The result of `integrate`.

    **Fields:**

    - `u1`: the state at `T` (before the output map).
    - `y`: the output, `output_map(u1)` (the model's final hidden state).
    - `ts`, `us`: step end times and states, when `save_steps=True` (else `None`).
    - `num_steps`, `num_evaluations`: steps taken and term evaluations (vector-field calls), as
      Python ints when known at trace time (splitting schemes with a static step count), else
      `None` (see `stats`).
    - `first_nonfinite_step`: index of the first step (splitting) or layer (diffrax) whose
      result held NaN/inf, or −1.
    - `result`: a `workbench.RESULTS` item: `RESULTS.successful`, `nonfinite_state`,
      `max_steps_reached`, `solver_failed` or, for a splitting scheme given a run-time
      `num_steps` with `throw=False`, `invalid_num_steps` (compare with `==`;
      `RESULTS[sol.result]` is the message). Under `vmap` with `throw=False` it holds one result
      per batch entry.
    - `stats`: run-time statistics as arrays: `num_steps`, `num_evaluations` (splitting and
      diffrax; `-1` where unknown, e.g. implicit solvers' Newton iterations), and for diffrax
      `num_accepted_steps`, `num_rejected_steps` and `failed_piece` (first layer whose solve
      failed, −1).
    - `running_cost`: the running cost `∫ L dt` summed along the solve when `integrate` was
      given a `running_cost` (else `None`).
    """

    u1: Tokens
    y: Tokens
    ts: Float[Array, " steps"] | None
    us: Float[Array, "steps n d"] | None
    num_steps: int | None = eqx.field(static=True)
    num_evaluations: int | None = eqx.field(static=True)
    first_nonfinite_step: Int[Array, ""]
    result: RESULTS
    stats: dict = eqx.field(default_factory=dict)
    running_cost: Float[Array, ""] | None = None
