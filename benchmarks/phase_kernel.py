"""How fast is the batched phase-diagram kernel against NumPy and PyTorch, and how close to peak?

The Fig. 3 kernel (`workbench.particles._sweeps.phase_diagram`): SA, n = 32, d = 128, 1024 random
starts, 300 Euler-then-renormalize steps (dt = 0.1, one β), the clustering statistic every 5
steps (61 saves), float64. Side by side, in one process, the *same algorithm* in three
implementations and three forms:

- forms: `particle` (X in R^{n×d}: `G = X Xᵀ`, `E = exp(βG − β)`, `Y = E X + diag(z/dt − e) X`,
  normalize rows: 4 n² d flops per step); `reduced` (the same on the n × n coordinates of X in an
  orthonormal basis of its row space, one QR per start first: 4 n³); `gram` (the Gram recursion
  `G⁺ = D M G Mᵀ D`, `M = E + diag(z/dt − e)`: 4 n³);
- implementations: `jax` (the workbench kernel, `phase_diagram(..., form=...)`, end to end:
  validation, chunking, async dispatch); `numpy` (a loop over starts, each advanced with NumPy on
  its (n, ·) arrays); `torch` (batched over starts: `bmm`, threads = CPU count,
  `torch.inference_mode()`).

All nine produce the per-start statistics, checked equal as counts of clustered pairs (a pair
within rounding of the threshold 1 − δ could in principle differ; the script fails if any does).
Timing: JIT compile separately; warm-up; `rounds` interleaved rounds, one call per
implementation per round in a rotating order, JAX blocked on; medians; the CPU share other
processes took during each call is recorded. Reported: the ratios NumPy/JAX and torch/JAX for
every form (headline: the workbench's default `reduced` vs the NumPy loop, goal ≥ 8, and vs
batched torch, goal ≥ 3; and each against the paper's particle form), achieved GFLOP/s
(matrix-product flops of the algorithm actually run) against the measured float64 matmul peak
(2048² `jnp.dot`, `np.dot`, `torch.mm`, best of 5, measured before and after the rounds; the
larger is used: this shared machine's speed drifts), the ratios within each round (their spread
shows that drift), and the time of the full d = 128 Fig. 3 diagram (90 β × 1024 starts × 300
steps) against the 15-minute budget.

Run: `python benchmarks/phase_kernel.py [--smoke] [--rounds R] [--diagram-betas K]`.
"""

import argparse
import dataclasses
import os
import time

import jax

jax.config.update("jax_enable_x64", True)

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

from workbench.particles import _sweeps  # noqa: E402

FORMS = ("reduced", "gram", "particle")
IMPLEMENTATIONS = ("jax", "numpy", "torch")
GOALS = {"numpy": 8.0, "torch": 3.0}
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
        np.array([cfg.beta]),
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
    """Time the Fig. 3 diagram at this d: `diagram_betas` of the 90 β, extrapolated if fewer."""
    betas = 9.0 * np.arange(1, 91) / 90
    chosen = betas[:: max(1, 90 // cfg.diagram_betas)][: cfg.diagram_betas]
    save_ts = 0.5 * np.arange(61)
    steps_total = round(30.0 / cfg.dt)
    kwargs = dict(dt=cfg.dt, save_ts=save_ts if not cfg.is_smoke else save_ts[:3], progress=False)
    _sweeps.phase_diagram(chosen[:1], x[:8], **kwargs)  # compile the chunk shape used below
    with OtherLoad() as load:
        t = time.perf_counter()
        pd = _sweeps.phase_diagram(chosen, x, **kwargs)
        wall = time.perf_counter() - t
    full = wall * 90 / chosen.size
    return {
        "betas_timed": int(chosen.size),
        "starts": int(x.shape[0]),
        "steps": steps_total if not cfg.is_smoke else 10,
        "form": type(pd.form).__name__,
        "wall_s": wall,
        "full_diagram_s": full,
        "extrapolated": bool(chosen.size < 90),
        "budget_s": BUDGET_S,
        "within_budget": bool(full < BUDGET_S),
        "other_load": load.fraction,
    }


def main(cfg: Config, out: str) -> dict:
    t_start = time.perf_counter()
    torch.set_num_threads(cpu_count())
    rng = np.random.default_rng(cfg.seed)
    x_np = rng.standard_normal((cfg.starts, cfg.n, cfg.d))
    x_np /= np.linalg.norm(x_np, axis=-1, keepdims=True)
    x_jax, x_torch = jnp.asarray(x_np), torch.from_numpy(x_np)
    x_numpy = x_np[: cfg.numpy_starts]
    numpy_scale = cfg.starts / cfg.numpy_starts

    calls = {}
    for form in FORMS:
        calls[("jax", form)] = lambda form=form: jax_run(form, x_jax, cfg)
        calls[("numpy", form)] = lambda form=form: numpy_run(form, x_numpy, cfg)
        calls[("torch", form)] = lambda form=form: torch_run(form, x_torch, cfg)

    # compile (and first call) times, then the value check
    first_call = {}
    results = {}
    for key, call in calls.items():
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
    for _ in range(cfg.warmup):
        for key, call in calls.items():
            if key[0] != "numpy":
                call()
    keys = list(calls)
    samples = {"/".join(k): [] for k in keys}
    loads = {"/".join(k): [] for k in keys}
    for r in range(cfg.rounds):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            with OtherLoad() as load:
                seconds = _timed(calls[key])
            scale = numpy_scale if key[0] == "numpy" else 1.0
            samples["/".join(key)].append(seconds * scale)
            loads["/".join(key)].append(load.fraction)

    timing = {k: stats(v) for k, v in samples.items()}
    med = {k: t["median_s"] for k, t in timing.items()}
    ratios = {}
    for form in FORMS:
        for other in ("numpy", "torch"):
            ratios[f"{other}_over_jax/{form}"] = med[f"{other}/{form}"] / med[f"jax/{form}"]
            ratios[f"{other}_particle_over_jax/{form}"] = (
                med[f"{other}/particle"] / med[f"jax/{form}"]
            )
    # The machine's speed drifts (shared host): the peak is measured before and after the timing
    # rounds, and fractions use the larger (what the machine can do).
    peak_after = matmul_peak(cfg)
    peak = {k: max(peak_before[k], peak_after[k]) for k in peak_before}
    # Ratios within each round (calls minutes apart): their spread shows the drift.
    paired = {}
    for form in FORMS:
        for other in ("numpy", "torch"):
            r = np.array(samples[f"{other}/{form}"]) / np.array(samples[f"jax/{form}"])
            paired[f"{other}_over_jax/{form}"] = {
                "per_round": r.tolist(),
                "median": float(np.median(r)),
                "min": float(r.min()),
                "max": float(r.max()),
            }
    gflops = {k: flops(k.split("/")[1], cfg) / med[k] / 1e9 for k in med}
    diagram = full_diagram(cfg, x_jax)
    headline = {
        other: {
            "metric": f"median {other}/reduced over median jax/reduced (same algorithm)",
            "target": f">= {GOALS[other]}",
            "ratio": ratios[f"{other}_over_jax/reduced"],
            "pass": bool(ratios[f"{other}_over_jax/reduced"] >= GOALS[other]),
        }
        for other in ("numpy", "torch")
    }
    record = {
        "benchmark": "phase_kernel",
        "question": "batched phase-diagram kernel vs a NumPy loop and batched torch; GFLOP/s",
        "config": dataclasses.asdict(cfg),
        "environment": {**environment(), "torch_threads": torch.get_num_threads()},
        "load": {**quiet, "other_load_per_call": loads},
        "checks": checks,
        "numpy_starts_scaled_by": numpy_scale,
        "first_call_s": first_call,
        # Trace + XLA compile of the JAX kernel: its first call minus its median call.
        "jax_compile_s": {k: first_call[k] - med[k] for k in first_call if k.startswith("jax/")},
        "timing": timing,
        "samples_s": samples,
        "ratios": ratios,
        "flops": {form: flops(form, cfg) for form in FORMS},
        "exps": exps(cfg),
        "gflops": gflops,
        "paired_ratios": paired,
        "matmul_peak_gflops": peak,
        "matmul_peak_gflops_before_after": {"before": peak_before, "after": peak_after},
        "fraction_of_jax_peak": {k: g / peak["jax"] for k, g in gflops.items()},
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
    peak = record["matmul_peak_gflops"]
    print(
        f"phase kernel: n={cfg.n} d={cfg.d} starts={cfg.starts} steps={cfg.steps} float64; "
        f"{record['environment']['torch_threads']} torch threads; matmul peak (float64, "
        f"{peak['size']}²): jax {peak['jax']:.1f}, numpy {peak['numpy']:.1f}, torch "
        f"{peak['torch']:.1f} GFLOP/s"
    )
    rows = []
    for k, t in timing.items():
        impl, form = k.split("/")
        per = t["median_s"] / (cfg.starts * cfg.steps) * 1e6
        rows.append(
            [
                impl,
                form,
                t["median_s"],
                t["iqr_s"],
                per,
                gflops[k],
                gflops[k] / peak["jax"],
                record["checks"][k]["differing_cells"],
            ]
        )
    header = [
        "impl",
        "form",
        "median s",
        "IQR s",
        "us/step/start",
        "GFLOP/s",
        "x jax peak",
        "cells != ref",
    ]
    print(table(rows, header))
    print()
    for form in FORMS:
        print(
            f"{form:9s} numpy/jax = {ratios[f'numpy_over_jax/{form}']:6.2f}   "
            f"torch/jax = {ratios[f'torch_over_jax/{form}']:6.2f}   "
            f"(numpy particle / jax {form} = {ratios[f'numpy_particle_over_jax/{form}']:6.2f}, "
            f"torch particle / jax {form} = {ratios[f'torch_particle_over_jax/{form}']:6.2f})"
        )
    for other, g in record["goals"].items():
        verdict = "PASS" if g["pass"] else "FAIL"
        if cfg.is_smoke:
            verdict = "(smoke sizes: not meaningful)"
        p = record["paired_ratios"][f"{other}_over_jax/reduced"]
        print(
            f"goal {other}: {g['ratio']:.2f} ({g['target']}): {verdict}   "
            f"(per round: median {p['median']:.2f}, range {p['min']:.2f}–{p['max']:.2f})"
        )
    ba = record["matmul_peak_gflops_before_after"]
    print(
        f"matmul peak (jax) before / after the rounds: {ba['before']['jax']:.1f} / "
        f"{ba['after']['jax']:.1f} GFLOP/s (fractions use the larger)"
    )
    compile_s = ", ".join(
        f"{k.split('/')[1]} {v:.2f} s" for k, v in record["jax_compile_s"].items()
    )
    print(f"JAX trace + compile (first call − median): {compile_s}")
    dg = record["full_diagram"]
    how = "extrapolated from " + str(dg["betas_timed"]) + " β" if dg["extrapolated"] else "measured"
    print(
        f"full Fig. 3 diagram at d = {cfg.d} ({dg['form']}, {dg['starts']} starts): "
        f"{dg['full_diagram_s']:.0f} s ({how}); budget {BUDGET_S} s: "
        f"{'within' if dg['within_budget'] else 'OVER'}"
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
