"""Building a model from NumPy weights compiles no XLA program (`workbench._host`), and gives
the arrays `jax.numpy` would."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
from workbench._host import device_array, stack_arrays


def _compiled(caplog, fn):
    """What `fn()` returns, and the names of the XLA programs compiled while it ran."""
    caplog.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        out = jax.block_until_ready(fn())
    names = [r.getMessage() for r in caplog.records if "Finished XLA compilation" in r.getMessage()]
    return out, names


def _same(a, b):
    assert isinstance(a, jax.Array) and a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", [None, np.float32, np.float64])
def test_device_array_is_jnp_asarray_without_compiling(caplog, dtype):
    rng = np.random.default_rng(0)
    cases = [
        rng.standard_normal((5, 7)),  # float64
        rng.standard_normal((4, 6)).astype(np.float32).T,  # not contiguous
        np.float64(1.5),  # a NumPy scalar stays 0-d
        np.arange(6, dtype=np.int32).reshape(2, 3),
    ]
    for x in cases:
        if dtype is not None and x.dtype.kind == "i":
            continue
        want = jnp.asarray(x, dtype=dtype)
        got, compiled = _compiled(caplog, lambda: device_array(x, dtype))
        _same(got, want)
        assert not compiled, (x.shape, dtype, compiled)


def test_stack_arrays_is_jnp_stack_without_compiling_and_falls_back_for_tracers(caplog):
    rng = np.random.default_rng(1)
    host = [rng.standard_normal((3, 4)) for _ in range(5)]
    want = jnp.stack(host)
    got, compiled = _compiled(caplog, lambda: stack_arrays(host))
    _same(got, want)
    assert not compiled
    on_device = [jnp.asarray(x) for x in host]  # uncommitted CPU arrays: read as they are
    got, compiled = _compiled(caplog, lambda: stack_arrays(on_device))
    _same(got, want)
    assert not compiled
    # Traced entries (inside jit) and mixed dtypes take jnp.stack, with its promotion rules.
    _same(jax.jit(lambda *xs: stack_arrays(xs))(*host), want)
    mixed = [host[0].astype(np.float32), host[1]]
    _same(stack_arrays(mixed), jnp.stack(mixed))


def test_a_state_dict_loads_into_an_encoder_without_compiling(caplog):
    """`encoder_from_torch` on a NumPy state dict: no XLA program, and the same model as the
    loader of `jax.numpy` arrays gives (every leaf equal)."""
    rng = np.random.default_rng(2)
    sd = wb.architectures.random_encoder_state_dict(
        rng, d=16, num_layers=3, dim_feedforward=24, final_norm=True, dtype=np.float32
    )
    load = lambda sd: wb.architectures.encoder_from_torch(sd, num_heads=2, norm_first=True)
    model, compiled = _compiled(caplog, lambda: load(sd))
    assert not compiled, compiled
    reference = load({k: jnp.asarray(v) for k, v in sd.items()})
    for a, b in zip(jax.tree.leaves(model), jax.tree.leaves(reference)):
        _same(a, b)


def test_weakly_typed_and_committed_arrays_keep_jax_numpy_semantics():
    weak = [jnp.asarray(1.5), jnp.asarray(2.5)]  # weakly typed scalars
    got = stack_arrays(weak)
    assert got.weak_type == jnp.stack(weak).weak_type
    committed = [jax.device_put(np.ones(3), jax.devices()[0]) for _ in range(2)]
    got = stack_arrays(committed)
    _same(got, jnp.stack(committed))
    assert got.committed == jnp.stack(committed).committed
