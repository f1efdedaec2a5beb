"""Does the continuous adjoint (optimize, then discretize) converge to the exact gradient of the
discrete model at the scheme's order, and what do the gradient methods cost in time and memory
as the network deepens?

Part 1, accuracy (float64): a small pre-norm GELU equation with random controls, random token
states as the initial condition and a random linear classifier on the class token. For every
scheme and a ladder of steps per layer, the relative difference between the gradient of the
objective (cross-entropy + a kinetic cost when `kinetic > 0`) from `OptimizeThenDiscretize` (the
costate solved backward by the scheme itself) and the exact discrete gradient from
`DiscretizeThenOptimize`; `fit_order` gives the observed order, expected to equal the scheme's
(the discrete kinetic cost is a second-order quadrature, so with it the gap is O(τ²) at best).
The diffrax path is measured the same way: `BacksolveAdjoint` against the default
`RecursiveCheckpointAdjoint` for Tsit5 (order 5).

Part 2, cost (float32): for depths 6, 24, 96 (Lie–Trotter, one step per layer, a batch), the
compiled gradient's peak temporary memory from XLA's memory analysis (machine-independent) and
its median wall time, for each gradient method: no checkpointing, a checkpoint every step,
binomial checkpointing, the continuous adjoint, and one iteration of the extended MSA.

Figures: `orders` (relative gradient gap against the step, per method, with fitted slopes),
`memory` (peak temporary memory against depth), `time` (seconds per gradient against depth).
"""

from __future__ import annotations

import dataclasses
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba
import workbench.control as wbc
from studies._toolkit.config import check, check_choices, check_nonempty, check_positive, check_seed
from studies._toolkit.report import ci_cell, markdown_table, new_figure, progress, wide_ci_note

NAME = "adjoint-accuracy"
SUMMARY = "Continuous adjoint vs exact discrete gradient: observed order; time and memory vs depth."

COST_METHODS = ("dto", "dto-every-step", "dto-binomial", "otd", "msa")
"""The gradient methods whose cost is measured (keys of `GRADIENT_METHODS`)."""


@dataclasses.dataclass(frozen=True)
class Config:
    d: int = 16
    """Model width d of the accuracy part."""
    n: int = 8
    """Tokens per example (including the class token)."""
    num_heads: int = 2
    """Attention heads per layer, in both parts."""
    num_layers: int = 2
    """Layers of the accuracy part's equation."""
    hidden: int = 32
    """Feed-forward width of the accuracy part (the cost part uses 2 · cost_d)."""
    batch: int = 2
    """Examples in the accuracy part's batch."""
    schemes: tuple[str, ...] = ("lie", "strang", "suzuki4")
    """Splitting schemes whose adjoint gap is measured (`wb.registry.SPLITTING_SCHEMES` names)."""
    ladder: tuple[int, ...] = (2, 4, 8, 16, 32)
    """Steps per layer of the accuracy ladder."""
    tsit5_ladder: tuple[int, ...] = (2, 4, 8, 16)
    """Steps per layer of the diffrax BacksolveAdjoint ladder (empty: skip)."""
    kinetic: float = 0.0
    """λ_K of the kinetic cost in the accuracy part's objective (0: cross-entropy only)."""
    depths: tuple[int, ...] = (6, 24, 96)
    """Depths (layers, one Lie–Trotter step each) of the cost part."""
    cost_d: int = 64
    """Model width d of the cost part."""
    cost_n: int = 32
    """Tokens per example of the cost part."""
    cost_batch: int = 16
    """Examples in the cost part's batch."""
    cost_methods: tuple[str, ...] = COST_METHODS
    """Gradient methods of the cost part: dto, dto-every-step, dto-binomial, otd, msa."""
    repeats: int = 5
    """Timed runs per method and depth in the cost part; the median is reported."""
    order_tolerance: float = 0.3
    """A fitted order within this of the expected order counts as reached."""
    seed: int = 0
    """Seeds the random controls, inputs, classifier weights and labels."""

    def __post_init__(self):
        check_positive(
            self,
            "d",
            "n",
            "num_heads",
            "num_layers",
            "hidden",
            "batch",
            "ladder",
            "depths",
            "cost_d",
            "cost_n",
            "cost_batch",
            "repeats",
            "order_tolerance",
        )
        check_positive(self, "kinetic", allow_zero=True)
        check_choices(self, "schemes", wb.registry.SPLITTING_SCHEMES)
        check_choices(self, "cost_methods", COST_METHODS)
        check_nonempty(self, "schemes", "ladder", "depths")
        check(
            self,
            "ladder",
            len(self.ladder) >= 3 and list(self.ladder) == sorted(set(self.ladder)),
            "at least 3 increasing step counts",
        )
        check(
            self,
            "tsit5_ladder",
            not self.tsit5_ladder
            or (
                len(self.tsit5_ladder) >= 3
                and list(self.tsit5_ladder) == sorted(set(self.tsit5_ladder))
            ),
            "empty, or at least 3 increasing step counts",
        )
        check_seed(self)

    def estimated_peak_bytes(self) -> int:
        """Peak bytes of `compute` (`studies._toolkit.memory.training_bytes`), the larger of its
        parts: the accuracy part (float64), the exact gradient at the finest ladder entry — `batch`
        examples of `n` tokens × the scheme's operator evaluations over `num_layers · max(ladder)`
        steps, Tsit5's 7 field evaluations per step over `max(tsit5_ladder)` — and the cost part
        (float32) at the deepest `depths` entry: `cost_batch` examples of `cost_n` tokens through
        one Lie–Trotter step per layer, with the `depths` layers' parameters (width `cost_d`,
        feed-forward `2 · cost_d`) and their gradient."""
        from studies._toolkit import memory as M

        def gradient(*, d, n, hidden, layers, batch, steps, evaluations, item):
            return M.training_bytes(
                params=M.encoder_parameters(d, hidden, layers) + 4 * d,
                batch=batch,
                tokens=n,
                d=d,
                hidden=hidden,
                heads=self.num_heads,
                steps=steps,
                evaluations=evaluations,
                eval_batch=0,
                itemsize=item,
                state_copies=3,
            )

        small = dict(
            d=self.d,
            n=self.n,
            hidden=self.hidden,
            layers=self.num_layers,
            batch=self.batch,
            item=M.F64,
        )
        evaluations = max(M.scheme_evaluations(s) for s in self.schemes)
        parts = [
            gradient(**small, steps=self.num_layers * max(self.ladder), evaluations=evaluations)
        ]
        if self.tsit5_ladder:
            steps = self.num_layers * max(self.tsit5_ladder)
            parts.append(gradient(**small, steps=steps, evaluations=14))
        depth = max(self.depths)
        parts.append(
            gradient(
                d=self.cost_d,
                n=self.cost_n,
                hidden=2 * self.cost_d,
                layers=depth,
                batch=self.cost_batch,
                steps=depth,
                evaluations=2,
                item=M.F32,
            )
        )
        return max(parts)


def smoke_config() -> Config:
    return Config(
        d=8,
        n=4,
        hidden=16,
        batch=1,
        num_layers=1,
        schemes=("lie", "strang"),
        ladder=(2, 4, 8),
        tsit5_ladder=(),
        depths=(2, 8),
        cost_d=16,
        cost_n=8,
        cost_batch=4,
        cost_methods=("dto", "dto-every-step", "otd"),
        repeats=2,
    )


@dataclasses.dataclass
class Ladder:
    method: str
    declared_order: int
    steps_per_layer: list
    relative_gaps: list
    observed_order: float | None
    ci: tuple | None


@dataclasses.dataclass
class Cost:
    method: str
    depths: list
    peak_temp_bytes: list
    seconds: list
    compile_seconds: list


@dataclasses.dataclass
class Results:
    config: Config
    ladders: list
    costs: list
    wall_time_s: float


class _Given(eqx.Module):
    """The identity embedding: the inputs are the initial token states."""

    def __call__(self, x):
        return x


def _model(key, config, *, d, layers, scheme, steps, dtype):
    k1, k2 = jax.random.split(key)
    tr = wbc.random_transformer(
        k1,
        d=d,
        num_heads=config.num_heads,
        num_layers=layers,
        hidden=2 * d if d != config.d else config.hidden,
        scheme=scheme,
        steps_per_layer=steps,
        output_scale=0.5,
        dtype=dtype,
    )
    head = wbc.ClassifierHead(d, 3, dtype=dtype)
    head = eqx.tree_at(lambda h: h.weight, head, jax.random.normal(k2, head.weight.shape, dtype))
    return wbc.ControlledModel(_Given(), tr, head)


def _flat(tree):
    return jnp.concatenate(
        [jnp.ravel(x) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))]
    )


def _gap(g_ref, g):
    a, b = _flat(g_ref), _flat(g)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))


def _fit(steps, gaps, order):
    h = 1.0 / np.asarray(steps, float)
    fit = wba.fit_order(h, np.asarray(gaps), expected=order, throw=False)
    if not fit.success:
        return None, None
    return float(fit.order), (float(fit.ci_low), float(fit.ci_high))


def _accuracy(config: Config) -> list:
    key = jax.random.key(config.seed)
    kx, kmodel, ky = jax.random.split(key, 3)
    xs = jax.random.normal(kx, (config.batch, config.n, config.d), jnp.float64)
    ys = jax.random.randint(ky, (config.batch,), 0, 3)
    objective = wbc.Objective(kinetic=wbc.KineticEnergy(config.kinetic) if config.kinetic else None)
    dto = eqx.filter_jit(wbc.DiscretizeThenOptimize().value_and_direction)
    otd = eqx.filter_jit(wbc.OptimizeThenDiscretize().value_and_direction)
    ladders = []
    for name in progress(config.schemes, desc="adjoint ladders"):
        scheme = wb.registry.SPLITTING_SCHEMES[name]
        gaps = []
        for k in config.ladder:
            model = _model(
                kmodel,
                config,
                d=config.d,
                layers=config.num_layers,
                scheme=scheme,
                steps=k,
                dtype=jnp.float64,
            )
            _, g_ref = dto(objective, model, xs, ys)
            _, g = otd(objective, model, xs, ys)
            gaps.append(_gap(g_ref, g))
        expected = min(scheme.order(), 2) if config.kinetic else scheme.order()
        order, ci = _fit(config.ladder, gaps, expected)
        ladders.append(Ladder(name, expected, list(config.ladder), gaps, order, ci))
    if config.tsit5_ladder:
        model = _model(
            kmodel,
            config,
            d=config.d,
            layers=config.num_layers,
            scheme=wb.schemes.LieTrotter(),
            steps=1,
            dtype=jnp.float64,
        )
        eq, head = model.transformer.equation, model.head

        def loss(eq, k, adjoint):
            def one(x, y):
                u1 = wb.integrate(
                    eq, x, diffrax.Tsit5(), num_steps=k * eq.num_pieces, adjoint=adjoint
                ).y
                return wbc.CrossEntropy()(head(u1), y)

            return jnp.mean(jax.vmap(one)(xs, ys))

        grad = eqx.filter_jit(eqx.filter_grad(loss))
        gaps = [
            _gap(grad(eq, k, None), grad(eq, k, diffrax.BacksolveAdjoint()))
            for k in config.tsit5_ladder
        ]
        order, ci = _fit(config.tsit5_ladder, gaps, 5)
        ladders.append(Ladder("tsit5-backsolve", 5, list(config.tsit5_ladder), gaps, order, ci))
    return ladders


GRADIENT_METHODS = {
    "dto": lambda: wbc.DiscretizeThenOptimize(),
    "dto-every-step": lambda: wbc.DiscretizeThenOptimize(wb.CheckpointEvery(1)),
    "dto-binomial": lambda: wbc.DiscretizeThenOptimize(wb.BinomialCheckpointing()),
    "otd": lambda: wbc.OptimizeThenDiscretize(),
    "msa": lambda: wbc.SuccessiveApproximations(rho=1.0, inner_steps=2),
}
"""The gradient methods of the cost part by name (`COST_METHODS`)."""


def _costs(config: Config) -> list:
    out = []
    with jax.enable_x64(False):
        key = jax.random.key(config.seed + 1)
        xs = jax.random.normal(key, (config.cost_batch, config.cost_n, config.cost_d), jnp.float32)
        ys = jax.random.randint(key, (config.cost_batch,), 0, 3)
        objective = wbc.Objective()
        for name in progress(config.cost_methods, desc="gradient costs"):
            method = GRADIENT_METHODS[name]()
            peaks, seconds, compiles = [], [], []
            for depth in config.depths:
                model = _model(
                    key,
                    config,
                    d=config.cost_d,
                    layers=depth,
                    scheme=wb.schemes.LieTrotter(),
                    steps=1,
                    dtype=jnp.float32,
                )
                params, static = eqx.partition(model, eqx.is_array)

                @jax.jit
                def direction(p, xs, ys):
                    return method.value_and_direction(objective, eqx.combine(p, static), xs, ys)

                start = time.perf_counter()
                compiled = direction.lower(params, xs, ys).compile()
                compiles.append(time.perf_counter() - start)
                peaks.append(int(compiled.memory_analysis().temp_size_in_bytes))
                jax.block_until_ready(compiled(params, xs, ys))
                runs = []
                for _ in range(config.repeats):
                    start = time.perf_counter()
                    jax.block_until_ready(compiled(params, xs, ys))
                    runs.append(time.perf_counter() - start)
                seconds.append(float(np.median(runs)))
            out.append(Cost(name, list(config.depths), peaks, seconds, compiles))
    return out


def compute(config: Config) -> Results:
    start = time.perf_counter()
    with jax.enable_x64(True):
        ladders = _accuracy(config)
    costs = _costs(config)
    return Results(config, ladders, costs, time.perf_counter() - start)


def _ok(ladder: Ladder, tol: float) -> bool:
    return (
        ladder.observed_order is not None
        and abs(ladder.observed_order - ladder.declared_order) <= tol
    )


def verdict(results: Results) -> str:
    tol = results.config.order_tolerance
    good = [x for x in results.ladders if _ok(x, tol)]
    parts = ", ".join(
        f"{x.method} {'none' if x.observed_order is None else f'{x.observed_order:.2f}'} "
        f"(expected {x.declared_order})"
        for x in results.ladders
    )
    answer = "Yes" if len(good) == len(results.ladders) else ("Partly" if good else "No")
    deepest = {c.method: c.peak_temp_bytes[-1] for c in results.costs}
    memory = ""
    if "dto" in deepest and "dto-every-step" in deepest:
        memory = (
            f" At depth {results.config.depths[-1]}, checkpointing every step needs "
            f"{deepest['dto-every-step'] / max(deepest['dto'], 1):.2f}× the peak temporary "
            "memory of storing everything."
        )
    return (
        f"{answer}. Observed orders of the gap between the continuous adjoint and the exact "
        f"discrete gradient (within ±{tol:g} of the scheme's order counts): {parts}.{memory}"
    )


def report(results: Results) -> str:
    rows = [
        (
            x.method,
            x.declared_order,
            "—" if x.observed_order is None else f"{x.observed_order:.2f}",
            "—" if x.ci is None else ci_cell(*x.ci),
            " ".join(f"{g:.2e}" for g in x.relative_gaps),
        )
        for x in results.ladders
    ]
    cost_rows = []
    for c in results.costs:
        for depth, peak, sec, comp in zip(
            c.depths, c.peak_temp_bytes, c.seconds, c.compile_seconds
        ):
            cost_rows.append((c.method, depth, peak / 2**20, 1e3 * sec, comp))
    return "\n".join(
        [
            "Relative gap ‖g_adjoint − g_exact‖ / ‖g_exact‖ over the ladder of steps per layer "
            f"{list(results.config.ladder)} (float64):",
            "",
            markdown_table(["method", "expected order", "observed", "95 % CI", "gaps"], rows),
            "",
            wide_ci_note(x.ci for x in results.ladders),
            "Cost of one gradient (float32, Lie–Trotter, one step per layer, batch "
            f"{results.config.cost_batch}, n = {results.config.cost_n}, d = {results.config.cost_d}; "
            "peak temporary memory from XLA's compiled memory analysis; median wall time):",
            "",
            markdown_table(
                ["method", "depth", "peak temp (MiB)", "ms / gradient", "compile (s)"],
                cost_rows,
                floatfmt=".3g",
            ),
            "",
            f"Wall time {results.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    figs = {}
    fig, ax = new_figure(figsize=(6, 4.5))
    for x in results.ladders:
        h = 1.0 / np.asarray(x.steps_per_layer, float)
        label = f"{x.method} (observed {x.observed_order:.2f})" if x.observed_order else x.method
        ax.loglog(h, x.relative_gaps, "o-", label=label)
    ax.set(
        xlabel="step τ (per unit time)",
        ylabel="relative gradient gap",
        title="Continuous adjoint vs exact discrete gradient",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    figs["orders"] = fig
    for key, label, scale in (
        ("memory", "peak temporary memory (MiB)", 2**-20),
        ("time", "ms per gradient", 1e3),
    ):
        fig, ax = new_figure(figsize=(6, 4.5))
        for c in results.costs:
            values = c.peak_temp_bytes if key == "memory" else c.seconds
            ax.loglog(c.depths, np.asarray(values) * scale, "o-", label=c.method)
        ax.set(xlabel="depth (layers)", ylabel=label, title=f"Gradient {key} against depth")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        figs[key] = fig
    return figs
