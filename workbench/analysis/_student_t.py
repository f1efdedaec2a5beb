"""Student's t quantiles for confidence intervals, without SciPy (a runtime dependency we avoid).

`t_quantile` bisects the upper tail `P(T > t) = I_x(ν/2, 1/2)/2`, `x = ν/(ν + t²)`, where `I_x` is
the regularized incomplete beta function (`jax.scipy.special.betainc`). It is called on the host
with Python floats and always computes in float64, whether or not the caller enabled x64 (a
scoped `enable_x64`, not a change of the global config). Tested against `scipy.stats.t`.
"""

import jax
import jax.numpy as jnp
from jax.scipy.special import betainc

__all__ = ["t_quantile"]

# Bisection steps on [0, _T_MAX]: 1e6 / 2**_STEPS is far below float64 resolution.
_T_MAX = 1e6
_STEPS = 200


def t_quantile(q: float, dof: int) -> float:
    """The `q`-quantile of Student's t with `dof` degrees of freedom, `0 < q < 1` (float64)."""
    q, dof = float(q), float(dof)
    if not 0.0 < q < 1.0 or not dof > 0.0:
        raise ValueError(f"t_quantile: needs 0 < q < 1 and dof > 0, got q={q!r}, dof={dof!r}.")
    if q < 0.5:
        return -t_quantile(1.0 - q, dof)
    with jax.enable_x64(True):  # scoped: the caller's setting is restored on exit
        return float(_upper_quantile(1.0 - q, dof))


@jax.jit
def _upper_quantile(tail, dof):
    """The `t ≥ 0` with `P(T > t) = tail` (`tail ≤ 1/2`), by bisection on `[0, _T_MAX]`."""

    def step(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        above = _upper_tail(mid, dof) > tail  # the tail decreases in t: the root is right of mid
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = jax.lax.fori_loop(0, _STEPS, step, (jnp.float64(0.0), jnp.float64(_T_MAX)))
    return 0.5 * (lo + hi)


def _upper_tail(t, dof):
    """`P(T > t)` for `t ≥ 0`: `I_x(ν/2, 1/2)/2` with `x = ν/(ν + t²)`."""
    return 0.5 * betainc(0.5 * dof, 0.5, dof / (dof + t * t))
