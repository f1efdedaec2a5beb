"""Cost per training step of the continuous-depth recipes against today's Lie training, side by
side in one process, on the digits model (`studies/training/train_digits.py`'s: 65 tokens, d = 64, 4
heads, hidden 128, 4 layers, batch 64, float32, AdamW after clipping).

Recipes (the workbench's `wbc.TrainStep`, called as `wbc.train` calls it, augmentation off):

- `lie_1` — today's training (`--depth fixed --kinetic 0 --smoothness 0`): one Lie–Trotter step per layer;
- `multi_resolution` — multi-resolution training without smoothness (`--depth multi-resolution
  --resolutions 1,2,4 --kinetic 0.05 --smoothness 0`): every batch solved with k ∈ {1, 2, 4} Lie steps per layer drawn from
  the step's key, kinetic cost λ_K = 0.05;
- `multi_resolution_smooth` — the same with the smoothness cost in depth λ_s = 0.1
  (`--smoothness 0.1`): today's default of `train-digits`;
- `multi_resolution_coarsen` — that, with coarse-basis draws: `train-digits`' default,
  `wbc.MultiResolution((1, 2, 4), (0.2, 0.2, 0.2, 0.4), coarsen=(2,))` (`--coarsen 2
  --coarse-weight 2`: a fourth candidate, the controls projected onto half the layers, drawn
  twice as often as each step count);
- `multi_resolution_k1`, `_k2`, `_k4` — the same objective at one fixed k (each branch of
  the recipe alone, `wbc.MultiResolution((k,))`), whose mean is the recipe's expected cost;
- `multi_resolution_coarse_branch` — `multi_resolution_coarsen`'s coarse draw alone (the same
  candidates, the coarse one drawn with probability 1 − 3e-9); with the three above, the mean
  of its four branches weighted by their probabilities is `multi_resolution_coarsen`'s
  expected cost per step;
- `lie_2`, `strang_1` — two of the recipes tried before (`--steps-per-layer 2`, `--scheme
  strang`), kinetic 0.

And what a user would otherwise write (plain equinox + optax, below, never the library's step):

- `plain_lie_1` — a hand-written pre-norm ViT, `lax.scan` over the stacked blocks, one residual
  update per layer (`benchmarks/train_step.py`'s `PlainViT`);
- `plain_multi_resolution` — the same blocks applied k times with step 1/k (`u + MHA(LN(u))/k`,
  then `u + FFN(LN(u))/k`), the kinetic cost `λ_K (1/n) Σ ‖u_{j+1} − u_j‖² k` summed over the
  steps, a `lax.switch` over k ∈ {1, 2, 4} with the branch passed in (the sequence of branches
  is the workbench's draws, so both solve the same k at every step), differentiated through
  the switch;
- `plain_multi_resolution_grad_in_branch` — the same, a switch over the branches' own
  `value_and_grad` (what the library's step does: one forward and backward pass per branch).

Checks by value first: at every k the plain objective equals the workbench's on the same weights
(relative 1e-5; the script exits non-zero otherwise). Then each step function is compiled
(first call timed apart), warmed up, and timed in interleaved rounds in a rotating order, each
round `steps_per_round` consecutive steps (step indices 0, 1, ... restarted every round, so the
multi-resolution lines draw the same k's every round), blocked on at the end. Nothing is read on
the host between steps (for every line alike). Reported: median seconds per step and IQR, each
recipe's ratio to `lie_1`, the workbench/plain ratios, and `multi_resolution`'s measured cost
against the mean of its branches.

Run: `python benchmarks/training_recipes.py [--smoke] [--rounds R] [--out PATH]`.
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
from _common import RESULTS, OtherLoad, environment, layer_norm, stats, table, write_json

import workbench as wb
import workbench.control as wbc
from studies._toolkit import training as _training
from studies.training import train_digits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import (  # noqa: E402
    Config as StepConfig,  # noqa: E402
    plain_from_workbench,
    plain_optimizer,
    workbench_model,
)

RESOLUTIONS = (1, 2, 4)
KINETIC = 0.05
SMOOTHNESS = 0.1
TOLERANCE = 1e-5


@dataclasses.dataclass(frozen=True)
class Config:
    depth: int = 4
    batch: int = 64
    d: int = 64
    num_heads: int = 4
    hidden: int = 128
    warmup: int = 2  # untimed rounds of every line
    rounds: int = 15
    steps_per_round: int = 6
    seed: int = 0
    is_smoke: bool = False

    @classmethod
    def smoke(cls) -> "Config":
        return cls(
            depth=2,
            batch=8,
            d=32,
            num_heads=2,
            hidden=64,
            warmup=1,
            rounds=2,
            steps_per_round=3,
            is_smoke=True,
        )

    def step_config(self) -> StepConfig:
        return StepConfig(
            depths=(self.depth,),
            batch=self.batch,
            d=self.d,
            num_heads=self.num_heads,
            hidden=self.hidden,
            seed=self.seed,
        )


# ----------------------------------------------------------------------------- plain equinox


def plain_objective(plain, xs, ys, k: int, kinetic: float):
    """Cross-entropy + `kinetic · (1/n) Σ_j ‖u_{j+1} − u_j‖² / τ` with k Lie steps per layer of
    size τ = 1/k, on the `PlainViT` layout (mean over the batch)."""
    params, static = eqx.partition(plain.blocks, eqx.is_array)
    tau = 1.0 / k
    p, eps = plain.padding, plain.eps

    def one(image, label):
        y = jax.lax.conv_general_dilated(
            image[None, None], plain.conv_weight, (1, 1), [(p, p), (p, p)]
        )[0]
        tokens = y.reshape(y.shape[0], -1).T + plain.conv_bias
        u = jnp.concatenate([plain.class_token[None], tokens]) + plain.position
        n = u.shape[0]

        def layer(carry, layer_params):
            block = eqx.combine(layer_params, static)

            def step(carry, _):
                u, cost = carry
                v = u + tau * block.attention(layer_norm(u, block.ln1_weight, block.ln1_bias, eps))
                w = v + tau * block.feedforward(
                    layer_norm(v, block.ln2_weight, block.ln2_bias, eps)
                )
                return (w, cost + kinetic * jnp.sum((w - u) ** 2) / (n * tau)), None

            return jax.lax.scan(step, carry, None, length=k)[0], None

        (u, cost), _ = jax.lax.scan(layer, (u, jnp.zeros((), u.dtype)), params)
        u = layer_norm(u, plain.norm_weight, plain.norm_bias, eps)
        logits = u[0] @ plain.head_weight + plain.head_bias
        return optax.softmax_cross_entropy_with_integer_labels(logits, label) + cost

    return jnp.mean(jax.vmap(one)(xs, ys))


def plain_step(static, optimizer, ks: tuple[int, ...], kinetic: float, *, grad_in_branch=False):
    """`(params, opt_state, xs, ys, branch) -> (params, opt_state, objective)`: k = ks[branch].
    The gradient of the switch (`grad_in_branch=False`), or a switch over the branches'
    gradients (each branch its own forward and backward pass)."""

    def objective(params, xs, ys, branch):
        plain = eqx.combine(params, static)
        branches = [lambda k=k: plain_objective(plain, xs, ys, k, kinetic) for k in ks]
        return jax.lax.switch(branch, branches) if len(ks) > 1 else branches[0]()

    def value_and_grad(params, xs, ys, branch):
        if not grad_in_branch:
            return jax.value_and_grad(objective)(params, xs, ys, branch)
        loss = lambda p, k: plain_objective(eqx.combine(p, static), xs, ys, k, kinetic)
        branches = [lambda p, k=k: jax.value_and_grad(loss)(p, k) for k in ks]
        return jax.lax.switch(branch, branches, params)

    def step(params, opt_state, xs, ys, branch):
        value, grads = value_and_grad(params, xs, ys, branch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, objective


# ----------------------------------------------------------------------------- workbench


def recipes() -> dict:
    """name -> (objective, discretization, scheme, steps_per_layer of the model)."""
    kinetic = wbc.Objective(kinetic=wbc.KineticEnergy(KINETIC))
    smooth = wbc.Objective(
        kinetic=wbc.KineticEnergy(KINETIC), controls=(wbc.ControlSmoothness(SMOOTHNESS),)
    )
    plain = wbc.Objective()
    own = wbc.OwnDiscretization()
    lie, strang = wb.schemes.LieTrotter(), wb.schemes.Strang()
    out = {
        "lie_1": (plain, own, lie, 1),
        "multi_resolution": (kinetic, wbc.MultiResolution(RESOLUTIONS), lie, 1),
    }
    for k in RESOLUTIONS:
        out[f"multi_resolution_k{k}"] = (kinetic, wbc.MultiResolution((k,)), lie, 1)
    out["multi_resolution_smooth"] = (smooth, wbc.MultiResolution(RESOLUTIONS), lie, 1)
    out["multi_resolution_coarsen"] = (smooth, DEFAULT, lie, 1)
    out["multi_resolution_coarse_branch"] = (smooth, COARSE_ONLY, lie, 1)
    out["lie_2"] = (plain, own, lie, 2)
    out["strang_1"] = (plain, own, strang, 1)
    return out


DEFAULT = _training.multi_resolution(train_digits.Config())
"""`train-digits`' default training discretization (the study's own, not restated here)."""

COARSE_ONLY = wbc.MultiResolution(
    RESOLUTIONS, probabilities=(1e-9, 1e-9, 1e-9, 1 - 3e-9), coarsen=(2,)
)
"""The coarse-basis branch of `multi_resolution_coarsen` alone: the same candidates, the coarse
draw with probability 1 − 3e-9 (`main` checks that every timed step draws it)."""


def _drawn(discretization, i: int) -> int:
    """The candidate `TrainStep` draws at step `i` (base key 0, as `workbench_step` fixes)."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(0), i), 1)
    return int(discretization.index(key, i))


def workbench_step(static, optimizer, objective, discretization):
    """The library's step as `wbc.train` runs it: a function of arrays (parameters, optimizer
    state, batch, step index) for `jax.jit`; the base key fixed."""
    step = wbc.TrainStep(optimizer, objective=objective, discretization=discretization)
    key = jax.random.key(0)

    def train_step(params, opt_state, xs, ys, index):
        state = wbc.TrainState(eqx.combine(params, static), opt_state, index, key)
        new, info = step(state, (xs, ys))
        return eqx.filter(new.model, eqx.is_inexact_array), new.opt_state, info["objective"]

    return train_step, step


# ----------------------------------------------------------------------------- run


def main(cfg: Config, out_path: str) -> dict:
    scfg = cfg.step_config()
    base = workbench_model(scfg, cfg.depth, jax.random.key(cfg.seed))
    rng = np.random.default_rng(cfg.seed)
    xs = jnp.asarray(rng.uniform(0, 16, (cfg.batch, 8, 8)), jnp.float32)
    ys = jnp.asarray(rng.integers(0, 10, cfg.batch), jnp.int32)
    optimizer = wbc.default_optimizer(3e-3, steps=840, warmup=0, weight_decay=0.05, clip=1.0)

    lines, draws, coarse_draws = {}, {}, []
    for name, (objective, disc, scheme, k) in recipes().items():
        model = base.rediscretize(scheme, k)
        params, static = eqx.partition(model, eqx.is_inexact_array)
        fn, step = workbench_step(static, optimizer, objective, disc)
        lines[name] = (jax.jit(fn), params, optimizer.init(params), "index")
        if name == "multi_resolution":
            draws = [_drawn(disc, i) for i in range(cfg.steps_per_round)]
            mr_step, mr_model = step, model
        if name == "multi_resolution_coarsen":  # (steps per layer, coarsening) of each draw
            coarse_draws = [disc.draws[_drawn(disc, i)] for i in range(cfg.steps_per_round)]
        if name == "multi_resolution_coarse_branch":
            only = {_drawn(disc, i) for i in range(cfg.steps_per_round)}
            assert only == {len(RESOLUTIONS)}, f"the coarse-only line drew {only}"

    plain = plain_from_workbench(base, scfg)
    p_params, p_static = eqx.partition(plain, eqx.is_array)
    p_opt = plain_optimizer(scfg)
    fn1, _ = plain_step(p_static, p_opt, (1,), 0.0)
    fnm, plain_obj = plain_step(p_static, p_opt, RESOLUTIONS, KINETIC)
    lines["plain_lie_1"] = (jax.jit(fn1), p_params, p_opt.init(p_params), "zero")
    lines["plain_multi_resolution"] = (jax.jit(fnm), p_params, p_opt.init(p_params), "draws")
    fnb, _ = plain_step(p_static, p_opt, RESOLUTIONS, KINETIC, grad_in_branch=True)
    lines["plain_multi_resolution_grad_in_branch"] = (
        jax.jit(fnb),
        p_params,
        p_opt.init(p_params),
        "draws",
    )

    # ---- by value: the plain objective at every k against the workbench's
    checks = {}
    plain_obj = jax.jit(plain_obj)
    for branch, k in enumerate(RESOLUTIONS):
        theirs = float(plain_obj(p_params, xs, ys, branch))
        model_k = mr_model.rediscretize(None, k)
        ours = float(jax.jit(lambda m: mr_step.objective(m, xs, ys)[0])(model_k))
        rel = abs(theirs - ours) / abs(ours)
        checks[f"objective_k{k}"] = {
            "plain": theirs,
            "workbench": ours,
            "relative": rel,
            "tol": TOLERANCE,
            "pass": bool(rel < TOLERANCE),
        }

    # ---- compile (first call) and timing
    def args(name, state, i):
        fn, _, _, kind = lines[name]
        extra = {"index": i, "zero": 0, "draws": draws[i % len(draws)]}[kind]
        return (*state, xs, ys, jnp.asarray(extra, jnp.int32))

    states, first = {}, {}
    for name, (fn, params, opt_state, _) in lines.items():
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args(name, (params, opt_state), 0)))
        first[name] = time.perf_counter() - t0
        states[name] = (params, opt_state)

    samples = {name: [] for name in lines}
    names = list(lines)
    with OtherLoad() as load:
        for r in range(cfg.warmup + cfg.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                fn = lines[name][0]
                state = states[name]
                t0 = time.perf_counter()
                for i in range(cfg.steps_per_round):
                    params, opt_state, value = fn(*args(name, state, i))
                    state = (params, opt_state)
                jax.block_until_ready(state)
                dt = (time.perf_counter() - t0) / cfg.steps_per_round
                states[name] = state
                if r >= cfg.warmup:
                    samples[name].append(dt)

    per_step = {name: stats(s) for name, s in samples.items()}
    med = {name: v["median_s"] for name, v in per_step.items()}
    branch_mean = float(np.mean([med[f"multi_resolution_k{k}"] for k in RESOLUTIONS]))
    drawn_mean = float(np.mean([med[f"multi_resolution_k{RESOLUTIONS[b]}"] for b in draws]))
    ratios = {name: med[name] / med["lie_1"] for name in lines}
    # the default's expected cost: its four branches (k = 1, 2, 4 and the coarse one), each
    # weighted by the probability of its draw
    branch_of = {(k, 1): f"multi_resolution_k{k}" for k in RESOLUTIONS}
    branch_of[(1, 2)] = "multi_resolution_coarse_branch"
    coarse_mean = float(np.dot(DEFAULT.weights, [med[branch_of[d]] for d in DEFAULT.draws]))
    coarse_drawn_mean = float(np.mean([med[branch_of[tuple(d)]] for d in coarse_draws]))
    result = {
        "benchmark": "training_recipes",
        "config": dataclasses.asdict(cfg),
        "environment": environment(),
        "checks": checks,
        "draws_per_round": [RESOLUTIONS[b] for b in draws],
        "draws_per_round_coarsen": [list(d) for d in coarse_draws],
        "first_call_s": first,
        "per_step": per_step,
        "ratio_to_lie_1": ratios,
        "workbench_over_plain": {
            "lie_1": med["lie_1"] / med["plain_lie_1"],
            "multi_resolution": med["multi_resolution"] / med["plain_multi_resolution"],
            "multi_resolution_vs_grad_in_branch": med["multi_resolution"]
            / med["plain_multi_resolution_grad_in_branch"],
        },
        "multi_resolution_vs_branches": {
            "measured_s": med["multi_resolution"],
            "mean_of_branches_s": branch_mean,
            "mean_of_drawn_branches_s": drawn_mean,
            "expected_steps_per_layer": wbc.MultiResolution(RESOLUTIONS).cost,
        },
        "multi_resolution_coarsen_vs_branches": {
            "measured_s": med["multi_resolution_coarsen"],
            "mean_of_branches_s": coarse_mean,  # weighted by the draws' probabilities
            "mean_of_drawn_branches_s": coarse_drawn_mean,
            "probabilities": [float(p) for p in DEFAULT.weights],
            "expected_steps_per_layer": DEFAULT.cost,
            "expected_ratio_to_lie_1": coarse_mean / med["lie_1"],
        },
        "other_load_fraction": load.fraction,
    }
    rows = [[n, 1e3 * med[n], 1e3 * per_step[n]["iqr_s"], ratios[n], first[n]] for n in lines]
    print(table(rows, ["line", "ms/step", "IQR ms", "x lie_1", "first call s"]))
    print(
        f"multi_resolution: {1e3 * med['multi_resolution']:.1f} ms/step; mean of its branches "
        f"{1e3 * branch_mean:.1f} ms, of the branches drawn in a round {1e3 * drawn_mean:.1f} ms"
    )
    print(
        f"multi_resolution_coarsen: {1e3 * med['multi_resolution_coarsen']:.1f} ms/step; mean of "
        f"its four branches weighted by their probabilities {1e3 * coarse_mean:.1f} ms "
        f"({coarse_mean / med['lie_1']:.2f}x lie_1), "
        f"of the branches drawn in a round {1e3 * coarse_drawn_mean:.1f} ms"
    )
    print("workbench / plain:", {k: round(v, 3) for k, v in result["workbench_over_plain"].items()})
    ok = all(c["pass"] for c in checks.values())
    print(
        "value checks:",
        "pass" if ok else "FAIL",
        {k: f"{c['relative']:.1e}" for k, c in checks.items()},
    )
    write_json(out_path, result)
    print("wrote", out_path)
    if not ok:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--out")
    a = parser.parse_args()
    cfg = Config.smoke() if a.smoke else Config()
    if a.rounds:
        cfg = dataclasses.replace(cfg, rounds=a.rounds)
    name = "training_recipes_smoke.json" if cfg.is_smoke else "training_recipes.json"
    main(cfg, a.out or os.path.join(RESULTS, name))
