"""Schemes are validated data, and they converge at their declared order (float64)."""

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb

from helpers import max_abs, small_encoder

S = wb.schemes


def test_tableaus_are_checked():
    assert [m.order() for m in (S.Euler(), S.Midpoint(), S.Heun(), S.RK4())] == [1, 2, 2, 4]
    with pytest.raises(ValueError, match="fails order-2"):
        S.ButcherTableau(a=((), (0.5,)), b=(0.5, 0.5), order=2)
    with pytest.raises(ValueError, match="satisfies order 2"):
        S.ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), order=1)
    with pytest.raises(ValueError, match="strictly lower-triangular"):
        S.ButcherTableau(a=((0.5,),), b=(1.0,), order=1)


def test_splitting_stages_are_consistent():
    assert S.LieTrotter().stages(2) == ((0, 1.0), (1, 1.0))
    assert S.Strang().stages(3) == ((0, 0.5), (1, 0.5), (2, 1.0), (1, 0.5), (0, 0.5))
    for scheme in (S.Yoshida4(), S.Suzuki4()):
        g = np.array(scheme.weights())
        assert abs(g.sum() - 1) < 1e-14 and abs((g**3).sum()) < 1e-13
        for m in (2, 3):
            totals = np.zeros(m)
            for k, a in scheme.stages(m):
                totals[k] += a
            np.testing.assert_allclose(totals, 1.0, atol=1e-14)
    assert [s.order() for s in (S.LieTrotter(), S.Strang(), S.Yoshida4(), S.Suzuki4())] == [
        1,
        2,
        4,
        4,
    ]


def test_inner_solver_must_match_the_order():
    with pytest.raises(ValueError, match="inner solver Euler has order 1 < the scheme's order 2"):
        S.Strang(inner=S.Euler())
    with pytest.raises(ValueError, match="order 2 < the scheme's order 4"):
        S.Yoshida4(inner=S.Midpoint())
    S.LieTrotter(inner=S.RK4())  # a more accurate inner solver is fine


def test_rk_orders_on_a_scalar_ode():
    # y' = -2ty + cos t, observed order of each tableau in float64.
    f = lambda t, y: -2 * t * y + jnp.cos(t)
    exact = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, a: f(t, y)),
        diffrax.Dopri8(),
        0.0,
        1.0,
        0.01,
        jnp.array(0.3),
        stepsize_controller=diffrax.PIDController(rtol=1e-14, atol=1e-14),
        max_steps=100_000,
    ).ys[-1]
    for method in (S.Euler(), S.Midpoint(), S.Heun(), S.RK4()):
        errs, hs = [], []
        for n in (8, 16, 32, 64):
            h = 1.0 / n
            y = jnp.array(0.3)
            for i in range(n):
                y = method.step(f, i * h, y, h)
            errs.append(abs(float(y - exact)))
            hs.append(h)
        slope = np.polyfit(np.log(hs), np.log(errs), 1)[0]
        assert abs(slope - method.order()) < 0.3, (type(method).__name__, slope)


def _pre_norm_model(rng):
    _, m = small_encoder(
        rng, d=8, heads=2, layers=2, dff=16, norm_first=True, activation="gelu", final_norm=True
    )
    return m


def _interpolated(eq):
    """The equation with its piecewise-constant controls made piecewise linear (`Interpolated`:
    continuous in t, kinks at the layer midpoints)."""
    ops = tuple(
        wb.Operator(wb.Interpolated(op.term.values), wb.Interpolated(op.projection.values))
        for op in eq.operators
    )
    return wb.Equation(ops, eq.placement, eq.output)


def _reference_solve(equation, u0):
    """Unsplit reference: Dopri8 at tolerance 1e-14, restarted at every layer (controls jump)."""
    term = diffrax.ODETerm(lambda t, u, args: equation.vector_field(t, u))
    u = u0
    for layer in range(equation.num_pieces):
        sol = diffrax.diffeqsolve(
            term,
            diffrax.Dopri8(),
            float(layer),
            float(layer + 1),
            0.05,
            u,
            stepsize_controller=diffrax.PIDController(rtol=1e-14, atol=1e-14),
            max_steps=100_000,
        )
        u = sol.ys[-1]
    return u


def _observed_order(model, u0, ref, scheme, ks):
    errs = []
    for k in ks:
        sol = wb.integrate(model.equation, u0, scheme, num_steps=model.num_layers * k)
        errs.append(max_abs(sol.u1, ref))
    return np.polyfit(np.log(1.0 / np.asarray(ks)), np.log(errs), 1)[0], errs


@pytest.fixture(scope="module")
def pre_norm_problem():
    rng = np.random.default_rng(7)
    model = _pre_norm_model(rng)
    u0 = jnp.asarray(rng.normal(size=(6, 8)))
    return model, u0, _reference_solve(model.equation, u0)


@pytest.mark.parametrize(
    "scheme, ks",
    [
        (S.LieTrotter(), (4, 8, 16, 32)),
        (S.Strang(), (4, 8, 16, 32)),
        (S.Yoshida4(), (4, 8, 16, 32)),
        (S.Suzuki4(), (4, 8, 16, 32)),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, eqx.Module) else None,
)
@pytest.mark.slow
def test_splitting_order_on_the_pre_norm_equation(scheme, ks, pre_norm_problem):
    model, u0, ref = pre_norm_problem
    slope, errs = _observed_order(model, u0, ref, scheme, ks)
    assert abs(slope - scheme.order()) < 0.3, (slope, errs)
    assert errs[-1] > 1e-13, "hit the round-off floor: the fit would be meaningless"


@pytest.mark.slow
def test_splitting_order_with_interpolated_controls(rng):
    # Time-dependent θ(t): the clock advances only in operator 0's substeps (augmented system).
    eq = _interpolated(_pre_norm_model(rng).equation)
    u0 = jnp.asarray(rng.normal(size=(6, 8)))
    # Kinks of the piecewise-linear θ sit at layer midpoints: reference restarts there.
    term = diffrax.ODETerm(lambda t, u, args: eq.vector_field(t, u))
    u = u0
    for a, b in ((0.0, 0.5), (0.5, 1.5), (1.5, 2.0)):
        u = diffrax.diffeqsolve(
            term,
            diffrax.Dopri8(),
            a,
            b,
            0.05,
            u,
            stepsize_controller=diffrax.PIDController(rtol=1e-14, atol=1e-14),
            max_steps=100_000,
        ).ys[-1]
    # (Yoshida4's clock leaves the step and crosses the kinks of the piecewise-linear θ, which
    # costs it its order: see the next test.)
    for scheme, ks in ((S.LieTrotter(), (4, 8, 16, 32)), (S.Strang(), (4, 8, 16, 32))):
        errs = [max_abs(wb.integrate(eq, u0, scheme, num_steps=2 * k).u1, u) for k in ks]
        slope = np.polyfit(np.log(1.0 / np.asarray(ks)), np.log(errs), 1)[0]
        assert abs(slope - scheme.order()) < 0.3, (type(scheme).__name__, slope, errs)


@pytest.mark.parametrize("scheme", [S.Yoshida4(), S.Suzuki4()], ids=["yoshida4", "suzuki4"])
def test_a_composition_step_is_its_stages_left_to_right_compiled_once(scheme, rng):
    """`step` runs a composition as a `lax.scan` over its weights; it equals the sub-flows of
    `scheme.stages` applied one after the other (time-dependent controls, so the clock, which
    moves in operator 0's substeps, is checked too) to 1e-14 in float64, and its program holds
    the operators of one Strang step, not one per weight."""
    import jax

    eq = _interpolated(_pre_norm_model(rng).equation)
    u0 = jnp.asarray(rng.normal(size=(6, 8)))
    t, tau = 0.3, 0.4
    u, clock = u0, t
    for k, a in scheme.stages(len(eq.operators)):  # the unrolled definition
        u = eq.subflow(k, scheme.inner, clock, u, a * tau, None, clock_moves=(k == 0))
        clock = clock + a * tau if k == 0 else clock
    assert max_abs(wb.step(eq, scheme, t, u0, tau), u) <= 1e-14

    def dots(fn):
        jaxpr = jax.make_jaxpr(fn)(u0)
        return str(jaxpr).count("dot_general")

    one_strang = dots(lambda v: wb.step(eq, S.Strang(inner=scheme.inner), t, v, tau))
    assert dots(lambda v: wb.step(eq, scheme, t, v, tau)) == one_strang


@eqx.filter_jit
def _ladder_solve(equation, u0, scheme, num_steps):
    # num_steps is traced: one compilation for a whole ladder of step counts.
    return wb.integrate(equation, u0, scheme, num_steps=num_steps).u1


def _order_from_differences(equation, u0, scheme, ks):
    """Observed order from successive differences `u_k − u_2k` (no reference solution needed):
    they shrink like `k^-p` when the error does."""
    us = [_ladder_solve(equation, u0, scheme, jnp.asarray(equation.num_pieces * k)) for k in ks]
    diffs = [max_abs(a, b) for a, b in zip(us[:-1], us[1:])]
    return np.polyfit(np.log(1.0 / np.asarray(ks[:-1])), np.log(diffs), 1)[0], diffs


@pytest.mark.slow  # two compilations of a Yoshida4 ladder: about 8 s of CPU
def test_yoshida4_loses_its_order_with_interpolated_controls():
    # Same model, same start: piecewise-constant controls with steps aligned to layers give
    # order 4; piecewise-linear (Interpolated) controls, kinks at the layer midpoints and on step
    # boundaries (an even number of steps per layer), give about 2, because Yoshida4's negative
    # middle weight takes its clock to t + 1.35τ and t − 0.35τ, across the kinks.
    rng = np.random.default_rng(7)
    model = _pre_norm_model(rng)
    u0 = jnp.asarray(rng.normal(size=(6, 8)))
    eq = model.equation
    interpolated = _interpolated(eq)
    ks = (4, 8, 16, 32, 64)
    constant, diffs = _order_from_differences(eq, u0, S.Yoshida4(), ks)
    assert abs(constant - 4) < 0.3, (constant, diffs)
    linear, diffs = _order_from_differences(interpolated, u0, S.Yoshida4(), ks)
    assert linear < 3.5 and abs(linear - 2) < 0.3, (linear, diffs)
    assert diffs[-1] > 1e-12, "hit the round-off floor: the fit would be meaningless"


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
def test_rediscretize_lie_one_step_is_bit_for_bit(rng):
    for norm_first in (False, True):
        sd, m = small_encoder(rng, norm_first=norm_first, final_norm=True)
        u = jnp.asarray(rng.normal(size=(5, 12)))
        y = m(u)
        again = m.rediscretize(scheme=S.Strang(), steps_per_layer=4).rediscretize(
            scheme=S.LieTrotter(), steps_per_layer=1
        )
        np.testing.assert_array_equal(np.asarray(again(u)), np.asarray(y))
        direct = wb.architectures.direct_encoder(
            sd, np.asarray(u), num_heads=3, norm_first=norm_first
        )
        np.testing.assert_allclose(y, direct, atol=1e-12)


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Yoshida4, on purpose
def test_rediscretized_post_norm_stays_on_the_constraint_set(rng):
    # Post-norm: every step ends with the projection, whatever the scheme and step count.
    _, m = small_encoder(rng, norm_first=False)
    m2 = m.rediscretize(scheme=S.Yoshida4(), steps_per_layer=3)
    u = jnp.asarray(rng.normal(size=(5, 12)))
    sol = m2.solve(u, save_steps=True)
    assert sol.us.shape == (m.num_layers * 3, 5, 12)
    # Strang-based steps end with operator 0's sub-flow, hence on the set of its projection.
    norms = m.equation.operators[0].projection.values
    for step in range(sol.us.shape[0]):
        layer = step // 3
        w = (sol.us[step] - norms.bias[layer]) / norms.weight[layer]  # back to S1(0, 1) coordinates
        np.testing.assert_allclose(w.mean(-1), 0.0, atol=1e-12)
        # LayerNorm's ε: variance s²/(s² + ε), just below 1.
        assert float(jnp.max(jnp.abs(w.var(-1) - 1.0))) < 1e-4
