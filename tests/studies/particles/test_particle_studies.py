"""Value tests of the particle studies cluster-histograms, metastability and high-dimension
(paper B) at their smoke sizes.

Each study's `compute(smoke_config())` runs once per module; the tests check its numbers against
exact identities (histogram counts, plateau tiling, rank ≥ components), theory (d^{−1/2}
concentration, the collapse rate 2 from the linearized γ_β ODE, Thm 6.3's bound) and stated
tolerances; that each verdict gives the expected answer on the smoke run and flips on Results
built to fail; and that invalid configs are rejected with one line naming the field, before
any run folder exists.
"""

import dataclasses
import math
import re

import numpy as np
import pytest

from studies._run.cli import main as cli_main
from studies._toolkit.config import ConfigError
from studies.particles import cluster_histograms, high_dimension, metastability


@pytest.fixture(scope="module")
def histograms():
    return cluster_histograms.compute(cluster_histograms.smoke_config())


@pytest.fixture(scope="module")
def meta():
    return metastability.compute(metastability.smoke_config())


@pytest.fixture(scope="module")
def highdim():
    return high_dimension.compute(high_dimension.smoke_config())


def _config_error(module, field_value: str, **changes):
    with pytest.raises(ConfigError, match=re.escape(field_value)):
        dataclasses.replace(module.smoke_config(), **changes)


@pytest.mark.parametrize(
    "module, args",
    [
        (cluster_histograms, ["--num_starts=-5"]),
        (metastability, ["--check_t1", "5000"]),
        (high_dimension, ["--dt", "0"]),
    ],
)
def test_cli_rejects_invalid_config_without_run_folder(module, args, tmp_path, capsys):
    out = tmp_path / "x"
    assert cli_main(["run", module.NAME, "--smoke", "--out", str(out), *args]) == 2
    assert not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and module.NAME in err[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, expected",
    [
        (cluster_histograms, {"heatmaps", "histograms", "mass_near_one"}),
        (metastability, {"cluster_counts", "angles", "plateaus_vs_beta"}),
        (high_dimension, {"gram_vs_gamma", "deviation_vs_d", "deviation_vs_time", "collapse"}),
    ],
)
def test_figures_are_the_old_pngs(module, expected, request):
    fixture = {cluster_histograms: "histograms", metastability: "meta", high_dimension: "highdim"}
    results = request.getfixturevalue(fixture[module])
    figs = module.figures(results)
    assert set(figs) == expected
    if module is high_dimension:
        # The plotted deviations are the numbers in Results, exactly.
        lines = figs["deviation_vs_d"].axes[0].get_lines()
        beta = results.config.betas[0]
        sub = [r for r in results.rows if r.beta == beta]
        np.testing.assert_array_equal(lines[0].get_ydata(), [r.max_deviation for r in sub])
        np.testing.assert_array_equal(lines[1].get_ydata(), [r.mean_deviation for r in sub])


# ----------------------------------------------------------------------------------------------
# cluster-histograms


def test_histogram_counts_sum_to_all_ordered_pairs(histograms):
    config = histograms.config
    assert histograms.counts.shape[-1] == config.bins
    assert histograms.pairs_per_start == config.n * (config.n - 1)
    # Exact: every ordered pair i ≠ j lands in exactly one bin at every saved time.
    np.testing.assert_array_equal(
        histograms.counts.sum(axis=-1), config.num_starts * histograms.pairs_per_start
    )


def test_histogram_mass_near_one(histograms):
    config = histograms.config
    frac = histograms.fraction_near_one_mean  # (β, d, t)
    np.testing.assert_allclose(frac, histograms.fraction_near_one.mean(axis=2))
    top_bin = histograms.counts[..., -1] / (config.num_starts * histograms.pairs_per_start)
    # Pairs with ⟨x_i, x_j⟩ ≥ 1 − δ lie in the top bin [1 − 2/bins, 1]: its mass is at least F_δ.
    assert np.all(top_bin >= frac - 1e-12)
    # Uniform starts: P(⟨x_i, x_j⟩ ≥ 1 − 10⁻³) ≈ 1.4 % on the circle, ~0 in d = 32.
    assert np.all(frac[:, :, 0] <= 0.05)
    b1 = config.betas.index(1.0)
    # β = 1 collapses to one cluster by t1 = 20 in both d (the smoke run gives 1.000).
    assert np.all(frac[b1, :, -1] >= 0.99)
    for r in histograms.rows:
        if r.beta == 1.0:
            assert r.t_half is not None and r.t_99 is not None and r.t_half <= r.t_99 <= config.t1
            assert r.final_clusters == [1] * config.num_starts
    # Γ_∞ (Thm 6.9) at β = 1, n = 32, δ = 1e-3: t* = 5.27; the d = 32 run reaches ½ near it.
    row = next(r for r in histograms.rows if r.beta == 1.0 and r.d == 32)
    assert row.gamma_infinity_time == pytest.approx(5.27, abs=0.01)
    assert abs(row.t_half - row.gamma_infinity_time) <= 1.0


def test_histogram_metastable_case_stalls(histograms):
    row = next(r for r in histograms.rows if r.beta == 9.0 and r.d == 2)
    # β = 9 on the circle sits in a few clusters: the mass near 1 stalls strictly inside (0, 1).
    assert 2 <= row.final_clusters_median <= 6
    assert 0.1 <= row.fraction_near_one[-1] <= 0.9
    assert row.t_99 is None


def test_histogram_verdict_smoke_is_partly(histograms):
    # 2 of 4 cases pile up at 1 by t1 = 20; β = 9, d = 2 stalls in 3 clusters; β = 9, d = 32
    # is still forming with t1 < t*(9) = 179.
    text = cluster_histograms.verdict(histograms)
    assert text.startswith("Partly.")
    assert "in 2 of 4 (β, d) cases" in text
    assert "β = 9, d = 2 (3–3 clusters" in text
    assert "β = 9, d = 32 (t* = 179)" in text


def test_histogram_verdict_flips(histograms):
    rows = histograms.rows
    all_piled = dataclasses.replace(
        histograms, rows=[dataclasses.replace(r, t_99=r.t_99 or 19.0) for r in rows]
    )
    assert cluster_histograms.verdict(all_piled).startswith("Yes. ")
    none_piled = dataclasses.replace(
        histograms, rows=[dataclasses.replace(r, t_99=None) for r in rows]
    )
    assert cluster_histograms.verdict(none_piled).startswith("No. ")
    # The mass near 1 shrinking in a case that did not pile up is a "No" even if others did.
    lost = histograms.fraction_near_one_mean.copy()
    b, j = histograms.config.betas.index(9.0), histograms.config.dims.index(2)
    lost[b, j, 0] = 0.9
    text = cluster_histograms.verdict(dataclasses.replace(histograms, fraction_near_one_mean=lost))
    assert text.startswith("No. ") and "lower at t1 than at t = 0 in 1: β = 9, d = 2" in text


@pytest.mark.parametrize(
    "changes, field_value",
    [
        ({"num_starts": -5}, "num_starts=-5"),
        ({"n": 1}, "n=1"),
        ({"dims": (2, 1)}, "dims=(2, 1)"),
        ({"dims": ()}, "dims=()"),
        ({"betas": (1.0, -3.0), "histogram_beta": 1.0}, "betas=(1.0, -3.0)"),
        ({"dt": 0.0}, "dt=0.0"),
        ({"t1": 10.05}, "t1=10.05"),
        ({"save_every": 0.25}, "save_every=0.25"),
        ({"integrator": "rk45"}, "integrator='rk45'"),
        ({"bins": 1}, "bins=1"),
        ({"delta": 1.0}, "delta=1.0"),
        ({"snapshot_times": (0.0, 25.0)}, "snapshot_times=(0.0, 25.0)"),
        ({"histogram_beta": 4.0}, "histogram_beta=4.0"),
        ({"seed": -1}, "seed=-1"),
    ],
)
def test_histogram_invalid_config(changes, field_value):
    _config_error(cluster_histograms, field_value, **changes)


# ----------------------------------------------------------------------------------------------
# metastability


def test_plateaus_tile_the_time_range(meta):
    t1 = meta.t1
    assert t1 == meta.ts[-1] == meta.config.t1
    for runs in meta.runs.values():
        for run in runs:
            pls = run.plateaus
            assert pls[0].start == 0.0
            assert pls[-1].end == pytest.approx(t1, abs=1e-9)
            for a, b in zip(pls[:-1], pls[1:]):
                assert a.end == b.start
                assert a.count != b.count  # maximal intervals
            assert sum(p.duration for p in pls) == pytest.approx(t1, rel=1e-12)


def test_metastability_counts(meta):
    config, comp, rank = meta.config, meta.counts, meta.counts_rank  # (β, start, t)
    # The rank of the thresholded Gram matrix is never below the number of components.
    assert np.all(rank >= comp)
    assert meta.rank_vs_components.max_rank_minus_components == int(np.max(rank - comp))
    assert meta.rank_vs_components.fraction_equal == pytest.approx(np.mean(rank == comp))
    # Counts are non-increasing: clusters merge and do not split (no up-step at all here).
    assert np.sum(np.diff(comp, axis=-1) > 0) == 0
    # Uniform start: about 2 of the 496 pairs are within 1e-4 (angle 0.014); allow 8 merged.
    assert np.all(comp[:, :, 0] >= config.n - 8)
    b1 = config.betas.index(1.0)
    assert np.all(comp[b1, :, -1] == 1)  # small β: one cluster
    for run in meta.runs["1.0"]:
        assert run.time_to_one is not None and run.time_to_one <= 50.0
    b9 = config.betas.index(9.0)
    assert np.all(comp[b9, :, -1] >= 2)  # β = 9: still several clusters at t1 = 2000
    assert meta.per_beta["9.0"].fraction_collapsed == 0.0
    assert meta.per_beta["9.0"].median_time_to_one is None
    # Angles of start 0 for the featured β, one per saved time and particle.
    assert meta.angles["4.0"].shape == (meta.ts.size, config.n)


def test_metastability_plateaus_grow_with_beta(meta):
    med = {b: p.median_longest_duration for b, p in meta.per_beta.items()}
    # The longest metastable plateau lengthens by orders of magnitude from β = 1 to β = 4, 9.
    assert med["4.0"] >= 20 * med["1.0"]
    assert med["9.0"] >= 20 * med["1.0"]
    # The authors' Euler dt = 0.1 and the study's RK4 dt = 0.5 give the same count series at
    # ≥ 90 % of the saved times up to check_t1.
    assert [r.beta for r in meta.cross_check.rows] == list(meta.config.featured_betas)
    for row in meta.cross_check.rows:
        assert row.fraction_equal >= 0.9


def test_metastability_verdict_smoke_is_yes(meta):
    text = metastability.verdict(meta)
    assert text.startswith("Yes.")
    assert "2 of 2 featured β reach 100 time units" in text


def test_metastability_verdict_flips(meta):
    short = {
        k: dataclasses.replace(p, median_longest_duration=5.0) for k, p in meta.per_beta.items()
    }
    assert metastability.verdict(dataclasses.replace(meta, per_beta=short)).startswith("No. ")
    # Long plateaus, but the authors' integrator disagrees: only partly established.
    cross = dataclasses.replace(
        meta.cross_check,
        rows=[dataclasses.replace(r, fraction_equal=0.5) for r in meta.cross_check.rows],
    )
    assert metastability.verdict(dataclasses.replace(meta, cross_check=cross)).startswith("Partly")
    # Long plateaus at every β, the smallest too: no dependence on β shown.
    base = dict(meta.per_beta)
    base["1.0"] = dataclasses.replace(base["1.0"], median_longest_duration=500.0)
    assert metastability.verdict(dataclasses.replace(meta, per_beta=base)).startswith("Partly")
    # A fitted growth rate that is not positive.
    fit = metastability.GrowthFit(rate_per_beta=-0.1, intercept=1.0, betas=[2.0, 3.0, 4.0])
    assert metastability.verdict(dataclasses.replace(meta, growth_fit=fit)).startswith("Partly")


@pytest.mark.parametrize(
    "changes, field_value",
    [
        ({"num_starts": -5}, "num_starts=-5"),
        ({"d": 1}, "d=1"),
        ({"betas": ()}, "betas=()"),
        ({"featured_betas": (2.0,)}, "featured_betas=(2.0,)"),
        ({"dt": 0.0}, "dt=0.0"),
        ({"t1": 2000.2}, "t1=2000.2"),
        ({"integrator": "foo"}, "integrator='foo'"),
        ({"num_saves": 1}, "num_saves=1"),
        ({"threshold": 3.0}, "threshold=3.0"),
        ({"max_count": 40}, "max_count=40"),
        ({"check_t1": 5000.0}, "check_t1=5000.0"),
        ({"check_t1": 100.05}, "check_t1=100.05"),
        ({"min_agreement": 1.5}, "min_agreement=1.5"),
        ({"long_time": float("nan")}, "long_time=nan"),
    ],
)
def test_metastability_invalid_config(changes, field_value):
    _config_error(metastability, field_value, **changes)


# ----------------------------------------------------------------------------------------------
# high-dimension


def test_high_dimension_deviation_shrinks_with_d(highdim):
    config = highdim.config
    rows = {r.d: r for r in highdim.rows}
    d_small, d_large = min(config.dims), max(config.dims)
    # Stated bound at the largest d: the initial inner products are ~ N(0, 1/d); the max over
    # pairs, times and starts stays below 4/√d (measured 0.10 at d = 512, 4/√512 = 0.18).
    assert rows[d_large].max_deviation <= 4.0 / math.sqrt(d_large)
    # d grows 64-fold: d^{-1/2} predicts a factor 8; require at least 4 (max and mean).
    assert rows[d_large].max_deviation * 4 <= rows[d_small].max_deviation
    assert rows[d_large].mean_deviation * 4 <= rows[d_small].mean_deviation
    for fit in highdim.fits:
        assert fit.exponent_mean_deviation == pytest.approx(-0.5, abs=0.15)
        assert fit.exponent_max_deviation == pytest.approx(-0.5, abs=0.15)
    # The fitted exponent is the least-squares slope in log-log over all dims.
    dims = np.log(np.asarray(config.dims, dtype=float))
    slope = np.polyfit(dims, np.log([rows[d].max_deviation for d in config.dims]), 1)[0]
    assert highdim.fits[0].exponent_max_deviation == pytest.approx(slope, abs=1e-12)


def test_high_dimension_integration_error_and_collapse_rate(highdim):
    config = highdim.config
    # From an orthogonal start every Gram entry equals γ_β(t): RK4 at dt = 0.05 is within 1e-7.
    for err in highdim.integration_error_orthogonal_start.values():
        assert err <= 1e-7
    for r in highdim.rows:
        # Linearizing Thm 6.8's SA ODE at γ = 1 gives γ' = 2(1 − γ): rate 2 (derived).
        assert r.starts_with_rate == config.num_starts
        assert r.collapse_rate_min == pytest.approx(2.0, abs=0.05)
        assert r.collapse_rate_max == pytest.approx(2.0, abs=0.05)
        # Thm 6.3's bound 1/(2n e^{2β}) is a lower bound on the rate, far from tight.
        assert r.collapse_rate_min >= 10 * r.rate_bound
    np.testing.assert_allclose(highdim.collapse_rates, 2.0, atol=0.05)


def test_high_dimension_verdict_smoke_is_yes(highdim):
    text = high_dimension.verdict(highdim)
    assert text.startswith("Yes.")
    assert "all within ±0.15 of −1/2" in text and "fitted for 12/12 starts" in text


def test_high_dimension_verdict_flips(highdim):
    flat = [
        dataclasses.replace(f, exponent_max_deviation=-0.1, exponent_mean_deviation=-0.1)
        for f in highdim.fits
    ]
    slow = [dataclasses.replace(r, collapse_rate_min=0.5 * r.rate_bound) for r in highdim.rows]
    text = high_dimension.verdict(dataclasses.replace(highdim, fits=flat))
    assert text.startswith("Partly. ") and "not all within ±0.15" in text
    text = high_dimension.verdict(dataclasses.replace(highdim, rows=slow))
    assert text.startswith("Partly. ") and "the slowest 0.5× Thm 6.3's bound" in text
    assert high_dimension.verdict(dataclasses.replace(highdim, fits=flat, rows=slow)).startswith(
        "No. "
    )
    # An integration error as large as the deviations themselves voids the tracking claim.
    noisy = dataclasses.replace(highdim, integration_error_orthogonal_start={"1.0": 1e-2})
    assert high_dimension.verdict(noisy).startswith("Partly. ")


@pytest.mark.parametrize(
    "changes, field_value",
    [
        ({"num_starts": -5}, "num_starts=-5"),
        ({"n": 0}, "n=0"),
        ({"dims": (8,)}, "dims=(8,)"),
        ({"dims": (8, 8, 64)}, "dims=(8, 8, 64)"),
        ({"betas": (-1.0,)}, "betas=(-1.0,)"),
        ({"dt": 0.0}, "dt=0.0"),
        ({"save_every": 0.07}, "save_every=0.07"),
        ({"t1": 15.25}, "t1=15.25"),
        ({"integrator": "foo"}, "integrator='foo'"),
        ({"fit_window": (1e-6, 1e-20)}, "fit_window=(1e-06, 1e-20)"),
        ({"fit_window": (1e-20,)}, "fit_window=(1e-20,)"),
        ({"exponent_tol": 0.0}, "exponent_tol=0.0"),
        ({"seed": -1}, "seed=-1"),
    ],
)
def test_high_dimension_invalid_config(changes, field_value):
    _config_error(high_dimension, field_value, **changes)
