r"""How a splitting solve keeps its states for reverse-mode differentiation (`integrate(...,
adjoint=...)`): memory against recomputation.

Differentiating `N` steps of a scheme by reverse mode needs every step's intermediate values
(the residuals of its VJP). Keeping them all costs memory `O(N · step)`; keeping only some
states and recomputing the rest from them in the backward pass trades memory for time:

| option | stored | recomputed forward work |
|---|---|---|
| `NoCheckpointing()` | every intermediate of every step | none |
| `CheckpointEvery(1)` | the state at every step boundary | one step per step |
| `CheckpointEvery(k)` | the state every `k` steps | the block of `k` steps |
| `BinomialCheckpointing(c)` | `c` states (Griewank's binomial schedule) | `O(N log N)`-ish |

All of them give the same gradient (to round-off): this is the exact gradient of the discrete
model. diffrax solvers take diffrax's own adjoints instead (`diffrax.RecursiveCheckpointAdjoint`,
`diffrax.BacksolveAdjoint`).
"""

import abc

import equinox as eqx
import equinox.internal as eqxi
import jax

from ._checks import positive_int


class AbstractCheckpointing(eqx.Module):
    """How the steps of a splitting solve are stored for reverse-mode differentiation."""

    @abc.abstractmethod
    def scan(self, f, init, xs, length: int):
        """`jax.lax.scan(f, init, xs, length)` with this storage policy."""


class NoCheckpointing(AbstractCheckpointing):
    """Store everything: a plain `jax.lax.scan` (no recomputation, most memory).

    No recomputation is not always the fastest: on XLA's CPU backend, writing every step's
    internals into the scan's stacked buffers cost more than recomputing them for the digits
    training step (d = 64, 4 layers, batch 64: `CheckpointEvery(1)` took 0.87× the time,
    `benchmarks/README.md`, `train_step_ops.py`)."""

    def scan(self, f, init, xs, length: int):
        return jax.lax.scan(f, init, xs, length=length)


class CheckpointEvery(AbstractCheckpointing):
    """Store the state every `every` steps; recompute each block of steps in the backward pass.

    With `every=1` only the step boundaries are stored (each step's internals — attention
    weights, hidden activations — are recomputed). `num_steps` must be a multiple of `every`.
    """

    every: int = eqx.field(static=True, default=1)

    def __check_init__(self):
        positive_int("CheckpointEvery.every", self.every)

    def scan(self, f, init, xs, length: int):
        k = self.every
        if length % k:
            raise ValueError(
                f"CheckpointEvery(every={k}): num_steps={length} is not a multiple of {k}; "
                f"choose every among the divisors of {length}."
            )

        @jax.checkpoint
        def block(carry, xs_block):
            return jax.lax.scan(f, carry, xs_block, length=k)

        blocks = jax.tree.map(lambda x: x.reshape((length // k, k) + x.shape[1:]), xs)
        carry, ys = jax.lax.scan(block, init, blocks, length=length // k)
        ys = jax.tree.map(lambda y: y.reshape((length,) + y.shape[2:]), ys)
        return carry, ys


class BinomialCheckpointing(AbstractCheckpointing):
    """Store `checkpoints` states placed by the binomial (treeverse) schedule of Griewank and
    Walther, the memory-optimal schedule for a given amount of recomputation
    (`equinox.internal.scan(kind="checkpointed")`, what `diffrax.RecursiveCheckpointAdjoint`
    uses). `None`: about `sqrt(num_steps)` checkpoints. Reverse mode only (no `jax.jvp`).
    """

    checkpoints: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        positive_int("BinomialCheckpointing.checkpoints", self.checkpoints, allow_none=True)

    def scan(self, f, init, xs, length: int):
        checkpoints = None if self.checkpoints is None else min(int(self.checkpoints), length)
        return eqxi.scan(f, init, xs, length=length, kind="checkpointed", checkpoints=checkpoints)


def check_checkpointing(adjoint) -> AbstractCheckpointing:
    """`None` → `NoCheckpointing()`; a checkpointing object unchanged; anything else a
    `ValueError` naming the valid choices."""
    if adjoint is None:
        return NoCheckpointing()
    if isinstance(adjoint, AbstractCheckpointing):
        return adjoint
    raise ValueError(
        f"adjoint={adjoint!r} does not apply to a splitting scheme; pass None, "
        "workbench.NoCheckpointing(), workbench.CheckpointEvery(k) or "
        "workbench.BinomialCheckpointing(checkpoints) (diffrax adjoints such as "
        "diffrax.BacksolveAdjoint() go with diffrax solvers)."
    )
