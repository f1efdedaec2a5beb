r"""Paired comparison of two classifiers (or one model under two discretizations) on the same
examples: the exact McNemar test and a confidence interval for the difference of accuracies.

A claim such as "the accuracy stays within half a point under refinement" compares predictions
on the *same* held-out examples, so the two accuracies are correlated and a spread of two
accuracies says nothing about sampling error. `paired_difference` counts the discordant
examples (right under one, wrong under the other) and gives

- the exact two-sided McNemar p-value: under "no difference" each of the `m` discordant examples
  is equally likely to favour either side, so the smaller count `k` is Binomial(`m`, 1/2) and
  `p = min(1, 2 P(K <= k))`, summed in exact integer arithmetic (`math.comb`), no SciPy;
- Newcombe's hybrid score interval for the paired difference of proportions (Newcombe 1998,
  "Improved confidence intervals for the difference between binomial proportions based on
  paired data", Statistics in Medicine 17, 2635-2650, method 10; also Fagerland, Lydersen and
  Laake 2017, "Statistical Analysis of Contingency Tables", section 8.5, "Newcombe
  square-and-add"): the Wilson score intervals of the two accuracies, combined with the
  correlation `phi` of the 2 x 2 table. It is closed-form and deterministic, stays inside
  [-100, 100] points, is not degenerate when no example is discordant, and its coverage is close
  to nominal for the sizes of held-out sets (Newcombe 1998, table III).

`within(points)` is the verdict of "within x points": the whole interval lies in
`[-points, points]`.
"""

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from .._checks import number_in_range, positive_float

__all__ = ["PairedDifference", "mcnemar_p_value", "paired_difference"]


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """The paired comparison of `b` against `a` on the same examples (`paired_difference`).

    - `num_examples`: the number of examples compared.
    - `accuracy_a`, `accuracy_b`: the fraction of examples each gets right.
    - `difference`: `accuracy_b - accuracy_a` in points (x 100).
    - `only_a_correct`, `only_b_correct`: the discordant counts (a right and b wrong; a wrong and
      b right). `difference = 100 (only_b_correct - only_a_correct) / num_examples`.
    - `p_value`: the exact two-sided McNemar p-value (1 when no example is discordant).
    - `low`, `high`: Newcombe's hybrid score interval for the difference, in points.
    - `confidence`: the interval's confidence level.
    """

    num_examples: int
    accuracy_a: float
    accuracy_b: float
    difference: float
    only_a_correct: int
    only_b_correct: int
    p_value: float
    low: float
    high: float
    confidence: float

    def within(self, points: float) -> bool:
        """Whether the whole interval lies in `[-points, points]`: the difference is shown to be
        at most `points` points in either direction at this confidence."""
        points = positive_float(
            "points", points, owner="PairedDifference.within", allow_zero=True, numpy_scalars=True
        )
        return bool(-points <= self.low and self.high <= points)


def paired_difference(correct_a, correct_b, *, confidence: float = 0.95) -> PairedDifference:
    r"""Compare two sets of per-example correctness on the same examples.

    **Arguments:**

    - `correct_a`, `correct_b`: 1-d arrays of equal length, `True` (or 1) where the classifier
      gets the example right; entry `i` of both is the same example.
    - `confidence`: the level of the interval, in (0, 1).

    **Returns:** a `PairedDifference`: both accuracies, the difference `b - a` in points, the
    discordant counts, the exact McNemar p-value and Newcombe's interval (method 10) in points.

    **Raises:** `ValueError` naming the argument and the value when an array is not 1-d, not
    boolean or 0/1, empty, or the two lengths differ, or `confidence` is not in (0, 1).
    """
    a = _correctness("correct_a", correct_a)
    b = _correctness("correct_b", correct_b)
    if a.size != b.size:
        raise ValueError(
            f"paired_difference: correct_a and correct_b must have the same length (one entry "
            f"per example, the same examples); got {a.size} and {b.size}."
        )
    confidence = number_in_range(
        "confidence", confidence, 0.0, 1.0, owner="paired_difference", hint="e.g. 0.95"
    )
    n = int(a.size)
    both = int(np.sum(a & b))
    neither = int(np.sum(~a & ~b))
    only_a = int(np.sum(a & ~b))
    only_b = int(np.sum(~a & b))
    low, high = _newcombe(both, only_b, only_a, neither, confidence)
    return PairedDifference(
        num_examples=n,
        accuracy_a=(both + only_a) / n,
        accuracy_b=(both + only_b) / n,
        difference=100.0 * (only_b - only_a) / n,
        only_a_correct=only_a,
        only_b_correct=only_b,
        p_value=mcnemar_p_value(only_a, only_b),
        low=100.0 * low,
        high=100.0 * high,
        confidence=confidence,
    )


def mcnemar_p_value(only_a: int, only_b: int) -> float:
    """The exact two-sided McNemar p-value of `only_a` against `only_b` discordant examples:
    `min(1, 2 P(K <= min(only_a, only_b)))` for `K ~ Binomial(only_a + only_b, 1/2)`, summed in
    integers (exact up to the final division, which rounds once)."""
    m, k = only_a + only_b, min(only_a, only_b)
    if 2 * k >= m:  # includes m == 0: no discordant example is no evidence
        return 1.0
    term, tail = 1, 1  # C(m, 0)
    for i in range(k):
        term = term * (m - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / 2**m)


def _correctness(name: str, value) -> np.ndarray:
    """`value` as a 1-d boolean array, if it is a non-empty 1-d array of bools or of 0/1."""
    array = np.asarray(value)
    allowed = "a non-empty 1-d array of booleans or 0/1 (one entry per example)"
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"paired_difference: {name} has shape {array.shape}; it must be {allowed}."
        )
    if array.dtype == np.bool_:
        return array
    if array.dtype.kind in "iuf":
        bad = (array != 0) & (array != 1)
        if not bad.any():
            return array == 1
        shown = array[bad][0].item()
        raise ValueError(f"paired_difference: {name} holds {shown!r}; it must be {allowed}.")
    raise ValueError(f"paired_difference: {name} has dtype {array.dtype}; it must be {allowed}.")


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (Wilson 1927)."""
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def _newcombe(both: int, first_only: int, second_only: int, neither: int, confidence: float):
    """Newcombe's method 10 for `p1 - p2` of the paired table
    `[[both, first_only], [second_only, neither]]` (`p1 = (both + first_only) / n`): the
    square-and-add of the two Wilson intervals with the table's correlation, whose numerator
    `ad - bc` is shrunk by `n / 2` towards 0 when positive (zero when a margin is empty)."""
    n = both + first_only + second_only + neither
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    first, second = both + first_only, both + second_only
    p1, p2 = first / n, second / n
    l1, u1 = _wilson(first, n, z)
    l2, u2 = _wilson(second, n, z)
    phi = 0.0
    if 0 < first < n and 0 < second < n:
        a = both * neither - first_only * second_only
        a = a - n / 2 if a > n / 2 else (0.0 if a >= 0 else a)
        phi = a / (math.sqrt(first * (n - first)) * math.sqrt(second * (n - second)))
    theta = (first_only - second_only) / n

    def square_and_add(x, y):
        # x**2 + y**2 - 2 phi x y, written so that swapping x and y gives the same float
        return math.sqrt(max(0.0, (x * x + y * y) - 2.0 * phi * (x * y)))

    low = theta - square_and_add(p1 - l1, u2 - p2)
    high = theta + square_and_add(u1 - p1, p2 - l2)
    return max(-1.0, low), min(1.0, high)
