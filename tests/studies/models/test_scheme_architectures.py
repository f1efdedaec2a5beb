"""The `scheme-architectures` study: its training budgets, its verdict against the numbers, its
config errors, and a tiny run whose numbers are recomputed from the run folders it names."""

import dataclasses

import jax
import numpy as np
import pytest

import workbench as wb
import workbench.control as wbc
from studies import ConfigError
from studies._toolkit.memory import scheme_evaluations
from studies.models import scheme_architectures as SA


def test_equal_cost_steps_spend_the_reference_budget():
    """At equal cost every scheme's steps times its evaluations per step equal the reference's
    budget up to the rounding of one step; each (scheme, seed, steps) trains once."""
    c = SA.Config(schemes=("lie", "strang", "yoshida4", "suzuki4"), steps=1000)
    budget = 1000 * scheme_evaluations("lie")
    for s in c.schemes:
        e = scheme_evaluations(s)
        assert abs(c.equal_cost_steps(s) * e - budget) <= e / 2
    assert [c.equal_cost_steps(s) for s in c.schemes] == [1000, 333, 56, 33]
    assert len(c.trainings()) == len(set(c.trainings())) == 3 * (1 + 2 * 3)
    # a costlier reference gives the cheaper schemes more steps
    assert SA.Config(scheme="strang", steps=100).equal_cost_steps("lie") == 300
    sub = c.sequence_config("yoshida4", 2, 56)
    assert (sub.scheme, sub.seed, sub.steps, sub.depth) == ("yoshida4", 2, 56, "fixed")
    assert sub.warmup == round(c.warmup * 56 / 1000) and sub.d == c.d and sub.kinetic == 0.0


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="schemes"):
        SA.Config(schemes=("lie", "rk4"))
    with pytest.raises(ConfigError, match="schemes"):
        SA.Config(schemes=("lie", "lie"))
    with pytest.raises(ConfigError, match="steps_per_layer"):
        SA.Config(steps_per_layer=2)
    with pytest.raises(ConfigError, match="num_seeds"):
        SA.Config(num_seeds=0)
    with pytest.raises(ConfigError, match="length"):  # the sequence task's own check
        SA.Config(length=1)


def _results(acc, schemes=("lie", "strang", "yoshida4"), steps_acc=None):
    """Results with the given accuracies `(scheme, seed)` in both arms (`steps_acc` for equal
    steps when given)."""
    c = dataclasses.replace(SA.Config(), schemes=schemes, num_seeds=len(acc[0]))
    runs = []
    for arm, table in (("equal-cost", acc), ("equal-steps", steps_acc or acc)):
        for i, s in enumerate(schemes):
            for k, a in enumerate(table[i]):
                runs.append(
                    {
                        "arm": arm,
                        "scheme": s,
                        "seed": k,
                        "steps": c.arm_steps(arm, s),
                        "accuracy": a,
                        "spread": 0.01,
                        "consistent": True,
                        "observed_order": 1.0,
                        "expected_order": 1,
                        "training_time_s": 1.0 + i,
                        "inference_evaluations": 1.0,
                        "inference_s": 1e-3,
                        "folder": s,
                    }
                )
    return SA.Results(config=c, runs=runs, wall_time_s=1.0)


def test_verdict_follows_the_numbers():
    lie_wins = SA.verdict(_results([[0.90, 0.91], [0.85, 0.89], [0.80, 0.82]]))
    assert lie_wins.startswith("No: lie (order 1) wins at equal training cost")
    assert "lie 90.50 % (90.00–91.00)" in lie_wins and "strang 3.00×" not in lie_wins
    assert "strang 2.00×, yoshida4 3.00×" in lie_wins  # measured time ratios against lie
    strang_wins = SA.verdict(_results([[0.85, 0.86], [0.90, 0.91], [0.80, 0.82]]))
    assert strang_wins.startswith("Yes: strang (order 2) wins at equal training cost")
    overlap = SA.verdict(_results([[0.85, 0.90], [0.88, 0.91], [0.80, 0.82]]))
    assert overlap.startswith("No: no scheme wins clearly at equal training cost (strang and lie")
    steps = SA.verdict(
        _results(
            [[0.90, 0.91], [0.85, 0.89], [0.80, 0.82]],
            steps_acc=[[0.90, 0.91], [0.85, 0.89], [0.95, 0.96]],
        )
    )
    assert "At equal steps (1000): yoshida4 wins" in steps
    assert SA.verdict(_results([[0.9, 0.9]], schemes=("lie",))).startswith("No answer")


def test_a_tiny_run_reports_the_models_of_its_folders(tmp_path):
    """Every run's accuracy and refinement are those of the trained model read back from the
    folder it names; Lie's equal-cost run is its equal-steps run; a second call over the
    finished folders trains nothing and gives the same numbers."""
    c = SA.Config(
        steps=8,
        d=8,
        num_heads=2,
        hidden=16,
        length=3,
        vocab=6,
        num_train=64,
        num_test=16,
        batch_size=16,
        warmup=2,
        checkpoint_every=4,
        num_seeds=2,
        schemes=("lie", "strang"),
        certificate_examples=1,
        max_spread=0.5,
        timing_repeats=1,
    )
    r = SA.compute(c, run_dir=tmp_path)
    assert len(r.runs) == 2 * 2 * 2
    with jax.enable_x64(False):
        for run in r.runs:
            model = wbc.load_run(tmp_path / run["folder"])
            task = wbc.sorting(run["seed"], length=3, vocab=6, num_train=64, num_test=16)
            assert model.transformer.scheme == wb.registry.SPLITTING_SCHEMES[run["scheme"]]
            assert run["steps"] == c.arm_steps(run["arm"], run["scheme"])
            assert run["accuracy"] == pytest.approx(wbc.evaluate(model, task.test), abs=1e-7)
            ref = wbc.refinement_accuracy(model, task.test)
            np.testing.assert_allclose(run["refined_accuracies"], ref.refined_accuracies, atol=1e-7)
            assert run["spread"] == pytest.approx(ref.spread, abs=1e-7)
            assert run["training_evaluations"] == run["steps"] * scheme_evaluations(run["scheme"])
    by = {(x["arm"], x["scheme"], x["seed"]): x for x in r.runs}
    assert by[("equal-cost", "lie", 0)] == {**by[("equal-steps", "lie", 0)], "arm": "equal-cost"}
    assert by[("equal-cost", "strang", 1)]["steps"] == 3  # round(8 · 2 / 6)
    again = SA.compute(c, run_dir=tmp_path)
    for a, b in zip(r.runs, again.runs):
        assert (a["accuracy"], a["training_time_s"]) == (b["accuracy"], b["training_time_s"])
