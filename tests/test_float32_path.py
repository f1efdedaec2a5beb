"""The default user path: float32 with `jax_enable_x64` off.

These tests run in the main pass (x64 on, float32 inputs) and again in CI's second pass with
`WORKBENCH_X64=0`, where float64 arrays cannot exist: recovery against PyTorch / Hugging Face at
1e-4, the particle oracles at float32 tolerances, and every integrator keeping float32 states
float32.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

from helpers import ALL_SCHEMES, require_reference, small_encoder

pytestmark = pytest.mark.float32

A = wb.architectures
F32 = np.float32


@pytest.mark.slow
def test_recovery_vs_torch_float32():
    require_reference()
    rng = np.random.default_rng(0)
    for norm_first, act in ((False, "relu"), (True, "gelu")):
        sd = A.random_encoder_state_dict(
            rng, d=12, num_layers=2, dim_feedforward=20, final_norm=norm_first, dtype=F32
        )
        m = A.encoder_from_torch(sd, num_heads=3, norm_first=norm_first, activation=act)
        u = rng.standard_normal((7, 12)).astype(F32)
        ours = m(jnp.asarray(u))
        assert ours.dtype == jnp.float32
        ref = A.run_reference(
            A.torch_encoder(sd, num_heads=3, norm_first=norm_first, activation=act, dtype=F32), u
        )
        assert np.max(np.abs(np.asarray(ours) - ref)) <= 1e-4


@pytest.mark.slow
def test_bert_and_gpt2_vs_hf_float32():
    require_reference()
    rng = np.random.default_rng(1)
    bert = A.bert_config(d=12, num_heads=3, num_layers=2, intermediate=24, positions=16)
    sd = A.random_bert_state_dict(rng, bert, dtype=F32)
    ids, types = rng.integers(0, bert["vocab_size"], 9), rng.integers(0, 2, 9)
    ours = A.bert_from_hf(sd, bert)(ids, types)
    assert ours.dtype == jnp.float32
    ref = A.run_reference(A.hf_bert(sd, bert, dtype=F32), ids, token_type_ids=types)
    assert np.max(np.abs(np.asarray(ours) - ref)) <= 1e-4

    gpt = A.gpt2_config(d=12, num_heads=3, num_layers=2, positions=16)
    sd = A.random_gpt2_state_dict(rng, gpt, dtype=F32)
    ids = rng.integers(0, gpt["vocab_size"], 9)
    ours = A.gpt2_from_hf(sd, gpt)(ids)
    assert ours.dtype == jnp.float32
    ref = A.run_reference(A.hf_gpt2(sd, gpt, dtype=F32), ids)
    assert np.max(np.abs(np.asarray(ours) - ref)) <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ALL_SCHEMES, ids=lambda s: type(s).__name__)
def test_integrate_keeps_float32(scheme):
    rng = np.random.default_rng(2)
    _, m = small_encoder(rng, norm_first=True, activation="gelu", dtype=F32, layers=2)
    u = jnp.asarray(rng.standard_normal((5, 12)), jnp.float32)
    sol = wb.integrate(m.equation, u, scheme, num_steps=2 * m.num_layers)
    floats = [x for x in jax.tree_util.tree_leaves(sol) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(x.dtype == jnp.float32 for x in floats)
    out = m.rediscretize(scheme=scheme, steps_per_layer=2)(u)
    assert out.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.slow
def test_diffrax_path_keeps_float32():
    rng = np.random.default_rng(3)
    _, m = small_encoder(rng, norm_first=True, activation="gelu", dtype=F32, layers=2)
    u = jnp.asarray(rng.standard_normal((5, 12)), jnp.float32)
    sol = wb.integrate(m.equation, u, diffrax.Tsit5(), num_steps=4)
    leaves = [x for x in jax.tree_util.tree_leaves(sol) if hasattr(x, "dtype")]
    floats = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(x.dtype == jnp.float32 for x in floats)


def test_particles_two_point_oracle_float32():
    # n = 2, β = 0: ρ(t) = tanh(t + artanh ρ0) for the inner product of the two particles.
    theta = 1.2
    x0 = jnp.asarray([[1.0, 0.0, 0.0], [np.cos(theta), np.sin(theta), 0.0]], jnp.float32)
    ts = jnp.linspace(0.0, 2.0, 5, dtype=jnp.float32)
    xs = wb.particles.simulate(
        wb.particles.USA(beta=0.0),
        x0,
        t1=2.0,
        dt=1e-2,
        integrator=wb.particles.ProjectedRK4(),
        save_ts=ts,
    )
    assert xs.dtype == jnp.float32
    rho = np.sum(np.asarray(xs[:, 0] * xs[:, 1]), axis=-1)
    exact = np.tanh(np.asarray(ts, np.float64) + np.arctanh(np.cos(theta)))
    assert np.max(np.abs(rho - exact)) <= 1e-5
    norms = np.linalg.norm(np.asarray(xs), axis=-1)
    assert np.max(np.abs(norms - 1.0)) <= 1e-6


def test_second_pass_really_runs_with_x64_off():
    import os

    if os.environ.get("WORKBENCH_X64") == "0":
        assert not jax.config.jax_enable_x64
        assert jnp.asarray(1.0).dtype == jnp.float32
    else:
        assert jax.config.jax_enable_x64
