r"""Exponential trends: the rate of `y ≈ e^{a + r x}` (a straight line on a semilog plot), the
counterpart of `fit_order` for quantities that decay or grow exponentially rather than like a
power of the step: collapse rates and plateau growth of the particle model, the convergence of
Gauss rules in the number of nodes.
"""

import math
from typing import NamedTuple

import numpy as np

from .._checks import int_in_range

__all__ = ["ExponentialFit", "exponential_fit", "exponential_rate"]


class ExponentialFit(NamedTuple):
    """The result of `exponential_fit`: `y ≈ exp(intercept + rate · x)` on `num_used` points."""

    rate: float
    intercept: float
    num_used: int


def exponential_fit(x, y, *, window=None, min_points: int = 2) -> ExponentialFit:
    r"""The rate $r$ of an exponential trend $y \approx e^{a + r x}$: least squares on $\log y$.

    A slope of $\log y$ against $x$ itself (not against $\log x$: for a power law $y \approx C x^p$
    use `workbench.analysis.fit_order`). $r < 0$ is a decay, e.g. the late-time collapse of
    $1 - \min_{i \ne j}\langle x_i, x_j\rangle$ compared with Thm 6.3's rate bound (then $-r$ is the
    collapse rate); $r > 0$ a growth, e.g. metastable plateau lengths against $\beta$. NumPy, float64.

    **Arguments:**

    - `x`: abscissae (times, inverse temperatures), shape `(T,)`.
    - `y`: the values, shape `(T,)`; only finite `y > 0` are used.
    - `window`: `(low, high)` with `0 < low < high`: use only the points with
      `low ≤ y ≤ high` (e.g. the late-time range above round-off); `None` uses all.
    - `min_points`: the fewest usable points a fit needs (an integer ≥ 2).

    **Returns:** an `ExponentialFit(rate, intercept, num_used)`. When fewer than `min_points`
    points are usable (or they share one `x`), `rate` and `intercept` are `nan`: the data do not
    reach the window, which is a result, not an error; `num_used` still counts the usable points.

    **Raises:** `ValueError` for `x`, `y` of different or non-1-D shapes, a bad `window` or
    `min_points`.

    **Example:** `exponential_fit([0, 1, 2], [1, e⁻², e⁻⁴]).rate == -2.0`.
    """
    int_in_range("min_points", min_points, 2, owner="exponential_fit")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(
            f"exponential_fit: x and y must be 1-D of the same length; got shapes {x.shape} and "
            f"{y.shape}."
        )
    use = np.isfinite(x) & np.isfinite(y) & (y > 0)
    if window is not None:
        try:
            low, high = (float(v) for v in window)
        except (TypeError, ValueError):
            raise ValueError(
                f"exponential_fit: window={window!r} must be a pair (low, high)."
            ) from None
        if not 0 < low < high:
            raise ValueError(f"exponential_fit: window={window!r} must satisfy 0 < low < high.")
        use &= (y >= low) & (y <= high)
    num = int(use.sum())
    if num < min_points or np.ptp(x[use]) == 0:
        return ExponentialFit(float("nan"), float("nan"), num)
    rate, intercept = np.polyfit(x[use], np.log(y[use]), 1)
    return ExponentialFit(float(rate), float(intercept), num)


def exponential_rate(num_nodes, errors, *, floor: float = 1e-13) -> float:
    r"""The rate `c` of exponential convergence `e(m) ≈ C · 10^{−c m}` in the number of nodes `m`:
    decades of error gained per added node.

    It is the least-squares slope of `−log10 e` against `m` (a straight line on a semilog plot),
    over the points whose error is above `floor` (round-off). This is the measure for
    Gauss–Legendre rules on analytic integrands, whose error decays like `ρ^{−2m}` (`c =
    2 log10 ρ`); an algebraic order (`fit_order`, a log-log slope against the spacing) does not
    describe it.

    **Arguments:**

    - `num_nodes`: the node counts `m` (distinct, > 0).
    - `errors`: the errors `e(m) ≥ 0`, one per node count.
    - `floor`: errors at or below it are left out.

    **Returns:** `c` (float; positive when the error falls).

    **Raises:** `ValueError` for mismatched lengths, non-finite values, node counts that are not
    distinct and positive, negative errors, or fewer than 2 errors above `floor`.

    **Example:** `exponential_rate([4, 6, 8], [1e-3, 1e-5, 1e-7])` is `1.0` (to rounding).
    """
    m = np.asarray(num_nodes, dtype=np.float64).ravel()
    e = np.asarray(errors, dtype=np.float64).ravel()
    if m.size != e.size:
        raise ValueError(
            f"exponential_rate: {m.size} node counts but {e.size} errors; pass one per count."
        )
    if not (np.all(np.isfinite(m)) and np.all(m > 0) and len(np.unique(m)) == m.size):
        raise ValueError(
            f"exponential_rate: num_nodes={m.tolist()} must be distinct, finite and > 0."
        )
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ValueError(f"exponential_rate: errors={e.tolist()} must be finite and >= 0.")
    above = e > floor
    if above.sum() < 2:
        raise ValueError(
            f"exponential_rate: only {int(above.sum())} error(s) above floor={floor:g} "
            f"(errors {e.tolist()}); a rate needs 2: use fewer nodes."
        )
    # The same least-squares line as `exponential_fit`, in decades: log10 e = ln e / ln 10.
    return float(-exponential_fit(m[above], e[above]).rate / math.log(10.0))
