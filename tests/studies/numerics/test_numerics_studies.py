"""The convergence-order and plan studies at smoke size, and the ladder / plan API: observed
orders within ±0.3 with one compilation per method, the ReLU order reduction (and none for GELU),
iterates on the constraint set, a plan that reads back from its `plan.json` artifact and whose
method meets its tolerance when re-run independently, verdicts that flip on failing numbers, and
the config errors."""

import dataclasses
import json
import re

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.analysis as wba
from studies._run.cli import main as cli
from studies._toolkit.config import ConfigError
from studies.numerics import convergence_order, plan
from workbench.io import atomic_write_json

from helpers import small_encoder


@pytest.fixture(scope="module")
def orders():
    return convergence_order.compute(convergence_order.smoke_config())


@pytest.fixture(scope="module")
def planned():
    return plan.compute(plan.smoke_config())


# --------------------------------------------------------------------------------------------
# convergence-order
# --------------------------------------------------------------------------------------------


def test_convergence_order_smoke_orders_and_compilations(orders):
    assert orders.rows
    for r in orders.rows:
        assert r.order is not None and abs(r.order - r.declared) <= 0.3, r.method
        assert r.within_tolerance and r.order_reduction is False, r.method
        assert r.points_in_fit >= 5, (r.method, r.points_in_fit)
        # One compilation for the whole ladder (the step count is a run-time value).
        assert r.ladder["compilations"] == 1, r.method
        # Richardson's estimate agrees with the measured error in the asymptotic range.
        assert abs(r.ladder["richardson"] - 1.0) < 0.15, r.method
        # The predicted cost at the target error lies between the ladder's cheapest and dearest
        # solve when the target lies inside the ladder's error range.
        errors, evals = r.ladder["errors"], r.ladder["evaluations"]
        if min(errors) <= orders.config.target_error <= max(errors):
            assert min(evals) <= r.evaluations_at_target <= max(evals), r.method
    post = [r for r in orders.rows if r.equation == "post-norm"]
    assert post and max(r.constraint_violation for r in post) < 1e-12
    for t in orders.timing.values():
        assert t.reference_error_estimate < 1e-13


def test_relu_reduces_the_order_and_gelu_does_not(orders):
    by = {(a.activation, a.method): a for a in orders.activation}
    methods = orders.config.activation_methods
    assert set(by) == {(act, m) for act in ("gelu", "relu") for m in methods}
    for m in methods:
        gelu, relu = by[("gelu", m)], by[("relu", m)]
        assert not gelu.reduced and gelu.order >= gelu.declared - 0.3, m
        # A Lipschitz (ReLU) field: a kink crossing costs O(τ²) per step, so order ≤ ~2.
        assert relu.reduced and relu.slope_all <= 2.5, (m, relu.slope_all)
        assert relu.order is None or relu.order <= 2.5, (m, relu.order)
        # The adaptive reference is far below the errors it measures.
        assert orders.activation_reference_error["relu"] < 1e-3 * relu.errors.min(), m
    fig = convergence_order.figures(orders)["activation"]
    relu_labels = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert all("order reduction" in t for t in relu_labels if not t.startswith("slope"))


def test_convergence_order_report_and_verdict(orders):
    text = convergence_order.verdict(orders)
    assert text.startswith("Yes."), text
    assert "ReLU: 2 of 2 methods of declared order > 2 show order reduction" in text, text
    report = convergence_order.report(orders)
    assert "first order" in report and "wb.Projected()" in report
    assert "`penalty-form` study" in report and not hasattr(orders, "penalty")
    assert "(order reduction)" in report  # the ReLU column


def test_convergence_order_verdict_flips(orders):
    def replace_rows(**changes):
        rows = [dataclasses.replace(r, **changes) for r in orders.rows]
        return dataclasses.replace(orders, rows=rows)

    # Every ladder at order 1: most miss their declared order.
    failed = replace_rows(order=1.0, within_tolerance=False, order_reduction=True)
    text = convergence_order.verdict(failed)
    assert text.startswith("No.") and "0 of 4" in text and "(1.00 vs 4)" in text, text
    # One miss out of four: partly.
    rows = list(orders.rows)
    rows[0] = dataclasses.replace(rows[0], order=2.9, within_tolerance=False)
    text = convergence_order.verdict(dataclasses.replace(orders, rows=rows))
    assert text.startswith("Partly.") and "(2.90 vs 4)" in text, text
    # The smooth model showing reduction in the comparison: not the activation's alone.
    act = [
        dataclasses.replace(a, reduced=True) if a.activation == "gelu" else a
        for a in orders.activation
    ]
    text = convergence_order.verdict(dataclasses.replace(orders, activation=act))
    assert text.startswith("Partly.") and "GELU model also shows order reduction" in text, text
    # A fourth-order scheme keeping its order on the ReLU model is flagged as unexpected.
    act = [
        dataclasses.replace(a, reduced=False, order=4.0) if a.method == "rk4" else a
        for a in orders.activation
    ]
    text = convergence_order.verdict(dataclasses.replace(orders, activation=act))
    assert "rk4 is not reduced (4.00), unexpected for a Lipschitz field" in text, text


@pytest.mark.parametrize(
    "changes, allowed",
    [
        ({"d": 0}, "every value must be finite and > 0"),
        ({"num_heads": 3}, "it must divide d=16; valid: [1, 2, 4, 8, 16]"),
        ({"methods": ("rk5",)}, "valid choices: 'euler', 'heun'"),
        ({"post_norm_methods": ("strang",)}, "post-norm splittings are first order"),
        ({"weights": ()}, "give at least one value"),
        ({"methods": ("rk4", "rk4")}, "the values must be distinct"),
        ({"activation_steps_per_layer": (4, 2, 8)}, "give at least 3 increasing step counts"),
        ({"order_tolerance": 0.0}, "allowed range (0, 1]"),
        ({"relu_reference_tolerance": 1e-3}, "allowed range (0, 1e-06]"),
        ({"reference_steps_per_layer": 1}, "it must be >= 2"),
        ({"seed": -1}, "allowed range [0, inf)"),
    ],
)
def test_convergence_order_config_errors(changes, allowed):
    (field, value), *_ = changes.items()
    match = f"convergence-order: {field}={value!r} is not allowed; {allowed}"
    with pytest.raises(ConfigError, match=re.escape(match)):
        dataclasses.replace(convergence_order.smoke_config(), **changes)


def test_convergence_order_cli_rejects_a_bad_config(tmp_path):
    out = tmp_path / "x"
    assert cli(["run", "convergence-order", "--smoke", "--out", str(out), "--num_heads", "3"]) == 2
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------


def test_plan_reads_back_and_meets_its_tolerance(planned, tmp_path):
    config = planned.config
    files = plan.artifacts(planned)
    assert list(files) == ["plan.json"]
    atomic_write_json(tmp_path / "plan.json", files["plan.json"])
    p = wba.DiscretizationPlan.load(tmp_path / "plan.json")
    assert p.tolerance == config.tolerance and p.measured_error <= config.tolerance
    best = min(
        (c for c in p.candidates if c["meets_tolerance"]),
        key=lambda c: (c["evaluations"], c["seconds"]),
    )
    assert best["method"] == p.method and p.stable and p.step <= p.largest_stable_step
    assert [c["method"] for c in p.candidates] == list(config.methods)
    # Independent check: rebuild the model, solve with the plan, compare with a fine RK4 solve.
    rng = np.random.default_rng(config.seed)
    u0 = jnp.asarray(rng.standard_normal((config.n, config.d)))
    sd = wb.architectures.random_encoder_state_dict(
        np.random.default_rng(config.seed + 1),
        d=config.d,
        num_layers=config.num_layers,
        dim_feedforward=config.dim_feedforward,
    )
    m = wb.architectures.encoder_from_torch(
        sd, num_heads=config.num_heads, norm_first=True, activation="gelu"
    )
    u = wb.integrate(m.equation, u0, p.method_object(), num_steps=p.num_steps(config.num_layers)).u1
    ref = wb.integrate(
        m.equation, u0, wb.solvers.ClassicalRK4(), num_steps=400 * config.num_layers
    ).u1
    assert float(jnp.max(jnp.abs(u - ref))) <= config.tolerance
    # Evaluations are exact counts: stages × steps for the chosen method.
    assert p.evaluations == best["evaluations"] > 0
    assert planned.spectrum.num_decaying > 0 and planned.reference_error_estimate < 1e-13


def test_plan_verdict_and_its_flips(planned):
    text = plan.verdict(planned)
    assert text.startswith("Yes.") and f"meets tolerance {planned.config.tolerance:g}" in text
    # The cheapest candidate beyond its stability limit: partly.
    best = plan._best(planned.candidates)
    cands = [
        dataclasses.replace(c, stable=False, largest_stable_step=0.5 * c.step) if c is best else c
        for c in planned.candidates
    ]
    text = plan.verdict(dataclasses.replace(planned, candidates=cands))
    assert text.startswith("Partly.") and "exceeds the predicted largest stable step" in text
    # No candidate meets the tolerance: no (and no plan.json).
    cands = [
        dataclasses.replace(c, meets_tolerance=False, measured_error=1e-2)
        for c in planned.candidates
    ]
    failed = dataclasses.replace(planned, candidates=cands, plan=None)
    text = plan.verdict(failed)
    assert text.startswith("No.") and "None of the 3 candidates" in text, text
    assert plan.artifacts(failed) == {}


def test_plan_stability_stand_in_is_explicit():
    # diffrax's Euler has no tableau; the named stand-in has the same R(z) = 1 + z.
    assert isinstance(plan.stability_method("euler"), wb.schemes.Euler)
    np.testing.assert_allclose(
        wba.stability_function(plan.stability_method("euler")).coefficients, [1.0, 1.0]
    )
    for name in ("heun", "rk4", "strang"):
        assert plan.stability_method(name) is wb.registry.METHODS[name]


@pytest.mark.parametrize(
    "changes, allowed",
    [
        ({"tolerance": 0.0}, "allowed range (0, 1)"),
        ({"equation": "mid-norm"}, "valid choices: 'pre-norm', 'post-norm'"),
        ({"methods": ("lie",), "equation": "post-norm"}, "post-norm splittings are first order"),
        ({"methods": ("rk5",)}, "valid choices: 'euler', 'heun'"),
        ({"methods": ()}, "give at least one value"),
        ({"num_eigenvalues": 20}, "it must be <= krylov_dim=16"),
        ({"num_heads": 5}, "it must divide d=16; valid: [1, 2, 4, 8, 16]"),
        ({"max_refinements": -1}, "allowed range [0, inf)"),
        ({"max_steps_per_layer": 0}, "every value must be finite and > 0"),
    ],
)
def test_plan_config_errors(changes, allowed):
    (field, value), *_ = changes.items()
    with pytest.raises(
        ConfigError, match=re.escape(f"plan: {field}={value!r} is not allowed; {allowed}")
    ):
        dataclasses.replace(plan.smoke_config(), **changes)


def test_plan_cli_rejects_a_bad_config(tmp_path):
    out = tmp_path / "x"
    assert cli(["run", "plan", "--smoke", "--out", str(out), "--tolerance", "0"]) == 2
    assert not out.exists()


def test_plan_errors(tmp_path):
    with pytest.raises(
        ValueError, match="plan.method='nope' is not a known method .*; valid choices: euler"
    ):
        wba.DiscretizationPlan("nope", 4, 1e-6, 1e-7, 10, 1.0, 0.25, True)
    with pytest.raises(ValueError, match="plan.tolerance=0.0 must be a number > 0"):
        wba.DiscretizationPlan("rk4", 4, 0.0, 1e-7, 10, 1.0, 0.25, True)
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(ValueError, match="is not 'workbench.discretization-plan/1'"):
        wba.DiscretizationPlan.load(path)


def test_plan_roundtrip(tmp_path):
    p = wba.DiscretizationPlan("strang", 8, 1e-6, 5e-7, 96, float("inf"), 0.125, True)
    p.save(tmp_path / "p.json")
    q = wba.DiscretizationPlan.load(tmp_path / "p.json")
    assert q == p and isinstance(q.method_object(), wb.schemes.Strang)
    assert q.num_steps(6) == 48


# --------------------------------------------------------------------------------------------
# The ladder API
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_adaptive_reference_and_predicted_cost():
    rng = np.random.default_rng(0)
    _, m = small_encoder(rng, d=8, heads=2, layers=2, dff=8, norm_first=True, activation="gelu")
    u0 = jnp.asarray(rng.standard_normal((3, 8)))
    fixed = wba.reference_solution(m.equation, u0, steps_per_layer=64)
    adaptive = wba.reference_solution(m.equation, u0, rtol=1e-11)
    assert adaptive.steps_per_layer is None and adaptive.rtol == 1e-11
    # On a smooth field both references agree, and the adaptive one's estimate bounds the gap.
    gap = float(np.max(np.abs(adaptive.u1 - fixed.u1)))
    assert gap < 1e-9 and adaptive.error_estimate < 1e-8
    lad = wba.error_ladder(
        m.equation,
        u0,
        wb.registry.METHODS["rk4"],
        [4, 8, 16, 32],
        fixed,
        declared_order=4,
        repeats=1,
    )
    # The fit judges reduction against the declared order (`expected`).
    assert lad.fit.expected == 4.0 and not lad.fit.order_reduction
    # The cost predicted at the finest error is the finest solve's (evaluations ∝ steps).
    predicted = lad.evaluations_for(float(lad.errors[-1]))
    assert abs(predicted / lad.evaluations[-1] - 1) < 0.1, (predicted, lad.evaluations)
    assert lad.evaluations_for(float(lad.errors[0]) / 16) == pytest.approx(
        lad.evaluations_for(float(lad.errors[0])) * 16 ** (1 / lad.fit.order)
    )


@pytest.mark.parametrize("method", [wb.schemes.Strang(), diffrax.Heun()], ids=["strang", "heun"])
def test_the_ladders_solve_is_integrates_and_its_program_calls_no_python(method):
    """The ladders' solve (`_convergence._solve`) gives `integrate`'s state and evaluation count,
    raises on the host for a state that is not finite (naming the method, the step count and
    the first step or layer), and its compiled program holds no call back to Python, which
    JAX's persistent compilation cache would refuse to keep."""
    from workbench.analysis import _convergence

    rng = np.random.default_rng(0)
    _, m = small_encoder(rng, d=8, heads=2, layers=2, dff=8, norm_first=True, activation="gelu")
    u0 = jnp.asarray(rng.standard_normal((3, 8)))
    k = jnp.asarray(8)
    u1, evaluations = _convergence._solve(m.equation, u0, method, None, k)
    want = wb.integrate(m.equation, u0, method, num_steps=8)
    np.testing.assert_array_equal(np.asarray(u1), np.asarray(want.u1))
    assert int(evaluations) == int(want.stats["num_evaluations"]) > 0
    bad = u0.at[1, 2].set(jnp.nan)
    where = "step" if isinstance(method, wb.schemes.Strang) else "layer"
    message = f"{type(method).__name__} with num_steps=8: {wb.RESULTS[wb.RESULTS.nonfinite_state]}"
    with pytest.raises(
        RuntimeError, match=re.escape(f"{message} First {where} not finite: 0.") + "$"
    ):
        _convergence._solve(m.equation, bad, method, None, k)
    text = _convergence._solve_program.lower(m.equation, u0, method, None, k).as_text()
    checked = eqx.filter_jit(lambda u, n: wb.integrate(m.equation, u, method, num_steps=n).u1)
    assert "callback" not in text and "callback" in checked.lower(u0, k).as_text()


def test_a_run_time_step_count_off_the_layers_raises_or_is_a_result():
    """A traced `num_steps` that is not a multiple of the layer count: `integrate` raises at run
    time, or with `throw=False` returns `RESULTS.invalid_num_steps` (the valid count succeeds)."""
    rng = np.random.default_rng(0)
    _, m = small_encoder(rng, d=8, heads=2, layers=2, dff=8, norm_first=True)
    u0 = jnp.asarray(rng.standard_normal((3, 8)))
    solve = eqx.filter_jit(
        lambda k, throw: (
            wb.integrate(m.equation, u0, wb.schemes.LieTrotter(), num_steps=k, throw=throw).result
        )
    )
    assert solve(jnp.asarray(3), False) == wb.RESULTS.invalid_num_steps
    assert solve(jnp.asarray(4), False) == wb.RESULTS.successful
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"multiple of the number of layers \(2\)"):
        solve(jnp.asarray(3), True)


def test_error_ladder_errors():
    rng = np.random.default_rng(0)
    _, m = small_encoder(rng, d=8, heads=2, layers=1, dff=8, norm_first=True)
    u0 = jnp.asarray(rng.standard_normal((3, 8)))
    ref = np.zeros((3, 8))
    with pytest.raises(ValueError, match="at least 3 integers"):
        wba.error_ladder(m.equation, u0, diffrax.Heun(), [2, 4], ref)
    with pytest.raises(ValueError, match="positive and increasing"):
        wba.error_ladder(m.equation, u0, diffrax.Heun(), [4, 2, 8], ref)
    with pytest.raises(ValueError, match="needs error_range"):
        wba.error_ladder(m.equation, u0, diffrax.Heun(), "auto", ref)
    with pytest.raises(ValueError, match="must be \\(start, end\\) with 0 < end < start"):
        wba.error_ladder(
            m.equation, u0, diffrax.Heun(), "auto", ref, error_range=(1e-6, 1e-3), declared_order=2
        )
    with pytest.raises(ValueError, match="steps_per_layer=1 must be an integer >= 2"):
        wba.reference_solution(m.equation, u0, steps_per_layer=1)
    with pytest.raises(ValueError, match="rtol=0.0 must be a number in \\(0, 1\\)"):
        wba.reference_solution(m.equation, u0, rtol=0.0)
