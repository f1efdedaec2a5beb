"""Compile time of a training step as the model grows: the exact gradient and the continuous
adjoint, for Lie–Trotter, Strang and Suzuki4 layers, at 4 and 12 layers.

The model is the digits model of `benchmarks/train_step.py` (`studies/training/train_digits.py`'s: d = 64,
4 heads, hidden 128, batch 64, float32), one step per layer of the scheme. The step is the
library's, `wbc.TrainStep(optimizer, method=...)` with `wbc.DiscretizeThenOptimize()` (the
exact gradient, reverse mode through the steps) or `wbc.OptimizeThenDiscretize()` (the costate
equation solved backward by the same scheme), jitted as `wbc.train` jits it. For every case,
after `jax.clear_caches()`: trace + lower, XLA compile and the first call are timed apart, then
the warm step (median of `repeats` calls), so a reader sees what the first step of a run costs
next to what every later step costs. Depth is a `lax.scan`, so the compile time should not grow
with the number of layers: the JSON gives the ratio 12 layers / 4 layers per case.

Before timing, by value: the two gradient methods' objectives agree on the batch (relative
1e-5; they are the same forward pass) and the exact gradient of the Lie model equals
`jax.grad` of the objective written with the model called directly (relative 1e-4), so the
timed steps compute what they claim.

Run: `python benchmarks/gradient_compile.py [--smoke] [--out PATH]`; writes
`benchmarks/results/gradient_compile.json` (`--smoke`: `gradient_compile_smoke.json`).
"""

import argparse
import dataclasses
import os
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import RESULTS, OtherLoad, environment, table, write_json

import workbench as wb
import workbench.control as wbc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import (
    Config as StepConfig,  # noqa: E402
    workbench_model,  # noqa: E402
)

SCHEMES = {
    "lie": wb.schemes.LieTrotter(),
    "strang": wb.schemes.Strang(),
    "suzuki4": wb.schemes.Suzuki4(),
}
METHODS = {"exact": wbc.DiscretizeThenOptimize(), "adjoint": wbc.OptimizeThenDiscretize()}


@dataclasses.dataclass(frozen=True)
class Config:
    depths: tuple[int, ...] = (4, 12)
    schemes: tuple[str, ...] = tuple(SCHEMES)
    methods: tuple[str, ...] = tuple(METHODS)
    batch: int = 64
    repeats: int = 5
    seed: int = 0
    is_smoke: bool = False

    @classmethod
    def smoke(cls) -> "Config":
        return cls(depths=(2, 4), schemes=("lie", "strang"), batch=8, repeats=2, is_smoke=True)


def _model(cfg: Config, depth: int, scheme) -> wbc.ControlledModel:
    scfg = StepConfig(batch=cfg.batch, seed=cfg.seed)
    if cfg.is_smoke:
        scfg = dataclasses.replace(scfg, d=16, num_heads=2, hidden=32)
    return workbench_model(scfg, depth, jax.random.key(cfg.seed)).rediscretize(scheme, 1)


def _step_fn(model, method):
    """The library's step as a function of arrays, as `wbc.train` jits it."""
    optimizer = wbc.default_optimizer(3e-3, steps=840, warmup=0, weight_decay=0.05, clip=1.0)
    step = wbc.TrainStep(optimizer, method=method)
    state = step.init(model, key=jax.random.key(0))
    dynamic, static = eqx.partition(state, eqx.is_array)

    def fn(dynamic, xs, ys):
        new, info = step(eqx.combine(dynamic, static), (xs, ys))
        return eqx.filter(new, eqx.is_array), info["objective"]

    return fn, dynamic


def _case(model, method, xs, ys, repeats: int) -> dict:
    fn, dynamic = _step_fn(model, method)
    jax.clear_caches()
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    lowered = jitted.lower(dynamic, xs, ys)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    out = jax.block_until_ready(compiled(dynamic, xs, ys))
    t3 = time.perf_counter()
    warm = []
    for _ in range(repeats):
        s = time.perf_counter()
        jax.block_until_ready(compiled(dynamic, xs, ys))
        warm.append(time.perf_counter() - s)
    return {
        "trace_lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "first_call_s": t3 - t2,
        "cold_total_s": t3 - t0,
        "warm_step_median_s": float(np.median(warm)),
        "objective": float(out[1]),
    }


def _checks(cfg: Config, xs, ys) -> dict:
    model = _model(cfg, cfg.depths[0], SCHEMES["lie"])
    objective = wbc.Objective()
    ours = {}
    for name, method in METHODS.items():
        value, direction = eqx.filter_jit(
            lambda m, method=method: method.value_and_direction(objective, m, xs, ys)
        )(model)
        ours[name] = (float(value[0] if isinstance(value, tuple) else value), direction)

    def plain(m):  # the mean cross-entropy of the model called directly
        logits = jax.vmap(m)(xs)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, ys))

    grads = eqx.filter_grad(plain)(model)
    got = jnp.concatenate(
        [g.ravel() for g in jax.tree.leaves(eqx.filter(ours["exact"][1], eqx.is_inexact_array))]
    )
    want = jnp.concatenate(
        [g.ravel() for g in jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))]
    )
    rel_grad = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    a, b = ours["exact"][0], ours["adjoint"][0]
    rel_obj = abs(a - b) / abs(a)
    return {
        "objective_exact_vs_adjoint": {
            "exact": a,
            "adjoint": b,
            "relative": rel_obj,
            "tol": 1e-5,
            "pass": rel_obj <= 1e-5,
        },
        "exact_gradient_vs_jax_grad": {"relative": rel_grad, "tol": 1e-4, "pass": rel_grad <= 1e-4},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    cfg = Config.smoke() if args.smoke else Config()
    rng = np.random.default_rng(cfg.seed)
    xs = jnp.asarray(rng.uniform(0, 16, (cfg.batch, 8, 8)), jnp.float32)
    ys = jnp.asarray(rng.integers(0, 10, cfg.batch), jnp.int32)

    checks = _checks(cfg, xs, ys)
    if not all(c["pass"] for c in checks.values()):
        print("value checks failed:", checks, file=sys.stderr)
        return 1
    cases = []
    with OtherLoad() as load:
        for scheme in cfg.schemes:
            for method in cfg.methods:
                for depth in cfg.depths:
                    model = _model(cfg, depth, SCHEMES[scheme])
                    row = _case(model, METHODS[method], xs, ys, cfg.repeats)
                    cases.append({"scheme": scheme, "method": method, "depth": depth, **row})
                    print(
                        f"{scheme:8s} {method:8s} {depth:3d} layers: trace+lower "
                        f"{row['trace_lower_s']:.2f} s, compile {row['compile_s']:.2f} s, warm "
                        f"step {1e3 * row['warm_step_median_s']:.1f} ms",
                        flush=True,
                    )
    growth = {}
    lo, hi = min(cfg.depths), max(cfg.depths)
    for scheme in cfg.schemes:
        for method in cfg.methods:
            pick = {c["depth"]: c for c in cases if c["scheme"] == scheme and c["method"] == method}
            growth[f"{scheme}/{method}"] = (pick[hi]["trace_lower_s"] + pick[hi]["compile_s"]) / (
                pick[lo]["trace_lower_s"] + pick[lo]["compile_s"]
            )
    result = {
        "benchmark": "gradient_compile",
        "config": dataclasses.asdict(cfg),
        "environment": environment(),
        "checks": checks,
        "cases": cases,
        f"compile_ratio_{hi}_over_{lo}_layers": growth,
        "other_load_fraction": load.fraction,
    }
    rows = [
        [
            c["scheme"],
            c["method"],
            c["depth"],
            f"{c['trace_lower_s']:.2f}",
            f"{c['compile_s']:.2f}",
            f"{1e3 * c['warm_step_median_s']:.1f}",
        ]
        for c in cases
    ]
    print(table(rows, ["scheme", "gradient", "layers", "trace+lower s", "compile s", "warm ms"]))
    print(f"compile time {hi} / {lo} layers:", {k: round(v, 2) for k, v in growth.items()})
    name = "gradient_compile_smoke.json" if cfg.is_smoke else "gradient_compile.json"
    out = args.out or os.path.join(RESULTS, name)
    write_json(out, result)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
