"""The phase-diagram kernel: one trajectory (`_Kernel.observe` / `_Kernel.curve`: a scan over
blocks of steps between observations, in the state of its form) and one compiled chunk of
(β, start) pairs (`_chunk`)."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .._sharding import CellMesh
from .._types import Tokens
from ._cluster_statistics import Gram
from ._forms import AbstractForm
from ._gram_algebra import _as_beta
from ._integrators import AbstractSphereIntegrator
from ._time_grid import _Plan


class _Kernel(eqx.Module):
    """What one trajectory needs besides (β, start, dt): static choices and the matrices."""

    dynamics: type = eqx.field(static=True)
    integrator: AbstractSphereIntegrator
    form: AbstractForm
    Q: Array | None
    K: Array | None
    V: Array | None

    def initial(self, x0: Tokens):
        return self.form.initial(x0)

    def advance(self):
        """`(state, beta, dt) -> state` for one step (`beta` a `_Beta`)."""
        return self.form.advance(self.dynamics, self.integrator, self.Q, self.K, self.V)

    def gram(self, state) -> Gram:
        return self.form.gram(state)

    def observe(self, plan: _Plan, beta, x0, dt, slots, inverse, observable):
        """`observable(state)` at the saved times of one trajectory, stacked on a leading axis.

        A scan over blocks of `plan.block` steps (a static inner loop: on XLA:CPU a loop with a
        run-time trip count costs ~25 % more here); each block's observation goes to its slot of
        a buffer of the saved values (the last slot is scratch for unsaved blocks).
        """
        advance = self.advance()
        if self.form.hoist_shift:
            # |β| before the loop (see `_Beta`). (The Gram form measured faster without.)
            beta = _as_beta(beta)
        state = self.initial(x0)
        shape = jax.eval_shape(observable, state)
        buffer = jnp.zeros((plan.size + 1, *shape.shape), shape.dtype)
        if plan.initial:
            buffer = buffer.at[0].set(observable(state))

        def block(carry, slot):
            state, buffer = carry
            state = jax.lax.fori_loop(
                0, plan.block, lambda _, s: advance(s, beta, dt), state, unroll=min(plan.block, 5)
            )
            buffer = jax.lax.dynamic_update_index_in_dim(buffer, observable(state), slot, 0)
            return (state, buffer), None

        (_, buffer), _ = jax.lax.scan(block, (state, buffer), slots)
        return buffer[inverse]

    def curve(self, plan: _Plan, beta, x0, dt, slots, inverse, delta):
        """The statistic at the saved times of one trajectory, shape `(T,)`."""
        form = self.form
        return self.observe(
            plan, beta, x0, dt, slots, inverse, lambda state: form.statistic(state, delta)
        )


@functools.partial(jax.jit, static_argnames=("static", "plan", "mesh"))
def _chunk(params, static, plan: _Plan, mesh: CellMesh, betas, starts, dt, slots, inverse, delta):
    """`(len(betas), len(starts), T)` statistics, the starts cut over the devices of `mesh` (β
    and the rest replicated): each device runs its own cells, no communication. (`jax.jit`, not
    `eqx.filter_jit`: the latter waits for the result, and the host should prepare the next chunk
    meanwhile.)"""

    def local(params, betas, starts, dt, slots, inverse, delta):
        kernel = eqx.combine(params, static)
        one = lambda b, x: kernel.curve(plan, b, x, dt, slots, inverse, delta)
        # The form picks nested or flattened vmaps (measured per form; see `ReducedForm.map_pairs`).
        return kernel.form.map_pairs(one, betas, starts)

    cells = (False, False, True, False, False, False, False)  # the starts
    sharded = mesh.shard_map(local, cells, out_axis=1)
    return sharded(params, betas, starts, dt, slots, inverse, delta)
