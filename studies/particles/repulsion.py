"""Does the repulsive flow (V = −I) find the minimum-energy configurations on the sphere?

With V = −I the interaction energy E_β(X) = (1/(2βn²)) Σ_i Σ_j exp(β⟨x_i, x_j⟩) decreases along
SA (docs/particles.md): the particles spread out. For small n on S^1 and S^2 and a few β, this
study runs the repulsive SA flow (`SA(beta, repulsive=True)`) to convergence from many uniform
random starts and compares the final energies with (a) an independent numerical optimizer —
SciPy's L-BFGS-B on E_β of the row-normalized points (gradient by `jax.grad` of
`wb.particles.interaction_energy`), from many random starts, best value — and (b) the known
optima: the regular n-gon on S^1 (universally optimal), the regular simplex when n ≤ d + 1
(inner products −1/(n−1); optimal for every convex increasing function of the inner products by
Jensen), and the cross-polytope when n = 2d (the octahedron for n = 6 on S^2; universally
optimal, Cohn–Kumar).

Relative gaps are reported on the *interaction part* E_β − e^β/(2βn) (the n self-terms removed),
which is stricter than the relative gap of E_β itself. Needs SciPy (the `studies` extra).

Figures: `gaps` (relative gaps per case), `inner_products` (the distinct inner products of the
final configurations against the known optima), `energy_decay` (E(t) − min E along the flow).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
from studies._toolkit.config import (
    check,
    check_devices,
    check_nonempty,
    check_positive,
    check_seed,
    chosen_devices,
    steps_in,
)
from studies._toolkit.fields import Betas, Dims, Dt, ParticleFields, defaults
from studies._toolkit.report import markdown_table, new_figure, progress
from workbench.particles._starts import uniform_sphere

NAME = "repulsion"
SUMMARY = "Paper B's repulsive case V = −I: the flow's final energies vs an optimizer and the known optima."


@dataclasses.dataclass(frozen=True)
@defaults(num_starts=32, betas=(0.5, 1.0, 4.0), dt=0.5)
class Config(Dims, Dt, Betas, ParticleFields):
    ns: tuple[int, ...] = (3, 4, 5, 6, 7, 8)
    """Numbers of particles n, one case per (n, d, β)."""
    optimizer_starts: int = 32
    """Random starts of the L-BFGS-B optimizer per (n, d, β)."""
    chunk_time: float = 25.0
    """The flow runs in chunks of this length; convergence is checked after each."""
    max_time: float = 20000.0
    """The flow stops at this time if it has not converged by then."""
    speed_tol: float = 1e-10
    """Converged when max_i ‖ẋ_i‖ < speed_tol for every start."""
    same_tol: float = 1e-9
    """A start "reaches the best" when its relative gap to the best energy is below this."""
    gap_tol: float = 1e-6
    """The verdict's tolerance on the relative gaps between flow, optimizer and known optimum."""

    def __post_init__(self):
        check_devices(self)
        check_nonempty(self, "dims", "ns", "betas")
        check(self, "dims", all(d >= 2 for d in self.dims), "every d must be >= 2")
        check(self, "ns", all(n >= 2 for n in self.ns), "every n must be >= 2")
        check_positive(
            self, "betas", "num_starts", "optimizer_starts", "dt", "chunk_time", "max_time"
        )
        check_positive(self, "speed_tol", "same_tol", "gap_tol")
        check(
            self,
            "chunk_time",
            steps_in(self.chunk_time, self.dt) is not None,
            f"it must be a whole multiple of dt={self.dt!r}",
        )
        check(self, "max_time", self.max_time >= self.chunk_time, "it must be >= chunk_time")
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory`, float64): the largest case (n, d),
        one at a time — its starts `(num_starts, n, d)` on the host and the device, the compiled
        chunk's input, output and per-start temporaries (RK4 stages and attention,
        `_memory.particle_trajectory_bytes`), the final Gram matrices `(num_starts, n, n)` and their
        host copies — plus the energy histories every case keeps, at most `max_time / chunk_time +
        1` checks × `num_starts` (the worst case: no start converges early)."""
        from studies._toolkit import memory as M

        checks = int(self.max_time // self.chunk_time) + 1
        history = M.array_bytes(checks, self.num_starts)
        cases = len(self.dims) * len(self.ns) * len(self.betas)

        def case(n: int, d: int) -> int:
            starts = M.array_bytes(self.num_starts, n, d)
            chunk = self.num_starts * M.particle_trajectory_bytes(n, d, integrator="rk4")
            grams = M.array_bytes(self.num_starts, n, n)
            return 4 * starts + chunk + 2 * grams + 2 * history

        return max(case(n, d) for n in self.ns for d in self.dims) + cases * history


def smoke_config() -> Config:
    return Config(ns=(4, 6), betas=(1.0,), num_starts=8, optimizer_starts=8)


@dataclasses.dataclass(frozen=True)
class Case:
    """One (n, d, β): final energies, gaps and the flow's history."""

    n: int
    d: int
    beta: float
    known: str | None
    """Name of the known optimum, if there is one for (n, d)."""
    energy_known: float | None
    energy_flow: float
    """The best start's interaction energy E_int = E_β − e^β/(2βn)."""
    energy_optimizer: float
    gap_flow_vs_optimizer: float
    gap_flow_vs_known: float | None
    gap_optimizer_vs_known: float | None
    gram_distance_to_known: float | None
    """Max difference of the sorted inner products of the flow's best configuration and the
    known optimum."""
    flow_fraction_at_best: float
    optimizer_fraction_at_best: float
    flow_time: float
    flow_max_speed: float
    flow_converged: bool
    flow_max_relative_energy_increase: float
    """Largest relative increase of E_β between consecutive checks (rounding only, for a descent)."""
    flow_worst_gap: float
    times: np.ndarray
    energy_history: np.ndarray
    """E_β at `times`, shape (len(times), num_starts)."""
    inner_products_flow: np.ndarray
    inner_products_optimizer: np.ndarray
    inner_products_known: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    cases: tuple[Case, ...]
    num_devices_used: int = 1
    """Devices the starts were spread over (`wb.map_cells`; the numbers do not depend on it)."""


# ----------------------------------------------------------------------------------------------
# energies and known optima


def interaction_part(gram: np.ndarray, beta: float) -> float:
    """E_β − e^β/(2βn) = (1/(2βn²)) Σ_{i≠j} exp(β G_ij), from a Gram matrix (NumPy, float64)."""
    n = gram.shape[0]
    off = ~np.eye(n, dtype=bool)
    return float(np.sum(np.exp(beta * gram[off])) / (2.0 * beta * n * n))


def known_optimum(n: int, d: int) -> tuple[str, np.ndarray] | None:
    """`(name, Gram matrix)` of the known minimizer of E_β for every β > 0, or `None`."""
    if d == 2:
        k = np.arange(n)
        return f"regular {n}-gon", np.cos(2 * np.pi * (k[:, None] - k[None, :]) / n)
    if n <= d + 1:
        g = np.full((n, n), -1.0 / (n - 1))
        np.fill_diagonal(g, 1.0)
        return f"regular simplex ({n} points)", g
    if n == 2 * d:
        e = np.concatenate([np.eye(d), -np.eye(d)])
        return "cross-polytope (octahedron)" if d == 3 else "cross-polytope", e @ e.T
    return None


@functools.partial(jax.jit, static_argnums=(2, 3))
def _energy_and_grad(flat, beta, n: int, d: int):
    """E_β of the normalized rows of X and its gradient in X (for SciPy; float64)."""

    def energy(flat):
        x = flat.reshape(n, d)
        return wb.particles.interaction_energy(x / jnp.linalg.norm(x, axis=1, keepdims=True), beta)

    return jax.value_and_grad(energy)(flat)


def _optimize(n: int, d: int, beta: float, starts: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Best-of-`starts` L-BFGS-B minimization: energies per start and the best Gram matrix."""
    try:
        from scipy.optimize import minimize
    except ImportError as e:  # pragma: no cover - scipy is in the studies extra
        raise ImportError(
            f"The {NAME} study compares with scipy.optimize.minimize; install SciPy "
            "(`pip install 'workbench[studies]'`)."
        ) from e

    def fun(flat):
        e, g = _energy_and_grad(jnp.asarray(flat), jnp.asarray(beta), n, d)
        return float(e), np.asarray(g, dtype=np.float64)

    energies, best, best_e = [], None, np.inf
    for _ in range(starts):
        x0 = rng.standard_normal((n, d))
        res = minimize(
            fun,
            x0.ravel(),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 20000, "gtol": 1e-12, "ftol": 1e-15},
        )
        y = res.x.reshape(n, d)
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
        g = y @ y.T
        e = interaction_part(g, beta)
        energies.append(e)
        if e < best_e:
            best_e, best = e, g
    return np.asarray(energies), best


# ----------------------------------------------------------------------------------------------
# the flow


def _chunk(beta, xs, *, dt, num_steps):
    """Advance every start by `num_steps` projected RK4 steps of repulsive SA; return the new
    points, each start's max speed max_i ‖ẋ_i‖ and its energy E_β."""
    dyn = wb.particles.SA(beta, repulsive=True)

    def one(x):
        x = wb.particles.simulate(
            dyn, x, dt=dt, num_steps=num_steps, integrator=wb.particles.ProjectedRK4()
        )
        speed = jnp.max(jnp.linalg.norm(dyn.velocity(x), axis=-1))
        return x, speed, wb.particles.interaction_energy(x, beta)

    return jax.vmap(one)(xs)


def _run_flow(config: Config, n: int, d: int, beta: float, rng, chunk) -> dict:
    x0 = uniform_sphere(rng, config.num_starts, n, d)
    xs = jnp.asarray(x0)
    e0 = jax.vmap(wb.particles.interaction_energy, in_axes=(0, None))(xs, beta)
    energies, times, t = [np.asarray(e0)], [0.0], 0.0
    speed = np.inf
    while t < config.max_time:
        xs, s, e = chunk(jnp.asarray(beta, jnp.float64), xs)
        t += config.chunk_time
        speed = np.asarray(s)
        energies.append(np.asarray(e))
        times.append(t)
        if np.max(speed) < config.speed_tol:
            break
    energies = np.asarray(energies)  # (chunks + 1, starts), full E_β
    incr = np.max(np.diff(energies, axis=0) / np.abs(energies[:-1])) if len(times) > 1 else 0.0
    x_np = np.asarray(xs)
    grams = np.einsum("sid,sjd->sij", x_np, x_np)
    return {
        "interaction": np.array([interaction_part(g, beta) for g in grams]),
        "grams": grams,
        "energy_history": energies,
        "times": np.asarray(times),
        "time": t,
        "max_speed": float(np.max(speed)),
        "converged": bool(np.max(speed) < config.speed_tol),
        "max_relative_energy_increase": float(max(incr, 0.0)),
    }


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def _sorted_offdiag(g: np.ndarray) -> np.ndarray:
    return np.sort(g[~np.eye(g.shape[0], dtype=bool)])


def _case(config: Config, n: int, d: int, beta: float, flow_rng, opt_rng, chunk) -> Case:
    flow = _run_flow(config, n, d, beta, flow_rng, chunk)
    opt_e, opt_g = _optimize(n, d, beta, config.optimizer_starts, opt_rng)
    known = known_optimum(n, d)
    best = int(np.argmin(flow["interaction"]))
    e_flow, e_opt = float(flow["interaction"][best]), float(opt_e.min())
    e_ref = min(e_flow, e_opt)
    ek = None if known is None else interaction_part(known[1], beta)
    flow_ips = _sorted_offdiag(flow["grams"][best])
    return Case(
        n=n,
        d=d,
        beta=beta,
        known=None if known is None else known[0],
        energy_known=ek,
        energy_flow=e_flow,
        energy_optimizer=e_opt,
        gap_flow_vs_optimizer=(e_flow - e_opt) / e_opt,
        gap_flow_vs_known=None if ek is None else (e_flow - ek) / ek,
        gap_optimizer_vs_known=None if ek is None else (e_opt - ek) / ek,
        gram_distance_to_known=(
            None if known is None else float(np.max(np.abs(flow_ips - _sorted_offdiag(known[1]))))
        ),
        flow_fraction_at_best=float(
            np.mean([_rel(e, e_ref) < config.same_tol for e in flow["interaction"]])
        ),
        optimizer_fraction_at_best=float(
            np.mean([_rel(e, e_ref) < config.same_tol for e in opt_e])
        ),
        flow_time=flow["time"],
        flow_max_speed=flow["max_speed"],
        flow_converged=flow["converged"],
        flow_max_relative_energy_increase=flow["max_relative_energy_increase"],
        flow_worst_gap=float((np.max(flow["interaction"]) - e_ref) / e_ref),
        times=flow["times"],
        energy_history=flow["energy_history"],
        inner_products_flow=flow_ips,
        inner_products_optimizer=_sorted_offdiag(opt_g),
        inner_products_known=None if known is None else _sorted_offdiag(known[1]),
    )


def compute(config: Config) -> Results:
    """Run the flow and the optimizer for every (d, n, β) of `config` (float64)."""
    steps = steps_in(config.chunk_time, config.dt)
    # The starts cut over the devices; one compilation per (n, d).
    chunk = wb.map_cells(
        functools.partial(_chunk, dt=config.dt, num_steps=steps),
        cells=(False, True),
        devices=chosen_devices(config.devices),
    )
    # Separate streams for the flow's and the optimizer's starts.
    flow_rng, opt_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(2)
    )
    cases = [(n, d, b) for d in config.dims for n in config.ns for b in config.betas]
    with jax.enable_x64(True):
        done = tuple(
            _case(config, n, d, beta, flow_rng, opt_rng, chunk)
            for n, d, beta in progress(cases, desc=NAME)
        )
    return Results(config=config, cases=done, num_devices_used=chunk.mesh.size)


# ----------------------------------------------------------------------------------------------
# verdict and report


def _worst(values) -> float:
    values = [abs(v) for v in values if v is not None]
    return max(values) if values else 0.0


def verdict(results: Results) -> str:
    """Yes if, in every case, the flow's best energy is within `gap_tol` (relative) of the
    optimizer's and of the known optimum, and E_β never rose along the flow beyond rounding."""
    c, cases = results.config, results.cases
    vs_opt = _worst(r.gap_flow_vs_optimizer for r in cases)
    vs_known = _worst(r.gap_flow_vs_known for r in cases)
    rise = max(r.flow_max_relative_energy_increase for r in cases)
    missed = [
        r
        for r in cases
        if max(abs(r.gap_flow_vs_optimizer), abs(r.gap_flow_vs_known or 0)) > c.gap_tol
    ]
    unconverged = sum(not r.flow_converged for r in cases)
    numbers = (
        f"worst relative gap of the flow's best energy to the optimizer {vs_opt:.1e} and to the "
        f"known optima {vs_known:.1e} (tolerance {c.gap_tol:g}) over {len(cases)} cases; largest "
        f"relative rise of E_β along the flow {rise:.1e}"
    )
    if rise > 1e-12:
        return f"No. E_β rose along the repulsive flow, which must be a descent: {numbers}."
    if missed:
        where = ", ".join(f"(d = {r.d}, n = {r.n}, β = {r.beta:g})" for r in missed)
        word = "No" if len(missed) == len(cases) else "Partly"
        return f"{word}. The flow misses the minimum energy in {where}: {numbers}."
    tail = (
        f" {unconverged} case(s) did not reach the speed tolerance {c.speed_tol:g} by t = "
        f"{c.max_time:g}, but their best start is already at the minimum."
        if unconverged
        else ""
    )
    return f"Yes. The repulsive flow reaches the minimum-energy configurations: {numbers}.{tail}"


def _fmt(x, spec=".2e") -> str:
    return "—" if x is None else format(x, spec)


def report(results: Results) -> str:
    config, cases = results.config, results.cases
    table = markdown_table(
        [
            "d",
            "n",
            "β",
            "known optimum",
            "E_int flow",
            "gap flow vs optimizer",
            "gap flow vs known",
            "gap optimizer vs known",
            "Gram dist. to known",
            "flow starts at best",
            "optimizer starts at best",
            "flow t",
            "max speed",
        ],
        [
            [
                r.d,
                r.n,
                r.beta,
                r.known or "—",
                f"{r.energy_flow:.10g}",
                f"{r.gap_flow_vs_optimizer:+.1e}",
                _fmt(r.gap_flow_vs_known, "+.1e"),
                _fmt(r.gap_optimizer_vs_known, "+.1e"),
                _fmt(r.gram_distance_to_known, ".1e"),
                f"{r.flow_fraction_at_best:.0%}",
                f"{r.optimizer_fraction_at_best:.0%}",
                f"{r.flow_time:g}",
                f"{r.flow_max_speed:.0e}",
            ]
            for r in cases
        ],
    )
    lines = [
        f"Repulsive SA (V = −I, Q = K = I), projected RK4 with dt = {config.dt}, run in chunks of "
        f"{config.chunk_time:g} until max_i ‖ẋ_i‖ < {config.speed_tol:g} for all "
        f"{config.num_starts} uniform random starts (or t = {config.max_time:g}); optimizer: "
        f"SciPy L-BFGS-B on the normalized rows, best of {config.optimizer_starts} starts; float64. "
        "E_int = E_β − e^β/(2βn) (self-terms removed); gaps are relative, (E − E_ref)/E_ref, of "
        "E_int (a positive gap means above the reference). 'Gram dist. to known' = max difference "
        "of the sorted inner products of the flow's best configuration and the known optimum. "
        f"'at best' = within {config.same_tol:g} relative of the best energy found.",
        "",
        table,
        "",
        f"Largest relative increase of E_β between checks along the flow: "
        f"{max(r.flow_max_relative_energy_increase for r in cases):.1e}.",
    ]
    local = [r for r in cases if r.flow_fraction_at_best < 1 and r.flow_converged]
    if local:
        desc = ", ".join(
            f"(d = {r.d}, n = {r.n}, β = {r.beta:g}): {r.flow_fraction_at_best:.0%}" for r in local
        )
        lines.append(
            f"Converged, but not every start reaches the best configuration — fraction that does: "
            f"{desc}; the others stop at other critical points (local minima or saddles)."
        )
    unconverged = [r for r in cases if not r.flow_converged]
    if unconverged:
        desc = ", ".join(
            f"(d = {r.d}, n = {r.n}, β = {r.beta:g}: max speed {r.flow_max_speed:.0e}, "
            f"{r.flow_fraction_at_best:.0%} of the starts within {config.same_tol:g} of the best, "
            f"worst start {r.flow_worst_gap:.1e} above it)"
            for r in unconverged
        )
        lines.append(
            f"Not converged to the speed tolerance by t = {config.max_time:g}: {desc}. See "
            "`energy_decay.png`: starts can linger slightly above the best energy (near a saddle "
            "or along a soft direction) for thousands of time units before descending."
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# figures


def figures(results: Results) -> dict:
    return {
        "gaps": _plot_gaps(results.cases),
        "inner_products": _plot_inner_products(results),
        "energy_decay": _plot_energy(results),
    }


def _label(r: Case) -> str:
    return f"d={r.d} n={r.n} β={r.beta:g}"


def _plot_gaps(cases):
    fig, ax = new_figure(figsize=(max(6.0, 0.35 * len(cases) + 2), 4.4))
    x = np.arange(len(cases))
    floor = 1e-17
    vs_opt = [max(abs(r.gap_flow_vs_optimizer), floor) for r in cases]
    vs_known = [
        np.nan if r.gap_flow_vs_known is None else max(abs(r.gap_flow_vs_known), floor)
        for r in cases
    ]
    ax.semilogy(x, vs_opt, "o", label="|flow − optimizer| / optimizer")
    ax.semilogy(x, vs_known, "x", ms=8, label="|flow − known optimum| / known")
    ax.axhline(1e-6, color="k", ls="--", lw=1, label="1e-6")
    ax.axhline(np.finfo(float).eps, color="gray", ls=":", lw=1, label="machine ε")
    ax.set_xticks(x, [_label(r) for r in cases], rotation=90, fontsize=7)
    ax.set_ylabel("relative gap of E_int (floored at 1e-17)")
    ax.set_title("Repulsive flow vs optimizer and known optima")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def _plot_inner_products(results: Results):
    config = results.config
    by_case = {(r.n, r.d, r.beta): r for r in results.cases}
    beta = config.betas[-1]
    nd = len(config.dims)
    fig, axes = new_figure(1, nd, figsize=(5.0 * nd, 4.0), squeeze=False, sharey=True)
    for k, d in enumerate(config.dims):
        ax = axes[0, k]
        for n in config.ns:
            r = by_case[(n, d, beta)]
            flow, opt, known = (
                r.inner_products_flow,
                r.inner_products_optimizer,
                r.inner_products_known,
            )
            ax.plot(np.full(flow.size, n - 0.12), flow, "o", color="C0", ms=5, mfc="none")
            ax.plot(np.full(opt.size, n), opt, "s", color="C1", ms=4, mfc="none")
            if known is not None:
                ax.plot(np.full(known.size, n + 0.12), known, "x", color="k", ms=6)
        ax.plot([], [], "o", color="C0", mfc="none", label="flow (best start)")
        ax.plot([], [], "s", color="C1", mfc="none", label="optimizer (best start)")
        ax.plot([], [], "x", color="k", label="known optimum")
        ax.set_xticks(list(config.ns))
        ax.set_xlabel("number of points n")
        ax.set_title(f"S^{d - 1} (d = {d}), β = {beta:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel("inner products ⟨x_i, x_j⟩, i ≠ j")
    fig.suptitle("Final configurations: their pairwise inner products")
    return fig


def _plot_energy(results: Results):
    config = results.config
    by_case = {(r.n, r.d, r.beta): r for r in results.cases}
    nd, nb = len(config.dims), len(config.betas)
    fig, axes = new_figure(nd, nb, figsize=(4.2 * nb, 3.3 * nd), squeeze=False, sharex=True)
    for k, d in enumerate(config.dims):
        for b, beta in enumerate(config.betas):
            ax = axes[k, b]
            for i, n in enumerate(config.ns):
                r = by_case[(n, d, beta)]
                e = r.energy_history
                gap = np.median((e - e[-1]) / np.abs(e[-1]), axis=1)  # vs each start's final E
                ax.semilogy(r.times, np.maximum(gap, 1e-17), color=f"C{i}", label=f"n = {n}")
            ax.set_title(f"d = {d}, β = {beta:g}", fontsize=9)
            if k == nd - 1:
                ax.set_xlabel("time t")
            if b == 0:
                ax.set_ylabel("(E_β(t) − E_β(end)) / E_β(end)\n(median over starts)", fontsize=8)
            ax.set_xscale("symlog", linthresh=config.chunk_time)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6)
    fig.suptitle("Energy decay along the repulsive flow")
    return fig
