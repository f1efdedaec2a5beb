r"""Optimize, then discretize: the continuous adjoint (costate) equation solved backward by the
model's own splitting scheme.

For `J = ℓ(head(u(T))) + ∫ L dt` with `u_t = f(u, θ) = Σ_k f_k(u, θ_k)` and the kinetic cost
`L = (λ_K/n)‖f‖²`, the costate `λ(t) = ∂J/∂u(t)` solves

$$λ_t = -(\partial_u f)^\top w,\qquad w = λ + \tfrac{2λ_K}{n} f,\qquad λ(T) = ∇_{u(T)}\,ℓ,$$

and the gradient with respect to the controls of layer `l` is
`∫_{layer l} (∂_θ f)^⊤ w dt`. The augmented system `(u, λ, g)' = Σ_k F_k` with
`F_k = (f_k, −(∂_u f_k)^⊤ w, −(∂_{θ_k} f_k)^⊤ w)` splits operator by operator like the equation
itself, so one step of the model's scheme with step `−τ`, started from the stored forward state
`u_{n+1}`, advances `(λ, g)` from `t_{n+1}` back to `t_n` with the scheme's order. The result
differs from the exact gradient of the discrete model (`DiscretizeThenOptimize`) by `O(τ^p)`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._equation import PreNorm
from .._integrate import integrate
from ..schemes._splitting import AbstractComposition
from ._gradients import AbstractGradientMethod
from ._objective import accuracy

__all__ = ["OptimizeThenDiscretize", "costate_gradient"]


def _controls(equation):
    """Per operator, the stacked `(term values, projection values or None)`."""
    return tuple(
        (op.term.values, None if op.projection is None else op.projection.values)
        for op in equation.operators
    )


def _piece(tree, i):
    return jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, tree)


def _zeros(tree):
    return jax.tree.map(lambda x: jnp.zeros_like(x) if eqx.is_inexact_array(x) else None, tree)


def _add(a, b):
    return jax.tree.map(lambda x, y: x + y, a, b)


def _check(model):
    tr = model.transformer
    eq = tr.equation
    if not isinstance(eq.placement, PreNorm):
        raise ValueError(
            "OptimizeThenDiscretize needs a pre-norm equation (a smooth field); on a post-norm "
            "equation the projections after each sub-flow have no continuous adjoint here: use "
            "DiscretizeThenOptimize()."
        )
    if not eq.is_piecewise_constant:
        raise ValueError(
            "OptimizeThenDiscretize needs piecewise-constant controls (a network's layers); use "
            "DiscretizeThenOptimize() for Interpolated controls."
        )


def costate_gradient(objective, model, x, y):
    """`(terminal loss, kinetic cost, prediction, gradient)` of one example by the continuous
    adjoint (see the module docstring); `gradient` has the structure of
    `eqx.filter(model, eqx.is_inexact_array)` and includes the control costs' exact gradient."""
    _check(model)
    tr = model.transformer
    eq, scheme = tr.equation, tr.scheme
    num_steps = eq.num_pieces * tr.steps_per_layer
    tau = eq.piece_length / tr.steps_per_layer
    stages = scheme.stages(len(eq.operators))
    rk = scheme.inner
    kinetic = 0.0 if objective.kinetic is None else objective.kinetic.weight

    def parts(m):
        return m.embedding(x), _controls(m.transformer.equation)

    (u0, controls), parts_vjp = eqx.filter_vjp(parts, model)
    kwargs = {"throw": False, "save_steps": True}
    if objective.kinetic is not None:
        kwargs["running_cost"] = objective.kinetic.step_cost
    sol = integrate(eq, u0, scheme, num_steps=num_steps, **kwargs)
    states = jnp.concatenate([u0[None], sol.us])

    def terminal_loss(m, u1):
        return objective.terminal(m.head(m.transformer.equation.output_map(u1)), y)

    loss, terminal_vjp = eqx.filter_vjp(terminal_loss, model, sol.u1)
    g_terminal, lam_T = terminal_vjp(jnp.ones_like(loss))
    prediction = model.head(eq.output_map(sol.u1))

    n = u0.shape[0]
    placement = eq.placement

    def field(k, ctrl, u):
        term, proj = ctrl
        return placement.field(term, proj, u, None)

    def backward_step(carry, xs):
        lam, stacked = carry
        u_next, piece = xs
        ctrl = _piece(controls, piece)

        def augmented(k):
            def F(s, state):
                del s
                u, lam_, g = state
                w = lam_
                if kinetic:
                    f_full = sum(field(j, ctrl[j], u) for j in range(len(ctrl)))
                    w = lam_ + (2.0 * kinetic / n) * f_full
                v, vjp = jax.vjp(lambda u_, c_: field(k, c_, u_), u, ctrl[k])
                du, dc = vjp(w)
                dg = tuple(
                    jax.tree.map(lambda a: -a, dc) if j == k else _zeros(ctrl[j])
                    for j in range(len(ctrl))
                )
                return v, -du, dg

            return F

        state = (u_next, lam, _zeros(ctrl))
        if table is None:
            for k, a in stages:
                state = rk.step(augmented(k), 0.0, state, -a * tau)
        else:  # a composition: one Strang step's sub-flows, scanned over the weights

            def strang(state, steps):
                for (k, _), h in zip(base, steps):
                    state = rk.step(augmented(k), 0.0, state, h)
                return state, None

            state, _ = jax.lax.scan(strang, state, table)
        _, lam, g = state
        stacked = jax.tree.map(lambda acc, gi: acc.at[piece].add(gi), stacked, g)
        return (lam, stacked), None

    table = None
    if isinstance(scheme, AbstractComposition):
        # As the forward step does (`workbench._step`): the composition's substeps as a table,
        # row j the Strang sub-flows' `−γ_j a_i τ` (products in float64, as the unrolled
        # `-a * tau` of Python floats), scanned, so the augmented sub-flows compile once, not
        # once per weight (Suzuki4: 3 sub-flows, not 15).
        base, fractions = scheme.substep_table(len(eq.operators))
        table = jnp.asarray(-fractions * np.float64(tau), u0.dtype)
    pieces = jnp.repeat(jnp.arange(eq.num_pieces), tr.steps_per_layer)
    (lam0, control_grads), _ = jax.lax.scan(
        backward_step, (lam_T, _zeros(controls)), (states[1:], pieces), reverse=True
    )
    (g_parts,) = parts_vjp((lam0, control_grads))
    grads = _add(
        eqx.filter(g_parts, eqx.is_inexact_array), eqx.filter(g_terminal, eqx.is_inexact_array)
    )
    cost = jnp.zeros((), u0.dtype) if objective.kinetic is None else sol.running_cost
    return loss, cost, prediction, grads


class OptimizeThenDiscretize(AbstractGradientMethod):
    r"""The continuous adjoint: the costate equation solved backward by the model's own
    splitting scheme (step `−τ`, from the stored forward states), the control gradient
    integrated along it (see `costate_gradient`). It approximates the gradient of the
    continuous problem at the scheme's order, so it differs from `DiscretizeThenOptimize` by
    `O(τ^p)` (the `adjoint-accuracy` study measures the order). Pre-norm equations with
    piecewise-constant controls."""

    def optimizer(self, proposed: optax.GradientTransformation) -> optax.GradientTransformation:
        return proposed  # a gradient: applied by the caller's optimizer

    def value_and_direction(self, objective, model, xs, ys):
        if getattr(objective, "acceleration", None) is not None:
            raise ValueError(
                "OptimizeThenDiscretize does not take Objective.acceleration (a cost on the stored "
                "trajectory's second differences); train it with DiscretizeThenOptimize()."
            )
        _check(model)
        losses, kinetic, predictions, grads = jax.vmap(
            lambda x, y: costate_gradient(objective, model, x, y)
        )(xs, ys)
        grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)

        def control_cost(m):
            return sum((c(m.transformer) for c in objective.controls), jnp.zeros((), losses.dtype))

        control, control_grads = eqx.filter_value_and_grad(control_cost)(model)
        grads = _add(grads, eqx.filter(control_grads, eqx.is_inexact_array))
        loss = jnp.mean(losses)
        total = loss + jnp.mean(kinetic) + control
        aux = {
            "loss": loss,
            "kinetic": jnp.mean(kinetic),
            "control": control,
            "accuracy": accuracy(predictions, ys),
        }
        return (total, aux), grads
