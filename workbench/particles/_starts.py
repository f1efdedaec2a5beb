"""Random starting configurations and summary times shared by the particle experiments."""

from __future__ import annotations

import math

import numpy as np

from .._checks import int_in_range

__all__ = ["half_time", "uniform_sphere"]


def uniform_sphere(rng: np.random.Generator, num: int, n: int, d: int) -> np.ndarray:
    """`num` configurations of `n` i.i.d. uniform points on the unit sphere `S^{d−1}`.

    A uniform point is a standard Gaussian vector divided by its norm (the Gaussian is
    rotation invariant). Drawn with NumPy, so that sweeps over many `(n, d)` compile nothing.

    **Arguments:**

    - `rng`: a `numpy.random.Generator` (e.g. `np.random.default_rng(seed)`).
    - `num`, `n`, `d`: number of configurations, particles per configuration, dimension
      (`d ≥ 1`, `n ≥ 1`, `num ≥ 1`).

    **Returns:** a float64 array of shape `(num, n, d)` whose rows have unit norm.
    """
    for name, value in (("num", num), ("n", n), ("d", d)):
        int_in_range(name, value, 1, owner="uniform_sphere")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(
            f"uniform_sphere: rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
            f"got {type(rng).__name__}."
        )
    g = rng.standard_normal((num, n, d))
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def half_time(ts, fraction, level: float = 0.5) -> float | np.ndarray:
    """First time a statistic reaches `level`, linearly interpolated between saved times.

    **Arguments:**

    - `ts`: increasing saved times, shape `(T,)`.
    - `fraction`: the statistic at those times, shape `(T,)` or `(..., T)` (one curve per
      leading index, e.g. per β of a phase diagram).
    - `level`: the level to reach (default ½: the phase diagram's half time `t½`).

    **Returns:** the time (a float for one curve, an array for several); `NaN` where the curve
    never reaches `level`; `ts[0]` where it starts at or above it.
    """
    ts = np.asarray(ts, dtype=np.float64)
    f = np.asarray(fraction, dtype=np.float64)
    if f.shape[-1] != ts.shape[0]:
        raise ValueError(
            f"half_time: fraction has {f.shape[-1]} times along its last axis, ts has {ts.shape[0]}."
        )
    if f.ndim > 1:
        return np.array([half_time(ts, row, level) for row in f.reshape(-1, ts.shape[0])]).reshape(
            f.shape[:-1]
        )
    above = np.nonzero(f >= level)[0]
    if above.size == 0:
        return math.nan
    k = int(above[0])
    if k == 0:
        return float(ts[0])
    t0, t1, f0, f1 = ts[k - 1], ts[k], f[k - 1], f[k]
    return float(t0 + (level - f0) * (t1 - t0) / (f1 - f0))
