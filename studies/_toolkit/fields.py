"""Config fields that several studies share, each declared once with its docstring.

A study's `Config` inherits the groups it has (dataclass inheritance: the fields of the bases
come first, in the order of the method resolution order) and states its own defaults with
`defaults(...)`, so a field's type, meaning and default live in one place and `workbench run
<study> --help` (which reads docstrings along `__mro__`) shows the same words everywhere:

```python
@dataclasses.dataclass(frozen=True)
@defaults(d=32, num_heads=2, hidden=64)
class Config(TrainingFields, Epochs, Patch):
    max_change: float = 1.0
    \"\"\"Accuracy points the network may lose.\"\"\"
```

The checks of these fields stay in each study's `__post_init__` (`studies._toolkit.training`,
`studies._toolkit.config`): the groups hold declarations only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from workbench.registry import SPHERE_INTEGRATORS

__all__ = [
    "Betas",
    "Costs",
    "Depth",
    "Delta",
    "Dimension",
    "Dims",
    "Dt",
    "Epochs",
    "FinalTime",
    "Integrator",
    "Ladder",
    "Method",
    "ParticleFields",
    "Particles",
    "Patch",
    "SaveEvery",
    "Smoothness",
    "Sorting",
    "Steps",
    "TMax",
    "TrainingFields",
    "WeightDecay",
    "defaults",
]

_C = TypeVar("_C", bound=type)


def defaults(**values: Any) -> Callable[[_C], _C]:
    """Class decorator, applied below `@dataclasses.dataclass`: give inherited fields the
    study's own defaults (their type and docstring stay in the base). An unknown name raises
    `TypeError` naming the inherited fields."""

    def apply(cls: _C) -> _C:
        inherited = {
            f.name: f
            for base in reversed(cls.__mro__[1:])
            if dataclasses.is_dataclass(base)
            for f in dataclasses.fields(base)
        }
        unknown = sorted(set(values) - set(inherited))
        if unknown:
            raise TypeError(
                f"defaults({', '.join(unknown)}): {cls.__qualname__} inherits no such field; "
                f"inherited: {', '.join(inherited)}."
            )
        annotations = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in values.items():
            annotations[name] = inherited[name].type
            setattr(cls, name, value)
        cls.__annotations__ = annotations
        return cls

    return apply


# --------------------------------------------------------------------------------------------
# Training studies
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainingFields:
    """The model, the discretization and the optimizer every training study has."""

    seed: int = 0
    """Seeds the data split, the initialization and the batch order (and the augmentation)."""
    batch_size: int = 64
    """Training examples per step (at most the size of the training split)."""
    d: int = 64
    """Model width d (token dimension)."""
    num_heads: int = 4
    """Attention heads per layer; must divide d."""
    num_layers: int = 4
    """Layers of the equation (pieces of its controls)."""
    hidden: int = 128
    """Feed-forward width."""
    activation: str = "gelu"
    """Feed-forward activation, a name in `wb.registry.ACTIVATIONS` (gelu, relu, tanh, ...)."""
    scheme: str = "lie"
    """Splitting scheme solving the equation in training: lie, strang, yoshida4 or suzuki4."""
    steps_per_layer: int = 1
    """Steps of the scheme per layer in training."""
    learning_rate: float = 3e-3
    """Peak learning rate, reached after the warm-up and cosine-decayed to 1 % of it."""
    warmup: int = 100
    """Steps of linear learning-rate warm-up from 0."""
    clip: float = 1.0
    """Largest global gradient norm; larger gradients are scaled down to it."""
    checkpoint_every: int = 100
    """Steps between training checkpoints in the run folder (resume after a kill)."""


@dataclasses.dataclass(frozen=True)
class WeightDecay:
    weight_decay: float = 0.05
    """Decoupled weight decay (AdamW)."""


@dataclasses.dataclass(frozen=True)
class Epochs:
    epochs: int = 40
    """Passes over the training split (of the first stage, where there are several)."""


@dataclasses.dataclass(frozen=True)
class Steps:
    steps: int = 1000
    """Training steps (iterations of every method, where several are compared)."""


@dataclasses.dataclass(frozen=True)
class Sorting:
    """The sorting task of `wbc.sorting` (`train-sequence`, `scheme-architectures`)."""

    length: int = 8
    """Symbols to sort (the input has 2 · length tokens)."""
    vocab: int = 16
    """Symbols are drawn from [0, vocab); the separator is one more token."""
    num_train: int = 4096
    """Training sequences (distinct from the held-out ones)."""
    num_test: int = 1024
    """Held-out sequences."""


@dataclasses.dataclass(frozen=True)
class Patch:
    patch: int = 2
    """Patch size and stride of the digits' patch embedding (1, 2, 4 or 8: divides 8)."""


@dataclasses.dataclass(frozen=True)
class Smoothness:
    smoothness: float = 0.0
    """λ_s of the smoothness cost ∫‖θ'‖² dt."""


@dataclasses.dataclass(frozen=True)
class Costs:
    kinetic: float = 0.0
    """λ_K of the kinetic cost ∫ (1/n)‖u_t‖² dt."""
    control_norm: float = 0.0
    """λ_θ of ∫‖θ‖² dt."""
    acceleration: float = 0.0
    """λ_A of the running cost ∫ (1/n)‖u_tt‖² dt (`wbc.Acceleration`, Kelly et al.): trains the
    flow to be easy for an adaptive solver (gradient dto only)."""


@dataclasses.dataclass(frozen=True)
class Depth:
    """How a training run discretizes its equation in depth (`wbc.TrainStep.discretization`)."""

    depth: str = "multi-resolution"
    """multi-resolution: every batch solved with a step count per layer drawn from
    `resolutions` (`wbc.MultiResolution`), the model keeping `scheme` and `steps_per_layer` as
    its own discretization (the certificate's base); fixed: every batch at `steps_per_layer`
    (`wbc.OwnDiscretization`: how networks are trained, one Lie step per layer by default)."""
    resolutions: tuple[int, ...] = (1, 2, 4)
    """Steps per layer drawn (uniformly) for each batch with depth=multi-resolution."""
    coarsen: tuple[int, ...] = ()
    """Depth factors of coarse-basis draws with depth=multi-resolution
    (`wbc.MultiResolution(coarsen=)`): the controls projected onto `num_layers / f` layers (the
    mean of each run of `f`) and solved with one step per coarse layer, drawn like one more
    step count, so that the trained network keeps its accuracy with half (`f = 2`) its layers;
    empty (`--coarsen ''`): none."""
    coarse_weight: float = 1.0
    """The weight of each coarse-basis draw against that of one entry of `resolutions` (1: every
    draw equally likely; 2 with `resolutions` 1,2,4 and `coarsen` 2: probabilities
    0.2, 0.2, 0.2, 0.4)."""


@dataclasses.dataclass(frozen=True)
class Method:
    """The choices of a single training run: plan, optimizer, gradient, layout, certificate."""

    plan: str | None = None
    """A plan.json from `workbench run plan` (its scheme and steps replace scheme and
    steps_per_layer)."""
    optimizer: str = "adamw"
    """adamw, adam or sgd, each with warm-up, cosine decay and clipping (msa brings its own)."""
    gradient: str = "dto"
    """Gradient: dto (exact, through the scheme), otd (continuous adjoint) or msa (Pontryagin)."""
    checkpointing: str = "none"
    """What dto's backward pass stores: none (everything), every-step or binomial."""
    shard_params: bool = False
    """Cut the parameters and optimizer state over the visible devices (fully sharded data
    parallel, `--shard-params`) instead of replicating them; checkpoints resume in either
    layout and on any device count."""
    certificate_examples: int = 2
    """Held-out examples the certificate solves in float64 (0: no certificate)."""
    target_accuracy: float = 0.98
    """Held-out accuracy the verdict requires (a fraction)."""
    max_spread: float = 0.005
    """The certificate's `max_accuracy_spread`: the largest change of the held-out accuracy
    (a fraction; 0.005 = half a point) under refinement and with a second scheme for which the
    trained network counts as a consistent discretization of its equation."""


@dataclasses.dataclass(frozen=True)
class Ladder:
    controls: str = "interpolated"
    """Controls in depth: interpolated (piecewise linear) or piecewise (constant per layer)."""
    ladder: tuple[int, ...] = (1, 2, 4, 8)
    """Steps per layer of the error ladder (increasing)."""
    examples: int = 2
    """Held-out images of the error ladder (float64); the worst is reported."""


# --------------------------------------------------------------------------------------------
# Particle studies
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Particles:
    n: int = 32
    """Number of particles n."""


@dataclasses.dataclass(frozen=True)
class ParticleFields:
    """What every particle study has: the random starts, their seed and the devices."""

    num_starts: int = 8
    """Uniform random starts on the sphere (the same starts for every β)."""
    seed: int = 0
    """Seeds the random starts (and any random matrices or optimizer of the study)."""
    devices: int = 0
    """Devices to spread the starts over: 0 = every visible device (all processes' after
    `jax.distributed.initialize()`; `XLA_FLAGS=--xla_force_host_platform_device_count=8`
    simulates 8 on a CPU), k = the first k. The numbers do not depend on it."""


@dataclasses.dataclass(frozen=True)
class Betas:
    betas: tuple[float, ...] = (1.0, 4.0)
    """Inverse temperatures β of the dynamics, one run per value."""


@dataclasses.dataclass(frozen=True)
class Dt:
    dt: float = 0.1
    """Integration time step Δt of the particle flow."""


@dataclasses.dataclass(frozen=True)
class SaveEvery:
    save_every: float = 0.5
    """Spacing of the saved times; a multiple of `dt`."""


IntegratorName = Literal[tuple(SPHERE_INTEGRATORS)]  # pyright: ignore[reportInvalidTypeForm]
"""The names of the sphere integrators, read from the registry: the command line accepts these and
`--help` lists them."""


@dataclasses.dataclass(frozen=True)
class Integrator:
    integrator: IntegratorName = "rk4"
    """A sphere integrator of `wb.registry.SPHERE_INTEGRATORS` (`euler` is paper B's)."""


@dataclasses.dataclass(frozen=True)
class Delta:
    delta: float = 1e-3
    """A pair is clustered when ⟨x_i, x_j⟩ ≥ 1 − δ (paper B's Fig. 3 tolerance)."""


@dataclasses.dataclass(frozen=True)
class Dims:
    dims: tuple[int, ...] = (2, 3)
    """Dimensions d of the sphere S^{d−1} the particles live on, one run per value."""


@dataclasses.dataclass(frozen=True)
class Dimension:
    d: int = 32
    """Dimension d of the sphere S^{d−1}."""


@dataclasses.dataclass(frozen=True)
class FinalTime:
    t1: float = 30.0
    """Final time of the flow (time plays the role of depth)."""


@dataclasses.dataclass(frozen=True)
class TMax:
    t_max: float = 30.0
    """Final time of the flow; a multiple of `save_every`."""
