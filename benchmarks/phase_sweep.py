"""How long does the whole Fig. 3 sweep take, for every d of the paper, on this machine's device?

The prepared command for an accelerator: the full Fig. 3 sweep for all six d in one command,
timings to JSON (commit them); it runs on CPU too.
For each d in (2, 8, 32, 128, 512, 1024): SA, n = 32, 90 values β = 0.1 … 9, 1024 random starts
(the same for every β), t ∈ [0, 30] with Euler-then-renormalize at dt = 0.1 (300 steps), the
statistic every 0.5 (61 saves), δ = 1e-3, float64 — `wb.particles.phase_diagram` end to end with
its defaults (reduced form, default chunking for the backend).

Reported per d: the wall time of the sweep as a user runs it (first call: includes the one
compilation), its throughput in matrix-product GFLOP/s (the reduced form's flops, as counted by
`phase_kernel.py`) and as a fraction of the device's float32 and float64 matmul peaks (measured
here: best of 5 jitted `jnp.dot`, 8192² on an accelerator, 2048² on a CPU), a second identical run when the first took under `--repeat-under` seconds (then
`compile_s` ≈ first − second), trajectory-steps per second, and the values needed to compare
devices: the statistic at t = 30 for every β (`fraction_t30`) and its minimum over β ≤ 1 (the
one-cluster check, ≥ 0.99). The CPU and GPU files can be diffed: the same starts (seed) give the
same diagram up to rounding.

Run: `python benchmarks/phase_sweep.py [--smoke] [--ds 128 1024] [--out PATH]`; writes
`results/phase_sweep_<backend>.json` (`_smoke` added for `--smoke`).
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
from _common import RESULTS, OtherLoad, environment, matmul_peaks, write_json  # noqa: E402

from workbench import particles as P  # noqa: E402

PAPER_DS = (2, 8, 32, 128, 512, 1024)


@dataclasses.dataclass(frozen=True)
class Config:
    ds: tuple[int, ...] = PAPER_DS
    n: int = 32
    num_betas: int = 90
    beta_max: float = 9.0
    num_starts: int = 1024
    t_max: float = 30.0
    save_every: float = 0.5
    dt: float = 0.1
    delta: float = 1e-3
    repeat_under_s: float = 60.0
    seed: int = 0
    is_smoke: bool = False

    @classmethod
    def smoke(cls, **overrides) -> "Config":
        base = dict(ds=(8, 32), num_betas=3, num_starts=16, t_max=2.0, is_smoke=True)
        return cls(**{**base, **overrides})


def sweep(cfg: Config, d: int, peaks: dict) -> dict:
    betas = cfg.beta_max * np.arange(1, cfg.num_betas + 1) / cfg.num_betas
    save_ts = cfg.save_every * np.arange(round(cfg.t_max / cfg.save_every) + 1)
    key = jax.random.fold_in(jax.random.key(cfg.seed), d)
    starts = P.random_starts(key, cfg.num_starts, cfg.n, d)
    starts.block_until_ready()
    sa = eqx.filter_vmap(P.SA)(jnp.asarray(betas))  # one SA per β

    def run():
        t = time.perf_counter()
        pd = P.phase_diagram(
            sa, starts, dt=cfg.dt, save_ts=save_ts, delta=cfg.delta, progress=False
        )
        return pd, time.perf_counter() - t

    with OtherLoad() as load:
        pd, first = run()
    second = None
    if first < cfg.repeat_under_s:
        pd2, second = run()
        assert np.array_equal(pd2.fraction, pd.fraction), "two identical runs differ"
    trajectory_steps = cfg.num_betas * cfg.num_starts * pd.num_steps
    final = pd.fraction[:, -1]
    steps_per_s = trajectory_steps / (second or first)
    r = min(cfg.n, d)
    saves = len(save_ts)
    # Matrix-product flops of the reduced form per trajectory-step (see phase_kernel.flops):
    # 4 n² r per Euler step, 2 n² r per saved statistic, the start's QR spread over the steps.
    per_step = 4 * cfg.n**2 * r + (saves * 2 * cfg.n**2 * r + 2 * d * cfg.n**2) / pd.num_steps
    gflops = steps_per_s * per_step / 1e9
    return {
        "d": d,
        "form": type(pd.form).__name__,
        "first_s": first,
        "second_s": second,
        "compile_s": None if second is None else first - second,
        "trajectory_steps": trajectory_steps,
        "trajectory_steps_per_s": steps_per_s,
        "gflops": gflops,
        "fraction_of_matmul_peak": {k: gflops / v for k, v in peaks.items()},
        "other_load": load.fraction,
        "betas": betas.tolist(),
        "fraction_t30": final.tolist(),
        "min_fraction_t30_beta_le_1": float(final[betas <= 1.0].min())
        if (betas <= 1).any()
        else None,
    }


def main(cfg: Config, out: str) -> dict:
    t0 = time.perf_counter()
    devices = jax.devices()
    # 8192 on an accelerator (a 2048 product does not fill an H200), 2048 on a CPU.
    peaks = matmul_peaks(8192 if devices[0].platform != "cpu" else 2048)
    print("matmul peaks (GFLOP/s):", {k: round(v, 1) for k, v in peaks.items()}, flush=True)
    per_d = []
    for d in cfg.ds:
        r = sweep(cfg, d, peaks)
        per_d.append(r)
        again = f", second {r['second_s']:.2f} s" if r["second_s"] is not None else ""
        print(
            f"d = {d:5d}: {r['first_s']:8.2f} s (first call{again}); "
            f"{r['trajectory_steps_per_s'] / 1e6:.2f} M trajectory-steps/s, "
            f"{r['gflops']:.1f} GFLOP/s ({r['fraction_of_matmul_peak']['float64']:.1%} of the "
            "float64 matmul peak); "
            f"min F(t_max, β ≤ 1) = {r['min_fraction_t30_beta_le_1']}",
            flush=True,
        )
    record = {
        "benchmark": "phase_sweep",
        "question": "wall time of the full Fig. 3 sweep per d on this device",
        "config": dataclasses.asdict(cfg),
        "environment": {
            **environment(),
            "device_kind": devices[0].device_kind,
            "num_devices": len(devices),
        },
        "matmul_peak_gflops": peaks,
        "per_d": per_d,
        "total_first_s": sum(r["first_s"] for r in per_d),
        "wall_s": time.perf_counter() - t0,
    }
    write_json(out, record)
    print(f"total {record['total_first_s']:.1f} s on {devices[0].device_kind}; wrote {out}")
    return record


def parse(argv=None) -> tuple[Config, str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    ap.add_argument("--ds", type=int, nargs="+", help=f"dimensions (default {PAPER_DS})")
    ap.add_argument("--repeat-under", type=float, help="repeat a sweep that took less (s)")
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/)")
    a = ap.parse_args(argv)
    overrides = {}
    if a.ds:
        overrides["ds"] = tuple(a.ds)
    if a.repeat_under is not None:
        overrides["repeat_under_s"] = a.repeat_under
    cfg = Config.smoke(**overrides) if a.smoke else Config(**overrides)
    name = f"phase_sweep_{jax.default_backend()}{'_smoke' if a.smoke else ''}.json"
    return cfg, a.out or os.path.join(RESULTS, name)


if __name__ == "__main__":
    main(*parse())
