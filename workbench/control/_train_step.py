r"""One step of training as a value: `TrainStep` (what a step does) and `TrainState` (what it
changes), the shape an equinox + optax user writes by hand.

A step on the batch $(x, y)$ with state $(θ, s, k)$ (model, optimizer state, step count):

1. augment: $x \leftarrow a(\mathrm{fold\_in}(key, k), x)$ when an augmentation is given;
2. the discretization: the model's own, or the candidate the `discretization` draws for step
   $k$ (`MultiResolution`: a step count per batch);
3. the objective and a descent direction: $(J, g) = $ `method.value_and_direction(objective,
   model, x, y)` on the model so discretized — the exact gradient of the discrete model
   (`DiscretizeThenOptimize`), the continuous adjoint's, or the method of successive
   approximations' displacement;
4. the update: $(u, s') = $ `optimizer.update(g, s, θ)`, $θ' = θ + u$, with the optimizer the
   method asks for (`method.optimizer(optimizer)`: MSA applies its own iteration).

`TrainStep.__call__` is pure, so it can be jitted, vmapped or written into any loop; `train`
runs it with batches, devices, checkpoints, logging and signals around it.

```python
step = wbc.TrainStep(optax.adam(1e-3))
state = step.init(model, key=jax.random.key(0))
run = eqx.filter_jit(step)
for xs, ys in batches:
    state, info = run(state, (xs, ys))    # info: objective, loss, ..., finite
```
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Int, PRNGKeyArray, PyTree

from ._discretizations import (
    AbstractTrainingDiscretization,
    OwnDiscretization,
    coarsened,
    own_discretization,
    refined_adjoint,
    with_discretization,
)
from ._gradients import AbstractGradientMethod, DiscretizeThenOptimize
from ._objective import Objective

__all__ = ["TrainState", "TrainStep"]


class TrainState(eqx.Module):
    """What a training step changes: the `model` (an equinox module), the optimizer's state
    `opt_state`, the number of steps taken `step`, and the base `key` of the augmentation
    (step `k` uses `fold_in(key, k)`)."""

    model: eqx.Module
    opt_state: PyTree
    step: Int[Array, ""]
    key: PRNGKeyArray


class TrainStep(eqx.Module):
    r"""One optimization step of the optimal-control objective (see the module docstring).

    **Arguments:**

    - `optimizer`: an optax `GradientTransformation` (e.g. `wbc.default_optimizer(3e-3,
      steps=...)`). A gradient method may bring its own: the method of successive
      approximations returns the update itself and applies it with `optax.sgd(1.0)`
      (`AbstractGradientMethod.optimizer`).
    - `objective`: the `Objective` (default: cross-entropy through the head, no running costs).
    - `method`: the gradient method (default `DiscretizeThenOptimize()`).
    - `augment`: `augment(key, inputs) -> inputs` applied to each batch (e.g.
      `random_shift` in `workbench.control._tasks`), or `None`.
    - `discretization`: which discretization of the equation each batch is solved with:
      `OwnDiscretization()` (default: the model's scheme and steps per layer) or e.g.
      `MultiResolution((1, 2, 4))` (a step count drawn per batch from the step's key; the model
      keeps its own for evaluation).
    - `max_skipped`: the NaN guard. `0` (default): a step whose objective or direction is not
      finite is reported in `info["finite"]` (and `train` stops there, naming the step and
      where the non-finite values are). `k > 0`: such a step is skipped inside the update
      (`optax.apply_if_finite`: parameters and optimizer moments unchanged) up to `k` times in a
      row; `train` stops at the `k + 1`-th.

    `init(model, key=)` makes the first `TrainState`; `__call__(state, (xs, ys))` returns the
    next state and `info`: `objective`, `loss`, `kinetic`, `control`, `accuracy` (of the batch)
    and `finite` (scalars).
    """

    optimizer: optax.GradientTransformation
    objective: Objective = Objective()
    method: AbstractGradientMethod = DiscretizeThenOptimize()
    augment: Callable | None = None
    discretization: AbstractTrainingDiscretization = OwnDiscretization()
    max_skipped: int = eqx.field(default=0, static=True)

    def __check_init__(self):
        if not isinstance(self.optimizer, optax.GradientTransformation):
            raise ValueError(
                f"TrainStep.optimizer={self.optimizer!r} is not an optax GradientTransformation; "
                "pass e.g. optax.adam(1e-3) or workbench.control.default_optimizer(steps=...)."
            )
        if not isinstance(self.objective, Objective):
            raise ValueError(
                f"TrainStep.objective={self.objective!r} must be a workbench.control.Objective."
            )
        if not isinstance(self.method, AbstractGradientMethod):
            raise ValueError(
                f"TrainStep.method={self.method!r} is not a gradient method; valid: "
                "DiscretizeThenOptimize(), OptimizeThenDiscretize(), SuccessiveApproximations()."
            )
        if self.augment is not None and not callable(self.augment):
            raise ValueError(f"TrainStep.augment={self.augment!r} must be callable or None.")
        if not isinstance(self.discretization, AbstractTrainingDiscretization):
            raise ValueError(
                f"TrainStep.discretization={self.discretization!r} is not a training "
                "discretization; valid: OwnDiscretization(), MultiResolution((1, 2, 4))."
            )
        skipped = self.max_skipped
        if isinstance(skipped, bool) or not isinstance(skipped, int) or skipped < 0:
            raise ValueError(f"TrainStep.max_skipped={skipped!r} must be an integer >= 0.")

    @property
    def update_rule(self) -> optax.GradientTransformation:
        """The optax transformation the step applies: the method's choice of `optimizer`, inside
        `optax.apply_if_finite` when steps may be skipped."""
        rule = self.method.optimizer(self.optimizer)
        if self.max_skipped:
            rule = optax.apply_if_finite(rule, self.max_skipped)
        return rule

    def init(self, model: eqx.Module, *, key: PRNGKeyArray) -> TrainState:
        """The state before the first step: `model`, the optimizer initialized on its floating
        arrays, step 0, and `key` (the augmentation's base key)."""
        params = eqx.filter(model, eqx.is_inexact_array)
        return TrainState(model, self.update_rule.init(params), jnp.asarray(0), key)

    def value_and_direction(self, model: eqx.Module, batch, key: PRNGKeyArray, step):
        """`((J, aux), direction)` of step `step` on `batch` from `model`: the batch augmented
        with `fold_in(key, step)`, solved with the discretization drawn for the step, the
        direction shaped like `model` (its own discretization)."""
        xs, ys = batch
        step_key = jax.random.fold_in(key, step)
        if self.augment is not None:
            xs = self.augment(step_key, xs)
        candidates = self.discretization.candidates(model)

        def branch(candidate):
            def solve(m):
                if candidate is None:  # the model as it is
                    return self.method.value_and_direction(self.objective, m, xs, ys)
                scheme, steps, factor = candidate
                trained = with_discretization(coarsened(m, factor), scheme, steps)
                out, direction = self.method.value_and_direction(self.objective, trained, xs, ys)
                direction = refined_adjoint(direction, factor)
                return out, with_discretization(direction, *own_discretization(m))

            return solve

        if len(candidates) == 1:
            return branch(candidates[0])(model)
        index = self.discretization.index(jax.random.fold_in(step_key, 1), step)
        params, static = eqx.partition(model, eqx.is_array)
        branches = [lambda p, c=c: branch(c)(eqx.combine(p, static)) for c in candidates]
        return jax.lax.switch(index, branches, params)

    def __call__(self, state: TrainState, batch) -> tuple[TrainState, dict]:
        """One step on `batch = (inputs, targets)`: `(next state, info)`."""
        (value, aux), direction = self.value_and_direction(
            state.model, batch, state.key, state.step
        )
        params, static = eqx.partition(state.model, eqx.is_inexact_array)
        direction = eqx.filter(direction, eqx.is_inexact_array)
        finite = jnp.isfinite(value)
        for leaf in jax.tree.leaves(direction):
            finite = finite & jnp.all(jnp.isfinite(leaf))
        updates, opt_state = self.update_rule.update(direction, state.opt_state, params)
        model = eqx.combine(eqx.apply_updates(params, updates), static)
        info = {
            "objective": value,
            "loss": aux["loss"],
            "kinetic": aux["kinetic"],
            "control": aux["control"],
            "accuracy": aux["accuracy"],
            "finite": finite,
        }
        return TrainState(model, opt_state, state.step + 1, state.key), info
