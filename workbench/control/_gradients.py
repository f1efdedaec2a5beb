r"""Ways to a descent direction for the controls, behind one interface.

A method maps `(objective, model, batch)` to `((J, aux), direction)`, `direction` with the
structure of the model's floating arrays, and names the optax transformation that applies it
(`optimizer`: the caller's for a gradient); `TrainStep` hands the direction to it.
"""

import abc

import equinox as eqx
import optax

from .._checkpointing import AbstractCheckpointing, check_checkpointing

__all__ = ["AbstractGradientMethod", "DiscretizeThenOptimize"]


class AbstractGradientMethod(eqx.Module):
    """Computes the objective and a descent direction on one batch."""

    @abc.abstractmethod
    def value_and_direction(self, objective, model, xs, ys):
        """`((J, aux), direction)` on the batch `(xs, ys)`."""

    @abc.abstractmethod
    def optimizer(self, proposed: optax.GradientTransformation) -> optax.GradientTransformation:
        """The optax transformation that applies this method's direction: `proposed` (the
        caller's optimizer) for a gradient; a method whose direction is already the update
        returns its own (`SuccessiveApproximations`: `optax.sgd(1.0)`)."""


class DiscretizeThenOptimize(AbstractGradientMethod):
    r"""The exact gradient of the discrete model: reverse-mode differentiation through the
    scheme's steps (backpropagation).

    `adjoint` chooses what the backward pass stores (`workbench.NoCheckpointing()`, the
    default; `CheckpointEvery(k)`; `BinomialCheckpointing(c)`): the gradient is the same, the
    memory and the recomputation differ.
    """

    adjoint: AbstractCheckpointing | None = None

    def __check_init__(self):
        check_checkpointing(self.adjoint)

    def optimizer(self, proposed: optax.GradientTransformation) -> optax.GradientTransformation:
        return proposed  # a gradient: applied by the caller's optimizer

    def value_and_direction(self, objective, model, xs, ys):
        kwargs = {} if self.adjoint is None else {"adjoint": self.adjoint}

        @eqx.filter_value_and_grad(has_aux=True)
        def value(m):
            return objective(m, xs, ys, kwargs)

        return value(model)
