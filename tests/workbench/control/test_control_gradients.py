"""The gradient methods of training as optimal control: the exact discrete gradient against
central differences and across checkpoint policies, the continuous adjoint's convergence to it
at the scheme's order (splitting path and diffrax's BacksolveAdjoint), and the method of
successive approximations' first step."""

import chex
import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.control as wbc
from workbench.control._certificate import RefinementAccuracy

from helpers import randomize_head, tiny_data, tiny_model, train, well_conditioned

# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_dto_gradient_matches_central_differences(getkey, rng):
    """float64: the directional derivative of J along random directions, from the gradient and
    from central differences, agree to a relative 1e-6 (Strang, 2 steps/layer,
    all costs on)."""
    model = randomize_head(
        tiny_model(getkey(), scheme=wb.schemes.Strang(), steps_per_layer=2), getkey()
    )
    data = tiny_data(rng, n=6)
    objective = wbc.Objective(
        wbc.CrossEntropy(),
        wbc.KineticEnergy(0.1),
        (wbc.ControlNorm(1e-2), wbc.ControlSmoothness(1e-2)),
    )
    xs, ys = jnp.asarray(data.inputs), jnp.asarray(data.targets)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    # Jitted once: the seven evaluations of J share one program (eagerly, each would compile
    # its own scan).
    J = jax.jit(lambda p: objective(eqx.combine(p, static), xs, ys)[0])
    (value, _), grad = wbc.DiscretizeThenOptimize().value_and_direction(objective, model, xs, ys)
    np.testing.assert_allclose(float(value), float(J(params)), rtol=1e-14)
    leaves, treedef = jax.tree.flatten(params)
    gleaves = jax.tree.leaves(eqx.filter(grad, eqx.is_inexact_array))
    for _ in range(3):
        direction = [jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in leaves]
        exact = sum(float(jnp.vdot(g, v)) for g, v in zip(gleaves, direction))
        # The class token starts near zero, so its LayerNorm has a large curvature: the central
        # difference's O(h²) error is ≈ 5e5 h² relative here, and round-off ≈ 1e-16 J/(h J').
        h = 1e-7
        at = lambda s: float(
            J(jax.tree.unflatten(treedef, [x + s * v for x, v in zip(leaves, direction)]))
        )
        fd = (at(h) - at(-h)) / (2 * h)
        assert abs(fd - exact) <= 1e-6 * abs(exact), (fd, exact)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme, ladder, order, kinetic",
    [
        (wb.schemes.LieTrotter(), (8, 16, 32), 1, True),
        (wb.schemes.Strang(), (4, 8, 16), 2, True),
        (wb.schemes.Suzuki4(), (2, 4), 4, False),
    ],
)
def test_continuous_adjoint_converges_to_the_discrete_gradient_at_the_scheme_order(
    rng, scheme, ladder, order, kinetic
):
    """OptimizeThenDiscretize (the costate solved backward by the scheme) differs from the exact
    discrete gradient by O(τ^p): observed orders within 0.3 of the scheme's. (The discrete
    kinetic cost is a second-order quadrature of ∫‖u_t‖², so with it the gap is O(τ²) at best:
    the fourth-order case runs without it.)"""
    key = jax.random.key(3)
    data = tiny_data(rng, n=1)
    xs, ys = jnp.asarray(data.inputs), jnp.asarray(data.targets)
    objective = wbc.Objective(
        kinetic=wbc.KineticEnergy(0.1) if kinetic else None, controls=(wbc.ControlNorm(1e-2),)
    )
    errors = []
    for k in ladder:
        model = tiny_model(key, scheme=scheme, steps_per_layer=k, layers=1)
        model = well_conditioned(randomize_head(model, jax.random.key(4)), jax.random.key(5))
        dto = eqx.filter_jit(wbc.DiscretizeThenOptimize().value_and_direction)
        otd = eqx.filter_jit(wbc.OptimizeThenDiscretize().value_and_direction)
        (v1, _), g1 = dto(objective, model, xs, ys)
        (v2, _), g2 = otd(objective, model, xs, ys)
        assert float(v1) == pytest.approx(float(v2), rel=1e-13)
        l1 = jax.tree.leaves(eqx.filter(g1, eqx.is_inexact_array))
        l2 = jax.tree.leaves(g2)
        assert len(l1) == len(l2)
        diff = np.sqrt(sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(l1, l2)))
        errors.append(diff / np.sqrt(sum(float(jnp.sum(a**2)) for a in l1)))
    orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    assert np.all(np.abs(orders - order) < 0.3), (errors, orders)


def test_msa_first_inner_step_moves_every_layer_against_the_gradient(getkey, rng):
    """Basic MSA (ρ = 0) with one Adam step of size η: the first Adam step is η g/(|g| + 1e-8),
    so the controls' displacement is that of g = ∂J/∂θ, entry by entry (the Hamiltonian's gradient in θ is
    the discrete gradient); the embedding and head take `outer_learning_rate` × their gradient."""
    model = randomize_head(
        tiny_model(getkey(), scheme=wb.schemes.Strang(), steps_per_layer=2), getkey()
    )
    data = tiny_data(rng, n=8)
    xs, ys = jnp.asarray(data.inputs), jnp.asarray(data.targets)
    objective = wbc.Objective(
        kinetic=wbc.KineticEnergy(0.1),
        controls=(wbc.ControlNorm(1e-3), wbc.ControlSmoothness(1e-3)),
    )
    (v1, _), g = eqx.filter_jit(wbc.DiscretizeThenOptimize().value_and_direction)(
        objective, model, xs, ys
    )
    msa = wbc.SuccessiveApproximations(
        rho=0.0, inner_steps=1, inner_learning_rate=1e-4, outer_learning_rate=0.5
    )
    (v2, _), d = eqx.filter_jit(msa.value_and_direction)(objective, model, xs, ys)
    assert float(v2) == pytest.approx(float(v1), rel=1e-13)
    for op_g, op_d in zip(g.transformer.equation.operators, d.transformer.equation.operators):
        for a, b in zip(
            jax.tree.leaves((op_g.term.values, op_g.projection.values)),
            jax.tree.leaves((op_d.term.values, op_d.projection.values)),
        ):
            a, b = np.asarray(a), np.asarray(b)
            big = np.abs(a) > 1e-9  # key biases: zero gradient (softmax shift invariance)
            # Adam's first step, bias-corrected: η g / (|g| + 1e-8).
            np.testing.assert_allclose(b[big], 1e-4 * a[big] / (np.abs(a[big]) + 1e-8), rtol=1e-8)
    for part in ("embedding", "head"):
        half = jax.tree.map(lambda a: 0.5 * a, getattr(g, part))
        chex.assert_trees_all_close(getattr(d, part), half, rtol=1e-10, atol=1e-14)


def test_extended_msa_trains(getkey, rng):
    import optax

    model = tiny_model(getkey(), dtype=jnp.float64)
    data = tiny_data(rng)
    msa = wbc.SuccessiveApproximations(
        rho=1.0, inner_steps=3, inner_learning_rate=5e-3, outer_learning_rate=0.05
    )
    res = train(
        model,
        data,
        steps=30,
        batch_size=8,
        log_every=5,
        method=msa,
        optimizer=optax.sgd(1.0),
        progress=False,
    )
    losses = [r["loss"] for r in res.history]
    assert losses[-1] < 0.8 * losses[0], losses


def test_certificate_measures_the_trained_discretization(getkey):
    """The certificate's numbers against independent computations: the error at the model's
    steps against a Dopri8 reference, the observed order of a smooth pre-norm model (Lie: 1),
    the stability limit from the same spectra, and a plan's verdict against its error."""
    import diffrax

    model = tiny_model(getkey(), layers=2, steps_per_layer=2)
    tr = model.transformer
    states = jax.random.normal(getkey(), (2, 5, 8), jnp.float64)
    plan = wb.analysis.DiscretizationPlan(
        method="strang",
        steps_per_layer=4,
        tolerance=1e-3,
        measured_error=0.0,
        evaluations=0,
        largest_stable_step=1.0,
        step=0.25,
        stable=True,
    )
    cert = wbc.certify(tr, states, plan=plan, ladder=(2, 4, 8, 16))
    ref = [wb.integrate(tr.equation, u, diffrax.Dopri8(), num_steps=2 * 128).u1 for u in states]
    ours = [tr.solve(u).u1 for u in states]
    error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(ours, ref))
    assert cert.error == pytest.approx(error, rel=1e-6)
    assert cert.reference_error_estimate < 1e-3 * cert.error
    assert abs(cert.observed_order - 1) < 0.3 and cert.expected_order == 1
    assert cert.order_as_expected and not cert.order_reduced and not cert.order_raised
    strang = [wb.integrate(tr.equation, u, wb.schemes.Strang(), num_steps=8).u1 for u in states]
    plan_error = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(strang, ref))
    assert cert.plan_error == pytest.approx(plan_error, rel=1e-6)
    assert cert.plan_holds == (plan_error <= 1e-3)
    assert cert.stable == (cert.step <= cert.largest_stable_step)
    assert cert.num_decaying_eigenvalues > 0


def test_certificate_flags_an_order_off_the_schemes_either_way(getkey, monkeypatch):
    """The observed order is judged against the scheme's ± order_tolerance on both sides: a fit
    shifted up by 0.6 is `order_raised` (reported, `consistent` still decided by the accuracy),
    shifted down by 0.6 is `order_reduced` (inconsistent, with the reason)."""
    import dataclasses

    from workbench.control import _certificate

    model = tiny_model(getkey(), layers=2, steps_per_layer=2)
    states = jax.random.normal(getkey(), (1, 5, 8), jnp.float64)
    accuracy = RefinementAccuracy(
        scheme="LieTrotter",
        steps_per_layer=2,
        accuracy=0.9,
        refined_steps_per_layer=[4],
        refined_accuracies=[0.9],
        second_scheme="Strang",
        second_steps_per_layer=4,
        second_accuracy=0.9,
        spread=0.0,
    )
    with pytest.raises(ValueError, match=r"order_tolerance=-0.1 must be a finite number >= 0"):
        wbc.certify(model.transformer, states, order_tolerance=-0.1)
    base = wbc.certify(model.transformer, states, ladder=(2, 4, 8, 16), accuracy=accuracy)
    assert base.order_as_expected and base.consistent, base.reasons
    real_fit = _certificate.fit_order
    for shift, raised, reduced in ((0.6, True, False), (-0.6, False, True)):

        def shifted(*args, shift=shift, **kwargs):
            fit = real_fit(*args, **kwargs)
            return dataclasses.replace(fit, order=fit.order + shift)

        monkeypatch.setattr(_certificate, "fit_order", shifted)
        cert = wbc.certify(model.transformer, states, ladder=(2, 4, 8, 16), accuracy=accuracy)
        assert cert.observed_order == pytest.approx(base.observed_order + shift, abs=1e-12)
        assert (cert.order_raised, cert.order_reduced) == (raised, reduced)
        assert not cert.order_as_expected and cert.to_dict()["order_as_expected"] is False
        assert cert.consistent == (not reduced)
        assert any("observed order" in r for r in cert.reasons) == reduced


def test_continuous_adjoint_refuses_post_norm(getkey, rng):
    model = tiny_model(getkey())
    tr = model.transformer
    post = eqx.tree_at(lambda t: t.equation.placement, tr, wb.PostNorm())
    model = eqx.tree_at(lambda m: m.transformer, model, post)
    data = tiny_data(rng, n=2)
    with pytest.raises(ValueError, match="needs a pre-norm equation"):
        wbc.OptimizeThenDiscretize().value_and_direction(
            wbc.Objective(), model, jnp.asarray(data.inputs), jnp.asarray(data.targets)
        )


@pytest.mark.slow
@pytest.mark.parametrize("adjoint", [wb.CheckpointEvery(3), wb.BinomialCheckpointing(2)])
def test_checkpoint_policies_give_the_same_gradient(getkey, rng, adjoint):
    model = randomize_head(
        tiny_model(getkey(), layers=3, scheme=wb.schemes.Strang(), steps_per_layer=2), getkey()
    )
    data = tiny_data(rng, n=4)
    xs, ys = jnp.asarray(data.inputs), jnp.asarray(data.targets)
    objective = wbc.Objective(kinetic=wbc.KineticEnergy(0.1))
    exact = eqx.filter_jit(wbc.DiscretizeThenOptimize().value_and_direction)
    (v0, _), g0 = exact(objective, model, xs, ys)
    (v1, _), g1 = eqx.filter_jit(wbc.DiscretizeThenOptimize(adjoint).value_and_direction)(
        objective, model, xs, ys
    )
    assert float(v0) == pytest.approx(float(v1), rel=1e-14)
    chex.assert_trees_all_close(g0, g1, rtol=1e-10, atol=1e-13)


def test_checkpoint_every_needs_a_divisor(getkey):
    model = tiny_model(getkey(), layers=2)
    u = model.embedding(jnp.zeros((4, 4)))
    with pytest.raises(
        ValueError, match="not a multiple of 3; choose every among the divisors of 2"
    ):
        wb.integrate(
            model.transformer.equation,
            u,
            wb.schemes.LieTrotter(),
            num_steps=2,
            adjoint=wb.CheckpointEvery(3),
        )
    with pytest.raises(ValueError, match="does not apply to a splitting scheme"):
        wb.integrate(
            model.transformer.equation,
            u,
            wb.schemes.LieTrotter(),
            num_steps=2,
            adjoint=diffrax.BacksolveAdjoint(),
        )
    with pytest.raises(ValueError, match="does not apply to a diffrax solver"):
        wb.integrate(
            model.transformer.equation,
            u,
            diffrax.Tsit5(),
            num_steps=2,
            adjoint=wb.CheckpointEvery(1),
        )


@pytest.mark.slow
def test_backsolve_adjoint_converges_to_the_discrete_gradient(getkey):
    """diffrax's continuous adjoint (the equation passed through `args`, so the controls get
    gradients) approaches the exact gradient of the discrete Tsit5 solve as the step shrinks."""
    model = tiny_model(getkey(), layers=2)
    # Generic tokens: BacksolveAdjoint re-solves the state backward in time, which is
    # ill-conditioned from the near-zero class token of an untrained embedding.
    u = jax.random.normal(getkey(), (5, 8), jnp.float64)
    eq = model.transformer.equation

    def loss(eq, k, adjoint):
        y = wb.integrate(eq, u, diffrax.Tsit5(), num_steps=2 * k, adjoint=adjoint).y
        return jnp.sum(jnp.sin(3 * y))

    gaps = []
    for k in (2, 4, 8):
        g_exact = eqx.filter_grad(loss)(eq, k, None)
        g_back = eqx.filter_grad(loss)(eq, k, diffrax.BacksolveAdjoint())
        gaps.append(
            max(
                float(jnp.max(jnp.abs(a - b)))
                for a, b in zip(jax.tree.leaves(g_exact), jax.tree.leaves(g_back))
            )
        )
    assert gaps[0] > 0 and gaps[1] < gaps[0] / 8 and gaps[2] < gaps[1] / 8, gaps
