"""diffrax on the continuous equation: observed orders (pre-norm; projected post-norm), iterates on
the constraint set, the penalty form's O(ε) distance and its stiffness, no recompilation across
step counts, solver statistics, and the errors for misuse."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

import workbench as wb
from workbench.architectures import Transformer

from helpers import small_encoder

# Step-count ladders (per 2-layer model) inside each method's asymptotic range, float64.
PRE_NORM = [
    (diffrax.Euler(), 1, [16, 22, 32, 46, 64]),
    (diffrax.Heun(), 2, [16, 22, 32, 46, 64]),
    (diffrax.Midpoint(), 2, [16, 22, 32, 46, 64]),
    (diffrax.Ralston(), 2, [16, 22, 32, 46, 64]),
    (diffrax.Bosh3(), 3, [16, 22, 32, 46, 64]),
    (wb.solvers.ClassicalRK4(), 4, [16, 22, 32, 46, 64]),
    (diffrax.Tsit5(), 5, [64, 76, 90, 108, 128]),
    (diffrax.Dopri5(), 5, [64, 76, 90, 108, 128]),
]


@pytest.fixture(scope="module")
def pre_norm():
    rng = np.random.default_rng(0)
    _, m = small_encoder(rng, d=16, heads=2, layers=2, dff=24, norm_first=True, activation="gelu")
    u0 = jnp.asarray(rng.standard_normal((6, 16)))
    # Reference: Dopri8 with 512 fixed steps per layer (error far below every ladder's).
    ref = wb.integrate(m.equation, u0, diffrax.Dopri8(), num_steps=1024).u1
    return m.equation, u0, ref


@pytest.fixture(scope="module")
def post_norm():
    rng = np.random.default_rng(1)
    _, m = small_encoder(rng, d=16, heads=2, layers=2, dff=24, norm_first=False, activation="gelu")
    u0 = jnp.asarray(rng.standard_normal((6, 16)))
    ref = wb.integrate(m.equation, u0, diffrax.Dopri8(), num_steps=1024).u1
    return m.equation, u0, ref


def _ladder_errors(equation, u0, ref, solver, ks, **kwargs):
    solve = jax.jit(lambda k: wb.integrate(equation, u0, solver, num_steps=k, **kwargs).u1)
    us = [solve(k) for k in ks]
    # One compilation for the whole ladder: the step count is a run-time value.
    assert solve._cache_size() == 1
    return [float(jnp.max(jnp.abs(u - ref))) for u in us], us


@pytest.mark.parametrize("solver,order,ks", PRE_NORM, ids=lambda x: type(x).__name__)
def test_observed_order_pre_norm(pre_norm, solver, order, ks):
    equation, u0, ref = pre_norm
    errors, _ = _ladder_errors(equation, u0, ref, solver, ks)
    fit = wb.analysis.fit_order(1.0 / np.asarray(ks), errors, asymptotic=False)
    assert abs(fit.order - order) <= 0.3, (fit.order, errors)


def test_dopri8_reaches_order_seven_before_the_floor(pre_norm):
    equation, u0, ref = pre_norm
    ks = [4, 6, 8, 10, 12]
    errors, _ = _ladder_errors(equation, u0, ref, diffrax.Dopri8(), ks)
    fit = wb.analysis.fit_order(1.0 / np.asarray(ks), errors, asymptotic=False)
    assert fit.order >= 7.0, (fit.order, errors)


@pytest.mark.parametrize(
    "solver,order",
    [(diffrax.Euler(), 1), (diffrax.Heun(), 2), (wb.solvers.ClassicalRK4(), 4)],
    ids=lambda x: type(x).__name__,
)
def test_projected_post_norm_order_and_constraint(post_norm, solver, order):
    equation, u0, ref = post_norm
    ks = [16, 22, 32, 46, 64]
    errors, us = _ladder_errors(equation, u0, ref, solver, ks)
    fit = wb.analysis.fit_order(1.0 / np.asarray(ks), errors, asymptotic=False)
    assert abs(fit.order - order) <= 0.3, (fit.order, errors)
    # Every iterate on S: the last layer's LayerNorm set {γ ⊙ w + β : mean w = 0, var w = 1}.
    ln = equation.operators[-1].projection.evaluate(1.5)
    for u in us:
        w = (u - ln.bias) / ln.weight
        assert float(jnp.max(jnp.abs(w.mean(-1)))) < 1e-12
        assert float(jnp.max(jnp.abs(w.var(-1) - 1))) < 1e-12


def test_projected_field_is_tangent_and_matches_the_orthogonal_projection_for_s1():
    """For S1 (constant γ, β) the tangent map of the retraction is the orthogonal projection."""
    rng = np.random.default_rng(2)
    p = wb.terms.LayerNormProjection.onto_s1(8, 0.3, 1.7)
    u = p(jnp.asarray(rng.standard_normal((5, 8))))
    v = jnp.asarray(rng.standard_normal((5, 8)))
    jvp = jax.jvp(p.retract, (u,), (v,))[1]
    np.testing.assert_allclose(jvp, p.tangent(u, v), atol=1e-13)
    np.testing.assert_allclose(p.retract(u), u, atol=1e-14)


@pytest.mark.slow
def test_penalty_converges_to_the_projected_ode_at_order_one(post_norm):
    equation, u0, ref = post_norm
    eps = np.array([1e-1, 1e-2, 1e-3])
    controller = diffrax.PIDController(rtol=1e-9, atol=1e-9)
    # Newton (not diffrax's default chord iteration): the penalty is nonlinear.
    solver = diffrax.Kvaerno5(root_finder=optx.Newton(rtol=1e-11, atol=1e-11))
    dist = [
        float(
            jnp.max(
                jnp.abs(
                    wb.integrate(
                        equation,
                        u0,
                        solver,
                        formulation=wb.Penalty(float(e)),
                        stepsize_controller=controller,
                        max_steps=100_000,
                    ).u1
                    - ref
                )
            )
        )
        for e in eps
    ]
    fit = wb.analysis.fit_order(eps, dist, asymptotic=False)
    assert abs(fit.order - 1.0) <= 0.2, (fit.order, dist)


@pytest.mark.slow
def test_imex_takes_far_fewer_steps_than_tsit5_on_the_stiff_penalty():
    rng = np.random.default_rng(3)
    _, m = small_encoder(rng, d=8, heads=2, layers=1, dff=8, norm_first=False, activation="gelu")
    u0 = jnp.asarray(rng.standard_normal((3, 8)))
    controller = diffrax.PIDController(rtol=1e-6, atol=1e-6)
    count = {}
    newton = optx.Newton(rtol=1e-8, atol=1e-8)
    solvers = (diffrax.KenCarp4(root_finder=newton), diffrax.Kvaerno5(root_finder=newton))
    for solver in (*solvers, diffrax.Tsit5()):
        sol = wb.integrate(
            m.equation,
            u0,
            solver,
            formulation=wb.Penalty(1e-5),
            stepsize_controller=controller,
            max_steps=200_000,
        )
        count[type(solver).__name__] = int(sol.stats["num_steps"])
    assert count["Tsit5"] >= 20 * count["KenCarp4"], count
    assert count["Tsit5"] >= 20 * count["Kvaerno5"], count


@pytest.mark.slow
def test_statistics_count_steps_and_evaluations(pre_norm):
    equation, u0, _ = pre_norm
    sol = wb.integrate(equation, u0, wb.solvers.ClassicalRK4(), num_steps=8)
    assert int(sol.stats["num_steps"]) == 8 and int(sol.stats["num_rejected_steps"]) == 0
    assert int(sol.stats["num_evaluations"]) == 4 * 8
    # Tsit5 is first-same-as-last: 6 new stages per step plus one per layer restart.
    sol = wb.integrate(equation, u0, diffrax.Tsit5(), num_steps=8)
    assert int(sol.stats["num_evaluations"]) == 6 * 8 + 2
    adaptive = wb.integrate(
        equation,
        u0,
        diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
    )
    s = adaptive.stats
    assert int(s["num_steps"]) == int(s["num_accepted_steps"]) + int(s["num_rejected_steps"])


def test_diffrax_matches_the_splitting_path_for_euler_one_step_per_layer(pre_norm):
    """Euler on the unsplit pre-norm field with τ = 1 is `u + A(P u) + F(P u)` per layer, which the
    Lie splitting with Euler sub-flows is not; but with one operator they coincide. Compare instead
    diffrax's RK4 with the workbench's own RK4 step on the full field."""
    equation, u0, _ = pre_norm
    sol = wb.integrate(equation, u0, wb.solvers.ClassicalRK4(), num_steps=4).u1
    rk = wb.schemes.RK4()
    u = u0
    for layer in range(2):
        local = equation.localize(layer)
        for i in range(2):
            t = layer + 0.5 * i
            u = rk.step(lambda s, v: local.vector_field(s, v), t, u, 0.5)
    np.testing.assert_allclose(sol, u, rtol=1e-13, atol=1e-13)


def test_throw_false_reports_the_failing_layer(pre_norm):
    equation, u0, _ = pre_norm
    sol = wb.integrate(
        equation,
        u0,
        diffrax.Tsit5(),
        stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
        max_steps=3,
        throw=False,
    )
    assert int(sol.stats["failed_piece"]) == 0
    assert sol.result == wb.RESULTS.max_steps_reached
    assert "raise max_steps" in wb.RESULTS[sol.result]
    with pytest.raises(eqx.EquinoxRuntimeError, match="failed on layer 0"):
        wb.integrate(
            equation,
            u0,
            diffrax.Tsit5(),
            stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
            max_steps=3,
        )


def test_errors_for_misuse(pre_norm, post_norm):
    eq_pre, u0, _ = pre_norm
    eq_post, _, _ = post_norm
    pid = diffrax.PIDController(rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="IMEX solver"):
        wb.integrate(eq_pre, u0, diffrax.KenCarp4(), stepsize_controller=pid)
    with pytest.raises(ValueError, match="no error estimate"):
        wb.integrate(eq_pre, u0, wb.solvers.ClassicalRK4(), stepsize_controller=pid)
    with pytest.raises(ValueError, match="not both"):
        wb.integrate(eq_pre, u0, diffrax.Tsit5(), num_steps=4, stepsize_controller=pid)
    with pytest.raises(ValueError, match="pass num_steps= .* or an adaptive"):
        wb.integrate(eq_pre, u0, diffrax.Tsit5())
    with pytest.raises(ValueError, match="rtol=0.0 must be a number > 0"):
        wb.integrate(
            eq_pre,
            u0,
            diffrax.Tsit5(),
            stepsize_controller=diffrax.PIDController(rtol=0.0, atol=1e-6),
        )
    with pytest.raises(ValueError, match="Penalty.epsilon=-1"):
        wb.Penalty(-1.0)
    with pytest.raises(ValueError, match="needs a post-norm equation"):
        wb.integrate(eq_pre, u0, diffrax.Tsit5(), num_steps=4, formulation=wb.Projected())
    with pytest.raises(ValueError, match="ignores the constraints"):
        wb.integrate(eq_post, u0, diffrax.Tsit5(), num_steps=4, formulation=wb.Natural())
    with pytest.raises(ValueError, match="multiple of the number of layers"):
        wb.integrate(eq_pre, u0, diffrax.Tsit5(), num_steps=3)
    with pytest.raises(ValueError, match="neither a splitting scheme nor a diffrax solver"):
        wb.integrate(eq_pre, u0, "rk4", num_steps=4)
    with pytest.raises(ValueError, match="apply to diffrax solvers only|applies to diffrax"):
        wb.integrate(eq_pre, u0, wb.schemes.Strang(), num_steps=4, stepsize_controller=pid)


@pytest.mark.parametrize(
    "solver,formulation",
    [
        (diffrax.Tsit5(), None),
        (wb.solvers.ClassicalRK4(), None),
        (diffrax.Heun(), "post"),
        (diffrax.Tsit5(), wb.Penalty(0.1)),
        (diffrax.Euler(), "continuous"),
        (diffrax.Dopri5(), "continuous"),
    ],
    ids=[
        "tsit5",
        "rk4",
        "heun-projected",
        "tsit5-penalty",
        "euler-continuous",
        "dopri5-continuous",
    ],
)
def test_a_run_time_step_count_is_diffeqsolves_arithmetic_without_a_callback(
    pre_norm, post_norm, solver, formulation
):
    """With a traced `num_steps` and no adjoint, an explicit solver runs as a plain loop of its
    steps (`_fixed_steps_forward`): bit for bit the state, step and evaluation counts of
    `diffeqsolve` with `ConstantStepSize` (which an explicit adjoint still takes), piecewise
    and continuous controls alike (their step times as ConstantStepSize places them), and,
    with `throw=False`, a program with no call back to Python."""
    import workbench.control as wbc

    post = formulation == "post" or isinstance(formulation, wb.Penalty)
    equation, u0, _ = post_norm if post else pre_norm
    if formulation == "continuous":
        equation = wbc.interpolate_controls(Transformer(equation)).equation
    kwargs = {"formulation": formulation} if isinstance(formulation, wb.Penalty) else {}
    solve = eqx.filter_jit(
        lambda k, adjoint: wb.integrate(
            equation, u0, solver, num_steps=k, throw=False, adjoint=adjoint, **kwargs
        )
    )
    for k in (2, 6):
        light = solve(jnp.asarray(k), None)
        full = solve(jnp.asarray(k), diffrax.RecursiveCheckpointAdjoint())
        np.testing.assert_array_equal(np.asarray(light.u1), np.asarray(full.u1))
        for name in ("num_steps", "num_evaluations", "num_rejected_steps"):
            assert int(light.stats[name]) == int(full.stats[name]), name
        assert light.result == full.result == wb.RESULTS.successful
    assert "callback" not in solve.lower(jnp.asarray(2), None).as_text()
    assert "callback" in solve.lower(jnp.asarray(2), diffrax.RecursiveCheckpointAdjoint()).as_text()


def test_a_run_time_step_count_reports_bad_counts_and_the_first_bad_layer(pre_norm):
    """The loop of a traced step count: a count off the layers is `invalid_num_steps` (raised
    with `throw=True`), one above `max_steps` per layer `max_steps_reached`, and a NaN that
    enters in layer 1 is reported there."""
    equation, u0, _ = pre_norm
    solve = eqx.filter_jit(
        lambda u, k, throw: wb.integrate(
            equation, u, diffrax.Tsit5(), num_steps=k, throw=throw, max_steps=4
        )
    )
    assert solve(u0, jnp.asarray(3), False).result == wb.RESULTS.invalid_num_steps
    assert solve(u0, jnp.asarray(10), False).result == wb.RESULTS.max_steps_reached
    assert solve(u0, jnp.asarray(8), False).result == wb.RESULTS.successful
    with pytest.raises(eqx.EquinoxRuntimeError, match=r"multiple of the number of layers \(2\)"):
        solve(u0, jnp.asarray(3), True)
    # A NaN in layer 1's output bias: the state is finite after layer 0, not after layer 1.
    broken = eqx.tree_at(
        lambda e: e.operators[0].term.values.output_bias,
        equation,
        equation.operators[0].term.values.output_bias.at[1, 0].set(jnp.nan),
    )
    sol = eqx.filter_jit(
        lambda k: wb.integrate(broken, u0, diffrax.Tsit5(), num_steps=k, throw=False)
    )(jnp.asarray(4))
    assert sol.result == wb.RESULTS.nonfinite_state
    assert int(sol.first_nonfinite_step) == 1


@pytest.mark.slow
def test_traced_step_count_for_splitting_schemes_compiles_once(pre_norm):
    equation, u0, _ = pre_norm
    scheme = wb.schemes.Strang()
    solve = jax.jit(lambda k: wb.integrate(equation, u0, scheme, num_steps=k).u1)
    for k in (2, 4, 8):
        np.testing.assert_allclose(
            solve(k), wb.integrate(equation, u0, scheme, num_steps=k).u1, rtol=1e-13, atol=1e-13
        )
    assert solve._cache_size() == 1


@pytest.mark.slow
def test_vmap_over_inputs_equals_a_loop_with_throw_false(pre_norm):
    equation, u0, _ = pre_norm
    batch = jnp.stack([u0, 0.5 * u0 + 0.1])
    pid = diffrax.PIDController(rtol=1e-8, atol=1e-8)
    solve = lambda u: wb.integrate(
        equation, u, diffrax.Tsit5(), stepsize_controller=pid, throw=False
    )
    batched = jax.vmap(solve)(batch)
    for i in range(2):
        one = solve(batch[i])
        np.testing.assert_allclose(batched.u1[i], one.u1, rtol=1e-12, atol=1e-12)
        assert int(batched.stats["failed_piece"][i]) == -1
        assert one.result == wb.RESULTS.successful
    np.testing.assert_array_equal(batched.result == wb.RESULTS.successful, [True, True])


# --------------------------------------------------------------------------------------------
# Adaptive solves over the whole depth: declared jumps, counted evaluations


_CALLS = []


class _CountedNatural(wb.AbstractFormulation):
    """`Natural()` whose field calls back to Python on every evaluation: the counter that
    `Solution.stats["num_evaluations"]` is checked against."""

    def check(self, equation):
        wb.Natural().check(equation)

    def terms(self, equation, mask, *, imex):
        def field(t, u, args):
            eq, m = args
            jax.debug.callback(lambda: _CALLS.append(None))
            return eq.vector_field(t, u, m)

        return diffrax.ODETerm(field)


@pytest.fixture(scope="module")
def three_bases():
    """One pre-norm 3-layer model in three bases: its layers (piecewise constant, jumps at
    t = 1, 2), piecewise linear through them, and their projection on Legendre degree ≤ 2."""
    import workbench.control as wbc

    m = wbc.random_transformer(
        jax.random.PRNGKey(3),
        d=8,
        num_heads=2,
        num_layers=3,
        hidden=12,
        output_scale=1.0,
        dtype=jnp.float64,
    )
    u0 = jax.random.normal(jax.random.PRNGKey(4), (5, 8), jnp.float64)
    equations = {
        "piecewise": m.equation,
        "interpolated": wbc.interpolate_controls(m).equation,
        "legendre": wb.to_basis(m, wb.LegendreBasis(2)).equation,
    }
    return equations, u0


@pytest.mark.parametrize("basis", ["piecewise", "interpolated", "legendre"])
@pytest.mark.parametrize(
    "solver", [diffrax.Bosh3(), diffrax.Heun(), diffrax.Tsit5()], ids=lambda s: type(s).__name__
)
def test_reported_evaluations_are_the_field_calls(three_bases, basis, solver):
    """`stats["num_evaluations"]` equals a counter of the field's calls (a call back to Python
    per evaluation, one unbatched solve), exactly: fixed steps; adaptive with diffrax's first
    step (`dt0=None`, which evaluates nothing: see `_CountedController`); and adaptive from a
    first step of the whole depth, which is rejected and retried (a first-same-as-last solver
    evaluates its first stage on every retry of a first step, and again after every declared
    jump of the piecewise-constant controls)."""
    equations, u0 = three_bases
    equation = equations[basis]
    pid = diffrax.PIDController(rtol=1e-6, atol=1e-6)
    runs = {
        "fixed": {"num_steps": 6},
        "adaptive": {"stepsize_controller": pid},
        "adaptive, dt0 = T": {"stepsize_controller": pid, "dt0": 3.0},
    }
    for name, kwargs in runs.items():
        _CALLS.clear()
        sol = wb.integrate(equation, u0, solver, formulation=_CountedNatural(), **kwargs)
        jax.effects_barrier()
        assert int(sol.stats["num_evaluations"]) == len(_CALLS) > 0, name
    # The last run exercised the retries: its first step (all of [0, T], clipped to the first
    # layer where the controls jump) was rejected at least once.
    assert int(sol.stats["num_rejected_steps"]) >= 1
    if basis == "piecewise" and not isinstance(solver, diffrax.Heun):  # FSAL, jumps restart
        steps, s = int(sol.stats["num_steps"]), solver.tableau.num_stages
        assert len(_CALLS) >= (s - 1) * steps + 3  # the first stage at 0, 1⁺ and 2⁺


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64], ids=["float32", "float64"])
def test_declared_jumps_are_the_first_float_of_each_layer(dtype):
    """`layer_starts` gives, for each boundary `l h`, the float at which the controls' own
    `piece_index` turns to `l`: the float below it reads layer `l − 1`. The rounded `fl(l h)`
    is not that float for some boundaries of these `h` (so the test can tell them apart), and
    a step that ended below it could evaluate the next layer's weights."""
    from workbench._integrate_diffrax import layer_starts

    lower = lambda t: jnp.nextafter(t, jnp.asarray(-jnp.inf, dtype))
    misplaced = 0
    for h in (0.1, 0.3, 1 / 3, 0.7, 1.1, 2 / 7):
        control = wb.PiecewiseConstant({"w": jnp.zeros((40, 2), dtype)}, h)
        layers = np.arange(1, 40)
        starts = jax.jit(lambda: layer_starts(control, dtype))()
        index = jax.jit(lambda t: control.piece_index(t))
        assert starts.dtype == dtype
        np.testing.assert_array_equal(index(starts), layers)
        np.testing.assert_array_equal(index(lower(starts)), layers - 1)
        rounded = jnp.arange(1, 40, dtype=dtype) * jnp.asarray(h, dtype)
        misplaced += int(jnp.sum(index(lower(rounded)) != layers - 1))
        misplaced += int(jnp.sum(index(jnp.nextafter(rounded, jnp.inf)) != layers))
        ulps = np.abs(np.asarray(starts) - np.asarray(rounded)) / np.spacing(np.asarray(rounded))
        assert ulps.max() <= 2
    assert misplaced > 0


def test_one_adaptive_solve_steps_to_every_jump_and_matches_the_layers(three_bases):
    """Layers of length h = 0.3 (not a power of two): the adaptive solve over [0, T] ends a
    step next to every layer start (the jumps were declared) and matches a
    layer-by-layer Dopri8 solve of 64 steps per layer to 1e-8 at tolerance 1e-10; a NaN in
    layer 1's weights fails the solve in layer 1, reported there (value and message)."""
    from workbench._integrate_diffrax import layer_starts

    equations, u0 = three_bases
    eq = equations["piecewise"]
    h = 0.3
    ops = tuple(
        wb.Operator(
            wb.PiecewiseConstant(op.term.values, h),
            None if op.projection is None else wb.PiecewiseConstant(op.projection.values, h),
        )
        for op in eq.operators
    )
    eq = wb.Equation(ops, eq.placement, eq.output)
    ref = wb.integrate(eq, u0, diffrax.Dopri8(), num_steps=3 * 64).u1
    pid = diffrax.PIDController(rtol=1e-10, atol=1e-10)
    sol = wb.integrate(eq, u0, diffrax.Tsit5(), stepsize_controller=pid, dt0=h)
    assert float(jnp.max(jnp.abs(sol.u1 - ref))) < 1e-8
    steps = wb.analysis.adaptive_steps(eq, u0, solver=diffrax.Tsit5(), rtol=1e-10, atol=1e-10)
    # diffrax records a step that ends below a jump at the float above it, where the next
    # step starts
    above = jnp.nextafter(layer_starts(eq.operators[0].term, jnp.float64), jnp.inf)
    assert set(np.asarray(above).tolist()) <= set(steps.times.tolist())
    assert steps.accepted == int(sol.stats["num_accepted_steps"])

    values = eq.operators[0].term.values
    broken = eqx.tree_at(
        lambda e: e.operators[0].term.values.output_bias,
        eq,
        values.output_bias.at[1, 0].set(jnp.nan),
    )
    failed = wb.integrate(
        broken, u0, diffrax.Tsit5(), stepsize_controller=pid, max_steps=64, throw=False
    )
    assert failed.result == wb.RESULTS.max_steps_reached
    assert int(failed.stats["failed_piece"]) == 1
    with pytest.raises(
        eqx.EquinoxRuntimeError, match=r"over t in \[0, 0.9\] failed on layer 1 \(t in \[0.3, 0.6\]"
    ):
        wb.integrate(broken, u0, diffrax.Tsit5(), stepsize_controller=pid, max_steps=64)
