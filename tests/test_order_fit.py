"""`fit_order`: exact slopes, the confidence band against SciPy, the asymptotic window and the
round-off floor, and its errors."""

import numpy as np
import pytest

import workbench as wb


def test_exact_power_law():
    h = 0.1 / 2 ** np.arange(5)
    fit = wb.analysis.fit_order(h, 3.0 * h**4)
    assert abs(fit.order - 4.0) < 1e-12 and abs(fit.constant - 3.0) < 1e-10
    assert fit.used.all() and fit.floor is None and fit.pre_asymptotic == 0


def test_confidence_interval_matches_scipy_linregress():
    stats = pytest.importorskip("scipy.stats", reason="scipy (studies extra) gives the reference")
    rng = np.random.default_rng(0)
    h = 0.2 / 1.5 ** np.arange(7)
    e = 2.0 * h**2 * np.exp(0.05 * rng.standard_normal(h.size))
    fit = wb.analysis.fit_order(h, e, asymptotic=False)
    ref = stats.linregress(np.log(h), np.log(e))
    t = stats.t.ppf(0.975, h.size - 2)
    assert abs(fit.order - ref.slope) < 1e-12
    assert abs(fit.stderr - ref.stderr) < 1e-12
    assert abs(fit.ci_low - (ref.slope - t * ref.stderr)) < 1e-9
    assert abs(fit.ci_high - (ref.slope + t * ref.stderr)) < 1e-9


def test_window_drops_pre_asymptotic_points_and_the_round_off_floor():
    h = 0.5 / 2 ** np.arange(10)
    e = 1e-3 * h**4 * (1 + 20 * h**2) + 1e-14  # pre-asymptotic at large h, floor at small h
    fit = wb.analysis.fit_order(h, e)
    assert abs(fit.order - 4.0) < 0.1
    assert fit.floor is not None and fit.floor < 1e-12
    assert not fit.used[0]  # the smallest step sits on the floor
    assert fit.pre_asymptotic >= 1


def test_errors():
    with pytest.raises(ValueError, match="needs at least 3 step sizes"):
        wb.analysis.fit_order([0.1, 0.05], [1e-2, 2.5e-3])
    with pytest.raises(ValueError, match="3 steps but 2 errors"):
        wb.analysis.fit_order([0.1, 0.05, 0.025], [1e-2, 2.5e-3])
    with pytest.raises(ValueError, match="finite and > 0"):
        wb.analysis.fit_order([0.1, -0.05, 0.025], [1e-2, 2.5e-3, 1e-4])
    with pytest.raises(ValueError, match="a run diverged"):
        wb.analysis.fit_order([0.1, 0.05, 0.025], [np.nan, 2.5e-3, 1e-4])
    with pytest.raises(ValueError, match="share one slope"):
        wb.analysis.fit_order([0.1, 0.05, 0.025, 0.0125], [1.0, 1e-1, 5e-2, 1e-5])
