"""Do random starts in high dimension track γ_β(t) to within d^{−1/2}, and do they collapse to one
cluster at least as fast as Thm 6.3's rate bound (paper B, Thm 6.3, 6.9)?

Thm 6.9 of paper B: for n i.i.d. uniform starts on S^{d−1}, with probability ≥ 1 − 2n² d^{−1/64},
every off-diagonal Gram entry ⟨x_i(t), x_j(t)⟩ of SA stays close to γ_β(t), the common inner
product from an orthogonal start (Thm 6.8), for all t. This study measures the distance

    D(t) = max_{i ≠ j} |⟨x_i(t), x_j(t)⟩ − γ_β(t)|

over t ∈ [0, t1] (its max and its mean over pairs and times) as d grows with n fixed, fits its
exponent in d (`wb.analysis.fit_order`, all points) and compares it with −1/2 (the size of the
initial inner products). Thm 6.3 (d ≥ n): collapse to one cluster is exponential, with the proof's
rate bound λ = 1/(2n e^{2β}) (`clustering_rate_bound`); the observed late-time exponential rate of
1 − min_{i≠j}⟨x_i, x_j⟩ (`exponential_fit`) is compared with it.

Integration: projected RK4, dt = 0.05, float64; its error is measured from an orthogonal start
(where every Gram entry must equal γ_β(t) exactly). 1 − ⟨x_i, x_j⟩ = ‖x_i − x_j‖²/2 is computed
from the centred points, so it stays accurate far below the float64 resolution of ⟨x_i, x_j⟩.
"""

import dataclasses
import functools
import math

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
from workbench.analysis._exponential import exponential_fit
from workbench.particles._starts import uniform_sphere

NAME = "high-dimension"
SUMMARY = (
    "Paper B's Thm 6.3/6.9: random-start Gram entries vs γ_β(t) as d grows; collapse rate vs bound."
)

ERROR_SHARE = 0.01
"""The integration error (orthogonal start) must stay below this share of every deviation."""


@dataclasses.dataclass(frozen=True)
@defaults(num_starts=16, dt=0.05, save_every=0.25, dims=(32, 128, 512, 2048))
class Config(FinalTime, Dims, Integrator, SaveEvery, Dt, Betas, Particles, ParticleFields):
    fit_window: tuple[float, ...] = (1e-20, 1e-6)
    """Late-time window (low, high) of 1 − min ⟨x_i, x_j⟩ used to fit the collapse rate."""
    exponent_tol: float = 0.15
    """The verdict accepts fitted exponents in d within this distance of −1/2."""

    def __post_init__(self):
        check_devices(self)
        check_range(self, "n", 2)
        check_nonempty(self, "dims", "betas")
        check_range(self, "dims", 2)
        distinct = len(self.dims) >= 2 and len(set(self.dims)) == len(self.dims)
        check(self, "dims", distinct, "give at least two distinct dimensions")
        check_positive(self, "betas", allow_zero=True)
        check_range(self, "num_starts", 1)
        check_positive(self, "t1", "dt", "save_every", "exponent_tol")
        check_multiple(self, "save_every", of="dt")
        check_multiple(self, "t1", of="save_every")
        check_choices(self, "integrator", wb.registry.SPHERE_INTEGRATORS)
        window = self.fit_window
        ok = len(window) == 2 and all(math.isfinite(v) for v in window)
        check(
            self, "fit_window", ok and 0 < window[0] < window[1], "need (low, high), 0 < low < high"
        )
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the starts of every d, all
        drawn first (`num_starts · n · sum(dims)` entries, one more start at the first d), the
        kept series `(betas, dims, num_starts, T)` (three of them), and one compiled call at the
        largest d — the starts on the device and, per start, its integrator's state and
        attention (`_memory.particle_trajectory_bytes`), the statistics' n×n matrices (Gram
        matrix, deviations, distances) and its five series of `T = t1 / save_every + 1`
        values."""
        from studies._toolkit import memory as M

        times = round(self.t1 / self.save_every) + 1
        n, ns = self.n, self.num_starts + 1
        starts = M.array_bytes(ns, n, sum(self.dims))
        kept = 3 * M.array_bytes(len(self.betas), len(self.dims), ns, times)

        def call(d: int) -> int:
            trajectory = M.particle_trajectory_bytes(n, d, integrator=self.integrator)
            stats = M.array_bytes(4, n, n) + M.array_bytes(2, 5, times)
            return M.array_bytes(ns, n, d) + ns * (trajectory + stats)

        return starts + kept + max(call(d) for d in self.dims)


def smoke_config() -> Config:
    return Config(n=8, dims=(8, 64, 512), betas=(1.0,), num_starts=4, t1=15.0, save_every=0.5)


@dataclasses.dataclass(frozen=True)
class Row:
    """One (β, d): deviations from γ_β over pairs, times and starts, and the collapse rates."""

    beta: float
    d: int
    max_deviation: float
    max_deviation_t0: float
    median_start_max_deviation: float
    mean_deviation: float
    collapse_rate_median: float | None
    collapse_rate_min: float | None
    collapse_rate_max: float | None
    starts_with_rate: int
    final_spread_max: float
    rate_bound: float
    d_at_least_n: bool


@dataclasses.dataclass(frozen=True)
class Fit:
    """Fitted exponents p of deviation ∝ d^p (least squares in log-log over all dims)."""

    beta: float
    exponent_max_deviation: float
    exponent_mean_deviation: float
    exponent_median_start_max_deviation: float


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    ts: np.ndarray
    gamma: dict[str, np.ndarray]
    """γ_β(t) at `ts`, by str(β)."""
    rows: list[Row]
    fits: list[Fit]
    integration_error_orthogonal_start: dict[str, float] | None
    """Max |G_ij − γ_β| at t1 from an orthogonal start, by str(β) (None when dims[0] < n)."""
    max_deviation: np.ndarray
    """(β, d, start, t): max over i ≠ j of |G_ij − γ_β(t)|."""
    spread: np.ndarray
    """(β, d, start, t): 1 − min over i ≠ j of G_ij."""
    band: np.ndarray
    """(β, d, 2, t): min and max of G_ij over i ≠ j for start 0."""
    collapse_rates: np.ndarray
    """(β, d, start): fitted collapse rate, NaN where 1 − min G_ij never enters the window."""
    num_devices_used: int = 1
    """Devices the starts were spread over (`wb.map_cells`; the numbers do not depend on it)."""


# ----------------------------------------------------------------------------------------------
# computation


def _stats(x, gamma_t):
    """Max and mean over i ≠ j of |G_ij − γ|, 1 − min_{i≠j} G_ij (accurate when clustered), and
    the min and max of G_ij over i ≠ j."""
    n = x.shape[0]
    off = ~np.eye(n, dtype=bool)
    g = wb.particles.gram(x)[off]
    dev = jnp.abs(g - gamma_t)
    # ‖x_i − x_j‖² from the centred points y = x − mean: the cancellation is relative to ‖y‖²,
    # not to 1, so tiny spreads (1e-20) are resolved.
    y = x - jnp.mean(x, axis=0)
    sq = jnp.sum(y * y, axis=-1)
    dist2 = sq[:, None] + sq[None, :] - 2.0 * (y @ y.T)
    return jnp.max(dev), jnp.mean(dev), 0.5 * jnp.max(dist2), jnp.min(g), jnp.max(g)


def _track(beta, gammas, x0, *, dt, steps_per_save, num_saves, integrator):
    """The `_stats` at `t = 0, s, 2s, …` for one start, shape `(T,)` each."""
    dyn = wb.particles.SA(beta)

    def body(x, gamma_t):
        x = wb.particles.simulate(dyn, x, dt=dt, num_steps=steps_per_save, integrator=integrator)
        return x, _stats(x, gamma_t)

    _, series = jax.lax.scan(body, x0, gammas[1:], length=num_saves)
    first = _stats(x0, gammas[0])
    return tuple(jnp.concatenate([f[None], s]) for f, s in zip(first, series))


def _exponent(dims, values) -> float:
    """Least-squares slope of log values against log d over all dims (a plain fit: no window,
    so `fit_order` flags no order reduction)."""
    return wb.analysis.fit_order(dims, values, asymptotic=False, min_points=2).order


def compute(config: Config) -> Results:
    steps_per_save = steps_in(config.save_every, config.dt)
    num_saves = steps_in(config.t1, config.save_every)
    ts = np.arange(num_saves + 1) * config.save_every
    n, nb, nd, ns = config.n, len(config.betas), len(config.dims), config.num_starts
    rng = np.random.default_rng(config.seed)
    starts = [uniform_sphere(rng, ns, n, d) for d in config.dims]
    # Integration error: from an orthogonal start every Gram entry equals γ_β(t) (Thm 6.8). The
    # orthogonal start rides along as an extra start of the first d (no extra compilation).
    with_orth = config.dims[0] >= n
    if with_orth:
        starts[0] = np.concatenate([starts[0], np.eye(n, config.dims[0])[None]])
    shape = (nb, nd, ns, ts.size)
    max_dev, mean_dev, spread = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    band = np.zeros((nb, nd, 2, ts.size))
    floor = {} if with_orth else None
    with jax.enable_x64(True):
        run = functools.partial(
            _track,
            dt=config.dt,
            steps_per_save=steps_per_save,
            num_saves=num_saves,
            integrator=wb.registry.SPHERE_INTEGRATORS[config.integrator],
        )
        # Over the starts, cut over every visible device.
        batched = wb.map_cells(
            jax.vmap(run, in_axes=(None, None, 0)),
            cells=(False, False, True),
            devices=chosen_devices(config.devices),
        )
        gammas = {
            b: np.asarray(wb.particles.gamma_beta(jnp.asarray(ts), b, n, "SA"))
            for b in config.betas
        }
        cases = [(b, j) for b in range(nb) for j in range(nd)]
        for b, j in progress(cases, desc=NAME):
            beta = config.betas[b]
            out = batched(jnp.asarray(beta, jnp.float64), jnp.asarray(gammas[beta]), starts[j])
            m, a, h, lo, hi = (np.asarray(v) for v in out)
            if with_orth and j == 0:
                floor[str(beta)] = float(np.max(m[-1]))
                m, a, h, lo, hi = (v[:-1] for v in (m, a, h, lo, hi))
            max_dev[b, j], mean_dev[b, j], spread[b, j] = m, a, h
            band[b, j] = lo[0], hi[0]
        bound = {b: float(wb.particles.clustering_rate_bound(n, b)) for b in config.betas}

    rates = np.full((nb, nd, ns), np.nan)  # NaN: fewer than 4 saved times in the window
    for b, j, s in np.ndindex(nb, nd, ns):
        fit = exponential_fit(ts, spread[b, j, s], window=config.fit_window, min_points=4)
        rates[b, j, s] = -fit.rate
    dims = np.asarray(config.dims, dtype=float)
    rows, fits = [], []
    for b, beta in enumerate(config.betas):
        sup_dev = max_dev[b].max(axis=(1, 2))  # (D,): max over starts, pairs and t
        avg_dev = mean_dev[b].mean(axis=(1, 2))  # (D,): mean over starts, pairs and t
        at0 = max_dev[b][:, :, 0].max(axis=1)  # (D,): the initial Gram entries' max |G_ij|
        for j, d in enumerate(config.dims):
            ok = rates[b, j][np.isfinite(rates[b, j])]
            rows.append(
                Row(
                    beta=beta,
                    d=d,
                    max_deviation=float(sup_dev[j]),
                    max_deviation_t0=float(at0[j]),
                    median_start_max_deviation=float(np.median(max_dev[b, j].max(axis=1))),
                    mean_deviation=float(avg_dev[j]),
                    collapse_rate_median=float(np.median(ok)) if ok.size else None,
                    collapse_rate_min=float(np.min(ok)) if ok.size else None,
                    collapse_rate_max=float(np.max(ok)) if ok.size else None,
                    starts_with_rate=int(ok.size),
                    final_spread_max=float(spread[b, j, :, -1].max()),
                    rate_bound=bound[beta],
                    d_at_least_n=d >= n,
                )
            )
        med = np.median(max_dev[b].max(axis=2), axis=1)  # (D,): per-start max, median
        fits.append(
            Fit(beta, _exponent(dims, sup_dev), _exponent(dims, avg_dev), _exponent(dims, med))
        )
    return Results(
        config=config,
        num_devices_used=len(chosen_devices(config.devices)),
        ts=ts,
        gamma={str(b): g for b, g in gammas.items()},
        rows=rows,
        fits=fits,
        integration_error_orthogonal_start=floor,
        max_deviation=max_dev,
        spread=spread,
        band=band,
        collapse_rates=rates,
    )


# ----------------------------------------------------------------------------------------------
# verdict and report


def _tracking(results: Results) -> tuple[bool, str]:
    """Whether every fitted exponent is within `exponent_tol` of −1/2 and the integration error
    is negligible, with the sentence saying so."""
    c = results.config
    exps = [e for f in results.fits for e in (f.exponent_mean_deviation, f.exponent_max_deviation)]
    close = all(abs(e + 0.5) <= c.exponent_tol for e in exps)
    pairs = ", ".join(
        f"{f.exponent_mean_deviation:.2f} / {f.exponent_max_deviation:.2f} at β = {f.beta:g}"
        for f in results.fits
    )
    text = (
        f"The fitted exponents in d of the mean / max deviation from γ_β(t) are {pairs}, "
        f"{'all' if close else 'not all'} within ±{c.exponent_tol:g} of −1/2"
    )
    floor = results.integration_error_orthogonal_start
    if floor is not None:
        smallest = min(r.mean_deviation for r in results.rows)
        small = max(floor.values()) <= ERROR_SHARE * smallest
        close = close and small
        text += (
            f"; integration error {max(floor.values()):.1e} "
            f"{'≤' if small else '>'} {ERROR_SHARE:.0%} of the smallest mean deviation {smallest:.1e}"
        )
    return close, text


def _collapse(results: Results) -> tuple[bool | None, str]:
    """Whether every start with d ≥ n has a fitted collapse rate at or above Thm 6.3's bound
    (None when no d ≥ n), with the sentence saying so."""
    rows = [r for r in results.rows if r.d_at_least_n]
    if not rows:
        return None, f"no d ≥ n = {results.config.n}, so Thm 6.3's bound is not tested"
    total = results.config.num_starts * len(rows)
    fitted = sum(r.starts_with_rate for r in rows)
    text = f"for d ≥ n the collapse rate was fitted for {fitted}/{total} starts"
    rated = [r for r in rows if r.collapse_rate_min is not None]
    if not rated:
        return False, text
    ratio = min(r.collapse_rate_min / r.rate_bound for r in rated)
    low = min(r.collapse_rate_min for r in rated)
    high = max(r.collapse_rate_max for r in rated)
    ok = fitted == total and ratio >= 1.0
    return ok, (
        f"{text}, rates {low:.3f}–{high:.3f} (linearized Thm 6.8 ODE: 2), the slowest "
        f"{ratio:.3g}× Thm 6.3's bound 1/(2n e^{{2β}}) (at least 1× needed)"
    )


def verdict(results: Results) -> str:
    track_ok, track = _tracking(results)
    collapse_ok, collapse = _collapse(results)
    if track_ok and collapse_ok:
        word = "Yes"
    elif track_ok or collapse_ok:
        word = "Partly"
    else:
        word = "No"
    return f"{word}. {track}; {collapse}."


def _fmt(x, spec=".3g") -> str:
    return "—" if x is None else format(x, spec)


def report(results: Results) -> str:
    c = results.config
    table = markdown_table(
        [
            "β",
            "d",
            "max dev",
            "max dev at t = 0",
            "max dev × √d",
            "mean dev",
            "mean dev × √d",
            "collapse rate: median (min–max)",
            "starts fitted",
            "bound 1/(2n e^{2β})",
            "median rate / bound",
        ],
        [
            [
                r.beta,
                r.d,
                f"{r.max_deviation:.3e}",
                f"{r.max_deviation_t0:.3e}",
                f"{r.max_deviation * math.sqrt(r.d):.2f}",
                f"{r.mean_deviation:.3e}",
                f"{r.mean_deviation * math.sqrt(r.d):.3f}",
                f"{_fmt(r.collapse_rate_median, '.3f')} ({_fmt(r.collapse_rate_min, '.3f')}–"
                f"{_fmt(r.collapse_rate_max, '.3f')})",
                f"{r.starts_with_rate}/{c.num_starts}",
                f"{r.rate_bound:.3e}",
                _fmt(
                    None
                    if r.collapse_rate_median is None
                    else r.collapse_rate_median / r.rate_bound
                ),
            ]
            for r in results.rows
        ],
    )
    fit_lines = [
        f"- β = {f.beta:g}: max deviation ∝ d^{f.exponent_max_deviation:.3f}, "
        f"mean deviation ∝ d^{f.exponent_mean_deviation:.3f} "
        f"(per-start max, median over starts: d^{f.exponent_median_start_max_deviation:.3f})"
        for f in results.fits
    ]
    lines = [
        f"SA, n = {c.n}, {c.num_starts} uniform random starts per (β, d), {c.integrator} with "
        f"dt = {c.dt}, t ∈ [0, {c.t1:g}], Gram matrices every {c.save_every}, float64. "
        "Deviation = |⟨x_i(t), x_j(t)⟩ − γ_β(t)| over i ≠ j; 'max dev' is the max over pairs, "
        "saved times and starts ('at t = 0': the initial |⟨x_i, x_j⟩|), 'mean dev' the mean over "
        "them; a constant '× √d' column means d^{−1/2}. Collapse rate = late-time exponential "
        "rate of 1 − min_{i≠j} ⟨x_i, x_j⟩, fitted per start where it lies in "
        f"[{c.fit_window[0]:g}, {c.fit_window[1]:g}] (at least 4 saved times).",
        "",
        table,
        "",
        "**Exponent in d** (least-squares slope of log deviation against log d over all dims; "
        "d^{−1/2} is the size of the initial inner products):",
        "",
        *fit_lines,
    ]
    floor = results.integration_error_orthogonal_start
    if floor is not None:
        lines += [
            "",
            "Integration error (orthogonal start, where the Gram entries must equal γ_β exactly; "
            "max |G_ij − γ_β| at t1): " + ", ".join(f"β = {b}: {v:.1e}" for b, v in floor.items()),
        ]
    lines += [
        "",
        "Linearizing Thm 6.8's ODE at γ = 1 gives γ' ≈ 2(1 − γ) for every β and n (derived): "
        "a late-time collapse rate of 2, to compare with the fitted rates above.",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# figures


def figures(results: Results) -> dict:
    return {
        "gram_vs_gamma": _plot_gram(results),
        "deviation_vs_d": _plot_deviation_vs_d(results),
        "deviation_vs_time": _plot_deviation_vs_time(results),
        "collapse": _plot_collapse(results),
    }


def _panels(results: Results):
    nb = len(results.config.betas)
    fig, axes = new_figure(1, nb, figsize=(5.0 * nb, 3.8), squeeze=False, sharey=True)
    return fig, axes[0]


def _plot_gram(results: Results):
    """Min–max band of the Gram entries of one start, smallest and largest d, against γ_β(t)."""
    c, ts = results.config, results.ts
    fig, axes = _panels(results)
    for b, (ax, beta) in enumerate(zip(axes, c.betas)):
        for j in (0, len(c.dims) - 1):
            ax.fill_between(
                ts,
                results.band[b, j, 0],
                results.band[b, j, 1],
                alpha=0.3,
                color=f"C{j}",
                label=f"d = {c.dims[j]}: min–max over i ≠ j (one start)",
            )
        ax.plot(ts, results.gamma[str(beta)], "k-", lw=1.5, label="γ_β(t) (Thm 6.8)")
        ax.set_xlabel("time t")
        ax.set_title(f"β = {beta:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("⟨x_i(t), x_j(t)⟩")
    fig.suptitle(f"Random-start Gram entries against γ_β(t), SA, n = {c.n}")
    return fig


def _plot_deviation_vs_d(results: Results):
    c = results.config
    fig, ax = new_figure(figsize=(6.0, 4.4))
    dims = np.asarray(c.dims, dtype=float)
    for b, (beta, fit) in enumerate(zip(c.betas, results.fits)):
        sub = [r for r in results.rows if r.beta == beta]
        for key, marker, p in (
            ("max", "o-", fit.exponent_max_deviation),
            ("mean", "s--", fit.exponent_mean_deviation),
        ):
            ax.loglog(
                dims,
                [getattr(r, f"{key}_deviation") for r in sub],
                marker,
                color=f"C{b}",
                label=f"β = {beta:g}: {key}, fit $d^{{{p:.2f}}}$",
            )
    first = [r for r in results.rows if r.beta == c.betas[0]][0]
    ax.loglog(
        dims, first.mean_deviation * np.sqrt(dims[0] / dims), "k:", label=r"$\propto d^{-1/2}$"
    )
    ax.set_xlabel("dimension d")
    ax.set_ylabel("|⟨x_i, x_j⟩ − γ_β(t)| over i ≠ j, t, starts")
    ax.set_title(f"Distance to γ_β(t) against d (SA, n = {c.n})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def _plot_deviation_vs_time(results: Results):
    c, ts = results.config, results.ts
    fig, axes = _panels(results)
    for b, (ax, beta) in enumerate(zip(axes, c.betas)):
        for j, d in enumerate(c.dims):
            ax.semilogy(
                ts, np.median(results.max_deviation[b, j], axis=0), color=f"C{j}", label=f"d = {d}"
            )
        ax.set_xlabel("time t")
        ax.set_title(f"β = {beta:g}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("max over i ≠ j of |⟨x_i, x_j⟩ − γ_β(t)|\n(median over starts)")
    fig.suptitle(f"Distance of the Gram entries to γ_β over time (SA, n = {c.n})")
    return fig


def _plot_collapse(results: Results):
    c, ts, spread = results.config, results.ts, results.spread
    fig, axes = _panels(results)
    for b, (ax, beta) in enumerate(zip(axes, c.betas)):
        for j, d in enumerate(c.dims):
            h = np.median(spread[b, j], axis=0)
            ax.semilogy(ts, np.maximum(h, 1e-300), color=f"C{j}", label=f"d = {d}")
        # The bound's slope, anchored at the median curve of the largest d at t = t1 / 2.
        bound = next(r.rate_bound for r in results.rows if r.beta == beta)
        h_last = np.median(spread[b, -1], axis=0)
        k = ts.size // 2
        ax.semilogy(
            ts,
            h_last[k] * np.exp(-bound * (ts - ts[k])),
            "k--",
            lw=1,
            label=f"slope of the bound, {bound:.1e}",
        )
        ax.axhspan(*c.fit_window, color="gray", alpha=0.1, label="fit window")
        positive = spread[b][spread[b] > 0]
        ax.set_ylim(max(1e-32, positive.min() / 10) if positive.size else 1e-32, 3)
        ax.set_xlabel("time t")
        ax.set_title(f"β = {beta:g}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("1 − min over i ≠ j of ⟨x_i, x_j⟩\n(median over starts)")
    fig.suptitle(f"Exponential collapse to one cluster (SA, n = {c.n})")
    return fig
