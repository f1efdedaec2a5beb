"""The reduction of `ReducedForm`: a start `X` `(n, d)` as coordinates `R` `(n, r)` in an
orthonormal basis of its row space (`X = R Uᵀ`; the identity-matrix dynamics never leaves it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._types import Tokens

_LANES = 8  # float64 lanes of an AVX-512 register


def _reduce(x0: Tokens) -> Tokens:
    """Coordinates `R = X U` `(n, r)` in an orthonormal basis `U` of the row space, `r = min(n, d)`;
    for `d < n`, `R = X` with zero columns appended up to a multiple of 8.

    Zero columns stay zero (the velocity rows are combinations of the rows) and add exact zeros
    to every inner product; a width below one SIMD register runs ~2.5× slower on XLA:CPU at
    `d = 2` than the padded width 8 (measured).
    """
    n, d = x0.shape
    if d <= n:
        width = -(-d // _LANES) * _LANES
        return jnp.pad(x0, ((0, 0), (0, width - d))) if width > d else x0
    _, c = jnp.linalg.qr(x0.T)  # x0ᵀ = U c, U (d, n) orthonormal: x0 = cᵀ Uᵀ
    return c.T


@jax.jit
def _reduce_all(x: Float[Array, "S n d"]) -> Float[Array, "S n r"]:
    return jax.vmap(_reduce)(x)
