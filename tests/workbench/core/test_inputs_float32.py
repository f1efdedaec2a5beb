"""Input checks on the default user path (x64 off) as well as with x64 on.

Marked `float32`: CI runs these again with `WORKBENCH_X64=0`. With x64 off float64 arrays do
not exist, so a NumPy float64 input (or state dict) is float32 to JAX and is accepted; with x64
on it is float64 and a float32 model rejects it instead of promoting silently.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

from helpers import max_abs, small_encoder

pytestmark = pytest.mark.float32

A = wb.architectures
F32 = np.float32


def test_numpy_float64_input_follows_jax_dtypes():
    rng = np.random.default_rng(0)
    _, m = small_encoder(rng, dtype=F32)
    u64 = rng.standard_normal((5, 12))  # NumPy float64
    want = m(jnp.asarray(u64, jnp.float32))
    assert want.dtype == jnp.float32
    if jax.config.jax_enable_x64:
        with pytest.raises(ValueError, match=r"u has dtype float64 but .* are float32"):
            m(u64)
        with pytest.raises(ValueError, match=r"u0 has dtype float64 but .* are float32"):
            wb.integrate(m.equation, u64, wb.schemes.LieTrotter(), num_steps=m.num_layers)
    else:
        # JAX holds it as float32: the same computation, no error.
        got = m(u64)
        assert got.dtype == jnp.float32 and max_abs(got, want) == 0.0


def test_mixed_numpy_state_dict_follows_jax_dtypes():
    rng = np.random.default_rng(1)
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16, dtype=F32)
    sd["layers.0.norm1.bias"] = sd["layers.0.norm1.bias"].astype(np.float64)
    if jax.config.jax_enable_x64:
        with pytest.raises(ValueError, match="the weights mix floating dtypes"):
            A.encoder_from_torch(sd, num_heads=3)
    else:
        m = A.encoder_from_torch(sd, num_heads=3)
        assert m(jnp.ones((4, 12), jnp.float32)).dtype == jnp.float32


def test_masks_in_float32():
    rng = np.random.default_rng(2)
    _, m = small_encoder(rng, dtype=F32)
    u = jnp.asarray(rng.standard_normal((5, 12)), jnp.float32)
    keep = jnp.array([True, True, False, True, True])
    assert max_abs(m(u, mask=keep.astype(jnp.int32)), m(u, mask=keep)) == 0.0
    with pytest.raises(ValueError, match=r"mask has shape \(1,\); expected \(5,\)"):
        m(u, mask=jnp.array([True]))
    with pytest.raises(ValueError, match=r"mask has dtype float32"):
        m(u, mask=jnp.where(keep, 0.0, -jnp.inf).astype(jnp.float32))
    jitted = eqx.filter_jit(lambda model, x, k: model(x, mask=k))
    with pytest.raises(eqx.EquinoxRuntimeError, match="mask masks every token"):
        jax.block_until_ready(jitted(m, u, jnp.zeros(5, bool)))
