"""What a continuous-in-depth control costs in training: one `wbc.TrainStep` of a model whose
controls are Legendre polynomials in depth-time against the same model with a network's
piecewise-constant layers, at equal evaluations, side by side in one process.

The model is MNIST-1D's (`train-digits --task mnist1d`, wider and deeper): a
`wbc.PatchEmbedding((1, 40), 64, kernel_size=3, stride=1, padding=1)` (one token per sample of
the signal plus a class token: 41 tokens), `wbc.random_transformer(d=64, num_heads=4,
num_layers=8, hidden=256)` (pre-norm, GELU), a `wbc.ClassifierHead`; float32, batch 64 of the
real `wbc.mnist1d(0)` training signals (the first 64). Two controls of the same equation:

- `piecewise_constant`: the 8 layers as built, one step per layer (8 steps of the scheme over
  [0, 8]);
- `legendre`: the same model mapped onto `wb.LegendreBasis(7)` by `wb.to_basis` (8 coefficients
  per weight, one piece over [0, 8], 8 steps): the same number of steps and so of evaluations of
  the terms; only how θ(t) is obtained differs — a dynamic slice of layer `⌊t⌋` against the
  contraction `Σ_k φ_k(t) c_k` of `wb.Legendre.evaluate`, done at every sub-flow (Lie–Trotter:
  attention and feed-forward once each per step; Strang: attention twice) — and its backward.

Each with Lie–Trotter and with Strang. The step is the library's, `wbc.TrainStep(
wbc.default_optimizer(...))` (`DiscretizeThenOptimize` on `Objective()`: cross-entropy, no
running costs), called as `wbc.train` calls it: `jax.jit` of a function of the parameters
(`eqx.is_inexact_array`), the optimizer state, the batch and the step index.

Timing: per variant, after `jax.clear_caches()`, `lower` and `compile` timed apart (cold
compile, reported apart). Then `warmup` untimed steps of each, then `rounds` rounds; a round
times `steps_per_round` consecutive steps of the piecewise-constant and of the Legendre step of
one scheme, then of the other scheme, the order within each pair alternating from round to round
(so that drift in machine load falls on both). Reported per variant: the median, IQR, min of
the seconds per step over rounds (wall clock, and this process's CPU time, which other
processes' load disturbs less); per scheme **the ratio Legendre / piecewise-constant** of the
medians, and the per-round ratios (paired, consecutive measurements) with their median,
quartiles, min and max — the spread — and the same per-round ratios of CPU time. The share of
the CPUs other processes used is recorded per round (`other_load`); the machine is shared, and a high share means contended numbers.

Acceptance (issue 49): **the Legendre step costs ≤ 1.15× the piecewise-constant step**, read
off the median of the per-round ratios.

`--profile`: also time the forward + backward of `Legendre.evaluate` alone (the contraction of
all of one operator's coefficients at one time) against the piecewise-constant `localize`, at
the model's sizes, to attribute the difference.

Run: `python benchmarks/basis_step_cost.py [--smoke] [--rounds R] [--profile]`.
"""

import argparse
import dataclasses
import os
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _common import RESULTS, OtherLoad, environment, stats, table, wait_for_quiet, write_json

import workbench as wb
import workbench.control as wbc

ACCEPTANCE = 1.15  # Legendre step time / piecewise-constant step time, at most
PC, LEG = "piecewise_constant", "legendre"
SCHEMES = {"lie": wb.schemes.LieTrotter, "strang": wb.schemes.Strang}


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 64
    num_heads: int = 4
    num_layers: int = 8
    hidden: int = 256
    batch: int = 64
    schemes: tuple[str, ...] = ("lie", "strang")
    rounds: int = 15
    steps_per_round: int = 5
    warmup: int = 3
    wait_quiet_s: float = 30.0
    seed: int = 0
    is_smoke: bool = False

    @classmethod
    def smoke(cls, **overrides) -> "Config":
        base = {
            "d": 16,
            "num_heads": 2,
            "num_layers": 4,
            "hidden": 32,
            "batch": 8,
            "rounds": 3,
            "steps_per_round": 2,
            "warmup": 1,
            "wait_quiet_s": 0.0,
            "is_smoke": True,
        }
        return cls(**{**base, **overrides})


# ----------------------------------------------------------------------------- models and steps


def build_model(cfg: Config, scheme: str, basis: str) -> wbc.ControlledModel:
    """The MNIST-1D model (see the module docstring), its controls in `basis` (`PC` or `LEG`)."""
    k1, k2 = jax.random.split(jax.random.key(cfg.seed))
    transformer = wbc.random_transformer(
        k2,
        d=cfg.d,
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        hidden=cfg.hidden,
        scheme=SCHEMES[scheme](),
    )
    if basis == LEG:
        transformer = wb.to_basis(transformer, wb.LegendreBasis(cfg.num_layers - 1))
    return wbc.ControlledModel(
        wbc.PatchEmbedding((1, 40), cfg.d, kernel_size=3, stride=1, padding=1, key=k1),
        transformer,
        wbc.ClassifierHead(cfg.d, 10),
    )


def train_step(static, optimizer):
    """`wbc.TrainStep(optimizer)` as a function of arrays (the model's structure closed over),
    the way `wbc.train` jits it."""
    step = wbc.TrainStep(optimizer)
    key = jax.random.key(0)

    def run(params, opt_state, xs, ys, index):
        state = wbc.TrainState(eqx.combine(params, static), opt_state, index, key)
        new, info = step(state, (xs, ys))
        return eqx.filter(new.model, eqx.is_inexact_array), new.opt_state, info["objective"]

    return run


def setup(cfg: Config, xs, ys) -> dict:
    variants = {}
    for scheme in cfg.schemes:
        for basis in (PC, LEG):
            model = build_model(cfg, scheme, basis)
            tr = model.transformer
            params, static = eqx.partition(model, eqx.is_inexact_array)
            optimizer = wbc.default_optimizer(3e-3, steps=1000)
            variants[f"{scheme}/{basis}"] = {
                "fn": train_step(static, optimizer),
                "state": (params, optimizer.init(params)),
                "steps_total": tr.num_layers * tr.steps_per_layer,
                "num_pieces": tr.num_layers,
                "steps_per_layer": tr.steps_per_layer,
                "num_parameters": sum(x.size for x in jax.tree.leaves(params)),
            }
    for v in variants.values():  # equal evaluations: the same number of steps over [0, T]
        assert v["steps_total"] == cfg.num_layers, v["steps_total"]
    return variants


def compile_cold(variants: dict, xs, ys) -> dict:
    """Per variant, after `jax.clear_caches()`: lower and compile a new `jax.jit`, timed apart,
    and the first call of the compiled step."""
    out = {}
    for name, v in variants.items():
        jax.clear_caches()
        jitted = jax.jit(v["fn"])
        args = (*v["state"], xs, ys, jnp.asarray(0))
        t0 = time.perf_counter()
        lowered = jitted.lower(*args)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        first = jax.block_until_ready(compiled(*args))
        t3 = time.perf_counter()
        out[name] = {
            "lower_s": t1 - t0,
            "compile_s": t2 - t1,
            "first_call_s": t3 - t2,
            "first_objective": float(first[2]),
        }
        v["compiled"] = compiled
    return out


def runner(v: dict, xs, ys):
    counter = {"step": 0}

    def run(k: int) -> None:
        params, opt_state = v["state"]
        for _ in range(k):
            params, opt_state, objective = v["compiled"](
                params, opt_state, xs, ys, jnp.asarray(counter["step"])
            )
            counter["step"] += 1
        jax.block_until_ready((params, opt_state, objective))
        v["state"] = params, opt_state

    return run


# ----------------------------------------------------------------------------- timing


def time_rounds(variants: dict, cfg: Config, xs, ys) -> tuple[dict, dict, list]:
    """Wall-clock and process CPU seconds per step of every variant, per round (see the module
    docstring), and the other processes' CPU share per round."""
    runs = {name: runner(v, xs, ys) for name, v in variants.items()}
    for run in runs.values():
        run(cfg.warmup)
    samples = {name: [] for name in variants}
    cpu = {name: [] for name in variants}
    loads = []
    for r in range(cfg.rounds):
        with OtherLoad() as load:
            for scheme in cfg.schemes if r % 2 == 0 else cfg.schemes[::-1]:
                pair = (PC, LEG) if r % 2 == 0 else (LEG, PC)
                for basis in pair:
                    name = f"{scheme}/{basis}"
                    t, c = time.perf_counter(), time.process_time()
                    runs[name](cfg.steps_per_round)
                    samples[name].append((time.perf_counter() - t) / cfg.steps_per_round)
                    cpu[name].append((time.process_time() - c) / cfg.steps_per_round)
        loads.append(load.fraction)
    return samples, cpu, loads


def summarize(samples: dict, cpu: dict, cfg: Config) -> dict:
    out = {}
    for scheme in cfg.schemes:
        pc = np.asarray(samples[f"{scheme}/{PC}"])
        leg = np.asarray(samples[f"{scheme}/{LEG}"])
        per_round = leg / pc
        q25, q50, q75 = np.percentile(per_round, [25, 50, 75])
        paired = float(q50)
        cpu_ratio = np.asarray(cpu[f"{scheme}/{LEG}"]) / np.asarray(cpu[f"{scheme}/{PC}"])
        out[scheme] = {
            "ratio_of_medians": float(np.median(leg) / np.median(pc)),
            "cpu_time_per_round_ratio": {
                "median": float(np.median(cpu_ratio)),
                "q25": float(np.percentile(cpu_ratio, 25)),
                "q75": float(np.percentile(cpu_ratio, 75)),
                "min": float(cpu_ratio.min()),
                "max": float(cpu_ratio.max()),
            },
            "ratio_of_minima": float(leg.min() / pc.min()),
            "per_round_ratios": per_round.tolist(),
            "per_round_ratio": {
                "median": paired,
                "q25": float(q25),
                "q75": float(q75),
                "min": float(per_round.min()),
                "max": float(per_round.max()),
            },
            "acceptance": {
                "metric": "median over rounds of (Legendre step s / piecewise-constant step s)",
                "target": f"<= {ACCEPTANCE}",
                "ratio": paired,
                "pass": bool(paired <= ACCEPTANCE),
            },
        }
    return out


# ----------------------------------------------------------------------------- profile


def profile(cfg: Config, rounds: int = 20) -> dict:
    """Forward + backward of the controls alone, one operator at a time, at the model's sizes:
    `Legendre.evaluate(t)` (the contraction over the coefficients) against
    `PiecewiseConstant.localize(piece)` (a dynamic slice), each jitted, with a cotangent of the
    evaluated parameters' shape, summed over the `steps` evaluation times of one step (so one
    number per scheme-step's worth of evaluations)."""
    pc_model = build_model(cfg, "lie", PC)
    leg_model = build_model(cfg, "lie", LEG)
    out = {}
    for k, name in enumerate(("attention", "feedforward")):
        pc_op = pc_model.transformer.equation.operators[k]
        leg_op = leg_model.transformer.equation.operators[k]
        ts = jnp.arange(cfg.num_layers, dtype=jnp.float32)

        def pc_fn(values, cot, op=pc_op):
            def one(t):
                piece = jnp.clip(jnp.floor(t + 0.5), 0, cfg.num_layers - 1).astype(int)
                local = eqx.tree_at(lambda o: o.term.values, op, values).term.localize(piece)
                leaves = jax.tree.leaves(eqx.filter(local, eqx.is_inexact_array))
                return sum(jnp.vdot(x, c) for x, c in zip(leaves, cot, strict=True))

            return jax.value_and_grad(lambda v: jnp.sum(jax.vmap(one)(ts)))(values)

        def leg_fn(values, cot, op=leg_op):
            def one(t):
                local = eqx.tree_at(lambda o: o.term.values, op, values).term.evaluate(t + 0.5)
                leaves = jax.tree.leaves(eqx.filter(local, eqx.is_inexact_array))
                return sum(jnp.vdot(x, c) for x, c in zip(leaves, cot, strict=True))

            return jax.value_and_grad(lambda v: jnp.sum(jax.vmap(one)(ts)))(values)

        timings = {}
        for label, fn, op in ((PC, pc_fn, pc_op), (LEG, leg_fn, leg_op)):
            values = op.term.values
            leaves = jax.tree.leaves(eqx.filter(values, eqx.is_inexact_array))
            cot = [jnp.ones(x.shape[1:], x.dtype) for x in leaves]
            f = jax.jit(fn)
            jax.block_until_ready(f(values, cot))
            s = []
            for _ in range(rounds):
                t = time.perf_counter()
                jax.block_until_ready(f(values, cot))
                s.append(time.perf_counter() - t)
            timings[label] = stats(s)
        out[name] = timings
    return out


# ----------------------------------------------------------------------------- main


def main(cfg: Config, out: str, *, do_profile: bool) -> dict:
    t_start = time.perf_counter()
    task = wbc.mnist1d(0)
    xs = jnp.asarray(task.train.inputs[: cfg.batch])
    ys = jnp.asarray(task.train.targets[: cfg.batch])
    variants = setup(cfg, xs, ys)
    cold = compile_cold(variants, xs, ys)
    quiet = wait_for_quiet(cfg.wait_quiet_s)
    samples, cpu, loads = time_rounds(variants, cfg, xs, ys)
    summary = summarize(samples, cpu, cfg)
    record = {
        "benchmark": "basis_step_cost",
        "question": "training step time of a Legendre-in-depth model over the same model with "
        "piecewise-constant layers, equal evaluations (issue 49: <= 1.15x)",
        "config": dataclasses.asdict(cfg),
        "data": task.description + f"; the first {cfg.batch} training signals",
        "variants": {
            name: {k: v[k] for k in ("steps_total", "num_pieces", "steps_per_layer")}
            | {"num_parameters": int(v["num_parameters"])}
            for name, v in variants.items()
        },
        "environment": environment(),
        "load": {**quiet, "other_load_per_round": loads},
        "cold": cold,
        "step_time": {name: stats(s) for name, s in samples.items()},
        "samples_step_s": samples,
        "cpu_time": {name: stats(s) for name, s in cpu.items()},
        "samples_step_cpu_s": cpu,
        "ratios": summary,
        "profile": profile(cfg) if do_profile else None,
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(out, record)
    report(record, cfg, out)
    return record


def report(record: dict, cfg: Config, out: str) -> None:
    env = record["environment"]
    print(
        f"training step, d={cfg.d} heads={cfg.num_heads} layers={cfg.num_layers} "
        f"hidden={cfg.hidden}, 41 tokens, batch {cfg.batch}, float32; {env['processor']}, "
        f"{env['cpu_count']} CPUs; {cfg.rounds} rounds x {cfg.steps_per_round} steps"
    )
    loads = [f for f in record["load"]["other_load_per_round"] if f is not None]
    if loads:
        print(f"other processes' CPU share per round: median {np.median(loads):.0%}")
    rows = []
    for name, s in record["step_time"].items():
        c = record["cold"][name]
        rows.append([name, 1e3 * s["median_s"], 1e3 * s["iqr_s"], 1e3 * s["min_s"], c["compile_s"]])
    print(table(rows, ["variant", "median ms", "IQR ms", "min ms", "compile s"]))
    for scheme, r in record["ratios"].items():
        p = r["per_round_ratio"]
        verdict = "PASS" if r["acceptance"]["pass"] else "FAIL"
        if cfg.is_smoke:
            verdict += " (smoke sizes: not meaningful)"
        print(
            f"{scheme}: Legendre / piecewise-constant = {p['median']:.3f} per round "
            f"(IQR {p['q25']:.3f}-{p['q75']:.3f}, range {p['min']:.3f}-{p['max']:.3f}); "
            f"ratio of medians {r['ratio_of_medians']:.3f}; target <= {ACCEPTANCE}: {verdict}"
        )
        c = r["cpu_time_per_round_ratio"]
        print(
            f"{scheme}: process CPU time per step, Legendre / piecewise-constant = "
            f"{c['median']:.3f} per round (IQR {c['q25']:.3f}-{c['q75']:.3f})"
        )
    if record["profile"]:
        for op, t in record["profile"].items():
            pc, leg = t[PC]["median_s"], t[LEG]["median_s"]
            print(
                f"profile {op}: controls alone, fwd + bwd over {cfg.num_layers} times: "
                f"localize {1e3 * pc:.3f} ms, Legendre.evaluate {1e3 * leg:.3f} ms"
            )
    print(f"wrote {out}  ({record['wall_s']:.0f} s)")


def parse(argv=None) -> tuple[Config, str, bool]:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few rounds (seconds)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 15; smoke 3)")
    ap.add_argument("--steps-per-round", type=int, help="steps timed per variant and round")
    ap.add_argument("--schemes", nargs="+", choices=tuple(SCHEMES), help="default: lie strang")
    ap.add_argument("--wait-quiet", type=float, help="max seconds to wait for an idle machine")
    ap.add_argument("--profile", action="store_true", help="also time the controls alone")
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/)")
    a = ap.parse_args(argv)
    overrides = {}
    for field, value in (
        ("rounds", a.rounds),
        ("steps_per_round", a.steps_per_round),
        ("schemes", tuple(a.schemes) if a.schemes else None),
        ("wait_quiet_s", a.wait_quiet),
    ):
        if value is not None:
            overrides[field] = value
    for field in ("rounds", "steps_per_round"):
        if field in overrides and overrides[field] < 1:
            ap.error(f"--{field.replace('_', '-')} must be >= 1")
    cfg = Config.smoke(**overrides) if a.smoke else Config(**overrides)
    name = "basis_step_cost_smoke.json" if a.smoke else "basis_step_cost.json"
    return cfg, a.out or os.path.join(RESULTS, name), a.profile


if __name__ == "__main__":
    cfg, out, do_profile = parse()
    main(cfg, out, do_profile=do_profile)
