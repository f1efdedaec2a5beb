"""Terms and projections against closed forms, brute-force minimization and invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import workbench as wb

T = wb.terms


def _brute_force_s1(v, sigma1, sigma2, starts=20, seed=0):
    """min ‖w − v‖² s.t. mean(w) = σ1, var(w) = σ2², by SLSQP from many starts."""
    d = v.size
    cons = (
        {"type": "eq", "fun": lambda w: w.mean() - sigma1},
        {"type": "eq", "fun": lambda w: ((w - w.mean()) ** 2).mean() - sigma2**2},
    )
    rng = np.random.default_rng(seed)
    best = None
    for _ in range(starts):
        w0 = rng.normal(size=d)
        w0 = sigma2 * (w0 - w0.mean()) / w0.std() + sigma1
        r = scipy.optimize.minimize(
            lambda w: ((w - v) ** 2).sum(),
            w0,
            constraints=cons,
            method="SLSQP",
            options={"ftol": 1e-14, "maxiter": 500},
        )
        if r.success and (best is None or r.fun < best.fun):
            best = r
    return best


@pytest.mark.slow
@pytest.mark.parametrize("d", [3, 4, 6])
def test_layer_norm_projection_is_the_argmin(d, rng):
    sigma1, sigma2 = 0.3, 1.7
    P = T.LayerNormProjection.onto_s1(d, sigma1, sigma2, dtype=jnp.float64)
    for _ in range(3):
        v = rng.normal(size=(1, d)) * 2 + 0.5
        w = np.asarray(P(jnp.asarray(v)))[0]
        best = _brute_force_s1(v[0], sigma1, sigma2)
        # The closed form is on S1 ...
        assert abs(w.mean() - sigma1) < 1e-12 and abs(w.std() - sigma2) < 1e-12
        # ... and no feasible point found by the optimizer is closer (to the optimizer's tolerance).
        assert ((w - v[0]) ** 2).sum() <= best.fun + 1e-8
        np.testing.assert_allclose(w, best.x, atol=1e-5)
        # Closed-form squared distance d[(σ2 − s)² + (σ1 − m)²].
        np.testing.assert_allclose(
            P.squared_distance_s1(jnp.asarray(v))[0], ((w - v[0]) ** 2).sum(), rtol=1e-12
        )


def test_layer_norm_projection_properties(rng):
    d = 7
    P = T.LayerNormProjection.onto_s1(d, -0.4, 2.0, dtype=jnp.float64)
    v = jnp.asarray(rng.normal(size=(5, d)))
    # Idempotent, and invariant under positive scaling of the centred input (the ½ of paper A).
    np.testing.assert_allclose(P(P(v)), P(v), atol=1e-13)
    c = v - v.mean(-1, keepdims=True)
    np.testing.assert_allclose(P(3.7 * c + 5.0), P(c), atol=1e-13)
    # The ε form is not the exact projection: it misses the variance by a factor s²/(s² + ε).
    Pe = T.LayerNormProjection(P.weight, P.bias, 1e-2)
    s2 = jnp.var(v, axis=-1)
    np.testing.assert_allclose(jnp.var(Pe(v), axis=-1), 4.0 * s2 / (s2 + 1e-2), rtol=1e-12)


def test_relu_projection_is_the_argmin(rng):
    v = rng.normal(size=6)
    r = scipy.optimize.minimize(
        lambda w: ((w - v) ** 2).sum(),
        np.abs(v),
        bounds=[(0, None)] * 6,
        method="L-BFGS-B",
        options={"ftol": 1e-15, "gtol": 1e-12},
    )
    w = np.asarray(T.NonnegativeProjection()(jnp.asarray(v[None])))[0]
    np.testing.assert_allclose(w, r.x, atol=1e-7)
    np.testing.assert_array_equal(w, np.asarray(T.relu(jnp.asarray(v))))


@pytest.mark.parametrize(
    "make",  # built in the test: collecting this module must not ask for float64 with x64 off
    [T.SphereProjection, lambda: T.LayerNormProjection.onto_s1(6, 0.2, 1.3, dtype=jnp.float64)],
    ids=["sphere", "layer-norm"],
)
def test_tangent_projection_is_the_derivative_of_the_projection(make, rng):
    # For the orthogonal projection onto a smooth manifold, D P(u) = tangent projection at u ∈ S.
    proj = make()
    u = proj(jnp.asarray(rng.normal(size=(4, 6))))
    v = jnp.asarray(rng.normal(size=(4, 6)))
    _, jvp = jax.jvp(proj, (u,), (v,))
    t = proj.tangent(u, v)
    np.testing.assert_allclose(jvp, t, atol=1e-12)
    np.testing.assert_allclose(proj.tangent(u, t), t, atol=1e-12)  # idempotent


def test_affine_layer_norm_tangent_is_orthogonal_onto_the_tangent_space(rng):
    # With per-feature γ the set is {γ ⊙ w + β : w ∈ S1(0, 1)}, tangent vectors γ ⊙ s with
    # s ⊥ 1, s ⊥ w; `tangent` is the orthogonal projection onto that space.
    gamma, beta = jnp.linspace(0.5, 2.0, 6), jnp.linspace(-1.0, 1.0, 6)
    proj = T.LayerNormProjection(gamma, beta)
    w = T.LayerNormProjection.onto_s1(6, dtype=jnp.float64)(jnp.asarray(rng.normal(size=(4, 6))))
    u = gamma * w + beta
    v = jnp.asarray(rng.normal(size=(4, 6)))
    t = proj.tangent(u, v)
    s = t / gamma
    np.testing.assert_allclose(s.sum(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose((s * w).sum(-1), 0.0, atol=1e-12)
    s1 = T.LayerNormProjection.onto_s1(6, dtype=jnp.float64)
    for _ in range(3):
        other = gamma * s1.tangent(w, jnp.asarray(rng.normal(size=(4, 6))))
        np.testing.assert_allclose(jnp.sum((v - t) * other, axis=-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(proj.tangent(u, t), t, atol=1e-12)


def test_nonnegative_tangent_cone():
    u = jnp.array([[0.0, 1.0, 0.0, 2.0]])
    v = jnp.array([[-1.0, -1.0, 3.0, 0.5]])
    np.testing.assert_array_equal(T.NonnegativeProjection().tangent(u, v), [[0.0, -1.0, 3.0, 0.5]])


def _attention(rng, d=8, heads=2, causal=False):
    w = lambda *s: jnp.asarray(rng.normal(size=s) / np.sqrt(s[0]))
    return T.MultiHeadAttention(
        w(d, d), w(d, d), w(d, d), w(d, d), w(d), w(d), w(d), w(d), num_heads=heads, causal=causal
    )


def test_attention_matches_per_head_formula(rng):
    attn = _attention(rng, d=8, heads=2)
    u = jnp.asarray(rng.normal(size=(5, 8)))
    dh = 4
    out = np.zeros((5, 8))
    for h in range(2):
        sl = slice(h * dh, (h + 1) * dh)
        q = u @ attn.query[:, sl] + attn.query_bias[sl]
        k = u @ attn.key[:, sl] + attn.key_bias[sl]
        v = u @ attn.value[:, sl] + attn.value_bias[sl]
        s = np.asarray(q @ k.T) / np.sqrt(dh)
        g = np.exp(s - s.max(1, keepdims=True))
        g /= g.sum(1, keepdims=True)
        out += g @ np.asarray(v) @ np.asarray(attn.output[sl])  # W_O folds into per-head kernels
    out += np.asarray(attn.output_bias)
    np.testing.assert_allclose(attn.vector_field(u), out, atol=1e-12)


def test_attention_weights_causal_and_padding(rng):
    attn = _attention(rng, causal=True)
    u = jnp.asarray(rng.normal(size=(6, 8)))
    mask = jnp.array([True, True, True, False, True, True])
    g = attn.scores(u, mask=mask)
    np.testing.assert_allclose(g.sum(-1), 1.0, atol=1e-14)
    assert float(jnp.abs(jnp.triu(g, 1)).max()) == 0.0  # Volterra: no weight on x̃ > x
    assert float(jnp.abs(g[:, :, 3]).max()) == 0.0  # padding key gets no weight


def test_feedforward_and_linear_kernel_substeps(rng):
    d, m = 5, 9
    w1, b1 = rng.normal(size=(d, m)), rng.normal(size=m)
    w2, b2 = rng.normal(size=(m, d)), rng.normal(size=d)
    u = rng.normal(size=(3, d))
    for name, f in (("relu", lambda x: np.maximum(x, 0)), ("gelu_tanh", None), ("gelu", None)):
        ffn = T.FeedForward(
            jnp.asarray(w1),
            jnp.asarray(b1),
            jnp.asarray(w2),
            jnp.asarray(b2),
            activation=wb.registry.lookup("activation", name),
        )
        h = u @ w1 + b1
        if name == "gelu":
            from scipy.special import erf

            a = 0.5 * h * (1 + erf(h / np.sqrt(2)))
        elif name == "gelu_tanh":
            a = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
        else:
            a = f(h)
        np.testing.assert_allclose(ffn.vector_field(jnp.asarray(u)), a @ w2 + b2, atol=1e-12)
        np.testing.assert_allclose(
            ffn.substep(jnp.asarray(u), 0.25), u + 0.25 * (a @ w2 + b2), atol=1e-12
        )
    W, b = rng.normal(size=(d, d)), rng.normal(size=d)
    lin = T.LinearKernel(jnp.asarray(W), jnp.asarray(b))
    np.testing.assert_allclose(
        lin.substep(jnp.asarray(u), 1.0), u @ (np.eye(d) + W) + b, atol=1e-12
    )


def test_bad_construction_errors(rng):
    with pytest.raises(ValueError, match=r"num_heads=3 does not divide .* 8"):
        _attention(rng, d=8, heads=3)
    with pytest.raises(ValueError, match="valid choices: gelu, gelu_new"):
        wb.registry.lookup("activation", "swish")
    with pytest.raises(ValueError, match="FeedForward.output has shape"):
        T.FeedForward(jnp.zeros((4, 6)), None, jnp.zeros((4, 6)), None)
