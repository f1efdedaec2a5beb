"""The hypernetwork control basis (`wb.HypernetworkBasis`, `wb.Hypernetwork`): θ(t) = Σ φ_k(t) c_k
with φ a small network of t. Values against a hand-written NumPy network, SciPy quadrature,
observed orders and finite differences, in float64."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad_vec
from scipy.special import erf

import workbench as wb
import workbench.control as wbc
from workbench.control._saved_models import load_model

T = 3.0
K = 4


def _np_phi(basis, t, t1, derivative=False):
    """φ(t) (or φ'(t)) from the basis's weights, by hand in NumPy (float64)."""
    w1, b1, w2, b2 = (np.asarray(x, np.float64) for x in (basis.w1, basis.b1, basis.w2, basis.b2))
    f = w1.shape[0] // 2
    s = np.asarray(t, np.float64) / t1
    j = np.arange(1, f + 1)
    feat = np.concatenate([np.sin(np.pi * j * s), np.cos(np.pi * j * s)])
    z = feat @ w1 + b1
    if basis.activation == "tanh":
        h, dh = np.tanh(z), 1 - np.tanh(z) ** 2
    else:
        cdf = 0.5 * (1 + erf(z / math.sqrt(2)))
        h = z * cdf
        dh = cdf + z * np.exp(-(z**2) / 2) / math.sqrt(2 * math.pi)
    if not derivative:
        return h @ w2 + b2
    dfeat = np.concatenate([np.pi * j * np.cos(np.pi * j * s), -np.pi * j * np.sin(np.pi * j * s)])
    return (dh * (dfeat @ w1 / t1)) @ w2


def _np_theta(phi, values):
    return {k: np.tensordot(phi, np.asarray(v), axes=1) for k, v in values.items()}


def _values(key, n):
    ka, kb = jax.random.split(key)
    return {
        "a": jax.random.normal(ka, (n, 2, 3), jnp.float64),
        "b": jax.random.normal(kb, (n, 4), jnp.float64),
    }


def _basis(key, k=K, **kw):
    return wb.HypernetworkBasis(k, width=8, num_frequencies=3, dtype=jnp.float64, key=key, **kw)


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(tree[k])) for k in sorted(tree)])


@pytest.mark.parametrize("activation", ["tanh", "gelu"])
def test_evaluate_matches_a_numpy_network_on_the_same_weights(getkey, activation):
    basis = _basis(getkey(), activation=activation)
    values = _values(getkey(), K)
    control = wb.Hypernetwork(values, basis, t1=T)
    for t in (0.0, 0.37, 1.5, 2.99, T):
        want = _np_theta(_np_phi(basis, t, T), values)
        got = control.evaluate(t)
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-12, atol=1e-12)
    assert control.num_pieces == 1 and control.piece_length == T and control.t1 == T
    assert not control.is_piecewise_constant and control.localize(0) is control
    assert wb.AbstractBasis is not None and control.basis is basis
    # K banks of 6 + 4 parameters and the network 2F·W + W + W·K + K.
    assert basis.num_parameters == 6 * 8 + 8 + 8 * K + K


def test_projection_of_a_control_in_the_span_returns_it(getkey):
    """A control in the span of φ written with another network, φ' = φ M (M invertible) and
    banks M⁻¹ c: the same θ, so projecting it onto φ returns c."""
    basis = _basis(getkey())
    m = jax.random.normal(getkey(), (K, K), jnp.float64) + 3 * jnp.eye(K)
    other = eqx.tree_at(lambda b: (b.w2, b.b2), basis, (basis.w2 @ m, basis.b2 @ m))
    c = _values(getkey(), K)
    inv = jnp.linalg.inv(m)
    mixed = wb.Hypernetwork({k: jnp.tensordot(inv, v, axes=1) for k, v in c.items()}, other, t1=T)
    out = mixed.project(basis)
    assert isinstance(out, wb.Hypernetwork) and out.net is basis
    for k in c:
        np.testing.assert_allclose(np.asarray(out.values[k]), np.asarray(c[k]), atol=1e-8)


def _check_orthogonal(theta, projected, basis, points):
    """`∫ φ_k (θ − θ_P) dt` by SciPy's adaptive quadrature, θ given in NumPy."""

    def integrand(t):
        r = _np_theta(_np_phi(basis, t, T), projected.values)
        th = theta(t)
        residual = np.concatenate([np.ravel(th[k] - r[k]) for k in sorted(r)])
        return np.outer(_np_phi(basis, t, T), residual).ravel()

    inner, _ = quad_vec(integrand, 0.0, T, epsabs=1e-13, epsrel=1e-12, points=points)
    assert np.max(np.abs(inner)) <= 1e-8, np.max(np.abs(inner))


def test_the_residual_of_a_projection_is_orthogonal_to_every_phi(getkey):
    basis = _basis(getkey())
    v = {k: np.asarray(x) for k, x in _values(getkey(), 6).items()}
    layers = wb.PiecewiseConstant(v, T / 6)
    piece = lambda t: {k: x[min(int(t // (T / 6)), 5)] for k, x in v.items()}
    _check_orthogonal(piece, basis.project(layers), basis, points=list(np.arange(1, 6) * T / 6))
    legendre = wb.Legendre(v, t1=T)
    leg = lambda t: _np_theta(
        np.array(
            [
                math.sqrt(2 * k + 1) * np.polynomial.legendre.Legendre.basis(k)(2 * t / T - 1)
                for k in range(6)
            ]
        ),
        v,
    )
    _check_orthogonal(leg, wb.to_basis(legendre, basis), basis, points=None)


def test_compression_onto_legendre_and_layers_matches_scipy_quadrature(getkey):
    control = wb.Hypernetwork(_values(getkey(), K), _basis(getkey()), t1=T)
    theta = lambda t: _flat(_np_theta(_np_phi(control.net, t, T), control.values))
    leg = control.project(wb.LegendreBasis(2))
    for k in range(3):
        p = np.polynomial.legendre.Legendre.basis(k)
        want, _ = quad_vec(
            lambda t: math.sqrt(2 * k + 1) * p(2 * t / T - 1) * theta(t) / T, 0.0, T, epsabs=1e-13
        )
        np.testing.assert_allclose(_flat({n: v[k] for n, v in leg.values.items()}), want, atol=1e-9)
    layers = control.project(wb.PiecewiseConstantBasis(3))
    h = T / 3
    for i in range(3):
        want, _ = quad_vec(lambda t: theta(t) / h, i * h, (i + 1) * h, epsabs=1e-13)
        np.testing.assert_allclose(
            _flat({n: v[i] for n, v in layers.values.items()}), want, atol=1e-9
        )


def test_norm_and_smoothness_terms_match_scipy_quadrature(getkey):
    control = wb.Hypernetwork(_values(getkey(), K), _basis(getkey(), activation="gelu"), t1=T)

    def per_leaf(derivative):
        def f(t):
            th = _np_theta(_np_phi(control.net, t, T, derivative), control.values)
            return np.array([np.sum(th[k] ** 2) for k in sorted(th)])

        return quad_vec(f, 0.0, T, epsabs=1e-14, epsrel=1e-13)[0]

    np.testing.assert_allclose(control.norm_terms(), per_leaf(False), rtol=1e-10)
    np.testing.assert_allclose(control.smoothness_terms(), per_leaf(True), rtol=1e-10)


def _model(key, **kw):
    k1, k2 = jax.random.split(key)
    basis = wb.HypernetworkBasis(3, width=8, dtype=jnp.float64, key=k2)
    return wbc.random_transformer(
        k1, d=8, num_heads=2, num_layers=4, hidden=12, dtype=jnp.float64, basis=basis, **kw
    )


def test_a_network_projected_onto_the_basis_keeps_its_total_steps(getkey):
    model = _model(getkey(), steps_per_layer=3)
    assert model.num_layers == 1 and model.steps_per_layer == 12
    assert isinstance(model.equation.operators[0].term, wb.Hypernetwork)


@pytest.mark.parametrize(
    ("scheme", "order"), [(wb.schemes.LieTrotter(), 1), (wb.schemes.Strang(), 2)]
)
def test_splitting_schemes_keep_their_order_with_any_step_count(getkey, scheme, order):
    model = _model(getkey(), output_scale=1.0)
    u = jax.random.normal(getkey(), (5, 8), jnp.float64)
    ref = wb.integrate(model.equation, u, wb.schemes.Suzuki4(), num_steps=300).u1
    steps = np.array([5, 10, 20, 40, 80])
    errors = [
        float(jnp.max(jnp.abs(wb.integrate(model.equation, u, scheme, num_steps=int(n)).u1 - ref)))
        for n in steps
    ]
    fit = wb.analysis.fit_order(T / steps, errors)
    assert abs(fit.order - order) <= 0.2, (fit.order, errors)
    assert min(errors) > 1e-11  # above round-off: the fit is meaningful


def test_the_gradient_through_banks_and_network_matches_finite_differences(getkey):
    model = _model(getkey(), output_scale=1.0)
    u = jax.random.normal(getkey(), (5, 8), jnp.float64)
    params, static = eqx.partition(model.equation, eqx.is_inexact_array)

    def loss(p):
        eq = eqx.combine(p, static)
        return jnp.sum(jnp.sin(wb.integrate(eq, u, wb.schemes.Strang(), num_steps=5).u1))

    grad = jax.grad(loss)(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grad))
    direction = jax.tree.map(lambda x: jax.random.normal(getkey(), x.shape, x.dtype), params)

    def in_net(path):
        return any(getattr(k, "name", None) == "net" for k in path)

    for part in (True, False):  # the network's weights, then the banks
        v = jax.tree_util.tree_map_with_path(
            lambda path, x: x if in_net(path) == part else jnp.zeros_like(x), direction
        )
        exact = sum(
            float(jnp.vdot(g, d)) for g, d in zip(jax.tree.leaves(grad), jax.tree.leaves(v))
        )
        eps = 1e-5
        shift = lambda s: jax.tree.map(lambda x, d: x + s * eps * d, params, v)
        fd = (float(loss(shift(1))) - float(loss(shift(-1)))) / (2 * eps)
        assert abs(exact) > 1e-6
        assert abs(exact - fd) <= 1e-6 * abs(exact), (part, exact, fd)


def test_a_saved_model_comes_back_and_solves_identically(getkey, tmp_path):
    model = _model(getkey())
    u = jax.random.normal(getkey(), (5, 8), jnp.float64)
    wbc.save_model(tmp_path, model)
    back = load_model(tmp_path)
    assert isinstance(back.equation.operators[0].term, wb.Hypernetwork)
    a = wb.integrate(model.equation, u, wb.schemes.Strang(), num_steps=7).u1
    b = wb.integrate(back.equation, u, wb.schemes.Strang(), num_steps=7).u1
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_input_is_refused_by_name(getkey):
    with pytest.raises(ValueError, match="num_functions=0"):
        wb.HypernetworkBasis(0, key=getkey())
    with pytest.raises(ValueError, match="activation='relu'"):
        wb.HypernetworkBasis(2, activation="relu", key=getkey())
    with pytest.raises(ValueError, match="key=None"):
        wb.HypernetworkBasis(2)
    basis = _basis(getkey())
    with pytest.raises(ValueError, match="4"):
        wb.Hypernetwork(_values(getkey(), 3), basis, t1=T)
    layers = wb.PiecewiseConstant(_values(getkey(), 3), 1.0)
    with pytest.raises(ValueError, match="cannot project"):
        basis.project(layers)  # 4 learned functions from 3 layers: larger and not nested
    with pytest.raises(ValueError, match="cannot project"):
        wb.Hypernetwork(_values(getkey(), K), basis, t1=T).project(wb.LegendreBasis(K))
    # A learned basis's weights join the model: a float64 network into a float32 basis would
    # mix dtypes, so the projection names both before any compute.
    single = wb.HypernetworkBasis(K, width=8, key=getkey())  # float32 by default
    with pytest.raises(ValueError, match="float64 control onto HypernetworkBasis.*float32"):
        single.project(wb.PiecewiseConstant(_values(getkey(), K), 1.0))
