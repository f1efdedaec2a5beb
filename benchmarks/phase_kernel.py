"""How fast is the batched phase-diagram kernel against NumPy and PyTorch, and how close to peak?

The Fig. 3 kernel (`workbench.particles._sweeps.phase_diagram`): SA, n = 32, d = 128, 1024 random
starts, 300 Euler-then-renormalize steps (dt = 0.1, one β), the clustering statistic every 5
steps (61 saves), float64. Side by side, in one process, the *same algorithm* in four
implementations and three forms:

- forms: `particle` (X in R^{n×d}: `G = X Xᵀ`, `E = exp(βG − β)`, `Y = E X + diag(z/dt − e) X`,
  normalize rows: 4 n² d flops per step); `reduced` (the same on the n × n coordinates of X in an
  orthonormal basis of its row space, one QR per start first: 4 n³); `gram` (the Gram recursion
  `G⁺ = D M G Mᵀ D`, `M = E + diag(z/dt − e)`: 4 n³);
- implementations: `jax` (the workbench kernel, `phase_diagram(..., form=...)`, end to end:
  validation, chunking, async dispatch); `numpy_loop` (a Python loop over starts, each advanced
  with NumPy on its (n, ·) arrays: mostly interpreter overhead at these sizes); `numpy_batched`
  (the same algorithm vectorised over starts: `np.matmul` / `np.linalg.qr` on (starts, n, ·)
  arrays, one Python iteration per step); `torch` (batched over starts: `bmm`, threads = CPU
  count, `torch.inference_mode()`).

All twelve produce the per-start statistics, checked equal as counts of clustered pairs (a pair
within rounding of the threshold 1 − δ could in principle differ; the script fails if any does).
Timing: the first call of each JAX form after `jax.clear_caches()` (cold: trace + compile + run);
warm-up; `rounds` interleaved rounds, one call per implementation per round in a rotating order,
JAX blocked on; medians (warm); the CPU share other processes took during each call is recorded.
Reported: the ratios <baseline>/JAX for every baseline and form (headline: the workbench's default
`reduced` vs the NumPy loop, goal ≥ 8, vs batched torch, goal ≥ 3, and vs batched NumPy,
no goal; and each against the paper's particle form), JAX cold and warm times, achieved GFLOP/s
(matrix-product flops of the algorithm actually run) as a fraction of the best measured float64
matmul peak (2048² `jnp.dot`, `np.matmul`, `torch.mm`, best of 5 each, measured before and after
the rounds: the largest of the six, and the JSON names the library), the ratios within each round
(their spread shows this shared machine's drift), and the time of the full d = 128 Fig. 3 diagram
(90 β × 1024 starts × 300 steps), cold and warm, against the 15-minute budget.

Run: `python benchmarks/phase_kernel.py [--smoke] [--rounds R] [--diagram-betas K]`.
"""

import argparse
import dataclasses
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import (  # noqa: E402
    RESULTS,
    OtherLoad,
    cpu_count,
    environment,
    stats,
    table,
    wait_for_quiet,
    write_json,
)

from workbench.particles import SA, _sweeps  # noqa: E402

FORMS = ("reduced", "gram", "particle")
BASELINES = ("numpy_loop", "numpy_batched", "torch")
IMPLEMENTATIONS = ("jax", *BASELINES)
# The goals (stated against the NumPy loop and batched torch); none for batched NumPy.
GOALS = {"numpy_loop": 8.0, "numpy_batched": None, "torch": 3.0}
PEAK_LIBRARIES = ("jax", "numpy", "torch")
BUDGET_S = 15 * 60


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 32
    d: int = 128
    starts: int = 1024
    steps: int = 300
    save_every: int = 5
    beta: float = 4.0
    dt: float = 0.1
    delta: float = 1e-3
    rounds: int = 3
    warmup: int = 1
    numpy_starts: int = 1024
    """Starts the NumPy loop runs (all by default; fewer are scaled up, and the JSON says so)."""
    diagram_betas: int = 90
    """β values of the full-diagram timing (90 = the whole Fig. 3 diagram; fewer: extrapolated)."""
    peak_size: int = 2048
    wait_quiet_s: float = 60.0
    quiet_threshold: float = 0.1
    seed: int = 0
    is_smoke: bool = False

    @classmethod
    def smoke(cls, **overrides) -> "Config":
        base = dict(
            n=8,
            d=16,
            starts=16,
            steps=20,
            rounds=1,
            numpy_starts=16,
            diagram_betas=2,
            peak_size=256,
            wait_quiet_s=0.0,
            is_smoke=True,
        )
        return cls(**{**base, **overrides})


# ----------------------------------------------------------------------------- flop counts


def flops(form: str, cfg: Config) -> float:
    """Matrix-product flops (2 m n k per product) of the algorithm as run, all starts."""
    n, d, s = cfg.n, cfg.d, cfg.starts
    saves = cfg.steps // cfg.save_every + 1
    r = min(n, d)
    if form == "particle":  # G and E X per step; G again at each save
        per_start = cfg.steps * 4 * n * n * d + saves * 2 * n * n * d
    elif form == "reduced":  # QR of the (d, n) start, then the particle form in r coordinates
        per_start = 2 * d * n * n - 2 * n**3 / 3 + cfg.steps * 4 * n * n * r + saves * 2 * n * n * r
    else:  # G0 = X Xᵀ, then M G and (M G) Mᵀ per step
        per_start = 2 * n * n * d + cfg.steps * 4 * n**3
    return float(per_start * s)


def exps(cfg: Config) -> float:
    return float(cfg.n * cfg.n * cfg.steps * cfg.starts)


# ----------------------------------------------------------------------------- implementations


def _upper(n):
    return np.triu(np.ones((n, n), dtype=bool), k=1)


def numpy_run(form: str, x: np.ndarray, cfg: Config) -> np.ndarray:
    """The statistic `(S, T)` with a loop over starts; NumPy on each start's arrays."""
    n = cfg.n
    upper = _upper(n)
    thr = 1.0 - cfg.delta
    pairs = n * (n - 1) / 2
    beta, dt = cfg.beta, cfg.dt
    saves = cfg.steps // cfg.save_every + 1
    out = np.zeros((x.shape[0], saves))
    for s in range(x.shape[0]):
        if form == "gram":
            g = x[s] @ x[s].T
            out[s, 0] = np.count_nonzero(g[upper] >= thr) / pairs
            for k in range(1, cfg.steps + 1):
                e = np.exp(beta * g - beta)
                m = e.copy()
                m[np.diag_indices(n)] += e.sum(axis=1) / dt - (e * g).sum(axis=1)
                h = (m @ g) @ m.T
                r = 1.0 / np.sqrt(np.diag(h))
                g = h * r[:, None] * r[None, :]
                if k % cfg.save_every == 0:
                    out[s, k // cfg.save_every] = np.count_nonzero(g[upper] >= thr) / pairs
            continue
        y = x[s] if form == "particle" else _numpy_reduce(x[s])
        g = y @ y.T
        out[s, 0] = np.count_nonzero(g[upper] >= thr) / pairs
        for k in range(1, cfg.steps + 1):
            g = y @ y.T
            e = np.exp(beta * g - beta)
            w = e.sum(axis=1) / dt - (e * g).sum(axis=1)
            y = e @ y + w[:, None] * y
            y = y / np.sqrt((y * y).sum(axis=1))[:, None]
            if k % cfg.save_every == 0:
                g = y @ y.T
                out[s, k // cfg.save_every] = np.count_nonzero(g[upper] >= thr) / pairs
    return out


def _numpy_reduce(x):
    n, d = x.shape
    if d <= n:
        return x
    return np.linalg.qr(x.T, mode="r").T


def numpy_batched_run(form: str, x: np.ndarray, cfg: Config) -> np.ndarray:
    """The statistic `(S, T)`, the loop's algorithm vectorised over starts: `np.matmul` on
    `(S, n, ·)` stacks, so Python runs once per step, not once per step and start."""
    n = cfg.n
    upper = _upper(n)
    thr = 1.0 - cfg.delta
    pairs = n * (n - 1) / 2
    beta, dt = cfg.beta, cfg.dt
    diag = np.arange(n)
    stat = lambda g: np.count_nonzero((g >= thr) & upper, axis=(1, 2)) / pairs
    out = [None] * (cfg.steps // cfg.save_every + 1)
    if form == "gram":
        g = np.matmul(x, x.mT)
        out[0] = stat(g)
        for k in range(1, cfg.steps + 1):
            m = np.exp(beta * g - beta)
            w = m.sum(axis=2) / dt - (m * g).sum(axis=2)
            m[:, diag, diag] += w  # M = E + diag(z/dt − e)
            h = np.matmul(np.matmul(m, g), m.mT)
            r = 1.0 / np.sqrt(np.diagonal(h, axis1=1, axis2=2))
            g = h * r[:, :, None] * r[:, None, :]
            if k % cfg.save_every == 0:
                out[k // cfg.save_every] = stat(g)
        return np.stack(out, axis=1)
    y = x
    if form == "reduced" and cfg.d > n:  # R factor of every start's (d, n) matrix at once
        y = np.linalg.qr(x.mT, mode="r").mT
    out[0] = stat(np.matmul(y, y.mT))
    for k in range(1, cfg.steps + 1):
        g = np.matmul(y, y.mT)
        e = np.exp(beta * g - beta)
        w = e.sum(axis=2) / dt - (e * g).sum(axis=2)
        y = np.matmul(e, y) + w[:, :, None] * y
        y = y / np.sqrt((y * y).sum(axis=2))[:, :, None]
        if k % cfg.save_every == 0:
            out[k // cfg.save_every] = stat(np.matmul(y, y.mT))
    return np.stack(out, axis=1)


def torch_run(form: str, x: torch.Tensor, cfg: Config) -> np.ndarray:
    """The statistic `(S, T)`, batched over starts with `bmm`."""
    n = cfg.n
    upper = torch.from_numpy(_upper(n))
    thr = 1.0 - cfg.delta
    pairs = n * (n - 1) / 2
    beta, dt = cfg.beta, cfg.dt
    eye = torch.eye(n, dtype=x.dtype)
    stat = lambda g: ((g >= thr) & upper).sum(dim=(1, 2)).to(x.dtype) / pairs
    out = []
    with torch.inference_mode():
        if form == "gram":
            g = torch.bmm(x, x.transpose(1, 2))
            out.append(stat(g))
            for k in range(1, cfg.steps + 1):
                e = torch.exp(beta * g - beta)
                w = e.sum(dim=2) / dt - (e * g).sum(dim=2)
                m = e + eye * w[:, :, None]
                h = torch.bmm(torch.bmm(m, g), m.transpose(1, 2))
                r = torch.rsqrt(torch.diagonal(h, dim1=1, dim2=2))
                g = h * r[:, :, None] * r[:, None, :]
                if k % cfg.save_every == 0:
                    out.append(stat(g))
            return torch.stack(out, dim=1).numpy()
        y = x
        if form == "reduced" and cfg.d > n:
            y = torch.linalg.qr(x.transpose(1, 2), mode="r")[1].transpose(1, 2)
        out.append(stat(torch.bmm(y, y.transpose(1, 2))))
        for k in range(1, cfg.steps + 1):
            g = torch.bmm(y, y.transpose(1, 2))
            e = torch.exp(beta * g - beta)
            w = e.sum(dim=2) / dt - (e * g).sum(dim=2)
            y = torch.bmm(e, y) + w[:, :, None] * y
            y = y * torch.rsqrt((y * y).sum(dim=2, keepdim=True))
            if k % cfg.save_every == 0:
                out.append(stat(torch.bmm(y, y.transpose(1, 2))))
        return torch.stack(out, dim=1).numpy()


def jax_run(form: str, x, cfg: Config) -> np.ndarray:
    """The workbench kernel, end to end (validation, chunks, async dispatch)."""
    option = {
        "reduced": _sweeps.ReducedForm(),
        "gram": _sweeps.GramForm(),
        "particle": _sweeps.ParticleForm(),
    }[form]
    pd = _sweeps.phase_diagram(
        SA(cfg.beta),
        x,
        dt=cfg.dt,
        save_ts=cfg.dt * cfg.save_every * np.arange(cfg.steps // cfg.save_every + 1),
        delta=cfg.delta,
        form=option,
        per_start=True,
        progress=False,
    )
    return pd.per_start[0]


# ----------------------------------------------------------------------------- measurements


def matmul_peak(cfg: Config) -> dict:
    """Best-of-5 GFLOP/s of a large float64 square product in each library."""
    m = cfg.peak_size
    a = np.random.default_rng(1).standard_normal((m, m))
    aj, at = jnp.asarray(a), torch.from_numpy(a)
    dot = jax.jit(jnp.dot)
    dot(aj, aj).block_until_ready()
    calls = {
        "jax": lambda: dot(aj, aj).block_until_ready(),
        "numpy": lambda: a @ a,
        "torch": lambda: torch.mm(at, at),
    }
    out = {}
    for name, call in calls.items():
        call()
        best = min(_timed(call) for _ in range(5))
        out[name] = 2 * m**3 / best / 1e9
    out["size"] = m
    return out


def _timed(call) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def full_diagram(cfg: Config, x) -> dict:
    """Time the Fig. 3 diagram at this d: `diagram_betas` of the 90 β (extrapolated if fewer).

    Two identical calls: the first after `jax.clear_caches()` (cold: what a user waits for,
    trace + compile included), then a second one (warm). Extrapolating to 90 β scales the warm
    time and adds the compile once: `cold − warm + warm · 90 / K`.
    """
    betas = 9.0 * np.arange(1, 91) / 90
    chosen = betas[:: max(1, 90 // cfg.diagram_betas)][: cfg.diagram_betas]
    save_ts = 0.5 * np.arange(61)
    steps_total = round(30.0 / cfg.dt)
    kwargs = dict(dt=cfg.dt, save_ts=save_ts if not cfg.is_smoke else save_ts[:3], progress=False)
    walls, loads = [], []
    jax.clear_caches()
    for _ in range(2):
        with OtherLoad() as load:
            t = time.perf_counter()
            pd = _sweeps.phase_diagram(eqx.filter_vmap(SA)(jnp.asarray(chosen)), x, **kwargs)
            walls.append(time.perf_counter() - t)
        loads.append(load.fraction)
    cold, warm = walls
    scale = 90 / chosen.size
    full_cold = (cold - warm) + warm * scale
    return {
        "betas_timed": int(chosen.size),
        "starts": int(x.shape[0]),
        "steps": steps_total if not cfg.is_smoke else 10,
        "form": type(pd.form).__name__,
        "cold_s": cold,
        "warm_s": warm,
        "compile_estimate_s": cold - warm,
        "full_diagram_cold_s": full_cold,
        "full_diagram_warm_s": warm * scale,
        "extrapolated": bool(chosen.size < 90),
        "budget_s": BUDGET_S,
        "budget_compares": "full_diagram_cold_s (one call as a user runs it, compile included)",
        "within_budget": bool(full_cold < BUDGET_S),
        "other_load_cold_warm": loads,
    }


def peak_reference(before: dict, after: dict) -> dict:
    """The best float64 matmul rate measured in this run: max over libraries and before/after."""
    when, lib = max(
        ((w, lib) for w in ("before", "after") for lib in PEAK_LIBRARIES),
        key=lambda wl: {"before": before, "after": after}[wl[0]][wl[1]],
    )
    gflops = {"before": before, "after": after}[when][lib]
    return {
        "gflops": gflops,
        "library": lib,
        "measured": when,
        "size": before["size"],
        "rule": "max over jnp.dot (jitted), np.matmul and torch.mm, before and after the rounds",
    }


def main(cfg: Config, out: str) -> dict:
    t_start = time.perf_counter()
    torch.set_num_threads(cpu_count())
    rng = np.random.default_rng(cfg.seed)
    x_np = rng.standard_normal((cfg.starts, cfg.n, cfg.d))
    x_np /= np.linalg.norm(x_np, axis=-1, keepdims=True)
    x_jax, x_torch = jnp.asarray(x_np), torch.from_numpy(x_np)
    x_loop = x_np[: cfg.numpy_starts]
    loop_scale = cfg.starts / cfg.numpy_starts

    calls = {}
    for form in FORMS:
        calls[("jax", form)] = lambda form=form: jax_run(form, x_jax, cfg)
        calls[("numpy_loop", form)] = lambda form=form: numpy_run(form, x_loop, cfg)
        calls[("numpy_batched", form)] = lambda form=form: numpy_batched_run(form, x_np, cfg)
        calls[("torch", form)] = lambda form=form: torch_run(form, x_torch, cfg)

    # First calls (JAX: cold, caches cleared before each form), then the value check.
    first_call = {}
    results = {}
    for key, call in calls.items():
        if key[0] == "jax":
            jax.clear_caches()
        t = time.perf_counter()
        results[key] = call()
        first_call["/".join(key)] = time.perf_counter() - t
    # Compare clustered-pair counts (the fractions can differ in the last bit: XLA may multiply
    # by 1/pairs where NumPy divides).
    pairs = cfg.n * (cfg.n - 1) / 2
    reference = np.rint(results[("jax", "reduced")] * pairs)
    checks = {}
    for key, value in results.items():
        counts = np.rint(value * pairs)
        ref = reference[: value.shape[0]]
        checks["/".join(key)] = {
            "differing_cells": int(np.count_nonzero(counts != ref)),
            "cells": int(value.size),
            "max_abs_diff_of_mean": float(np.abs(counts.mean(0) - ref.mean(0)).max() / pairs),
        }

    quiet = wait_for_quiet(cfg.wait_quiet_s, cfg.quiet_threshold)
    peak_before = matmul_peak(cfg)
    for _ in range(cfg.warmup):  # NumPy compiles nothing: its first call was its warm-up
        for key, call in calls.items():
            if not key[0].startswith("numpy"):
                call()
    keys = list(calls)
    samples = {"/".join(k): [] for k in keys}
    loads = {"/".join(k): [] for k in keys}
    for r in range(cfg.rounds):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            with OtherLoad() as load:
                seconds = _timed(calls[key])
            scale = loop_scale if key[0] == "numpy_loop" else 1.0
            samples["/".join(key)].append(seconds * scale)
            loads["/".join(key)].append(load.fraction)
    first_call = {
        k: v * (loop_scale if k.startswith("numpy_loop/") else 1.0) for k, v in first_call.items()
    }

    timing = {k: stats(v) for k, v in samples.items()}
    med = {k: t["median_s"] for k, t in timing.items()}
    ratios = {}
    for form in FORMS:
        for other in BASELINES:
            ratios[f"{other}_over_jax/{form}"] = med[f"{other}/{form}"] / med[f"jax/{form}"]
            ratios[f"{other}_particle_over_jax/{form}"] = (
                med[f"{other}/particle"] / med[f"jax/{form}"]
            )
    # Ratios within each round (calls minutes apart): their spread shows the drift.
    paired = {}
    for form in FORMS:
        for other in BASELINES:
            r = np.array(samples[f"{other}/{form}"]) / np.array(samples[f"jax/{form}"])
            paired[f"{other}_over_jax/{form}"] = {
                "per_round": r.tolist(),
                "median": float(np.median(r)),
                "min": float(r.min()),
                "max": float(r.max()),
            }
    # JAX: cold = the first call after jax.clear_caches() (trace + compile + run), warm = the
    # median of the timed rounds.
    cold_warm = {
        k: {
            "cold_s": first_call[k],
            "warm_median_s": med[k],
            "cold_minus_warm_s": first_call[k] - med[k],
        }
        for k in first_call
        if k.startswith("jax/")
    }
    # The machine's speed drifts (shared host): the peak is measured before and after the timing
    # rounds; fractions use the best rate any library reached (what the machine can do).
    peak_after = matmul_peak(cfg)
    peak = {k: max(peak_before[k], peak_after[k]) for k in peak_before}
    best = peak_reference(peak_before, peak_after)
    gflops = {k: flops(k.split("/")[1], cfg) / med[k] / 1e9 for k in med}
    diagram = full_diagram(cfg, x_jax)
    headline = {
        other: {
            "metric": f"median {other}/reduced over median jax/reduced (same algorithm)",
            "target": None if GOALS[other] is None else f">= {GOALS[other]}",
            "ratio": ratios[f"{other}_over_jax/reduced"],
            "pass": None
            if GOALS[other] is None
            else bool(ratios[f"{other}_over_jax/reduced"] >= GOALS[other]),
        }
        for other in BASELINES
    }
    record = {
        "benchmark": "phase_kernel",
        "question": (
            "batched phase-diagram kernel vs a NumPy loop, batched NumPy and batched torch; "
            "GFLOP/s as a fraction of the best measured matmul peak"
        ),
        "config": dataclasses.asdict(cfg),
        "environment": {**environment(), "torch_threads": torch.get_num_threads()},
        "load": {**quiet, "other_load_per_call": loads},
        "checks": checks,
        "numpy_loop_starts_scaled_by": loop_scale,
        # First call of every implementation (NumPy loop scaled like its samples); for JAX cold.
        "first_call_s": first_call,
        "jax_cold_warm": cold_warm,
        "timing": timing,
        "samples_s": samples,
        "ratios": ratios,
        "flops": {form: flops(form, cfg) for form in FORMS},
        "exps": exps(cfg),
        "gflops": gflops,
        "paired_ratios": paired,
        "matmul_peak_gflops": peak,
        "matmul_peak_gflops_before_after": {"before": peak_before, "after": peak_after},
        "peak_reference": best,
        "fraction_of_best_peak": {k: g / best["gflops"] for k, g in gflops.items()},
        "full_diagram": diagram,
        "goals": headline,
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(out, record)
    report(record, cfg, out)
    bad = [k for k, c in checks.items() if c["differing_cells"] > 0]
    if bad:
        raise SystemExit(f"value check failed for {bad}: the implementations disagree.")
    return record


def report(record: dict, cfg: Config, out: str) -> None:
    timing, ratios, gflops = record["timing"], record["ratios"], record["gflops"]
    peak, best = record["matmul_peak_gflops"], record["peak_reference"]
    print(
        f"phase kernel: n={cfg.n} d={cfg.d} starts={cfg.starts} steps={cfg.steps} float64; "
        f"{record['environment']['torch_threads']} torch threads; matmul peak (float64, "
        f"{peak['size']}², larger of before/after): jax {peak['jax']:.1f}, numpy "
        f"{peak['numpy']:.1f}, torch {peak['torch']:.1f} GFLOP/s"
    )
    print(
        f"fractions of peak use the best measured: {best['gflops']:.1f} GFLOP/s "
        f"({best['library']}, {best['measured']} the rounds)"
    )
    if record["numpy_loop_starts_scaled_by"] != 1:
        print(
            f"numpy_loop ran {cfg.numpy_starts} starts, times scaled by "
            f"{record['numpy_loop_starts_scaled_by']:g}"
        )
    rows = []
    for k, t in timing.items():
        impl, form = k.split("/")
        per = t["median_s"] / (cfg.starts * cfg.steps) * 1e6
        rows.append(
            [
                impl,
                form,
                record["first_call_s"][k],
                t["median_s"],
                t["iqr_s"],
                per,
                gflops[k],
                record["fraction_of_best_peak"][k],
                record["checks"][k]["differing_cells"],
            ]
        )
    header = [
        "impl",
        "form",
        "1st call s",
        "warm median s",
        "IQR s",
        "us/step/start",
        "GFLOP/s",
        "x best peak",
        "cells != ref",
    ]
    print(table(rows, header))
    print(
        "(1st call: JAX cold = after jax.clear_caches(), trace + compile + run; others: first run)"
    )
    print()
    for form in FORMS:
        print(
            f"{form:9s} "
            + "   ".join(f"{o}/jax = {ratios[f'{o}_over_jax/{form}']:6.2f}" for o in BASELINES)
        )
    print(
        "vs the paper's particle form, baseline particle / jax reduced: "
        + ", ".join(f"{o} {ratios[f'{o}_particle_over_jax/reduced']:.2f}" for o in BASELINES)
    )
    for other, g in record["goals"].items():
        if g["target"] is None:
            verdict = "(no goal)"
        else:
            verdict = "PASS" if g["pass"] else "FAIL"
            verdict = f"{g['target']}: {verdict}"
        if cfg.is_smoke:
            verdict += " (smoke sizes: not meaningful)"
        p = record["paired_ratios"][f"{other}_over_jax/reduced"]
        print(
            f"reduced, {other}/jax: {g['ratio']:.2f} {verdict}   "
            f"(per round: median {p['median']:.2f}, range {p['min']:.2f}–{p['max']:.2f})"
        )
    ba = record["matmul_peak_gflops_before_after"]
    print(
        "matmul peak before / after the rounds: "
        + ", ".join(
            f"{lib} {ba['before'][lib]:.1f} / {ba['after'][lib]:.1f}" for lib in PEAK_LIBRARIES
        )
        + " GFLOP/s"
    )
    cw = ", ".join(
        f"{k.split('/')[1]} {v['cold_s']:.2f} / {v['warm_median_s']:.3f} s"
        for k, v in record["jax_cold_warm"].items()
    )
    print(f"JAX cold / warm: {cw}")
    dg = record["full_diagram"]
    how = "extrapolated from " + str(dg["betas_timed"]) + " β" if dg["extrapolated"] else "measured"
    print(
        f"full Fig. 3 diagram at d = {cfg.d} ({dg['form']}, {dg['starts']} starts, {how}): "
        f"cold {dg['full_diagram_cold_s']:.1f} s, warm {dg['full_diagram_warm_s']:.1f} s; "
        f"budget {BUDGET_S} s (cold): {'within' if dg['within_budget'] else 'OVER'}"
    )
    print(f"wrote {out}  ({record['wall_s']:.0f} s)")


def parse(argv=None) -> tuple[Config, str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, one round (seconds)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--numpy-starts", type=int, help="starts the NumPy loop runs (scaled up)")
    ap.add_argument("--diagram-betas", type=int, help="β values of the full-diagram timing")
    ap.add_argument("--wait-quiet", type=float, help="max seconds to wait for an idle machine")
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/)")
    a = ap.parse_args(argv)
    overrides = {}
    for field, value in (
        ("rounds", a.rounds),
        ("numpy_starts", a.numpy_starts),
        ("diagram_betas", a.diagram_betas),
        ("wait_quiet_s", a.wait_quiet),
    ):
        if value is not None:
            overrides[field] = value
    cfg = Config.smoke(**overrides) if a.smoke else Config(**overrides)
    name = "phase_kernel_smoke.json" if a.smoke else "phase_kernel.json"
    return cfg, a.out or os.path.join(RESULTS, name)


if __name__ == "__main__":
    main(*parse())
