"""The phase-diagram kernel: one trajectory of one dynamics object (`_Kernel.observe` /
`_Kernel.curve`: a scan over blocks of steps between observations, in the state of its form) and
one compiled chunk of (β, start) pairs (`_chunk`: the chunk's β swapped into the dynamics
template, then vmapped over the β leaf and the starts)."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .._sharding import CellMesh
from .._types import Tokens
from ._cluster_statistics import Gram
from ._dynamics import SA
from ._forms import AbstractForm, _with_beta
from ._integrators import AbstractSphereIntegrator
from ._time_grid import _Plan


class _Kernel(eqx.Module):
    """What one trajectory needs besides (dynamics, start, dt): the integrator and the form."""

    integrator: AbstractSphereIntegrator
    form: AbstractForm

    def initial(self, x0: Tokens):
        return self.form.initial(x0)

    def advance(self, dynamics: SA):
        """`(state, dt) -> state` for one step of `dynamics` (see `AbstractForm.advance`)."""
        return self.form.advance(dynamics, self.integrator)

    def gram(self, state) -> Gram:
        return self.form.gram(state)

    def observe(self, plan: _Plan, dynamics: SA, x0, dt, slots, inverse, observable):
        """`observable(state)` at the saved times of one trajectory of `dynamics` (one `SA` /
        `USA`, β a scalar), stacked on a leading axis.

        A scan over blocks of `plan.block` steps (a static inner loop: on XLA:CPU a loop with a
        run-time trip count costs ~25 % more here); each block's observation goes to its slot of
        a buffer of the saved values (the last slot is scratch for unsaved blocks).
        """
        # Before the loop: what the form computes once per trajectory (|β|, a fused KᵀQ).
        advance = self.advance(dynamics)
        state = self.initial(x0)
        shape = jax.eval_shape(observable, state)
        buffer = jnp.zeros((plan.size + 1, *shape.shape), shape.dtype)
        if plan.initial:
            buffer = buffer.at[0].set(observable(state))

        def block(carry, slot):
            state, buffer = carry
            state = jax.lax.fori_loop(
                0, plan.block, lambda _, s: advance(s, dt), state, unroll=min(plan.block, 5)
            )
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, observable(state), slot, 0)
            return (state, buffer), None

        (_, buffer), _ = jax.lax.scan(block, (state, buffer), slots)
        return buffer[inverse]

    def curve(self, plan: _Plan, dynamics: SA, x0, dt, slots, inverse, delta):
        """The statistic at the saved times of one trajectory, shape `(T,)`."""
        form = self.form
        return self.observe(
            plan, dynamics, x0, dt, slots, inverse, lambda state: form.statistic(state, delta)
        )


@functools.partial(jax.jit, static_argnames=("static", "plan", "mesh"))
def _chunk(params, static, plan: _Plan, mesh: CellMesh, betas, starts, dt, slots, inverse, delta):
    """`(len(betas), len(starts), T)` statistics, the starts cut over the devices of `mesh` (β
    and the rest replicated): each device runs its own cells, no communication. (`jax.jit`, not
    `eqx.filter_jit`: the latter waits for the result, and the host should prepare the next chunk
    meanwhile.)

    `eqx.combine(params, static)` is `(kernel, template)`: `template` is the sweep's dynamics
    (shared matrices, a placeholder scalar β); the chunk's `betas` replace its β leaf, giving the
    batch of the chunk's dynamics that the form maps over (β is not a jit argument of fixed
    value, so every chunk and every β grid of the same sizes reuses one compilation)."""

    def local(params, betas, starts, dt, slots, inverse, delta):
        kernel, template = eqx.combine(params, static)
        one = lambda dynamics, x: kernel.curve(plan, dynamics, x, dt, slots, inverse, delta)
        # The form picks nested or flattened vmaps (measured per form; see `ReducedForm.map_pairs`).
        return kernel.form.map_pairs(one, _with_beta(template, betas), starts)

    cells = (False, False, True, False, False, False, False)  # the starts
    sharded = mesh.shard_map(local, cells, out_axis=1)
    return sharded(params, betas, starts, dt, slots, inverse, delta)
