r"""Error against step size for one method on one equation: a ladder of step counts solved with
one compilation, a high-order reference with a Richardson estimate of its own error, and the
observed order (`fit_order`), with evaluations and wall time for work–precision diagrams."""

import dataclasses
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import int_in_range, number_in_range, positive_float, positive_int
from .._equation import Equation
from .._integrate import integrate
from .._solution import RESULTS
from ..schemes._splitting import AbstractSplittingScheme
from ._order import OrderFit, fit_order


@dataclasses.dataclass(frozen=True)
class Reference:
    """A reference solution by Dopri8: `steps_per_layer` fixed steps per layer, or adaptive steps
    at tolerance `rtol` (then `steps_per_layer` is `None`).

    `error_estimate` checks that it is far below the errors it will measure: with fixed steps,
    Richardson's estimate `‖u(k) − u(k/2)‖_∞ / (2⁸ − 1)` (Dopri8 is order 8, on smooth fields);
    adaptive, `‖u(rtol) − u(10 rtol)‖_∞`, which assumes no order (for fields that are only
    Lipschitz, such as a ReLU feed-forward, where the adaptive steps shrink at the kinks).
    """

    u1: np.ndarray
    steps_per_layer: int | None
    error_estimate: float
    seconds: float
    rtol: float | None = None


def reference_solution(
    equation: Equation,
    u0,
    *,
    formulation=None,
    steps_per_layer: int = 256,
    rtol: float | None = None,
    max_steps: int = 10**6,
) -> Reference:
    """Dopri8 with fixed steps (`steps_per_layer` per layer) and a Richardson check at half; or,
    given `rtol`, adaptive Dopri8 (PID controller, `rtol = atol`, at most `max_steps` steps over
    `[0, T]`) checked against `10 rtol` (one compilation for both)."""
    if rtol is not None:
        number_in_range("rtol", rtol, 0, 1, numpy_scalars=False)
        kwargs = {} if formulation is None else {"formulation": formulation}

        def adaptive(tol):
            pid = diffrax.PIDController(rtol=jnp.asarray(tol), atol=jnp.asarray(tol))
            sol = integrate(
                equation,
                u0,
                diffrax.Dopri8(),
                stepsize_controller=pid,
                max_steps=max_steps,
                **kwargs,
            )
            return np.asarray(sol.u1)

        start = time.perf_counter()
        fine = adaptive(rtol)
        seconds = time.perf_counter() - start
        estimate = float(np.max(np.abs(fine - adaptive(10 * rtol))))
        return Reference(fine, None, estimate, seconds, float(rtol))
    int_in_range("steps_per_layer", steps_per_layer, 2, numpy_ints=False)
    layers = equation.num_pieces
    method = diffrax.Dopri8()
    solve = lambda k: _solve(equation, u0, method, formulation, jnp.asarray(k))[0]
    start = time.perf_counter()
    fine = np.asarray(solve(steps_per_layer * layers))
    seconds = time.perf_counter() - start
    coarse = np.asarray(solve((steps_per_layer // 2) * layers))
    estimate = float(np.max(np.abs(fine - coarse))) / (2.0**8 - 1.0)
    return Reference(fine, steps_per_layer, estimate, seconds)


_TRACES = [0]  # times `_solve_program` was traced (= compiled): the no-recompilation check


def _solve(equation, u0, method, formulation, k):
    """`(u(T), vector-field evaluations)` of one solve with a run-time step count `k`, checked
    on the host: a solve that failed (NaN/inf, diffrax's `max_steps`, a `k` that is not a
    multiple of the layer count) raises `RuntimeError` naming the method, the step count and
    the first step (splitting) or layer (diffrax) that was not finite. The compiled program
    (`_solve_program`) then calls no Python (an explicit diffrax solver with a traced step count
    runs as a plain loop of its steps, not `diffeqsolve`, whose check of its step's sign is a
    callback), so JAX's persistent compilation cache keeps it and a later process reads it
    back (a program with a callback, as `integrate(throw=True)` makes, is compiled anew in every
    process)."""
    u1, evaluations, result, first_bad = _solve_program(equation, u0, method, formulation, k)
    if result != RESULTS.successful:
        where = "step" if isinstance(method, AbstractSplittingScheme) else "layer"
        first = f" First {where} not finite: {int(first_bad)}." if int(first_bad) >= 0 else ""
        raise RuntimeError(
            f"{type(method).__name__} with num_steps={int(k)}: {RESULTS[result]}{first}"
        )
    return u1, evaluations


@eqx.filter_jit
def _solve_program(equation, u0, method, formulation, k):
    """The program of `_solve`: cached across calls by the inputs' structure, so a ladder, and
    later solves of the same method and model, compile once."""
    _TRACES[0] += 1  # runs at trace time only
    kwargs = {} if formulation is None else {"formulation": formulation}
    sol = integrate(equation, u0, method, num_steps=k, throw=False, **kwargs)
    return sol.u1, sol.stats["num_evaluations"], sol.result, sol.first_nonfinite_step


@dataclasses.dataclass(frozen=True)
class Ladder:
    """Errors of one method over a ladder of step counts (see `error_ladder`).

    **Fields:** `steps_per_layer`, `step_sizes` (`h = piece_length / k`), `errors` (max-abs
    against the reference), `evaluations` (vector-field evaluations per solve, `-1` if unknown),
    `seconds` (median wall time per solve, compiled), `compile_seconds` (first call minus one
    run), `compilations` (distinct compilations for the whole ladder), `fit` (`OrderFit`, or
    `None` when `fit_order` found none or `min_points < 2`), `fit_error` (why not: the failed
    fit's `OrderFit.message`),
    `richardson` (Richardson's estimate of the error at the finest step in the fit divided by
    its measured error: ≈ 1 in the asymptotic range), `solutions` (`u(T)` of every step count;
    not in `to_dict`). `evaluations_for(error)` predicts the cost of an accuracy from the fit.
    """

    steps_per_layer: np.ndarray
    step_sizes: np.ndarray
    errors: np.ndarray
    evaluations: np.ndarray
    seconds: np.ndarray
    compile_seconds: float
    compilations: int
    fit: OrderFit | None
    fit_error: str | None
    richardson: float | None
    solutions: list = dataclasses.field(repr=False, default_factory=list)

    def evaluations_for(self, error: float) -> float | None:
        """Vector-field evaluations per solve that the fit `e = C h^p` predicts for `error`
        (evaluations grow like the step count); `None` without a fit, a positive fitted order
        or an evaluation count."""
        if self.fit is None or not self.fit.order > 0 or self.evaluations[0] <= 0:
            return None
        positive_float("error", error, finite=False, arrays=True)
        h = (error / self.fit.constant) ** (1.0 / self.fit.order)
        return float(self.evaluations[0] * self.step_sizes[0] / h)

    def to_dict(self) -> dict:
        return {
            "steps_per_layer": self.steps_per_layer.tolist(),
            "step_sizes": self.step_sizes.tolist(),
            "errors": self.errors.tolist(),
            "evaluations": self.evaluations.tolist(),
            "seconds": self.seconds.tolist(),
            "compile_seconds": self.compile_seconds,
            "compilations": self.compilations,
            "fit": None if self.fit is None else self.fit.to_dict(),
            "fit_error": self.fit_error,
            "richardson": self.richardson,
        }


def error_ladder(
    equation: Equation,
    u0,
    method,
    steps_per_layer,
    reference: Reference | np.ndarray,
    *,
    formulation=None,
    declared_order: int | None = None,
    error_range: tuple[float, float] | None = None,
    num_points: int = 6,
    max_steps_per_layer: int = 4096,
    repeats: int = 3,
    min_points: int = 3,
    tol: float = 0.3,
) -> Ladder:
    r"""Solve with `method` at every step count of `steps_per_layer` and compare with `reference`.

    The step count is a run-time argument of one jitted solve (`num_steps` may be traced), so the
    whole ladder compiles once (and later ladders of the same method and model shapes reuse it);
    `compilations` counts the compilations this call triggered. Errors are `‖u_k(T) − u_ref(T)‖_∞`.

    **Arguments:**

    - `equation`, `u0`: the problem.
    - `method`: a splitting scheme or a diffrax solver (fixed steps).
    - `steps_per_layer`: increasing positive integers (at least `min_points`), or `"auto"`:
      doubling from one step per layer finds the count `k` whose error first drops below
      `start_error`, backs off to where `e ≈ C h^p` predicts `start_error`, and takes
      `num_points` counts `k₀ r^j` with `r = (start_error/end_error)^{1/((num_points−1)p)}`
      (`p = declared_order`; `r` clipped to [1.15, 2]) so that the errors span `error_range`.
      Keep `end_error` a few decades above the round-off floor (≈ 1e-14 for O(1) states in
      float64) and `start_error` inside the asymptotic range.
    - `error_range`: `(start_error, end_error)` for `"auto"`.
    - `num_points`, `max_steps_per_layer`: for `"auto"`.
    - `reference`: a `Reference` or the reference `u(T)`.
    - `formulation`: for diffrax solvers (`None`: automatic).
    - `declared_order`: the method's order: the Richardson check uses it (`None`: the fitted
      one), and the fit judges order reduction against it (`fit_order(..., expected=...)`).
    - `repeats`: timed runs per step count (median reported).
    - `min_points`, `tol`: passed to `fit_order` (`min_points=1`: no fit, for checks of single
      step counts).

    **Returns:** a `Ladder`.
    """
    u_ref = np.asarray(reference.u1 if isinstance(reference, Reference) else reference)
    traces_before = _TRACES[0]
    compile_seconds = None
    if isinstance(steps_per_layer, str):
        if steps_per_layer != "auto":
            raise ValueError(
                f"steps_per_layer={steps_per_layer!r}: pass a sequence of integers or 'auto'."
            )
        if error_range is None or declared_order is None:
            raise ValueError(
                "steps_per_layer='auto' needs error_range=(start_error, end_error) and "
                "declared_order."
            )
        hi, lo = error_range
        if not 0 < lo < hi:
            raise ValueError(
                f"error_range={error_range!r} must be (start, end) with 0 < end < start."
            )
        positive_int("declared_order", declared_order, numpy_ints=False)
        one = jnp.asarray(equation.num_pieces)
        start = time.perf_counter()
        jax.block_until_ready(_solve(equation, u0, method, formulation, one))
        first = time.perf_counter() - start
        start = time.perf_counter()
        jax.block_until_ready(_solve(equation, u0, method, formulation, one))
        compile_seconds = max(first - (time.perf_counter() - start), 0.0)
        steps_per_layer = _auto_steps(
            equation,
            u0,
            method,
            formulation,
            u_ref,
            hi,
            lo,
            declared_order,
            num_points,
            max_steps_per_layer,
        )
    ks = np.asarray(steps_per_layer)
    if ks.ndim != 1 or ks.size < min_points or not np.issubdtype(ks.dtype, np.integer):
        raise ValueError(
            f"steps_per_layer={list(np.ravel(ks))} must be at least {min_points} integers "
            "(an order fit needs that many step sizes)."
        )
    if np.any(ks < 1) or np.any(np.diff(ks) <= 0):
        raise ValueError(f"steps_per_layer={ks.tolist()} must be positive and increasing.")
    positive_int("repeats", repeats, numpy_ints=False)
    layers = equation.num_pieces

    def solve(k):
        return _solve(equation, u0, method, formulation, k)

    errors, evals, seconds, solutions = [], [], [], []
    for i, k in enumerate(ks):
        n = jnp.asarray(int(k) * layers)
        start = time.perf_counter()
        u1, ev = jax.block_until_ready(solve(n))
        first = time.perf_counter() - start
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(solve(n))
            runs.append(time.perf_counter() - start)
        if i == 0 and compile_seconds is None:
            compile_seconds = max(first - float(np.median(runs)), 0.0)
        seconds.append(float(np.median(runs)))
        u1 = np.asarray(u1)
        solutions.append(u1)
        errors.append(float(np.max(np.abs(u1 - u_ref))))
        evals.append(int(ev))
    h = equation.piece_length / ks.astype(np.float64)
    errors = np.asarray(errors)
    fit, why = None, None
    if min_points < 2:  # a check of single step counts: no order fit asked for
        why = f"no order fit: min_points={min_points} (a fit needs at least 2 points)."
    else:
        fit = fit_order(
            h,
            errors,
            min_points=min_points,
            tol=tol,
            expected=None if declared_order is None else float(declared_order),
            throw=False,
        )
        if not fit.success:
            fit, why = None, fit.message
    richardson = None
    if fit is not None:
        used = np.flatnonzero(fit.used)  # indices in increasing-h order
        if used.size >= 2:
            # fit.steps is sorted by increasing h; map back to ladder order (decreasing h).
            a, b = used[0], used[1]  # finest and next finest step
            ia, ib = ks.size - 1 - a, ks.size - 1 - b
            p = declared_order if declared_order is not None else fit.order
            ratio = (h[ia] / h[ib]) ** p
            estimate = float(np.max(np.abs(solutions[ia] - solutions[ib]))) * ratio / (1 - ratio)
            if errors[ia] > 0:
                richardson = estimate / float(errors[ia])
    return Ladder(
        steps_per_layer=ks,
        step_sizes=h,
        errors=errors,
        evaluations=np.asarray(evals),
        seconds=np.asarray(seconds),
        compile_seconds=compile_seconds,
        compilations=_TRACES[0] - traces_before,
        fit=fit,
        fit_error=why,
        richardson=richardson,
        solutions=solutions,
    )


def _auto_steps(
    equation, u0, method, formulation, u_ref, start_error, end_error, order, num_points, cap
):
    """The step counts of `error_ladder(..., "auto")` (see there)."""
    layers = equation.num_pieces
    k = 1
    while True:
        u1, _ = _solve(equation, u0, method, formulation, jnp.asarray(k * layers))
        err = float(np.max(np.abs(np.asarray(u1) - u_ref)))
        if err <= start_error or k >= cap:
            break
        k *= 2
    if err > start_error:
        raise ValueError(
            f"error_ladder: error {err:.2e} > start_error={start_error:g} even at {k} steps per "
            "layer; raise start_error or max_steps_per_layer."
        )
    if k > 1 and err > 0:
        # Back off to where e(h) = C h^p predicts the error start_error.
        k = max(k // 2 + 1, int(k * (err / start_error) ** (1.0 / order)))
    r = (start_error / end_error) ** (1.0 / ((num_points - 1) * order))
    r = min(max(r, 1.15), 2.0)
    ks = [k]
    for j in range(1, num_points):
        ks.append(max(ks[-1] + 1, int(round(k * r**j))))
    return np.asarray(ks)
