r"""Summaries of particle statistics over time (docs/particles.md): when one cluster forms, the
plateaus of a cluster-count series (metastability, Fig. 4) and their medians over random starts.
The rate of an exponential trend is `workbench.analysis._exponential.exponential_fit`. NumPy in, NumPy out.
"""

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from ._diagnostics import _check_series

__all__ = [
    "CountSummary",
    "Plateau",
    "StartsSummary",
    "plateaus",
    "summarize_counts",
    "summarize_starts",
    "time_to_one_cluster",
]


# ----------------------------------------------------------------------------------------------
# time series of cluster counts


def time_to_one_cluster(
    ts: Float[ArrayLike, " T"], counts: Int[ArrayLike, " T"]
) -> Float[Array, ""]:
    r"""First saved time from which the cluster count is 1 and stays 1 until the last saved time.

    $$t_1 = \min\{t_k : N(t_m) = 1 \text{ for all } m \ge k\}.$$

    "Stays" refers to the saved window only: a count that returns to 1 after splitting counts from
    its last arrival. **Convention:** `inf` when the last count is not 1 (no collapse observed by
    `ts[-1]`), so that the result can be averaged with `isfinite` masks or compared with `<`.
    jit- and vmap-compatible (batch over starts with `jax.vmap`).

    **Arguments:**

    - `ts`: saved times, shape `(T,)`, non-decreasing.
    - `counts`: cluster counts at those times, shape `(T,)` (e.g. `vmap(cluster_count)(xs)`).

    **Returns:**

    A float scalar: a time from `ts`, or `inf`.
    """
    ts, counts = jnp.asarray(ts), jnp.asarray(counts)
    _check_series(ts, counts)
    one = counts == 1
    # suffix[k] = all(one[k:]): a reversed cumulative AND.
    suffix = jnp.flip(jnp.cumprod(jnp.flip(one).astype(jnp.int32)) > 0)
    first = jnp.argmax(suffix)
    ts = ts.astype(jnp.result_type(ts.dtype, float))
    return jnp.where(suffix[-1], ts[first], jnp.inf)


class Plateau(NamedTuple):
    """A maximal time interval with a constant cluster count (see `plateaus`)."""

    start: float
    end: float
    count: int

    @property
    def duration(self) -> float:
        return self.end - self.start


def plateaus(ts: Float[ArrayLike, " T"], counts: Int[ArrayLike, " T"]) -> list[Plateau]:
    r"""Maximal intervals of constant cluster count (metastable states; NumPy post-processing).

    A run of saved samples $a, …, b$ with the same count $N$ (and a different count, or the end of
    the series, on both sides) becomes `Plateau(start=ts[a], end=ts[b + 1], count=N)`: the interval is
    closed on the left and ends at the first saved time where the count differs, so consecutive
    plateaus tile $[t_0, t_{T-1}]$ and their durations sum to $t_{T-1} - t_0$. The last plateau ends
    at `ts[-1]`. The true switching time lies in $(t_b, t_{b+1}]$; refine `ts` to locate it better.
    Long plateaus with count $> 1$ are the metastable multi-cluster states of Fig. 4.

    Not jit-compatible: the number of plateaus is data dependent. Apply it to concrete arrays.

    **Arguments:**

    - `ts`: saved times, shape `(T,)`, non-decreasing.
    - `counts`: cluster counts, shape `(T,)`.

    **Returns:**

    A list of `Plateau(start, end, count)` in time order (`.duration` gives `end - start`).
    """
    ts, counts = np.asarray(ts, dtype=float), np.asarray(counts)
    _check_series(ts, counts)
    if np.any(np.diff(ts) < 0):
        raise ValueError("ts must be non-decreasing (saved times in order).")
    if not np.all(counts == np.round(counts)):
        raise ValueError("counts must be integers (cluster counts).")
    counts = counts.astype(int)
    change = np.flatnonzero(counts[1:] != counts[:-1]) + 1  # first index of every new run
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(ts) - 1]])
    return [Plateau(float(ts[a]), float(ts[b]), int(counts[a])) for a, b in zip(starts, ends)]


@dataclasses.dataclass(frozen=True)
class CountSummary:
    """The metastability summary of one cluster-count series (see `summarize_counts`)."""

    plateaus: list[Plateau]
    """All plateaus, in time order (they tile `[ts[0], ts[-1]]`)."""
    time_with: dict[int, float]
    """Total time with exactly k clusters, for k = min_count … max_count."""
    longest_count: int | None
    """Count of the longest plateau with min_count ≤ count ≤ max_count (None if there is none)."""
    longest_start: float | None
    longest_end: float | None
    longest_duration: float | None
    longest_censored: bool
    """Whether that plateau is still running at `ts[-1]` (its duration is then a lower bound)."""
    time_to_one: float | None
    """`time_to_one_cluster`, or None when the last count is not 1."""
    final_count: int


def summarize_counts(ts, counts, *, min_count: int = 2, max_count: int = 6) -> CountSummary:
    r"""Summarize a cluster-count series: its plateaus, the longest *metastable* plateau (a count
    in `[min_count, max_count]`, which leaves out the initial unclustered phase) and whether it is
    censored by the end of the series, the time spent with each count, and the time to one cluster.

    NumPy post-processing of concrete arrays (as `plateaus`; not jit-compatible).

    **Arguments:**

    - `ts`: saved times, shape `(T,)`, non-decreasing.
    - `counts`: cluster counts at those times, shape `(T,)`.
    - `min_count`, `max_count`: the counts that make a plateau metastable (`2 ≤ min_count ≤
      max_count`).

    **Returns:** a `CountSummary`. Ties between equally long plateaus go to the earliest.
    """
    if not 2 <= min_count <= max_count:
        raise ValueError(
            f"summarize_counts: need 2 <= min_count <= max_count; got min_count={min_count!r}, "
            f"max_count={max_count!r}."
        )
    pls = plateaus(ts, counts)
    counts = np.asarray(counts)
    multi = [p for p in pls if min_count <= p.count <= max_count]
    longest = max(multi, key=lambda p: p.duration) if multi else None
    end = float(np.asarray(ts)[-1])
    return CountSummary(
        plateaus=pls,
        time_with={
            k: float(sum(p.duration for p in pls if p.count == k))
            for k in range(min_count, max_count + 1)
        },
        longest_count=None if longest is None else longest.count,
        longest_start=None if longest is None else longest.start,
        longest_end=None if longest is None else longest.end,
        longest_duration=None if longest is None else longest.duration,
        # The last plateau ends at ts[-1] by construction: its true end is unobserved.
        longest_censored=bool(longest is not None and longest.end >= end and counts[-1] >= 2),
        # = time_to_one_cluster: the start of the last plateau when its count is 1.
        time_to_one=pls[-1].start if pls[-1].count == 1 else None,
        final_count=int(counts[-1]),
    )


@dataclasses.dataclass(frozen=True)
class StartsSummary:
    """`CountSummary`s of several starts, summarized (see `summarize_starts`)."""

    median_time_with: dict[int, float]
    median_longest_duration: float | None
    """Median over the starts that have a metastable plateau (None if none has)."""
    min_longest_duration: float | None
    max_longest_duration: float | None
    longest_count_mode: int | None
    """The most common count of the longest metastable plateaus (the smaller one on ties)."""
    longest_counts: list[int]
    """The count of each start's longest metastable plateau, starts without one left out."""
    num_censored: int
    """Starts whose longest metastable plateau is still running at the end (lower bounds)."""
    fraction_collapsed: float
    """Share of the starts at one cluster at the end."""
    median_time_to_one: float | None
    """Median time to one cluster, a start that has not collapsed counting as +inf; None when
    that median is infinite (at most half the starts collapsed)."""


def summarize_starts(summaries: Sequence[CountSummary]) -> StartsSummary:
    """Medians and ranges over starts of their `summarize_counts` summaries (same `min_count`,
    `max_count` and times), e.g. one `StartsSummary` per β of a metastability study.

    **Arguments:** `summaries`: one `CountSummary` per start (at least one).

    **Returns:** a `StartsSummary`.
    """
    if len(summaries) == 0:
        raise ValueError("summarize_starts: give at least one CountSummary (one per start).")
    durations = [r.longest_duration for r in summaries if r.longest_duration is not None]
    counts = [r.longest_count for r in summaries if r.longest_count is not None]
    t_one = float(
        np.median([np.inf if r.time_to_one is None else r.time_to_one for r in summaries])
    )
    mode = max(sorted(Counter(counts).items()), key=lambda kv: kv[1])[0] if counts else None
    return StartsSummary(
        median_time_with={
            k: float(np.median([r.time_with[k] for r in summaries])) for k in summaries[0].time_with
        },
        median_longest_duration=float(np.median(durations)) if durations else None,
        min_longest_duration=float(np.min(durations)) if durations else None,
        max_longest_duration=float(np.max(durations)) if durations else None,
        longest_count_mode=mode,
        longest_counts=counts,
        num_censored=sum(r.longest_censored for r in summaries),
        fraction_collapsed=sum(r.time_to_one is not None for r in summaries) / len(summaries),
        median_time_to_one=t_one if np.isfinite(t_one) else None,
    )
