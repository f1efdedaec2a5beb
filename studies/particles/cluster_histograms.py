"""Does the mass of the pairwise inner products ⟨x_i, x_j⟩ of the particle model pile up at 1 over
time, as Fig. 1 of paper B sees over depth for a trained Transformer?

Fig. 1 of paper B histograms the pairwise inner products ⟨x_i, x_j⟩ (i ≠ j) of the normalized
hidden states of a trained Transformer (ALBERT) layer by layer and sees the mass pile up at 1 as
depth grows. Here the same statistic is computed for the particle model itself: SA dynamics
(Q = K = V = I) from uniform random starts on S^{d−1}, for several β and d, with time t in the
role of depth. The measure is the fraction of pairs near 1 (⟨x_i, x_j⟩ ≥ 1 − δ) over time, and
where it stalls: in a few tight clusters (metastable states, Fig. 4), or still forming in high d
where Thm 6.9's Γ_∞ curve puts the pile-up after t1.
"""

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
from studies._toolkit.config import (
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
    Delta,
    Dims,
    Dt,
    FinalTime,
    Integrator,
    ParticleFields,
    Particles,
    SaveEvery,
    defaults,
)
from studies._toolkit.report import markdown_table, new_figure, progress
from workbench.particles._starts import half_time, uniform_sphere

NAME = "cluster-histograms"
SUMMARY = "Paper B's Fig. 1 for the particle model: histograms of ⟨x_i, x_j⟩ over time (SA, several β, d)."

COLLAPSED = 0.99
"""A (β, d) case has piled up at 1 when this fraction of its pairs (mean over starts) is near 1."""


@dataclasses.dataclass(frozen=True)
@defaults(n=64, betas=(1.0, 4.0, 9.0), dims=(2, 8, 32, 128))
class Config(FinalTime, Dims, Delta, Integrator, SaveEvery, Dt, Betas, Particles, ParticleFields):
    bins: int = 100
    """Equal bins on [−1, 1]."""
    snapshot_times: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    """Times (in [0, t1]; the nearest saved time is used) shown as Fig. 1 style histograms."""
    histogram_beta: float = 4.0
    """The β of the Fig. 1 style grid (must be one of `betas`)."""

    def __post_init__(self):
        check_devices(self)
        check_range(self, "n", 2)
        check_nonempty(self, "betas", "dims", "snapshot_times")
        check_positive(self, "betas", allow_zero=True)
        check_range(self, "dims", 2)
        check_range(self, "num_starts", 1)
        check_positive(self, "t1", "dt", "save_every")
        check_multiple(self, "save_every", of="dt")
        check_multiple(self, "t1", of="save_every")
        check_choices(self, "integrator", wb.registry.SPHERE_INTEGRATORS)
        check_range(self, "bins", 2)
        check_range(self, "delta", 0, 1, low_open=True, high_open=True)
        check_range(self, "snapshot_times", 0, self.t1)
        check_choices(self, "histogram_beta", self.betas)
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the kept statistics —
        histogram counts and densities `(betas, dims, T, bins)`, fractions `(betas, dims,
        num_starts, T)` — and, for the largest d, the starts and one compiled call over every (β,
        start): per trajectory its integrator's state and attention and the pair products of its two
        statistics (the histogram and the fraction near 1, `_memory.particle_trajectory_bytes(...,
        pair_products=2)`), its `(T, bins)` counts twice (the scan's stack and the output) and their
        host copy, `T = t1 / save_every + 1`."""
        from studies._toolkit import memory as M

        times = round(self.t1 / self.save_every) + 1
        nb, nd, ns = len(self.betas), len(self.dims), self.num_starts
        kept = 2 * M.array_bytes(nb, nd, times, self.bins) + 2 * M.array_bytes(nb, nd, ns, times)

        def call(d: int) -> int:
            trajectory = M.particle_trajectory_bytes(
                self.n, d, integrator=self.integrator, pair_products=2
            )
            counts = M.array_bytes(times, self.bins + 2)
            return 2 * M.array_bytes(ns, self.n, d) + nb * ns * (trajectory + 3 * counts)

        return kept + max(call(d) for d in self.dims)


def smoke_config() -> Config:
    return Config(
        n=32,
        betas=(1.0, 9.0),
        dims=(2, 32),
        num_starts=2,
        t1=20.0,
        save_every=1.0,
        bins=50,
        snapshot_times=(0.0, 2.0, 5.0, 20.0),
        histogram_beta=9.0,
    )


@dataclasses.dataclass(frozen=True)
class Row:
    """One (β, d): the fraction of pairs near 1 at the snapshot times and the final clusters."""

    beta: float
    d: int
    fraction_near_one: list[float]
    """Mean over starts, at `Results.snapshot_times`."""
    fraction_top_bin: list[float]
    final_fraction_min_over_starts: float
    final_fraction_max_over_starts: float
    t_half: float | None
    """First time the mean fraction near 1 reaches ½ (interpolated); None if not by t1."""
    t_99: float | None
    """Same for 99 %."""
    gamma_infinity_time: float
    """t*(β): γ_β(t*) = 1 − δ (Γ_∞, the d → ∞ prediction of Thm 6.9)."""
    final_clusters_median: float
    final_clusters: list[int]
    """Clusters (components of ⟨x_i, x_j⟩ ≥ 1 − δ) at t1, per start."""


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    ts: np.ndarray
    edges: np.ndarray
    snapshot_times: list[float]
    """The saved times nearest to `config.snapshot_times`."""
    pairs_per_start: int
    counts: np.ndarray
    """(β, d, t, bins): histogram counts of ordered pairs, pooled over starts."""
    fraction_near_one: np.ndarray
    """(β, d, start, t): fraction of pairs with ⟨x_i, x_j⟩ ≥ 1 − δ."""
    fraction_near_one_mean: np.ndarray
    """(β, d, t): its mean over starts."""
    rows: list[Row]
    num_devices_used: int = 1
    """Devices the starts were spread over (`wb.map_cells`; the numbers do not depend on it)."""


# ----------------------------------------------------------------------------------------------
# computation


def _histories(beta, x0, *, dt, steps_per_save, num_saves, bins, delta, integrator):
    """For one start: histogram counts `(T, bins)` and fraction near 1 `(T,)` at `t = 0, s, 2s,
    …`, and the cluster count at the last time."""
    dyn = wb.particles.SA(beta)

    def stats(x):
        counts, _ = wb.particles.inner_product_histogram(x, bins)
        return counts, wb.particles.fraction_clustered(x, delta)

    def body(x, _):
        x = wb.particles.simulate(dyn, x, dt=dt, num_steps=steps_per_save, integrator=integrator)
        return x, stats(x)

    x1, (counts, frac) = jax.lax.scan(body, x0, None, length=num_saves)
    c0, f0 = stats(x0)
    # Clusters at t1: connected components of ⟨x_i, x_j⟩ ≥ 1 − δ (tells stalls from slowness).
    clusters = wb.particles.cluster_count(x1, delta)
    return jnp.concatenate([c0[None], counts]), jnp.concatenate([f0[None], frac]), clusters


def _time(t: float) -> float | None:
    return None if np.isnan(t) else float(t)


def compute(config: Config) -> Results:
    num_saves = steps_in(config.t1, config.save_every)
    ts = np.arange(num_saves + 1) * config.save_every
    nb, nd, ns = len(config.betas), len(config.dims), config.num_starts
    pairs = config.n * (config.n - 1)
    rng = np.random.default_rng(config.seed)
    counts = np.zeros((nb, nd, ts.size, config.bins), dtype=np.int64)
    frac = np.zeros((nb, nd, ns, ts.size))
    clusters = np.zeros((nb, nd, ns), dtype=np.int64)
    with jax.enable_x64(True):
        run = functools.partial(
            _histories,
            dt=config.dt,
            steps_per_save=steps_in(config.save_every, config.dt),
            num_saves=num_saves,
            bins=config.bins,
            delta=config.delta,
            integrator=wb.registry.SPHERE_INTEGRATORS[config.integrator],
        )
        # vmap over starts (inner) and β (outer), the starts cut over the devices; one
        # compilation per d.
        batched = wb.map_cells(
            jax.vmap(jax.vmap(run, in_axes=(None, 0)), in_axes=(0, None)),
            cells=(False, True),
            devices=chosen_devices(config.devices),
            out_axis=1,
        )
        betas = jnp.asarray(config.betas, dtype=jnp.float64)
        for j, d in enumerate(progress(config.dims, desc=NAME)):
            x0 = jnp.asarray(uniform_sphere(rng, ns, config.n, d))
            c, f, k = batched(betas, x0)  # (B, S, T, bins), (B, S, T), (B, S)
            counts[:, j] = np.asarray(c).sum(axis=1)
            frac[:, j] = np.asarray(f)
            clusters[:, j] = np.asarray(k)
        sa = eqx.filter_vmap(wb.particles.SA)(betas)  # one SA per β
        t_star = np.asarray(wb.particles.gamma_infinity(sa, config.delta, config.n))

    density = counts / (ns * pairs)  # fraction of ordered pairs per bin
    frac_mean = frac.mean(axis=2)  # (B, D, T)
    t_half = half_time(ts, frac_mean, 0.5)
    t_99 = half_time(ts, frac_mean, COLLAPSED)
    snap = [int(np.argmin(np.abs(ts - s))) for s in config.snapshot_times]
    rows = [
        Row(
            beta=beta,
            d=d,
            fraction_near_one=[float(frac_mean[b, j, k]) for k in snap],
            fraction_top_bin=[float(density[b, j, k, -1]) for k in snap],
            final_fraction_min_over_starts=float(frac[b, j, :, -1].min()),
            final_fraction_max_over_starts=float(frac[b, j, :, -1].max()),
            t_half=_time(t_half[b, j]),
            t_99=_time(t_99[b, j]),
            gamma_infinity_time=float(t_star[b]),
            final_clusters_median=float(np.median(clusters[b, j])),
            final_clusters=clusters[b, j].tolist(),
        )
        for b, beta in enumerate(config.betas)
        for j, d in enumerate(config.dims)
    ]
    return Results(
        config=config,
        num_devices_used=len(chosen_devices(config.devices)),
        ts=ts,
        edges=np.linspace(-1.0, 1.0, config.bins + 1),
        snapshot_times=[float(ts[k]) for k in snap],
        pairs_per_start=pairs,
        counts=counts,
        fraction_near_one=frac,
        fraction_near_one_mean=frac_mean,
        rows=rows,
    )


# ----------------------------------------------------------------------------------------------
# verdict and report


def _few(config: Config) -> int:
    """At most this many clusters at t1 in every start = a metastable stall (Fig. 4)."""
    return max(2, config.n // 8)


def _classify(results: Results) -> dict[str, list[Row]]:
    """Cases by outcome at t1: piled up at 1; stalled in a few tight clusters; still forming
    before the Γ_∞ time t*(β); still forming at or after t*; mass near 1 not grown."""
    c, few = results.config, _few(results.config)
    start, end = results.fraction_near_one_mean[..., 0], results.fraction_near_one_mean[..., -1]
    groups = {
        "collapsed": [],
        "metastable": [],
        "before_t_star": [],
        "after_t_star": [],
        "lost": [],
    }
    for r in results.rows:
        b, j = c.betas.index(r.beta), c.dims.index(r.d)
        if r.t_99 is not None:
            groups["collapsed"].append(r)
        elif end[b, j] < start[b, j]:
            groups["lost"].append(r)
        elif max(r.final_clusters) <= few:
            groups["metastable"].append(r)
        elif c.t1 < r.gamma_infinity_time:
            groups["before_t_star"].append(r)
        else:
            groups["after_t_star"].append(r)
    return groups


def _case(r: Row) -> str:
    return f"β = {r.beta:g}, d = {r.d}"


def verdict(results: Results) -> str:
    c, g = results.config, _classify(results)
    total = len(results.rows)
    parts = [
        f"By t = {c.t1:g}, ≥ {COLLAPSED:.0%} of the pairs are within δ = {c.delta:g} of 1 "
        f"(mean over starts) in {len(g['collapsed'])} of {total} (β, d) cases"
    ]
    if g["metastable"]:
        parts.append(
            f"it stalls with every start in ≤ {_few(c)} clusters (metastable, Fig. 4) in "
            f"{len(g['metastable'])}: "
            + ", ".join(
                f"{_case(r)} ({min(r.final_clusters)}–{max(r.final_clusters)} clusters, "
                f"{r.fraction_near_one[-1]:.2f} near 1)"
                for r in g["metastable"]
            )
        )
    if g["before_t_star"]:
        parts.append(
            "clusters are still forming before the Γ_∞ time t*(β) > t1 (Thm 6.9) in "
            f"{len(g['before_t_star'])}: "
            + ", ".join(
                f"{_case(r)} (t* = {r.gamma_infinity_time:.3g})" for r in g["before_t_star"]
            )
        )
    if g["after_t_star"]:
        parts.append(
            f"clusters are still forming although t1 ≥ t*(β) in {len(g['after_t_star'])}: "
            + ", ".join(
                f"{_case(r)} (up to {max(r.final_clusters)} clusters, "
                f"t* = {r.gamma_infinity_time:.3g})"
                for r in g["after_t_star"]
            )
        )
    if g["lost"]:
        parts.append(
            f"the mass near 1 is lower at t1 than at t = 0 in {len(g['lost'])}: "
            + ", ".join(_case(r) for r in g["lost"])
        )
    if len(g["collapsed"]) == total:
        word = "Yes"
    elif g["collapsed"] and not g["lost"]:
        word = "Partly"
    else:
        word = "No"
    return f"{word}. " + "; ".join(parts) + "."


def _fmt_time(t) -> str:
    return "not reached" if t is None else f"{t:.3g}"


def report(results: Results) -> str:
    c = results.config
    table = markdown_table(
        [
            "β",
            "d",
            *(f"t={t:g}" for t in results.snapshot_times),
            "t(½ near 1)",
            f"t({COLLAPSED:.0%} near 1)",
            "Γ_∞ time t*(β)",
            f"clusters at t={c.t1:g} (min–max over starts)",
            "final fraction near 1 (min–max over starts)",
        ],
        [
            [
                r.beta,
                r.d,
                *(f"{v:.3f}" for v in r.fraction_near_one),
                _fmt_time(r.t_half),
                _fmt_time(r.t_99),
                f"{r.gamma_infinity_time:.3g}",
                f"{min(r.final_clusters)}–{max(r.final_clusters)}",
                f"{r.final_fraction_min_over_starts:.3f}–{r.final_fraction_max_over_starts:.3f}",
            ]
            for r in results.rows
        ],
    )
    return (
        f"SA dynamics, n = {c.n}, {c.num_starts} uniform random starts per (β, d) (the same "
        f"starts for every β), {c.integrator} with dt = {c.dt}, float64. Histograms of "
        f"⟨x_i, x_j⟩ over the n(n−1) = {results.pairs_per_start} ordered pairs i ≠ j, {c.bins} "
        f"bins on [−1, 1], every {c.save_every} in t ∈ [0, {c.t1:g}].\n\n"
        f"**Fraction of pairs near 1** (⟨x_i, x_j⟩ ≥ 1 − δ, δ = {c.delta:g}, mean over starts) "
        "at selected times; the first time the mean reaches ½ and "
        f"{COLLAPSED:.0%} (linear interpolation between saved times); the time t*(β) at which "
        "γ_β(t) = 1 − δ (the Γ_∞ curve, the d → ∞ prediction of Thm 6.9); the number of "
        "clusters (components of ⟨x_i, x_j⟩ ≥ 1 − δ) and the fraction near 1 at the final time, "
        f"over the starts. A stall with every start in ≤ {_few(c)} clusters counts as metastable "
        "(Fig. 4).\n\n" + table + "\n"
    )


# ----------------------------------------------------------------------------------------------
# figures


def figures(results: Results) -> dict:
    return {
        "heatmaps": _plot_heatmaps(results),
        "histograms": _plot_histograms(results),
        "mass_near_one": _plot_mass(results),
    }


def _density(results: Results) -> np.ndarray:
    return results.counts / (results.config.num_starts * results.pairs_per_start)


def _plot_heatmaps(results: Results):
    from matplotlib.colors import LogNorm

    c, ts, edges = results.config, results.ts, results.edges
    density = _density(results)
    nb, nd = len(c.betas), len(c.dims)
    fig, axes = new_figure(
        nb, nd, figsize=(3.2 * nd + 1.2, 2.6 * nb + 0.6), squeeze=False, sharex=True, sharey=True
    )
    norm = LogNorm(vmin=1.0 / (c.num_starts * results.pairs_per_start), vmax=1.0)
    dt_half = 0.5 * (ts[1] - ts[0]) if ts.size > 1 else 0.5
    image = None
    for b, beta in enumerate(c.betas):
        for j, d in enumerate(c.dims):
            ax = axes[b, j]
            image = ax.imshow(
                np.ma.masked_equal(density[b, j], 0.0),
                origin="lower",
                aspect="auto",
                extent=(edges[0], edges[-1], ts[0] - dt_half, ts[-1] + dt_half),
                norm=norm,
                cmap="viridis",
                interpolation="nearest",
            )
            ax.set_title(f"β = {beta:g}, d = {d}", fontsize=9)
            if b == nb - 1:
                ax.set_xlabel("⟨x_i, x_j⟩")
            if j == 0:
                ax.set_ylabel("time t (depth)")
    fig.colorbar(image, ax=axes, label="fraction of pairs per bin (log)", shrink=0.8)
    fig.suptitle(
        f"Histograms of pairwise inner products over time (SA, n = {c.n}, "
        f"{c.num_starts} starts pooled)"
    )
    return fig


def _plot_histograms(results: Results):
    c, edges = results.config, results.edges
    density = _density(results)
    b = c.betas.index(c.histogram_beta)
    snap = [int(np.argmin(np.abs(results.ts - t))) for t in results.snapshot_times]
    nd, ns = len(c.dims), len(snap)
    fig, axes = new_figure(
        nd, ns, figsize=(2.1 * ns + 0.5, 1.9 * nd + 0.7), squeeze=False, sharex=True, sharey=True
    )
    floor = 1.0 / (c.num_starts * results.pairs_per_start)
    centres = 0.5 * (edges[1:] + edges[:-1])
    for j, d in enumerate(c.dims):
        for col, k in enumerate(snap):
            ax = axes[j, col]
            ax.bar(centres, density[b, j, k], width=edges[1] - edges[0], color="C0", linewidth=0)
            ax.set_yscale("log")
            ax.set_ylim(0.5 * floor, 1.5)
            if j == 0:
                ax.set_title(f"t = {results.ts[k]:g}", fontsize=9)
            if col == 0:
                ax.set_ylabel(f"d = {d}\nfraction of pairs", fontsize=8)
            if j == nd - 1:
                ax.set_xlabel("⟨x_i, x_j⟩", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.suptitle(
        f"Fig. 1 style: histograms of ⟨x_i, x_j⟩ (i ≠ j) at increasing t, SA, "
        f"β = {c.histogram_beta:g}, n = {c.n}"
    )
    return fig


def _plot_mass(results: Results):
    c, ts, frac = results.config, results.ts, results.fraction_near_one
    nb = len(c.betas)
    fig, axes = new_figure(1, nb, figsize=(4.2 * nb, 4.0), squeeze=False, sharey=True)
    for b, beta in enumerate(c.betas):
        ax = axes[0, b]
        for j, d in enumerate(c.dims):
            ax.plot(ts, frac[b, j].mean(axis=0), color=f"C{j}", label=f"d = {d}")
            ax.fill_between(
                ts, frac[b, j].min(axis=0), frac[b, j].max(axis=0), color=f"C{j}", alpha=0.2
            )
        ax.set_title(f"β = {beta:g}")
        ax.set_xlabel("time t")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if b == 0:
            ax.set_ylabel(f"fraction of pairs with ⟨x_i, x_j⟩ ≥ 1 − {c.delta:g}")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"Mass near 1 over time (SA, n = {c.n}; line = mean, band = range over "
        f"{c.num_starts} starts)"
    )
    return fig
