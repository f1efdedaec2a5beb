"""Library helpers the particle studies share: `exponential_fit` (an exponential trend)
against exact exponentials and the closed-form least-squares slope; `summarize_counts` and
`summarize_starts` (metastability summaries of cluster-count series) on hand-made series."""

import math

import numpy as np
import pytest

from workbench.analysis._exponential import exponential_fit
from workbench.particles import Plateau, time_to_one_cluster
from workbench.particles._time_series import summarize_counts, summarize_starts


def test_exact_exponential_decay_and_growth():
    t = np.linspace(0.0, 10.0, 21)
    fit = exponential_fit(t, 3.0 * np.exp(-2.0 * t))
    assert fit.rate == pytest.approx(-2.0, abs=1e-12)
    assert fit.intercept == pytest.approx(math.log(3.0), abs=1e-12)
    assert fit.num_used == t.size
    beta = np.array([2.0, 3.0, 5.0])
    grow = exponential_fit(beta, 0.5 * np.exp(1.5 * beta))
    assert grow.rate == pytest.approx(1.5, abs=1e-12)
    assert grow.intercept == pytest.approx(math.log(0.5), abs=1e-12)


def test_matches_closed_form_least_squares(rng):
    x = np.sort(rng.uniform(0.0, 5.0, 30))
    y = np.exp(0.7 - 1.3 * x + 0.05 * rng.standard_normal(30))
    ly = np.log(y)
    slope = np.sum((x - x.mean()) * (ly - ly.mean())) / np.sum((x - x.mean()) ** 2)
    fit = exponential_fit(x, y)
    assert fit.rate == pytest.approx(slope, rel=1e-12)
    assert fit.intercept == pytest.approx(ly.mean() - slope * x.mean(), rel=1e-10)


def test_window_keeps_only_the_late_exponential_range():
    # e^{-2t} above a round-off floor of 1e-16: the window [1e-14, 1e-3] sees the pure
    # exponential only, so the rate is exact; without a window the floor bends the fit.
    t = np.arange(0.0, 40.0, 0.25)
    h = np.maximum(np.exp(-2.0 * t), 1e-16)
    fit = exponential_fit(t, h, window=(1e-14, 1e-3))
    assert fit.rate == pytest.approx(-2.0, abs=1e-10)
    inside = (h >= 1e-14) & (h <= 1e-3)
    assert fit.num_used == int(inside.sum()) == 51
    assert exponential_fit(t, h).rate > -1.5


def test_too_few_points_give_nan_not_an_error():
    t = np.arange(5.0)
    h = np.exp(-t)  # 1 ... 0.018: nothing in [1e-20, 1e-6]
    fit = exponential_fit(t, h, window=(1e-20, 1e-6))
    assert math.isnan(fit.rate) and math.isnan(fit.intercept) and fit.num_used == 0
    fit = exponential_fit(t, h, min_points=6)
    assert math.isnan(fit.rate) and fit.num_used == 5
    # Two usable points at one x: no slope.
    assert math.isnan(exponential_fit([1.0, 1.0], [1.0, 2.0]).rate)


def test_nonpositive_and_nonfinite_values_are_left_out():
    t = np.arange(6.0)
    y = np.exp(-0.5 * t)
    y_bad = y.copy()
    y_bad[[1, 3, 4]] = [0.0, -1.0, np.nan]
    fit = exponential_fit(t, y_bad)
    assert fit.num_used == 3
    assert fit.rate == pytest.approx(-0.5, abs=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"x": [0.0, 1.0], "y": [1.0]}, "same length"),
        ({"x": [[0.0, 1.0]], "y": [[1.0, 2.0]]}, "1-D"),
        ({"window": (1e-6, 1e-20)}, "0 < low < high"),
        ({"window": (0.0, 1.0)}, "0 < low < high"),
        ({"window": 1e-6}, "pair"),
        ({"min_points": 1}, "min_points=1"),
        ({"min_points": 2.0}, "min_points=2.0"),
    ],
)
def test_invalid_arguments_raise(kwargs, match):
    args = {"x": [0.0, 1.0, 2.0], "y": [1.0, 0.5, 0.25], **kwargs}
    with pytest.raises(ValueError, match=match):
        exponential_fit(args.pop("x"), args.pop("y"), **args)


# ----------------------------------------------------------------------------------------------
# summarize_counts / summarize_starts (metastability summaries of cluster-count series)


def _series():
    # 8 clusters on [0, 1), 3 on [1, 4), 2 on [4, 10), then 1 from t = 10 to the end at 12.
    ts = np.array([0.0, 1.0, 2.0, 4.0, 6.0, 10.0, 12.0])
    counts = np.array([8, 3, 3, 2, 2, 1, 1])
    return ts, counts


def test_summarize_counts_hand_made_series():
    ts, counts = _series()
    s = summarize_counts(ts, counts, max_count=6)
    assert s.plateaus == [
        Plateau(0.0, 1.0, 8),
        Plateau(1.0, 4.0, 3),
        Plateau(4.0, 10.0, 2),
        Plateau(10.0, 12.0, 1),
    ]
    # 8 clusters is above max_count: the initial phase is not metastable.
    assert s.time_with == {2: 6.0, 3: 3.0, 4: 0.0, 5: 0.0, 6: 0.0}
    assert (s.longest_count, s.longest_start, s.longest_end, s.longest_duration) == (
        2,
        4.0,
        10.0,
        6.0,
    )
    assert not s.longest_censored
    assert s.time_to_one == float(time_to_one_cluster(ts, counts)) == 10.0
    assert s.final_count == 1
    # max_count = 8 lets the initial phase count; min_count = 3 drops the 2-cluster plateau.
    assert summarize_counts(ts, counts, min_count=3, max_count=8).longest_count == 3


def test_summarize_counts_censored_and_without_plateau():
    ts = np.array([0.0, 1.0, 5.0, 20.0])
    s = summarize_counts(ts, np.array([9, 3, 3, 3]))
    assert s.longest_count == 3 and s.longest_duration == 19.0 and s.longest_censored
    assert s.time_to_one is None and s.final_count == 3
    s = summarize_counts(ts, np.array([9, 9, 1, 1]))  # straight from 9 to 1
    assert s.longest_count is None and s.longest_duration is None and not s.longest_censored
    assert s.time_to_one == 5.0
    with pytest.raises(ValueError, match="min_count"):
        summarize_counts(ts, np.array([9, 9, 1, 1]), min_count=1)


def test_summarize_starts_medians_and_censoring():
    ts = np.array([0.0, 1.0, 5.0, 20.0])
    runs = [
        summarize_counts(ts, np.array([9, 2, 1, 1])),  # 2 clusters for 4, one cluster at t = 5
        summarize_counts(ts, np.array([9, 3, 3, 3])),  # 3 clusters from t = 1, censored
        summarize_counts(ts, np.array([9, 2, 2, 1])),  # 2 clusters for 19, one cluster at t = 20
    ]
    s = summarize_starts(runs)
    assert s.longest_counts == [2, 3, 2] and s.longest_count_mode == 2
    assert (s.median_longest_duration, s.min_longest_duration, s.max_longest_duration) == (
        19.0,
        4.0,
        19.0,
    )
    assert s.num_censored == 1
    assert s.fraction_collapsed == pytest.approx(2 / 3)
    assert s.median_time_to_one == 20.0  # median of (5, inf, 20)
    assert s.median_time_with[2] == 4.0 and s.median_time_with[3] == 0.0
    # Two of three never collapse: the median time to one cluster is infinite -> None.
    s = summarize_starts([runs[1], runs[1], runs[0]])
    assert s.median_time_to_one is None
    with pytest.raises(ValueError, match="at least one"):
        summarize_starts([])
