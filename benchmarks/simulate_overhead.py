"""Does `wb.particles.simulate` cost anything over a hand-written `lax.scan` of the same step?

A batch of starts of the self-attention dynamics SA (paper B: n particles on the sphere in R^d,
softmax of β⟨x_i, x_j⟩, Euler then renormalize, the authors' integrator) run two ways, both
`jax.jit(jax.vmap(...))` over the starts, float64, in one process:

- `workbench`: `wb.particles.simulate(SA(beta), x0, t1=..., dt=..., save_ts=...)` — with its
  input checks (unit rows, time grid) and its save buffer;
- `hand`: what a user would write without the library: a `lax.scan` of the Euler-renormalize
  step (`softmax(β x xᵀ) x`, tangent projection, step, row normalization), with the saved
  states from an outer `lax.scan` over save intervals of an inner `lax.scan` of steps.

Two cases: `final` (only x(t1)) and `saved` (the state every `save_every` steps, as the
phase diagram's statistic needs). Outputs are first compared by value (max abs difference
≤ 1e-12). Timing: warm-up, then `rounds` rounds, each timing one call of both in an order that
alternates from round to round (drift hits both alike), blocked on; the minimum and median per
implementation, their ratio workbench/hand (goal ≤ 1.05, on the minima of the interleaved
rounds; the ratio of medians is reported too), and the compile time (first call minus warm
median).

Run: `python benchmarks/simulate_overhead.py [--smoke] [--rounds R]`; writes
`benchmarks/results/simulate_overhead.json` (`--smoke`: `simulate_overhead_smoke.json`).
"""

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import RESULTS, environment, table, write_json

import workbench as wb

GOAL = 1.05
TOLERANCE = 1e-12


def _hand_step(x, beta, dt):
    v = jax.nn.softmax(beta * (x @ x.T), axis=-1) @ x
    v = v - jnp.sum(v * x, axis=-1, keepdims=True) * x
    y = x + dt * v
    return y / jnp.linalg.norm(y, axis=-1, keepdims=True)


def _hand(x0, beta, dt, steps, save_every):
    def inner(x, _):
        return _hand_step(x, beta, dt), None

    if save_every is None:
        return jax.lax.scan(inner, x0, None, length=steps)[0]

    def outer(x, _):
        x = jax.lax.scan(inner, x, None, length=save_every)[0]
        return x, x

    _, xs = jax.lax.scan(outer, x0, None, length=steps // save_every)
    return jnp.concatenate([x0[None], xs])


def _workbench(x0, beta, dt, steps, save_every):
    dyn = wb.particles.SA(beta=beta)
    save_ts = None
    if save_every is not None:
        save_ts = [k * save_every * dt for k in range(steps // save_every + 1)]
    return wb.particles.simulate(dyn, x0, t1=steps * dt, dt=dt, save_ts=save_ts)


def _time(fn, x0) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(x0))
    return time.perf_counter() - start


def run_case(name, x0, *, beta, dt, steps, save_every, rounds) -> dict:
    fns = {
        "workbench": jax.jit(jax.vmap(lambda x: _workbench(x, beta, dt, steps, save_every))),
        "hand": jax.jit(jax.vmap(lambda x: _hand(x, beta, dt, steps, save_every))),
    }
    first = {k: _time(f, x0) for k, f in fns.items()}
    diff = float(jnp.max(jnp.abs(fns["workbench"](x0) - fns["hand"](x0))))
    if not diff <= TOLERANCE:
        raise SystemExit(f"{name}: workbench and hand-written differ by {diff:.3e} > {TOLERANCE}")
    samples = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for k in order:
            samples[k].append(_time(fns[k], x0))
    best = {k: min(v) for k, v in samples.items()}
    median = {k: float(np.median(v)) for k, v in samples.items()}
    ratio = best["workbench"] / best["hand"]
    return {
        "case": name,
        "save_every": save_every,
        "max_abs_difference": diff,
        "seconds": samples,
        "min_s": best,
        "median_s": median,
        "compile_s": {k: first[k] - median[k] for k in fns},
        "ratio_min": ratio,
        "ratio_median": median["workbench"] / median["hand"],
        "goal": GOAL,
        "meets_goal": bool(ratio <= GOAL),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 15; 3)")
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.smoke else 15)
    if args.smoke:
        n, d, starts, steps, save_every = 8, 16, 16, 40, 5
    else:
        n, d, starts, steps, save_every = 32, 128, 256, 300, 5
    beta, dt = 1.0, 0.1
    with jax.enable_x64(True):
        x0 = wb.particles.random_starts(jax.random.key(0), num_starts=starts, n=n, d=d)
        cases = [
            run_case(name, x0, beta=beta, dt=dt, steps=steps, save_every=every, rounds=rounds)
            for name, every in (("final", None), ("saved", save_every))
        ]
    record = {
        "benchmark": "simulate_overhead",
        "smoke": args.smoke,
        "sizes": {
            "n": n,
            "d": d,
            "starts": starts,
            "steps": steps,
            "dt": dt,
            "beta": beta,
            "save_every": save_every,
            "dtype": "float64",
            "rounds": rounds,
        },
        "cases": cases,
        "environment": environment(),
    }
    name = "simulate_overhead_smoke.json" if args.smoke else "simulate_overhead.json"
    write_json(os.path.join(RESULTS, name), record)
    rows = [
        [
            c["case"],
            f"{c['min_s']['workbench']:.4f}",
            f"{c['min_s']['hand']:.4f}",
            f"{c['ratio_min']:.3f}",
            f"{c['ratio_median']:.3f}",
            f"{c['compile_s']['workbench']:.2f} / {c['compile_s']['hand']:.2f}",
            "yes" if c["meets_goal"] else "no",
        ]
        for c in cases
    ]
    header = [
        "case",
        "workbench min s",
        "hand min s",
        "ratio (min)",
        "ratio (median)",
        "compile s (wb / hand)",
        f"≤ {GOAL}",
    ]
    print(table(rows, header))
    met = all(c["meets_goal"] for c in cases)
    print(
        f"vmapped simulate within {GOAL}x of a hand-written lax.scan in every case: "
        + ("yes" if met else "no")
    )


if __name__ == "__main__":
    main()
