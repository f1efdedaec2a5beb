"""The repulsion study: its numbers against the known optima and the optimizer, its verdict on
passing and on failing numbers, and its config checks."""

import dataclasses

import numpy as np
import pytest

from studies._run.cli import main as cli
from studies._toolkit.config import ConfigError
from studies.particles import repulsion


@pytest.fixture(scope="module")
def results():
    return repulsion.compute(repulsion.smoke_config())


def test_matches_known_optima_and_optimizer(results):
    config = results.config
    assert len(results.cases) == len(config.dims) * len(config.ns) * len(config.betas)
    for r in results.cases:
        assert r.known is not None  # the smoke cases all have a known optimum
        assert abs(r.gap_flow_vs_known) <= 1e-6
        assert abs(r.gap_flow_vs_optimizer) <= 1e-6
        assert abs(r.gap_optimizer_vs_known) <= 1e-6
        # The configuration itself (sorted inner products) is the n-gon / simplex / octahedron.
        assert r.gram_distance_to_known <= 1e-6
        assert r.flow_converged


def test_energy_decreases_along_the_flow(results):
    for r in results.cases:
        # E_β is non-increasing between checks, up to rounding.
        assert r.flow_max_relative_energy_increase <= 1e-12
        assert np.all(np.diff(r.energy_history, axis=0) <= 1e-12 * np.abs(r.energy_history[:-1]))


def test_verdict_flips_on_failing_numbers(results):
    assert repulsion.verdict(results).startswith("Yes")
    off = dataclasses.replace(results.cases[0], gap_flow_vs_optimizer=1e-2)
    partly = dataclasses.replace(results, cases=(off, *results.cases[1:]))
    assert repulsion.verdict(partly).startswith("Partly")
    all_off = tuple(dataclasses.replace(r, gap_flow_vs_known=-3e-3) for r in results.cases)
    assert repulsion.verdict(dataclasses.replace(results, cases=all_off)).startswith("No")
    rising = dataclasses.replace(results.cases[0], flow_max_relative_energy_increase=1e-6)
    no = dataclasses.replace(results, cases=(rising, *results.cases[1:]))
    assert repulsion.verdict(no).startswith("No. E_β rose")


def test_report_and_figures(results):
    text = repulsion.report(results)
    for r in results.cases:
        assert f"{r.energy_flow:.10g}" in text
    figs = repulsion.figures(results)
    assert set(figs) == {"gaps", "inner_products", "energy_decay"}
    # The gap plot shows exactly the floored gaps of the cases.
    line = figs["gaps"].axes[0].get_lines()[0]
    expected = [max(abs(r.gap_flow_vs_optimizer), 1e-17) for r in results.cases]
    np.testing.assert_allclose(line.get_ydata(), expected)


def test_known_optimum_gram_matrices():
    # Simplex: inner products −1/(n − 1); the 4-gon is the 2-d cross-polytope; octahedron: 0 and −1.
    name, g = repulsion.known_optimum(4, 3)
    assert name.startswith("regular simplex")
    np.testing.assert_allclose(g[~np.eye(4, dtype=bool)], -1.0 / 3.0, rtol=0, atol=1e-15)
    _, g = repulsion.known_optimum(6, 3)
    off = np.sort(g[~np.eye(6, dtype=bool)])
    np.testing.assert_array_equal(off, np.sort(np.r_[np.full(6, -1.0), np.zeros(24)]))
    _, g = repulsion.known_optimum(4, 2)
    np.testing.assert_allclose(np.sort(g[0]), [-1.0, 0.0, 0.0, 1.0], atol=1e-15)
    assert repulsion.known_optimum(5, 3) is None


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"num_starts": -5}, r"num_starts=-5 is not allowed; every value must be finite and > 0"),
        ({"betas": (1.0, -3.0)}, r"betas=\(1.0, -3.0\)"),
        ({"dims": (1,)}, r"dims=\(1,\) is not allowed; every d must be >= 2"),
        ({"dt": 0.0}, r"dt=0.0"),
        ({"chunk_time": 10.3}, r"chunk_time=10.3 .* whole multiple of dt=0.5"),
        ({"ns": ()}, r"ns=\(\) is not allowed; give at least one value"),
        ({"speed_tol": float("nan")}, r"speed_tol=nan"),
    ],
)
def test_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(repulsion.Config(), **changes)


def test_cli_rejects_a_bad_config_before_making_a_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["run", "repulsion", "--smoke", "--out", str(out), "--num_starts", "-5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "workbench run: error: repulsion: num_starts=-5 is not allowed; every value "
        "must be finite and > 0."
    ]
    assert not out.exists()
