"""Invariants of the recovered models: equivariance, causality, masks, jit, vmap, gradients."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

from helpers import max_abs, small_encoder

A = wb.architectures
S = wb.schemes


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("scheme, k", [(S.LieTrotter(), 1), (S.Strang(), 3)])
def test_permutation_equivariance(norm_first, scheme, k, rng):
    _, m = small_encoder(rng, norm_first=norm_first, final_norm=True)
    m = m.rediscretize(scheme=scheme, steps_per_layer=k)
    u = jnp.asarray(rng.normal(size=(7, 12)))
    perm = rng.permutation(7)
    assert max_abs(m(u[perm]), m(u)[perm]) < 1e-13


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_causal_model_is_prefix_independent(k, rng):
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=2)
    g = A.gpt2_from_hf(A.random_gpt2_state_dict(rng, cfg), cfg).rediscretize(steps_per_layer=k)
    ids = jnp.asarray(rng.integers(0, cfg["vocab_size"], 10))
    full = g(ids)
    for n in (1, 4, 9):
        assert max_abs(g(ids[:n]), full[:n]) < 1e-13
    # Changing a later token does not change earlier outputs (Volterra operator).
    other = g(ids.at[7].set((ids[7] + 1) % cfg["vocab_size"]))
    assert max_abs(other[:7], full[:7]) == 0.0
    assert max_abs(other[7:], full[7:]) > 1e-3


def test_padding_mask_equals_dropping_the_padded_tokens(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(8, 12)))
    real = jnp.array([True, True, False, True, True, False, True, True])
    masked = m(u, mask=real)
    assert max_abs(masked[real], m(u[real])) < 1e-13


@pytest.mark.slow
def test_jit_equals_eager(rng):
    _, m = small_encoder(rng, norm_first=True, activation="gelu", final_norm=True)
    m = m.rediscretize(scheme=S.Yoshida4(), steps_per_layer=2)
    u = jnp.asarray(rng.normal(size=(6, 12)))
    with jax.disable_jit():
        eager = m(u)
    assert max_abs(eqx.filter_jit(m)(u), eager) < 1e-13


@pytest.mark.slow
def test_vmap_equals_loop(rng):
    cfg = A.bert_config(d=12, num_heads=3, num_layers=2, intermediate=20)
    b = A.bert_from_hf(A.random_bert_state_dict(rng, cfg), cfg)
    ids = jnp.asarray(rng.integers(0, cfg["vocab_size"], (4, 9)))
    types = jnp.asarray(rng.integers(0, 2, (4, 9)))
    batched = jax.vmap(b)(ids, types)
    looped = jnp.stack([b(i, t) for i, t in zip(ids, types)])
    assert max_abs(batched, looped) < 1e-13


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
def test_gradients_match_finite_differences(rng):
    _, m = small_encoder(rng, norm_first=False, activation="gelu", final_norm=True)
    m = m.rediscretize(scheme=S.Strang(), steps_per_layer=2)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    w = jnp.asarray(rng.normal(size=(5, 12)))

    @eqx.filter_jit  # one program for the four evaluations below (eagerly: one scan each)
    def loss(model, x):
        return jnp.sum(model(x) * w)

    gm, gu = (
        eqx.filter_grad(lambda model, x: loss(model, x))(m, u),
        jax.grad(lambda x: loss(m, x))(u),
    )
    eps = 1e-6
    du = jnp.asarray(rng.normal(size=u.shape))
    fd = (loss(m, u + eps * du) - loss(m, u - eps * du)) / (2 * eps)
    np.testing.assert_allclose(jnp.sum(gu * du), fd, rtol=1e-7)
    # Gradient with respect to a control: the layer-1 query kernel of the attention term.
    get = lambda model: model.equation.operators[0].term.values.query
    dq = jnp.asarray(rng.normal(size=get(m).shape))
    bump = lambda s: eqx.tree_at(get, m, get(m) + s * dq)
    fd = (loss(bump(eps), u) - loss(bump(-eps), u)) / (2 * eps)
    np.testing.assert_allclose(jnp.sum(get(gm) * dq), fd, rtol=1e-7)


def test_no_recompilation_on_the_second_call(rng):
    traces = []

    @eqx.filter_jit
    def forward(model, x):
        traces.append(None)  # runs only while tracing
        return model(x)

    _, m1 = small_encoder(rng)
    _, m2 = small_encoder(rng)  # same shapes, other weights
    u = jnp.asarray(rng.normal(size=(6, 12)))
    y1 = forward(m1, u)
    y2 = forward(m2, u + 1.0)
    assert len(traces) == 1
    assert max_abs(y1, m1(u)) < 1e-13 and max_abs(y2, m2(u + 1.0)) < 1e-13


@pytest.mark.slow
def test_paper_a_literal_scheme_equals_post_ln_block(rng):
    p = A.PaperAEncoder.random(rng, d=10, num_heads=2, num_layers=3)
    assert (
        p.scheme.substeps()[0] == "euler(attention)" and len(p.scheme.substeps()) == 4 + 2 - 1 + 1
    )
    u = jnp.asarray(rng.normal(size=(6, 10)))
    assert max_abs(p(u), p.post_ln_equivalent()(u)) < 1e-13
    # With LayerNorm's ε the ½ of the average no longer cancels: not exact any more.
    pe = A.PaperAEncoder.random(np.random.default_rng(3), d=10, num_heads=2, num_layers=3, eps=1e-1)
    assert max_abs(pe(u), pe.post_ln_equivalent()(u)) > 1e-6


@pytest.mark.parametrize(
    "scheme",
    [S.LieTrotter(), S.Strang(), S.Yoshida4(), S.Suzuki4()],
    ids=lambda s: type(s).__name__,
)
def test_float32_stays_float32(scheme, rng):
    # x64 is on in the tests: no scheme may promote a float32 model's state to float64.
    _, m = small_encoder(rng, norm_first=True, dtype=np.float32)
    u = jnp.asarray(rng.normal(size=(5, 12)), jnp.float32)
    y = m.rediscretize(scheme=scheme, steps_per_layer=2)(u)
    assert y.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(y)))


def test_post_norm_rediscretization_warns_that_the_order_is_one(rng):
    import warnings

    _, post = small_encoder(rng, norm_first=False, activation="gelu")
    _, pre = small_encoder(rng, norm_first=True, activation="gelu")
    _, pre_relu = small_encoder(rng, norm_first=True, activation="relu")
    assert post.is_post_norm and not pre.is_post_norm
    for scheme in (S.Strang(), S.Yoshida4(), S.Suzuki4()):
        with pytest.warns(UserWarning, match="post-norm model.*will converge at order 1") as record:
            m = post.rediscretize(scheme=scheme, steps_per_layer=4)
        assert len(record) == 1 and record[0].filename == __file__  # points at this line
        assert m.expected_order == 1
        assert "formulation=wb.Projected()" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: Lie–Trotter, or pre-norm
        assert post.rediscretize(scheme=S.LieTrotter(), steps_per_layer=4).expected_order == 1
        assert pre.rediscretize(scheme=S.Yoshida4(), steps_per_layer=4).expected_order == 4
        assert pre.rediscretize(scheme=S.Strang()).expected_order == 2
        # ReLU: a Lipschitz, not C¹, field: at most about 2.
        assert pre_relu.rediscretize(scheme=S.Yoshida4()).expected_order == 2
        assert pre_relu.rediscretize(scheme=S.Strang()).expected_order == 2
    # BERT (post-norm) forwards the warning to its caller; GPT-2 (pre-norm) does not warn.
    cfg = A.bert_config(d=12, num_heads=3, num_layers=1, intermediate=16)
    b = A.bert_from_hf(A.random_bert_state_dict(rng, cfg), cfg)
    with pytest.warns(UserWarning, match="post-norm model") as record:
        b.rediscretize(scheme=S.Strang())
    assert record[0].filename == __file__
    cfg = A.gpt2_config(d=12, num_heads=3, num_layers=1)
    g = A.gpt2_from_hf(A.random_gpt2_state_dict(rng, cfg), cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g.rediscretize(scheme=S.Yoshida4()).transformer.expected_order == 4


def test_integer_and_boolean_masks_agree_under_vmap(rng):
    _, m = small_encoder(rng)
    u = jnp.asarray(rng.normal(size=(2, 6, 12)))
    keep = jnp.array([[1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1]])
    f = jax.vmap(lambda x, k: m(x, mask=k))
    assert max_abs(f(u, keep), f(u, keep.astype(bool))) == 0.0


@pytest.mark.slow
def test_cvt_rediscretization_converges_at_the_scheme_order(rng):
    """Every CvT stage is a pre-norm equation with a smooth (GELU, softmax, convolution) field,
    so re-discretizing all stages with Strang converges at order 2 (float64; slopes of the
    max-abs error against 128 steps per layer, 4 → 8 → 16 steps, within 0.3; Yoshida4 gives
    4.0–4.1 on the same model, left out for compile time)."""
    scheme = S.Strang()
    cfg = A.cvt_config(embed_dim=(8, 12), num_heads=(2, 3), depth=(1, 2))
    m = A.cvt_from_hf(A.random_cvt_state_dict(rng, cfg), cfg, image_size=(16, 20))
    x = jnp.asarray(rng.standard_normal((3, 16, 20)))
    solve = lambda k: eqx.filter_jit(m.rediscretize(scheme, k))(x)
    ref_tokens, ref_cls = solve(128)
    errors = []
    for k in (4, 8, 16):
        tokens, cls = solve(k)
        errors.append(max(max_abs(tokens, ref_tokens), max_abs(cls, ref_cls)))
    slopes = np.diff(-np.log2(errors))
    assert np.all(np.abs(slopes - scheme.order()) <= 0.3), (errors, slopes)
