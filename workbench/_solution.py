"""What `integrate` returns: the `Solution` and its typed `RESULTS`.

Every result reported as a value in workbench follows this pattern (diffrax's): an
`equinox.Enumeration` named `RESULTS` in the namespace of the function that returns it
(`workbench.RESULTS` for a solve, `workbench.analysis.RESULTS` for an order fit), an item in the
`result` field of what the function returns, compared with `==` (`result == RESULTS.successful`),
`RESULTS[result]` its message, and `throw=True` (the default) raising instead of returning a failure.

In a module of its own so that the splitting path (`_integrate.py`) and the diffrax path
(`_integrate_diffrax.py`) both build it without importing each other.
"""

import equinox as eqx
from jaxtyping import Array, Float, Int

from ._types import Tokens

__all__ = ["RESULTS", "Solution", "is_result", "result_name"]


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


# The class of every enumeration item (equinox does not export it under a public name).
_ITEM = type(RESULTS.successful)


def is_result(obj) -> bool:
    """Whether `obj` is an item of an `equinox.Enumeration` (a result reported as a value)."""
    return isinstance(obj, _ITEM)


def result_name(item: eqx.Enumeration) -> str:
    """The name of a concrete enumeration item (`"successful"`, `"at_floor"`, ...), the form a
    result takes in JSON records and error messages.

    `equinox.Enumeration` gives an item's message (`RESULTS[item]`) but not its name; the names are
    the keys of the enumeration's `_name_to_item` table, matched here by the item's index.
    """
    enumeration = item._enumeration
    index = int(item._value)
    for name, candidate in enumeration._name_to_item.items():
        if int(candidate._value) == index:
            return name
    raise ValueError(f"result_name: {item!r} is not an item of {enumeration.__qualname__}.")


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
      `num_accepted_steps`, `num_rejected_steps` and `failed_piece` (the layer where the solve
      failed: the first failed layer's solve, or the layer a solve over `[0, T]` stopped in; −1).
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
