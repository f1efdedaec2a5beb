"""Student's t quantiles for confidence intervals, without SciPy (a runtime dependency we avoid).

`t_quantile` bisects the CDF `1 − I_x(ν/2, 1/2)/2`, `x = ν/(ν + t²)`, where `I_x` is the regularized
incomplete beta function, evaluated by Lentz's continued fraction. Tested against `scipy.stats.t`.
"""

import math

__all__ = ["t_quantile"]


def t_quantile(q: float, dof: int) -> float:
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
