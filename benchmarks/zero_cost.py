"""Is the equation/control/scheme machinery free at run time?

The recovered 6-layer post-LN ReLU encoder (`wb.architectures.encoder_from_torch`, which runs as
`integrate(equation, u, LieTrotter(), num_steps=6)`) against what a user would otherwise pick, all
holding the same weights, on the same CPU, in one process:

- `plain_equinox`: a hand-written equinox encoder (`benchmarks/_common.py::ScanEncoder`): stacked
  weights, `lax.scan` over layers, fused-QKV multi-head attention with einsum + softmax,
  LayerNorm, ReLU feed-forward; jitted the same way as the workbench (weights as arguments,
  batch by `jax.vmap`);
- `torch`: `torch.nn.TransformerEncoder` (batch_first, eval, `torch.inference_mode()`, threads =
  CPU count), whatever kernels torch picks for it (its fused encoder fast path when eligible).

Outputs are first checked by value against the workbench (max abs difference < 1e-4). Timing:
warm-up, then `rounds` rounds that each time one forward call of every implementation, in an order
that rotates from round to round (so drift and noise hit all three alike); JAX calls are blocked on.
Reported: median, IQR, ratios of medians workbench/plain-equinox (goal <= 1.10) and
workbench/torch, the median of the per-round ratios, and trace+lower / XLA compile times. For each
implementation both a cold and a warm time: cold = the first call of a freshly jitted forward
after `jax.clear_caches()` (trace + compile + run; torch: its first forward), warm = the median
over the timed rounds.

Run: `python benchmarks/zero_cost.py [--smoke] [--rounds R]`.
"""

import argparse
import collections
import dataclasses
import os
import re
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch
from _common import (
    RESULTS,
    OtherLoad,
    ScanEncoder,
    cpu_count,
    environment,
    stats,
    table,
    torch_encoder,
    wait_for_quiet,
    write_json,
)

import workbench as wb

GOAL_VS_PLAIN = 1.10
TOLERANCE = 1e-4
OPS_OF_INTEREST = (
    "dot",
    "fusion",
    "dynamic-slice",
    "dynamic-update-slice",
    "transpose",
    "copy",
    "while",
    "conditional",
    "custom-call",
    "reduce",
)


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 256
    num_heads: int = 8
    dim_feedforward: int = 1024
    num_layers: int = 6
    n: int = 128
    batch: int = 8
    dtype: str = "float32"
    warmup: int = 3
    rounds: int = 30  # quiet rounds wanted
    seed: int = 0
    is_smoke: bool = False  # tiny sizes: checks that the script runs; ratios mean nothing
    # Shared machines: wait up to `wait_quiet_s` for other processes to go idle, then keep timing
    # until `rounds` rounds were quiet (others used < `quiet_threshold` of the CPUs), within
    # `max_rounds` rounds and `max_timing_s` seconds.
    wait_quiet_s: float = 60.0
    quiet_threshold: float = 0.1
    max_rounds: int = 300
    max_timing_s: float = 150.0

    @classmethod
    def smoke(cls, **overrides) -> "Config":
        base = dict(
            d=32,
            dim_feedforward=128,
            n=16,
            batch=2,
            warmup=2,
            rounds=5,
            max_rounds=5,
            wait_quiet_s=0,
            is_smoke=True,
        )
        return cls(**{**base, **overrides})


def jax_forward(model):
    """`(forward, params)`: `forward(params, x) = vmap(model)(x)`, the weights as arguments (to
    be `jax.jit`-ed)."""
    params, static = eqx.partition(model, eqx.is_array)

    def forward(p, u):
        return jax.vmap(eqx.combine(p, static))(u)

    return forward, params


def compile_times(forward, params, x) -> dict:
    """Cold trace+lower and XLA compile times, plus a census of the optimized HLO."""
    jax.clear_caches()
    t0 = time.perf_counter()
    lowered = jax.jit(forward).lower(params, x)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return {
        "trace_lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "optimized_hlo_ops": hlo_census(compiled.as_text()),
    }


def cold_first_calls(forwards, torch_call, x) -> dict[str, float]:
    """The first call of each implementation, cold: for JAX a new `jax.jit` of the forward after
    `jax.clear_caches()` (trace + compile + run, blocked on); for torch its first forward."""
    out = {}
    for name, (forward, params) in forwards.items():
        jax.clear_caches()
        t = time.perf_counter()
        jax.jit(forward)(params, x).block_until_ready()
        out[name] = time.perf_counter() - t
    t = time.perf_counter()
    torch_call()
    out["torch"] = time.perf_counter() - t
    return out


def hlo_census(text: str) -> dict[str, int]:
    """How many instructions of each interesting opcode the optimized HLO holds (all computations,
    fused ones included)."""
    text = re.sub(r"/\*.*?\*/", "", text)  # `/*index=5*/` comments inside tuple shapes
    # `%name = <shape or (tuple of shapes)> opcode(operands), ...`
    pattern = r"=\s+(?:\([^=]*?\)|[^\s(]+)\s+([a-z][a-z0-9-]*)\("
    counts = collections.Counter(re.findall(pattern, text))
    out = {op: counts.get(op, 0) for op in OPS_OF_INTEREST}
    out["total"] = sum(counts.values())
    return out


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def setup(cfg: Config):
    """Weights, inputs, the three models and their zero-argument forward calls."""
    sd = wb.architectures.random_encoder_state_dict(
        np.random.default_rng(cfg.seed),
        d=cfg.d,
        num_layers=cfg.num_layers,
        dim_feedforward=cfg.dim_feedforward,
        dtype=np.dtype(cfg.dtype),
    )
    x_np = np.random.default_rng(cfg.seed + 1).standard_normal((cfg.batch, cfg.n, cfg.d))
    x_np = x_np.astype(cfg.dtype)
    x, x_t = jnp.asarray(x_np), torch.from_numpy(x_np)
    workbench_model = wb.architectures.encoder_from_torch(
        sd, num_heads=cfg.num_heads, norm_first=False, activation="relu", layer_norm_eps=1e-5
    )
    plain_model = ScanEncoder.from_torch(sd, num_heads=cfg.num_heads, dtype=jnp.dtype(cfg.dtype))
    torch_model = torch_encoder(sd, num_heads=cfg.num_heads, eps=1e-5)
    forwards = {
        "workbench": jax_forward(workbench_model),
        "plain_equinox": jax_forward(plain_model),
    }
    (wb_forward, wb_params), (plain_forward, plain_params) = forwards.values()
    wb_jit, plain_jit = jax.jit(wb_forward), jax.jit(plain_forward)

    def torch_call():
        with torch.inference_mode():
            return torch_model(x_t)

    calls = {
        "workbench": lambda: wb_jit(wb_params, x).block_until_ready(),
        "plain_equinox": lambda: plain_jit(plain_params, x).block_until_ready(),
        "torch": torch_call,
    }
    eager = lambda: jax.vmap(workbench_model)(x)
    return calls, forwards, eager, x


def check_values(calls, eager) -> dict:
    """Every implementation against the workbench (and workbench jit against eager), by value."""
    y_wb = np.asarray(calls["workbench"]())
    check = lambda err: {"max_abs_diff": err, "tol": TOLERANCE, "pass": err < TOLERANCE}
    checks = {
        f"{name}_vs_workbench": check(max_abs(calls[name](), y_wb))
        for name in ("plain_equinox", "torch")
    }
    checks["workbench_eager_vs_jit"] = check(max_abs(eager(), y_wb))
    return checks


def time_rounds(calls, cfg: Config) -> tuple[dict[str, list[float]], list[float | None]]:
    """Interleaved rounds (one call of each implementation per round, rotating order).

    Each round also records the CPU share other processes took meanwhile. Rounds run until
    `cfg.rounds` of them were quiet (other load < `cfg.quiet_threshold`), or `cfg.max_rounds`
    rounds, or `cfg.max_timing_s` seconds, whichever comes first.
    """
    names = list(calls)
    samples = {name: [] for name in names}
    loads = []
    t_end = time.perf_counter() + cfg.max_timing_s
    r = 0
    while r < cfg.max_rounds and time.perf_counter() < t_end:
        with OtherLoad() as load:
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter()
                calls[name]()
                samples[name].append(time.perf_counter() - t)
        loads.append(load.fraction)
        r += 1
        if sum(_is_quiet(f, cfg) for f in loads) >= cfg.rounds:
            break
    return samples, loads


def _is_quiet(fraction, cfg: Config) -> bool:
    return fraction is None or fraction < cfg.quiet_threshold


def summarize(samples: dict, loads: list, cfg: Config) -> dict:
    """Statistics and ratios over the quiet rounds (over all rounds if too few were quiet)."""
    quiet = [i for i, f in enumerate(loads) if _is_quiet(f, cfg)]
    use_quiet = len(quiet) >= min(cfg.rounds, 10)
    keep = quiet if use_quiet else list(range(len(loads)))
    kept = {name: [s[i] for i in keep] for name, s in samples.items()}
    timing = {name: stats(s) for name, s in kept.items()}
    med = {name: t["median_s"] for name, t in timing.items()}
    lo = {name: t["min_s"] for name, t in timing.items()}
    paired = lambda a, b: float(np.median(np.asarray(kept[a]) / np.asarray(kept[b])))
    return {
        "rounds_run": len(loads),
        "rounds_used": len(keep),
        "used": "quiet rounds" if use_quiet else "all rounds (too few quiet ones: contended)",
        "forward": timing,
        "forward_all_rounds": {name: stats(s) for name, s in samples.items()},
        "ratios": {
            "workbench_over_plain_equinox": med["workbench"] / med["plain_equinox"],
            "workbench_over_torch": med["workbench"] / med["torch"],
            "plain_equinox_over_torch": med["plain_equinox"] / med["torch"],
            "paired_median_workbench_over_plain_equinox": paired("workbench", "plain_equinox"),
            "paired_median_workbench_over_torch": paired("workbench", "torch"),
            "min_workbench_over_plain_equinox": lo["workbench"] / lo["plain_equinox"],
            "min_workbench_over_torch": lo["workbench"] / lo["torch"],
        },
    }


def main(cfg: Config, out: str) -> dict:
    t_start = time.perf_counter()
    threads = cpu_count()
    torch.set_num_threads(threads)
    calls, forwards, eager, x = setup(cfg)
    compile_info = {name: compile_times(f, p, x) for name, (f, p) in forwards.items()}
    # Cold first calls: trace + compile + run (JAX: a new jit, caches cleared, so nothing built
    # above is reused) / kernel selection and allocator warm-up (torch).
    first_call = cold_first_calls(forwards, calls["torch"], x)
    checks = check_values(calls, eager)

    quiet = wait_for_quiet(cfg.wait_quiet_s, cfg.quiet_threshold)
    for _ in range(cfg.warmup):
        for call in calls.values():
            call()
    samples, loads = time_rounds(calls, cfg)
    summary = summarize(samples, loads, cfg)
    warm = {name: t["median_s"] for name, t in summary["forward"].items()}
    cold_warm = {
        name: {
            "cold_first_call_s": first_call[name],
            "warm_median_s": warm[name],
            "cold_minus_warm_s": first_call[name] - warm[name],
            "cold_includes": "a first forward" if name == "torch" else "trace + compile + run",
        }
        for name in calls
    }
    ratio = summary["ratios"]["workbench_over_plain_equinox"]
    record = {
        "benchmark": "zero_cost",
        "question": "run-time cost of the workbench encoder vs plain equinox and torch",
        "config": dataclasses.asdict(cfg),
        "environment": {
            **environment(),
            "torch_threads": torch.get_num_threads(),
            "torch_mha_fastpath_enabled": _torch_fastpath(),
        },
        "load": {**quiet, "other_load_per_round": loads},
        "checks": checks,
        **summary,
        "samples_s": samples,
        "first_call_s": first_call,
        "cold_warm": cold_warm,
        "compile": compile_info,
        "goal": {
            "metric": "median workbench / median plain_equinox",
            "target": f"<= {GOAL_VS_PLAIN}",
            "ratio": ratio,
            "pass": bool(ratio <= GOAL_VS_PLAIN),
        },
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(out, record)
    report(record, cfg, out)
    if not all(c["pass"] for c in checks.values()):
        raise SystemExit("a value check failed: the implementations do not compute the same map.")
    return record


def report(record: dict, cfg: Config, out: str) -> None:
    timing, ratios = record["forward"], record["ratios"]
    tokens = cfg.batch * cfg.n
    rows = [
        [
            name,
            1e3 * t["median_s"],
            1e3 * t["iqr_s"],
            1e3 * t["min_s"],
            tokens / t["median_s"],
            t["median_s"] / timing["workbench"]["median_s"],
        ]
        for name, t in timing.items()
    ]
    sizes = (
        f"L={cfg.num_layers} d={cfg.d} heads={cfg.num_heads} ff={cfg.dim_feedforward} "
        f"n={cfg.n} batch={cfg.batch} {cfg.dtype}"
    )
    threads = record["environment"]["torch_threads"]
    print(f"forward; {sizes}; {threads} CPU threads")
    used, run = record["rounds_used"], record["rounds_run"]
    print(f"{used} of {run} interleaved rounds ({record['used']})")
    header = ["impl", "median ms", "IQR ms", "min ms", "tokens/s", "x workbench"]
    print(table(rows, header))
    print()
    cw, comp = record["cold_warm"], record["compile"]
    crows = [
        [
            k,
            comp[k]["trace_lower_s"] if k in comp else "-",
            comp[k]["compile_s"] if k in comp else "-",
            v["cold_first_call_s"],
            1e3 * v["warm_median_s"],
            comp[k]["optimized_hlo_ops"]["total"] if k in comp else "-",
        ]
        for k, v in cw.items()
    ]
    header = [
        "impl",
        "trace+lower s",
        "compile s",
        "cold 1st call s",
        "warm median ms",
        "optimized HLO instrs",
    ]
    print(table(crows, header))
    print("(cold: JAX a new jit after jax.clear_caches(), trace + compile + run; torch its first")
    print(" forward. warm: the median of the timed rounds above)")
    print()
    for name, c in record["checks"].items():
        verdict = "ok" if c["pass"] else "FAIL"
        err = c["max_abs_diff"]
        print(f"check {name:28s} max|diff| = {err:.2e} (tol {TOLERANCE:g}): {verdict}")
    r = ratios["workbench_over_plain_equinox"]
    verdict = "PASS" if r <= GOAL_VS_PLAIN else "FAIL"
    if cfg.is_smoke:
        verdict = "(smoke sizes: not meaningful)"
    print(f"workbench / plain equinox = {r:.3f} (goal <= {GOAL_VS_PLAIN}): {verdict}")
    print(f"workbench / torch         = {ratios['workbench_over_torch']:.3f}")
    print(f"wrote {out}  ({record['wall_s']:.0f} s)")


def _torch_fastpath():
    try:
        return bool(torch.backends.mha.get_fastpath_enabled())
    except AttributeError:
        return None


def parse(argv=None) -> tuple[Config, str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few rounds (seconds)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--wait-quiet", type=float, help="max seconds to wait for an idle machine")
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/)")
    a = ap.parse_args(argv)
    overrides = {"rounds": a.rounds} if a.rounds else {}
    if a.wait_quiet is not None:
        overrides["wait_quiet_s"] = a.wait_quiet
    cfg = Config.smoke(**overrides) if a.smoke else Config(**overrides)
    name = "zero_cost_smoke.json" if a.smoke else "zero_cost.json"
    return cfg, a.out or os.path.join(RESULTS, name)


if __name__ == "__main__":
    main(*parse())
