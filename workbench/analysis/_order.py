r"""Observed convergence order: a log-log fit with a confidence band, the asymptotic range, order
reduction and the round-off floor, all read from the data.

For a method of order `p` the global error behaves like `e(h) ≈ C h^p` for small `h`, until
rounding errors take over. The round-off model is `e_round ≈ ε · |u| · N`: machine epsilon of the
working precision, times the size of the solution, times the number of steps `N` taken
(`roundoff_level` computes it, per point of a ladder). `fit_order` reads a step-size ladder from
the small steps up:

1. **Floor.** The smallest steps are round-off floor when their error is zero, or within
   `roundoff_factor` of the round-off level (`error ≤ roundoff_factor · roundoff`), or when the
   error stopped decreasing there (its order towards some larger step is below `flat`, negative
   included: round-off grows like `N`). Points within a factor 10 of the floor's largest error
   are floor too (they are more than 10 % round-off), and so is a flat or non-decreasing stretch
   found at the small end of the window (see `fit_order`). Nothing else is floor: an error of
   `1e-9` in float64 that still decreases is not round-off unless the caller's `roundoff` says so.
2. **Asymptotic window.** The order is fitted on the run of consecutive points whose local orders
   agree (within `tol` of their median) that starts at the smallest step above the floor: the
   *asymptotic* order, the one that governs refinement. Larger steps outside it are
   pre-asymptotic. (If that run has fewer than `min_points` points, they are reported as
   `unresolved` and the window is the next run.)
3. **Order reduction.** When the larger steps show a clearly higher slope as a separate regime
   (an abrupt change, not a slow drift, higher by more than `tol` beyond the noise), or when the
   asymptotic order falls below a caller's `expected` order by more than `tol`,
   `order_reduction` is set and `preasymptotic_order` records the large-step slope.

The confidence interval is Bonferroni-widened over the windows the selection could have chosen
(see `OrderFit`).

**Failure.** Bad arguments (mismatched lengths, non-positive, non-finite or repeated steps,
negative errors, bad options) raise `ValueError` at once: they are the caller's bug. Valid data
that admits no fit (too few points, a diverged run's NaN error, everything at the floor, no
window sharing one slope) is an outcome of the analysis, reported as a value as
`workbench.Solution.result` does for a solve: `OrderFit.result` is a `RESULTS` item
and the numbers are NaN. `fit_order(..., throw=True)` (the default) raises `OrderFitError` (a
`ValueError`) for it; `throw=False` returns the failed `OrderFit`.
"""

import dataclasses
import math

import equinox as eqx
import numpy as np

from .._checks import finite_float, int_in_range, number_in_range, positive_float
from .._solution import result_name
from ._student_t import t_quantile as _t_quantile

# A point whose error is within this factor of the floor's largest error is mostly round-off.
_TRANSITION = 10.0


def roundoff_level(dtype_or_eps, solution_scale=1.0, num_steps=1):
    r"""The round-off error level `ε · |u| · N` of the model in the module docstring.

    **Arguments:**

    - `dtype_or_eps`: the working precision: a dtype (`np.float64`, `"float32"`,
      `jnp.bfloat16`, …), an array (its dtype), or machine epsilon itself as a float.
    - `solution_scale`: `|u|`, the size of the solution (e.g. `max |u_ref|`); scalar or array.
    - `num_steps`: `N`, the number of steps of each solve: a scalar or an array over a ladder
      (e.g. `steps_per_layer · num_layers`).

    **Returns:** `ε · |solution_scale| · num_steps`, a float, or an array broadcast over the
    arguments. Pass it to `fit_order(..., roundoff=...)` in the ladder's order.

    **Example:** `roundoff_level(np.float64, 2.0, [10, 20])` is `[4.4e-15, 8.9e-15]`.
    """
    if isinstance(dtype_or_eps, bool):
        raise ValueError(f"roundoff_level: dtype_or_eps={dtype_or_eps!r} is not a dtype or eps.")
    if isinstance(dtype_or_eps, (float, int, np.floating, np.integer)):
        eps = number_in_range("eps", dtype_or_eps, 0, 1, owner="roundoff_level")
    else:
        dt = dtype_or_eps
        if not isinstance(dt, (type, str, np.dtype)) and hasattr(dt, "dtype"):
            dt = dt.dtype  # an array: its precision
        try:
            eps = float(np.finfo(dt).eps)
        except (TypeError, ValueError):
            import jax.numpy as jnp  # bfloat16 and friends: numpy's finfo does not know them

            eps = float(jnp.finfo(dt).eps)
    scale = np.abs(np.asarray(solution_scale, dtype=np.float64))
    n = np.asarray(num_steps, dtype=np.float64)
    if not np.all(np.isfinite(scale)):
        raise ValueError(f"roundoff_level: solution_scale={solution_scale!r} must be finite.")
    if not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise ValueError(f"roundoff_level: num_steps={num_steps!r} must be finite and > 0.")
    out = eps * scale * n
    return float(out) if out.ndim == 0 else out


# The default round-off level when the caller gives none: float64, |u| = 1, ten steps
# (≈ 2.2e-15; with `roundoff_factor = 100` errors ≤ 2.2e-13 count as round-off).
DEFAULT_ROUNDOFF = roundoff_level(np.float64, 1.0, 10)


class RESULTS(eqx.Enumeration):
    """How `fit_order` ended, as `workbench.RESULTS` reports a solve: an `equinox.Enumeration`
    item, compared with `==` (`fit.result == workbench.analysis.RESULTS.successful`);
    `RESULTS[fit.result]` is the generic reason and fix (`OrderFit.message` has the specifics:
    the data, the counts), and the item's name is the JSON record."""

    successful = ""
    too_few_points = "Fewer step sizes than min_points were given: use a longer ladder."
    nonfinite_errors = "An error is NaN or inf: a run diverged; shrink the largest step."
    zero_errors = (
        "asymptotic=False fits log e over all points and an error is exactly 0: drop it, or "
        "fit with asymptotic=True (zero errors are round-off floor)."
    )
    at_floor = (
        "Fewer than min_points points lie above the round-off (or flat) floor: use larger steps, "
        "or a finer reference if the floor is flat."
    )
    no_asymptotic_window = (
        "No min_points consecutive points above the floor share one slope within tol: refine "
        "the ladder or raise tol."
    )


class OrderFitError(ValueError):
    """`fit_order(..., throw=True)` found no fit from valid data (a `ValueError`, so callers that
    catch that keep working). `fit` is the failed `OrderFit` (NaN numbers), `result` its
    `RESULTS` item; the message is `fit.message` and the result's name."""

    def __init__(self, fit: "OrderFit"):
        super().__init__(
            f"{fit.message} (result: {result_name(fit.result)}; fit_order(..., throw=False) returns the "
            "failed OrderFit instead)"
        )
        self.fit = fit
        self.result = fit.result


@dataclasses.dataclass(frozen=True)
class OrderFit:
    """The result of `fit_order`.

    **Fields:**

    - `order`: the fitted slope `p` of `log e` against `log h` on the asymptotic window.
    - `constant`: `C` in `e ≈ C h^p`.
    - `stderr`: the standard error of `p` (`nan` with two points); not adjusted for selection.
    - `ci_low`, `ci_high`: the two-sided confidence interval of `p` (Student t, `n − 2` degrees
      of freedom; `±inf` with two points). When the window was selected from the data
      (`window_selected`), the interval is Bonferroni-widened over the `candidate_windows`
      contiguous windows the selection could have picked: each bound uses the level
      `1 − (1 − confidence)/candidate_windows`, so the interval keeps its coverage whichever
      window the data chose. It covers the slope of a power law with log-normal noise on that
      window; it does not cover model error (curvature left in the window).
    - `confidence`: the nominal (family-wise) level of that interval.
    - `steps`, `errors`: the data, sorted by increasing step.
    - `used`: boolean mask of the points in the fit (the asymptotic window).
    - `local_orders`: slopes between consecutive points (`len(steps) − 1`).
    - `floor`: the largest error among the small-step points left out as floor (see
      `fit_order`), or `None` if there were none.
    - `pre_asymptotic`: how many large-step points were left out.
    - `order_reduction`: whether the asymptotic order is lower than the large-step one (or than
      `expected`) by more than `tol` (see `fit_order`).
    - `preasymptotic_order`: the slope of the large-step regime (the run of consistent local
      orders at the largest steps, down to the window), or `None` without pre-asymptotic points.
    - `expected`: the order the caller expected, if given.
    - `unresolved`: small-step points above the floor left out because they were too few
      (fewer than `min_points`) to fit the different slope they show: refine further.
    - `floor_kind`: `"roundoff"` (some floor points lie at the round-off level), `"flat"` (the
      error stopped decreasing above it: an unresolved reference, a solver tolerance, or
      round-off larger than `roundoff` says), or `None`.
    - `regime`: `"asymptotic"`, `"order_reduction"`, `"unresolved"` (see `unresolved`) or
      `"all_points"` (`asymptotic=False`).
    - `window_selected`: whether the window was chosen from the data.
    - `candidate_windows`: how many windows the selection chose among (`1` if not selected).
    - `result`: a `RESULTS` item; `successful` unless no fit was possible (then
      `order`, `constant`, `stderr` and the interval are NaN, `used` is all `False`, `regime` is
      `"no_fit"`, and `floor`/`floor_kind` say what was floor when that is known).
    - `message`: why there is no fit (`""` on success).
    """

    order: float
    constant: float
    stderr: float
    ci_low: float
    ci_high: float
    confidence: float
    steps: np.ndarray
    errors: np.ndarray
    used: np.ndarray
    local_orders: np.ndarray
    floor: float | None
    pre_asymptotic: int
    order_reduction: bool = False
    preasymptotic_order: float | None = None
    expected: float | None = None
    unresolved: int = 0
    floor_kind: str | None = None
    regime: str = "asymptotic"
    window_selected: bool = False
    candidate_windows: int = 1
    # A factory: an enumeration item is an `equinox.Module`, which `dataclasses` counts as mutable.
    result: RESULTS = dataclasses.field(default_factory=lambda: RESULTS.successful)
    message: str = ""

    @property
    def success(self) -> bool:
        """Whether there is a fit (`result == RESULTS.successful`)."""
        return bool(self.result == RESULTS.successful)

    @property
    def num_used(self) -> int:
        return int(self.used.sum())

    def within(self, declared: float, tol: float = 0.3) -> bool:
        """Whether `|order − declared| ≤ tol`."""
        return abs(self.order - declared) <= tol

    def describe(self) -> str:
        """One line for a report, e.g. `"order 4.0 at large steps, reduced to 1.0 at small
        steps"`, or `"no order fit: <message>"`."""
        if not self.success:
            return f"no order fit: {self.message}"
        ci = f"{100 * self.confidence:.0f} % CI [{self.ci_low:.2f}, {self.ci_high:.2f}]"
        text = f"order {self.order:.2f} ({ci}, {self.num_used} points)"
        if self.order_reduction:
            pre = self.preasymptotic_order
            if pre is not None and pre > self.order:
                text = (
                    f"order {self.preasymptotic_order:.2f} at large steps, reduced to "
                    f"{self.order:.2f} at small steps ({ci}, {self.num_used} points)"
                )
            if self.expected is not None:
                text += f"; below the expected {self.expected:g}"
        if self.unresolved:
            text += f"; {self.unresolved} smallest step(s) show another slope (unresolved)"
        if self.floor is not None:
            text += f"; {self.floor_kind} floor at {self.floor:.1e}"
        return text

    def to_dict(self) -> dict:
        """JSON-able summary."""
        return {
            "order": self.order,
            "constant": self.constant,
            "stderr": self.stderr,
            "ci": [self.ci_low, self.ci_high],
            "confidence": self.confidence,
            "steps": self.steps.tolist(),
            "errors": self.errors.tolist(),
            "used": self.used.tolist(),
            "local_orders": self.local_orders.tolist(),
            "floor": self.floor,
            "pre_asymptotic": self.pre_asymptotic,
            "order_reduction": self.order_reduction,
            "preasymptotic_order": self.preasymptotic_order,
            "expected": self.expected,
            "unresolved": self.unresolved,
            "floor_kind": self.floor_kind,
            "regime": self.regime,
            "window_selected": self.window_selected,
            "candidate_windows": self.candidate_windows,
            "result": result_name(self.result),
            "message": self.message,
        }


def fit_order(
    steps,
    errors,
    *,
    min_points: int = 3,
    tol: float = 0.3,
    confidence: float = 0.95,
    asymptotic: bool = True,
    roundoff=None,
    roundoff_factor: float = 100.0,
    flat: float = 0.3,
    expected: float | None = None,
    throw: bool = True,
) -> OrderFit:
    r"""Fit `e(h) ≈ C h^p` on the asymptotic range of a step-size ladder.

    **Arguments:**

    - `steps`: step sizes `h > 0` (any order; at least `min_points`).
    - `errors`: the errors `e(h) ≥ 0`, same length. Zero errors (exact to the last bit) count as
      round-off floor.
    - `min_points`: the fewest points a fit may use (at least 2).
    - `tol`: local orders within `tol` of their median are "the same slope"; an order drop of
      more than `tol` is a reduction.
    - `confidence`: level of the confidence interval of `p`.
    - `asymptotic`: `False` fits all points (no floor, window or reduction detection).
    - `roundoff`: the absolute round-off level `ε · |u| · N` of each point (a scalar, or an array
      in the order of `steps`; `roundoff_level` computes it). `None`: `DEFAULT_ROUNDOFF`, float64
      with `|u| = 1` and ten steps (≈ 2.2e-15), so only errors ≤ 2.2e-13 are round-off by level.
      Pass the real level for long ladders, large states or lower precision.
    - `roundoff_factor`: errors `≤ roundoff_factor · roundoff` count as round-off.
    - `flat`: at the small-step end, a local order below `flat` (including negative ones: round-off
      grows like `N`) means the error stopped decreasing: floor. Ignored when fewer than
      `min_points` points would remain above it (then the fit reports the flat slope itself).
    - `expected`: the order the method should have. Given, `order_reduction` is
      `order < expected − tol`. Not given, `order_reduction` needs the data to show a higher
      order at larger steps, as a separate regime: the run of consistent local orders at the
      largest steps (its slope is `preasymptotic_order`) must not share a local order with the
      window; somewhere between the two, neighbouring local orders must jump by more than `tol`
      (two power laws one order apart, `e = C h^p (1 + c h)`, turn by at most 0.17 per halving of
      `h`: that slow drift is pre-asymptotic, not reduction); the large-step slope must exceed the
      asymptotic order by more than `tol` beyond `t · stderr` of the difference (noise pooled
      from both fits' residuals; none with two-point fits); and it must rest on at least two
      local orders, or on one that is at least twice the asymptotic order. A correction term
      that dominates the largest steps (`h^4 + c h^6` with large `c`) can still look like this,
      and a reduction by one order can look like a drift: pass `expected` to judge against the
      method's order.

    The floor rule of the module docstring is completed by three checks on the selected
    window, repeated until none applies (each only while `min_points` points stay above the
    floor): small-step points below the window that, with its first point, do not decrease
    (fitted order `< flat`) are floor; a window whose own order is `< flat` is floor; and a window
    whose largest error was already reached at a larger step (errors not decreasing across it) is
    floor up to that step. A deep dip of the error (a sign change of the error constant) above
    the asymptotic range can trigger the last check; `unresolved`, `floor_kind` and `used` show
    what happened.

    - `throw`: what to do when the data admit no fit: raise `OrderFitError` (`True`), or return
      an `OrderFit` whose `result` says why (`False`; see `RESULTS`).

    **Returns:** an `OrderFit`; with `throw=False` check `fit.success` (or `fit.result`) before
    reading its numbers.

    **Raises:** `ValueError` at once for bad input: mismatched lengths, non-positive, non-finite
    or repeated steps, negative errors, a `roundoff` of the wrong shape, bad options. With
    `throw=True`, `OrderFitError` (a `ValueError`) when no fit is possible: fewer than
    `min_points` points (`too_few_points`), a NaN/inf error (`nonfinite_errors`), a zero error
    with `asymptotic=False` (`zero_errors`), fewer than `min_points` points above the floor
    (`at_floor`), or no run of `min_points` consecutive points above the floor sharing one slope
    (`no_asymptotic_window`).

    **Example:** `fit_order([0.1, 0.05, 0.025], [1e-2, 2.5e-3, 6.25e-4]).order == 2.0`.
    """
    owner = "fit_order"
    int_in_range("min_points", min_points, 2, owner=owner, numpy_ints=False)
    number_in_range("confidence", confidence, 0, 1, owner=owner)
    positive_float("tol", tol, owner=owner, finite=False, numpy_scalars=True)
    positive_float("roundoff_factor", roundoff_factor, owner=owner, numpy_scalars=True)
    finite_float("flat", flat, owner=owner, numpy_scalars=True)
    finite_float("expected", expected, owner=owner, allow_none=True, numpy_scalars=True)
    h = np.asarray(steps, dtype=np.float64).ravel()
    e = np.asarray(errors, dtype=np.float64).ravel()
    if h.size != e.size:
        raise ValueError(f"fit_order: {h.size} steps but {e.size} errors; pass one error per step.")
    if not np.all(np.isfinite(h)) or np.any(h <= 0):
        raise ValueError(f"fit_order: steps must be finite and > 0; got {h.tolist()}.")
    if len(np.unique(h)) != h.size:
        raise ValueError(f"fit_order: steps must be distinct; got {h.tolist()}.")
    if np.any(e < 0):
        raise ValueError(
            f"fit_order: errors must be >= 0 (they are norms of differences); got {e.tolist()}."
        )
    # Valid data that admit no fit: reported after every input check (those raise first).
    failure = None
    if h.size < min_points:
        failure = (
            RESULTS.too_few_points,
            f"fit_order: {h.size} point(s) given; an order fit needs at least {min_points} "
            "step sizes (use a longer ladder).",
        )
    elif not np.all(np.isfinite(e)):
        failure = (
            RESULTS.nonfinite_errors,
            f"fit_order: errors must be finite and >= 0; got {e.tolist()} (a NaN/inf error means "
            "a run diverged: shrink the largest step).",
        )
    level = np.asarray(DEFAULT_ROUNDOFF if roundoff is None else roundoff, dtype=np.float64)
    if level.ndim == 0:
        level = np.full(h.shape, float(level))
    elif level.shape != h.shape:
        raise ValueError(
            f"fit_order: roundoff must be a scalar or one level per step ({h.size}); "
            f"got shape {level.shape}."
        )
    if not np.all(np.isfinite(level)) or np.any(level < 0):
        raise ValueError("fit_order: roundoff levels must be finite and >= 0.")
    order = np.argsort(h)
    h, e, level = h[order], e[order], level[order]
    n = h.size

    def no_fit(result, message, floor=None, floor_kind=None, local=None):
        return _no_fit(result, message, h, e, confidence, expected, floor, floor_kind, local, throw)

    if failure is not None:
        return no_fit(*failure)
    positive = e > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        logh, loge = np.log(h), np.where(positive, np.log(np.where(positive, e, 1.0)), -np.inf)
        local = np.diff(loge) / np.diff(logh)
    local = np.where(np.isfinite(local), local, -np.inf)

    fields = dict(window_selected=False, candidate_windows=1, regime="all_points")
    floor, floor_kind, unresolved, q, reduction = None, None, 0, None, False
    if asymptotic:
        by_level = ~positive | (e <= level * roundoff_factor)
        lo = _extend(e, _floor_tail(logh, loge, by_level, flat, min_points), min_points)
        while True:
            floor = float(e[:lo].max()) if lo > 0 else None
            floor_kind = None if floor is None else "roundoff" if by_level[:lo].any() else "flat"
            if n - lo < min_points:
                return no_fit(
                    RESULTS.at_floor,
                    f"fit_order: only {n - lo} point(s) lie above the round-off floor "
                    f"(errors {e.tolist()}); an order fit needs {min_points}: use larger steps.",
                    floor,
                    floor_kind,
                    local,
                )
            a, hi = _window(local, positive, lo, min_points, tol)
            if hi - a < min_points:
                return no_fit(
                    RESULTS.no_asymptotic_window,
                    f"fit_order: no {min_points} consecutive points share one slope within "
                    f"±{tol} (local orders {np.round(local, 3).tolist()}); refine the ladder or "
                    "raise tol.",
                    floor,
                    floor_kind,
                    local,
                )
            # A flat stretch (order < `flat`) at the small end is floor too: the points below
            # the window when, with the window's first point, they do not decrease; the window
            # itself when it is flat, or when a larger step already had an error as small as the
            # window's largest (no convergence across it), and `min_points` points stay above.
            above = np.flatnonzero(e[hi:] <= e[a:hi].max())
            if a > lo and _line(logh[lo : a + 1], loge[lo : a + 1])[0] < flat:
                lo = _extend(e, a, min_points)
            elif _line(logh[a:hi], loge[a:hi])[0] < flat and n - hi >= min_points:
                lo = _extend(e, hi, min_points)
            elif above.size and n - (hi + above[-1] + 1) >= min_points:
                lo = _extend(e, hi + above[-1] + 1, min_points)
            else:
                break
        unresolved = a - lo
        m = min_points
        fields["window_selected"] = True
        fields["candidate_windows"] = (n - m + 1) * (n - m + 2) // 2
    else:
        if not positive.all():
            return no_fit(
                RESULTS.zero_errors,
                f"fit_order: asymptotic=False needs all errors > 0; got {e.tolist()}.",
                local=local,
            )
        a, hi = 0, n
    used = np.zeros(n, dtype=bool)
    used[a:hi] = True
    p, c, rss, sxx = _line(logh[a:hi], loge[a:hi])
    mw = hi - a
    level_ci = 1.0 - (1.0 - confidence) / fields["candidate_windows"]
    if mw > 2:
        se = math.sqrt(rss / (mw - 2) / sxx)
        t = _t_quantile(0.5 + level_ci / 2, mw - 2)
        ci = (p - t * se, p + t * se)
    else:
        se, ci = float("nan"), (-math.inf, math.inf)

    if asymptotic:
        start, drift = _large_step_run(local, positive, hi, tol) if hi < n else (n, True)
        if start < n and positive[start:].all():
            q, _, rss_q, sxx_q = _line(logh[start:], loge[start:])
            if expected is None:
                dof = max(mw - 2, 0) + max(n - start - 2, 0)
                if dof > 0:
                    s2 = (rss + rss_q) / dof
                    se_diff = math.sqrt(s2 / sxx + s2 / sxx_q)
                    t_diff = _t_quantile(0.5 + confidence / 2, dof)
                else:
                    se_diff, t_diff = 0.0, 0.0
                # Local orders from the window's last to the large-step run's first: a jump of
                # more than `tol` between neighbours marks a change of regime; a slow drift (the
                # sum of two power laws one order apart never jumps by more than 0.17 per
                # halving of h) is pre-asymptotic.
                jumps = np.abs(np.diff(local[hi - 2 : start + 1]))
                reduction = (
                    not drift
                    and bool(jumps.size)
                    and float(jumps.max()) > tol
                    and q - p - tol > t_diff * se_diff
                    and (n - start >= 3 or q >= 2 * p)
                )
        if expected is not None:
            reduction = p < expected - tol
        if reduction:
            fields["regime"] = "order_reduction"
        elif unresolved:
            fields["regime"] = "unresolved"
        else:
            fields["regime"] = "asymptotic"
    return OrderFit(
        order=p,
        constant=math.exp(c),
        stderr=se,
        ci_low=ci[0],
        ci_high=ci[1],
        confidence=confidence,
        steps=h,
        errors=e,
        used=used,
        local_orders=local,
        floor=floor,
        pre_asymptotic=int(n - hi),
        order_reduction=bool(reduction),
        preasymptotic_order=None if q is None else float(q),
        expected=None if expected is None else float(expected),
        unresolved=int(unresolved),
        floor_kind=floor_kind,
        **fields,
    )


def _no_fit(result, message, h, e, confidence, expected, floor, floor_kind, local, throw):
    """The failed `OrderFit` of `fit_order` (NaN numbers, no point used); raised as
    `OrderFitError` when `throw`."""
    nan = float("nan")
    fit = OrderFit(
        order=nan,
        constant=nan,
        stderr=nan,
        ci_low=nan,
        ci_high=nan,
        confidence=confidence,
        steps=h,
        errors=e,
        used=np.zeros(h.size, dtype=bool),
        local_orders=np.full(max(h.size - 1, 0), nan) if local is None else local,
        floor=floor,
        pre_asymptotic=0,
        expected=None if expected is None else float(expected),
        floor_kind=floor_kind,
        regime="no_fit",
        result=result,
        message=message,
    )
    if throw:
        raise OrderFitError(fit)
    return fit


def _line(x: np.ndarray, y: np.ndarray):
    """Least squares `y ≈ c + p x`: `(p, c, residual sum of squares, Σ (x − x̄)²)`."""
    xm = x.mean()
    sxx = float(((x - xm) ** 2).sum())
    p = float(((x - xm) * (y - y.mean())).sum() / sxx)
    c = float(y.mean() - p * xm)
    rss = float(((y - (c + p * x)) ** 2).sum())
    return p, c, rss, sxx


def _consistent(s: np.ndarray, tol: float) -> bool:
    """Whether all local orders `s` lie within `tol` of their median."""
    if s.size == 0:
        return True
    if not np.all(np.isfinite(s)):
        return False
    return bool(np.all(np.abs(s - np.median(s)) <= tol))


def _floor_tail(logh, loge, by_level, flat, min_points):
    """How many smallest-step points are floor by level or flatness (before `_extend`).

    From the smallest step up: points round-off by level (`by_level`: zero, or `≤ roundoff_factor
    · roundoff`), and points whose order towards some larger step is below `flat` (the error is
    no smaller than at a larger step, up to `(h/H)^flat`: comparing with every larger step, not
    just the next, keeps a noisy up-tick inside a round-off floor from ending it). Flatness only
    counts when at least `min_points` points stay above it."""
    n = loge.size
    flat_at = np.zeros(n, dtype=bool)
    for j in range(n - 1):
        with np.errstate(invalid="ignore"):
            slopes = (loge[j + 1 :] - loge[j]) / (logh[j + 1 :] - logh[j])
        flat_at[j] = bool(np.any(np.where(np.isnan(slopes), -np.inf, slopes) < flat))

    def tail(use_flat: bool) -> int:
        lo = 0
        while lo < n and (by_level[lo] or (use_flat and flat_at[lo])):
            lo += 1
        return lo

    lo = tail(True)
    return lo if n - lo >= min_points else tail(False)


def _extend(e, lo, min_points):
    """Extend a floor `[0, lo)` over the points within `_TRANSITION` of its largest error (more
    than `1/_TRANSITION` round-off), keeping `min_points` points above it."""
    if lo == 0:
        return 0
    top = float(e[:lo].max())
    while e.size - lo > min_points and e[lo] <= _TRANSITION * top:
        lo += 1
    return lo


def _window(local, positive, lo, min_points, tol):
    """The asymptotic window `[a, hi)`: the first start `a ≥ lo` (smallest steps first) whose
    longest run of consistent local orders has `min_points` points; `(lo, lo)` if none."""
    n = local.size + 1
    for a in range(lo, n - min_points + 1):
        if not positive[a]:
            continue
        for hi in range(n, a + min_points - 1, -1):
            if positive[a:hi].all() and _consistent(local[a : hi - 1], tol):
                return a, hi
    return lo, lo


def _large_step_run(local, positive, hi, tol):
    """The large-step regime: the longest run of consistent local orders ending at the largest
    step. Returns its first point clipped to the window's last point `hi − 1` (so the regime is
    fitted on pre-asymptotic points plus that junction), and whether the run reaches into the
    window (shares a local order with it: a drift, not a separate regime)."""
    n = local.size + 1
    first = n - 2
    for s in range(0, n - 1):
        if positive[s:].all() and _consistent(local[s:], tol):
            first = s
            break
    return max(first, hi - 1), first <= hi - 2
