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
gap is counted as 30 − t_Γ, a lower bound, and the number of such β is reported). The sharpness of
the transition is the width of the clustering front: per β, the time the statistic takes to rise
from 0.1 to 0.9, relative to t_½ (infinite where it reaches 0.5 but not 0.9 by t_max); its median
over the β that reach 0.5.

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

from __future__ import annotations

import dataclasses
import math
import time

import equinox as eqx
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
)
from studies._toolkit.fields import Delta, Dt, ParticleFields, Particles, SaveEvery, TMax, defaults
from studies._toolkit.report import markdown_table, new_figure, progress
from workbench.particles._starts import half_time

NAME = "phase-diagram"
SUMMARY = "Paper B's Fig. 3/5: fraction of clustered pairs over (t, β) per d, against Γ_∞; random Q, K, V."

VARIANTS = ("gaussian", "wigner-psd", "gaussian-v-qtk", "wigner-v-qtk")

FOLLOW_TOL = 0.1
"""The diagram follows Γ_∞ when mean |log(t_½ / t_Γ)| at the largest d is at most this."""
SHARP_WIDTH = 1.0
"""A transition is sharp when the median relative front width (t_0.9 − t_0.1) / t_½ is at most
this."""
ONE_CLUSTER = 0.99
"""The statistic at t_max for β ≤ 1 that counts as one cluster."""


@dataclasses.dataclass(frozen=True)
@defaults(num_starts=1024)
class Config(TMax, Delta, SaveEvery, Dt, Particles, ParticleFields):
    ds: tuple[int, ...] = (2, 8, 32, 128, 512, 1024)
    """Dimensions d (the paper's list; each d ≥ n costs the same, see `ReducedForm`)."""
    num_betas: int = 90
    """β = beta_max · k / num_betas, k = 1..num_betas."""
    beta_max: float = 9.0
    """Largest inverse temperature β of the grid (0, beta_max]."""
    variants: tuple[str, ...] = VARIANTS
    """Fig. 5 random Q, K, V variants to run (see the module docstring)."""
    variant_d: int = 128
    """Dimension d of the Fig. 5 variants."""
    variant_starts: int = 32
    """Starts per β for the Fig. 5 variants (their particle form costs ~15× more per step)."""
    x64: bool = True
    """Float64, as the paper's runs (`--x64`); false runs the particles in float32 (`--no-x64`:
    half the memory, the accelerators' fast path; Γ_∞ stays float64)."""

    def __post_init__(self):
        check_nonempty(self, "ds")
        check_range(self, "ds", 2)
        check(self, "ds", len(set(self.ds)) == len(self.ds), "each d at most once")
        check_range(self, "n", 2)
        check_range(self, "num_betas", 1)
        check_positive(self, "beta_max", "dt")
        check_multiple(self, "t_max", of="dt")
        check_multiple(self, "save_every", of="dt")
        check_multiple(self, "t_max", of="save_every")
        check_range(self, "num_starts", 1)
        check_range(self, "delta", 0.0, 1.0, low_open=True, high_open=True)
        check_choices(self, "variants", VARIANTS)
        check(self, "variants", len(set(self.variants)) == len(self.variants), "each at most once")
        check_range(self, "variant_d", 2)
        check_range(self, "variant_starts", 1)
        check_seed(self)
        check_devices(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`): the largest of its phase diagrams,
        one d or one variant at a time — the starts `(num_starts, n, d)` with their prepared and
        host copies, the compiled chunks in flight and the moments (`_memory.phase_diagram_bytes`),
        plus a variant's three `(variant_d, variant_d)` matrices — and the diagrams kept,
        `(num_betas, T)` each."""
        from studies._toolkit import memory as M

        item = M.itemsize(self.x64)
        times = round(self.t_max / self.save_every) + 1
        diagram = lambda starts, d, matrices: M.phase_diagram_bytes(
            self.num_betas, starts, self.n, d, times, itemsize=item, matrices=matrices
        )
        peaks = [diagram(self.num_starts, d, False) for d in self.ds]
        if self.variants:
            matrices = M.array_bytes(3, self.variant_d, self.variant_d, itemsize=item)
            peaks.append(diagram(self.variant_starts, self.variant_d, True) + matrices)
        kept = M.array_bytes(len(self.ds) + len(self.variants), 5, self.num_betas, times)
        return max(peaks) + kept


def smoke_config() -> Config:
    return Config(
        ds=(8, 32),
        num_betas=9,
        t_max=15.0,
        save_every=1.0,
        num_starts=8,
        variants=("gaussian",),
        variant_d=32,
        variant_starts=4,
    )


@dataclasses.dataclass(frozen=True)
class GammaDistance:
    """Gap between the empirical 0.5-level curve and Γ_∞ over the β with t_Γ ≤ t_max."""

    num_betas_compared: int
    num_censored: int
    """β whose 0.5 level is not reached by t_max (gap counted as t_max − t_Γ, a lower bound)."""
    mean_abs_dt: float
    median_abs_dt: float
    mean_abs_log_ratio: float


@dataclasses.dataclass(frozen=True)
class Diagram:
    """One phase diagram: identity matrices at dimension `d` (`variant == "identity"`), or a
    Fig. 5 random-matrix variant."""

    variant: str
    d: int
    form: str
    wall_s: float
    fraction: np.ndarray
    """(B, T): the statistic averaged over the starts."""
    max_sem: float
    t_half: np.ndarray
    """(B,): first time the statistic reaches 0.5 (NaN: not by t_max)."""
    front_width: np.ndarray
    """(B,): (t_0.9 − t_0.1) / t_½ (NaN where t_½ is NaN, inf where 0.9 is not reached)."""
    median_front_width: float
    """Median of `front_width` over the β that reach 0.5 (NaN if none)."""
    distance_to_gamma_infinity: GammaDistance
    min_fraction_at_t_max_beta_le_1: float
    """NaN when no β ≤ 1 is on the grid."""
    one_cluster_beta_le_1: bool | None


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    betas: np.ndarray
    ts: np.ndarray
    gamma_infinity_t: np.ndarray
    """t_Γ(β): Γ_∞'s time for each β."""
    per_d: list[Diagram]
    variants: list[Diagram]
    num_devices_used: int
    """Devices the cells were spread over (the statistics are the same on any number)."""
    num_processes: int
    platform: str


def _matrices(name: str, d: int, key, dtype=jnp.float64):
    """(Q, K, V) of a Fig. 5 variant (see the module docstring); K = None means the identity."""
    kq, kk, kv = jax.random.split(key, 3)
    normal = lambda k: jax.random.normal(k, (d, d), dtype)
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


def _distance(t_half: np.ndarray, t_gamma: np.ndarray, t_max: float) -> GammaDistance:
    inside = t_gamma <= t_max
    t_emp = np.where(np.isnan(t_half), t_max, t_half)[inside]
    gaps = np.abs(t_emp - t_gamma[inside])
    logs = np.abs(np.log(t_emp / t_gamma[inside]))
    return GammaDistance(
        num_betas_compared=int(inside.sum()),
        num_censored=int((inside & np.isnan(t_half)).sum()),
        mean_abs_dt=float(gaps.mean()) if gaps.size else math.nan,
        median_abs_dt=float(np.median(gaps)) if gaps.size else math.nan,
        mean_abs_log_ratio=float(logs.mean()) if logs.size else math.nan,
    )


def _summarize(pd, variant, d, wall, betas, ts, t_gamma, t_max) -> Diagram:
    t_half = np.asarray(half_time(ts, pd.fraction), float)
    t_low = np.asarray(half_time(ts, pd.fraction, level=0.1), float)
    t_high = np.asarray(half_time(ts, pd.fraction, level=0.9), float)
    width = np.where(np.isnan(t_high), np.inf, (t_high - t_low) / t_half)
    width = np.where(np.isnan(t_half), np.nan, width)
    reached = ~np.isnan(t_half)
    small = betas <= 1.0
    at_end = pd.fraction[:, -1]
    low = float(at_end[small].min()) if small.any() else math.nan
    return Diagram(
        variant=variant,
        d=int(d),
        form=type(pd.form).__name__,
        wall_s=wall,
        fraction=np.asarray(pd.fraction),
        max_sem=float(pd.sem.max()),
        t_half=t_half,
        front_width=width,
        median_front_width=float(np.median(width[reached])) if reached.any() else math.nan,
        distance_to_gamma_infinity=_distance(t_half, t_gamma, t_max),
        min_fraction_at_t_max_beta_le_1=low,
        one_cluster_beta_le_1=bool(low >= ONE_CLUSTER) if small.any() else None,
    )


def compute(config: Config) -> Results:
    devices = chosen_devices(config.devices)
    betas = config.beta_max * np.arange(1, config.num_betas + 1) / config.num_betas
    ts = config.save_every * np.arange(round(config.t_max / config.save_every) + 1)
    with jax.enable_x64(True):
        sa = eqx.filter_vmap(wb.particles.SA)(jnp.asarray(betas))  # one SA per β (float64)
        t_gamma = np.asarray(wb.particles.gamma_infinity(sa, config.delta, config.n), np.float64)
    dtype = jnp.float64 if config.x64 else jnp.float32
    with jax.enable_x64(config.x64):
        key_starts, key_matrices = jax.random.split(jax.random.key(config.seed))
        run = dict(dt=config.dt, save_ts=ts, delta=config.delta, devices=devices)
        summary = dict(betas=betas, ts=ts, t_gamma=t_gamma, t_max=config.t_max)

        per_d = []
        for i, d in enumerate(progress(config.ds, desc="phase diagram: d")):
            starts = wb.particles.random_starts(
                jax.random.fold_in(key_starts, i), config.num_starts, config.n, d, dtype
            )
            t0 = time.perf_counter()
            pd = wb.particles.phase_diagram(sa, starts, **run)
            wall = time.perf_counter() - t0
            per_d.append(_summarize(pd, "identity", d, wall, **summary))
            del starts

        variants = []
        for j, name in enumerate(progress(config.variants, desc="phase diagram: variants")):
            q, k, v = _matrices(name, config.variant_d, jax.random.fold_in(key_matrices, j), dtype)
            starts = wb.particles.random_starts(
                jax.random.fold_in(key_starts, 1000 + j),
                config.variant_starts,
                config.n,
                config.variant_d,
                dtype,
            )
            # One SA per β sharing the matrices (the β leaf swapped in: no copy per β).
            sa_qkv = eqx.tree_at(lambda s: s.beta, wb.particles.SA(0.0, Q=q, K=k, V=v), betas)
            t0 = time.perf_counter()
            pd = wb.particles.phase_diagram(sa_qkv, starts, **run)
            wall = time.perf_counter() - t0
            variants.append(_summarize(pd, name, config.variant_d, wall, **summary))
    processes = len({d.process_index for d in devices})
    return Results(
        config, betas, ts, t_gamma, per_d, variants, len(devices), processes, devices[0].platform
    )


def _parts(results: Results):
    """The three answers: (follows Γ_∞ at the largest d, closer at the largest than at the
    smallest d, every variant sharp), with the diagrams that decide them."""
    by_d = sorted(results.per_d, key=lambda r: r.d)
    small, large = by_d[0], by_d[-1]
    follows = large.distance_to_gamma_infinity.mean_abs_log_ratio <= FOLLOW_TOL
    closer = (
        len(by_d) > 1
        and large.distance_to_gamma_infinity.mean_abs_dt
        < small.distance_to_gamma_infinity.mean_abs_dt
    )
    unsharp = [r for r in results.variants if not r.median_front_width <= SHARP_WIDTH]
    sharp = bool(results.variants) and not unsharp
    return follows, closer, sharp, small, large, unsharp


def verdict(results: Results) -> str:
    follows, closer, sharp, small, large, unsharp = _parts(results)
    c = results.config
    dist_l = large.distance_to_gamma_infinity
    held = sum((follows, closer, sharp))
    word = "Yes" if held == 3 else "No" if held == 0 else "Partly"
    lines = [
        f"{word}. At the largest d = {large.d} the empirical ½-level curve "
        + ("is" if follows else "is not")
        + f" within mean |log t½/t_Γ| = {dist_l.mean_abs_log_ratio:.3g} of Γ_∞ "
        f"(tolerance {FOLLOW_TOL:g}; {dist_l.num_censored} of {dist_l.num_betas_compared} β "
        f"not reached by t = {c.t_max:g})."
    ]
    if len(results.per_d) > 1:
        a = small.distance_to_gamma_infinity.mean_abs_dt
        lines.append(
            f"The mean gap |t½ − t_Γ| {'falls' if closer else 'does not fall'} from {a:.3g} at "
            f"d = {small.d} to {dist_l.mean_abs_dt:.3g} at d = {large.d}."
        )
    else:
        lines.append(f"Only d = {large.d} was run, so the trend in d is not measured.")
    widths = ", ".join(f"{r.variant} {r.median_front_width:.3g}" for r in results.variants)
    if not results.variants:
        lines.append("No random-matrix variant was run.")
    elif sharp:
        lines.append(
            f"Every random-matrix variant at d = {c.variant_d} keeps a sharp transition (median "
            f"front width (t_0.9 − t_0.1)/t½: {widths}; at most {SHARP_WIDTH:g} allowed)."
        )
    else:
        lines.append(
            f"{len(unsharp)} of {len(results.variants)} random-matrix variants at d = "
            f"{c.variant_d} have no sharp transition (median front width (t_0.9 − t_0.1)/t½: "
            f"{widths}; at most {SHARP_WIDTH:g} allowed; inf/nan: 0.9/0.5 not reached by "
            f"t = {c.t_max:g})."
        )
    ones = [r for r in results.per_d if r.one_cluster_beta_le_1 is not None]
    if ones:
        low = min(r.min_fraction_at_t_max_beta_le_1 for r in ones)
        failing = [r.d for r in ones if not r.one_cluster_beta_le_1]
        lines.append(
            f"For β ≤ 1 the statistic at t = {c.t_max:g} is at least {low:.4g} "
            + (
                f"(one cluster, ≥ {ONE_CLUSTER:g}, at every d)."
                if not failing
                else f"(below {ONE_CLUSTER:g} at d = {', '.join(map(str, failing))})."
            )
        )
    return " ".join(lines)


def report(results: Results) -> str:
    c = results.config
    rows = []
    for r in results.per_d:
        dist = r.distance_to_gamma_infinity
        rows.append(
            [
                r.d,
                r.form,
                r.wall_s / 60,
                r.min_fraction_at_t_max_beta_le_1,
                dist.mean_abs_dt,
                dist.median_abs_dt,
                dist.mean_abs_log_ratio,
                f"{dist.num_censored}/{dist.num_betas_compared}",
                r.median_front_width,
                r.max_sem,
            ]
        )
    lines = [
        f"SA, n = {c.n}, {c.num_betas} β in (0, {c.beta_max:g}], t ∈ [0, {c.t_max:g}] (saved "
        f"every {c.save_every:g}), {c.num_starts} starts per β (the same for every β), "
        f"Euler-then-renormalize dt = {c.dt:g}, {'float64' if c.x64 else 'float32'}, "
        f"δ = {c.delta:g}; cells spread over {results.num_devices_used} "
        f"{results.platform.upper()} device(s) in {results.num_processes} process(es). Distances are in time "
        f"units over the β whose Γ_∞ time is ≤ {c.t_max:g}; where the empirical 0.5 level is not "
        f"reached by t = {c.t_max:g} the gap counts as t_max − t_Γ (a lower bound). Front width: "
        "median over the β reaching 0.5 of (t_0.9 − t_0.1)/t½ (inf: 0.9 not reached).",
        "",
        markdown_table(
            [
                "d",
                "form",
                "time (min)",
                f"min F(β≤1, t={c.t_max:g})",
                "mean |t½ − t_Γ|",
                "median |t½ − t_Γ|",
                "mean |log t½/t_Γ|",
                "not reached / compared",
                "front width",
                "max s.e.m.",
            ],
            rows,
        ),
    ]
    for r in results.per_d:
        if r.d == 128:
            lines += [
                "",
                f"The d = 128 diagram ({c.num_betas} β × {c.num_starts} starts × "
                f"{round(c.t_max / c.dt)} steps) took {r.wall_s / 60:.2f} min.",
            ]
    if results.variants:
        vrows = [
            [
                r.variant,
                r.wall_s / 60,
                r.min_fraction_at_t_max_beta_le_1,
                r.distance_to_gamma_infinity.mean_abs_dt,
                f"{r.distance_to_gamma_infinity.num_censored}/"
                f"{r.distance_to_gamma_infinity.num_betas_compared}",
                r.median_front_width,
                r.max_sem,
            ]
            for r in results.variants
        ]
        lines += [
            "",
            f"Fig. 5 random-matrix variants at d = {c.variant_d}, {c.variant_starts} starts per β "
            "(particle form; scaling in the study docstring). Γ_∞ is the identity-matrix curve, "
            "drawn for reference only.",
            "",
            markdown_table(
                [
                    "variant",
                    "time (min)",
                    f"min F(β≤1, t={c.t_max:g})",
                    "mean |t½ − t_Γ|",
                    "not reached / compared",
                    "front width",
                    "max s.e.m.",
                ],
                vrows,
            ),
        ]
    return "\n".join(lines) + "\n"


def figures(results: Results) -> dict:
    c = results.config
    out = {}
    if results.per_d:
        out["phase_diagram"] = _heatmaps(
            [(f"d = {r.d}", r) for r in results.per_d], results, "paper B's Fig. 3"
        )
    if results.variants:
        out["phase_diagram_random_matrices"] = _heatmaps(
            [(f"({r.variant}) d = {c.variant_d}", r) for r in results.variants],
            results,
            "paper B's Fig. 5 (random Q, K, V)",
        )
    return out


def _heatmaps(panels, results: Results, figure: str):
    betas, ts, t_gamma = results.betas, results.ts, results.gamma_infinity_t
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = new_figure(
        rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, sharex=True, sharey=True
    )
    dt_half = (ts[1] - ts[0]) / 2 if ts.size > 1 else 0.5
    db_half = (betas[1] - betas[0]) / 2 if betas.size > 1 else 0.5
    extent = (ts[0] - dt_half, ts[-1] + dt_half, betas[0] - db_half, betas[-1] + db_half)
    inside = t_gamma <= ts[-1]
    image = None
    for ax, (title, r) in zip(axes.flat, panels):
        image = ax.imshow(
            r.fraction,
            origin="lower",
            aspect="auto",
            extent=extent,
            vmin=0.0,
            vmax=1.0,
            cmap="viridis",
            interpolation="nearest",
        )
        ax.plot(t_gamma[inside], betas[inside], color="tab:red", lw=1.5, label=r"$\Gamma_\infty$")
        ax.plot(r.t_half, betas, color="white", lw=1.0, ls="--", label="empirical ½ level")
        ax.set_title(title)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("t")
    for ax in axes[:, 0]:
        ax.set_ylabel("β")
    axes.flat[0].legend(loc="upper left", fontsize=7)
    c = results.config
    fig.suptitle(
        f"{figure}: n = {c.n} particles, {c.num_starts} random starts per β, "
        f"dt = {c.dt:g}, {len(betas)} values of β",
        fontsize=10,
    )
    fig.colorbar(
        image,
        ax=axes,
        shrink=0.8,
        label=f"fraction of pairs with ⟨x_i, x_j⟩ ≥ 1 − {results.config.delta:g}",
    )
    return fig
