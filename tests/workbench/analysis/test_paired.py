"""`workbench.analysis.paired_difference`: the exact McNemar p-value against SciPy's binomial
test, Newcombe's paired interval against published values and an independent computation, its
coverage, symmetry, and the validation of its arguments."""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from workbench.analysis import PairedDifference, mcnemar_p_value, paired_difference


def _pairs(both, only_b, only_a, neither):
    """Correctness arrays of `a` and `b` with the given 2 x 2 table (in a shuffled order: the
    order of the examples does not matter, only their pairing)."""
    a = np.r_[np.ones(both + only_a, bool), np.zeros(only_b + neither, bool)]
    b = np.r_[
        np.ones(both, bool), np.zeros(only_a, bool), np.ones(only_b, bool), np.zeros(neither, bool)
    ]
    order = np.random.default_rng(both + 7 * only_a + 11 * only_b).permutation(a.size)
    return a[order], b[order]


@pytest.mark.parametrize(
    "only_a, only_b",
    [(0, 0), (4, 0), (0, 4), (1, 1), (3, 1), (5, 12), (0, 1), (7, 7), (20, 40), (31, 260)],
)
def test_mcnemar_p_value_is_scipys_exact_binomial_test(only_a, only_b):
    r = paired_difference(*_pairs(50, only_b, only_a, 9))
    want = 1.0 if only_a + only_b == 0 else stats.binomtest(only_b, only_a + only_b, 0.5).pvalue
    assert (r.only_a_correct, r.only_b_correct) == (only_a, only_b)
    assert r.p_value == pytest.approx(want, rel=1e-12, abs=1e-300)
    assert mcnemar_p_value(only_a, only_b) == r.p_value == mcnemar_p_value(only_b, only_a)


def test_the_issues_example_four_images_lost_none_gained():
    """A refinement that loses 4 held-out images and gains none: p = 2 / 2**4 = 0.125, not
    significant, though the accuracy moved by 4 images."""
    r = paired_difference(*_pairs(9990, 0, 4, 6))
    assert r.p_value == 0.125
    assert r.difference == pytest.approx(-0.04, abs=1e-12)
    assert r.low < r.difference < r.high


def test_no_discordant_example_gives_p_one():
    a = np.array([1, 0, 1, 1, 0], dtype=np.int32)
    r = paired_difference(a, a.copy())
    assert r.p_value == 1.0 and (r.only_a_correct, r.only_b_correct) == (0, 0)


def test_newcombe_interval_matches_the_published_example():
    """Fagerland, Lydersen and Laake (2017), section 8.5 (Cavo et al. 2012, table
    [[59, 6], [16, 80]]): Newcombe square-and-add estimate -0.0621, 95 % CI -0.1186 to -0.0046.
    Their first margin (row) is our `b`."""
    r = paired_difference(*_pairs(59, 6, 16, 80))
    assert r.num_examples == 161
    assert r.difference == pytest.approx(100 * (6 - 16) / 161, abs=1e-12)
    assert round(r.difference / 100, 4) == -0.0621
    assert (round(r.low / 100, 4), round(r.high / 100, 4)) == (-0.1186, -0.0046)
    assert r.accuracy_a == pytest.approx(75 / 161) and r.accuracy_b == pytest.approx(65 / 161)


def _wilson_by_root_finding(x, n, z):
    """The Wilson interval as the roots of the score equation |p_hat - p| = z sqrt(p(1-p)/n)."""
    p_hat = x / n

    def score(p):
        return (p_hat - p) ** 2 - z * z * p * (1 - p) / n

    # p_hat is itself a root when it is 0 or 1: bracket the other root away from it
    inner = min(max(p_hat, 1e-12), 1 - 1e-12)
    low = 0.0 if x == 0 else optimize.brentq(score, 1e-300, inner, xtol=1e-15, rtol=1e-15)
    high = 1.0 if x == n else optimize.brentq(score, inner, 1 - 1e-16, xtol=1e-15, rtol=1e-15)
    return low, high


def _newcombe_reference(both, only_b, only_a, neither, confidence):
    """Newcombe (1998) method 10 written from the paper, with SciPy's normal quantile and the
    Wilson limits found by root finding: an independent computation of the interval."""
    n = both + only_b + only_a + neither
    z = stats.norm.ppf(1 - (1 - confidence) / 2)
    e, f = both + only_b, only_a + neither  # b's margin (the paper's first)
    g, h = both + only_a, only_b + neither  # a's margin
    p1, p2 = e / n, g / n
    l1, u1 = _wilson_by_root_finding(e, n, z)
    l2, u2 = _wilson_by_root_finding(g, n, z)
    if min(e, f, g, h) == 0:
        phi = 0.0
    else:
        num = both * neither - only_b * only_a
        num = max(num - n / 2, 0) if num > 0 else num
        phi = num / math.sqrt(e * f * g * h)
    d = p1 - p2
    delta = math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    eps = math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return 100 * (d - delta), 100 * (d + eps)


@pytest.mark.parametrize(
    "table",
    [(59, 6, 16, 80), (1, 1, 7, 12), (9990, 0, 4, 6), (40, 3, 0, 0), (0, 5, 2, 0), (12, 9, 2, 21)],
)
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_newcombe_interval_matches_an_independent_computation(table, confidence):
    r = paired_difference(*_pairs(*table), confidence=confidence)
    low, high = _newcombe_reference(*table, confidence)
    assert r.low == pytest.approx(low, abs=1e-9) and r.high == pytest.approx(high, abs=1e-9)
    assert r.low <= r.difference <= r.high and r.confidence == confidence


@pytest.mark.parametrize(
    "n, probs",
    [
        (400, (0.80, 0.07, 0.04, 0.09)),  # (both, only b, only a, neither): b 3 points better
        (1000, (0.90, 0.03, 0.02, 0.05)),
        (200, (0.70, 0.10, 0.10, 0.10)),
    ],
)
def test_the_95_interval_covers_the_true_difference(n, probs):
    """2000 simulated tables with a known difference: the 95 % interval covers it in 93-97 %
    of them (the binomial standard error of the coverage is 0.5 %: the band is +-4 of them)."""
    rng = np.random.default_rng(2)
    truth = 100 * (probs[1] - probs[2])
    hits = 0
    for counts in rng.multinomial(n, probs, size=2000):
        r = paired_difference(*_pairs(*map(int, counts)))
        hits += r.low <= truth <= r.high
    assert 0.93 <= hits / 2000 <= 0.97


@pytest.mark.parametrize("table", [(59, 6, 16, 80), (1, 1, 7, 12), (0, 5, 2, 0), (9990, 0, 4, 6)])
def test_swapping_a_and_b_negates_the_difference_and_the_interval(table):
    a, b = _pairs(*table)
    ab, ba = paired_difference(a, b), paired_difference(b, a)
    assert ba.difference == -ab.difference
    assert (ba.low, ba.high) == (-ab.high, -ab.low)
    assert (ba.only_a_correct, ba.only_b_correct) == (ab.only_b_correct, ab.only_a_correct)
    assert (ba.accuracy_a, ba.accuracy_b) == (ab.accuracy_b, ab.accuracy_a)
    assert ba.p_value == ab.p_value


@pytest.mark.parametrize("a", [np.ones(10, bool), np.zeros(10, bool), np.arange(10) % 3 == 0])
def test_identical_inputs_differ_by_nothing(a):
    r = paired_difference(a, a)
    assert r.difference == 0.0 and r.p_value == 1.0
    assert r.low <= 0.0 <= r.high
    assert r.accuracy_a == r.accuracy_b == a.mean()


def test_within_is_the_whole_interval_inside_plus_minus_points():
    r = PairedDifference(1000, 0.9, 0.905, 0.5, 0, 5, 0.0625, -0.2, 1.2, 0.95)
    assert r.within(1.2) and r.within(2) and not r.within(1.19) and not r.within(0.5)
    assert not PairedDifference(1000, 0.9, 0.9, 0.0, 0, 0, 1.0, -0.3, 0.1, 0.95).within(0.29)
    big = paired_difference(*_pairs(9990, 0, 4, 6))
    assert big.within(0.2) and not big.within(0.05)
    with pytest.raises(ValueError, match=r"PairedDifference.within: points=-1 must be"):
        r.within(-1)


def test_bad_arguments_are_refused_with_the_field_and_the_value():
    ok = np.array([True, False, True])
    with pytest.raises(ValueError, match=r"correct_a has shape \(0,\); it must be a non-empty"):
        paired_difference(np.array([], bool), np.array([], bool))
    with pytest.raises(ValueError, match=r"correct_b has shape \(3, 1\).*1-d array"):
        paired_difference(ok, ok[:, None])
    with pytest.raises(ValueError, match=r"correct_a holds 2; it must be .*booleans or 0/1"):
        paired_difference(np.array([0, 1, 2]), ok)
    with pytest.raises(ValueError, match=r"correct_b holds 0.5"):
        paired_difference(ok, np.array([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match=r"correct_a has dtype <U1"):
        paired_difference(np.array(["a", "b", "c"]), ok)
    with pytest.raises(ValueError, match=r"same length .* got 3 and 2"):
        paired_difference(ok, ok[:2])
    for bad in (0, 1, 1.5, -0.1, float("nan"), True):
        with pytest.raises(
            ValueError, match=r"paired_difference: confidence=.* must be a number in \(0, 1\)"
        ):
            paired_difference(ok, ok, confidence=bad)
    r = paired_difference([1, 0, 1], np.array([1.0, 1.0, 0.0]), confidence=np.float32(0.9))
    assert (r.only_a_correct, r.only_b_correct, r.confidence) == (1, 1, pytest.approx(0.9))
