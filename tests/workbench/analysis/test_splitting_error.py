"""Value tests of the splitting-error analysis (`workbench.analysis._splitting`) and its study.

Oracles: a linear equation whose flows are matrix exponentials (SciPy `expm`), where the Lie error
and the commutator are closed-form; central differences for the JVPs; diffrax Dopri8 for the exact
flow; `workbench.integrate` for the network schemes; observed orders by `fit_order` in float64.
"""

import dataclasses
import re

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import workbench as wb
import workbench.analysis as wba
from studies._toolkit.config import ConfigError
from studies._toolkit.report import have_matplotlib
from studies.numerics import splitting_error
from tests.helpers import small_encoder

S = wb.schemes
RK4 = S.RK4()


def _pre_norm(rng, layers=1):
    _, m = small_encoder(
        rng, d=8, heads=2, layers=layers, dff=16, norm_first=True, activation="gelu"
    )
    return m.equation


def _post_norm(equation, d=8):
    s1 = wb.terms.LayerNormProjection.onto_s1(d, dtype=jnp.float64)
    proj = wb.PiecewiseConstant(wb.stack([s1] * equation.num_pieces))
    return wb.Equation(
        tuple(wb.Operator(op.term, proj) for op in equation.operators), wb.PostNorm()
    )


def _linear(rng, d=5):
    wa, wf = 0.7 * rng.standard_normal((d, d)), 0.7 * rng.standard_normal((d, d))
    ops = tuple(
        wb.Operator(wb.Constant(wb.terms.LinearKernel(jnp.asarray(w), None))) for w in (wa, wf)
    )
    return wb.Equation(ops, wb.PreNorm()), wa, wf


def _norms(e):
    return np.linalg.norm(np.asarray(e).reshape(len(e), -1), axis=1)


# ----------------------------------------------------------------------------------------------
# Closed-form oracle: linear fields A(u) = u W_A, F(u) = u W_F


def test_linear_commutator_and_lie_error_closed_form(rng):
    eq, wa, wf = _linear(rng)
    u = rng.standard_normal((3, 5))
    c = np.asarray(wba.vector_field_commutator(eq, jnp.asarray(u)))
    # [A, F](u) = F'(u)A(u) − A'(u)F(u) = u (W_A W_F − W_F W_A).
    np.testing.assert_allclose(c, u @ (wa @ wf - wf @ wa), rtol=1e-13, atol=1e-13)
    taus = np.array([0.2, 0.1, 0.05])
    e = wba.local_errors(
        eq, jnp.asarray(u), taus, S.LieTrotter(), subflow_solver=RK4, subflow_substeps=32
    )
    for tau, got in zip(taus, e):
        exact = u @ scipy.linalg.expm(tau * wa) @ scipy.linalg.expm(
            tau * wf
        ) - u @ scipy.linalg.expm(tau * (wa + wf))
        np.testing.assert_allclose(got, exact, rtol=1e-7, atol=1e-11)


@pytest.mark.slow
def test_commutator_jvps_match_central_differences(rng):
    eq = _pre_norm(rng).localize(0)
    u = jnp.asarray(rng.standard_normal((4, 8)))
    a_field, f_field = wba.operator_fields(eq)
    a, f = a_field(u), f_field(u)
    h = 1e-5
    fa = (f_field(u + h * a) - f_field(u - h * a)) / (2 * h)
    af = (a_field(u + h * f) - a_field(u - h * f)) / (2 * h)
    c = wba.vector_field_commutator(eq, u)
    np.testing.assert_allclose(c, fa - af, rtol=1e-7, atol=1e-8)
    # Antisymmetry, and the fields sum to the equation's field.
    np.testing.assert_allclose(
        wba.vector_field_commutator(eq, u, first=1, second=0), -c, atol=1e-14
    )
    np.testing.assert_allclose(a + f, eq.vector_field(0.0, u), atol=1e-14)


# ----------------------------------------------------------------------------------------------
# The Lie leading term on the Transformer equation (pre-norm, float64)


def test_lie_local_error_vector_is_half_tau_squared_commutator(rng):
    eq = _pre_norm(rng)
    u = jnp.asarray(rng.standard_normal((4, 8)))
    taus = 2.0 ** -np.arange(4, 11)
    e = wba.local_errors(eq, u, taus, S.LieTrotter(), subflow_solver=RK4, subflow_substeps=8)
    c = np.asarray(wba.vector_field_commutator(eq.localize(0), u))
    pred = taus[:, None, None] ** 2 / 2 * c
    dev = _norms(e - pred) / _norms(pred)
    # The vector (not only the norm) agrees, with an O(τ) remainder: the deviation halves with τ.
    assert dev[-1] < 5e-3, dev
    np.testing.assert_allclose(dev[:-1] / dev[1:], 2.0, rtol=0.05)
    ratio = _norms(e) / _norms(pred)
    assert abs(ratio[-1] - 1) < 0.05, ratio  # acceptance: within 5 % at the smallest τ
    # The opposite sign convention (A'F − F'A) would be off by 2‖pred‖, not by O(τ).
    assert np.all(_norms(e + pred) / _norms(pred) > 1.9)


@pytest.mark.slow
def test_exact_step_matches_dopri8(rng):
    eq = _pre_norm(rng).localize(0)
    u = jnp.asarray(rng.standard_normal((4, 8)))
    got = wba.exact_step(eq, u, 0.5, substeps=64)
    ref = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: eq.vector_field(t, y)),
        diffrax.Dopri8(),
        0.0,
        0.5,
        0.05,
        u,
        stepsize_controller=diffrax.PIDController(rtol=1e-14, atol=1e-14),
        max_steps=10_000,
    ).ys[-1]
    np.testing.assert_allclose(got, ref, atol=1e-10)


@pytest.mark.parametrize("scheme", [S.LieTrotter(), S.Strang(), S.Yoshida4()])
def test_network_steps_match_integrate(rng, scheme):
    eq = _pre_norm(rng, layers=2)
    u = jnp.asarray(rng.standard_normal((4, 8)))
    ours = wba.splitting_flow(eq, u, scheme, 3)
    theirs = wb.integrate(eq, u, scheme, num_steps=6).u1
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_all_methods_share_one_compiled_local_error_map(rng, placement):
    """`local_errors` writes every method as a stage table (`_table_plan`): Lie, Strang,
    Yoshida4, Suzuki4 with RK4 sub-flows and the unsplit RK4 compile `_local` once per equation
    structure, not once per scheme, and each equals the scheme's own step map
    (`splitting_step`, `workbench.step` with the same sub-flows) minus the exact step to 1e-13."""
    from workbench.analysis._splitting_errors import _local

    pre = _pre_norm(rng)
    eq = pre if placement == "pre" else _post_norm(pre)
    u = jnp.asarray(rng.standard_normal((4, 8)))
    if placement == "post":  # the projected ODE starts on S (local_errors projects first)
        u = eq.operators[0].projection.evaluate(0.0)(u)
    taus = (0.5, 0.25, 0.125)
    before = _local._cached._cache_size()
    for method in (S.LieTrotter(), S.Strang(), S.Yoshida4(), S.Suzuki4(), RK4):
        sub = {} if isinstance(method, S.RK4) else dict(subflow_solver=RK4, subflow_substeps=4)
        got = wba.local_errors(eq, u, taus, method, reference_substeps=16, **sub)
        local = eq.localize(0)
        ours = eqx.filter_jit(
            lambda tau, method=method, sub=sub: wba.splitting_step(local, u, tau, method, **sub)
        )
        exact = eqx.filter_jit(lambda tau: wba.exact_step(local, u, tau, substeps=16))
        want = [ours(jnp.asarray(tau)) - exact(jnp.asarray(tau)) for tau in taus]
        np.testing.assert_allclose(got, np.stack(want), rtol=0, atol=1e-13)
    assert _local._cached._cache_size() - before <= 1  # 0 if another test compiled it


# ----------------------------------------------------------------------------------------------
# Observed orders (local slopes and global orders), pre-norm and post-norm


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(7)
    pre = _pre_norm(rng, layers=2)
    u0 = jnp.asarray(rng.standard_normal((4, 8)))
    return {"pre": pre, "post": _post_norm(pre)}, u0


LOCAL_TAUS = 2.0 ** -np.arange(2, 9)
GLOBAL_KS = (2, 4, 8, 16, 32)
CASES = [  # placement, method, expected local slope, expected global order
    ("pre", S.LieTrotter(), 2, 1),
    ("pre", S.Strang(), 3, 2),
    ("pre", S.Yoshida4(), 5, 4),
    ("pre", S.RK4(), 5, 4),
    ("post", S.LieTrotter(), 2, 1),
    ("post", S.Strang(), 2, 1),  # the projection after each sub-flow costs Strang its order
    ("post", S.RK4(), 5, 4),  # the projection method keeps RK4's order
]


@pytest.mark.slow
@pytest.mark.parametrize("placement, method, local_order, global_order", CASES)
def test_observed_orders(problem, placement, method, local_order, global_order):
    eqs, u0 = problem
    eq = eqs[placement]
    e = _norms(
        wba.local_errors(
            eq,
            u0,
            LOCAL_TAUS,
            method,
            subflow_solver=RK4,
            subflow_substeps=8,
            reference_substeps=64,
        )
    )
    fit = wba.fit_order(LOCAL_TAUS, e)
    assert abs(fit.order - local_order) <= 0.3, (fit.order, fit.local_orders)
    g = wba.global_errors(
        eq,
        u0,
        GLOBAL_KS,
        method,
        subflow_solver=RK4,
        subflow_substeps=8,
        reference_steps_per_layer=512,
    )
    gfit = wba.fit_order(1.0 / np.asarray(GLOBAL_KS), g)
    assert abs(gfit.order - global_order) <= 0.3, (gfit.order, gfit.local_orders, g)
    assert g.min() > 1e-12, "round-off floor: the fit would be meaningless"


def test_post_norm_flow_stays_on_s1(problem):
    eqs, u0 = problem
    s1 = wb.terms.LayerNormProjection.onto_s1(8, dtype=jnp.float64)
    for method in (S.Strang(), None):
        u = np.asarray(wba.splitting_flow(eqs["post"], u0, method, 4))
        np.testing.assert_allclose(u, np.asarray(s1(jnp.asarray(u))), atol=1e-12)


# ----------------------------------------------------------------------------------------------
# Method names: the unsplit tableaux are not the diffrax solvers of wb.registry.METHODS


def test_unsplit_methods_are_the_workbench_tableaux():
    rk4 = wb.registry.lookup("unsplit_method", "unsplit-rk4")
    assert isinstance(rk4, S.RK4) and rk4.order() == 4
    # The diffrax "rk4" of METHODS has the same Butcher data but is another object (no `step`
    # the splitting analysis can run).
    diffrax_rk4 = wb.registry.lookup("method", "rk4")
    assert not isinstance(diffrax_rk4, S.RK4)
    np.testing.assert_allclose(
        wba.stability_function(rk4).coefficients,
        wba.stability_function(diffrax_rk4).coefficients,
        rtol=1e-15,
    )
    unknown = "method='rk4' is not a known unsplit method; valid choices: unsplit-euler"
    with pytest.raises(ValueError, match=unknown + ".* Did you mean 'unsplit-rk4'"):
        wb.registry.lookup("unsplit_method", "rk4", field="method")


# ----------------------------------------------------------------------------------------------
# The study, at its smoke size


@pytest.fixture(scope="module")
def results():
    return splitting_error.compute(splitting_error.smoke_config())


def _rows(results):
    return {(r.placement, r.scheme, r.subflows): r for r in results.rows}


def test_study_numbers(results):
    com = results.commutator
    assert abs(com.smallest_tau_ratio - 1) < 0.01
    assert com.vector_relative_deviation[-1] < 0.01
    assert abs(com.vector_deviation_fit.order - 1) <= 0.1  # the O(τ³) remainder
    rows = _rows(results)
    assert abs(rows["pre", "strang", "exact"].local_fit.order - 3) <= 0.3
    for scheme, order in (("lie", 1), ("strang", 2), ("yoshida4", 4), ("unsplit-rk4", 4)):
        sub = "-" if scheme == "unsplit-rk4" else "exact"
        fit = rows["pre", scheme, sub].global_fit
        assert abs(fit.order - order) <= 0.3 and not fit.order_reduction, (scheme, fit)
    # Post-norm: the splittings fall to order 1 (local slope 2), the projection method keeps 4.
    for scheme in ("lie", "strang", "yoshida4"):
        row = rows["post", scheme, "exact"]
        assert abs(row.global_fit.order - 1) <= 0.3 and abs(row.local_fit.order - 2) <= 0.3
    assert rows["post", "strang", "exact"].global_fit.order_reduction
    assert abs(rows["post", "unsplit-rk4", "-"].global_fit.order - 4) <= 0.3


def test_verdict_yes_on_smoke(results):
    text = splitting_error.verdict(results)
    assert text.startswith("Yes. "), text
    assert "size and sign confirmed" in text and "all kept" in text
    assert "Strang, Yoshida 4 lose their classical order" in text
    assert "Post-norm unsplit RK4 (the projection method): order 4.01, keeps order 4" in text


def _with_fit(results, key, **change):
    rows = [
        dataclasses.replace(r, global_fit=dataclasses.replace(r.global_fit, **change))
        if (r.placement, r.scheme, r.subflows) == key
        else r
        for r in results.rows
    ]
    return dataclasses.replace(results, rows=rows)


def test_verdict_flips(results):
    low = _with_fit(results, ("pre", "yoshida4", "exact"), order=1.0)
    assert splitting_error.verdict(low).startswith("Partly. "), splitting_error.verdict(low)
    assert "not at their classical order: Yoshida 4" in splitting_error.verdict(low)
    # In tolerance, but fit_order flags order reduction: not kept either.
    flagged = _with_fit(results, ("pre", "strang", "exact"), order_reduction=True)
    assert "not at their classical order: Strang" in splitting_error.verdict(flagged)
    bad = dataclasses.replace(
        results.commutator, smallest_tau_ratio=1.2, ratio=np.r_[results.commutator.ratio[:-1], 1.2]
    )
    wrong = dataclasses.replace(results, commutator=bad)
    assert splitting_error.verdict(wrong).startswith("Partly. ")
    assert "NOT confirmed" in splitting_error.verdict(wrong)
    # The opposite sign: the norms agree, the vectors do not.
    flipped = dataclasses.replace(
        results.commutator,
        vector_relative_deviation=np.full_like(results.commutator.vector_relative_deviation, 2.0),
    )
    both = dataclasses.replace(low, commutator=flipped)
    assert splitting_error.verdict(both).startswith("No. ")
    post = _with_fit(results, ("post", "strang", "exact"), order=2.0)
    assert "not all at order 1 ± 0.3" in splitting_error.verdict(post)


def test_report_and_figures(results):
    text = splitting_error.report(results)
    assert "| post-norm | Strang      | exact     |" in text
    assert f"**{results.commutator.smallest_tau_ratio:.5f}**" in text
    if have_matplotlib():
        figs = splitting_error.figures(results)
        assert set(figs) == {
            "splitting_local_error",
            "splitting_global_error",
            "splitting_placement",
        }
        labels = [
            t.get_text() for ax in figs["splitting_placement"].axes for t in ax.get_legend().texts
        ]
        strang = _rows(results)["post", "strang", "exact"].global_fit.order
        assert f"post: Strang (order {strang:.2f}, order reduction)" in labels


@pytest.mark.parametrize(
    "change, match",
    [
        (
            {"schemes": ("lie", "trotter")},
            "schemes=('lie', 'trotter') is not allowed; valid choices",
        ),
        ({"schemes": ("strang",)}, "schemes=('strang',) is not allowed; include 'lie'"),
        ({"schemes": ()}, "schemes=() is not allowed; give at least one"),
        ({"placements": ("middle",)}, "placements=('middle',) is not allowed; valid choices"),
        (
            {"num_heads": 3},
            "num_heads=3 is not allowed; it must divide d=8; valid: [1, 2, 4, 8]",
        ),
        ({"local_taus": (0.1, 0.05)}, "local_taus=(0.1, 0.05) is not allowed; give at least 3"),
        (
            {"local_taus": (0.1, -0.05, 0.01)},
            "local_taus=(0.1, -0.05, 0.01) is not allowed; every value must be finite and > 0",
        ),
        (
            {"steps_per_layer": (2, 4, 4)},
            "steps_per_layer=(2, 4, 4) is not allowed; the values must be distinct",
        ),
        ({"subflow_substeps": 0}, "subflow_substeps=0 is not allowed"),
        (
            {"reference_steps_per_layer": 64},
            "reference_steps_per_layer=64 is not allowed; it must be at least 4 × max(steps_per_layer) = 128",
        ),
        (
            {"commutator_tolerance": 1.5},
            "commutator_tolerance=1.5 is not allowed; allowed range (0, 1)",
        ),
        ({"order_tolerance": -0.3}, "order_tolerance=-0.3 is not allowed"),
    ],
)
def test_bad_config(change, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        dataclasses.replace(splitting_error.smoke_config(), **change)


def test_cli_rejects_bad_config_before_any_folder(tmp_path):
    from studies._run.cli import main

    out = tmp_path / "x"
    assert (
        main(["run", splitting_error.NAME, "--smoke", "--out", str(out), "--num_heads", "3"]) == 2
    )
    assert not out.exists()


# ----------------------------------------------------------------------------------------------
# Bad input


def test_bad_library_input(rng):
    eq = _pre_norm(rng)
    u = jnp.asarray(rng.standard_normal((4, 8)))
    with pytest.raises(ValueError, match="neither a splitting scheme nor"):
        wba.local_errors(eq, u, [0.1, 0.05], "strang")
    with pytest.raises(ValueError, match="subflow_substeps=0 must be a positive integer"):
        wba.local_errors(eq, u, [0.1], S.Strang(), subflow_substeps=0)
    with pytest.raises(ValueError, match=r"layer=3 must be an integer in \[0, 1\)"):
        wba.local_errors(eq, u, [0.1], S.Strang(), layer=3)
    with pytest.raises(ValueError, match="must be a non-empty list of steps > 0"):
        wba.local_errors(eq, u, [0.1, -0.1], S.Strang())
    with pytest.raises(ValueError, match="subflow_solver="):
        wba.splitting_flow(eq, u, S.Strang(), 2, subflow_solver=S.Strang())
    with pytest.raises(ValueError, match="steps_per_layer=0 must be a positive integer"):
        wba.global_errors(eq, u, [2, 0], S.Strang())
    with pytest.raises(ValueError, match="first=1 and second=1 must differ"):
        wba.vector_field_commutator(eq, u, first=1, second=1)
    with pytest.raises(ValueError, match=r"second=2 must be an operator index in \[0, 2\)"):
        wba.vector_field_commutator(eq, u, second=2)
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        wba.local_errors(eq, u[None], [0.1], S.Strang())
    interp = wb.Equation(
        tuple(
            wb.Operator(wb.Interpolated(op.term.values), wb.Interpolated(op.projection.values))
            for op in eq.operators
        ),
        eq.placement,
    )
    with pytest.raises(ValueError, match="piecewise-constant controls"):
        wba.local_errors(interp, u, [0.1], S.Strang())
    post = _post_norm(eq)
    other = wb.PiecewiseConstant(
        wb.stack([wb.terms.LayerNormProjection.onto_s1(8, sigma2=2.0, dtype=jnp.float64)])
    )
    mixed = wb.Equation(
        (post.operators[0], wb.Operator(post.operators[1].term, other)), wb.PostNorm()
    )
    with pytest.raises(ValueError, match="project onto different sets"):
        wba.local_errors(mixed, u, [0.1], S.Strang())
