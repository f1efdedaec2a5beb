"""A trained run back into the analyses: `--weights DIR` of convergence-order, stability,
splitting-error and plan solves the trained equation of a train-digits run folder (`wbc.load_run`), and the run's
folder is recorded in `config.json`."""

import json

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.control as wbc
from workbench.control._saved_models import run_inputs

from helpers import study_cli


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("weights") / "train"
    # One epoch of a small network (d = 16) at its own discretization: the analyses below
    # solve its trained equation, whatever the recipe that trained it.
    done = study_cli(
        "train-digits",
        out,
        "--epochs",
        "1",
        "--certificate-examples",
        "0",
        "--warmup",
        "5",
        "--d",
        "16",
        "--hidden",
        "32",
        "--depth",
        "fixed",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.mark.slow
def test_convergence_order_takes_a_trained_run(digits_run, tmp_path):
    out = tmp_path / "order"
    done = study_cli(
        "convergence-order",
        out,
        "--weights",
        str(digits_run),
        "--methods",
        "strang,rk4",
        "--activation-methods",
        "",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["config"]["weights"] == [str(digits_run)]
    results = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in results["rows"]}
    assert {r["weights"] for r in rows.values()} == {"trained-train"}
    # The trained equation's errors, recomputed here from the loaded model: Strang's ladder.
    with jax.enable_x64(True):
        model = jax.tree.map(
            lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x,
            wbc.load_run(digits_run),
        )
        u0 = model.embedding(jnp.asarray(run_inputs(digits_run)[0], jnp.float64))
        ref = wb.analysis.reference_solution(model.transformer.equation, u0, steps_per_layer=64)
        lad = rows["strang"]["ladder"]
        k = lad["steps_per_layer"][0]
        mine = wb.integrate(
            model.transformer.equation,
            u0,
            wb.schemes.Strang(),
            num_steps=k * model.transformer.num_layers,
        ).u1
        assert float(jnp.max(jnp.abs(mine - ref.u1))) == pytest.approx(lad["errors"][0], rel=1e-6)
    assert abs(rows["strang"]["order"] - 2) <= 0.3 and abs(rows["rk4"]["order"] - 4) <= 0.3
    assert any("post-norm (the trained equation is pre-norm)" in s for s in results["skipped"])


@pytest.mark.slow
def test_stability_takes_a_trained_run(digits_run, tmp_path):
    out = tmp_path / "stability"
    done = study_cli("stability", out, "--weights", str(digits_run))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["config"]["weights"] == str(digits_run)
    results = json.loads((out / "results.json").read_text())
    trained = wbc.load_run(digits_run).transformer
    # One row per trained layer; the Lyapunov exponents of the trained layer map, n·d of them.
    assert len(results["model"]) == trained.num_layers
    assert len(results["lyapunov_exponents"]) == 4 * trained.d  # smoke n = 4 tokens
    # The trained layers' non-normal linearizations: the observed τ* of every method on every
    # layer within the study's model tolerance (5 %) of the predicted one.
    for layer in results["model"]:
        for row in layer["steps"].values():
            assert abs(row["rel_diff"]) <= 0.05, (layer["layer"], row)
    # Layer 0's spectral radius: NumPy's eigenvalues of the trained field's dense Jacobian at
    # the first 4 tokens of the embedded saved input (1e-8 relative).
    with jax.enable_x64(True):
        model = jax.tree.map(
            lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x,
            wbc.load_run(digits_run),
        )
        u0 = model.embedding(jnp.asarray(run_inputs(digits_run)[0], jnp.float64))[:4]
        field = wb.analysis.term_fields(model.transformer.equation, 0.5)["full"]
        jac = jax.jacfwd(lambda v: field(v.reshape(u0.shape)).reshape(-1))(u0.reshape(-1))
        radius = float(np.abs(np.linalg.eigvals(np.asarray(jac))).max())
    assert results["model"][0]["spectral_radius"]["full"] == pytest.approx(radius, rel=1e-8)


@pytest.mark.slow
def test_splitting_error_takes_a_trained_run(digits_run, tmp_path):
    """The trained equation's splitting error: the folder in config.json; Strang's network
    error at one step per layer recomputed from the loaded model (`wb.integrate` against an
    RK4 solve (diffrax, `ClassicalRK4`) of the whole field with 64 steps per layer, Frobenius norm, 1e-3
    relative); the Lie local error is (τ²/2)[A, F] of the trained field (ratio within 5 %)."""
    out = tmp_path / "splitting"
    done = study_cli(
        "splitting-error",
        out,
        "--weights",
        str(digits_run),
        "--schemes",
        "lie,strang",
        "--placements",
        "pre",
        "--steps-per-layer",
        "1,2,4",
        "--reference-steps-per-layer",
        "64",
        "--local-taus",
        "0.25,0.125,0.0625,0.03125,0.015625",
        "--reference-substeps",
        "16",
        "--network-subflows",
        "true",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["config"]["weights"] == str(digits_run)
    results = json.loads((out / "results.json").read_text())
    row = next(r for r in results["rows"] if (r["scheme"], r["subflows"]) == ("strang", "network"))
    with jax.enable_x64(True):
        model = jax.tree.map(
            lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x,
            wbc.load_run(digits_run),
        )
        u0 = model.embedding(jnp.asarray(run_inputs(digits_run)[0], jnp.float64))
        eq, layers = model.transformer.equation, model.transformer.num_layers
        ref = wb.integrate(eq, u0, wb.solvers.ClassicalRK4(), num_steps=64 * layers).u1
        mine = wb.integrate(eq, u0, wb.schemes.Strang(), num_steps=layers).u1
        error = float(jnp.linalg.norm(mine - ref))
    assert row["global_errors"][0] == pytest.approx(error, rel=1e-3)
    assert abs(results["commutator"]["smallest_tau_ratio"] - 1) < 0.05
    assert "Trained pre-norm equation of the run folder" in (out / "report.md").read_text()


@pytest.mark.slow
def test_plan_takes_a_trained_run(digits_run, tmp_path):
    """The plan of the trained equation: the folder in config.json and in plan.json's model;
    the chosen method's measured error recomputed from the loaded model (`wb.integrate` with
    the plan's steps against a Dopri8 solve at 64 steps per layer, max-abs, 1e-6 relative) and
    within the tolerance."""
    out = tmp_path / "plan"
    done = study_cli(
        "plan", out, "--weights", str(digits_run), "--methods", "rk4,strang", "--tolerance", "1e-4"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["config"]["weights"] == str(digits_run)
    plan = wb.analysis.DiscretizationPlan.load(out / "plan.json")
    assert plan.model["weights"] == str(digits_run) and plan.model["n"] == 65
    with jax.enable_x64(True):
        model = jax.tree.map(
            lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x,
            wbc.load_run(digits_run),
        )
        u0 = model.embedding(jnp.asarray(run_inputs(digits_run)[0], jnp.float64))
        eq, layers = model.transformer.equation, model.transformer.num_layers
        ref = wb.integrate(eq, u0, diffrax.Dopri8(), num_steps=64 * layers).u1
        method = wb.registry.METHODS[plan.method]
        mine = wb.integrate(eq, u0, method, num_steps=plan.steps_per_layer * layers).u1
        error = float(jnp.max(jnp.abs(mine - ref)))
    assert plan.measured_error == pytest.approx(error, rel=1e-6)
    assert error <= 1e-4


def test_weights_that_are_no_run_are_refused(tmp_path):
    from studies import ConfigError
    from studies.numerics.convergence_order import Config as Order
    from studies.numerics.plan import Config as Plan
    from studies.numerics.splitting_error import Config as Splitting
    from studies.numerics.stability import Config as Stability

    with pytest.raises(ConfigError, match="'random', 'recovered', or a training run folder"):
        Order(weights=("nonsense",))
    with pytest.raises(ConfigError, match="holds no model.json"):
        Stability(weights=str(tmp_path))
    with pytest.raises(ConfigError, match="'random', or a training run folder"):
        Splitting(weights="recovered")
    with pytest.raises(ConfigError, match="'random', or a training run folder"):
        Plan(weights="recovered")


@pytest.mark.slow
def test_a_network_trained_at_one_lie_step_per_layer_is_not_consistent(tmp_path):
    """Training with `--depth fixed --kinetic 0 --smoothness 0` (every batch at one
    Lie–Trotter step per layer) leans on its grid: the certificate measures the accuracy moving under refinement,
    says `consistent: false` with that spread, and the verdict is "No"."""
    out = tmp_path / "lie1"
    # A small network (d = 16, 5 epochs: 25 s, where the smoke size's d = 32 and 10 epochs took
    # 45 s) that meets its accuracy target, so the verdict's "No" is the refinement's alone.
    done = study_cli(
        "train-digits",
        out,
        "--depth",
        "fixed",
        "--kinetic",
        "0",
        "--smoothness",
        "0",
        "--epochs",
        "5",
        "--d",
        "16",
        "--hidden",
        "32",
        "--target-accuracy",
        "0.6",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cert = json.loads((out / "certificate.json").read_text())
    acc = cert["accuracy"]
    spread = max(
        abs(a - acc["accuracy"]) for a in [*acc["refined_accuracies"], acc["second_accuracy"]]
    )
    assert acc["spread"] == pytest.approx(spread, abs=1e-12)
    assert spread > cert["max_accuracy_spread"] and cert["consistent"] is False
    # The accuracies are those of the loaded model solved at each refinement.
    model, task = wbc.load_run(out), wbc.digits(0)
    fine = model.rediscretize(wb.schemes.LieTrotter(), acc["refined_steps_per_layer"][-1])
    assert wbc.evaluate(fine, task.test) == pytest.approx(acc["refined_accuracies"][-1], abs=1e-6)
    # Each refinement is also compared with the own discretization on the same test images,
    # and the report prints those intervals.
    others = [*acc["refined_accuracies"], acc["second_accuracy"]]
    steps = [*acc["refined_steps_per_layer"], acc["second_steps_per_layer"]]
    assert [p["steps_per_layer"] for p in acc["paired"]] == steps
    for p, a in zip(acc["paired"], others):
        assert p["num_examples"] == len(task.test) and p["confidence"] == 0.95
        assert p["accuracy_b"] == pytest.approx(a, abs=1e-6)
        assert p["difference"] == pytest.approx(100 * (a - acc["accuracy"]), abs=1e-4)
        assert p["low"] <= p["difference"] <= p["high"] and 0 <= p["p_value"] <= 1
    assert "paired change vs own" in (out / "report.md").read_text()
    verdict = (out / "report.md").read_text().splitlines()[0]
    assert verdict.startswith("**Verdict.** No.")
    assert json.loads((out / "results.json").read_text())["test_accuracy"] >= 0.6  # target met
    assert f"moves by {100 * spread:.2f} points under refinement" in verdict
