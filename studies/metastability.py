"""How long do particles on the circle stay in multi-cluster states before they merge (Fig. 4)?

Paper B, Fig. 4: in d = 2, single runs of SA at β = 4 and β = 9 hold 2 and 3 clusters for a long
time before the clusters merge. This study runs SA (Q = K = V = I) on the circle from uniform
random starts, for several β and seeds, over a long horizon saved on a logarithmic time grid,
counts the clusters (components of ⟨x_i, x_j⟩ > 1 − 10⁻⁴ as the authors' threshold, and the
authors' rank count), cuts the count series into plateaus (maximal intervals of constant count)
and reports the longest multi-cluster plateau, its count, and the time to one cluster against β.

Integrator: projected RK4 with dt = 0.5 (cheap: within a tight cluster SA contracts at rate ≈ 1,
well inside RK4's stability interval). The authors' integrator (projected Euler, dt = 0.1) is
rerun on the featured β up to `check_t1` and the two count series are compared.

Outputs: `cluster_counts.png` (count against log t, featured β), `angles.png` (the angles θ_i(t)
against log t, the Fig. 4 picture), `plateaus_vs_beta.png` (longest multi-cluster plateau and
time to one cluster against β).
"""

import dataclasses
import functools
import pathlib
from collections import Counter
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb

NAME = "metastability"
SUMMARY = "Fig. 4: cluster count over log t in d = 2 (β = 4, 9); plateau lengths against β."

INTEGRATORS = {"euler": wb.particles.ProjectedEuler(), "rk4": wb.particles.ProjectedRK4()}


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 32
    d: int = 2
    betas: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    featured_betas: tuple[float, ...] = (4.0, 9.0)
    """The β of Fig. 4, plotted in detail and cross-checked with the authors' integrator."""
    num_starts: int = 8
    """Uniform random starts (seeds) per β; the same starts for every β."""
    t1: float = 1e5
    dt: float = 0.5
    integrator: Literal["rk4", "euler"] = "rk4"
    num_saves: int = 400
    """Saved times: about this many, log-spaced in [dt, t1] (rounded to the step grid), plus 0."""
    threshold: float = 1e-4
    """Clusters = components of ⟨x_i, x_j⟩ > 1 − threshold (the authors use 1e-4)."""
    max_count: int = 6
    """Metastable plateaus have 2 ≤ count ≤ max_count (excludes the initial, unclustered phase)."""
    check_t1: float = 1e4
    """Horizon of the cross-check with projected Euler, dt = 0.1 (0 disables it)."""
    seed: int = 0


def smoke_config() -> Config:
    return Config(betas=(1.0, 4.0, 9.0), num_starts=2, t1=2000.0, num_saves=120, check_t1=200.0)


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
    angles = jnp.arctan2(xs[..., 1], xs[..., 0])
    return comp, rank, angles


def _batched(config: Config, *, dt, t1, save_ts, integrator):
    run = functools.partial(
        _counts,
        dt=dt,
        t1=t1,
        save_ts=save_ts,
        integrator=integrator,
        threshold=config.threshold,
    )
    return jax.jit(jax.vmap(run, in_axes=(None, 0)))  # over starts; β is traced (one compile)


def _uniform_starts(rng, num: int, n: int, d: int) -> np.ndarray:
    """`num` configurations of `n` i.i.d. uniform points on S^{d−1}, shape `(num, n, d)` (NumPy:
    no compilation per shape)."""
    g = rng.standard_normal((num, n, d))
    return g / np.linalg.norm(g, axis=-1, keepdims=True)


def _summary(ts, counts, t1, max_count) -> dict:
    """Plateaus of one count series and its longest metastable plateau (2 ≤ count ≤ max_count)."""
    pls = wb.particles.plateaus(ts, counts)
    multi = [p for p in pls if 2 <= p.count <= max_count]
    longest = max(multi, key=lambda p: p.duration) if multi else None
    t_one = float(wb.particles.time_to_one_cluster(ts, counts))
    return {
        "plateaus": [[p.start, p.end, p.count] for p in pls],
        # Total time with exactly k clusters, k = 2 … max_count (a lower bound if still there at t1).
        "time_with": {
            k: sum(p.duration for p in pls if p.count == k) for k in range(2, max_count + 1)
        },
        "longest_count": None if longest is None else longest.count,
        "longest_start": None if longest is None else longest.start,
        "longest_end": None if longest is None else longest.end,
        "longest_duration": None if longest is None else longest.duration,
        # The last plateau ends at t1 by construction: its true end is unobserved.
        "longest_censored": bool(longest is not None and longest.end >= t1 and counts[-1] >= 2),
        "time_to_one": None if not np.isfinite(t_one) else t_one,
        "final_count": int(counts[-1]),
    }


def _check(config: Config) -> None:
    if not jax.config.jax_enable_x64:
        raise ValueError(
            f"{NAME} runs in float64 but jax_enable_x64 is off; run it with `workbench run {NAME}` "
            "or call jax.config.update('jax_enable_x64', True) first."
        )
    if config.n < 2 or config.d < 2:
        raise ValueError(f"n={config.n} and d={config.d} must be >= 2.")
    missing = [b for b in config.featured_betas if b not in config.betas]
    if missing:
        raise ValueError(f"featured_betas {missing} must be among betas={config.betas}.")
    if not config.t1 > config.dt > 0 or config.num_saves < 2 or config.num_starts < 1:
        raise ValueError("need t1 > dt > 0, num_saves >= 2 and num_starts >= 1.")
    if config.check_t1 and abs(round(config.check_t1 / 0.1) * 0.1 - config.check_t1) > 1e-9:
        raise ValueError(f"check_t1={config.check_t1!r} must be a multiple of 0.1.")


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    t1 = round(config.t1 / config.dt) * config.dt
    ts = _log_grid(t1, config.dt, config.num_saves)
    rng = np.random.default_rng(config.seed)
    x0 = jnp.asarray(_uniform_starts(rng, config.num_starts, config.n, config.d))
    run = _batched(
        config, dt=config.dt, t1=t1, save_ts=ts, integrator=INTEGRATORS[config.integrator]
    )

    comp = np.zeros((len(config.betas), config.num_starts, ts.size), dtype=np.int64)
    rank = np.zeros_like(comp)
    angles = {}
    for b, beta in enumerate(wb.report.progress(config.betas, desc=NAME)):
        c, r, a = run(jnp.asarray(beta, jnp.float64), x0)
        comp[b], rank[b] = np.asarray(c), np.asarray(r)
        if beta in config.featured_betas:
            angles[beta] = np.asarray(a[0])  # first start: (T, n)

    runs = [
        [_summary(ts, comp[b, s], t1, config.max_count) for s in range(config.num_starts)]
        for b in range(len(config.betas))
    ]
    per_beta = [_per_beta(beta, runs[b], config) for b, beta in enumerate(config.betas)]
    clustered = (comp >= 2) & (comp <= config.max_count)
    agreement = {
        "fraction_equal": float(np.mean(comp == rank)),
        "fraction_equal_metastable": float(np.mean((comp == rank)[clustered])),
        "max_rank_minus_components": int(np.max(rank - comp)),
        "fraction_equal_featured": {
            str(beta): float(np.mean(comp[b] == rank[b]))
            for b, beta in enumerate(config.betas)
            if beta in config.featured_betas
        },
    }
    cross = _cross_check(config, x0, ts, comp) if config.check_t1 else None
    fit = _fit_growth(config, per_beta)

    if wb.report.have_matplotlib():
        _plot_counts(config, ts, comp, rank, out / "cluster_counts.png")
        if config.d == 2:
            _plot_angles(config, ts, angles, out / "angles.png")
        _plot_plateaus(config, runs, per_beta, t1, out / "plateaus_vs_beta.png")

    report = _report(config, t1, ts, runs, per_beta, agreement, cross, fit)
    return {
        "ts": ts.tolist(),
        "t1": t1,
        "counts": comp.tolist(),
        "counts_rank": rank.tolist(),
        "runs": {str(beta): runs[b] for b, beta in enumerate(config.betas)},
        "per_beta": per_beta,
        "rank_vs_components": agreement,
        "cross_check": cross,
        "growth_fit": fit,
        "report": report,
    }


def _per_beta(beta, runs, config) -> dict:
    durations = [r["longest_duration"] for r in runs if r["longest_duration"] is not None]
    counts = [r["longest_count"] for r in runs if r["longest_count"] is not None]
    t_one = [r["time_to_one"] for r in runs]
    collapsed = [t for t in t_one if t is not None]
    # A censored run's time to one cluster is > t1: the median counts it as +inf.
    t_sorted = sorted(t if t is not None else np.inf for t in t_one)
    median_t_one = float(np.median(t_sorted))
    time_with = {
        k: float(np.median([r["time_with"][k] for r in runs])) for k in runs[0]["time_with"]
    }
    return {
        "beta": beta,
        "median_time_with": time_with,
        "median_longest_duration": float(np.median(durations)) if durations else None,
        "min_longest_duration": float(np.min(durations)) if durations else None,
        "max_longest_duration": float(np.max(durations)) if durations else None,
        "longest_count_mode": Counter(counts).most_common(1)[0][0] if counts else None,
        "longest_counts": counts,
        "num_censored": sum(r["longest_censored"] for r in runs),
        "fraction_collapsed": len(collapsed) / len(runs),
        "median_time_to_one": None if not np.isfinite(median_t_one) else median_t_one,
    }


def _fit_growth(config, per_beta) -> dict | None:
    """Least-squares fit of log(median longest plateau) = a + c β over β ≥ 2, uncensored medians."""
    pts = [
        (p["beta"], p["median_longest_duration"])
        for p in per_beta
        if p["beta"] >= 2
        and p["median_longest_duration"]
        and p["num_censored"] <= config.num_starts // 2 - 1
    ]
    if len(pts) < 3:
        return None
    b, dur = np.array(pts).T
    c, a = np.polyfit(b, np.log(dur), 1)
    return {"rate_per_beta": float(c), "intercept": float(a), "betas": b.tolist()}


def _cross_check(config, x0, ts, comp) -> dict:
    """Counts with the authors' projected Euler, dt = 0.1, against the main run, up to check_t1."""
    dt = 0.1
    t_end = round(min(config.check_t1, ts[-1]) / dt) * dt
    mask = ts <= t_end + 1e-9
    ts_check = ts[mask]
    # Every saved time of the main grid is a multiple of its dt; here it must be one of 0.1.
    ts_check = ts_check[np.abs(np.round(ts_check / dt) * dt - ts_check) < 1e-9]
    idx = np.searchsorted(ts, ts_check)
    run = _batched(config, dt=dt, t1=t_end, save_ts=ts_check, integrator=INTEGRATORS["euler"])
    rows = []
    for beta in config.featured_betas:
        b = config.betas.index(beta)
        c, _, _ = run(jnp.asarray(beta, jnp.float64), x0)
        c = np.asarray(c)
        main_c = comp[b][:, idx]
        rows.append(
            {
                "beta": beta,
                "fraction_equal": float(np.mean(c == main_c)),
                "final_counts_euler": c[:, -1].tolist(),
                "final_counts_main": main_c[:, -1].tolist(),
            }
        )
    return {"t1": t_end, "dt": dt, "integrator": "ProjectedEuler", "rows": rows}


# ----------------------------------------------------------------------------------------------
# report and plots


def _fmt(x, spec=".3g") -> str:
    return "—" if x is None else format(x, spec)


def _report(config, t1, ts, runs, per_beta, agreement, cross, fit) -> str:
    table = wb.report.markdown_table(
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
                p["beta"],
                f"{_fmt(p['median_longest_duration'])} "
                f"({_fmt(p['min_longest_duration'])}–{_fmt(p['max_longest_duration'])})",
                ", ".join(str(k) for k in p["longest_counts"]),
                f"{p['num_censored']}/{config.num_starts}",
                " / ".join(_fmt(p["median_time_with"].get(k)) for k in (2, 3, 4)),
                f"{p['fraction_collapsed']:.0%}",
                _fmt(p["median_time_to_one"]) if p["median_time_to_one"] else f"> {t1:g}",
            ]
            for p in per_beta
        ],
    )
    featured_lines = []
    for beta in config.featured_betas:
        b = config.betas.index(beta)
        parts = []
        for r in runs[b]:
            cens = "+" if r["longest_censored"] else ""
            parts.append(
                f"{r['longest_count']} clusters on [{r['longest_start']:.3g}, "
                f"{r['longest_end']:.3g}{cens}]"
                if r["longest_count"]
                else "no metastable plateau"
            )
        featured_lines.append(f"- β = {beta:g}: " + "; ".join(parts) + ".")
    lines = [
        f"SA on S^{config.d - 1}, n = {config.n}, Q = K = V = I, {config.num_starts} uniform "
        f"random starts (the same for every β), {config.integrator} (projected) with "
        f"dt = {config.dt}, t ∈ [0, {t1:g}], {ts.size} log-spaced saved times, float64. "
        f"Clusters = connected components of ⟨x_i, x_j⟩ > 1 − {config.threshold:g}.",
        "",
        f"**Longest metastable plateau per β**: a plateau is a maximal interval of constant count "
        f"between saved times; metastable = 2 to {config.max_count} clusters (this leaves out the "
        "initial, unclustered phase); censored = still running at t1, so a lower bound:",
        "",
        table,
        "",
        "**Featured β** (longest metastable plateau per start; `+` = still in it at t1):",
        "",
        *featured_lines,
        "",
    ]
    feat = [p for p in per_beta if p["beta"] in config.featured_betas]
    answer = "; ".join(_featured_answer(p, runs[config.betas.index(p["beta"])], t1) for p in feat)
    lines.append(f"**Answer.** {answer}.")
    if fit is not None:
        lines.append(
            f"Across β ∈ [{min(fit['betas']):g}, {max(fit['betas']):g}] the median longest "
            f"plateau grows like exp({fit['rate_per_beta']:.2f} β) (least-squares fit of its log, "
            "uncensored medians only): metastability is exponentially long in β. A heuristic "
            "reading: the attention one cluster pays another is e^{β(⟨c_a, c_b⟩ − 1)} relative "
            "to itself, e^{−2β} for two near-antipodal clusters, the typical final pair."
        )
    lines.append(
        f"Small β merge quickly: β = {per_beta[0]['beta']:g} reaches one cluster in "
        f"{per_beta[0]['fraction_collapsed']:.0%} of the starts (median time "
        f"{_fmt(per_beta[0]['median_time_to_one'])})."
    )
    lines += [
        "",
        f"**Rank count vs components.** The authors' rank count equals the component count at "
        f"{agreement['fraction_equal']:.1%} of all saved (β, start, t) and at "
        f"{agreement['fraction_equal_metastable']:.1%} of those in a metastable state "
        f"(2–{config.max_count} components); the largest excess of the rank is "
        f"{agreement['max_rank_minus_components']} (the rank exceeds the component count only "
        "while a component is not a clique: in the initial clustering phase and during merges).",
    ]
    if cross is not None:
        lines.append("")
        desc = ", ".join(f"β = {r['beta']:g}: {r['fraction_equal']:.1%}" for r in cross["rows"])
        lines.append(
            f"**Integrator check.** Rerun with the authors' projected Euler, dt = 0.1, up to "
            f"t = {cross['t1']:g}: the count series agree with the main run at {desc} of the "
            "saved times (differences sit at the switching times, whose exact position is "
            "sensitive near the unstable equilibria that the slow merges pass by)."
        )
    return "\n".join(lines) + "\n"


def _featured_answer(p, runs, t1) -> str:
    """One sentence per featured β: how long the runs sit with 2, 3, … clusters (states held for
    a median of less than 10 time units are transients and left out)."""
    parts = []
    for k, med in p["median_time_with"].items():
        visits = sum(r["time_with"][k] > 0 for r in runs)
        if med < 10:
            continue
        parts.append(
            f"{k} clusters in {visits}/{len(runs)} starts for a median {_fmt(med)} time units"
        )
    still = sum(r["longest_censored"] for r in runs)
    tail = f", {still} still there at t = {t1:g}" if still else ", all merged to one by t1"
    return f"β = {p['beta']:g} holds " + ", ".join(parts) + tail


def _count_ticks(ax, n):
    ticks = [k for k in (1, 2, 3, 4, 6, 8, 16, 32, 64, 128) if k <= n]
    ax.set_yticks(ticks, [str(k) for k in ticks])
    ax.minorticks_off()


def _plot_counts(config, ts, comp, rank, path):
    feat = config.featured_betas
    fig, axes = wb.report.new_figure(
        1, len(feat), figsize=(5.0 * len(feat), 3.8), squeeze=False, sharey=True
    )
    t = np.where(ts > 0, ts, ts[1] / 2)  # t = 0 drawn at half the first step on the log axis
    for ax, beta in zip(axes[0], feat):
        b = config.betas.index(beta)
        for s in range(config.num_starts):
            ax.step(t, comp[b, s], where="post", color=f"C{s % 10}", lw=1.2, alpha=0.8)
        ax.step(t, rank[b, 0], where="post", color="k", ls=":", lw=1.0, label="rank count, start 0")
        ax.plot([], [], color="C0", label="components, one line per start")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _count_ticks(ax, config.n)
        ax.set_xlabel("time t")
        ax.set_title(f"β = {beta:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel(f"number of clusters (⟨x_i, x_j⟩ > 1 − {config.threshold:g})")
    fig.suptitle(f"Cluster count over time, SA on the circle (d = {config.d}, n = {config.n})")
    wb.report.save_figure(fig, path)


def _plot_angles(config, ts, angles, path):
    feat = config.featured_betas
    fig, axes = wb.report.new_figure(
        1, len(feat), figsize=(5.0 * len(feat), 3.8), squeeze=False, sharey=True
    )
    t = np.where(ts > 0, ts, ts[1] / 2)
    for ax, beta in zip(axes[0], feat):
        th = angles[beta]  # (T, n)
        ax.plot(t, th, ".", ms=1.2, color="C0")
        ax.set_xscale("log")
        ax.set_xlabel("time t")
        ax.set_title(f"β = {beta:g} (start 0)")
        ax.set_ylim(-np.pi, np.pi)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("angle θ_i (rad)")
    fig.suptitle(f"Particle angles over time, SA on the circle (n = {config.n}): Fig. 4")
    wb.report.save_figure(fig, path)


def _plot_plateaus(config, runs, per_beta, t1, path):
    fig, axes = wb.report.new_figure(1, 3, figsize=(15.0, 4.2), squeeze=False)
    ax, ax3, ax2 = axes[0]
    for b, beta in enumerate(config.betas):
        for s, r in enumerate(runs[b]):
            if r["longest_duration"] is None:
                continue
            jitter = (s - (config.num_starts - 1) / 2) * 0.04
            ax.plot(
                beta + jitter,
                r["longest_duration"],
                "^" if r["longest_censored"] else "o",
                color=f"C{min(r['longest_count'], 9) - 1}",
                mfc="none" if r["longest_censored"] else None,
                ms=5,
            )
    med = [
        (p["beta"], p["median_longest_duration"]) for p in per_beta if p["median_longest_duration"]
    ]
    if med:
        ax.plot(*zip(*med), "k-", lw=1, label="median over starts")
    for k in sorted({r["longest_count"] for rb in runs for r in rb if r["longest_count"]}):
        ax.plot([], [], "o", color=f"C{min(k, 9) - 1}", label=f"{k} clusters")
    ax.plot([], [], "^", color="gray", mfc="none", label=f"censored at t1 = {t1:g}")
    ax.set_yscale("log")
    ax.set_xlabel("β")
    ax.set_ylabel(f"longest plateau with 2–{config.max_count} clusters")
    ax.set_title("Metastable plateau length against β")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)

    for b, beta in enumerate(config.betas):
        for s, r in enumerate(runs[b]):
            jitter = (s - (config.num_starts - 1) / 2) * 0.04
            if r["time_to_one"] is None:
                ax2.plot(beta + jitter, t1, "^", color="C3", mfc="none", ms=5)
            else:
                ax2.plot(beta + jitter, max(r["time_to_one"], 1e-2), "o", color="C0", ms=4)
    for k in (2, 3):
        for b, beta in enumerate(config.betas):
            for s, r in enumerate(runs[b]):
                jitter = (s - (config.num_starts - 1) / 2) * 0.04
                if r["time_with"].get(k, 0) > 0:
                    ax3.plot(
                        beta + jitter, r["time_with"][k], "o", color=f"C{k - 1}", ms=3, alpha=0.6
                    )
        med = [
            (p["beta"], p["median_time_with"][k]) for p in per_beta if p["median_time_with"].get(k)
        ]
        if med:
            ax3.plot(*zip(*med), "-", color=f"C{k - 1}", label=f"{k} clusters (line: median)")
    ax3.set_yscale("log")
    ax3.set_xlabel("β")
    ax3.set_ylabel("total time with exactly k clusters")
    ax3.set_title("Time spent in 2- and 3-cluster states")
    ax3.grid(alpha=0.3, which="both")
    ax3.legend(fontsize=7)

    ax2.plot([], [], "o", color="C0", label="collapsed: time to one cluster")
    ax2.plot([], [], "^", color="C3", mfc="none", label=f"not collapsed by t1 = {t1:g}")
    ax2.set_yscale("log")
    ax2.set_xlabel("β")
    ax2.set_ylabel("time to one cluster")
    ax2.set_title("Time to one cluster against β")
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=7)
    fig.suptitle(f"SA on the circle, n = {config.n}, {config.num_starts} starts per β")
    wb.report.save_figure(fig, path)
