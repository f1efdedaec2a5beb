"""The convergence-order and plan studies at smoke size, and the ladder / plan API: observed
orders within ±0.3 with one compilation per method, iterates on the constraint set, a plan that
reads back and whose method meets its tolerance when re-run independently, and the errors."""

import dataclasses
import json

import diffrax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.analysis as wba
from studies import convergence_order, plan

from helpers import small_encoder


@pytest.fixture(scope="module")
def orders(tmp_path_factory):
    out = tmp_path_factory.mktemp("convergence-order")
    return convergence_order.main(convergence_order.smoke_config(), out), out


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    config = plan.smoke_config()
    return config, plan.main(config, out), out


def test_convergence_order_smoke_orders_and_compilations(orders):
    results, out = orders
    rows = results["rows"]
    assert rows
    for r in rows:
        assert r["order"] is not None and abs(r["order"] - r["declared"]) <= 0.3, r["method"]
        assert r["points_in_fit"] >= 5, (r["method"], r["points_in_fit"])
        # One compilation for the whole ladder (the step count is a run-time value).
        assert r["ladder"]["compilations"] == 1, r["method"]
        # Richardson's estimate agrees with the measured error in the asymptotic range.
        assert abs(r["ladder"]["richardson"] - 1.0) < 0.15, r["method"]
    post = [r for r in rows if r["equation"] == "post-norm"]
    assert post and max(r["constraint_violation"] for r in post) < 1e-12
    for t in results["timing"].values():
        assert t["reference_error_estimate"] < 1e-13
    assert (out / "convergence_random_pre-norm.png").exists()


def test_penalty_distance_is_order_epsilon_and_implicit_solvers_take_far_fewer_steps(orders):
    results, out = orders
    p = results["penalty"]
    assert abs(p["slope"] - 1.0) <= 0.2, p["distance"]
    for name, c in p["counts"].items():
        assert c["result"] == 0, name
    assert p["tsit5_over_best_implicit"] >= 20, p["counts"]
    assert (out / "penalty.png").exists()


def test_plan_reads_back_and_meets_its_tolerance(planned):
    config, results, out = planned
    p = wba.DiscretizationPlan.load(out / "plan.json")
    assert p.method == results["plan"]["method"] and p.tolerance == config.tolerance
    assert p.measured_error <= config.tolerance
    best = min(
        (c for c in p.candidates if c["meets_tolerance"]),
        key=lambda c: (c["evaluations"], c["seconds"]),
    )
    assert best["method"] == p.method
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


def test_plan_errors(tmp_path):
    with pytest.raises(ValueError, match="plan.method='nope' is not known; valid: euler"):
        wba.DiscretizationPlan("nope", 4, 1e-6, 1e-7, 10, 1.0, 0.25, True)
    with pytest.raises(ValueError, match="plan.tolerance=0.0 must be > 0"):
        wba.DiscretizationPlan("rk4", 4, 0.0, 1e-7, 10, 1.0, 0.25, True)
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"schema": "something-else"}))
    with pytest.raises(ValueError, match="is not 'workbench.discretization-plan/1'"):
        wba.DiscretizationPlan.load(path)
    with pytest.raises(ValueError, match="tolerance=0.0 must be > 0"):
        plan.main(dataclasses.replace(plan.smoke_config(), tolerance=0.0), tmp_path)
    with pytest.raises(ValueError, match="methods: 'lie' is a splitting scheme"):
        plan.main(
            dataclasses.replace(plan.smoke_config(), equation="post-norm", methods=("lie",)),
            tmp_path,
        )
    with pytest.raises(ValueError, match="methods: 'rk5' is not known; valid: euler"):
        convergence_order.main(
            dataclasses.replace(convergence_order.smoke_config(), methods=("rk5",)), tmp_path
        )


def test_plan_roundtrip(tmp_path):
    p = wba.DiscretizationPlan("strang", 8, 1e-6, 5e-7, 96, float("inf"), 0.125, True)
    p.save(tmp_path / "p.json")
    q = wba.DiscretizationPlan.load(tmp_path / "p.json")
    assert q == p and isinstance(q.method_object(), wb.schemes.Strang)
    assert q.num_steps(6) == 48


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
