r"""The optimal-control objective: a terminal loss through the readout head plus running costs.

$$J(θ) = \frac1B \sum_i ℓ\big(\mathrm{head}(u_i(T)), y_i\big)
   + λ_K \int_0^T \tfrac1n \|u_t\|^2\,dt + λ_θ \int_0^T \|θ(t)\|^2\,dt
   + λ_s \int_0^T \|θ'(t)\|^2\,dt$$

subject to `u_i` solving the equation with controls θ (docs/control.md). The kinetic term is
summed in the same scan as the solve (`integrate(..., running_cost=)`); the control terms depend
on the controls only and are computed in closed form from the stacked layer values.
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from .._checks import positive_float
from .._controls import AbstractControl

__all__ = [
    "AbstractControlCost",
    "Acceleration",
    "AbstractTerminalLoss",
    "ControlNorm",
    "ControlSmoothness",
    "CrossEntropy",
    "KineticEnergy",
    "Objective",
]


def _check_weight(owner: str, weight) -> None:
    positive_float(f"{owner}.weight", weight, allow_zero=True)


class AbstractTerminalLoss(eqx.Module):
    """`ℓ(prediction, target)` for one example, a scalar."""

    @abc.abstractmethod
    def __call__(self, prediction, target): ...


class CrossEntropy(AbstractTerminalLoss):
    """Softmax cross-entropy with integer labels: one label (classification) or one per position
    (sequences; labels `< 0` are ignored, e.g. the prompt of a sequence task)."""

    def __call__(self, logits, labels):
        labels = jnp.asarray(labels)
        if labels.ndim == 0:
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        keep = labels >= 0
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
        return jnp.sum(jnp.where(keep, losses, 0)) / jnp.maximum(jnp.sum(keep), 1)


class KineticEnergy(eqx.Module):
    r"""`λ_K ∫ (1/n) ‖u_t‖² dt`, the kinetic (transport) cost of the token trajectories.

    Each step contributes `λ_K (1/n) ‖u_{k+1} − u_k‖² / τ`: the kinetic energy of the
    piecewise-linear path through the computed states (the midpoint rule for `∫‖u_t‖²`, second
    order), summed in the solve's own scan. With `LieTrotter`, `τ = 1` it is `λ_K` times the
    mean squared size of the network's residual updates.
    """

    weight: float = eqx.field(static=True, default=1.0)

    def __check_init__(self):
        _check_weight("KineticEnergy", self.weight)

    def step_cost(self, t, u, tau, u_next):
        del t
        n = u.shape[0]
        return self.weight * jnp.sum((u_next - u) ** 2) / (n * tau)


class Acceleration(eqx.Module):
    r"""`λ_A ∫ (1/n) ‖u_tt‖² dt`: the second derivative of the token trajectories (Kelly et al.,
    "Learning differential equations that are easy to solve", NeurIPS 2020: their `R_2`), a
    running cost that trains the flow to be easy for an adaptive solver, whose local error
    estimate is driven by `u_tt` (an embedded pair of orders 1 and 2 estimates `τ²‖u_tt‖/2`).

    On the solve's `N` steps of size `τ = T / N` it is the sum of the squared second differences
    of the computed states, `λ_A Σ_{k=1}^{N-1} (1/n) ‖u_{k+1} − 2u_k + u_{k−1}‖² / τ³`
    (`u_0` the initial state): the rectangle rule for the integral of the central difference
    quotient of `u_tt`, which converges to the integral at first order in `τ` on a smooth
    trajectory (tested). The training step keeps the states of the solve for it (the solve's
    `save_steps`); splitting schemes with a static step count only, and the exact gradient of
    the discrete model (`DiscretizeThenOptimize`). It is reported in the objective's running
    cost (`kinetic` in the metrics) together with the kinetic energy.
    """

    weight: float = eqx.field(static=True, default=1.0)

    def __check_init__(self):
        _check_weight("Acceleration", self.weight)

    def trajectory_cost(self, u0, us, t1):
        """The cost of the trajectory `u0, us[0], …, us[N-1]` over `[0, t1]`."""
        states = jnp.concatenate([u0[None], us])
        num_steps = us.shape[0]
        if num_steps < 2:
            return jnp.zeros((), u0.dtype)
        tau = t1 / num_steps
        second = states[2:] - 2 * states[1:-1] + states[:-2]
        n = u0.shape[0]
        return self.weight * jnp.sum(second**2) / (n * tau**3)


def _controls(transformer) -> list:
    """Every control of the equation (terms and projections)."""
    out = []
    for op in transformer.equation.operators:
        for c in (op.term, op.projection):
            if isinstance(c, AbstractControl):
                out.append(c)
    return out


class AbstractControlCost(eqx.Module):
    """A cost on the controls θ alone, `∫ L(θ, θ') dt`, in closed form."""

    @abc.abstractmethod
    def __call__(self, transformer): ...


class ControlNorm(AbstractControlCost):
    r"""`λ_θ ∫ ‖θ(t)‖² dt`, each control in its basis (`AbstractControl.norm_terms`):
    `λ_θ h Σ_l ‖θ_l‖²` for piecewise-constant controls (layer length `h`), the same sum for
    interpolated ones (their layer values), `λ_θ T Σ_k ‖c_k‖²` for Legendre coefficients."""

    weight: float = eqx.field(static=True, default=1e-4)

    def __check_init__(self):
        _check_weight("ControlNorm", self.weight)

    def __call__(self, transformer):
        total = sum(t for c in _controls(transformer) for t in c.norm_terms())
        return self.weight * total


class ControlSmoothness(AbstractControlCost):
    r"""`λ_s ∫ ‖θ'(t)‖² dt`, each control in its basis (`AbstractControl.smoothness_terms`):
    `λ_s Σ_l ‖θ_{l+1} − θ_l‖² / h`, exact for the piecewise-linear controls through the layer
    values (`Interpolated`), the same discrete sum for a network's piecewise-constant ones, and
    the exact integral `Σ_jk D_jk ⟨c_j, c_k⟩` for Legendre coefficients. It makes trained controls smooth in depth, what a network needs to
    be consistent with an ODE as the step shrinks."""

    weight: float = eqx.field(static=True, default=1e-3)

    def __check_init__(self):
        _check_weight("ControlSmoothness", self.weight)

    def __call__(self, transformer):
        total = sum(t for c in _controls(transformer) for t in c.smoothness_terms())
        return self.weight * total


class Objective(eqx.Module):
    """The training objective: `terminal` loss (mean over the batch) + `kinetic` (running, in
    the solve) + `controls` (closed form in θ).

    **Arguments:**

    - `terminal`: an `AbstractTerminalLoss`, `CrossEntropy()` by default.
    - `kinetic`: a `KineticEnergy` or `None`.
    - `controls`: a tuple of `AbstractControlCost` (`ControlNorm`, `ControlSmoothness`).
    - `acceleration`: an `Acceleration` (a running cost on `u_tt`, Kelly et al.) or `None`.
    """

    terminal: AbstractTerminalLoss = CrossEntropy()
    kinetic: KineticEnergy | None = None
    controls: tuple[AbstractControlCost, ...] = ()
    acceleration: Acceleration | None = None

    def __check_init__(self):
        if not isinstance(self.terminal, AbstractTerminalLoss):
            raise ValueError(f"Objective.terminal={self.terminal!r} must be e.g. CrossEntropy().")
        if self.kinetic is not None and not isinstance(self.kinetic, KineticEnergy):
            raise ValueError(
                f"Objective.kinetic={self.kinetic!r} must be None or KineticEnergy(λ)."
            )
        if self.acceleration is not None and not isinstance(self.acceleration, Acceleration):
            raise ValueError(
                f"Objective.acceleration={self.acceleration!r} must be None or Acceleration(λ)."
            )
        for c in self.controls:
            if not isinstance(c, AbstractControlCost):
                raise ValueError(
                    f"Objective.controls holds {c!r}; give ControlNorm(λ) / ControlSmoothness(λ)."
                )

    def per_example(self, model, x, y, solve_kwargs=None):
        """(terminal loss, kinetic cost, prediction) of one example. The solve does not raise
        on NaN/inf (`throw=False`): the trainer's guard reports the training step instead."""
        kwargs = {"throw": False, **(solve_kwargs or {})}
        if self.kinetic is not None:
            kwargs["running_cost"] = self.kinetic.step_cost
        if self.acceleration is not None:
            kwargs["save_steps"] = True
        sol = model.solve(x, **kwargs)
        prediction = model.head(sol.y)
        kinetic = sol.running_cost if self.kinetic is not None else jnp.zeros((), sol.y.dtype)
        if self.acceleration is not None:
            u0 = model.embedding(x)
            kinetic = kinetic + self.acceleration.trajectory_cost(
                u0, sol.us, model.transformer.equation.t1
            )
        return self.terminal(prediction, y), kinetic, prediction

    def __call__(self, model, xs, ys, solve_kwargs=None):
        """`(J, aux)` on a batch: `aux = {"loss", "kinetic", "control", "accuracy"}` (the
        terminal loss alone is `loss`)."""
        losses, kinetic, predictions = jax.vmap(
            lambda x, y: self.per_example(model, x, y, solve_kwargs)
        )(xs, ys)
        loss = jnp.mean(losses)
        control = sum((c(model.transformer) for c in self.controls), jnp.zeros((), loss.dtype))
        total = loss + jnp.mean(kinetic) + control
        return total, {
            "loss": loss,
            "kinetic": jnp.mean(kinetic),
            "control": control,
            "accuracy": accuracy(predictions, ys),
        }


def accuracy(logits, labels):
    """Fraction of correct argmax predictions (labels `< 0` ignored)."""
    labels = jnp.asarray(labels)
    keep = labels >= 0
    hit = (jnp.argmax(logits, -1) == labels) & keep
    return jnp.sum(hit) / jnp.maximum(jnp.sum(keep), 1)
