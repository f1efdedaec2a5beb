"""Gaussian draws that share a few compiled samplers across shapes."""

import math

import jax
import jax.numpy as jnp
import numpy as np

_SMALLEST_DRAW = 1 << 12
"""The fewest numbers one sampler program draws: every shape up to this size shares one."""


def normal(key, shape, dtype, scale=1.0):
    """`scale * jax.random.normal(key, shape, dtype)`, bit for bit, compiled for a few sizes only.

    JAX's partitionable threefry (its default) draws element `i` from the key and `i` alone, so
    the first `size` numbers of a draw of `m >= size` numbers are the draw of `shape`. Drawing
    `m` (the next power of two, at least 4096) and cutting and scaling on the host lets draws of
    many shapes share a few compiled samplers: each new shape compiled one (0.2-0.3 s on a
    2-core CPU, the threefry rounds). Under a transformation (a traced key), or with the
    non-partitionable threefry, it is the plain draw."""
    shape = tuple(shape)
    size = math.prod(shape)
    if isinstance(key, jax.core.Tracer) or not jax.config.jax_threefry_partitionable or size == 0:
        return scale * jax.random.normal(key, shape, dtype)
    draw = jax.random.normal(key, (max(_SMALLEST_DRAW, 1 << (size - 1).bit_length()),), dtype)
    values = np.asarray(draw)[:size].reshape(shape)
    if scale != 1.0:
        values = values * np.asarray(scale, values.dtype)
    return jnp.asarray(values)
