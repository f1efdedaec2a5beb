r"""Where an adaptive solver steps: the accepted steps of one solve over the depth `[0, T]`, for
a figure of the step size against depth-time (where the equation is hard to follow)."""

import dataclasses

import diffrax
import jax.numpy as jnp
import numpy as np

from .._checks import positive_float, positive_int
from .._equation import Equation
from .._integrate import check_dtype, check_tokens
from .._integrate_diffrax import integrate_diffrax


@dataclasses.dataclass(frozen=True)
class AdaptiveSteps:
    """The accepted steps of one adaptive solve (see `adaptive_steps`).

    - `times`: `0 = t_0 < t_1 < … < t_n = T`, the start and the end of every accepted step.
    - `sizes`: `t_{i+1} − t_i`, `n` of them, summing to `T`.
    - `rejected`: the steps tried and rejected; `evaluations`: field evaluations of the solve,
      rejected steps included (`Solution.stats["num_evaluations"]`).
    """

    times: np.ndarray
    sizes: np.ndarray
    rejected: int
    evaluations: int

    @property
    def accepted(self) -> int:
        return len(self.sizes)


def adaptive_steps(
    equation: Equation,
    u0,
    *,
    solver=None,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    dt0: float | None = None,
    max_steps: int = 4096,
) -> AdaptiveSteps:
    r"""The accepted steps of `equation` solved from `u0` over `[0, T]` by an adaptive diffrax
    solver with a `diffrax.PIDController(rtol, atol)`: the solve of
    `workbench.control.adaptive_accuracy` for one example (`u0 = model.embedding(x)`,
    `equation = model.transformer.equation`), with the same defaults.

    For piecewise-constant controls the layer starts are declared jumps: a step ends on the
    float just below a boundary and the next starts on the float just above it. diffrax
    records the first of the two at the time where the second starts, so `times` holds the
    float above each boundary, and the step before it counts two floats more than it took.

    **Arguments:**

    - `equation`, `u0`: the equation and one initial state `(n, d)`.
    - `solver`: an adaptive diffrax solver, `diffrax.Bosh3()` by default.
    - `rtol`, `atol`: the tolerances.
    - `dt0`: the first step tried; `None`: one piece of the controls (a layer, or `T` for a
      one-piece basis such as `wb.LegendreBasis`).
    - `max_steps`: the most steps; a solve that needs more raises, naming where it stopped.

    **Returns:** an `AdaptiveSteps`; `plt.step(s.times[1:], s.sizes)` draws the step size
    against depth.
    """
    check_tokens(u0, "u0", equation.width, owner="this equation")
    check_dtype(equation, u0, "u0")
    u0 = jnp.asarray(u0)
    rtol = positive_float("rtol", rtol, hint="a tolerance")
    atol = positive_float("atol", atol, hint="a tolerance")
    dt0 = equation.piece_length if dt0 is None else positive_float("dt0", dt0, hint="a step")
    max_steps = positive_int("max_steps", max_steps)
    sol = integrate_diffrax(
        equation,
        u0,
        diffrax.Bosh3() if solver is None else solver,
        num_steps=None,
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        formulation=None,
        dt0=dt0,
        max_steps=max_steps,
        mask=None,
        throw=True,
        u0_name="u0",
        save_step_times=True,
    )
    ends = np.asarray(sol.ts)
    ends = ends[np.isfinite(ends)]  # diffrax pads the unused entries with inf
    times = np.concatenate([[0.0], ends]).astype(ends.dtype)
    return AdaptiveSteps(
        times=times,
        sizes=np.diff(times),
        rejected=int(sol.stats["num_rejected_steps"]),
        evaluations=int(sol.stats["num_evaluations"]),
    )
