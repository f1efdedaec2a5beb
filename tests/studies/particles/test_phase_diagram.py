"""Value tests of the studies phase-diagram and step-convergence (paper B, Fig. 3/5) at their
smoke sizes.

Each study's `compute(smoke_config())` runs once per module; the tests check its numbers against
the library (half times, Γ_∞), against theory (the statistic is 0 at t = 0, one cluster for
β ≤ 1, Γ_∞ approached as d grows, Gram-matrix errors shrinking at the integrators' orders) and
against stated tolerances; that each verdict gives the expected answer on the smoke run and
flips on Results built to fail; and that invalid configs are rejected with one line naming the
field, before any run folder exists.
"""

import dataclasses
import math
import re

import numpy as np
import pytest

from studies._run.cli import main as cli_main
from studies._toolkit.config import ConfigError
from studies.particles import phase_diagram, step_convergence
from workbench.particles._starts import half_time


@pytest.fixture(scope="module")
def phase():
    return phase_diagram.compute(phase_diagram.smoke_config())


@pytest.fixture(scope="module")
def steps():
    return step_convergence.compute(step_convergence.smoke_config())


def _config_error(module, field_value: str, **changes):
    with pytest.raises(ConfigError, match=re.escape(field_value)):
        dataclasses.replace(module.smoke_config(), **changes)


# --------------------------------------------------------------------------------------------
# phase-diagram
# --------------------------------------------------------------------------------------------


def test_phase_grid_and_gamma_infinity(phase):
    c = phase.config
    np.testing.assert_allclose(phase.betas, c.beta_max * np.arange(1, c.num_betas + 1) / 9)
    np.testing.assert_allclose(phase.ts, np.arange(16.0))
    # Γ_∞'s time grows with β from its β = 0 value L_δ / 2, L_δ = log((n − (n − 1)δ) / δ).
    t0 = 0.5 * math.log((c.n - (c.n - 1) * c.delta) / c.delta)
    assert np.all(np.diff(phase.gamma_infinity_t) > 0)
    assert t0 < phase.gamma_infinity_t[0] < t0 + 0.2
    assert [r.d for r in phase.per_d] == [8, 32]
    assert [r.variant for r in phase.variants] == ["gaussian"]


def test_phase_statistic_and_half_times(phase):
    for r in phase.per_d + phase.variants:
        assert r.fraction.shape == (9, 16)
        assert np.all((r.fraction >= 0) & (r.fraction <= 1))
        assert np.all(r.fraction[:, 0] == 0)  # random starts: no pair within δ = 1e-3
        np.testing.assert_array_equal(r.t_half, half_time(phase.ts, r.fraction))
        dist = r.distance_to_gamma_infinity
        inside = phase.gamma_infinity_t <= 15
        assert dist.num_betas_compared == int(inside.sum()) == 5
        assert dist.num_censored == int(np.isnan(r.t_half[inside]).sum())
        gaps = np.abs(np.nan_to_num(r.t_half, nan=15.0) - phase.gamma_infinity_t)[inside]
        assert dist.mean_abs_dt == pytest.approx(gaps.mean(), rel=1e-12)
        assert dist.median_abs_dt == pytest.approx(np.median(gaps), rel=1e-12)
        # β ≤ 1 (one grid value): one cluster by t = 15.
        assert r.min_fraction_at_t_max_beta_le_1 == r.fraction[0, -1] >= 0.99
        assert r.one_cluster_beta_le_1 is True
    assert phase.per_d[0].form == phase.per_d[1].form == "ReducedForm"
    assert phase.variants[0].form == "ParticleForm"


def test_phase_front_width_matches_its_definition(phase):
    r = phase.per_d[1]
    t_low = half_time(phase.ts, r.fraction[0], level=0.1)
    t_high = half_time(phase.ts, r.fraction[0], level=0.9)
    assert r.front_width[0] == pytest.approx((t_high - t_low) / r.t_half[0], rel=1e-12)
    reached = ~np.isnan(r.t_half)
    assert np.all(np.isnan(r.front_width[~reached]))
    assert r.median_front_width == pytest.approx(np.median(r.front_width[reached]))
    assert 0 < r.median_front_width < 1


def test_phase_follows_gamma_infinity_more_closely_at_larger_d(phase):
    d8, d32 = (r.distance_to_gamma_infinity for r in phase.per_d)
    assert d32.mean_abs_log_ratio < phase_diagram.FOLLOW_TOL
    assert d32.num_censored == 0
    assert d32.mean_abs_dt < 0.5 * d8.mean_abs_dt


def test_phase_verdict_yes_on_smoke(phase):
    text = phase_diagram.verdict(phase)
    assert text.startswith("Yes.")
    assert "d = 32" in text and "tolerance 0.1" in text


def _replace_distance(diagram, **changes):
    dist = dataclasses.replace(diagram.distance_to_gamma_infinity, **changes)
    return dataclasses.replace(diagram, distance_to_gamma_infinity=dist)


def test_phase_verdict_flips_on_failing_results(phase):
    d8, d32 = phase.per_d
    far = _replace_distance(d32, mean_abs_log_ratio=0.5, mean_abs_dt=10.0)
    blunt = dataclasses.replace(phase.variants[0], median_front_width=math.inf)
    partly = dataclasses.replace(phase, per_d=[d8, far])
    assert phase_diagram.verdict(partly).startswith("Partly.")
    assert "is not within" in phase_diagram.verdict(partly)
    assert phase_diagram.verdict(dataclasses.replace(phase, variants=[blunt])).startswith("Partly.")
    assert phase_diagram.verdict(dataclasses.replace(phase, variants=[])).startswith("Partly.")
    none = dataclasses.replace(phase, per_d=[d8, far], variants=[blunt])
    assert phase_diagram.verdict(none).startswith("No.")


@pytest.mark.parametrize(
    "field_value, changes",
    [
        ("num_starts=-5", dict(num_starts=-5)),
        ("num_betas=0", dict(num_betas=0)),
        ("t_max=10.05", dict(t_max=10.05)),
        ("variants=('foo',)", dict(variants=("foo",))),
        ("variants=('gaussian', 'gaussian')", dict(variants=("gaussian", "gaussian"))),
        ("dt=0", dict(dt=0.0)),
        ("beta_max=-3", dict(beta_max=-3.0)),
        ("ds=()", dict(ds=())),
        ("ds=(8, 1)", dict(ds=(8, 1))),
        ("t_max=15.0", dict(save_every=0.7)),
        ("delta=1.0", dict(delta=1.0)),
        ("n=1", dict(n=1)),
        ("variant_starts=0", dict(variant_starts=0)),
    ],
)
def test_phase_invalid_configs_name_the_field(field_value, changes):
    _config_error(phase_diagram, field_value, **changes)


@pytest.mark.parametrize(
    "args",
    [
        ["--num_starts", "-5"],
        ["--num_betas", "0"],
        ["--t_max", "10.05"],
        ["--variants", "foo"],
        ["--dt", "0"],
        ["--beta_max=-3"],
    ],
)
def test_phase_cli_rejects_invalid_config_without_run_folder(args, tmp_path, capsys):
    out = tmp_path / "x"
    assert cli_main(["run", phase_diagram.NAME, "--smoke", "--out", str(out), *args]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and phase_diagram.NAME in err[0]


# --------------------------------------------------------------------------------------------
# step-convergence
# --------------------------------------------------------------------------------------------


def test_steps_rows_cover_the_ladder(steps):
    c = steps.config
    assert [(r.integrator, r.dt) for r in steps.rows] == [
        (name, dt) for name in c.integrators for dt in c.dts
    ]
    for r in steps.rows:
        assert 0 <= r.mean_abs_error <= r.max_abs_error <= 1
        assert list(r.gram_max_error) == ["1"]
        for p in r.points:
            i, k = list(steps.betas).index(p.beta), list(steps.ts).index(p.t)
            assert p.reference == steps.reference.fraction[i, k]
            assert abs(p.value - p.reference) <= r.max_abs_error
    assert steps.reference.integrator == "rk4" and steps.reference.dt == 0.0125


def test_steps_gram_errors_shrink_at_the_integrators_orders(steps):
    gram = {(r.integrator, r.dt): r.gram_max_error["1"] for r in steps.rows}
    # Halving dt divides the error by about 2^p.
    assert 1.7 < gram["euler", 0.1] / gram["euler", 0.05] < 2.3
    assert 12 < gram["rk4", 0.1] / gram["rk4", 0.05] < 20
    assert gram["rk4", 0.1] < 1e-4 * gram["euler", 0.1]
    for name, expected in (("euler", 1), ("rk4", 4)):
        o = steps.orders[name]
        assert o.expected_order == expected
        assert abs(o.observed_order - expected) <= step_convergence.ORDER_TOL
        assert o.observed_order == pytest.approx(
            math.log2(gram[name, 0.1] / gram[name, 0.05]), rel=1e-9
        )


def test_steps_authors_dt_within_statistical_error(steps):
    sem = steps.reference.standard_error_over_starts
    assert sem.max_at_1024_starts == pytest.approx(sem.max * math.sqrt(4 / 1024))
    assert sem.mean_at_1024_starts == pytest.approx(sem.mean * math.sqrt(4 / 1024))
    euler = steps.rows[0]
    assert (euler.integrator, euler.dt) == ("euler", 0.1)
    assert euler.t_half_defined_mismatch == 0
    assert euler.t_half_mean_abs_shift < steps.config.save_every
    assert euler.max_abs_error <= sem.max_at_1024_starts


def test_steps_verdict_yes_on_smoke(steps):
    text = step_convergence.verdict(steps)
    assert text.startswith("Yes.")
    assert "(expected 1)" in text and "(expected 4)" in text and "within ±0.3" in text


def test_steps_verdict_flips_on_failing_results(steps):
    rows = list(steps.rows)
    rows[0] = dataclasses.replace(rows[0], max_abs_error=0.3, t_half_mean_abs_shift=5.0)
    assert step_convergence.verdict(dataclasses.replace(steps, rows=rows)).startswith("No.")
    rows[0] = dataclasses.replace(steps.rows[0], max_abs_error=0.3)
    assert step_convergence.verdict(dataclasses.replace(steps, rows=rows)).startswith("Partly.")
    for change in (dict(observed_order=1.0), dict(order_reduction=True)):
        orders = dict(steps.orders, rk4=dataclasses.replace(steps.orders["rk4"], **change))
        text = step_convergence.verdict(dataclasses.replace(steps, orders=orders))
        assert text.startswith("Partly.") and "not all within" in text


@pytest.mark.parametrize(
    "field_value, changes",
    [
        ("integrators=('foo',)", dict(integrators=("foo",))),
        ("integrators=('rk4',)", dict(integrators=("rk4",))),
        ("dts=(0.05,)", dict(dts=(0.05,))),
        ("dts=(0.1, 0.1)", dict(dts=(0.1, 0.1))),
        ("dts=(0.1, 0.0)", dict(dts=(0.1, 0.0))),
        ("reference_dt=0.1", dict(reference_dt=0.1)),
        ("t_max=8.05", dict(t_max=8.05)),
        ("order_ts=(1.01,)", dict(order_ts=(1.01,))),
        ("point_ts=(8.0, 4.0)", dict(point_ts=(8.0, 4.0))),
        ("point_betas=(2.0,)", dict(point_betas=(2.0,))),
        ("point_ts=(10.0,)", dict(point_ts=(10.0,))),
        ("num_starts=-5", dict(num_starts=-5)),
        ("delta=0.0", dict(delta=0.0)),
        ("betas=()", dict(betas=())),
        ("d=1", dict(d=1)),
    ],
)
def test_steps_invalid_configs_name_the_field(field_value, changes):
    _config_error(step_convergence, field_value, **changes)


def test_steps_cli_rejects_invalid_config_without_run_folder(tmp_path, capsys):
    out = tmp_path / "x"
    args = ["run", step_convergence.NAME, "--smoke", "--out", str(out), "--integrators", "foo"]
    assert cli_main(args) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "integrators=('foo',)" in err[0]


def test_phase_float32_switch_agrees_with_float64_statistically():
    # --no-x64 runs the particles in float32. The flow is metastable, so single merge times move
    # with round-off; the averaged statistic must agree within its standard error.
    c = dataclasses.replace(phase_diagram.smoke_config(), ds=(8,), variants=(), num_starts=32)
    f64, f32 = (
        phase_diagram.compute(dataclasses.replace(c, x64=x)).per_d[0] for x in (True, False)
    )
    gap = np.abs(f64.fraction - f32.fraction)
    assert gap.max() <= 3 * f64.max_sem and gap.mean() <= 0.5 * f64.max_sem
    assert "float32" in phase_diagram.report(
        phase_diagram.compute(dataclasses.replace(c, x64=False, ds=(2,), num_starts=2))
    )
