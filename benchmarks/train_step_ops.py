"""Where a digits training step's time goes, op by op: JAX (what XLA compiles for the maths the
workbench step runs) against PyTorch's equivalent, each timed alone, forward and backward.

The sizes are `benchmarks/train_step.py`'s: batch 64 images of 8×8, 65 tokens (64 pixels and a
class token), d = 64, 4 heads, hidden 128, 4 layers, float32, 139,530 parameters. Every op is
written twice in this file, in plain `jax.numpy` (batched by `jax.vmap` over the images, as the
library's model is) and in plain torch, with the same weights; each is timed as one
forward + backward pass (the gradient of `Σ out · c` for a fixed random cotangent `c`, with
respect to the weights and the op's input, as inside a network):

- `embedding`: the 3×3 convolution (zero padding 1, 1 → 64 channels), bias, class token,
  positions;
- `layer_norm`: one LayerNorm of the `(65, 64)` tokens (two per layer in a pre-norm block);
- `attention`: fused QKV projection, 4-head softmax attention, output projection;
- `feed_forward`: 64 → 128, exact GELU, 128 → 64;
- `head`: final LayerNorm, linear head on the class token, mean cross-entropy;
- `optimizer`: global-norm clipping to 1 and AdamW on 139,530 parameters (`optax.chain(
  clip_by_global_norm, adamw)` jitted, against `clip_grad_norm_` and `torch.optim.AdamW`);

- `layers_scan`, `layers_unrolled`: the 4 pre-norm blocks composed (`u + att(LN(u))`, then
  `u + ffn(LN(u))`, each layer its own weights), forward + backward, in JAX as a `lax.scan` over
  the stacked weights (how the workbench and `train_step.py`'s plain equinox model solve depth)
  and as a Python loop unrolled at trace time; in torch the loop it always runs;
- `model`: embedding, the scanned blocks and the head's loss, forward + backward: the whole
  step but the optimizer.

The whole step of each is `benchmarks/train_step.py`'s measurement; the sum of the per-op times,
with the per-layer ops counted 4 times (2 LayerNorms per layer), can be set next to it (XLA fuses
across ops in the whole step, so the sum is an attribution, not an identity). The composition
lines attribute the rest of the gap: `composition` = (the blocks composed − the sum of their
ops), JAX's minus torch's, and `assembly` = (`model` − embedding − blocks − head), JAX's minus
torch's; with the ops and the optimizer they add up to the gap of the whole step without the
optimizer's host overhead.

Values first: each op's JAX and torch outputs agree (max abs difference < 1e-4, exit status 1
otherwise). Timing: `warmup` calls of each, then `rounds` interleaved rounds (the order rotates)
of `calls` calls each, blocked on / synchronous; medians of the rounds. Reported per op: JAX and
torch milliseconds per call, their ratio, and the op's share of the step-time gap
`count × (t_jax − t_torch)`.

Run: `python benchmarks/train_step_ops.py [--smoke] [--rounds R]`; writes
`benchmarks/results/train_step_ops.json` (`--smoke`: `train_step_ops_smoke.json`).
"""

import argparse
import dataclasses
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import RESULTS, OtherLoad, cpu_count, environment, stats, table, write_json


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 64
    image: int = 8
    d: int = 64
    heads: int = 4
    hidden: int = 128
    layers: int = 4
    classes: int = 10
    warmup: int = 3
    rounds: int = 15
    calls: int = 10
    seed: int = 0
    is_smoke: bool = False

    @property
    def tokens(self) -> int:
        return self.image * self.image + 1

    @classmethod
    def smoke(cls) -> "Config":
        return cls(batch=4, d=16, heads=2, hidden=32, warmup=1, rounds=3, calls=2, is_smoke=True)


EPS = 1e-5


# ----------------------------------------------------------------------------------------------
# The ops in plain jax.numpy (one example; vmapped over the batch) and in torch (batched)


def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + EPS) * w + b


def _attention(x, p, heads):
    n, d = x.shape
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    q, k, v = (t.reshape(n, heads, d // heads).transpose(1, 0, 2) for t in jnp.split(qkv, 3, -1))
    a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(d // heads), axis=-1)
    return (a @ v).transpose(1, 0, 2).reshape(n, d) @ p["w_out"] + p["b_out"]


def _ffn(x, p):
    return jax.nn.gelu(x @ p["w_1"] + p["b_1"], approximate=False) @ p["w_2"] + p["b_2"]


def _embed(image, p):
    y = jax.lax.conv_general_dilated(image[None, None], p["conv_w"], (1, 1), [(1, 1), (1, 1)])[0]
    tokens = y.reshape(y.shape[0], -1).T + p["conv_b"]
    return jnp.concatenate([p["cls"][None], tokens]) + p["pos"]


def _head_loss(u, y, p):
    logits = _ln(u, p["ln_w"], p["ln_b"])[0] @ p["head_w"] + p["head_b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def _torch_ops(torch, cfg: Config):
    F = torch.nn.functional
    h = cfg.heads

    def attention(x, p):
        b, n, d = x.shape
        qkv = x @ p["w_qkv"] + p["b_qkv"]
        q, k, v = (t.reshape(b, n, h, d // h).transpose(1, 2) for t in qkv.chunk(3, -1))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // h), dim=-1)
        return (a @ v).transpose(1, 2).reshape(b, n, d) @ p["w_out"] + p["b_out"]

    def ffn(x, p):
        return F.gelu(x @ p["w_1"] + p["b_1"]) @ p["w_2"] + p["b_2"]

    def embed(images, p):
        y = F.conv2d(images[:, None], p["conv_w"], padding=1)  # (b, d, h, w)
        tokens = y.flatten(2).transpose(1, 2) + p["conv_b"]
        cls = p["cls"].expand(images.shape[0], 1, -1)
        return torch.cat([cls, tokens], 1) + p["pos"]

    def ln(x, p):
        return F.layer_norm(x, (x.shape[-1],), p["ln_w"], p["ln_b"], EPS)

    def head_loss(u, y, p):
        logits = F.layer_norm(u, (u.shape[-1],), p["ln_w"], p["ln_b"], EPS)[:, 0] @ p["head_w"]
        return F.cross_entropy(logits + p["head_b"], y, reduction="none")

    return attention, ffn, embed, ln, head_loss


def _params(cfg: Config, rng) -> dict:
    d, hdn, c = cfg.d, cfg.hidden, cfg.classes
    r = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    return {
        "w_qkv": r(d, 3 * d),
        "b_qkv": r(3 * d),
        "w_out": r(d, d),
        "b_out": r(d),
        "w_1": r(d, hdn),
        "b_1": r(hdn),
        "w_2": r(hdn, d),
        "b_2": r(d),
        "ln_w": 1 + r(d),
        "ln_b": r(d),
        "conv_w": r(d, 1, 3, 3),
        "conv_b": r(d),
        "cls": r(d),
        "pos": r(cfg.tokens, d),
        "head_w": r(d, c),
        "head_b": r(c),
    }


# ----------------------------------------------------------------------------------------------
# Timed functions


def _cases(cfg: Config, torch, rng):
    """name → (count per step, jax fn(), torch fn(), jax output for the check, torch output)."""
    P = _params(cfg, rng)
    jp = {k: jnp.asarray(v) for k, v in P.items()}
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in P.items()}
    b, n, d = cfg.batch, cfg.tokens, cfg.d
    u = rng.standard_normal((b, n, d)).astype(np.float32)
    images = rng.uniform(0, 16, (b, cfg.image, cfg.image)).astype(np.float32)
    labels = rng.integers(0, cfg.classes, b)
    cot = rng.standard_normal((b, n, d)).astype(np.float32)
    ju, jimg, jy, jcot = map(jnp.asarray, (u, images, labels.astype(np.int32), cot))
    tu = torch.tensor(u, requires_grad=True)
    timg = torch.tensor(images)
    ty, tcot = torch.tensor(labels), torch.tensor(cot)
    t_att, t_ffn, t_emb, t_ln, t_head = _torch_ops(torch, cfg)

    def jax_case(fn, x, names, scalar=False):
        sub = {k: jp[k] for k in names}

        def objective(sub, x):
            out = fn(x, sub)
            return (jnp.mean(out) if scalar else jnp.sum(out * jcot[: out.shape[0]])), out

        grad = jax.jit(jax.grad(objective, argnums=(0, 1), has_aux=True))

        def run():
            return jax.block_until_ready(grad(sub, x))

        return run, lambda: np.asarray(objective(sub, x)[1])

    def torch_case(fn, x, names, scalar=False):
        sub = {k: tp[k] for k in names}

        def run():
            for t in sub.values():
                t.grad = None
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.grad = None
            out = fn(x, sub)
            (out.mean() if scalar else out).backward(None if scalar else tcot[: out.shape[0]])

        return run, lambda: fn(x, sub).detach().numpy()

    att = ["w_qkv", "b_qkv", "w_out", "b_out"]
    ffn = ["w_1", "b_1", "w_2", "b_2"]
    emb = ["conv_w", "conv_b", "cls", "pos"]
    ln = ["ln_w", "ln_b"]
    head = ["ln_w", "ln_b", "head_w", "head_b"]
    h = cfg.heads
    cases = {
        "embedding": (
            1,
            jax_case(jax.vmap(_embed, (0, None)), jimg, emb),
            torch_case(t_emb, timg, emb),
        ),
        "layer_norm": (
            2 * cfg.layers,
            jax_case(jax.vmap(lambda x, p: _ln(x, p["ln_w"], p["ln_b"]), (0, None)), ju, ln),
            torch_case(t_ln, tu, ln),
        ),
        "attention": (
            cfg.layers,
            jax_case(jax.vmap(lambda x, p: _attention(x, p, h), (0, None)), ju, att),
            torch_case(t_att, tu, att),
        ),
        "feed_forward": (
            cfg.layers,
            jax_case(jax.vmap(_ffn, (0, None)), ju, ffn),
            torch_case(t_ffn, tu, ffn),
        ),
        "head": (
            1,
            jax_case(lambda x, p: jax.vmap(_head_loss, (0, 0, None))(x, jy, p), ju, head, True),
            torch_case(lambda x, p: t_head(x, ty, p), tu, head, True),
        ),
    }
    return cases


def _stack_cases(cfg: Config, torch, rng):
    """The composition lines: the blocks composed (JAX scanned and unrolled, torch), and the
    model without the optimizer (JAX with the scanned blocks, torch). name → (jax fns by
    variant, torch fn, jax outputs for the checks, torch output)."""
    L, h = cfg.layers, cfg.heads
    per_layer = [_params(cfg, rng) for _ in range(L)]
    ln2 = [
        {
            "ln_w": 1 + 0.2 * rng.standard_normal(cfg.d).astype(np.float32),
            "ln_b": 0.2 * rng.standard_normal(cfg.d).astype(np.float32),
        }
        for _ in range(L)
    ]
    names = ["w_qkv", "b_qkv", "w_out", "b_out", "w_1", "b_1", "w_2", "b_2", "ln_w", "ln_b"]
    layers = [
        {**{k: p[k] for k in names}, "ln2_w": q["ln_w"], "ln2_b": q["ln_b"]}
        for p, q in zip(per_layer, ln2)
    ]
    outer = {k: per_layer[0][k] for k in ["conv_w", "conv_b", "cls", "pos", "head_w", "head_b"]}
    outer["lnf_w"], outer["lnf_b"] = per_layer[1]["ln_w"], per_layer[1]["ln_b"]
    b, n, d = cfg.batch, cfg.tokens, cfg.d
    u = rng.standard_normal((b, n, d)).astype(np.float32)
    cot = rng.standard_normal((b, n, d)).astype(np.float32)
    images = rng.uniform(0, 16, (b, cfg.image, cfg.image)).astype(np.float32)
    labels = rng.integers(0, cfg.classes, b)

    def block(x, p):
        x = x + _attention(_ln(x, p["ln_w"], p["ln_b"]), p, h)
        return x + _ffn(_ln(x, p["ln2_w"], p["ln2_b"]), p)

    def scanned(x, stacked):
        return jax.lax.scan(lambda c, p: (block(c, p), None), x, stacked)[0]

    def unrolled(x, stacked):
        for i in range(L):
            x = block(x, jax.tree.map(lambda a: a[i], stacked))
        return x

    stacked = {k: jnp.asarray(np.stack([lay[k] for lay in layers])) for k in layers[0]}
    jouter = {k: jnp.asarray(v) for k, v in outer.items()}
    ju, jcot, jimg = jnp.asarray(u), jnp.asarray(cot), jnp.asarray(images)
    jy = jnp.asarray(labels.astype(np.int32))

    def stack_objective(compose):
        def objective(stacked, x):
            out = jax.vmap(compose, (0, None))(x, stacked)
            return jnp.sum(out * jcot), out

        return objective

    def model_loss(params, images):
        stacked, o = params

        def one(image, y):
            x = scanned(_embed(image, o), stacked)
            hp = {
                "ln_w": o["lnf_w"],
                "ln_b": o["lnf_b"],
                "head_w": o["head_w"],
                "head_b": o["head_b"],
            }
            return _head_loss(x, y, hp)

        return jnp.mean(jax.vmap(one)(images, jy)), None

    def runner(objective, *args):
        grad = jax.jit(jax.grad(objective, argnums=(0, 1), has_aux=True))
        return lambda: jax.block_until_ready(grad(*args))

    jfns = {
        "layers_scan": runner(stack_objective(scanned), stacked, ju),
        "layers_unrolled": runner(stack_objective(unrolled), stacked, ju),
        "model": runner(model_loss, (stacked, jouter), jimg),
    }
    jouts = {
        "layers_scan": np.asarray(stack_objective(scanned)(stacked, ju)[1]),
        "layers_unrolled": np.asarray(stack_objective(unrolled)(stacked, ju)[1]),
    }
    t_att, t_ffn, t_emb, _, t_head = _torch_ops(torch, cfg)
    F = torch.nn.functional
    tl = [{k: torch.tensor(v, requires_grad=True) for k, v in lay.items()} for lay in layers]
    to = {k: torch.tensor(v, requires_grad=True) for k, v in outer.items()}
    tu = torch.tensor(u, requires_grad=True)
    tcot, timg, ty = torch.tensor(cot), torch.tensor(images), torch.tensor(labels)

    def t_stack(x):
        for p in tl:
            x = x + t_att(F.layer_norm(x, (d,), p["ln_w"], p["ln_b"], EPS), p)
            x = x + t_ffn(F.layer_norm(x, (d,), p["ln2_w"], p["ln2_b"], EPS), p)
        return x

    def t_model():
        x = t_stack(t_emb(timg, to))
        hp = {
            "ln_w": to["lnf_w"],
            "ln_b": to["lnf_b"],
            "head_w": to["head_w"],
            "head_b": to["head_b"],
        }
        return t_head(x, ty, hp).mean()

    def zero():
        for t in [tu, *to.values(), *(t for p in tl for t in p.values())]:
            t.grad = None

    def t_layers():
        zero()
        t_stack(tu).backward(tcot)

    def t_model_run():
        zero()
        t_model().backward()

    tfns = {"layers": t_layers, "model": t_model_run}
    touts = {"layers": t_stack(tu).detach().numpy(), "model": float(t_model().detach())}
    jouts["model"] = float(model_loss((stacked, jouter), jimg)[0])
    return jfns, tfns, jouts, touts


def _leaf_shapes(cfg: Config) -> list[tuple[int, ...]]:
    """The model's parameter arrays as the workbench holds them: the blocks' weights stacked
    over the layers (12 arrays), the embedding's 4, the final LayerNorm's 2, the head's 2."""
    d, hdn, L = cfg.d, cfg.hidden, cfg.layers
    block = [
        (d, 3 * d),
        (3 * d,),
        (d, d),
        (d,),
        (d,),
        (d,),
        (d,),
        (d,),
        (d, hdn),
        (hdn,),
        (hdn, d),
        (d,),
    ]
    rest = [(d, 1, 3, 3), (d,), (d,), (cfg.tokens, d), (d,), (d,), (d, cfg.classes), (cfg.classes,)]
    return [(L, *s) for s in block] + rest


def _optimizer_case(cfg: Config, torch, rng):
    shapes = _leaf_shapes(cfg)
    split = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    gsplit = [1e-2 * rng.standard_normal(s).astype(np.float32) for s in shapes]
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-3, weight_decay=0.05))
    jparams = [jnp.asarray(p) for p in split]
    jgrads = [jnp.asarray(g) for g in gsplit]
    state = opt.init(jparams)

    @jax.jit
    def update(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def jrun():
        return jax.block_until_ready(update(jparams, state, jgrads))

    tparams = [torch.nn.Parameter(torch.tensor(p)) for p in split]
    for t, g in zip(tparams, gsplit):
        t.grad = torch.tensor(g)
    topt = torch.optim.AdamW(tparams, lr=3e-3, weight_decay=0.05)

    def trun():
        with torch.no_grad():
            saved = [t.detach().clone() for t in tparams]
        torch.nn.utils.clip_grad_norm_(tparams, 1.0)
        topt.step()
        with torch.no_grad():  # undo, so every call starts from the same state
            for t, s in zip(tparams, saved):
                t.copy_(s)

    def tsave_only():
        with torch.no_grad():
            saved = [t.detach().clone() for t in tparams]
            for t, s in zip(tparams, saved):
                t.copy_(s)

    return jrun, trun, tsave_only


def _composition(med: dict, cfg: Config) -> dict:
    """The gap beyond the ops, in ms per step (JAX − torch), from the medians `med`:

    - `blocks_as_ops`: the ops of the blocks timed alone (`L` × (2 LN + attention + FFN));
    - `composition`: the blocks composed (`layers_scan`, torch's loop) minus `blocks_as_ops`;
    - `scan_vs_unrolled`: JAX's scanned blocks minus its unrolled ones (torch: 0);
    - `assembly`: `model` minus embedding, the composed blocks and the head;
    - `model`: the whole forward + backward without the optimizer."""
    L = cfg.layers

    def ops(side):
        return L * (
            2 * med[f"layer_norm/{side}"] + med[f"attention/{side}"] + med[f"feed_forward/{side}"]
        )

    rows = {
        "blocks_as_ops": (ops("jax"), ops("torch")),
        "composition": (med["layers_scan/jax"] - ops("jax"), med["layers/torch"] - ops("torch")),
        "scan_vs_unrolled": (med["layers_scan/jax"] - med["layers_unrolled/jax"], 0.0),
        "assembly": tuple(
            med[f"model/{side}"]
            - med[f"embedding/{side}"]
            - med[f"head/{side}"]
            - med["layers_scan/jax" if side == "jax" else "layers/torch"]
            for side in ("jax", "torch")
        ),
        "model": (med["model/jax"], med["model/torch"]),
    }
    return {
        k: {"jax_ms": 1e3 * j, "torch_ms": 1e3 * t, "step_gap_ms": 1e3 * (j - t)}
        for k, (j, t) in rows.items()
    }


def _time(fns: dict, cfg: Config) -> dict:
    for fn in fns.values():
        for _ in range(cfg.warmup):
            fn()
    samples = {k: [] for k in fns}
    names = list(fns)
    for r in range(cfg.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            for _ in range(cfg.calls):
                fns[name]()
            samples[name].append((time.perf_counter() - t0) / cfg.calls)
    return {k: stats(v) for k, v in samples.items()}


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    cfg = Config.smoke() if args.smoke else Config()
    if args.rounds:
        cfg = dataclasses.replace(cfg, rounds=args.rounds)
    torch.set_num_threads(cpu_count())
    rng = np.random.default_rng(cfg.seed)
    cases = _cases(cfg, torch, rng)

    checks, fns, counts = {}, {}, {}
    for name, (count, (jrun, jout), (trun, tout)) in cases.items():
        diff = float(np.max(np.abs(jout() - tout())))
        checks[name] = {"max_abs_diff": diff, "tol": 1e-4, "pass": diff < 1e-4}
        fns[f"{name}/jax"], fns[f"{name}/torch"], counts[name] = jrun, trun, count
    if not all(c["pass"] for c in checks.values()):
        print("value checks failed:", checks, file=sys.stderr)
        return 1
    num_params = sum(math.prod(s) for s in _leaf_shapes(cfg))
    jopt, topt, tsave = _optimizer_case(cfg, torch, rng)
    fns["optimizer/jax"], fns["optimizer/torch"], fns["optimizer/torch_restore_only"] = (
        jopt,
        topt,
        tsave,
    )
    counts["optimizer"] = 1
    sj, st, sjo, sto = _stack_cases(cfg, torch, rng)
    for v in ("layers_scan", "layers_unrolled"):
        diff = float(np.max(np.abs(sjo[v] - sto["layers"])))
        checks[v] = {"max_abs_diff": diff, "tol": 1e-4, "pass": diff < 1e-4}
    diff = abs(sjo["model"] - sto["model"])
    checks["model"] = {"abs_diff": diff, "tol": 1e-4, "pass": diff < 1e-4}
    if not all(c["pass"] for c in checks.values()):
        print("value checks failed:", checks, file=sys.stderr)
        return 1
    for k, fn in sj.items():
        fns[f"{k}/jax"] = fn
    fns["layers/torch"], fns["model/torch"] = st["layers"], st["model"]

    with OtherLoad() as load:
        timed = _time(fns, cfg)
    med = {k: v["median_s"] for k, v in timed.items()}
    med["optimizer/torch"] -= med.pop("optimizer/torch_restore_only")  # the undo is not the step
    rows, per_op = [], {}
    for name, count in counts.items():
        tj, tt = med[f"{name}/jax"], med[f"{name}/torch"]
        gap = count * (tj - tt)
        per_op[name] = {
            "count_per_step": count,
            "jax_ms": 1e3 * tj,
            "torch_ms": 1e3 * tt,
            "jax_over_torch": tj / tt,
            "step_gap_ms": 1e3 * gap,
        }
        rows.append(
            [
                name,
                count,
                f"{1e3 * tj:.3f}",
                f"{1e3 * tt:.3f}",
                f"{tj / tt:.2f}",
                f"{1e3 * gap:+.2f}",
            ]
        )
    total_jax = sum(v["count_per_step"] * v["jax_ms"] for v in per_op.values())
    total_torch = sum(v["count_per_step"] * v["torch_ms"] for v in per_op.values())
    print(table(rows, ["op", "per step", "jax ms", "torch ms", "jax/torch", "step gap ms"]))
    print(f"sum over a step: jax {total_jax:.1f} ms, torch {total_torch:.1f} ms")
    composition = _composition(med, cfg)
    print(
        table(
            [
                [k, f"{v['jax_ms']:.2f}", f"{v['torch_ms']:.2f}", f"{v['step_gap_ms']:+.2f}"]
                for k, v in composition.items()
            ],
            ["composition", "jax ms", "torch ms", "step gap ms"],
        )
    )
    result = {
        "benchmark": "train_step_ops",
        "config": dataclasses.asdict(cfg),
        "environment": environment(),
        "checks": checks,
        "timings": timed,
        "num_parameters": num_params,
        "per_op": per_op,
        "sum_per_step_ms": {"jax": total_jax, "torch": total_torch},
        "composition": composition,
        "other_load_fraction": load.fraction,
    }
    name = "train_step_ops_smoke.json" if cfg.is_smoke else "train_step_ops.json"
    out = args.out or os.path.join(RESULTS, name)
    write_json(out, result)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
