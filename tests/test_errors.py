"""Bad input gets a clear error naming the field, the bad value and the valid choices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

from helpers import small_encoder

A = wb.architectures
S = wb.schemes


def test_wrong_shapes(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    with pytest.raises(ValueError, match=r"shape \(n, d\).*jax.vmap"):
        m(u[None])
    with pytest.raises(ValueError, match="has 7 features; this model expects d = 12"):
        m(u[:, :7])
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1, positions=8)
    g = A.gpt2_from_hf(A.random_gpt2_state_dict(rng, cfg), cfg)
    with pytest.raises(ValueError, match="input_ids has length 9; this model takes 1 to 8 tokens"):
        g(jnp.zeros(9, int))
    with pytest.raises(ValueError, match="input_ids must hold integers"):
        g(jnp.zeros(3))


def test_state_dict_of_another_architecture(rng):
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    sd = A.random_gpt2_state_dict(rng, cfg)
    with pytest.raises(ValueError, match="looks like a Hugging Face GPT2Model state dict"):
        A.encoder_from_torch(sd, num_heads=3)
    enc = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    with pytest.raises(ValueError, match="looks like a torch.nn.TransformerEncoder"):
        A.bert_from_hf(enc, A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16))


def test_missing_unexpected_and_misshaped_keys(rng):
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=2, dim_feedforward=16)
    del sd["layers.1.norm2.bias"]
    sd["layers.0.extra.weight"] = np.zeros(3)
    sd["layers.1.linear2.bias"] = np.zeros(13)
    with pytest.raises(ValueError) as e:
        A.encoder_from_torch(sd, num_heads=3)
    msg = str(e.value)
    assert "missing keys (1): layers.1.norm2.bias" in msg
    assert "unexpected keys (1): layers.0.extra.weight" in msg
    assert "layers.1.linear2.bias: got (13,), expected (12,)" in msg


def test_heads_must_divide_the_width(rng):
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    with pytest.raises(
        ValueError,
        match=r"num_heads=5 does not divide the model width d=12; valid: \[1, 2, 3, 4, 6, 12\]",
    ):
        A.encoder_from_torch(sd, num_heads=5)
    cfg = A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16)
    sd = A.random_bert_state_dict(rng, cfg)
    with pytest.raises(ValueError, match="num_attention_heads=5 does not divide"):
        A.bert_from_hf(sd, {**cfg, "num_attention_heads": 5})
    with pytest.raises(ValueError, match="num_heads=0 must be a positive integer"):
        A.encoder_from_torch(
            A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16), num_heads=0
        )


def test_non_positive_steps(rng):
    _, m = small_encoder(rng, layers=3)
    u = jnp.asarray(rng.normal(size=(4, 12)))
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"steps_per_layer={bad!r} must be a positive integer"):
            m.rediscretize(steps_per_layer=bad)
        with pytest.raises(ValueError, match=f"num_steps={bad!r} must be a positive integer"):
            wb.integrate(m.equation, u, S.LieTrotter(), num_steps=bad)
    with pytest.raises(
        ValueError, match=r"num_steps=5 must be a multiple of the number of layers \(3\)"
    ):
        wb.integrate(m.equation, u, S.LieTrotter(), num_steps=5)
    with pytest.raises(ValueError, match="piece_length=0.0 must be positive"):
        wb.PiecewiseConstant(m.equation.operators[0].term.values, 0.0)


def test_bad_options(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(4, 12)))
    with pytest.raises(ValueError, match="method='strang' is neither a splitting scheme nor a diffrax solver; pass e.g."):
        wb.integrate(m.equation, u, "strang", num_steps=3)
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    with pytest.raises(
        ValueError, match="activation='swish' is not a known activation; valid choices"
    ):
        A.encoder_from_torch(sd, num_heads=3, activation="swish")
    with pytest.raises(ValueError, match="layer_norm_eps=-1.0 must be a nonnegative number"):
        A.encoder_from_torch(sd, num_heads=3, layer_norm_eps=-1.0)


def test_nan_input_is_reported(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(4, 12))).at[2, 3].set(jnp.nan)
    with pytest.raises(
        RuntimeError, match=r"the initial state \(the input tokens u\) contains NaN or inf"
    ):
        jax.block_until_ready(m(u))
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    g = A.gpt2_from_hf(A.random_gpt2_state_dict(rng, cfg), cfg)
    with pytest.raises(RuntimeError, match=r"input_ids out of range \[0, 97\)"):
        jax.block_until_ready(g(jnp.array([1, 2, 97])))


def test_divergence_is_reported_with_the_step():
    # u' = 1e100 u with Euler: 1e100, 1e200, 1e300, then inf at step 3 (t = 3).
    big = wb.terms.LinearKernel(
        jnp.full((4, 2, 2), 0.0).at[:, 0, 0].set(1e100).at[:, 1, 1].set(1e100), None
    )
    eq = wb.Equation((wb.Operator(wb.PiecewiseConstant(big)),), wb.PreNorm())
    u0 = jnp.ones((3, 2))
    sol = wb.integrate(eq, u0, S.LieTrotter(), num_steps=4, throw=False)
    assert int(sol.first_nonfinite_step) == 3
    with pytest.raises(RuntimeError, match=r"NaN/inf at step 3 \(t = 3 .. 4, layer 3\)"):
        jax.block_until_ready(wb.integrate(eq, u0, S.LieTrotter(), num_steps=4).u1)
    # Under vmap with throw=False each trajectory reports its own step.
    sols = jax.vmap(lambda x: wb.integrate(eq, x, S.LieTrotter(), num_steps=4, throw=False))(
        jnp.stack([u0, 1e-250 * u0])
    )
    np.testing.assert_array_equal(sols.first_nonfinite_step, [3, -1])
