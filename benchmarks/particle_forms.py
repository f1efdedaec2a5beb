"""Do the general particle forms run at the tuned reduced form's FLOP rate?

The phase diagram with `Q = K = V = I` runs in the tuned `ReducedForm`. Every other case runs the
particles as they are: the `ParticleForm` with dynamics matrices (Fig. 5: random Q, K, V; one
head or several) and, outside `phase_diagram`, a vmapped `wb.particles.simulate` of any dynamics
(here SA with a feed-forward term, `FFNAugmented`). This script times them side by side in one
process (SA, n = 32, d = 128, Euler-then-renormalize dt = 0.1, float64; `phase_diagram` cases: 2
β × `starts` starts; `simulate` case: one β, `2 × starts` starts) and converts each time to the
matrix-product GFLOP/s of its algorithm (2 m n k per product; the forms' counts below), so the
cases can be compared per FLOP. The goal: every general case (matrices, heads, FFN) at least the
reduced form's GFLOP/s. The particle form with identity matrices is reported too but is not a
general case: with identity matrices `phase_diagram` runs the reduced form (the same dynamics in
`min(n, d)` coordinates), and the particle form is there only when asked for.

Flops per step and trajectory (h heads of width k, feed-forward width m):
- reduced (identity): `4 n² r`, r = min(n, d)                    (Gram + mixing in r coordinates)
- particle (identity, `form=ParticleForm()`): `4 n² d`
- particle Q, K, V (fused W = KᵀQ): `4 n d² + 4 n² d`              (X Wᵀ, X Vᵀ, scores, mixing)
- multi-head: `h (4 n k d + 2 n² k + 2 n d² + 2 n² d)`
- simulate, SA + FFN: `4 n² d + 4 n m d`                          (SA as particle identity + a, w)

Timing: a warm-up call each (compile included, reported), then `rounds` rounds in rotating order;
the minimum of each case gives its GFLOP/s (the least-disturbed run), the medians are reported too.
Also the float64 matmul peak of a jitted 2048² `jnp.dot` (best of 5), measured in the same run.

Run: `python benchmarks/particle_forms.py [--smoke] [--rounds R]`; writes
`results/particle_forms.json` (`_smoke` with `--smoke`).
"""

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    RESULTS,
    OtherLoad,
    environment,
    matmul_peaks,
    stats,
    table,
    write_json,
)

from workbench import particles as P  # noqa: E402

GOAL = 1.0


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n, d, heads, k, m = 32, 128, 4, 32, 128
    starts_n, steps = (32, 20) if args.smoke else (256, 100)
    rounds = args.rounds or (2 if args.smoke else 5)
    dt = 0.1
    rng = np.random.default_rng(0)
    starts = P.random_starts(jax.random.key(0), starts_n, n, d)
    betas = np.array([1.0, 4.0])
    ts = np.array([steps * dt])
    q, kk, v = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3))
    qh, kh = (rng.standard_normal((heads, k, d)) / np.sqrt(d) for _ in range(2))
    vh = rng.standard_normal((heads, d, d)) / np.sqrt(d) / heads
    w, a, b = rng.standard_normal((d, m)) / np.sqrt(m), rng.standard_normal((m, d)), np.zeros(m)

    def diagram(form=None, **matrices):
        # One SA per β sharing the matrices (the β leaf swapped in: no copy per β).
        sa = eqx.tree_at(lambda s: s.beta, P.SA(0.0, **matrices), jnp.asarray(betas))
        return lambda: P.phase_diagram(sa, starts, dt=dt, save_ts=ts, form=form, progress=False)

    ffn_starts = P.random_starts(jax.random.key(1), 2 * starts_n, n, d)

    @jax.jit
    def ffn_simulate(x0):
        dyn = P.FFNAugmented(P.SA(4.0), w=w, a=a, b=b)
        return jax.vmap(lambda x: P.simulate(dyn, x, dt=dt, num_steps=steps))(x0)

    r = min(n, d)
    trajectory_steps = 2 * starts_n * steps
    cases = {
        "reduced (identity)": (diagram(), 4 * n * n * r),
        "particle (identity)": (diagram(form=P.ParticleForm()), 4 * n * n * d),
        "particle Q, K, V": (diagram(Q=q, K=kk, V=v), 4 * n * d * d + 4 * n * n * d),
        f"particle, {heads} heads": (
            diagram(Q=qh, K=kh, V=vh),
            heads * (4 * n * k * d + 2 * n * n * k + 2 * n * d * d + 2 * n * n * d),
        ),
        "simulate, SA + FFN (vmap)": (
            lambda: jax.block_until_ready(ffn_simulate(ffn_starts)),
            4 * n * n * d + 4 * n * m * d,
        ),
    }
    peak_before = matmul_peaks()["float64"]
    first = {name: _timed(fn) for name, (fn, _) in cases.items()}
    names = list(cases)
    samples = {name: [] for name in names}
    with OtherLoad() as load:
        for i in range(rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                samples[name].append(_timed(cases[name][0]))
    peak = max(peak_before, matmul_peaks()["float64"])
    results = {}
    for name, (_, flops) in cases.items():
        s = stats(samples[name])
        total = flops * trajectory_steps
        results[name] = {
            "flops_per_trajectory_step": flops,
            "first_call_s": first[name],
            "time": s,
            "gflops": total / s["min_s"] / 1e9,
            "gflops_median": total / s["median_s"] / 1e9,
        }
    base = results["reduced (identity)"]["gflops"]
    for x in results.values():
        x["gflops_over_reduced"] = x["gflops"] / base
        x["fraction_of_peak"] = x["gflops"] / peak
    general = [name for name in names if "identity" not in name]
    worst = min(results[name]["gflops_over_reduced"] for name in general)
    record = {
        "benchmark": "particle_forms",
        "question": "GFLOP/s of the general particle forms and of vmapped simulate vs the reduced form",
        "config": dict(
            n=n,
            d=d,
            heads=heads,
            head_width=k,
            ffn_width=m,
            starts=starts_n,
            steps=steps,
            dt=dt,
            rounds=rounds,
            smoke=args.smoke,
        ),
        "matmul_peak_gflops_float64": peak,
        "cases": results,
        "general_cases": general,
        "worst_general_over_reduced": worst,
        "goal": GOAL,
        "meets_goal": bool(worst >= GOAL),
        "other_load": load.fraction,
        "environment": environment(),
    }
    name = "particle_forms_smoke.json" if args.smoke else "particle_forms.json"
    write_json(args.out or f"{RESULTS}/{name}", record)
    rows = [
        [
            k,
            x["time"]["min_s"],
            x["gflops"],
            x["gflops_over_reduced"],
            x["fraction_of_peak"],
            x["first_call_s"],
        ]
        for k, x in results.items()
    ]
    print(table(rows, ["case", "min s", "GFLOP/s", "/ reduced", "of peak", "first call s"]))
    print(
        f"float64 matmul peak {peak:.1f} GFLOP/s; worst general case (matrices, heads, FFN) / "
        f"reduced form = {worst:.2f} "
        + ("(meets" if worst >= GOAL else "(misses")
        + f" the goal >= {GOAL})"
    )


if __name__ == "__main__":
    main()
