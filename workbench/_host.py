"""Arrays built on the host (NumPy) and handed to JAX once.

Every eager JAX operation on a new shape compiles a small XLA program (~10–40 ms on a CPU): a
model built from a state dict by `jnp.stack`, `.T` and dtype casts of its weights compiles one
per layer shape, which is most of the cost of loading a small model. These helpers do the same
work in NumPy when the inputs are NumPy arrays (or uncommitted single-CPU-device JAX arrays,
which NumPy reads without a copy), and fall back to `jax.numpy` otherwise (tracers, arrays on
an accelerator or placed on a chosen device), so the results are the same arrays either way.
"""

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["device_array", "stack_arrays"]


def _on_host(x) -> bool:
    """Whether NumPy can read `x` as it is: a NumPy array/scalar, or a concrete, uncommitted,
    strongly typed JAX array on one CPU device."""
    if isinstance(x, (np.ndarray, np.generic)):
        return True
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or x.weak_type:
        return False  # (a weakly typed array keeps its weak type through jax.numpy only)
    try:
        devices = x.devices()
        return not x.committed and len(devices) == 1 and next(iter(devices)).platform == "cpu"
    except Exception:  # deleted or otherwise unreadable arrays: let jax.numpy decide
        return False


def _canonical(dtype):
    return jax.dtypes.canonicalize_dtype(dtype)


def device_array(x, dtype=None) -> jax.Array:
    """`jnp.asarray(x, dtype=dtype)`, with the cast and any copy to contiguous memory done in
    NumPy for host inputs (no XLA program compiled). The dtype rules are `jnp.asarray`'s (with
    x64 off a requested float64 is float32, with JAX's warning)."""
    if not isinstance(x, (np.ndarray, np.generic)):  # JAX arrays, Python scalars, ...
        return jnp.asarray(x, dtype=dtype)
    host = np.asarray(x)
    host = host.astype(_canonical(host.dtype if dtype is None else dtype), copy=False)
    if host.ndim and not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)
    # An explicit dtype: `jnp.asarray` of a NumPy array without one compiles a copy (`stage`).
    return jnp.asarray(host, dtype=host.dtype if dtype is None else dtype)


def stack_arrays(xs) -> jax.Array:
    """`jnp.stack(xs)`, done in NumPy when every entry is a host array of one dtype."""
    xs = list(xs)
    if all(_on_host(x) for x in xs) and len({np.dtype(x.dtype) for x in xs}) == 1:
        return device_array(np.stack([np.asarray(x) for x in xs]))
    return jnp.stack(xs)
