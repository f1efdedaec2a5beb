"""Value tests of the particle studies (paper B) at their smoke sizes.

Each study's `main` runs once per module (float64, from `conftest.py`) into a temporary folder;
the tests check the numbers it returns against exact identities (histogram counts, plateau tiling,
rank ≥ components), theory (d^{−1/2} concentration, the collapse rate 2 from the linearized
γ_β ODE, known optimal configurations) and stated tolerances.
"""

import math

import numpy as np
import pytest

from studies import cluster_histograms, high_dimension, metastability, repulsion


def _run(module, tmp_path_factory):
    out = tmp_path_factory.mktemp(module.NAME)
    config = module.smoke_config()
    results = module.main(config, out)
    return config, results, out


@pytest.fixture(scope="module")
def histograms(tmp_path_factory):
    return _run(cluster_histograms, tmp_path_factory)


@pytest.fixture(scope="module")
def meta(tmp_path_factory):
    return _run(metastability, tmp_path_factory)


@pytest.fixture(scope="module")
def highdim(tmp_path_factory):
    return _run(high_dimension, tmp_path_factory)


@pytest.fixture(scope="module")
def repel(tmp_path_factory):
    return _run(repulsion, tmp_path_factory)


# ----------------------------------------------------------------------------------------------
# cluster-histograms


def test_histogram_counts_sum_to_all_ordered_pairs(histograms):
    config, res, _ = histograms
    counts = np.asarray(res["counts"])  # (β, d, t, bins), pooled over starts
    assert counts.shape[-1] == config.bins
    expected = config.num_starts * config.n * (config.n - 1)
    # Exact: every ordered pair i ≠ j lands in exactly one bin at every saved time.
    np.testing.assert_array_equal(counts.sum(axis=-1), expected)


def test_histogram_mass_near_one(histograms):
    config, res, _ = histograms
    frac = np.asarray(res["fraction_near_one_mean"])  # (β, d, t)
    counts = np.asarray(res["counts"])
    top_bin = counts[..., -1] / (config.num_starts * config.n * (config.n - 1))
    # Pairs with ⟨x_i, x_j⟩ ≥ 1 − δ lie in the top bin [1 − 2/bins, 1]: its mass is at least F_δ.
    assert np.all(top_bin >= frac - 1e-12)
    # Uniform starts: P(⟨x_i, x_j⟩ ≥ 1 − 10⁻³) ≈ 1.4 % on the circle, ~0 in d = 32.
    assert np.all(frac[:, :, 0] <= 0.05)
    b1 = config.betas.index(1.0)
    # β = 1 collapses to one cluster by t1 = 20 in both d (the smoke run gives 1.000).
    assert np.all(frac[b1, :, -1] >= 0.99)


def test_histogram_metastable_case_stalls(histograms):
    config, res, _ = histograms
    row = next(r for r in res["rows"] if r["beta"] == 9.0 and r["d"] == 2)
    # β = 9 on the circle sits in a few clusters: the mass near 1 stalls strictly inside (0, 1).
    assert 2 <= row["final_clusters_median"] <= 6
    assert 0.1 <= row["fraction_near_one"][-1] <= 0.9
    assert row["t_99"] is None


# ----------------------------------------------------------------------------------------------
# metastability


def test_plateaus_tile_the_time_range(meta):
    config, res, _ = meta
    t1 = res["t1"]
    for runs in res["runs"].values():
        for run in runs:
            pls = run["plateaus"]
            assert pls[0][0] == 0.0
            assert pls[-1][1] == pytest.approx(t1, abs=1e-9)
            for (_, end, _), (start, _, _) in zip(pls[:-1], pls[1:]):
                assert end == start
            assert sum(e - s for s, e, _ in pls) == pytest.approx(t1, rel=1e-12)
            # Consecutive plateaus have different counts (maximal intervals).
            assert all(a[2] != b[2] for a, b in zip(pls[:-1], pls[1:]))


def test_metastability_counts(meta):
    config, res, _ = meta
    comp = np.asarray(res["counts"])  # (β, start, t)
    rank = np.asarray(res["counts_rank"])
    # The rank of the thresholded Gram matrix is never below the number of components.
    assert np.all(rank >= comp)
    # Counts are non-increasing: clusters merge and do not split (no up-step at all here).
    ups = np.sum(np.diff(comp, axis=-1) > 0)
    assert ups == 0
    # Uniform start: about 2 of the 496 pairs are within 1e-4 (angle 0.014); allow 8 merged.
    assert np.all(comp[:, :, 0] >= config.n - 8)
    b1 = config.betas.index(1.0)
    assert np.all(comp[b1, :, -1] == 1)  # small β: one cluster
    for run in res["runs"]["1.0"]:
        assert run["time_to_one"] is not None and run["time_to_one"] <= 50.0
    b9 = config.betas.index(9.0)
    assert np.all(comp[b9, :, -1] >= 2)  # β = 9: still several clusters at t1 = 2000


def test_metastability_plateaus_grow_with_beta(meta):
    config, res, _ = meta
    med = {p["beta"]: p["median_longest_duration"] for p in res["per_beta"]}
    # The longest metastable plateau lengthens by orders of magnitude from β = 1 to β = 4, 9.
    assert med[4.0] >= 20 * med[1.0]
    assert med[9.0] >= 20 * med[1.0]
    # The authors' Euler dt = 0.1 and the study's RK4 dt = 0.5 give the same count series at
    # ≥ 90 % of the saved times up to check_t1.
    for row in res["cross_check"]["rows"]:
        assert row["fraction_equal"] >= 0.9


# ----------------------------------------------------------------------------------------------
# high-dimension


def test_high_dimension_deviation_shrinks_with_d(highdim):
    config, res, _ = highdim
    rows = {r["d"]: r for r in res["rows"]}
    d_small, d_large = min(config.dims), max(config.dims)
    # Stated bound at the largest d: the initial inner products are ~ N(0, 1/d); the max over
    # pairs, times and starts stays below 4/√d (measured 0.10 at d = 512, 4/√512 = 0.18).
    assert rows[d_large]["max_deviation"] <= 4.0 / math.sqrt(d_large)
    # d grows 64-fold: d^{-1/2} predicts a factor 8; require at least 4 (max and mean).
    assert rows[d_large]["max_deviation"] * 4 <= rows[d_small]["max_deviation"]
    assert rows[d_large]["mean_deviation"] * 4 <= rows[d_small]["mean_deviation"]
    for fit in res["fits"]:
        assert fit["exponent_mean_deviation"] == pytest.approx(-0.5, abs=0.15)
        assert fit["exponent_max_deviation"] == pytest.approx(-0.5, abs=0.15)


def test_high_dimension_integration_error_and_collapse_rate(highdim):
    config, res, _ = highdim
    # From an orthogonal start every Gram entry equals γ_β(t): RK4 at dt = 0.05 is within 1e-7.
    for err in res["integration_error_orthogonal_start"].values():
        assert err <= 1e-7
    for r in res["rows"]:
        # Linearizing Thm 6.8's SA ODE at γ = 1 gives γ' = 2(1 − γ): rate 2 (derived).
        assert r["starts_with_rate"] == config.num_starts
        assert r["collapse_rate_min"] == pytest.approx(2.0, abs=0.05)
        assert r["collapse_rate_max"] == pytest.approx(2.0, abs=0.05)
        # Thm 6.3's bound 1/(2n e^{2β}) is a lower bound on the rate, far from tight.
        assert r["collapse_rate_min"] >= 10 * r["rate_bound"]


# ----------------------------------------------------------------------------------------------
# repulsion


def test_repulsion_matches_known_optima_and_optimizer(repel):
    config, res, _ = repel
    assert len(res["rows"]) == len(config.dims) * len(config.ns) * len(config.betas)
    for r in res["rows"]:
        assert r["known"] is not None  # the smoke cases all have a known optimum
        assert abs(r["gap_flow_vs_known"]) <= 1e-6
        assert abs(r["gap_flow_vs_optimizer"]) <= 1e-6
        assert abs(r["gap_optimizer_vs_known"]) <= 1e-6
        # The configuration itself (sorted inner products) is the n-gon / simplex / octahedron.
        assert r["gram_distance_to_known"] <= 1e-6
        assert r["flow_converged"]


def test_repulsion_energy_decreases_along_the_flow(repel):
    _, res, _ = repel
    for r in res["rows"]:
        # E_β is non-increasing between checks, up to rounding.
        assert r["flow_max_relative_energy_increase"] <= 1e-12


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
