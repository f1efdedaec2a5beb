"""The continuous Transformer on [0, 1]² and its quadrature discretizations (the resolution study).

Checked by value: quadrature rules against exact integrals and their degrees of exactness; the
uniform-grid model against the standard pre-LN encoder with folded weights (1e-12); invariants of
the weighted discretization (a duplicated token = a doubled weight, probes and padding change
nothing, a probe on a node reproduces the node); observed orders of feature- and token-grid
refinement (the study's smoke run, order 2 ± 0.3; Gauss exponential); bad input.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.analysis as wba
from studies._toolkit.config import ConfigError
from studies._toolkit.report import have_matplotlib
from studies.numerics import resolution
from workbench.analysis._exponential import exponential_rate

RULES = (wba.MidpointRule(), wba.TrapezoidRule(), wba.GaussLegendreRule())


# ----------------------------------------------------------------------------------------------
# quadrature rules


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_weights_nodes_and_exactness(rule):
    for m in (2, 3, 7, 16):
        t, w = rule.nodes_weights(m)
        assert t.shape == w.shape == (m,)
        assert np.all((t >= 0) & (t <= 1)) and np.all(np.diff(t) > 0) and np.all(w > 0)
        np.testing.assert_allclose(w.sum(), 1.0, rtol=0, atol=1e-15)
        # Linear functions are exact for every rule: ∫ (3t − 1) = 1/2.
        np.testing.assert_allclose(w @ (3 * t - 1), 0.5, rtol=0, atol=1e-14)
    if rule.order is None:  # Gauss with m nodes: exact to degree 2m − 1, not 2m.
        t, w = rule.nodes_weights(5)
        np.testing.assert_allclose(w @ t**9, 1 / 10, rtol=0, atol=1e-15)
        assert abs(w @ t**10 - 1 / 11) > 1e-8


@pytest.mark.parametrize("rule", RULES[:2], ids=lambda r: r.name)
def test_rule_observed_order_on_a_smooth_integrand(rule):
    # ∫_0^1 e^t sin(3t) dt in closed form; not periodic, so trapezoid is not spectral.
    exact = (np.e * (np.sin(3) - 3 * np.cos(3)) + 3) / 10
    sizes = (8, 16, 32, 64, 128)
    errors = []
    for m in sizes:
        t, w = rule.nodes_weights(m)
        errors.append(abs(w @ (np.exp(t) * np.sin(3 * t)) - exact))
    fit = wba.fit_order([rule.spacing(m) for m in sizes], errors)
    assert abs(fit.order - rule.order) < 0.05


def test_gauss_converges_exponentially_on_a_smooth_integrand():
    exact = (np.e * (np.sin(3) - 3 * np.cos(3)) + 3) / 10
    errs = []
    for m in (2, 4, 6, 8):
        t, w = wba.GaussLegendreRule().nodes_weights(m)
        errs.append(abs(w @ (np.exp(t) * np.sin(3 * t)) - exact))
    assert errs[-1] < 1e-11
    assert all(b < 1e-2 * a for a, b in zip(errs[:-1], errs[1:]))  # > 2 decades per 2 nodes


# ----------------------------------------------------------------------------------------------
# the continuous model and its discretization


@pytest.fixture(scope="module")
def model_and_input():
    k1, k2 = jax.random.split(jax.random.key(3))
    model = wba.ContinuousTransformer.random(
        key=k1, num_layers=3, tau=0.5, activation=wb.terms.gelu
    )
    f = wba.SmoothKernel.random(key=k2)
    return model, f


def test_uniform_grid_is_the_standard_encoder(model_and_input):
    model, f = model_and_input
    rule = wba.MidpointRule()
    tokens, features = wba.Grid.from_rule(rule, 6), wba.Grid.from_rule(rule, 10)
    u_cont = model(f, tokens, features)
    sd = wba.folded_encoder_state_dict(model, features)
    enc = wb.architectures.encoder_from_torch(
        sd, num_heads=1, norm_first=True, activation="gelu", layer_norm_eps=0.0
    )
    u0 = f(jnp.asarray(tokens.nodes), jnp.asarray(features.nodes))
    diff = float(jnp.max(jnp.abs(u_cont - enc(u0))))
    assert diff < 1e-12
    # The discrete model really does something: u(T) differs from u(0) by O(1).
    assert float(jnp.max(jnp.abs(u_cont - u0))) > 0.1


def test_uniform_token_weights_cancel_in_the_softmax(model_and_input):
    model, f = model_and_input
    features = wba.Grid.from_rule(wba.GaussLegendreRule(), 8)
    t = wba.Grid.from_rule(wba.MidpointRule(), 6)
    scaled = wba.Grid(t.nodes, 7.0 * t.weights, t.num_nodes, 0)  # any constant weight
    np.testing.assert_allclose(
        model(f, scaled, features), model(f, t, features), rtol=0, atol=1e-13
    )


def test_duplicated_token_equals_doubled_weight(model_and_input):
    model, f = model_and_input
    features = wba.Grid.from_rule(wba.GaussLegendreRule(), 8)
    g = wba.Grid.from_rule(wba.GaussLegendreRule(), 5)
    k = 2
    # Node k twice with half its weight each, against node k once with its full weight.
    nodes = np.insert(g.nodes, k, g.nodes[k])
    weights = np.insert(g.weights, k, 0.5 * g.weights[k])
    weights[k + 1] = 0.5 * g.weights[k]
    dup = wba.Grid(nodes, weights, 6, 0)
    u = model(f, g, features)
    u_dup = model(f, dup, features)
    np.testing.assert_allclose(np.delete(np.asarray(u_dup), k, axis=0), u, rtol=0, atol=1e-13)


def test_probes_and_padding_change_nothing_and_nystrom_hits_the_nodes(model_and_input):
    model, f = model_and_input
    tokens = wba.Grid.from_rule(wba.TrapezoidRule(), 5)
    features = wba.Grid.from_rule(wba.GaussLegendreRule(), 7)
    u = np.asarray(model(f, tokens, features))
    # Probes at grid nodes (plus one elsewhere), then padding: the grid block is unchanged and
    # the Nyström value at a probe on a node equals the node's value.
    pt = wba.Grid.from_rule(wba.TrapezoidRule(), 5, probes=(tokens.nodes[1], 0.3)).padded(11)
    pf = wba.Grid.from_rule(wba.GaussLegendreRule(), 7, probes=(features.nodes[4], 0.77)).padded(12)
    up = np.asarray(model(f, pt, pf))
    np.testing.assert_allclose(up[:5, :7], u, rtol=0, atol=1e-13)
    np.testing.assert_allclose(up[5, :7], u[1], rtol=0, atol=1e-13)
    np.testing.assert_allclose(up[:5, 7], u[:, 4], rtol=0, atol=1e-13)
    assert np.all(np.isfinite(up))


# ----------------------------------------------------------------------------------------------
# the exponential rate (Gauss) is not an order fit


def test_exponential_rate():
    m = np.array([3, 4, 6, 8, 10])
    np.testing.assert_allclose(exponential_rate(m, 5.0 * 10.0 ** (-0.7 * m)), 0.7, rtol=1e-12)
    # Errors at the floor are left out; the rate of the rest is unchanged.
    e = np.r_[5.0 * 10.0 ** (-0.7 * m), 1e-16, 0.0]
    np.testing.assert_allclose(exponential_rate(np.r_[m, 12, 14], e), 0.7, rtol=1e-12)
    # Gauss on an analytic integrand: several decades per node; order 2 only a fraction of one.
    exact = (np.e * (np.sin(3) - 3 * np.cos(3)) + 3) / 10
    sizes = (2, 3, 4, 5, 6)
    gauss, mid = [], []
    for k in sizes:
        for rule, errs in ((wba.GaussLegendreRule(), gauss), (wba.MidpointRule(), mid)):
            t, w = rule.nodes_weights(k)
            errs.append(abs(w @ (np.exp(t) * np.sin(3 * t)) - exact))
    assert exponential_rate(sizes, gauss) > 1.0
    assert exponential_rate(sizes, mid) < 0.3
    with pytest.raises(ValueError, match="only 1 error"):
        exponential_rate([2, 4, 6], [1e-3, 1e-15, 0.0])
    with pytest.raises(ValueError, match="distinct"):
        exponential_rate([2, 2, 6], [1e-3, 1e-4, 1e-5])
    with pytest.raises(ValueError, match="3 node counts but 2 errors"):
        exponential_rate([2, 4, 6], [1e-3, 1e-4])


# ----------------------------------------------------------------------------------------------
# the study (smoke size): orders and acceptance


@pytest.fixture(scope="module")
def results():
    return resolution.compute(resolution.smoke_config())


def test_refinement_orders_match_the_rules(results):
    low = [r for r in results.rows if r.declared_order is not None]
    assert {(r.rule, r.refine) for r in low} == {
        (rule, refine) for rule in ("midpoint", "trapezoid") for refine in ("features", "tokens")
    }
    for r in low:
        assert len(r.sizes) >= 4
        assert abs(r.fit.order - 2) <= 0.3, (r.rule, r.refine, r.fit.order)
        assert abs(r.functional_fit.order - 2) <= 0.3
        assert not r.fit.order_reduction
        assert r.errors[-1] > 1e-12  # well above round-off: a real asymptotic range


def test_gauss_refinement_is_exponential(results):
    for r in (r for r in results.rows if r.rule == "gauss"):
        e = r.errors
        assert e[-1] < 1e-8, (r.refine, e)
        # Far beyond any order 2: a 4× increase of nodes gains more than 5 decades.
        assert e[0] / e[-1] > 1e5
        assert r.decades_per_node > 0.5 and r.fit is None
        # and at the largest Gauss size it beats midpoint at its largest (more nodes) by far.
        mid = next(m for m in results.rows if m.rule == "midpoint" and m.refine == r.refine)
        assert e[-1] < 1e-3 * mid.errors[-1]


def test_relu_kink_destroys_gauss_convergence(results):
    g = next(r for r in results.relu_rows if r.rule == "gauss")
    smooth = next(r for r in results.rows if r.rule == "gauss" and r.refine == "features")
    assert g.errors[-1] > 1e4 * smooth.errors[-1]
    assert g.decades_per_node < 0.3 and g.fit is not None


def test_verdict_yes_on_smoke(results):
    text = resolution.verdict(results)
    assert text.startswith("Yes. "), text
    assert "converge at their order ± 0.3" in text and "threshold 0.3" in text
    assert results.equivalence_max_abs_difference < 1e-12


def test_verdict_flips(results):
    def replace_row(rows, i, **change):
        return [dataclasses.replace(r, **change) if j == i else r for j, r in enumerate(rows)]

    low = dataclasses.replace(results.rows[0].fit, order=1.0)
    one = dataclasses.replace(results, rows=replace_row(results.rows, 0, fit=low))
    assert resolution.verdict(one).startswith("Partly. "), resolution.verdict(one)
    assert "do NOT all converge" in resolution.verdict(one)
    # In tolerance but flagged: order reduction is a failure too.
    flagged = dataclasses.replace(results.rows[0].fit, order_reduction=True)
    two = dataclasses.replace(results, rows=replace_row(results.rows, 0, fit=flagged))
    assert resolution.verdict(two).startswith("Partly. ")
    gauss = [i for i, r in enumerate(results.rows) if r.declared_order is None]
    rows = replace_row(results.rows, 0, fit=low)
    for i in gauss:
        rows = replace_row(rows, i, decades_per_node=0.1)
    none = dataclasses.replace(results, rows=rows)
    assert resolution.verdict(none).startswith("No. "), resolution.verdict(none)
    off = dataclasses.replace(results, equivalence_max_abs_difference=1e-3)
    assert resolution.verdict(off).startswith("Partly. ") and "NOT met" in resolution.verdict(off)


def test_report_and_figure(results):
    text = resolution.report(results)
    assert text.count("**pass**") == len(results.rows) and "**FAIL**" not in text
    assert f"max |Δ| = {results.equivalence_max_abs_difference:.1e}" in text
    if have_matplotlib():
        fig = resolution.figures(results)["resolution"]
        labels = [t.get_text() for t in fig.axes[0].get_legend().texts]
        assert f"midpoint: p = {results.rows[0].fit.order:.2f}" in labels


@pytest.mark.parametrize("num", [1, 0, -3, True, 2.5])
def test_grid_sizes_below_two_are_rejected(num):
    with pytest.raises(ValueError, match="at least|>= 2"):
        wba.Grid.from_rule(wba.MidpointRule(), num)
    with pytest.raises(ValueError, match="num="):
        wba.MidpointRule().nodes_weights(num)


@pytest.mark.parametrize(
    "change, match",
    [
        (
            {"rules": ("midpoint", "simpson")},
            "rules=('midpoint', 'simpson') is not allowed; valid choices: 'midpoint', 'trapezoid', 'gauss'",
        ),
        ({"rules": ()}, "rules=() is not allowed; give at least one value"),
        ({"sizes": (1, 8, 16, 32)}, "sizes=(1, 8, 16, 32) is not allowed; allowed range [2, inf)"),
        (
            {"sizes": (8, 16, 32)},
            "sizes=(8, 16, 32) is not allowed; give at least 4 distinct sizes",
        ),
        ({"gauss_sizes": (4, 6, 8, 8)}, "gauss_sizes=(4, 6, 8, 8) is not allowed; give at least 4"),
        (
            {"reference_size": 10},
            "reference_size=10 is not allowed; it must exceed the largest of gauss_sizes (12)",
        ),
        ({"fixed_size": 1}, "fixed_size=1 is not allowed; allowed range [2, inf)"),
        (
            {"activation": "swish"},
            "activation='swish' is not allowed; valid choices: 'gelu', 'gelu_new'",
        ),
        ({"tau": 0.0}, "tau=0.0 is not allowed; every value must be finite and > 0"),
        ({"probes": (0.5, 1.5)}, "probes=(0.5, 1.5) is not allowed; allowed range [0, 1]"),
        ({"max_frequency": 0.5}, "max_frequency=0.5 is not allowed; allowed range [1, inf)"),
        ({"min_gauss_rate": -1.0}, "min_gauss_rate=-1.0 is not allowed"),
    ],
)
def test_bad_study_configs(change, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        dataclasses.replace(resolution.smoke_config(), **change)


def test_cli_rejects_bad_config_before_any_folder(tmp_path):
    from studies._run.cli import main

    out = tmp_path / "x"
    assert main(["run", resolution.NAME, "--smoke", "--out", str(out), "--sizes", "8,16,32"]) == 2
    assert not out.exists()


def test_unknown_rule_names_the_valid_rules():
    with pytest.raises(ValueError, match=r"rule='simpson'.*midpoint, trapezoid, gauss"):
        wb.registry.lookup("quadrature_rule", "simpson", field="rule")


def test_bad_library_inputs(model_and_input):
    model, f = model_and_input
    g = wba.Grid.from_rule(wba.GaussLegendreRule(), 4, probes=(0.5,))
    with pytest.raises(ValueError, match=r"probes=\[1.5\] must lie in \[0, 1\]"):
        wba.Grid.from_rule(wba.MidpointRule(), 4, probes=(1.5,))
    with pytest.raises(ValueError, match="is not a quadrature rule"):
        wba.Grid.from_rule("midpoint", 4)
    with pytest.raises(ValueError, match=r"refine='heads'.*features, tokens"):
        wba.refinement_errors(
            model,
            f,
            wba.MidpointRule(),
            (4, 8),
            refine="heads",
            fixed=g,
            reference=g,
            probes=(0.5,),
        )
    with pytest.raises(ValueError, match="sizes=1"):
        wba.refinement_errors(
            model,
            f,
            wba.MidpointRule(),
            (1, 8),
            refine="tokens",
            fixed=g,
            reference=g,
            probes=(0.5,),
        )
    bare = wba.Grid.from_rule(wba.GaussLegendreRule(), 4)
    with pytest.raises(ValueError, match="fixed grid carries probes"):
        wba.refinement_errors(
            model,
            f,
            wba.MidpointRule(),
            (4, 8),
            refine="tokens",
            fixed=bare,
            reference=g,
            probes=(0.5,),
        )
    with pytest.raises(ValueError, match=r"input of shape \(3, 3\) does not match"):
        model(jnp.zeros((3, 3)), g, g)
    with pytest.raises(ValueError, match="uniform weights"):
        wba.folded_encoder_state_dict(model, wba.Grid.from_rule(wba.TrapezoidRule(), 5))
    with pytest.raises(ValueError, match="tau=0"):
        wba.ContinuousTransformer(model.layers, tau=0)
    with pytest.raises(ValueError, match="num_layers=0"):
        wba.ContinuousTransformer.random(key=jax.random.key(0), num_layers=0)
