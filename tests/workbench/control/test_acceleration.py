"""`wbc.Acceleration`, the running cost `λ ∫ (1/n)‖u_tt‖² dt` (Kelly et al. 2020's R_2): its
discrete sum converges to the integral on an exact trajectory, the objective adds it to the
running cost from the solve's own states, and it is refused where it cannot be honoured."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.analysis as wba
import workbench.control as wbc


def test_the_discrete_cost_converges_to_the_integral_at_first_order():
    """u(t) = e^{a t} u0 sampled on N steps of [0, T]: u_tt = a² u, so the cost is
    λ a⁴ ‖u0‖² (e^{2aT} − 1) / (2a n). The error of the sum falls at order 1 (float64)."""
    with jax.enable_x64(True):
        a, t1, weight = -0.7, 3.0, 0.5
        u0 = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)))
        n = u0.shape[0]
        exact = weight * a**4 * float(jnp.sum(u0**2)) * (np.exp(2 * a * t1) - 1) / (2 * a * n)
        cost = wbc.Acceleration(weight)
        ns = np.array([16, 32, 64, 128, 256])
        errors = []
        for steps in ns:
            ts = jnp.arange(1, steps + 1) * (t1 / steps)
            us = jnp.exp(a * ts)[:, None, None] * u0
            errors.append(abs(float(cost.trajectory_cost(u0, us, t1)) - exact))
        fit = wba.fit_order(t1 / ns, np.asarray(errors), expected=1)
        assert abs(fit.order - 1) < 0.1, fit
        assert errors[-1] / exact < 0.02


def test_the_objective_adds_it_to_the_running_cost_from_the_solves_states():
    """Objective(kinetic, acceleration).per_example's running cost is the kinetic energy plus
    the second differences of the states `wb.integrate(..., save_steps=True)` computes."""
    with jax.enable_x64(True):
        k1, k2 = jax.random.split(jax.random.key(0))
        model = wbc.ControlledModel(
            wbc.PatchEmbedding((1, 8), 8, kernel_size=3, padding=1, key=k1, dtype=jnp.float64),
            wbc.random_transformer(
                k2,
                d=8,
                num_heads=2,
                num_layers=4,
                hidden=16,
                output_scale=1.0,
                dtype=jnp.float64,
                basis=wb.LegendreBasis(3),
            ).rediscretize(None, 7),
            wbc.ClassifierHead(8, 3, dtype=jnp.float64),
        )
        x = jnp.asarray(np.random.default_rng(1).normal(size=(1, 8)))
        objective = wbc.Objective(
            wbc.CrossEntropy(), wbc.KineticEnergy(0.3), acceleration=wbc.Acceleration(2.0)
        )
        _, running, _ = objective.per_example(model, x, jnp.asarray(1))
        u0 = model.embedding(x)
        eq = model.transformer.equation
        sol = wb.integrate(eq, u0, wb.schemes.LieTrotter(), num_steps=7, save_steps=True)
        states = np.concatenate([np.asarray(u0)[None], np.asarray(sol.us)])
        tau = eq.t1 / 7
        kinetic = 0.3 * sum(
            np.sum((states[k + 1] - states[k]) ** 2) / (u0.shape[0] * tau) for k in range(7)
        )
        second = states[2:] - 2 * states[1:-1] + states[:-2]
        acceleration = 2.0 * np.sum(second**2) / (u0.shape[0] * tau**3)
        np.testing.assert_allclose(float(running), kinetic + acceleration, rtol=1e-12)
        assert acceleration > 1e-3 * kinetic  # the term is not negligible here

        grads = jax.grad(lambda m: objective(m, x[None], jnp.asarray([1]))[0])(model)
        leaves = jax.tree.leaves(grads)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)


def test_bad_weights_and_methods_that_cannot_honour_it_are_refused():
    with pytest.raises(ValueError, match=r"Acceleration\.weight"):
        wbc.Acceleration(-1.0)
    with pytest.raises(ValueError, match="Objective.acceleration"):
        wbc.Objective(acceleration=0.1)
    objective = wbc.Objective(acceleration=wbc.Acceleration(0.1))
    for method in (wbc.OptimizeThenDiscretize(), wbc.SuccessiveApproximations()):
        with pytest.raises(ValueError, match="DiscretizeThenOptimize"):
            method.value_and_direction(objective, None, None, None)
