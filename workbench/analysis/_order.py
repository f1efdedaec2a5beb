r"""Observed convergence order: a log-log fit with a confidence band, the asymptotic range and
the round-off floor detected from the data.

For a method of order `p` the global error behaves like `e(h) ≈ C h^p` for small `h`, until
rounding errors (`≈ ε_mach · |u| · (number of steps)`) take over. `fit_order` fits
`log e = log C + p log h` by least squares on the longest run of consecutive step sizes whose
local slopes agree, so the pre-asymptotic large steps and the round-off floor at small steps are
both left out, and says which points it used and why it dropped the others.
"""

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class OrderFit:
    """The result of `fit_order`.

    **Fields:**

    - `order`: the fitted slope `p` of `log e` against `log h`.
    - `constant`: `C` in `e ≈ C h^p`.
    - `stderr`: the standard error of `p` (`nan` with two points).
    - `ci_low`, `ci_high`: the two-sided confidence interval of `p` (Student t, `n − 2` degrees
      of freedom; `±inf` with two points).
    - `confidence`: the level of that interval.
    - `steps`, `errors`: the data, sorted by increasing step.
    - `used`: boolean mask of the points in the fit (the asymptotic range).
    - `local_orders`: slopes between consecutive points (`len(steps) − 1`).
    - `floor`: the largest error among the small-step points left out because their local order
      collapsed (the round-off floor), or `None` if there were none.
    - `pre_asymptotic`: how many large-step points were left out.
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

    @property
    def num_used(self) -> int:
        return int(self.used.sum())

    def within(self, declared: float, tol: float = 0.3) -> bool:
        """Whether `|order − declared| ≤ tol`."""
        return abs(self.order - declared) <= tol

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
        }


def fit_order(
    steps,
    errors,
    *,
    min_points: int = 3,
    tol: float = 0.3,
    confidence: float = 0.95,
    asymptotic: bool = True,
) -> OrderFit:
    r"""Fit `e(h) ≈ C h^p` on the asymptotic range of a step-size ladder.

    **Arguments:**

    - `steps`: step sizes `h > 0` (any order; at least `min_points`).
    - `errors`: the errors `e(h) ≥ 0`, same length. Zero errors (exact to the last bit) count as
      round-off floor.
    - `min_points`: the fewest points a fit may use (at least 2).
    - `tol`: local orders within `tol` of each other are "the same slope". The chosen window is
      the longest run of consecutive points whose local orders all lie within `tol` of the
      window's median local order, at the smallest steps among the longest runs, excluding
      small-step points whose local order fell below it by more than `tol` (the round-off
      floor).
    - `confidence`: level of the confidence interval of `p`.
    - `asymptotic`: `False` fits all points (no window detection).

    **Returns:** an `OrderFit`.

    **Raises:** `ValueError` for mismatched lengths, fewer than `min_points` points, non-positive
    or non-finite steps, negative or non-finite errors, or no window of `min_points` usable
    points.

    **Example:** `fit_order([0.1, 0.05, 0.025], [1e-2, 2.5e-3, 6.25e-4]).order == 2.0`.
    """
    if isinstance(min_points, bool) or not isinstance(min_points, int) or min_points < 2:
        raise ValueError(f"fit_order: min_points={min_points!r} must be an integer >= 2.")
    if not 0 < confidence < 1:
        raise ValueError(f"fit_order: confidence={confidence!r} must be in (0, 1).")
    if not tol > 0:
        raise ValueError(f"fit_order: tol={tol!r} must be > 0.")
    h = np.asarray(steps, dtype=np.float64).ravel()
    e = np.asarray(errors, dtype=np.float64).ravel()
    if h.size != e.size:
        raise ValueError(f"fit_order: {h.size} steps but {e.size} errors; pass one error per step.")
    if h.size < min_points:
        raise ValueError(
            f"fit_order: {h.size} point(s) given; an order fit needs at least {min_points} "
            "step sizes (use a longer ladder)."
        )
    if not np.all(np.isfinite(h)) or np.any(h <= 0):
        raise ValueError(f"fit_order: steps must be finite and > 0; got {h.tolist()}.")
    if len(np.unique(h)) != h.size:
        raise ValueError(f"fit_order: steps must be distinct; got {h.tolist()}.")
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ValueError(
            f"fit_order: errors must be finite and >= 0; got {e.tolist()} (a NaN/inf error means "
            "a run diverged: shrink the largest step)."
        )
    order = np.argsort(h)
    h, e = h[order], e[order]
    positive = e > 0
    with np.errstate(divide="ignore"):
        logh, loge = np.log(h), np.where(positive, np.log(np.where(positive, e, 1.0)), -np.inf)
    local = np.diff(loge) / np.diff(logh)
    local = np.where(np.isfinite(local), local, -np.inf)

    if asymptotic:
        lo, hi = _window(local, positive, min_points, tol)
    else:
        if not positive.all():
            raise ValueError("fit_order: asymptotic=False needs all errors > 0.")
        lo, hi = 0, h.size
    if hi - lo < min_points:
        raise ValueError(
            f"fit_order: no {min_points} consecutive points share one slope within ±{tol} "
            f"(local orders {np.round(local, 3).tolist()}); refine the ladder or raise tol."
        )
    used = np.zeros(h.size, dtype=bool)
    used[lo:hi] = True
    x, y = logh[lo:hi], loge[lo:hi]
    m = hi - lo
    xm = x.mean()
    sxx = float(((x - xm) ** 2).sum())
    p = float(((x - xm) * (y - y.mean())).sum() / sxx)
    c = float(y.mean() - p * xm)
    if m > 2:
        resid = y - (c + p * x)
        se = math.sqrt(float((resid**2).sum()) / (m - 2) / sxx)
        t = _t_quantile(0.5 + confidence / 2, m - 2)
        ci = (p - t * se, p + t * se)
    else:
        se, ci = float("nan"), (-math.inf, math.inf)
    floor = float(e[:lo].max()) if lo > 0 else None
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
        pre_asymptotic=int(h.size - hi),
    )


def _window(local: np.ndarray, positive: np.ndarray, min_points: int, tol: float):
    """The longest run `[lo, hi)` of points with consistent local slopes, smallest steps first
    among equals; points whose slope falls below the window's by more than `tol` at the small
    steps are round-off floor."""
    n = local.size + 1
    best = (0, 0)
    for lo in range(n):
        if not positive[lo]:
            continue
        for hi in range(n, lo + 1, -1):
            if hi - lo < max(min_points, best[1] - best[0] + 1) or not positive[lo:hi].all():
                continue
            s = local[lo : hi - 1]
            if s.size == 0:
                continue
            med = float(np.median(s))
            if np.all(np.abs(s - med) <= tol):
                best = (lo, hi)
                break
    return best


def _t_quantile(q: float, dof: int) -> float:
    """The `q`-quantile of Student's t with `dof` degrees of freedom (bisection on the CDF)."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, dof) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _t_cdf(t: float, dof: int) -> float:
    """CDF of Student's t for `t ≥ 0`: `1 − I_x(ν/2, 1/2)/2` with `x = ν/(ν + t²)`."""
    x = dof / (dof + t * t)
    return 1.0 - 0.5 * _betainc(0.5 * dof, 0.5, x)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function `I_x(a, b)` (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    log_front += a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = tiny if abs(d) < tiny else d
        d = 1.0 / d
        c = 1.0 + num / c
        c = tiny if abs(c) < tiny else c
        cd = c * d
        f *= cd
        if abs(1.0 - cd) < 1e-15:
            break
    return math.exp(log_front) * (f - 1.0) / a
