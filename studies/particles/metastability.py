"""Do particles on the circle stay in multi-cluster states for a long time before they merge, the
longer the larger β (paper B, Fig. 4)?

Paper B, Fig. 4: in d = 2, single runs of SA at β = 4 and β = 9 hold 2 and 3 clusters for a long
time before the clusters merge. This study runs SA (Q = K = V = I) on the circle from uniform
random starts, for several β and seeds, over a long horizon saved on a logarithmic time grid,
counts the clusters (components of ⟨x_i, x_j⟩ > 1 − 10⁻⁴ as the authors' threshold, and the
authors' rank count), cuts the count series into plateaus (maximal intervals of constant count)
and reports the longest multi-cluster plateau, its count, and the time to one cluster against β.

Integrator: projected RK4 with dt = 0.5 (cheap: within a tight cluster SA contracts at rate ≈ 1,
well inside RK4's stability interval). The authors' integrator (projected Euler, dt = 0.1) is
rerun on the featured β up to `check_t1` and the two count series are compared.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
from studies._toolkit.config import (
    check,
    check_choices,
    check_devices,
    check_multiple,
    check_nonempty,
    check_positive,
    check_range,
    check_seed,
    chosen_devices,
    steps_in,
)
from studies._toolkit.fields import (
    Betas,
    Dimension,
    Dt,
    FinalTime,
    Integrator,
    ParticleFields,
    Particles,
    defaults,
)
from studies._toolkit.report import markdown_table, new_figure, progress
from workbench.analysis._exponential import exponential_fit
from workbench.particles._starts import uniform_sphere
from workbench.particles._time_series import (
    CountSummary,
    StartsSummary,
    summarize_counts,
    summarize_starts,
)

NAME = "metastability"
SUMMARY = (
    "Paper B's Fig. 4: cluster count over log t in d = 2 (β = 4, 9); plateau lengths against β."
)

CHECK_DT = 0.1
"""The step of the cross-check with the authors' projected Euler."""


@dataclasses.dataclass(frozen=True)
@defaults(betas=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0), dt=0.5, d=2, t1=100000.0)
class Config(FinalTime, Dimension, Integrator, Dt, Betas, Particles, ParticleFields):
    featured_betas: tuple[float, ...] = (4.0, 9.0)
    """The β of Fig. 4, plotted in detail and cross-checked with the authors' integrator."""
    num_saves: int = 400
    """Saved times: about this many, log-spaced in [dt, t1] (rounded to the step grid), plus 0."""
    threshold: float = 1e-4
    """Clusters = components of ⟨x_i, x_j⟩ > 1 − threshold (the authors use 1e-4)."""
    max_count: int = 6
    """Metastable plateaus have 2 ≤ count ≤ max_count (excludes the initial, unclustered phase)."""
    long_time: float = 100.0
    """The verdict calls a median longest metastable plateau long from this duration (SA
    contracts within a cluster at rate ≈ 1)."""
    check_t1: float = 1e4
    """Horizon of the cross-check with projected Euler, dt = 0.1 (0 disables it)."""
    min_agreement: float = 0.9
    """The verdict needs the cross-check's count series to agree at this share of saved times."""

    def __post_init__(self):
        check_devices(self)
        check_range(self, "n", 2)
        check_range(self, "d", 2)
        check_nonempty(self, "betas", "featured_betas")
        check_positive(self, "betas", allow_zero=True)
        check_choices(self, "featured_betas", self.betas)
        check_range(self, "num_starts", 1)
        check_positive(self, "dt", "t1", "threshold", "long_time")
        check_multiple(self, "t1", of="dt")
        check_choices(self, "integrator", wb.registry.SPHERE_INTEGRATORS)
        check_range(self, "num_saves", 2)
        check_range(self, "threshold", 0, 2, low_open=True)
        check_range(self, "max_count", 2, self.n)
        check_range(self, "check_t1", 0, self.t1)
        ok = self.check_t1 == 0 or steps_in(self.check_t1, CHECK_DT) is not None
        check(self, "check_t1", ok, f"0 (off) or a positive whole multiple of {CHECK_DT}")
        check_range(self, "min_agreement", 0, 1)
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the starts, one compiled
        call over the starts at one β — per start its states at the `T ≤ num_saves + 1` saved times
        with, per time, the component and rank counts' n×n matrices and the SVD's work (about `4·n²
        + 2·n·d` entries: XLA's memory analysis measures 3.2·n²), and its integrator's state and
        attention — and the kept counts and ranks `(betas, num_starts, T)` with the comparisons made
        of them."""
        from studies._toolkit import memory as M

        times = min(self.num_saves, round(self.t1 / self.dt)) + 1
        n, d, ns = self.n, self.d, self.num_starts
        per_start = M.array_bytes(times, 4 * n * n + 2 * n * d) + M.particle_trajectory_bytes(
            n, d, integrator=self.integrator
        )
        kept = 6 * M.array_bytes(len(self.betas), ns, times)
        return 2 * M.array_bytes(ns, n, d) + ns * per_start + kept


def smoke_config() -> Config:
    return Config(betas=(1.0, 4.0, 9.0), num_starts=2, t1=2000.0, num_saves=120, check_t1=200.0)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """The authors' rank count against the component count over all saved (β, start, t)."""

    fraction_equal: float
    fraction_equal_metastable: float
    max_rank_minus_components: int
    fraction_equal_featured: dict[str, float]


@dataclasses.dataclass(frozen=True)
class CrossRow:
    beta: float
    fraction_equal: float
    final_counts_euler: list[int]
    final_counts_main: list[int]


@dataclasses.dataclass(frozen=True)
class CrossCheck:
    t1: float
    dt: float
    integrator: str
    rows: list[CrossRow]


@dataclasses.dataclass(frozen=True)
class GrowthFit:
    """log(median longest plateau) = intercept + rate_per_beta · β over `betas` (β ≥ 2, medians
    with fewer than half the starts censored)."""

    rate_per_beta: float
    intercept: float
    betas: list[float]


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    ts: np.ndarray
    t1: float
    counts: np.ndarray
    """(β, start, t): component counts."""
    counts_rank: np.ndarray
    """(β, start, t): the authors' rank counts."""
    angles: dict[str, np.ndarray]
    """Featured β (by str(β)) → the angles (t, n) of start 0."""
    runs: dict[str, list[CountSummary]]
    """str(β) → the summary of each start's count series."""
    per_beta: dict[str, StartsSummary]
    """str(β) → those summaries over the starts."""
    rank_vs_components: Agreement
    cross_check: CrossCheck | None
    growth_fit: GrowthFit | None
    num_devices_used: int = 1
    """Devices the starts were spread over (`wb.map_cells`; the numbers do not depend on it)."""


# ----------------------------------------------------------------------------------------------
# computation


def _log_grid(t1: float, dt: float, num: int) -> np.ndarray:
    """About `num` log-spaced multiples of `dt` in [dt, t1], plus 0, sorted and unique."""
    k = np.unique(np.round(np.geomspace(1.0, t1 / dt, num)).astype(np.int64))
    return np.concatenate([[0.0], k * dt])


def _counts(beta, x0, *, dt, t1, save_ts, integrator, threshold):
    """Cluster counts (components, rank) and the angles at `save_ts` for one start."""
    xs = wb.particles.simulate(
        wb.particles.SA(beta), x0, t1=t1, dt=dt, save_ts=save_ts, integrator=integrator
    )
    comp = jax.vmap(functools.partial(wb.particles.cluster_count, threshold=threshold))(xs)
    rank = jax.vmap(functools.partial(wb.particles.cluster_count_rank, threshold=threshold))(xs)
    # Angles on the circle (for d > 2, the angle of the projection on the first two axes).
    return comp, rank, jnp.arctan2(xs[..., 1], xs[..., 0])


def _batched(config: Config, *, dt, t1, save_ts, integrator):
    run = functools.partial(
        _counts, dt=dt, t1=t1, save_ts=save_ts, integrator=integrator, threshold=config.threshold
    )
    # Over the starts, cut over the devices; β is traced (one compile).
    return wb.map_cells(
        jax.vmap(run, in_axes=(None, 0)),
        cells=(False, True),
        devices=chosen_devices(config.devices),
    )


def _fit_growth(config: Config, per_beta: dict[str, StartsSummary]) -> GrowthFit | None:
    """Exponential fit of the median longest plateau against β over β ≥ 2, uncensored medians."""
    pts = [
        (beta, p.median_longest_duration)
        for beta, p in zip(config.betas, per_beta.values())
        if beta >= 2 and p.median_longest_duration and p.num_censored <= config.num_starts // 2 - 1
    ]
    if len(pts) < 3:
        return None
    b, dur = np.array(pts).T
    fit = exponential_fit(b, dur)
    return GrowthFit(fit.rate, fit.intercept, b.tolist())


def _cross_check(config: Config, x0, ts, comp) -> CrossCheck:
    """Counts with the authors' projected Euler, dt = 0.1, against the main run, up to check_t1."""
    # Every saved time of the main grid is a multiple of its dt; here it must be one of 0.1.
    keep = (ts <= config.check_t1 + 1e-9) & (np.abs(np.round(ts / CHECK_DT) * CHECK_DT - ts) < 1e-9)
    ts_check = ts[keep]
    run = _batched(
        config,
        dt=CHECK_DT,
        t1=config.check_t1,
        save_ts=ts_check,
        integrator=wb.registry.SPHERE_INTEGRATORS["euler"],
    )
    rows = []
    for beta in config.featured_betas:
        c = np.asarray(run(jnp.asarray(beta, jnp.float64), x0)[0])
        main_c = comp[config.betas.index(beta)][:, keep]
        rows.append(
            CrossRow(beta, float(np.mean(c == main_c)), c[:, -1].tolist(), main_c[:, -1].tolist())
        )
    return CrossCheck(config.check_t1, CHECK_DT, "ProjectedEuler", rows)


def compute(config: Config) -> Results:
    t1 = steps_in(config.t1, config.dt) * config.dt
    ts = _log_grid(t1, config.dt, config.num_saves)
    rng = np.random.default_rng(config.seed)
    x0_np = uniform_sphere(rng, config.num_starts, config.n, config.d)
    comp = np.zeros((len(config.betas), config.num_starts, ts.size), dtype=np.int64)
    rank = np.zeros_like(comp)
    angles = {}
    with jax.enable_x64(True):
        x0 = jnp.asarray(x0_np)
        integrator = wb.registry.SPHERE_INTEGRATORS[config.integrator]
        run = _batched(config, dt=config.dt, t1=t1, save_ts=ts, integrator=integrator)
        for b, beta in enumerate(progress(config.betas, desc=NAME)):
            c, r, a = run(jnp.asarray(beta, jnp.float64), x0)
            comp[b], rank[b] = np.asarray(c), np.asarray(r)
            if beta in config.featured_betas:
                angles[str(beta)] = np.asarray(a[0])  # first start: (T, n)
        cross = _cross_check(config, x0, ts, comp) if config.check_t1 else None

    runs = [
        [summarize_counts(ts, c, max_count=config.max_count) for c in comp[b]]
        for b in range(len(config.betas))
    ]
    per_beta = {str(beta): summarize_starts(r) for beta, r in zip(config.betas, runs)}
    equal, clustered = comp == rank, (comp >= 2) & (comp <= config.max_count)
    agreement = Agreement(
        fraction_equal=float(equal.mean()),
        fraction_equal_metastable=float(equal[clustered].mean()) if clustered.any() else np.nan,
        max_rank_minus_components=int(np.max(rank - comp)),
        fraction_equal_featured={
            str(beta): float(equal[config.betas.index(beta)].mean())
            for beta in config.featured_betas
        },
    )
    return Results(
        config=config,
        num_devices_used=len(chosen_devices(config.devices)),
        ts=ts,
        t1=t1,
        counts=comp,
        counts_rank=rank,
        angles=angles,
        runs={str(beta): runs[b] for b, beta in enumerate(config.betas)},
        per_beta=per_beta,
        rank_vs_components=agreement,
        cross_check=cross,
        growth_fit=_fit_growth(config, per_beta),
    )


# ----------------------------------------------------------------------------------------------
# verdict and report


def _fmt(x, spec=".3g") -> str:
    return "—" if x is None else format(x, spec)


def verdict(results: Results) -> str:
    c = results.config
    featured = {beta: results.per_beta[str(beta)] for beta in c.featured_betas}
    long = [p for p in featured.values() if (p.median_longest_duration or 0.0) >= c.long_time]
    parts = [
        f"The median longest metastable plateau (2–{c.max_count} clusters) lasts "
        + ", ".join(
            f"{_fmt(p.median_longest_duration)} at β = {beta:g} ({p.num_censored}/{c.num_starts} "
            f"starts censored at t1 = {results.t1:g})"
            for beta, p in featured.items()
        )
        + f"; {len(long)} of {len(featured)} featured β reach {c.long_time:g} time units"
    ]
    ok = len(long) == len(featured)
    beta = min(c.betas)
    base = results.per_beta[str(beta)]
    if beta not in c.featured_betas:
        short = (base.median_longest_duration or 0.0) < c.long_time
        ok = ok and short
        parts.append(
            f"the smallest β = {beta:g} holds {_fmt(base.median_longest_duration)} "
            f"({'below' if short else 'also at or above'} it)"
        )
    fit = results.growth_fit
    if fit is not None:
        ok = ok and fit.rate_per_beta > 0
        parts.append(
            f"over β ∈ [{min(fit.betas):g}, {max(fit.betas):g}] the median grows like "
            f"exp({fit.rate_per_beta:.2f} β) (uncensored medians)"
        )
    if results.cross_check is not None:
        agree = [r.fraction_equal for r in results.cross_check.rows]
        ok = ok and min(agree) >= c.min_agreement
        parts.append(
            f"the authors' projected Euler (dt = {CHECK_DT}) gives the same counts at "
            + ", ".join(f"{a:.1%}" for a in agree)
            + f" of the saved times up to t = {results.cross_check.t1:g} "
            f"(≥ {c.min_agreement:.0%} needed)"
        )
    word = "Yes" if ok else ("Partly" if long else "No")
    return f"{word}. " + "; ".join(parts) + "."


def _time_in_states(p: StartsSummary, runs: list[CountSummary], t1: float) -> str:
    """How long the runs sit with 2, 3, … clusters (median under 10 time units left out)."""
    parts = [
        f"{k} clusters in {sum(r.time_with[k] > 0 for r in runs)}/{len(runs)} starts for a "
        f"median {_fmt(med)}"
        for k, med in p.median_time_with.items()
        if med >= 10
    ]
    still = sum(r.longest_censored for r in runs)
    tail = f"{still} still in a metastable state at t = {t1:g}" if still else "all merged by t1"
    return "; ".join(parts or ["no state held for a median ≥ 10"]) + f"; {tail}"


def report(results: Results) -> str:
    c, t1, agr = results.config, results.t1, results.rank_vs_components
    table = markdown_table(
        [
            "β",
            "longest metastable plateau: median duration (range)",
            "its count (per start)",
            "censored at t1",
            "median time with 2 / 3 / 4 clusters",
            "collapsed to 1 by t1",
            "median time to 1 cluster",
        ],
        [
            [
                beta,
                f"{_fmt(p.median_longest_duration)} "
                f"({_fmt(p.min_longest_duration)}–{_fmt(p.max_longest_duration)})",
                ", ".join(str(k) for k in p.longest_counts),
                f"{p.num_censored}/{c.num_starts}",
                " / ".join(_fmt(p.median_time_with.get(k)) for k in (2, 3, 4)),
                f"{p.fraction_collapsed:.0%}",
                _fmt(p.median_time_to_one) if p.median_time_to_one is not None else f"> {t1:g}",
            ]
            for beta, p in zip(c.betas, results.per_beta.values())
        ],
    )
    featured = []
    for beta in c.featured_betas:
        runs = results.runs[str(beta)]
        parts = [
            f"{r.longest_count} clusters on [{r.longest_start:.3g}, {r.longest_end:.3g}"
            f"{'+' if r.longest_censored else ''}]"
            if r.longest_count
            else "no metastable plateau"
            for r in runs
        ]
        p = results.per_beta[str(beta)]
        featured += [
            f"- β = {beta:g}: " + "; ".join(parts) + ".",
            f"  Time in each state: {_time_in_states(p, runs, t1)}.",
        ]
    lines = [
        f"SA on S^{c.d - 1}, n = {c.n}, Q = K = V = I, {c.num_starts} uniform random starts (the "
        f"same for every β), {c.integrator} (projected) with dt = {c.dt}, t ∈ [0, {t1:g}], "
        f"{results.ts.size} log-spaced saved times, float64. Clusters = connected components of "
        f"⟨x_i, x_j⟩ > 1 − {c.threshold:g}.",
        "",
        "**Longest metastable plateau per β**: a plateau is a maximal interval of constant count "
        f"between saved times; metastable = 2 to {c.max_count} clusters (this leaves out the "
        "initial, unclustered phase); censored = still running at t1, so a lower bound:",
        "",
        table,
        "",
        "**Featured β** (longest metastable plateau per start; `+` = still in it at t1):",
        "",
        *featured,
        "",
    ]
    fit = results.growth_fit
    if fit is not None:
        lines += [
            f"**Growth in β.** Least-squares fit of log(median longest plateau) over β ∈ "
            f"[{min(fit.betas):g}, {max(fit.betas):g}] (uncensored medians only): rate "
            f"{fit.rate_per_beta:.2f} per unit β, intercept {fit.intercept:.2f}. For comparison, "
            "the attention one cluster pays another is e^{β(⟨c_a, c_b⟩ − 1)} relative to "
            "itself, e^{−2β} for two antipodal clusters.",
            "",
        ]
    lines.append(
        f"**Rank count vs components.** The authors' rank count equals the component count at "
        f"{agr.fraction_equal:.1%} of all saved (β, start, t) and at "
        f"{agr.fraction_equal_metastable:.1%} of those in a metastable state (2–{c.max_count} "
        f"components); the largest excess of the rank is {agr.max_rank_minus_components} (the "
        "rank can exceed the component count only while a component is not a clique)."
    )
    cross = results.cross_check
    if cross is not None:
        desc = ", ".join(f"β = {r.beta:g}: {r.fraction_equal:.1%}" for r in cross.rows)
        lines += [
            "",
            f"**Integrator check.** Rerun with the authors' projected Euler, dt = {cross.dt}, up "
            f"to t = {cross.t1:g}: the count series agree with the main run at {desc} of the "
            "saved times.",
        ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# figures


def figures(results: Results) -> dict:
    figs = {"cluster_counts": _plot_counts(results)}
    if results.config.d == 2:
        figs["angles"] = _plot_angles(results)
    figs["plateaus_vs_beta"] = _plot_plateaus(results)
    return figs


def _featured_panels(results: Results):
    """One panel per featured β, sharing y, and the times with t = 0 moved onto the log axis."""
    n = len(results.config.featured_betas)
    fig, axes = new_figure(1, n, figsize=(5.0 * n, 3.8), squeeze=False, sharey=True)
    ts = results.ts
    return fig, axes[0], np.where(ts > 0, ts, ts[1] / 2)


def _plot_counts(results: Results):
    c = results.config
    fig, axes, t = _featured_panels(results)
    for ax, beta in zip(axes, c.featured_betas):
        b = c.betas.index(beta)
        for s in range(c.num_starts):
            label = f"components, one line per start ({c.num_starts})" if s == 0 else None
            ax.step(
                t, results.counts[b, s], where="post", color="C0", lw=1.2, alpha=0.45, label=label
            )
        rank = dict(where="post", color="k", ls=":", lw=1.0, label="rank count, start 0")
        ax.step(t, results.counts_rank[b, 0], **rank)
        ax.set(xscale="log", yscale="log", xlabel="time t", title=f"β = {beta:g}")
        ticks = [k for k in (1, 2, 3, 4, 6, 8, 16, 32, 64, 128) if k <= c.n]
        ax.set_yticks(ticks, [str(k) for k in ticks])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"number of clusters (⟨x_i, x_j⟩ > 1 − {c.threshold:g})")
    fig.suptitle(f"Cluster count over time, SA on the circle (d = {c.d}, n = {c.n})")
    return fig


def _plot_angles(results: Results):
    fig, axes, t = _featured_panels(results)
    for ax, beta in zip(axes, results.config.featured_betas):
        ax.plot(t, results.angles[str(beta)], ".", ms=1.2, color="C0")
        ax.set(xscale="log", xlabel="time t", title=f"β = {beta:g} (start 0)", ylim=(-np.pi, np.pi))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("angle θ_i (rad)")
    fig.suptitle(f"Particle angles over time, SA on the circle (n = {results.config.n}): Fig. 4")
    return fig


def _plot_plateaus(results: Results):
    c, t1 = results.config, results.t1
    runs = [results.runs[str(beta)] for beta in c.betas]
    fig, axes = new_figure(1, 3, figsize=(15.0, 4.2), squeeze=False)
    ax, ax3, ax2 = axes[0]

    def jitter(s):
        return (s - (c.num_starts - 1) / 2) * 0.04

    for beta, rb in zip(c.betas, runs):
        for s, r in enumerate(rb):
            if r.longest_duration is not None:
                ax.plot(
                    beta + jitter(s),
                    r.longest_duration,
                    "^" if r.longest_censored else "o",
                    color=f"C{min(r.longest_count, 9) - 1}",
                    mfc="none" if r.longest_censored else None,
                    ms=5,
                )
            if r.time_to_one is None:
                ax2.plot(beta + jitter(s), t1, "^", color="C3", mfc="none", ms=5)
            else:
                ax2.plot(beta + jitter(s), max(r.time_to_one, 1e-2), "o", color="C0", ms=4)
            for k in (2, 3):
                if r.time_with.get(k, 0) > 0:
                    ax3.plot(
                        beta + jitter(s), r.time_with[k], "o", color=f"C{k - 1}", ms=3, alpha=0.6
                    )
    med = [
        (beta, p.median_longest_duration)
        for beta, p in zip(c.betas, results.per_beta.values())
        if p.median_longest_duration
    ]
    if med:
        ax.plot(*zip(*med), "k-", lw=1, label="median over starts")
    for k in sorted({r.longest_count for rb in runs for r in rb if r.longest_count}):
        ax.plot([], [], "o", color=f"C{min(k, 9) - 1}", label=f"{k} clusters")
    ax.plot([], [], "^", color="gray", mfc="none", label=f"censored at t1 = {t1:g}")
    for k in (2, 3):
        med = [
            (beta, p.median_time_with[k])
            for beta, p in zip(c.betas, results.per_beta.values())
            if p.median_time_with.get(k)
        ]
        if med:
            ax3.plot(*zip(*med), "-", color=f"C{k - 1}", label=f"{k} clusters (line: median)")
    ax2.plot([], [], "o", color="C0", label="collapsed: time to one cluster")
    ax2.plot([], [], "^", color="C3", mfc="none", label=f"not collapsed by t1 = {t1:g}")
    for a, ylabel, title in (
        (ax, f"longest plateau, 2–{c.max_count} clusters", "Metastable plateau length against β"),
        (ax3, "total time with exactly k clusters", "Time spent in 2- and 3-cluster states"),
        (ax2, "time to one cluster", "Time to one cluster against β"),
    ):
        a.set(yscale="log", xlabel="β", ylabel=ylabel, title=title)
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=7)
    fig.suptitle(f"SA on the circle, n = {c.n}, {c.num_starts} starts per β")
    return fig
