r"""The method of successive approximations (Pontryagin's maximum principle; Li, Chen, Tai & E,
JMLR 2018), basic and extended, on the discrete model.

With the step map `Φ_n(u; θ_l) = workbench.step(…)` of step `n` (inside layer `l`) and the
per-step kinetic cost `c_n(u; θ) = (λ_K/n)‖Φ_n(u) − u‖²/τ`, one iteration is

1. forward: `u_{n+1} = Φ_n(u_n; θ)` for every example;
2. backward: the costate `q_N = ∇ℓ(u_N)`, `q_n = ∇_u H_n(u_n, q_{n+1}, θ)` with the step
   Hamiltonian `H_n(u, q, θ) = q·Φ_n(u; θ) + c_n(u; θ)` (a `jax.vjp` of the step map);
3. for every layer `l` at once (`jax.vmap` over layers), `inner_steps` optax steps decreasing

$$\tilde H_l(θ) = \operatorname{mean}_i \sum_{n\in l}\Big[H_n(u^i_n, q^i_{n+1}, θ)
  + \tfrac{ρ}{2}\|u^i_{n+1} - Φ_n(u^i_n; θ)\|^2
  + \tfrac{ρ}{2}\|q^i_n - ∇_u H_n(u^i_n, q^i_{n+1}, θ)\|^2\Big] + C\big(θ^{(l)}\big),$$

   from the current θ (`ρ = 0`: the basic MSA; `ρ > 0`: the extended MSA, whose penalties keep
   the new controls where the forward and backward equations still hold). `C = Σ_c c` is the
   sum of the objective's control costs (any `AbstractControlCost`, evaluated by its own
   `__call__`), at `θ^{(l)} = (θ̄_1, …, θ̄_{l−1}, θ, θ̄_{l+1}, …, θ̄_L)`: layer `l` replaced,
   the others at their current values θ̄. A layer-separable cost, `C(θ) = Σ_l c_l(θ_l)`
   (`ControlNorm`: `c_l = λ_θ h‖θ_l‖²`), contributes exactly `c_l(θ) + const`; a cost that
   couples layers (`ControlSmoothness`) is minimized for each layer with its neighbours held
   (a Jacobi sweep). Either way `∇_θ \tilde H_l` at `θ = θ̄_l` is `∂J/∂θ_l`, the discrete
   gradient. A cost that has no derivative in the controls is refused by name.

The embedding, the output map and the head are not controls of the equation: they take a
gradient step of size `outer_learning_rate` (their exact gradients come from the same costates).
The direction returned to the trainer is the displacement `θ − θ_new` (and the scaled gradient
for the rest), so `optax.sgd(1.0)` applies exactly this iteration.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._controls import Constant
from .._equation import Equation, Operator
from .._integrate import integrate
from .._step import step
from ._adjoint import _add, _controls, _piece
from ._gradients import AbstractGradientMethod
from ._objective import accuracy

__all__ = ["SuccessiveApproximations"]


def _layer_equation(equation: Equation, ctrl) -> Equation:
    """The equation with every operator's controls frozen at `ctrl` (one layer's values)."""
    h = equation.piece_length
    ops = tuple(
        Operator(Constant(term, h), None if proj is None else Constant(proj, h))
        for term, proj in ctrl
    )
    return Equation(ops, equation.placement, equation.output)


def _with_controls(transformer, ctrl):
    """`transformer` with its operators' control values replaced by `ctrl` (the structure of
    `_controls(transformer.equation)`), so that a control cost can be evaluated on them."""

    def nodes(t):
        ops = t.equation.operators
        return [op.term.values for op in ops] + [
            op.projection.values for op in ops if op.projection is not None
        ]

    values = [term for term, _ in ctrl] + [proj for _, proj in ctrl if proj is not None]
    return eqx.tree_at(nodes, transformer, values)


def _check_costs(costs, transformer, theta, static):
    """Refuse, by name, a control cost that is not a real scalar or that cannot be
    differentiated with respect to the controls (the Hamiltonian step needs its gradient).
    Shapes only: `jax.eval_shape` computes nothing."""
    for c in costs:
        name = type(c).__name__
        try:
            out = eqx.filter_eval_shape(c, transformer)
        except Exception as err:  # a tracing failure, reported against the cost's name
            raise TypeError(
                f"SuccessiveApproximations: the control cost {name} cannot be evaluated on the "
                f"model's transformer: {type(err).__name__}: {err}"
            ) from err
        if getattr(out, "shape", None) != () or not jnp.issubdtype(out.dtype, jnp.floating):
            raise TypeError(
                f"SuccessiveApproximations: the control cost {name} returns {out!r}; an "
                "AbstractControlCost must return a real scalar."
            )
        try:
            eqx.filter_eval_shape(
                jax.grad(lambda th: c(_with_controls(transformer, eqx.combine(th, static)))),
                theta,
            )
        except Exception as err:
            raise TypeError(
                f"SuccessiveApproximations: the control cost {name} cannot be differentiated "
                "with respect to the controls (the MSA minimizes it inside the Hamiltonian "
                f"step; write it with jax.numpy): {type(err).__name__}: {err}"
            ) from err


def _positive(name, value, integer=False):
    ok = isinstance(value, (int, np.integer) if integer else (int, float)) and not isinstance(
        value, bool
    )
    if not ok or not value > 0 or not np.isfinite(value):
        kind = "a positive integer" if integer else "a finite number > 0"
        raise ValueError(f"SuccessiveApproximations.{name}={value!r} must be {kind}.")


class SuccessiveApproximations(AbstractGradientMethod):
    """Basic (`rho=0`) or extended (`rho>0`) method of successive approximations.

    **Arguments:**

    - `rho`: the extended MSA's penalty on the state and costate residuals (≥ 0).
    - `inner_steps`: optax steps of the per-layer Hamiltonian minimization.
    - `inner_learning_rate`: Adam's step for that minimization.
    - `outer_learning_rate`: the gradient step of the embedding, output map and head.

    Its direction is the update itself, so it applies it with `optax.sgd(1.0)` whatever
    optimizer the `TrainStep` was given (`optimizer`): its learning rates are its own fields.
    Piecewise-constant controls (a network's layers).
    """

    rho: float = eqx.field(static=True, default=1.0)
    inner_steps: int = eqx.field(static=True, default=5)
    inner_learning_rate: float = eqx.field(static=True, default=1e-3)
    outer_learning_rate: float = eqx.field(static=True, default=1e-3)

    def __check_init__(self):
        if not (isinstance(self.rho, (int, float)) and self.rho >= 0 and np.isfinite(self.rho)):
            raise ValueError(f"SuccessiveApproximations.rho={self.rho!r} must be a number >= 0.")
        _positive("inner_steps", self.inner_steps, integer=True)
        _positive("inner_learning_rate", self.inner_learning_rate)
        _positive("outer_learning_rate", self.outer_learning_rate)

    def optimizer(self, proposed: optax.GradientTransformation) -> optax.GradientTransformation:
        del proposed  # the direction is the displacement θ − θ_new: apply it as it is
        return optax.sgd(1.0)

    def value_and_direction(self, objective, model, xs, ys):
        if getattr(objective, "acceleration", None) is not None:
            raise ValueError(
                "SuccessiveApproximations does not take Objective.acceleration (a cost on the stored "
                "trajectory's second differences); train it with DiscretizeThenOptimize()."
            )
        tr = model.transformer
        eq, scheme = tr.equation, tr.scheme
        if not eq.is_piecewise_constant:
            raise ValueError(
                "SuccessiveApproximations needs piecewise-constant controls (one value per layer)."
            )
        k, L = tr.steps_per_layer, eq.num_pieces
        tau = eq.piece_length / k
        batch = xs.shape[0]
        kin = 0.0 if objective.kinetic is None else objective.kinetic.weight

        def step_cost(u, v):
            return kin * jnp.sum((v - u) ** 2) / (u.shape[0] * tau) if kin else 0.0

        def phi(ctrl, u):
            return step(_layer_equation(eq, ctrl), scheme, 0.0, u, tau)

        def hamiltonian(ctrl, u, q):
            v = phi(ctrl, u)
            return jnp.vdot(q, v) + step_cost(u, v)

        # 1. forward (every example), with the embedding's VJP for its gradient
        def parts(m):
            return jax.vmap(m.embedding)(xs), _controls(m.transformer.equation)

        (u0, controls), parts_vjp = eqx.filter_vjp(parts, model)
        kwargs = {"throw": False, "save_steps": True}
        if objective.kinetic is not None:
            kwargs["running_cost"] = objective.kinetic.step_cost
        sols = jax.vmap(lambda u: integrate(eq, u, scheme, num_steps=L * k, **kwargs))(u0)
        states = jnp.concatenate([u0[:, None], sols.us], axis=1)  # (B, N + 1, n, d)

        def terminal_loss(m, u1):
            logits = jax.vmap(lambda v: m.head(m.transformer.equation.output_map(v)))(u1)
            return jnp.mean(jax.vmap(objective.terminal)(logits, ys))

        loss, terminal_vjp = eqx.filter_vjp(terminal_loss, model, sols.u1)
        g_terminal, q_T = terminal_vjp(jnp.ones_like(loss))
        q_T = q_T * batch  # per-example costates ∂ℓ_i/∂u (the mean's 1/B undone)
        logits = jax.vmap(lambda v: model.head(eq.output_map(v)))(sols.u1)

        # 2. backward: q_n = ∇_u H_n(u_n, q_{n+1}, θ)
        layer_of = jnp.repeat(jnp.arange(L), k)

        def back(q, xs_n):
            u_n, layer = xs_n
            ctrl = _piece(controls, layer)
            q_n = jax.vmap(lambda u, qq: jax.grad(hamiltonian, argnums=1)(ctrl, u, qq))(u_n, q)
            return q_n, q

        q0, q_next = jax.lax.scan(
            back, q_T, (jnp.swapaxes(states[:, :-1], 0, 1), layer_of), reverse=True
        )
        # q_next[n] = q_{n+1}; costates q_n for the residual: q_n = [q_1..q_N] shifted
        q_prev = jnp.concatenate([q0[None], q_next[:-1]], axis=0)  # q_n, n = 0..N-1

        # 3. per-layer minimization of the extended Hamiltonian, all layers at once
        def by_layer(x):  # (N, ...) -> (L, k, ...)
            return x.reshape((L, k) + x.shape[1:])

        u_n = by_layer(jnp.swapaxes(states[:, :-1], 0, 1))  # (L, k, B, n, d)
        u_n1 = by_layer(jnp.swapaxes(states[:, 1:], 0, 1))
        q_n1, q_n = by_layer(q_next), by_layer(q_prev)
        rho = self.rho
        theta, static = eqx.partition(controls, eqx.is_inexact_array)
        costs = tuple(objective.controls)
        _check_costs(costs, tr, theta, static)

        def control_cost(transformer):
            return sum((c(transformer) for c in costs), jnp.zeros((), loss.dtype))

        def layer_objective(theta_l, layer, u, u1, q, q1):
            ctrl = eqx.combine(theta_l, static)

            def per_example(ue, u1e, qe, q1e):
                v = phi(ctrl, ue)
                value = jnp.vdot(q1e, v) + step_cost(ue, v)
                if rho:
                    grad_u = jax.grad(hamiltonian, argnums=1)(ctrl, ue, q1e)
                    value = value + 0.5 * rho * (
                        jnp.sum((u1e - v) ** 2) + jnp.sum((qe - grad_u) ** 2)
                    )
                return value

            per_step = jax.vmap(jax.vmap(per_example))(u, u1, q, q1)  # (k, B)
            total = jnp.sum(jnp.mean(per_step, axis=1))
            if costs:
                # C(θ^(l)): the current controls with layer `layer` replaced by θ_l.
                placed = jax.tree.map(lambda full, x: full.at[layer].set(x), theta, theta_l)
                total = total + control_cost(_with_controls(tr, eqx.combine(placed, static)))
            return total

        inner = optax.adam(self.inner_learning_rate)

        def minimize(theta_l, layer, u, u1, q, q1):
            state = inner.init(theta_l)

            def body(_, carry):
                th, st = carry
                g = jax.grad(layer_objective)(th, layer, u, u1, q, q1)
                upd, st = inner.update(g, st, th)
                return optax.apply_updates(th, upd), st

            return jax.lax.fori_loop(0, self.inner_steps, body, (theta_l, state))[0]

        new_theta = jax.vmap(minimize)(theta, jnp.arange(L), u_n, u_n1, q_n, q_n1)
        displacement = jax.tree.map(lambda a, b: a - b, theta, new_theta)

        # The embedding, output map and head: a gradient step (their exact gradients).
        zero_controls = jax.tree.map(jnp.zeros_like, theta)
        (g_parts,) = parts_vjp((q0 / batch, zero_controls))
        rest = _add(
            eqx.filter(g_parts, eqx.is_inexact_array), eqx.filter(g_terminal, eqx.is_inexact_array)
        )
        if costs:
            # A cost may also read parameters that are not controls (e.g. the output map): their
            # gradient joins the outer step (zero for ControlNorm / ControlSmoothness).
            frozen = eqx.combine(jax.lax.stop_gradient(theta), static)
            g_cost = eqx.filter_grad(lambda m: control_cost(_with_controls(m.transformer, frozen)))(
                model
            )
            rest = _add(rest, eqx.filter(g_cost, eqx.is_inexact_array))
        rest = jax.tree.map(lambda g: self.outer_learning_rate * g, rest)
        # Put the controls' displacement in place of their (zero) entries.
        _, controls_vjp = eqx.filter_vjp(lambda m: _controls(m.transformer.equation), model)
        (placed,) = controls_vjp(displacement)
        direction = _add(rest, eqx.filter(placed, eqx.is_inexact_array))

        kinetic = jnp.mean(sols.running_cost) if objective.kinetic is not None else 0.0 * loss
        control = control_cost(tr)
        aux = {
            "loss": loss,
            "kinetic": kinetic,
            "control": control,
            "accuracy": accuracy(logits, ys),
        }
        return (loss + kinetic + control, aux), direction
