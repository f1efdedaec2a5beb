"""A neural-ODE solve of one Transformer layer's field: the workbench vs diffrax, plain JAX and
torchdiffeq.

The field is the pre-norm layer's continuous equation (paper A's `Natural` formulation),
`u_t = MHA(LN₁ u) + FFN(LN₂ u)`, with the weights of one random `torch.nn.TransformerEncoderLayer`
(`norm_first=True`, ReLU), integrated on `[0, 1]` by the explicit midpoint rule with `steps` fixed
steps (the one fixed-step Runge–Kutta method that diffrax and torchdiffeq both ship as the same
tableau: torchdiffeq's `rk4` is Kutta's 3/8 rule, diffrax has no RK4), for a
batch of `batch` sequences of `n` tokens of width `d`, float32. Four implementations hold the same
weights and are checked by value first (max abs difference of the final states ≤ 1e-4):

- `workbench`: `wb.integrate(equation, u0, diffrax.Midpoint(), num_steps=steps)` on the equation
  recovered by `wb.architectures.encoder_from_torch`, `jax.vmap` over the batch, `jax.jit`;
- `diffrax`: the same field written by hand in equinox (fused QKV, `einsum`, `jax.nn.softmax`)
  and `diffrax.diffeqsolve(ODETerm, Midpoint(), dt0=1/steps, saveat=t1)`, vmapped, jitted;
- `plain_jax`: the hand-written field and a midpoint loop written by hand (`lax.fori_loop`), vmapped,
  jitted — what a JAX user writes without a solver library;
- `torchdiffeq`: the `TransformerEncoderLayer`'s own submodules as the field and
  `torchdiffeq.odeint(method="midpoint", options={"step_size": 1/steps})` on the batch, under
  `torch.inference_mode()` (threads = CPU count).

Timing: warm-up, then `rounds` rounds in a rotating order; medians, ratios to the workbench and
first calls (trace + compile for JAX) separately.

Run: `python benchmarks/ode_solve.py [--smoke] [--rounds R]`; writes `results/ode_solve.json`
(`_smoke` with `--smoke`).
"""

import argparse
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchdiffeq
from _common import (
    RESULTS,
    EncoderLayer,
    OtherLoad,
    _layer_arrays,
    cpu_count,
    environment,
    layer_norm,
    stats,
    table,
    write_json,
)

import workbench as wb

TOLERANCE = 1e-4
NAMES = ("workbench", "diffrax", "plain_jax", "torchdiffeq")


def _field(layer: EncoderLayer):
    """The pre-norm field `MHA(LN₁ u) + FFN(LN₂ u)` of the hand-written layer."""

    def f(u):
        a = layer.attention(layer_norm(u, layer.ln1_weight, layer.ln1_bias, layer.eps))
        b = layer.feedforward(layer_norm(u, layer.ln2_weight, layer.ln2_bias, layer.eps))
        return a + b

    return f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="few rounds (seconds)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.smoke else 20)
    batch, n, d, heads, hidden, steps = 32, 32, 64, 4, 256, 32
    torch.set_num_threads(cpu_count())

    rng = np.random.default_rng(0)
    sd = wb.architectures.random_encoder_state_dict(
        rng, d=d, num_layers=1, dim_feedforward=hidden, dtype=np.float32
    )
    u0 = rng.standard_normal((batch, n, d)).astype(np.float32)
    j_u0 = jnp.asarray(u0)

    # workbench
    equation = wb.architectures.encoder_from_torch(
        sd, num_heads=heads, norm_first=True, activation="relu"
    ).equation

    @eqx.filter_jit
    def solve_workbench(equation, u0):
        one = lambda u: wb.integrate(equation, u, diffrax.Midpoint(), num_steps=steps).u1
        return jax.vmap(one)(u0)

    # hand-written field: diffrax and plain JAX
    arrays = {f: jnp.asarray(x) for f, x in _layer_arrays(sd, 0).items()}
    layer = EncoderLayer(**arrays, num_heads=heads, eps=1e-5)

    @eqx.filter_jit
    def solve_diffrax(layer, u0):
        f = _field(layer)
        term = diffrax.ODETerm(lambda t, u, args: f(u))

        def one(u):
            sol = diffrax.diffeqsolve(
                term, diffrax.Midpoint(), 0.0, 1.0, 1.0 / steps, u, saveat=diffrax.SaveAt(t1=True)
            )
            return sol.ys[0]

        return jax.vmap(one)(u0)

    @eqx.filter_jit
    def solve_plain(layer, u0):
        f = jax.vmap(_field(layer))
        h = 1.0 / steps

        def step(_, u):
            return u + h * f(u + 0.5 * h * f(u))

        return jax.lax.fori_loop(0, steps, step, u0)

    # torchdiffeq
    t_layer = torch.nn.TransformerEncoderLayer(
        d,
        heads,
        dim_feedforward=hidden,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=True,
    )
    t_layer.load_state_dict({k.split(".", 2)[2]: torch.from_numpy(v) for k, v in sd.items()})
    t_layer.eval()

    class Field(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, t, u):
            a = self.layer.norm1(u)
            a = self.layer.self_attn(a, a, a, need_weights=False)[0]
            b = self.layer.linear2(torch.relu(self.layer.linear1(self.layer.norm2(u))))
            return a + b

    t_field, t_u0, t_span = Field(t_layer), torch.from_numpy(u0), torch.tensor([0.0, 1.0])

    def solve_torch():
        with torch.inference_mode():
            return torchdiffeq.odeint(
                t_field, t_u0, t_span, method="midpoint", options={"step_size": 1.0 / steps}
            )[-1]

    run = {
        "workbench": lambda: jax.block_until_ready(solve_workbench(equation, j_u0)),
        "diffrax": lambda: jax.block_until_ready(solve_diffrax(layer, j_u0)),
        "plain_jax": lambda: jax.block_until_ready(solve_plain(layer, j_u0)),
        "torchdiffeq": lambda: solve_torch(),
    }
    first, outputs = {}, {}
    for name in NAMES:
        t0 = time.perf_counter()
        outputs[name] = np.asarray(run[name]())
        first[name] = time.perf_counter() - t0
    errors = {k: float(np.max(np.abs(v - outputs["workbench"]))) for k, v in outputs.items()}
    bad = {k: e for k, e in errors.items() if e > TOLERANCE}
    if bad:
        raise SystemExit(f"final states differ from the workbench's by {bad} > {TOLERANCE}")
    for name in NAMES:
        run[name]()
    samples = {k: [] for k in NAMES}
    with OtherLoad() as load:
        for r in range(rounds):
            for name in NAMES[r % 4 :] + NAMES[: r % 4]:
                t0 = time.perf_counter()
                run[name]()
                samples[name].append(time.perf_counter() - t0)
    s = {k: stats(v) for k, v in samples.items()}
    base = s["workbench"]["median_s"]
    ratios = {f"{k}_over_workbench": v["median_s"] / base for k, v in s.items() if k != "workbench"}
    result = {
        "benchmark": "ode_solve",
        "question": "midpoint-rule neural-ODE solve of one pre-norm Transformer layer's field: workbench vs "
        "diffrax, plain JAX, torchdiffeq",
        "config": dict(
            batch=batch,
            n=n,
            d=d,
            heads=heads,
            hidden=hidden,
            steps=steps,
            dtype="float32",
            rounds=rounds,
            smoke=args.smoke,
        ),
        "max_abs_difference_to_workbench": errors,
        "first_call_s": first,
        "warm": s,
        "ratios": ratios,
        "other_load": load.fraction,
        "environment": environment(),
    }
    name = "ode_solve_smoke.json" if args.smoke else "ode_solve.json"
    write_json(args.out or f"{RESULTS}/{name}", result)
    rows = [
        [k, v["median_s"] * 1e3, v["median_s"] / base, first[k], errors[k]] for k, v in s.items()
    ]
    print(
        table(
            rows,
            ["implementation", "median ms", "ratio to workbench", "first call s", "max |diff|"],
        )
    )


if __name__ == "__main__":
    main()
