r"""Which discretization of the equation a training step solves: the model's own, or one drawn
per batch from several (multi-resolution training), so that the trained controls are those of
an equation and not of one grid (docs/control.md, "Continuous depth").

A network trained at one Lie–Trotter step per layer learns a discrete map: solved with more
steps, its accuracy falls (Queiruga et al. 2020; Ott et al. 2021). Training the same controls
at several step counts, one drawn for every batch, makes the loss an average over
discretizations of one equation, so the controls that minimize it give a flow whose solutions
at those step counts, and in the limit, agree.

A training discretization is a static list of candidates `(scheme, steps_per_layer, coarsen)`
and, for every step, the index of the one to use, drawn from the step's key (so a resumed run
draws the same ones). `TrainStep` solves the batch with that candidate (a `lax.switch` over the
candidates: one compiled branch each, one executed per step) and maps the direction back onto
the model, which keeps its own discretization. A candidate with `coarsen = f > 1` solves the
model with its controls projected onto `L / f` layers (`coarsen_depth`: the mean of each run of
`f` layers); its direction, shaped like the coarse model, is mapped back by the adjoint of that
mean (each coarse layer's direction repeated on its `f` layers, divided by `f`), which for a
gradient method is the exact gradient of `θ ↦ J(coarsen(θ))`.
"""

import abc
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, PRNGKeyArray

from .._checks import is_int
from ..architectures._model import Transformer
from ..schemes._splitting import AbstractSplittingScheme

__all__ = [
    "AbstractTrainingDiscretization",
    "MultiResolution",
    "OwnDiscretization",
    "with_discretization",
]


def _transformers(tree) -> list:
    is_transformer = lambda x: isinstance(x, Transformer)
    return [x for x in jax.tree.leaves(tree, is_leaf=is_transformer) if is_transformer(x)]


def with_discretization(tree, scheme: AbstractSplittingScheme | None, steps_per_layer: int):
    """`tree` (a model, or a direction shaped like one) with every `Transformer` in it solved by
    `scheme` (its own when None) with `steps_per_layer` steps per layer; controls, embedding and
    head unchanged. Unlike `rediscretize` it never warns: it is called on gradients too."""

    def swap(x):
        if not isinstance(x, Transformer):
            return x
        return Transformer(x.equation, x.scheme if scheme is None else scheme, steps_per_layer)

    return jax.tree.map(swap, tree, is_leaf=lambda x: isinstance(x, Transformer))


def _on_transformers(tree, fn):
    """`tree` with `fn` applied to every `Transformer` in it."""
    is_transformer = lambda x: isinstance(x, Transformer)
    return jax.tree.map(lambda x: fn(x) if is_transformer(x) else x, tree, is_leaf=is_transformer)


def coarsened(tree, factor: int):
    """`tree` (a model) with every `Transformer`'s controls projected onto `L / factor` layers
    (`coarsen_depth`; `factor = 1`: unchanged)."""
    if factor == 1:
        return tree
    from ._models import coarsen_depth

    return _on_transformers(tree, lambda t: coarsen_depth(t, factor))


def refined_adjoint(tree, factor: int):
    """The adjoint of `coarsened` on a direction shaped like the coarse model: every control's
    `coarsen_transpose` (for layers, each coarse layer's direction repeated on its `factor` fine
    layers and divided by `factor`, the mean's transpose; for Legendre coefficients, zeros
    appended)."""
    if factor == 1:
        return tree
    from ._models import _map_controls

    return _on_transformers(tree, lambda t: _map_controls(t, lambda c: c.coarsen_transpose(factor)))


def _is_global(model) -> bool:
    """Whether the model's controls are one piece over the whole depth (a global basis such as
    `wb.Legendre`), so that its steps are steps over `[0, T]`."""
    equation = _transformers(model)[0].equation
    return equation.num_pieces == 1 and not equation.is_piecewise_constant


def _num_functions(transformer) -> int:
    """The number of basis functions of the controls (layers, or Legendre coefficients)."""
    control = transformer.equation.operators[0].term
    return getattr(control, "num_functions", control.num_pieces)


def own_discretization(model) -> tuple[AbstractSplittingScheme, int]:
    found = _transformers(model)
    if len(found) != 1:
        raise ValueError(
            f"a training discretization needs a model with exactly one Transformer (a "
            f"ControlledModel, a ViT, ...); this {type(model).__name__} has {len(found)}."
        )
    return found[0].scheme, found[0].steps_per_layer


class AbstractTrainingDiscretization(eqx.Module):
    """Which discretization a training step solves (see the module docstring)."""

    @abc.abstractmethod
    def candidates(self, model) -> tuple[tuple[AbstractSplittingScheme, int, int] | None, ...]:
        """The `(scheme, steps_per_layer, coarsen)` a step may solve, for `model` (static):
        `coarsen = f` solves the controls projected onto `L / f` layers (1: the layers as they
        are); `None` for the model as it is."""

    @abc.abstractmethod
    def index(self, key: PRNGKeyArray, step: Int[Array, ""]) -> Int[Array, ""]:
        """The candidate of step `step`, from the step's `key` (traced)."""


class OwnDiscretization(AbstractTrainingDiscretization):
    """Every batch is solved with the model's own scheme and steps per layer: what a network
    is trained as (one Lie–Trotter step per layer for today's networks)."""

    def candidates(self, model):
        del model
        return (None,)  # the model as it is (any model, with or without a Transformer)

    def index(self, key, step):
        del key, step
        return jnp.asarray(0)


class MultiResolution(AbstractTrainingDiscretization):
    r"""Every batch is solved with `k` steps per layer drawn from `steps_per_layer` (with
    `probabilities`, uniform by default), by `scheme` (the model's own when None); the model
    keeps its own discretization for evaluation.

    The objective becomes $\mathbb{E}_k\, J(θ; \text{scheme}, k)$: controls that do well at
    every drawn step count, so their flow does not lean on one grid. A step costs the drawn
    `k`'s solve: $\sum_k p_k k$ relative steps per layer on average (`cost`).

    With `coarsen = (f, ...)` the draws also include, for each `f`, the controls projected onto
    `L / f` layers (`coarsen_depth`, the mean of each run of `f` layers) solved with one step per
    coarse layer: the objective then also asks that the network keep its accuracy on half
    (`f = 2`) its basis and steps, so that it can be compressed that way after training. Such a
    draw costs `1 / f` steps per layer.

    **Arguments:**

    - `steps_per_layer`: the step counts to draw from (distinct positive integers, e.g.
      `(1, 2, 4)`).
    - `probabilities`: one per draw (the entries of `steps_per_layer`, then those of
      `coarsen`), positive, summing to 1 (default: uniform).
    - `scheme`: the splitting scheme of every draw, or None for the model's own.
    - `coarsen`: depth factors of coarse-basis draws (distinct integers ≥ 2, each dividing the
      model's number of basis functions: its layers, or its `wb.Legendre` coefficients, whose
      coarse draw keeps the first `n / f` and takes `1 / f` of the model's own steps over
      `[0, T]`), or `()` for none.

    ```python
    step = wbc.TrainStep(optimizer, discretization=wbc.MultiResolution((1, 2, 4)))
    ```
    """

    steps_per_layer: tuple[int, ...] = eqx.field(static=True)
    probabilities: tuple[float, ...] | None = eqx.field(static=True, default=None)
    scheme: AbstractSplittingScheme | None = None
    coarsen: tuple[int, ...] = eqx.field(static=True, default=())
    _fingerprint_optional: ClassVar[tuple[str, ...]] = ("coarsen",)
    # (left out of a run's fingerprint while empty: a fingerprint without it matches)

    def __check_init__(self):
        ks = self.steps_per_layer
        if (
            not isinstance(ks, tuple)
            or not ks
            or not all(is_int(k) and k >= 1 for k in ks)
            or len(set(ks)) != len(ks)
        ):
            raise ValueError(
                f"MultiResolution.steps_per_layer={ks!r} must be a non-empty tuple of distinct "
                "positive integers, e.g. (1, 2, 4)."
            )
        fs = self.coarsen
        if (
            not isinstance(fs, tuple)
            or not all(is_int(f) and f >= 2 for f in fs)
            or len(set(fs)) != len(fs)
        ):
            raise ValueError(
                f"MultiResolution.coarsen={fs!r} must be a tuple of distinct integers >= 2 "
                "(depth factors, e.g. (2,)), or () for no coarse-basis draws."
            )
        p = self.probabilities
        n = len(ks) + len(fs)
        if p is not None:
            ok = (
                isinstance(p, tuple)
                and len(p) == n
                and all(isinstance(q, (int, float)) and math.isfinite(q) and q > 0 for q in p)
                and abs(sum(p) - 1) <= 1e-9
            )
            if not ok:
                raise ValueError(
                    f"MultiResolution.probabilities={p!r} must be a tuple of {n} positive "
                    "numbers (one per entry of steps_per_layer, then of coarsen) summing to 1, "
                    "or None (uniform)."
                )
        if self.scheme is not None and not isinstance(self.scheme, AbstractSplittingScheme):
            raise ValueError(
                f"MultiResolution.scheme={self.scheme!r} must be a splitting scheme object "
                "(wb.schemes.LieTrotter(), Strang(), ...) or None (the model's own)."
            )

    @property
    def draws(self) -> tuple[tuple[int, int], ...]:
        """`(steps_per_layer, coarsen)` of every draw, in the order of `probabilities`."""
        return tuple((int(k), 1) for k in self.steps_per_layer) + tuple(
            (1, int(f)) for f in self.coarsen
        )

    @property
    def weights(self) -> np.ndarray:
        n = len(self.draws)
        return np.full(n, 1 / n) if self.probabilities is None else np.asarray(self.probabilities)

    def candidates(self, model):
        own, _ = own_discretization(model)
        layers = _num_functions(_transformers(model)[0])
        bad = [f for f in self.coarsen if layers % f]
        if bad:
            raise ValueError(
                f"MultiResolution.coarsen={self.coarsen!r}: factor(s) {bad} do not divide the "
                f"model's {layers} layers (basis functions); valid: "
                f"{[f for f in range(2, layers + 1) if layers % f == 0]}."
            )
        scheme = own if self.scheme is None else self.scheme
        if _is_global(model):
            # One piece over the whole depth (a smooth basis): a coarse draw solves the first
            # 1/f of the functions with 1/f of the model's own steps.
            _, own_steps = own_discretization(model)
            return tuple(
                (scheme, k if f == 1 else max(1, own_steps // f), f) for k, f in self.draws
            )
        return tuple((scheme, k, f) for k, f in self.draws)

    def index(self, key, step):
        del step
        n = len(self.draws)
        if n == 1:
            return jnp.asarray(0)
        return jax.random.choice(key, n, p=jnp.asarray(self.weights, jnp.float32))

    @property
    def cost(self) -> float:
        """The expected steps per (fine) layer of a training step, `Σ p k / f` over the draws."""
        return float(np.dot(self.weights, [k / f for k, f in self.draws]))
