"""Training steps per second of the digits model: the workbench trainer's step against plain
equinox + optax and against PyTorch, side by side in one process.

The model is `studies/training/train_digits.py`'s: 8×8 images, a patch embedding (3×3 kernel, stride 1,
zero padding 1: 64 patch tokens) plus a class token and position embeddings, d = 64, 4 heads,
hidden 128, exact GELU, pre-norm blocks `u + MHA(LN(u))`, `u + FFN(LN(u))`, a final LayerNorm and
a linear head on the class token; cross-entropy; AdamW after clipping the global gradient norm to
1; batch 64; float32. Implementations:

- `plain_equinox_optax`: written by hand (`PlainViT` below): the patch embedding by
  `lax.conv_general_dilated`, fused-QKV head-major attention, the blocks' weights stacked and run
  by `lax.scan`, batch by `jax.vmap`, `optax.chain(clip_by_global_norm, adamw)`, one `jax.jit`-ed
  step `(params, opt_state, xs, ys) -> (params, opt_state, loss)`;
- `workbench`: the library's step, `wbc.TrainStep(wbc.default_optimizer(...))` on the
  `wbc.ControlledModel` (`wbc.PatchEmbedding`, `wbc.random_transformer`, `wbc.ClassifierHead`;
  `wbc.DiscretizeThenOptimize` on `wbc.Objective()`), run as `wbc.train` runs it: `jax.jit` of
  the parameters (partitioned by `eqx.is_inexact_array`), the optimizer state, the batch and the
  step index, the finiteness flag read on the host after every step (a non-finite step is not
  assigned);
- `workbench_no_read`: the same step, `finite` not read on the host after each step;
- `workbench_no_guard`: the same step without the finiteness flag (nothing read): next to
  `workbench` it shows what the guard costs, next to `workbench_no_read` how much of that is in
  the compiled step;
- `workbench_checkpoint_every`: the library's step with `wbc.DiscretizeThenOptimize(
  wb.CheckpointEvery(1))` (`--checkpointing every-step`): the backward pass recomputes each
  step's internals instead of storing them for every layer (timed without the host read, next
  to `workbench_no_read`);
- `workbench_filter_jit`: the trainer's step (`finite` not read) under `eqx.filter_jit`, as the
  trainer ran it before: `filter_jit` blocks until every call has finished (it waits on a marker
  output to report runtime errors), so step s + 1 cannot be dispatched while step s runs; a
  diagnostic line: its difference to `workbench_no_read` is what `filter_jit` costs here;
- `torch`: `nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0,
  activation="gelu", batch_first=True, norm_first=True), 4, norm=nn.LayerNorm(64))` with an
  `nn.Conv2d(1, 64, 3, padding=1)` patch embedding, class token, positions and an `nn.Linear`
  head; `torch.optim.AdamW` (torch's default implementation, the same betas, eps and weight
  decay, a constant learning rate equal to the JAX schedule's first value) + `clip_grad_norm_`;
  training mode; threads = CPU count.

All hold the same weights (the workbench model's, perturbed so that no weight is zero, copied
into the other two). First, by value: the logits of every implementation against the workbench
(max abs difference < 1e-4; the script exits non-zero if one fails), the parameter counts, and
that one step of each lowers the loss on the batch. Then, per depth: the cold first step of each
JAX step function (after `jax.clear_caches()`: trace + lower, XLA compile and first run timed
apart; the trainer reports this sum as `compile_time_s`) and torch's first step; `warmup` steps
of each; then interleaved rounds in a rotating order, each timing `steps_per_round` consecutive
steps of every implementation (JAX blocked on at the end of the round's steps), until `rounds`
rounds were quiet (other processes < `quiet_threshold` of the CPUs), or `max_rounds` /
`max_timing_s`. Reported: median steps/s and IQR, ratios workbench / plain (goal >= 0.95) and
workbench / torch (goal >= 1.0), both with the `workbench` line (the trainer's step as it runs),
the guard's overhead and `filter_jit`'s, and the cold first steps. Options: `--smoke`,
`--depths`, `--batch`, `--rounds`, `--steps-per-round`, `--warmup`, `--max-timing`,
`--wait-quiet`, `--out`.

Not included, for all implementations alike: data loading (the trainer indexes the dataset and
`device_put`s each batch; here one fixed batch sits on the device) and augmentation (the study
shifts images by ±1 pixel; off here). The learning-rate schedule is the study's (peak 3e-3,
weight decay 0.05, cosine over 840 steps) with no warm-up, so that the first step's learning rate
is not 0 and the loss check means something; the schedule's cost does not depend on it.

Run: `python benchmarks/train_step.py [--smoke] [--depths 4 16] [--batch 64] [--rounds R]`.
"""

import argparse
import collections
import copy
import dataclasses
import math
import os
import re
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from _common import (
    RESULTS,
    OtherLoad,
    cpu_count,
    environment,
    layer_norm,
    stats,
    table,
    wait_for_quiet,
    write_json,
)
from jaxtyping import Array, Float

import workbench as wb
import workbench.control as wbc

GOAL_VS_PLAIN = 0.95  # workbench steps/s over plain equinox + optax steps/s, at least
GOAL_VS_TORCH = 1.0  # workbench steps/s over torch steps/s, at least
TOLERANCE = 1e-4
PLAIN, WB, WB_NO_READ, WB_NO_GUARD, WB_FILTER_JIT, TORCH = (
    "plain_equinox_optax",
    "workbench",
    "workbench_no_read",
    "workbench_no_guard",
    "workbench_filter_jit",
    "torch",
)
WB_REMAT = "workbench_checkpoint_every"
OPS_OF_INTEREST = (
    "dot",
    "convolution",
    "fusion",
    "dynamic-slice",
    "dynamic-update-slice",
    "transpose",
    "copy",
    "select",
    "while",
    "custom-call",
)


@dataclasses.dataclass(frozen=True)
class Config:
    depths: tuple[int, ...] = (4,)
    batch: int = 64
    image: int = 8
    d: int = 64
    num_heads: int = 4
    hidden: int = 128
    kernel_size: int = 3  # stride 1, zero padding kernel_size // 2: one token per pixel
    num_classes: int = 10
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"
    learning_rate: float = 3e-3
    weight_decay: float = 0.05
    clip: float = 1.0
    schedule_steps: int = 840  # the study's 40 epochs x (1347 // 64) steps
    schedule_warmup: int = 0  # the study's is 100 (learning rate 0 at step 0); see the docstring
    perturbation: float = 0.05  # added to every weight (N(0, 1) times this) before the copies
    warmup: int = 3  # untimed steps of each implementation before the rounds
    rounds: int = 20  # quiet rounds wanted
    steps_per_round: int = 5
    seed: int = 0
    is_smoke: bool = False  # tiny sizes: checks that the script runs; ratios mean nothing
    wait_quiet_s: float = 60.0
    quiet_threshold: float = 0.1
    max_rounds: int = 60
    max_timing_s: float = 300.0  # per depth, for the rounds

    @classmethod
    def smoke(cls, **overrides) -> "Config":
        base = dict(
            depths=(2,),
            batch=8,
            d=32,
            num_heads=2,
            hidden=64,
            warmup=2,
            rounds=3,
            steps_per_round=2,
            max_rounds=3,
            max_timing_s=20.0,
            wait_quiet_s=0,
            is_smoke=True,
        )
        return cls(**{**base, **overrides})

    @property
    def padding(self) -> int:
        return self.kernel_size // 2

    @property
    def num_tokens(self) -> int:
        grid = self.image + 2 * self.padding - self.kernel_size + 1
        return 1 + grid * grid


# ----------------------------------------------------------------------------- plain equinox


class PlainBlock(eqx.Module):
    """One pre-norm block, `x @ W` convention, fused QKV: `u + MHA(LN(u))`, `u + FFN(LN(u))`."""

    w_qkv: Float[Array, "d 3d"]
    b_qkv: Float[Array, " 3d"]
    w_out: Float[Array, "d d"]
    b_out: Float[Array, " d"]
    w_1: Float[Array, "d m"]
    b_1: Float[Array, " m"]
    w_2: Float[Array, "m d"]
    b_2: Float[Array, " d"]
    ln1_weight: Float[Array, " d"]
    ln1_bias: Float[Array, " d"]
    ln2_weight: Float[Array, " d"]
    ln2_bias: Float[Array, " d"]
    num_heads: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    def attention(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        n, d = x.shape
        h = self.num_heads
        # Head-major (3, h, n, c), as benchmarks/_common.py's EncoderLayer (the faster layout on
        # XLA:CPU).
        qkv = (x @ self.w_qkv + self.b_qkv).reshape(n, 3, h, d // h).transpose(1, 2, 0, 3)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = jnp.einsum("hic,hjc->hij", q, k) / math.sqrt(d // h)
        weights = jax.nn.softmax(scores, axis=-1)
        z = jnp.einsum("hij,hjc->hic", weights, v).transpose(1, 0, 2).reshape(n, d)
        return z @ self.w_out + self.b_out

    def feedforward(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        return jax.nn.gelu(x @ self.w_1 + self.b_1, approximate=False) @ self.w_2 + self.b_2

    def __call__(self, x: Float[Array, "n d"]) -> Float[Array, "n d"]:
        x = x + self.attention(layer_norm(x, self.ln1_weight, self.ln1_bias, self.eps))
        return x + self.feedforward(layer_norm(x, self.ln2_weight, self.ln2_bias, self.eps))


class PlainViT(eqx.Module):
    """Conv patch embedding + class token + positions, `lax.scan` over stacked pre-norm blocks,
    final LayerNorm, linear head on the class token. One image `(H, W)` in, logits out."""

    conv_weight: Float[Array, "d c kh kw"]  # OIHW
    conv_bias: Float[Array, " d"]
    class_token: Float[Array, " d"]
    position: Float[Array, "tokens d"]
    blocks: PlainBlock  # every array with a leading layer axis
    norm_weight: Float[Array, " d"]
    norm_bias: Float[Array, " d"]
    head_weight: Float[Array, "d classes"]
    head_bias: Float[Array, " classes"]
    padding: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    def __call__(self, image: Float[Array, "h w"]) -> Float[Array, " classes"]:
        p = self.padding
        y = jax.lax.conv_general_dilated(
            image[None, None], self.conv_weight, (1, 1), [(p, p), (p, p)]
        )[0]  # (d, gh, gw)
        tokens = y.reshape(y.shape[0], -1).T + self.conv_bias
        u = jnp.concatenate([self.class_token[None], tokens]) + self.position
        params, static = eqx.partition(self.blocks, eqx.is_array)

        def body(h, layer):
            return eqx.combine(layer, static)(h), None

        u, _ = jax.lax.scan(body, u, params)
        u = layer_norm(u, self.norm_weight, self.norm_bias, self.eps)
        return u[0] @ self.head_weight + self.head_bias


def plain_from_workbench(model: wbc.ControlledModel, cfg: Config) -> PlainViT:
    """The workbench model's weights in the `PlainViT` layout (a copy on the device)."""
    eq = model.transformer.equation
    att, att_norm = eq.operators[0].term.values, eq.operators[0].projection.values
    ff, ff_norm = eq.operators[1].term.values, eq.operators[1].projection.values
    emb, head = model.embedding, model.head
    cat = lambda *xs: jnp.concatenate(xs, axis=-1)
    blocks = PlainBlock(
        w_qkv=cat(att.query, att.key, att.value),
        b_qkv=cat(att.query_bias, att.key_bias, att.value_bias),
        w_out=jnp.array(att.output),
        b_out=jnp.array(att.output_bias),
        w_1=jnp.array(ff.hidden),
        b_1=jnp.array(ff.hidden_bias),
        w_2=jnp.array(ff.output),
        b_2=jnp.array(ff.output_bias),
        ln1_weight=jnp.array(att_norm.weight),
        ln1_bias=jnp.array(att_norm.bias),
        ln2_weight=jnp.array(ff_norm.weight),
        ln2_bias=jnp.array(ff_norm.bias),
        num_heads=cfg.num_heads,
        eps=cfg.layer_norm_eps,
    )
    return PlainViT(
        conv_weight=jnp.transpose(emb.kernel, (3, 0, 1, 2)),
        conv_bias=jnp.array(emb.bias),
        class_token=jnp.array(emb.cls),
        position=jnp.array(emb.position),
        blocks=blocks,
        norm_weight=jnp.array(eq.output.weight),
        norm_bias=jnp.array(eq.output.bias),
        head_weight=jnp.array(head.weight),
        head_bias=jnp.array(head.bias),
        padding=cfg.padding,
        eps=cfg.layer_norm_eps,
    )


def plain_optimizer(cfg: Config) -> optax.GradientTransformation:
    """`optax.chain(clip_by_global_norm, adamw)` with `wbc.default_optimizer`'s schedule."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        cfg.learning_rate,
        cfg.schedule_warmup,
        max(cfg.schedule_steps, cfg.schedule_warmup + 1),
        cfg.learning_rate * 0.01,
    )
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip),
        optax.adamw(schedule, weight_decay=cfg.weight_decay),
    )


def plain_functions(static, optimizer):
    """`(step, loss)`: the training step `(params, opt_state, xs, ys) -> (params, opt_state,
    loss)` and the batch loss, both to be `jax.jit`-ed."""

    def loss(params, xs, ys):
        logits = jax.vmap(eqx.combine(params, static))(xs)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, ys))

    def step(params, opt_state, xs, ys):
        value, grads = jax.value_and_grad(loss)(params, xs, ys)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step, loss


# ----------------------------------------------------------------------------- workbench


def workbench_model(cfg: Config, depth: int, key) -> wbc.ControlledModel:
    """`studies/training/train_digits.py`'s model (same constructors and key use), then every floating
    weight perturbed by `cfg.perturbation · N(0, 1)`: the head, the biases and the class token
    start at zero, and a value check on zeros would check nothing."""
    k1, k2, k3 = jax.random.split(key, 3)
    dtype = jnp.dtype(cfg.dtype)
    model = wbc.ControlledModel(
        wbc.PatchEmbedding(
            (cfg.image, cfg.image),
            cfg.d,
            kernel_size=cfg.kernel_size,
            stride=1,
            padding=cfg.padding,
            key=k1,
            dtype=dtype,
        ),
        wbc.random_transformer(
            k2,
            d=cfg.d,
            num_heads=cfg.num_heads,
            num_layers=depth,
            hidden=cfg.hidden,
            activation=wb.terms.gelu,
            layer_norm_eps=cfg.layer_norm_eps,
            dtype=dtype,
        ),
        wbc.ClassifierHead(cfg.d, cfg.num_classes, dtype=dtype),
    )
    params, static = eqx.partition(model, eqx.is_inexact_array)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(k3, len(leaves))
    noisy = [
        x + cfg.perturbation * jax.random.normal(k, x.shape, x.dtype)
        for x, k in zip(leaves, keys, strict=True)
    ]
    return eqx.combine(jax.tree.unflatten(treedef, noisy), static)


def workbench_step(static, optimizer, *, guard: bool, method=None):
    """The library's step, `wbc.TrainStep(optimizer)` (`DiscretizeThenOptimize` on
    `Objective()`, augmentation off), called as `wbc.train` calls it: a function of arrays only
    (parameters, optimizer state, batch, step index; the model's structure closed over) for
    `jax.jit`. With `guard=False` its finiteness flag is not returned (XLA then drops it);
    `method`: the gradient method (default `DiscretizeThenOptimize()`)."""
    step = wbc.TrainStep(optimizer) if method is None else wbc.TrainStep(optimizer, method=method)
    key = jax.random.key(0)

    def train_step(params, opt_state, xs, ys, index):
        state = wbc.TrainState(eqx.combine(params, static), opt_state, index, key)
        new, info = step(state, (xs, ys))
        new_params = eqx.filter(new.model, eqx.is_inexact_array)
        aux = {k: info[k] for k in ("loss", "kinetic", "control", "accuracy")}
        if not guard:
            return new_params, new.opt_state, info["objective"], aux
        return new_params, new.opt_state, info["finite"], info["objective"], aux

    return train_step


def trainer_shardings():
    """The trainer's placement (`workbench.control._mesh.BatchMesh` with the default devices): the batch split
    along a one-axis mesh, everything else replicated."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.asarray(jax.devices()), ("batch",))
    return NamedSharding(mesh, PartitionSpec("batch")), NamedSharding(mesh, PartitionSpec())


# ----------------------------------------------------------------------------- torch


class TorchViT(torch.nn.Module):
    def __init__(self, cfg: Config, depth: int):
        super().__init__()
        nn = torch.nn
        self.patch = nn.Conv2d(1, cfg.d, cfg.kernel_size, padding=cfg.padding)
        self.cls = nn.Parameter(torch.zeros(cfg.d))
        self.position = nn.Parameter(torch.zeros(cfg.num_tokens, cfg.d))
        layer = nn.TransformerEncoderLayer(
            cfg.d,
            cfg.num_heads,
            dim_feedforward=cfg.hidden,
            dropout=0.0,
            activation="gelu",
            layer_norm_eps=cfg.layer_norm_eps,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer,
            num_layers=depth,
            norm=nn.LayerNorm(cfg.d, eps=cfg.layer_norm_eps),
            enable_nested_tensor=False,  # not usable with norm_first; avoids its warning
        )
        self.head = nn.Linear(cfg.d, cfg.num_classes)

    def forward(self, images):  # (B, H, W)
        tokens = self.patch(images[:, None]).flatten(2).transpose(1, 2)  # (B, patches, d)
        cls = self.cls.expand(images.shape[0], 1, -1)
        u = torch.cat([cls, tokens], dim=1) + self.position
        return self.head(self.encoder(u)[:, 0])


def torch_from_plain(plain: PlainViT, cfg: Config, depth: int) -> TorchViT:
    """A `TorchViT` holding the plain model's weights (torch `Linear` stores `(out, in)`)."""
    a = lambda x: torch.from_numpy(np.array(x, np.float32))
    t = lambda x: torch.from_numpy(np.ascontiguousarray(np.array(x, np.float32).T))
    b = plain.blocks
    sd = {
        "patch.weight": a(plain.conv_weight),
        "patch.bias": a(plain.conv_bias),
        "cls": a(plain.class_token),
        "position": a(plain.position),
        "encoder.norm.weight": a(plain.norm_weight),
        "encoder.norm.bias": a(plain.norm_bias),
        "head.weight": t(plain.head_weight),
        "head.bias": a(plain.head_bias),
    }
    for i in range(depth):
        p = f"encoder.layers.{i}."
        sd |= {
            p + "self_attn.in_proj_weight": t(b.w_qkv[i]),
            p + "self_attn.in_proj_bias": a(b.b_qkv[i]),
            p + "self_attn.out_proj.weight": t(b.w_out[i]),
            p + "self_attn.out_proj.bias": a(b.b_out[i]),
            p + "linear1.weight": t(b.w_1[i]),
            p + "linear1.bias": a(b.b_1[i]),
            p + "linear2.weight": t(b.w_2[i]),
            p + "linear2.bias": a(b.b_2[i]),
            p + "norm1.weight": a(b.ln1_weight[i]),
            p + "norm1.bias": a(b.ln1_bias[i]),
            p + "norm2.weight": a(b.ln2_weight[i]),
            p + "norm2.bias": a(b.ln2_bias[i]),
        }
    model = TorchViT(cfg, depth)
    model.load_state_dict(sd)
    return model.train()


def torch_optimizer(model, cfg: Config):
    return torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
    )


def torch_step(model, opt, x, y, cfg: Config):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    opt.step()
    return loss


def torch_loss(model, x, y) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


# ----------------------------------------------------------------------------- setup, checks


def count(tree) -> int:
    return int(sum(x.size for x in jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))))


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def setup(cfg: Config, depth: int, xs_np, ys_np):
    """The three models with the same weights, their step functions and optimizer states."""
    wb_model = workbench_model(cfg, depth, jax.random.key(cfg.seed))
    plain_model = plain_from_workbench(wb_model, cfg)
    torch_model = torch_from_plain(plain_model, cfg, depth)

    batch_sharding, replicated = trainer_shardings()
    wb_params, wb_static = eqx.partition(wb_model, eqx.is_inexact_array)
    wb_opt = wbc.default_optimizer(
        cfg.learning_rate,
        steps=cfg.schedule_steps,
        warmup=cfg.schedule_warmup,
        weight_decay=cfg.weight_decay,
        clip=cfg.clip,
    )
    wb_state = (
        jax.device_put(wb_params, replicated),
        jax.device_put(wb_opt.init(wb_params), replicated),
    )
    wb_xs = jax.device_put(jnp.asarray(xs_np), batch_sharding)
    wb_ys = jax.device_put(jnp.asarray(ys_np), batch_sharding)

    plain_params, plain_static = eqx.partition(plain_model, eqx.is_array)
    p_opt = plain_optimizer(cfg)
    plain_step, plain_loss = plain_functions(plain_static, p_opt)
    plain_state = (plain_params, p_opt.init(plain_params))
    xs, ys = jnp.asarray(xs_np), jnp.asarray(ys_np)

    return {
        "wb_model": wb_model,
        "plain_model": plain_model,
        "torch_model": torch_model,
        "torch_fresh": copy.deepcopy(torch_model),  # for the checks (the other one trains)
        "steps": {
            PLAIN: plain_step,
            WB: workbench_step(wb_static, wb_opt, guard=True),
            WB_NO_GUARD: workbench_step(wb_static, wb_opt, guard=False),
            WB_REMAT: workbench_step(
                wb_static,
                wb_opt,
                guard=True,
                method=wbc.DiscretizeThenOptimize(wb.CheckpointEvery(1)),
            ),
        },
        "plain_loss": plain_loss,
        "wb_static": wb_static,
        "wb_state": wb_state,
        "wb_batch": (wb_xs, wb_ys),
        "plain_state": plain_state,
        "plain_batch": (xs, ys),
        "torch_batch": (torch.from_numpy(xs_np), torch.from_numpy(ys_np.astype(np.int64))),
    }


def step_args(name, s):
    if name == PLAIN:
        return (*s["plain_state"], *s["plain_batch"])
    return (*s["wb_state"], *s["wb_batch"], jnp.asarray(0))


def cold_first_steps(s, cfg: Config) -> tuple[dict, dict]:
    """Per JAX step function: after `jax.clear_caches()`, a new jit (`jax.jit` for the plain
    step and the trainer's, `eqx.filter_jit` for the filter_jit line) lowered, compiled and
    called once, each timed; the
    sum is the trainer's `compile_time_s` (its first step). Torch: its first step on a fresh
    optimizer. Returns the timings and each JAX step's first result (the loss check uses them;
    the timed states are not advanced)."""
    out, first = {}, {}
    for name, fn in s["steps"].items():
        jax.clear_caches()
        wrap = eqx.filter_jit if name == WB_FILTER_JIT else jax.jit
        jitted = wrap(fn)
        args = step_args(name, s)
        t0 = time.perf_counter()
        lowered = jitted.lower(*args)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        first[name] = jax.block_until_ready(jitted(*args))  # the wrapper's first call: the
        t3 = time.perf_counter()  # executable just compiled (the AOT path fills the jit cache)
        out[name] = {
            "trace_lower_s": t1 - t0,
            "compile_s": t2 - t1,
            "first_run_s": t3 - t2,
            "first_step_s": t3 - t0,
            # eqx.filter_jit's Compiled wraps jax's (`.compiled`)
            "optimized_hlo_ops": hlo_census(getattr(compiled, "compiled", compiled).as_text()),
        }
    model = s["torch_model"]
    s["torch_opt"] = torch_optimizer(model, cfg)
    t0 = time.perf_counter()
    torch_step(model, s["torch_opt"], *s["torch_batch"], cfg)
    out[TORCH] = {"first_step_s": time.perf_counter() - t0}
    return out, first


def hlo_census(text: str) -> dict[str, int]:
    """How many instructions of each interesting opcode the optimized HLO holds (as in
    `zero_cost.py`)."""
    text = re.sub(r"/\*.*?\*/", "", text)
    pattern = r"=\s+(?:\([^=]*?\)|[^\s(]+)\s+([a-z][a-z0-9-]*)\("
    counts = collections.Counter(re.findall(pattern, text))
    out = {op: counts.get(op, 0) for op in OPS_OF_INTEREST}
    out["total"] = sum(counts.values())
    return out


def check_values(s, first, cfg: Config) -> tuple[dict, dict]:
    """Logits against the workbench's, parameter counts, and one step of each lowering the loss
    (`first`: the JAX steps' first results; torch steps a fresh copy of its model)."""
    wb_model, plain_model, torch_fresh = s["wb_model"], s["plain_model"], s["torch_fresh"]
    xs, ys = s["plain_batch"]
    x_t, y_t = s["torch_batch"]
    logits_wb = np.asarray(jax.jit(jax.vmap(wb_model))(xs))
    logits_plain = np.asarray(jax.jit(jax.vmap(plain_model))(xs))
    with torch.no_grad():
        logits_torch = torch_fresh(x_t).numpy()
    check = lambda err: {"max_abs_diff": err, "tol": TOLERANCE, "pass": bool(err < TOLERANCE)}
    n_wb, n_plain = count(wb_model), count(plain_model)
    n_torch = int(sum(p.numel() for p in torch_fresh.parameters()))
    checks = {
        "plain_equinox_optax_logits_vs_workbench": check(max_abs(logits_plain, logits_wb)),
        "torch_logits_vs_workbench": check(max_abs(logits_torch, logits_wb)),
        "parameter_counts": {
            "workbench": n_wb,
            "plain_equinox_optax": n_plain,
            "torch": n_torch,
            "pass": n_wb == n_plain == n_torch,
        },
    }

    # One step of each: the loss on the batch before and after.
    objective = wbc.Objective()
    wb_loss = jax.jit(lambda p, x, y: objective(eqx.combine(p, s["wb_static"]), x, y)[0])
    plain_loss = jax.jit(s["plain_loss"])
    losses = {}
    for name in (PLAIN, WB, WB_NO_GUARD, WB_REMAT):
        out = first[name]
        if name == PLAIN:
            before = float(plain_loss(s["plain_state"][0], xs, ys))
            after = float(plain_loss(out[0], xs, ys))
        else:
            before = float(wb_loss(s["wb_state"][0], *s["wb_batch"]))
            after = float(wb_loss(out[0], *s["wb_batch"]))
        losses[name] = {"before": before, "after": after}
    opt = torch_optimizer(torch_fresh, cfg)
    before = torch_loss(torch_fresh, x_t, y_t)
    torch_step(torch_fresh, opt, x_t, y_t, cfg)
    losses[TORCH] = {"before": before, "after": torch_loss(torch_fresh, x_t, y_t)}
    for v in losses.values():
        v["decreased"] = bool(v["after"] < v["before"])
    checks["one_step_lowers_the_loss"] = {"pass": all(v["decreased"] for v in losses.values())}
    after = [v["after"] for v in losses.values()]
    # Not a check: the same weights, gradient and AdamW should give (nearly) the same new loss.
    losses["spread_of_after"] = max(after) - min(after)
    return checks, losses


def make_runners(s, cfg: Config):
    """Per implementation `run(k)`: `k` consecutive training steps carrying its own state from
    call to call, blocked on at the end (JAX). Also the count of non-finite steps the trainer's
    per-step read saw."""
    runners = {}
    plain_jit = jax.jit(s["steps"][PLAIN])
    state = {"plain": s["plain_state"]}
    xs, ys = s["plain_batch"]

    def run_plain(k):
        params, opt_state = state["plain"]
        for _ in range(k):
            params, opt_state, loss = plain_jit(params, opt_state, xs, ys)
        jax.block_until_ready((params, opt_state, loss))
        state["plain"] = params, opt_state

    runners[PLAIN] = run_plain
    nonfinite = collections.Counter()
    wb_xs, wb_ys = s["wb_batch"]

    def workbench_runner(name, step_fn, *, read_finite: bool):
        state[name] = s["wb_state"]
        counter = {"step": 0}

        def run(k):
            params, opt_state = state[name]
            for _ in range(k):
                out = step_fn(params, opt_state, wb_xs, wb_ys, jnp.asarray(counter["step"]))
                counter["step"] += 1
                if read_finite:  # what the trainer does after every step
                    if not bool(out[2]):
                        nonfinite[name] += 1
                params, opt_state = out[0], out[1]
            jax.block_until_ready((params, opt_state, out[2:]))
            state[name] = params, opt_state

        return run

    guarded = jax.jit(s["steps"][WB])
    runners[WB] = workbench_runner(WB, guarded, read_finite=True)
    runners[WB_NO_READ] = workbench_runner(WB_NO_READ, guarded, read_finite=False)
    no_guard = jax.jit(s["steps"][WB_NO_GUARD])
    runners[WB_NO_GUARD] = workbench_runner(WB_NO_GUARD, no_guard, read_finite=False)
    remat = jax.jit(s["steps"][WB_REMAT])
    runners[WB_REMAT] = workbench_runner(WB_REMAT, remat, read_finite=False)
    as_filter_jit = eqx.filter_jit(s["steps"][WB])
    runners[WB_FILTER_JIT] = workbench_runner(WB_FILTER_JIT, as_filter_jit, read_finite=False)

    model, opt = s["torch_model"], s["torch_opt"]
    x_t, y_t = s["torch_batch"]

    def run_torch(k):
        for _ in range(k):
            torch_step(model, opt, x_t, y_t, cfg)

    runners[TORCH] = run_torch
    return runners, nonfinite


# ----------------------------------------------------------------------------- timing


def time_rounds(runners: dict, cfg: Config):
    """Interleaved rounds, rotating order; each times `steps_per_round` consecutive steps of
    every implementation (per-step seconds recorded). Runs until `cfg.rounds` rounds were quiet,
    or `cfg.max_rounds` rounds, or `cfg.max_timing_s` seconds."""
    names = list(runners)
    samples = {name: [] for name in names}
    loads = []
    t_end = time.perf_counter() + cfg.max_timing_s
    r = 0
    while r < cfg.max_rounds and time.perf_counter() < t_end:
        with OtherLoad() as load:
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter()
                runners[name](cfg.steps_per_round)
                samples[name].append((time.perf_counter() - t) / cfg.steps_per_round)
        loads.append(load.fraction)
        r += 1
        if sum(_is_quiet(f, cfg) for f in loads) >= cfg.rounds:
            break
    return samples, loads


def _is_quiet(fraction, cfg: Config) -> bool:
    return fraction is None or fraction < cfg.quiet_threshold


def rate_stats(step_seconds) -> dict:
    """Median, IQR, quartiles, min and max of the steps per second of each round."""
    a = 1.0 / np.asarray(step_seconds, float)
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return {
        "median": float(q50),
        "iqr": float(q75 - q25),
        "q25": float(q25),
        "q75": float(q75),
        "min": float(a.min()),
        "max": float(a.max()),
        "n": int(a.size),
    }


def summarize(samples, loads, cfg: Config) -> dict:
    """Statistics over the quiet rounds (all rounds if fewer than `min(rounds, 10)` were quiet).
    Ratios are of steps per second (> 1: the numerator is faster)."""
    quiet = [i for i, f in enumerate(loads) if _is_quiet(f, cfg)]
    use_quiet = len(quiet) >= min(cfg.rounds, 10)
    keep = quiet if use_quiet else list(range(len(loads)))
    kept = {name: np.asarray([s[i] for i in keep]) for name, s in samples.items()}
    rates = {name: rate_stats(s) for name, s in kept.items()}
    med = {name: r["median"] for name, r in rates.items()}
    paired = lambda a, b: float(np.median(kept[b] / kept[a]))  # per-round rate ratio a / b
    pairs = [
        (WB, PLAIN),
        (WB, TORCH),
        (PLAIN, TORCH),
        (WB_NO_GUARD, PLAIN),
        (WB, WB_NO_GUARD),
        (WB_NO_READ, WB_NO_GUARD),
        (WB, WB_NO_READ),
        (WB_FILTER_JIT, PLAIN),
        (WB_FILTER_JIT, WB_NO_READ),
        (WB_REMAT, WB_NO_READ),
        (WB_REMAT, TORCH),
    ]
    step_s = {name: float(np.median(s)) for name, s in kept.items()}
    return {
        "rounds_run": len(loads),
        "rounds_used": len(keep),
        "used": "quiet rounds" if use_quiet else "all rounds (too few quiet ones: contended)",
        "steps_per_s": rates,
        "step_time": {name: stats(s) for name, s in kept.items()},
        "step_time_all_rounds": {name: stats(s) for name, s in samples.items()},
        "ratios": {f"{a}_over_{b}": med[a] / med[b] for a, b in pairs},
        "paired_median_ratios": {f"{a}_over_{b}": paired(a, b) for a, b in pairs},
        "guard_overhead": {
            "per_step_s": step_s[WB] - step_s[WB_NO_GUARD],
            "fraction_of_no_guard_step": step_s[WB] / step_s[WB_NO_GUARD] - 1.0,
            "in_step_s": step_s[WB_NO_READ] - step_s[WB_NO_GUARD],
            "host_read_s": step_s[WB] - step_s[WB_NO_READ],
            "note": "differences of medians of per-step seconds: per_step = workbench - "
            "workbench_no_guard; in_step = the finiteness reductions in "
            "the compiled step (workbench_no_read - workbench_no_guard); host_read = reading "
            "`finite` after every step (workbench - workbench_no_read)",
        },
        "filter_jit_overhead": {
            "per_step_s": step_s[WB_FILTER_JIT] - step_s[WB_NO_READ],
            "fraction_of_jax_jit_step": step_s[WB_FILTER_JIT] / step_s[WB_NO_READ] - 1.0,
            "note": "workbench_filter_jit - workbench_no_read: the same compiled step called "
            "through eqx.filter_jit (blocks until each call finishes, flattens and partitions "
            "the arguments) instead of jax.jit (asynchronous dispatch)",
        },
    }


def goals(summary: dict, cfg: Config) -> dict:
    r_plain = summary["ratios"][f"{WB}_over_{PLAIN}"]
    r_torch = summary["ratios"][f"{WB}_over_{TORCH}"]
    return {
        "workbench_vs_plain_equinox_optax": {
            "metric": "median steps/s workbench / median steps/s plain_equinox_optax",
            "target": f">= {GOAL_VS_PLAIN}",
            "ratio": r_plain,
            "pass": bool(r_plain >= GOAL_VS_PLAIN),
        },
        "workbench_vs_torch": {
            "metric": "median steps/s workbench / median steps/s torch",
            "target": f">= {GOAL_VS_TORCH}",
            "ratio": r_torch,
            "pass": bool(r_torch >= GOAL_VS_TORCH),
        },
    }


def run_depth(cfg: Config, depth: int, xs_np, ys_np) -> dict:
    s = setup(cfg, depth, xs_np, ys_np)
    cold, first = cold_first_steps(s, cfg)
    checks, losses = check_values(s, first, cfg)
    runners, nonfinite = make_runners(s, cfg)
    quiet = wait_for_quiet(cfg.wait_quiet_s, cfg.quiet_threshold)
    for run in runners.values():  # compiles the JAX steps again (the caches were cleared)
        run(cfg.warmup)
    samples, loads = time_rounds(runners, cfg)
    summary = summarize(samples, loads, cfg)
    return {
        "depth": depth,
        "num_parameters": checks["parameter_counts"]["workbench"],
        "checks": checks,
        "losses": losses,
        "load": {**quiet, "other_load_per_round": loads},
        **summary,
        "samples_step_s": samples,
        "cold": cold,
        "nonfinite_steps": {name: nonfinite.get(name, 0) for name in (WB,)},
        "goals": goals(summary, cfg),
    }


def main(cfg: Config, out: str) -> dict:
    t_start = time.perf_counter()
    torch.set_num_threads(cpu_count())
    rng = np.random.default_rng(cfg.seed + 1)
    xs_np = rng.random((cfg.batch, cfg.image, cfg.image)).astype(cfg.dtype)
    ys_np = rng.integers(0, cfg.num_classes, cfg.batch).astype(np.int32)
    results = {}
    for depth in cfg.depths:
        results[str(depth)] = run_depth(cfg, depth, xs_np, ys_np)
    all_goals = [g["pass"] for r in results.values() for g in r["goals"].values()]
    all_checks = [c["pass"] for r in results.values() for c in r["checks"].values()]
    record = {
        "benchmark": "train_step",
        "question": "training steps/s of the digits model: workbench trainer step vs plain "
        "equinox + optax and torch",
        "config": dataclasses.asdict(cfg),
        "implementations": {
            PLAIN: "hand-written equinox ViT, lax.scan over stacked blocks, jax.jit step, "
            "optax.chain(clip_by_global_norm, adamw(schedule))",
            WB: "wb.control.train's step: jax.jit, DiscretizeThenOptimize on Objective(), "
            "default_optimizer, finiteness flag, bool(finite) read after every step",
            WB_NO_READ: "the same step, finite not read after each step",
            WB_NO_GUARD: "the same step without the finiteness flag",
            WB_REMAT: "the same step (finite not read) with DiscretizeThenOptimize("
            "CheckpointEvery(1)): each step's internals recomputed in the backward pass",
            WB_FILTER_JIT: "the trainer's step (finite not read) under eqx.filter_jit instead of "
            "jax.jit (filter_jit blocks until each call finishes)",
            TORCH: "nn.TransformerEncoder (norm_first, gelu, dropout 0) + Conv2d patches, "
            "torch.optim.AdamW (default implementation) + clip_grad_norm_",
        },
        "environment": {**environment(), "torch_threads": torch.get_num_threads()},
        "results": results,
        "all_checks_pass": bool(all(all_checks)),
        "all_goals_pass": bool(all(all_goals)),
        "goals_meaningful": not cfg.is_smoke,
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(out, record)
    report(record, cfg, out)
    if not record["all_checks_pass"]:
        raise SystemExit("a value check failed: the implementations do not compute the same map.")
    return record


def report(record: dict, cfg: Config, out: str) -> None:
    threads = record["environment"]["torch_threads"]
    for depth, r in record["results"].items():
        sizes = (
            f"depth={depth} d={cfg.d} heads={cfg.num_heads} hidden={cfg.hidden} "
            f"tokens={cfg.num_tokens} batch={cfg.batch} {cfg.dtype}"
        )
        print(f"training step; {sizes}; {r['num_parameters']} parameters; {threads} CPU threads")
        print(f"{r['rounds_used']} of {r['rounds_run']} interleaved rounds ({r['used']}), ", end="")
        print(f"{cfg.steps_per_round} steps per implementation and round")
        rates, cold = r["steps_per_s"], r["cold"]
        plain = rates[PLAIN]["median"]
        rows = [
            [
                name,
                v["median"],
                v["iqr"],
                1e3 / v["median"],
                v["median"] / plain,
                cold[name]["first_step_s"] if name in cold else "(= workbench)",
                cold[name]["compile_s"] if name in cold and "compile_s" in cold[name] else "-",
            ]
            for name, v in rates.items()
        ]
        header = ["impl", "steps/s", "IQR", "ms/step", "x plain", "1st step s", "compile s"]
        print(table(rows, header))
        g = r["guard_overhead"]
        print(
            f"guard overhead: {1e3 * g['per_step_s']:+.3f} ms/step "
            f"({100 * g['fraction_of_no_guard_step']:+.1f} %): in the step "
            f"{1e3 * g['in_step_s']:+.3f} ms, per-step host read {1e3 * g['host_read_s']:+.3f} ms"
        )
        f = r["filter_jit_overhead"]
        print(
            f"eqx.filter_jit over jax.jit (same step): {1e3 * f['per_step_s']:+.3f} ms/step "
            f"({100 * f['fraction_of_jax_jit_step']:+.1f} %)"
        )
        for name, c in r["checks"].items():
            verdict = "ok" if c["pass"] else "FAIL"
            if "max_abs_diff" in c:
                print(f"check {name:40s} max|diff| = {c['max_abs_diff']:.2e}: {verdict}")
            elif name == "parameter_counts":
                counts = ", ".join(f"{k} {v}" for k, v in c.items() if k != "pass")
                print(f"check {name:40s} {counts}: {verdict}")
            else:
                loss = ", ".join(
                    f"{k} {v['before']:.4f}->{v['after']:.4f}"
                    for k, v in r["losses"].items()
                    if isinstance(v, dict)
                )
                print(f"check {name:40s} {loss}: {verdict}")
        for name, goal in r["goals"].items():
            verdict = "PASS" if goal["pass"] else "FAIL"
            if cfg.is_smoke:
                verdict += " (smoke sizes: not meaningful)"
            print(f"goal {name}: {goal['ratio']:.3f} (target {goal['target']}): {verdict}")
        print()
    print(f"wrote {out}  ({record['wall_s']:.0f} s)")


def parse(argv=None) -> tuple[Config, str]:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, few rounds (seconds)")
    ap.add_argument("--depths", type=int, nargs="+", help="numbers of layers (default 4; smoke 2)")
    ap.add_argument("--batch", type=int, help="batch size (default 64; smoke 8)")
    ap.add_argument("--rounds", type=int, help="quiet rounds wanted (default 20; smoke 3)")
    ap.add_argument(
        "--steps-per-round", type=int, help="consecutive steps timed per round (default 5; smoke 2)"
    )
    ap.add_argument(
        "--warmup", type=int, help="untimed steps of each implementation (default 3; smoke 2)"
    )
    ap.add_argument(
        "--max-timing", type=float, help="max seconds of rounds per depth (default 300; smoke 20)"
    )
    ap.add_argument(
        "--wait-quiet",
        type=float,
        help="max seconds to wait for an idle machine (default 60; smoke 0)",
    )
    ap.add_argument("--out", help="JSON path (default: benchmarks/results/)")
    a = ap.parse_args(argv)
    overrides = {}
    for field, value in (
        ("depths", tuple(a.depths) if a.depths else None),
        ("batch", a.batch),
        ("rounds", a.rounds),
        ("steps_per_round", a.steps_per_round),
        ("warmup", a.warmup),
        ("wait_quiet_s", a.wait_quiet),
        ("max_timing_s", a.max_timing),
    ):
        if value is not None:
            overrides[field] = value
    for field in ("batch", "rounds", "steps_per_round"):
        if field in overrides and overrides[field] < 1:
            ap.error(f"--{field.replace('_', '-')} must be >= 1")
    if "depths" in overrides and min(overrides["depths"]) < 1:
        ap.error("--depths must be >= 1")
    if "warmup" in overrides and overrides["warmup"] < 1:
        ap.error("--warmup must be >= 1 (the first call recompiles after the cold measurement)")
    if "rounds" in overrides:
        overrides.setdefault("max_rounds", max(3 * overrides["rounds"], 1))
    cfg = Config.smoke(**overrides) if a.smoke else Config(**overrides)
    name = "train_step_smoke.json" if a.smoke else "train_step.json"
    return cfg, a.out or os.path.join(RESULTS, name)


if __name__ == "__main__":
    main(*parse())
