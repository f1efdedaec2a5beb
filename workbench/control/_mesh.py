r"""The training step placed on devices: a one-axis mesh over which each batch is split, the
layout of the parameters and optimizer state on it (replicated, or each array cut along one
axis), and the step compiled as one `jax.jit` program of arrays.

The program is one module-level `jax.jit` (`_step_program`) whose static argument is everything
the step closes over: the optimizer's `update` function, the objective, gradient method,
augmentation, discretization and `max_skipped`, the model's static part and the layouts, each
without its arrays (the arrays are arguments). JAX's own cache of traced programs, keyed by
that argument, therefore serves every later run of the process with an equal step on a model of
the same structure: another seed, another `default_optimizer` setting (its numbers are state,
its `update` one function), another `random_shift(1)`. An optax transformation made anew
(`optax.adam(1e-3)` twice) has another `update` function, so it is another program.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._data import Dataset, batch_indices
from ._train_step import TrainState, TrainStep

__all__ = ["BatchMesh", "CompiledStep", "layout"]


class BatchMesh:
    """The devices of a run on a one-axis mesh: batches split along it, arrays replicated."""

    def __init__(self, devices, batch_size: int):
        devices = list(jax.devices() if devices is None else devices)
        self.size = len(devices)
        if batch_size % self.size:
            raise ValueError(
                f"batch_size={batch_size} must be a multiple of the number of devices "
                f"({self.size}) to split the batch evenly."
            )
        mesh = Mesh(np.asarray(devices), ("batch",))
        self.split = NamedSharding(mesh, PartitionSpec("batch"))
        self.replicated = NamedSharding(mesh, PartitionSpec())

    def batch(self, data: Dataset, seed: int, s: int, batch_size: int):
        """Step `s`'s batch, gathered on the host and split over the devices."""
        idx = batch_indices(seed, s, len(data), batch_size)
        xs = jax.device_put(jnp.asarray(data.inputs[idx]), self.split)
        return xs, jax.device_put(jnp.asarray(data.targets[idx]), self.split)


def _leaf_sharding(leaf, replicated):
    """Shard an array over the mesh along its largest axis divisible by the device count (the
    last such axis on ties); replicate it when there is none (scalars, odd sizes)."""
    count = replicated.mesh.size
    shape = getattr(leaf, "shape", ())
    axes = [a for a, n in enumerate(shape) if n % count == 0 and n >= count]
    if count == 1 or not axes:
        return replicated
    axis = max(axes, key=lambda a: (shape[a], a))
    spec = [None] * len(shape)
    spec[axis] = "batch"
    return NamedSharding(replicated.mesh, PartitionSpec(*spec))


def layout(tree, replicated, shard_params: bool):
    """The placement of every array leaf of `tree`: replicated (data parallel), or each leaf cut
    over the devices along one axis (`shard_params`: each device holds 1/D of the parameters and
    of the optimizer state; XLA gathers a layer's weights where the step needs them)."""
    if not shard_params:
        return jax.tree.map(lambda _: replicated, tree)
    return jax.tree.map(lambda leaf: _leaf_sharding(leaf, replicated), tree)


class _Static:
    """A pytree without arrays as a static argument of `jax.jit`: equal (and of equal hash)
    when its structure and leaves are; `hash` raises `TypeError` for an unhashable leaf."""

    def __init__(self, tree):
        self.tree = tree
        leaves, treedef = jax.tree.flatten(tree)
        self.key = (tuple(leaves), treedef)
        self.hash = hash(self.key)  # TypeError for an unhashable leaf

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Static) and self.key == other.key


class _Own(_Static):
    """A static argument equal to itself only (a tree with an unhashable leaf)."""

    def __init__(self, tree):
        self.tree, self.key, self.hash = tree, object(), id(tree)


def _no_init(params):
    raise AssertionError("the compiled step does not initialize an optimizer")


def _step(static: _Static, arrays, params, opt_state, xs, ys, index, key):
    """One training step on the arrays; `static` holds the rest of the step and the model."""
    update, parts, model_static, layouts = eqx.combine(arrays, static.tree)
    train_step = TrainStep(optax.GradientTransformation(_no_init, update), *parts)
    before = TrainState(eqx.combine(params, model_static), opt_state, index, key)
    after, info = train_step(before, (xs, ys))
    new = (eqx.filter(after.model, eqx.is_inexact_array), after.opt_state)
    # Keep the layout from step to step (XLA would otherwise pick the outputs').
    return (*jax.lax.with_sharding_constraint(new, layouts), info)


_step_program = jax.jit(_step, static_argnums=0)


class CompiledStep:
    """The step as one `jax.jit` program of arrays (parameters, optimizer state, batch, step
    index, the augmentation's key, and any arrays of the step or the model's static part):
    unlike `eqx.filter_jit` it returns before the step has finished, so the host prepares the
    next batch meanwhile. The key is an argument, not a constant of the program, so runs that
    differ only in their seed compile the same program (read back from JAX's persistent
    compilation cache when one is set; within the process, traced once: see the module
    docstring). A step that is not finite is simply not assigned on the host (no select of old
    and new values in the program)."""

    def __init__(
        self, train_step: TrainStep, state: TrainState, mesh: BatchMesh, shard_params: bool
    ):
        params, model_static = eqx.partition(state.model, eqx.is_inexact_array)
        self.layouts = (
            layout(params, mesh.replicated, shard_params),
            layout(state.opt_state, mesh.replicated, shard_params),
        )
        self.key = state.key
        parts = (
            train_step.objective,
            train_step.method,
            train_step.augment,
            train_step.discretization,
            train_step.max_skipped,
        )
        closed = (train_step.optimizer.update, parts, model_static, self.layouts)
        self.arrays, rest = eqx.partition(closed, eqx.is_array)
        try:
            self.static, self.program = _Static(rest), _step_program
        except TypeError:  # an unhashable leaf: a program of this run's own, traced anew
            self.static, self.program = _Own(rest), jax.jit(_step, static_argnums=0)

    def lower(self, params, opt_state, xs, ys, index: int):
        """The program lowered for these arguments (its text: `.as_text()`)."""
        return self.program.lower(
            self.static, self.arrays, params, opt_state, xs, ys, jnp.asarray(index), self.key
        )

    def __call__(self, params, opt_state, xs, ys, index: int):
        return self.program(
            self.static, self.arrays, params, opt_state, xs, ys, jnp.asarray(index), self.key
        )
