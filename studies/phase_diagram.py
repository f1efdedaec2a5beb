"""Does the clustering phase diagram of self-attention dynamics (paper B, Fig. 3) follow the
high-dimensional curve Γ_∞, more closely as d grows, and do random Q, K, V (Fig. 5) keep a sharp
transition?

SA dynamics with n = 32 particles, β ∈ (0, 9] (90 values), t ∈ [0, 30], random uniform starts
(2^10 per β, the same starts for every β), Euler-then-renormalize with dt = 0.1 in float64, as the
authors. The statistic is the fraction of pairs i ≠ j with ⟨x_i, x_j⟩ ≥ 1 − δ (δ = 1e-3),
averaged over the starts, shown as a heat map (t on x, β on y) per d with Γ_∞ = {γ_β(t) = 1 − δ}
(Thm 6.9) overlaid. Reported per d: the statistic at t = 30 for β ≤ 1 (one cluster: ≥ 0.99), and
the distance between the empirical 0.5-level curve t_½(β) and Γ_∞'s t_Γ(β) (mean |t_½ − t_Γ| and
mean |log(t_½ / t_Γ)| over the β with t_Γ ≤ 30; where the 0.5 level is not reached by t = 30 the
gap is counted as 30 − t_Γ, a lower bound, and the number of such β is reported).

Fig. 5 variants at d = 128 (particle form, fewer starts: each step costs O(n d²) with matrices).
The score matrix S = QᵀK is scaled to O(1) entries, so that the scores ⟨Q x_i, K x_j⟩ of random
unit vectors are O(1) (as ⟨x_i, x_i⟩ = 1 with identities) and β ∈ (0, 9] keeps its meaning; V is
scaled to an O(1) operator norm (a positive factor on V only rescales time):
(a) `gaussian`: Q, K with i.i.d. N(0, d^{-1/2}) entries (so QᵀK has unit-variance entries), V
i.i.d. N(0, 1/d); (b) `wigner-psd`: QᵀK = W Wigner (symmetric, off-diagonal N(0, 1), diagonal
N(0, 2); Q = W, K = I) and V = B Bᵀ/d with B i.i.d. N(0, 1) (Wishart, PSD, E V = I); (c)
`gaussian-v-qtk`: Q, K as in (a), V = QᵀK/√d; (d) `wigner-v-qtk`: W as in (b), V = W/√d. One
draw of the matrices per variant, shared by all β and starts.
"""

import dataclasses
import math
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb

NAME = "phase-diagram"
SUMMARY = "Fig. 3/5: fraction of clustered pairs over (t, β) per d, against Γ_∞; random Q, K, V."

VARIANTS = ("gaussian", "wigner-psd", "gaussian-v-qtk", "wigner-v-qtk")


@dataclasses.dataclass(frozen=True)
class Config:
    ds: tuple[int, ...] = (2, 8, 32, 128, 512, 1024)
    """Dimensions d (the paper's list; each d ≥ n costs the same, see `ReducedForm`)."""
    n: int = 32
    num_betas: int = 90
    """β = beta_max · k / num_betas, k = 1..num_betas."""
    beta_max: float = 9.0
    t_max: float = 30.0
    save_every: float = 0.5
    dt: float = 0.1
    num_starts: int = 1024
    delta: float = 1e-3
    variants: tuple[str, ...] = VARIANTS
    variant_d: int = 128
    variant_starts: int = 32
    """Starts per β for the Fig. 5 variants (their particle form costs ~15× more per step)."""
    seed: int = 0


def smoke_config() -> Config:
    return Config(
        ds=(8, 32),
        num_betas=9,
        t_max=10.0,
        save_every=1.0,
        num_starts=8,
        variants=("gaussian",),
        variant_d=32,
        variant_starts=4,
    )


def _check(config: Config) -> None:
    for name in config.variants:
        if name not in VARIANTS:
            raise ValueError(f"variants: {name!r} is not known; valid: {', '.join(VARIANTS)}.")
    if not jax.config.jax_enable_x64:
        raise ValueError("the phase diagram runs in float64; run via `workbench run` (x64 on).")
    steps = config.t_max / config.dt
    every = config.save_every / config.dt
    if abs(steps - round(steps)) > 1e-9 or abs(every - round(every)) > 1e-9:
        raise ValueError("t_max and save_every must be multiples of dt.")


def _matrices(name: str, d: int, key):
    """(Q, K, V) of a Fig. 5 variant (see the module docstring); K = None means the identity."""
    kq, kk, kv = jax.random.split(key, 3)
    normal = lambda k: jax.random.normal(k, (d, d), jnp.float64)
    if name in ("gaussian", "gaussian-v-qtk"):
        q, k = normal(kq) / d**0.25, normal(kk) / d**0.25  # QᵀK: unit-variance entries
        v = normal(kv) / math.sqrt(d) if name == "gaussian" else q.T @ k / math.sqrt(d)
        return q, k, v
    z = normal(kq)
    w = (z + z.T) / math.sqrt(2)  # Wigner: ⟨W x, y⟩ = xᵀ W y, i.e. Q = W, K = I
    if name == "wigner-psd":
        b = normal(kv)
        return w, None, b @ b.T / d
    return w, None, w / math.sqrt(d)


def _half_time(ts: np.ndarray, fraction: np.ndarray) -> float:
    """First time the (mean) statistic reaches 0.5, linearly interpolated; NaN if never."""
    above = np.nonzero(fraction >= 0.5)[0]
    if above.size == 0:
        return math.nan
    k = int(above[0])
    if k == 0:
        return float(ts[0])
    t0, t1, f0, f1 = ts[k - 1], ts[k], fraction[k - 1], fraction[k]
    return float(t0 + (0.5 - f0) * (t1 - t0) / (f1 - f0))


def _distance(t_half: np.ndarray, t_gamma: np.ndarray, t_max: float) -> dict:
    """Gap between the empirical 0.5-level curve and Γ_∞ over the β with t_Γ ≤ t_max."""
    inside = t_gamma <= t_max
    censored = inside & np.isnan(t_half)
    t_emp = np.where(np.isnan(t_half), t_max, t_half)[inside]
    t_th = t_gamma[inside]
    gaps = np.abs(t_emp - t_th)
    logs = np.abs(np.log(t_emp / t_th))
    return {
        "num_betas_compared": int(inside.sum()),
        "num_censored": int(censored.sum()),
        "mean_abs_dt": float(gaps.mean()) if gaps.size else math.nan,
        "median_abs_dt": float(np.median(gaps)) if gaps.size else math.nan,
        "mean_abs_log_ratio": float(logs.mean()) if logs.size else math.nan,
    }


def _summarize(pd, betas, ts, t_gamma, config: Config) -> dict:
    t_half = np.array([_half_time(ts, row) for row in pd.fraction])
    small = betas <= 1.0
    at_end = pd.fraction[:, -1]
    return {
        "form": type(pd.form).__name__,
        "fraction": np.round(pd.fraction, 6).tolist(),
        "max_sem": float(pd.sem.max()),
        "t_half": [None if math.isnan(t) else t for t in t_half],
        "distance_to_gamma_infinity": _distance(t_half, t_gamma, config.t_max),
        "min_fraction_at_t_max_beta_le_1": float(at_end[small].min()) if small.any() else None,
        "one_cluster_beta_le_1": bool(at_end[small].min() >= 0.99) if small.any() else None,
    }


def main(config: Config, out: pathlib.Path) -> dict:
    _check(config)
    betas = config.beta_max * np.arange(1, config.num_betas + 1) / config.num_betas
    ts = config.save_every * np.arange(round(config.t_max / config.save_every) + 1)
    t_gamma = np.asarray(wb.particles.gamma_infinity(betas, config.delta, config.n, "SA"))
    key_starts, key_matrices = jax.random.split(jax.random.key(config.seed))
    run = dict(dt=config.dt, save_ts=ts, delta=config.delta)

    per_d = {}
    for i, d in enumerate(config.ds):
        starts = wb.particles.random_starts(
            jax.random.fold_in(key_starts, i), config.num_starts, config.n, d, jnp.float64
        )
        t0 = time.perf_counter()
        pd = wb.particles.phase_diagram(betas, starts, **run)
        wall = time.perf_counter() - t0
        per_d[d] = {"d": d, "wall_s": wall, **_summarize(pd, betas, ts, t_gamma, config)}
        del starts

    per_variant = {}
    for j, name in enumerate(config.variants):
        q, k, v = _matrices(name, config.variant_d, jax.random.fold_in(key_matrices, j))
        starts = wb.particles.random_starts(
            jax.random.fold_in(key_starts, 1000 + j),
            config.variant_starts,
            config.n,
            config.variant_d,
            jnp.float64,
        )
        t0 = time.perf_counter()
        pd = wb.particles.phase_diagram(betas, starts, Q=q, K=k, V=v, **run)
        wall = time.perf_counter() - t0
        per_variant[name] = {
            "variant": name,
            "wall_s": wall,
            **_summarize(pd, betas, ts, t_gamma, config),
        }

    if wb.report.have_matplotlib() and per_d:
        _plot_heatmaps(
            [(f"d = {d}", r) for d, r in per_d.items()],
            betas,
            ts,
            t_gamma,
            config,
            out / "phase_diagram.png",
        )
    if wb.report.have_matplotlib() and per_variant:
        _plot_heatmaps(
            [(f"({name}) d = {config.variant_d}", r) for name, r in per_variant.items()],
            betas,
            ts,
            t_gamma,
            config,
            out / "phase_diagram_random_matrices.png",
        )
    return {
        "betas": betas.tolist(),
        "ts": ts.tolist(),
        "gamma_infinity_t": t_gamma.tolist(),
        "per_d": list(per_d.values()),
        "variants": list(per_variant.values()),
        "report": _report(per_d, per_variant, config),
    }


def _report(per_d: dict, per_variant: dict, config: Config) -> str:
    rows = []
    for d, r in per_d.items():
        dist = r["distance_to_gamma_infinity"]
        rows.append(
            [
                d,
                r["form"],
                r["wall_s"] / 60,
                r["min_fraction_at_t_max_beta_le_1"],
                dist["mean_abs_dt"],
                dist["median_abs_dt"],
                dist["mean_abs_log_ratio"],
                f"{dist['num_censored']}/{dist['num_betas_compared']}",
            ]
        )
    table = wb.report.markdown_table(
        [
            "d",
            "form",
            "time (min)",
            f"min F(β≤1, t={config.t_max:g})",
            "mean |t½ − t_Γ|",
            "median |t½ − t_Γ|",
            "mean |log t½/t_Γ|",
            "not reached / compared",
        ],
        rows,
    )
    lines = [
        f"SA, n = {config.n}, {config.num_betas} β in (0, {config.beta_max:g}], t ∈ [0, "
        f"{config.t_max:g}] (saved every {config.save_every:g}), {config.num_starts} starts per β "
        f"(the same for every β), Euler-then-renormalize dt = {config.dt:g}, float64, "
        f"δ = {config.delta:g}. Distances are in time units over the β whose Γ_∞ time is ≤ "
        f"{config.t_max:g}; where the empirical 0.5 level is not reached by t = {config.t_max:g} "
        "the gap counts as t_max − t_Γ (a lower bound).",
        "",
        table,
        "",
    ]
    ones = [
        r["one_cluster_beta_le_1"] for r in per_d.values() if r["one_cluster_beta_le_1"] is not None
    ]
    if ones:
        lines.append(
            f"- **One cluster for β ≤ 1 at t = {config.t_max:g} (statistic ≥ 0.99): "
            f"{'yes' if all(ones) else 'NO'}** for every d "
            f"(min {min(r['min_fraction_at_t_max_beta_le_1'] for r in per_d.values()):.4f})."
        )
    if 8 in per_d and 128 in per_d:
        a = per_d[8]["distance_to_gamma_infinity"]["mean_abs_dt"]
        b = per_d[128]["distance_to_gamma_infinity"]["mean_abs_dt"]
        verdict = "yes" if b < a else "NO"
        lines.append(
            f"- **Transition closer to Γ_∞ at d = 128 than at d = 8: {verdict}** (mean gap "
            f"{b:.3g} vs {a:.3g} time units)."
        )
    if 128 in per_d:
        lines.append(
            f"- The d = 128 diagram ({config.num_betas} β × {config.num_starts} starts × "
            f"{round(config.t_max / config.dt)} steps) took {per_d[128]['wall_s'] / 60:.2f} min "
            "(budget: 15 min on the 2-core CPU)."
        )
    if per_variant:
        vrows = [
            [
                name,
                r["wall_s"] / 60,
                r["min_fraction_at_t_max_beta_le_1"],
                r["distance_to_gamma_infinity"]["mean_abs_dt"],
                f"{r['distance_to_gamma_infinity']['num_censored']}/"
                f"{r['distance_to_gamma_infinity']['num_betas_compared']}",
                r["max_sem"],
            ]
            for name, r in per_variant.items()
        ]
        lines += [
            "",
            f"Fig. 5 random-matrix variants at d = {config.variant_d}, {config.variant_starts} "
            "starts per β (particle form; scaling in the study docstring). Γ_∞ is the identity-"
            "matrix curve, drawn for reference only.",
            "",
            wb.report.markdown_table(
                [
                    "variant",
                    "time (min)",
                    f"min F(β≤1, t={config.t_max:g})",
                    "mean |t½ − t_Γ|",
                    "not reached / compared",
                    "max s.e.m.",
                ],
                vrows,
            ),
        ]
    return "\n".join(lines) + "\n"


def _plot_heatmaps(panels, betas, ts, t_gamma, config: Config, path: pathlib.Path) -> None:
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = wb.report.new_figure(
        rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, sharex=True, sharey=True
    )
    dt_half = (ts[1] - ts[0]) / 2 if ts.size > 1 else 0.5
    db_half = (betas[1] - betas[0]) / 2 if betas.size > 1 else 0.5
    extent = (ts[0] - dt_half, ts[-1] + dt_half, betas[0] - db_half, betas[-1] + db_half)
    inside = t_gamma <= ts[-1]
    image = None
    for ax, (title, r) in zip(axes.flat, panels):
        image = ax.imshow(
            np.asarray(r["fraction"]),
            origin="lower",
            aspect="auto",
            extent=extent,
            vmin=0.0,
            vmax=1.0,
            cmap="viridis",
            interpolation="nearest",
        )
        ax.plot(t_gamma[inside], betas[inside], color="tab:red", lw=1.5, label=r"$\Gamma_\infty$")
        t_half = np.array([np.nan if t is None else t for t in r["t_half"]], float)
        ax.plot(t_half, betas, color="white", lw=1.0, ls="--", label="empirical ½ level")
        ax.set_title(title)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("t")
    for ax in axes[:, 0]:
        ax.set_ylabel("β")
    axes.flat[0].legend(loc="upper left", fontsize=7)
    fig.colorbar(
        image,
        ax=axes,
        shrink=0.8,
        label=f"fraction of pairs with ⟨x_i, x_j⟩ ≥ 1 − {config.delta:g}",
    )
    wb.report.save_figure(fig, path)
