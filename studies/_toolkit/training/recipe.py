"""A training study's recipe: the names its config chooses from (optimizer, gradient method,
checkpointing, depth training), the checks of those fields and of the model's size, the plan
input, and the library objects they build (the `TrainStep`, the digits model)."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import jax

import workbench as wb
import workbench.analysis as wba
import workbench.control as wbc

from ..config import ConfigError, check, check_choices, check_divides, check_positive, check_range

OPTIMIZERS = ("adamw", "adam", "sgd")


def check_model_fields(config: Any) -> None:
    """Checks of the model and discretization fields every training study has (`d`,
    `num_heads`, `num_layers`, `hidden`, `batch_size`, `steps_per_layer`, `learning_rate`,
    `clip`, `checkpoint_every`, `warmup`, `scheme`, `activation`)."""
    check_positive(
        config,
        "d",
        "num_heads",
        "num_layers",
        "hidden",
        "batch_size",
        "steps_per_layer",
        "learning_rate",
        "clip",
        "checkpoint_every",
    )
    check_divides(config, "num_heads", into="d")
    check_choices(config, "scheme", wb.registry.SPLITTING_SCHEMES)
    check_choices(config, "activation", wb.registry.ACTIVATIONS)
    check(
        config, "warmup", isinstance(config.warmup, int) and config.warmup >= 0, "an integer >= 0"
    )


def multi_resolution(config: Any) -> wbc.MultiResolution:
    """The config's `wbc.MultiResolution`: `resolutions` and `coarsen`, each coarse draw weighted
    `coarse_weight` against one step count (uniform draws at weight 1)."""
    ks = tuple(config.resolutions)
    fs = tuple(getattr(config, "coarsen", ()))
    w = float(getattr(config, "coarse_weight", 1.0))
    if not fs or w == 1.0:
        return wbc.MultiResolution(ks, coarsen=fs)
    weights = (1.0,) * len(ks) + (w,) * len(fs)
    return wbc.MultiResolution(ks, tuple(x / sum(weights) for x in weights), coarsen=fs)


DEPTH = {
    "multi-resolution": multi_resolution,
    "fixed": lambda config: wbc.OwnDiscretization(),
}
"""How a training study discretizes depth while training, by the config's `depth`."""


def check_depth_fields(config: Any) -> None:
    """`depth` is a name of `DEPTH`; `resolutions` and `coarsen` what `wbc.MultiResolution`
    accepts, each factor of `coarsen` dividing `num_layers`."""
    check_choices(config, "depth", DEPTH)
    check_resolutions(config)
    check_coarsen(config)


def check_coarsen(config: Any) -> None:
    """`coarsen` (when the config has it): distinct integers >= 2 dividing `num_layers`;
    `coarse_weight` a positive finite number."""
    if hasattr(config, "coarse_weight"):
        w = config.coarse_weight
        check(
            config,
            "coarse_weight",
            isinstance(w, (int, float)) and math.isfinite(w) and w > 0,
            "a positive number (1: every draw equally likely)",
        )
    fs = getattr(config, "coarsen", ())
    try:
        wbc.MultiResolution((1,), coarsen=fs)
        ok = True
    except ValueError:
        ok = False
    check(config, "coarsen", ok, "distinct integers >= 2 (depth factors, e.g. 2), or '' for none")
    bad = [f for f in fs if config.num_layers % f]
    check(
        config,
        "coarsen",
        not bad,
        f"factors dividing num_layers={config.num_layers} (not {', '.join(map(str, bad))})",
    )


def check_resolutions(config: Any) -> None:
    """`resolutions` is what `wbc.MultiResolution` accepts."""
    try:
        wbc.MultiResolution(config.resolutions)
        ok = True
    except ValueError:
        ok = False
    check(config, "resolutions", ok, "distinct positive integers, e.g. 1,2,4")


def check_training_fields(config: Any) -> None:
    """`check_model_fields` and the optimizer, gradient method, costs, depth training and plan
    of a training study."""
    check_model_fields(config)
    if hasattr(config, "depth"):
        check_depth_fields(config)
    check_positive(
        config,
        "weight_decay",
        "kinetic",
        "control_norm",
        "smoothness",
        "acceleration",
        allow_zero=True,
    )
    check(
        config,
        "acceleration",
        not getattr(config, "acceleration", 0.0) or config.gradient == "dto",
        "0 unless gradient='dto' (the cost is on the stored trajectory)",
    )
    check_choices(config, "optimizer", OPTIMIZERS)
    check_choices(config, "gradient", GRADIENTS)
    check_choices(config, "checkpointing", CHECKPOINTING)
    check_range(config, "target_accuracy", 0.0, 1.0)
    check_range(config, "max_spread", 0.0, 1.0)
    if config.plan is not None:
        check(
            config,
            "plan",
            pathlib.Path(config.plan).is_file(),
            "a plan.json written by `workbench run plan`",
        )
        read_plan(config)


def read_plan(config: Any) -> wba.DiscretizationPlan:
    """The plan file of `config.plan`, read; `ConfigError` naming the file (one line) when it is
    not JSON or not a plan."""
    try:
        return wba.DiscretizationPlan.load(config.plan)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())  # one line, whatever the parser said
    # Outside the `except`: the ConfigError alone, not chained to the parser's error.
    check(config, "plan", False, f"the file is not a readable plan: {reason}")
    raise AssertionError("unreachable: check() raised")


def optimizer(config: Any, steps: int):
    """The optax optimizer of the config (a gradient method that brings its own, MSA, applies
    its own instead: `AbstractGradientMethod.optimizer`)."""
    import optax

    if config.optimizer == "adamw":
        return wbc.default_optimizer(
            config.learning_rate,
            steps=steps,
            warmup=config.warmup,
            weight_decay=config.weight_decay,
            clip=config.clip,
        )
    warmup = min(config.warmup, steps - 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, warmup, max(steps, warmup + 1), config.learning_rate * 0.01
    )
    base = optax.adam if config.optimizer == "adam" else optax.sgd
    return optax.chain(
        optax.clip_by_global_norm(config.clip),
        optax.inject_hyperparams(base)(learning_rate=schedule),
    )


CHECKPOINTING = {
    "none": lambda: None,
    "every-step": lambda: wb.CheckpointEvery(1),
    "binomial": lambda: wb.BinomialCheckpointing(),
}
"""What dto's backward pass stores, by the config's name."""


GRADIENTS = {
    "dto": lambda config: wbc.DiscretizeThenOptimize(CHECKPOINTING[config.checkpointing]()),
    "otd": lambda config: wbc.OptimizeThenDiscretize(),
    "msa": lambda config: wbc.SuccessiveApproximations(
        rho=getattr(config, "msa_rho", 1.0),
        inner_steps=getattr(config, "msa_inner_steps", 5),
        inner_learning_rate=getattr(config, "msa_inner_learning_rate", 1e-3),
        outer_learning_rate=config.learning_rate,
    ),
}
"""The gradient methods by the config's name: the exact gradient of the discrete model, the
continuous adjoint, Pontryagin's successive approximations."""


def gradient_method(config: Any):
    return GRADIENTS[config.gradient](config)


def train_step(config: Any, steps: int, **kwargs) -> wbc.TrainStep:
    """The config's `TrainStep`: its optimizer, objective, gradient method and depth training
    (`depth`, fixed for a study without the field) (`kwargs`: e.g. an augmentation)."""
    depth = DEPTH[getattr(config, "depth", "fixed")](config)
    return wbc.TrainStep(
        optimizer(config, steps),
        objective=objective(config),
        method=gradient_method(config),
        discretization=depth,
        **kwargs,
    )


def objective(config: Any) -> wbc.Objective:
    controls = []
    if config.control_norm:
        controls.append(wbc.ControlNorm(config.control_norm))
    if config.smoothness:
        controls.append(wbc.ControlSmoothness(config.smoothness))
    kinetic = wbc.KineticEnergy(config.kinetic) if config.kinetic else None
    lam = getattr(config, "acceleration", 0.0)
    acceleration = wbc.Acceleration(lam) if lam else None
    return wbc.Objective(wbc.CrossEntropy(), kinetic, tuple(controls), acceleration)


def load_plan(config: Any) -> wba.DiscretizationPlan | None:
    """The plan of `config.plan`, checked against the model: same width, depth, heads,
    feed-forward width and activation, a pre-norm equation, and a splitting scheme (what the
    trainer runs). A plan that records no activation counts as `"gelu"`: a plan without the
    field was made for a GELU model."""
    if config.plan is None:
        return None
    plan = read_plan(config)
    want = {
        "d": config.d,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "dim_feedforward": config.hidden,
        "equation": "pre-norm",
        "activation": config.activation,
    }
    have = {"activation": "gelu", **plan.model}
    wrong = [f"{k}: plan {have.get(k)!r}, model {v!r}" for k, v in want.items() if have.get(k) != v]
    if wrong:
        raise ConfigError(
            f"plan={config.plan!r} was written for another model ({'; '.join(wrong)}); make a "
            "plan for this model: workbench run plan --d ... --num-layers ... --equation pre-norm."
        )
    schemes = wb.registry.SPLITTING_SCHEMES
    if plan.method not in schemes:
        raise ConfigError(
            f"plan={config.plan!r} chose {plan.method!r}; training runs splitting schemes "
            f"({', '.join(schemes)}): make the plan with --methods {','.join(schemes)}."
        )
    return plan


def discretization(config: Any, plan) -> tuple[Any, int]:
    """(scheme object, steps per layer): the plan's when given, else the config's."""
    if plan is not None:
        return wb.registry.SPLITTING_SCHEMES[plan.method], plan.steps_per_layer
    return wb.registry.SPLITTING_SCHEMES[config.scheme], config.steps_per_layer


def activation(config: Any):
    return wb.registry.ACTIVATIONS[config.activation]


def digits_model(
    config: Any,
    key,
    scheme,
    steps_per_layer: int,
    *,
    kernel_size: int,
    stride: int,
    image_shape: tuple[int, ...] = (8, 8),
    basis: str = "layers",
) -> wbc.ControlledModel:
    """The ViT-style digits model of the config's size: a patch embedding of `image_shape`
    images (8×8 by default; `(1, 40)` is MNIST-1D's one-row signal) (`kernel_size`, `stride`,
    zero padding `kernel_size // 2` when `stride == 1`, else none), a pre-norm equation with
    fresh controls (`wbc.random_transformer`) in the basis `basis` (`BASES`), a linear head on
    the class token."""
    k1, k2 = jax.random.split(key)
    padding = kernel_size // 2 if stride == 1 else 0
    k2, k3 = jax.random.split(k2) if basis == "hypernetwork" else (k2, None)
    return wbc.ControlledModel(
        wbc.PatchEmbedding(
            image_shape, config.d, kernel_size=kernel_size, stride=stride, padding=padding, key=k1
        ),
        wbc.random_transformer(
            k2,
            d=config.d,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
            hidden=config.hidden,
            activation=activation(config),
            scheme=scheme,
            steps_per_layer=steps_per_layer,
            basis=BASES[basis](config.num_layers, k3),
        ),
        wbc.ClassifierHead(config.d, 10),
    )


BASES = {
    "layers": lambda num_layers, key: None,
    "legendre": lambda num_layers, key: wb.LegendreBasis(num_layers - 1),
    "interpolated": lambda num_layers, key: wb.PiecewiseLinearBasis(num_layers),
    "hypernetwork": lambda num_layers, key: wb.HypernetworkBasis(num_layers, key=key),
}
"""The controls' basis by the config's `basis`, for `num_layers` layers' worth of parameters
(`key`: the learned basis's initialization): a network's layers (piecewise constant), Legendre
polynomials of degree `num_layers − 1` on `[0, num_layers]` (one piece: smooth in depth, any
step count, steps over the whole depth), piecewise linear through the layer midpoints, or
`num_layers` banks mixed by a small network of t (`wb.HypernetworkBasis`, one piece)."""
ONE_PIECE = ("legendre", "hypernetwork")
"""The bases whose controls are one piece over the whole depth: their steps count over all of
`[0, T]`."""
NESTED = ("layers", "legendre")
"""The bases with a nested coarser basis (coarse-basis draws, `coarsen_depth`)."""


CONTROLS = ("interpolated", "piecewise")


def with_controls(model, kind: str):
    """`model` with `Interpolated` controls (`kind="interpolated"`) or as built."""
    return wbc.interpolate_controls(model) if kind == "interpolated" else model
