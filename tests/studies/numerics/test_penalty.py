"""The penalty-form study at smoke size: the distance to the projected solution is O(ε) (slope 1),
the implicit/IMEX solvers take far fewer steps than Tsit5 (which is held near its explicit
stability limit, a step of a few ε), the verdict on passing and on failing numbers, and the
config checks."""

import dataclasses
import re

import numpy as np
import pytest

from studies._run.cli import main as cli
from studies._run.harness import check_study
from studies._toolkit.config import ConfigError
from studies.numerics import penalty


@pytest.fixture(scope="module")
def results():
    return penalty.compute(penalty.smoke_config())


def test_distance_to_the_projected_solution_is_order_epsilon(results):
    c = results.config
    np.testing.assert_array_equal(results.epsilons, c.epsilons)
    assert results.ladder_ok == [True] * len(c.epsilons)
    assert abs(results.slope - 1.0) <= 0.1, results.distances
    assert results.slope_ci[0] <= results.slope <= results.slope_ci[1]
    # distance ≈ C ε: the constant is the same on every rung to 10 %.
    constants = results.distances / results.epsilons
    assert constants.max() / constants.min() < 1.1, constants
    # The reference and the ladder's tolerance are far below the smallest distance.
    assert results.reference_error_estimate < 1e-13
    assert results.distances.min() > 100 * c.ladder_accuracy


def test_implicit_and_imex_solvers_take_far_fewer_steps_than_tsit5(results):
    c = results.config
    assert list(results.counts) == [*c.solvers, "tsit5"]
    for name, count in results.counts.items():
        assert count.ok and count.failure == "", name
        assert 0 <= count.num_rejected_steps < count.num_steps, name
        # At ε* every solver is within O(ε*) of the projected solution (the ladder's constant).
        assert count.distance < 10 * c.stiff_epsilon * results.distances[0] / c.epsilons[0], name
    tsit5 = results.counts["tsit5"].num_steps
    # Explicit stability: the penalty's eigenvalues are ≈ −1/ε and Tsit5's real stability
    # interval is shorter than 4, so it needs at least T / (4 ε) steps (T = the layer count).
    assert tsit5 >= c.num_layers / (4 * c.stiff_epsilon), tsit5
    assert set(results.step_ratios) == set(c.solvers)
    for name, ratio in results.step_ratios.items():
        assert ratio == pytest.approx(tsit5 / results.counts[name].num_steps)
        assert ratio >= 20, (name, ratio)


def test_verdict_yes_on_smoke_and_flips_on_failing_numbers(results):
    text = penalty.verdict(results)
    assert text.startswith("Yes.") and f"slope {results.slope:.2f}" in text, text
    bad_slope = dataclasses.replace(results, slope=0.5)
    text = penalty.verdict(bad_slope)
    assert text.startswith("Partly.") and "slope 0.50" in text, text
    few = {k: 3.0 for k in results.step_ratios}
    text = penalty.verdict(dataclasses.replace(results, step_ratios=few))
    assert text.startswith("Partly.") and "too few for Kvaerno5 (implicit)" in text, text
    text = penalty.verdict(dataclasses.replace(bad_slope, step_ratios=few))
    assert text.startswith("No."), text
    # A failed implicit solve does not count, however few its steps.
    name = results.config.solvers[0]
    broken = dataclasses.replace(results.counts[name], ok=False, failure="max_steps reached")
    counts = {**results.counts, name: broken}
    text = penalty.verdict(dataclasses.replace(results, counts=counts))
    assert text.startswith("Partly.") and "whose solve failed" in text, text
    # A failed ε-ladder solve voids the slope.
    failed = [True] * (len(results.ladder_ok) - 1) + [False]
    text = penalty.verdict(dataclasses.replace(results, ladder_ok=failed))
    assert text.startswith("Partly.") and "1 ε-ladder solve(s) failed" in text, text


def test_report_figures_and_protocol(results):
    check_study(penalty, "penalty-form")
    text = penalty.report(results)
    for d in results.distances:
        assert f"{d:.3e}" in text
    for count in results.counts.values():
        assert re.search(rf"\|\s+{count.num_steps} \|", text), count
    figs = penalty.figures(results)
    assert set(figs) == {"distance", "steps"}
    line = figs["distance"].axes[0].get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), results.distances)


@pytest.mark.parametrize(
    "changes, allowed",
    [
        ({"num_heads": 3}, "it must divide d=8; valid: [1, 2, 4, 8]"),
        ({"d": 0}, "every value must be finite and > 0"),
        ({"epsilons": (0.1, 0.01)}, "give at least 3"),
        ({"epsilons": (0.1, 0.0, 0.01)}, "allowed range (0, 1]"),
        ({"epsilons": (0.1, 0.1, 0.01)}, "the values must be distinct"),
        ({"stiff_epsilon": 0.1}, "it must be <= min(epsilons)=0.001"),
        ({"solvers": ("tsit5",)}, "valid choices: 'kvaerno5', 'kencarp4'"),
        ({"solvers": ()}, "give at least one value"),
        ({"tolerance": 0.5}, "allowed range (0, 0.01]"),
        ({"ladder_accuracy": 0.0}, "allowed range (0, 0.0001]"),
        ({"reference_steps_per_layer": 1}, "it must be >= 2"),
        ({"slope_tolerance": 0.0}, "allowed range (0, 1]"),
        ({"min_step_ratio": 0.5}, "allowed range [1, inf)"),
        ({"seed": -1}, "allowed range [0, inf)"),
    ],
)
def test_config_errors(changes, allowed):
    (field, value), *_ = changes.items()
    match = f"penalty-form: {field}={value!r} is not allowed; {allowed}"
    with pytest.raises(ConfigError, match=re.escape(match)):
        dataclasses.replace(penalty.smoke_config(), **changes)


def test_cli_rejects_a_bad_config_before_making_a_folder(tmp_path, capsys):
    out = tmp_path / "x"
    args = ["run", "penalty-form", "--smoke", "--out", str(out), "--stiff_epsilon", "0.5"]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert "penalty-form: stiff_epsilon=0.5 is not allowed; it must be <= min(epsilons)" in err
    assert not out.exists()
