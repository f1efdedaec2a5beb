"""Does spreading the phase diagram's cells over devices cost anything, and does it change a number?

`wb.particles.phase_diagram` cuts its (β, start) cells over a one-axis device mesh
(`jax.shard_map`, no communication). This script times the same diagram (SA, n = 32, d = 32,
float64, reduced form, Euler dt = 0.1) on 1, 2, 4 and 8 CPU devices, each device count in its own
process: `1` is a plain process (one CPU device, as a user has by default), `k > 1` a process
started with `XLA_FLAGS=--xla_force_host_platform_device_count=k` using all k. On a machine with
fewer cores than devices the simulated devices share the cores, so the question is overhead: the
acceptance is a sharded run at most 10 % slower than one device. Every process also returns its
statistics (the fraction and its s.e.m. for every β and time), which must equal the one-device
numbers exactly.

Timing: per process a warm-up call (its compile time reported separately), then `--repeats`
calls, median; the processes run in `--rounds` interleaved rounds (1, 2, 4, 8, 1, 2, ...), and the
minimum over the rounds of each count's median is reported with its ratio to one device.

Run: `python benchmarks/phase_sharded.py [--smoke] [--rounds R] [--repeats K]`; writes
`results/phase_sharded.json` (`_smoke` with `--smoke`).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from _common import RESULTS, environment, table, write_json

ACCEPT = 1.10
COUNTS = (1, 2, 4, 8)

_WORKER = """
import json, sys, time
import jax
jax.config.update("jax_enable_x64", True)
import equinox as eqx
import numpy as np
from workbench import particles as P
cfg = json.loads(sys.argv[1])
betas = cfg["beta_max"] * np.arange(1, cfg["num_betas"] + 1) / cfg["num_betas"]
ts = cfg["save_every"] * np.arange(round(cfg["t_max"] / cfg["save_every"]) + 1)
starts = P.random_starts(jax.random.key(0), cfg["num_starts"], cfg["n"], cfg["d"])
sa = eqx.filter_vmap(P.SA)(jax.numpy.asarray(betas))
def run():
    t = time.perf_counter()
    pd = P.phase_diagram(sa, starts, dt=cfg["dt"], save_ts=ts, progress=False)
    return pd, time.perf_counter() - t
pd, first = run()
times = [run()[1] for _ in range(cfg["repeats"])]
print(json.dumps({"devices": len(jax.devices()), "first_s": first, "times_s": times,
                  "fraction": pd.fraction.tolist(), "sem": pd.sem.tolist()}))
"""


def _run(count: int, cfg: dict) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", WORKBENCH_PROGRESS="0")
    env.pop("XLA_FLAGS", None)
    if count > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"{count} device(s): worker failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out["devices"] != count:
        raise SystemExit(f"asked for {count} devices, the worker saw {out['devices']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a small diagram (seconds)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = dict(n=32, d=32, beta_max=9.0, dt=0.1, save_every=0.5)
    if args.smoke:
        cfg.update(num_betas=6, num_starts=32, t_max=5.0)
    else:
        cfg.update(num_betas=30, num_starts=256, t_max=30.0)
    rounds = args.rounds or (1 if args.smoke else 3)
    cfg["repeats"] = args.repeats or (2 if args.smoke else 3)

    per_count = {k: [] for k in COUNTS}
    t0 = time.perf_counter()
    for _ in range(rounds):
        for k in COUNTS:
            per_count[k].append(_run(k, cfg))
    one = np.asarray(per_count[1][0]["fraction"]), np.asarray(per_count[1][0]["sem"])
    rows, summary = [], {}
    for k, outs in per_count.items():
        diff = max(
            max(np.abs(np.asarray(o["fraction"]) - one[0]).max() for o in outs),
            max(np.abs(np.asarray(o["sem"]) - one[1]).max() for o in outs),
        )
        medians = [float(np.median(o["times_s"])) for o in outs]
        summary[k] = {
            "median_s_per_round": medians,
            "best_median_s": min(medians),
            "first_call_s": [o["first_s"] for o in outs],
            "max_abs_difference_to_one_device": float(diff),
        }
    base = summary[1]["best_median_s"]
    for k, s in summary.items():
        s["ratio_to_one_device"] = s["best_median_s"] / base
        rows.append(
            [
                k,
                s["best_median_s"],
                s["ratio_to_one_device"],
                s["first_call_s"][0],
                s["max_abs_difference_to_one_device"],
            ]
        )
    identical = all(s["max_abs_difference_to_one_device"] == 0.0 for s in summary.values())
    worst = max(s["ratio_to_one_device"] for s in summary.values())
    cells = cfg["num_betas"] * cfg["num_starts"]
    result = {
        "benchmark": "phase_sharded",
        "question": "phase diagram on 1, 2, 4, 8 CPU devices: overhead, and the same numbers?",
        "config": {**cfg, "rounds": rounds, "cells": cells, "smoke": args.smoke},
        "per_device_count": {str(k): v for k, v in summary.items()},
        "identical_statistics": identical,
        "worst_ratio_to_one_device": worst,
        "acceptance": ACCEPT,
        "meets_acceptance": bool(worst <= ACCEPT and identical),
        "wall_s": time.perf_counter() - t0,
        "environment": environment(),
    }
    name = "phase_sharded_smoke.json" if args.smoke else "phase_sharded.json"
    write_json(args.out or f"{RESULTS}/{name}", result)
    print(table(rows, ["devices", "median s", "ratio to 1", "first call s", "max |diff|"]))
    print(
        f"{cells} cells x {round(cfg['t_max'] / cfg['dt'])} steps; statistics "
        + ("identical on every device count" if identical else "DIFFER between device counts")
        + f"; worst ratio to one device {worst:.3f} "
        + ("(meets" if worst <= ACCEPT else "(misses")
        + f" the acceptance <= {ACCEPT})"
    )


if __name__ == "__main__":
    main()
