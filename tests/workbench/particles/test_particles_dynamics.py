"""Particles on the sphere (docs/particles.md): closed-form and ODE oracles, invariants, observed orders,
transforms (jit / vmap / dtype) and input errors. Float64 unless stated."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from workbench import particles as P

from helpers import max_abs

IVP = dict(method="DOP853", rtol=1e-12, atol=1e-12)


def _sphere(rng, n, d):
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _run_betas(cls, x0, betas, ts, dt, integrator=None):
    """`simulate` for several β at once (one compile): `(len(betas), len(ts), n, d)`."""
    integrator = P.ProjectedRK4() if integrator is None else integrator

    @jax.jit
    def run(betas, x0):
        return jax.vmap(
            lambda b: P.simulate(
                cls(b), x0, t1=float(ts[-1]), dt=dt, integrator=integrator, save_ts=ts
            )
        )(betas)

    return np.asarray(run(jnp.asarray(betas), jnp.asarray(x0)))


def _sa_numpy(x, beta, Q, K, V, normalized=True):
    """Independent loop reference of the (U)SA velocity with matrices."""
    n = x.shape[0]
    out = np.zeros_like(x)
    for i in range(n):
        s = np.array([beta * (Q @ x[i]) @ (K @ x[j]) for j in range(n)])
        a = np.exp(s - s.max()) / np.exp(s - s.max()).sum() if normalized else np.exp(s) / n
        f = sum(a[j] * (V @ x[j]) for j in range(n))
        out[i] = f - (x[i] @ f) * x[i]
    return out


# ---------------------------------------------------------------- oracles


@pytest.mark.parametrize("d", [2, 3, 7])
def test_two_particles_follow_the_scalar_ode(d, rng):
    # ρ = ⟨x1, x2⟩: SA ρ' = 2e^{βρ}(1−ρ²)/(e^β + e^{βρ}), USA ρ' = e^{βρ}(1−ρ²); β=0: tanh.
    betas = np.array([0.0, 0.5, 1.0, 4.0])
    ts = np.array([0.25, 1.0, 2.0, 3.0])
    x0 = _sphere(rng, 2, d)
    rho0 = float(x0[0] @ x0[1])
    rhs = {
        P.SA: lambda b: lambda t, r: 2 * np.exp(b * r) * (1 - r**2) / (np.exp(b) + np.exp(b * r)),
        P.USA: lambda b: lambda t, r: np.exp(b * r) * (1 - r**2),
    }
    for cls, f in rhs.items():
        xs = _run_betas(cls, x0, betas, ts, 1e-3)
        rho = np.einsum("btd,btd->bt", xs[:, :, 0], xs[:, :, 1])
        for k, b in enumerate(betas):
            ref = solve_ivp(f(b), (0, ts[-1]), [rho0], t_eval=ts, **IVP).y[0]
            err = np.max(np.abs(rho[k] - ref))
            assert err <= 1e-9, (cls.__name__, d, b, err)
        closed = np.tanh(ts + np.arctanh(rho0))
        assert np.max(np.abs(rho[0] - closed)) <= 1e-9, cls.__name__


@pytest.mark.parametrize("n, d", [(4, 6), (3, 3)])
def test_orthogonal_start_tracks_gamma(n, d, rng):
    # Thm 6.8: every off-diagonal Gram entry equals γ_β(t), γ(0) = 0.
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    x0 = q[:n]
    betas = np.array([0.5, 2.0])
    ts = np.array([0.5, 1.0, 2.0, 4.0])
    rhs = {
        P.SA: lambda b: (
            lambda t, g: (
                2
                * np.exp(b * g)
                * (1 - g)
                * ((n - 1) * g + 1)
                / (np.exp(b) + (n - 1) * np.exp(b * g))
            )
        ),
        P.USA: lambda b: lambda t, g: (2 / n) * np.exp(b * g) * (1 - g) * ((n - 1) * g + 1),
    }
    off = ~np.eye(n, dtype=bool)
    for cls, f in rhs.items():
        xs = _run_betas(cls, x0, betas, ts, 1e-3)
        gram = np.einsum("btid,btjd->btij", xs, xs)
        for k, b in enumerate(betas):
            gamma = solve_ivp(f(b), (0, ts[-1]), [0.0], t_eval=ts, **IVP).y[0]
            err = np.max(np.abs(gram[k][:, off] - gamma[:, None]))
            assert err <= 1e-9, (cls.__name__, b, err)


def test_angle_form_equals_cartesian_usa(rng):
    n, beta = 5, 1.5
    theta0 = rng.uniform(-np.pi, np.pi, size=n)
    x0 = np.asarray(P.from_angles(jnp.asarray(theta0)))
    np.testing.assert_allclose(np.asarray(P.to_angles(jnp.asarray(x0))), theta0, atol=1e-14)
    ts = np.array([0.5, 1.0, 3.0])
    xs = _run_betas(P.USA, x0, [beta], ts, 1e-3)[0]
    angle = P.AngleUSA(beta)
    vel = jax.jit(angle.velocity)
    sol = solve_ivp(
        lambda t, th: np.asarray(vel(jnp.asarray(th))),
        (0, ts[-1]),
        theta0,
        t_eval=ts,
        method="DOP853",
        rtol=1e-13,
        atol=1e-13,
    )
    cart = np.asarray(P.from_angles(jnp.asarray(sol.y.T)))
    assert np.max(np.abs(cart - xs)) <= 1e-10
    # The angle velocity is the Cartesian one in the tangent frame, and the energies agree.
    x = jnp.asarray(x0)
    frame = jnp.stack([-x[:, 1], x[:, 0]], axis=-1)
    v = P.USA(beta).velocity(x)
    assert max_abs(jnp.sum(v * frame, -1), angle.velocity(jnp.asarray(theta0))) <= 1e-14
    assert max_abs(v, angle.velocity(jnp.asarray(theta0))[:, None] * frame) <= 1e-14
    assert abs(float(angle.energy(jnp.asarray(theta0)) - P.interaction_energy(x, beta))) <= 1e-14


@pytest.mark.parametrize("beta", [0.3, 2.0])
def test_usa_is_n_times_the_riemannian_gradient_of_the_energy(beta, rng):
    n, d = 6, 4
    x = jnp.asarray(_sphere(rng, n, d))
    grad = jax.grad(P.interaction_energy)(x, beta)
    assert max_abs(P.USA(beta).velocity(x), P.tangent(x, n * grad)) <= 1e-12
    # The shifted energy E_β − 1/(2β) has the same gradient.
    grad_s = jax.grad(lambda x: P.interaction_energy(x, beta, shifted=True))(x)
    assert max_abs(grad, grad_s) <= 1e-12
    assert (
        abs(
            float(P.interaction_energy(x, beta) - P.interaction_energy(x, beta, shifted=True))
            - 1 / (2 * beta)
        )
        <= 1e-12
    )


def test_energy_at_small_beta():
    x = jnp.asarray(_sphere(np.random.default_rng(0), 5, 3))
    limit = 0.5 * float(jnp.sum(jnp.mean(x, 0) ** 2))
    assert abs(float(P.interaction_energy(x, 0.0, shifted=True)) - limit) <= 1e-15
    assert abs(float(P.interaction_energy(x, 1e-9, shifted=True)) - limit) <= 1e-8
    with pytest.raises(ValueError, match="diverges as β → 0"):
        P.interaction_energy(x, 0.0)


# ---------------------------------------------------------------- invariants


def test_energy_is_monotone_along_the_flows(rng):
    n, d, beta = 7, 3, 1.0
    x0 = _sphere(rng, n, d)
    ts = np.round(np.arange(0, 51) * 0.1, 12)
    energy = jax.vmap(lambda x: P.interaction_energy(x, beta))
    run = lambda dyn: energy(
        P.simulate(dyn, x0, t1=5.0, dt=0.01, integrator=P.ProjectedRK4(), save_ts=ts)
    )
    for dyn in (P.SA(beta), P.USA(beta)):
        e = np.asarray(run(dyn))
        assert np.all(np.diff(e) >= -1e-13) and e[-1] > e[0] + 1e-3, type(dyn).__name__
    e_rep = np.asarray(run(P.SA(beta, V=-jnp.eye(d))))
    assert np.all(np.diff(e_rep) <= 1e-13) and e_rep[-1] < e_rep[0] - 1e-3
    # `repulsive=True` is the same dynamics as V = −I.
    np.testing.assert_allclose(np.asarray(run(P.SA(beta, repulsive=True))), e_rep, atol=1e-14)
    e_rep_usa = np.asarray(run(P.USA(beta, repulsive=True)))
    assert np.all(np.diff(e_rep_usa) <= 1e-13) and e_rep_usa[-1] < e_rep_usa[0] - 1e-3


def test_sa_energy_rate_formula(rng):
    # dE/dt = (1/n) Σ_i ‖ẋ_i‖² ((1/n) Σ_k e^{β⟨x_i, x_k⟩}) along SA, vs a 4th-order finite
    # difference of E(x(t)) and vs the exact chain rule ⟨∇E, ẋ⟩.
    n, d, beta, h = 6, 3, 1.5, 0.01
    dyn = P.SA(beta)
    x0 = _sphere(rng, n, d)
    centres = np.array([0.5, 1.5])
    ts = np.round((centres[:, None] + h * np.array([-2, -1, 0, 1, 2])).ravel(), 12)
    xs = P.simulate(dyn, x0, t1=2.0, dt=1e-3, integrator=P.ProjectedRK4(), save_ts=ts)
    e = np.asarray(jax.vmap(lambda x: P.interaction_energy(x, beta))(xs)).reshape(2, 5)
    fd = (e[:, 0] - 8 * e[:, 1] + 8 * e[:, 3] - e[:, 4]) / (12 * h)
    x_mid = xs.reshape(2, 5, n, d)[:, 2]

    def formula(x):
        v = dyn.velocity(x)
        z = jnp.mean(jnp.exp(beta * x @ x.T), axis=-1)
        return jnp.mean(jnp.sum(v * v, -1) * z)

    rate = np.asarray(jax.vmap(formula)(x_mid))
    chain = np.asarray(
        jax.vmap(
            lambda x: jax.jvp(lambda y: P.interaction_energy(y, beta), (x,), (dyn.velocity(x),))[1]
        )(x_mid)
    )
    np.testing.assert_allclose(rate, chain, rtol=1e-12)
    np.testing.assert_allclose(rate, fd, rtol=1e-7)
    assert np.all(rate > 0)


def test_hemisphere_is_invariant(rng):
    n, d, beta = 8, 3, 1.0
    w = np.array([0.0, 0.0, 1.0])
    x0 = _sphere(rng, n, d)
    x0 = x0 * np.sign(x0 @ w)[:, None]
    ts = np.round(np.arange(0, 61) * 0.05, 12)
    for dyn in (P.SA(beta), P.USA(beta)):
        xs = P.simulate(dyn, x0, t1=3.0, dt=0.01, integrator=P.ProjectedRK4(), save_ts=ts)
        m = np.min(np.asarray(xs) @ w, axis=-1)
        assert m[0] > 0 and np.all(np.diff(m) >= -1e-14), type(dyn).__name__
        assert m[-1] > m[0]


# ---------------------------------------------------------------- velocities


def test_mean_field_velocity_matches_the_particle_system(rng):
    n, d, beta = 6, 4, 1.3
    x = jnp.asarray(_sphere(rng, n, d))
    at = jnp.asarray(_sphere(rng, 3, d))
    uniform = jnp.full((n,), 1 / n)
    for kind, cls in (("SA", P.SA), ("USA", P.USA)):
        v = P.mean_field_velocity(x, uniform, x, beta, kind=kind)
        assert max_abs(v, cls(beta).velocity(x)) <= 1e-14
        # μ is unchanged when every atom is split into two halves.
        doubled = P.mean_field_velocity(
            jnp.concatenate([x, x]), jnp.tile(uniform, 2) / 2, at, beta, kind
        )
        assert max_abs(doubled, P.mean_field_velocity(x, uniform, at, beta, kind)) <= 1e-14
    with pytest.raises(ValueError, match="choose 'SA' or 'USA'"):
        P.mean_field_velocity(x, uniform, x, beta, kind="softmax")
    with pytest.raises(ValueError, match="sum to 1"):
        P.mean_field_velocity(x, uniform * 2, x, beta)


def test_usa_is_sa_without_normalization(rng):
    """One class: `USA(beta, ...)` is `SA(beta, ..., normalized=False)`, named "USA" in messages
    and in the theory curves' kind, and batches over β like `SA`."""
    n, d, beta = 5, 3, 0.7
    x = jnp.asarray(_sphere(rng, n, d))
    q = jnp.asarray(rng.normal(size=(d, d)))
    usa = P.USA(beta, Q=q, repulsive=True)
    assert isinstance(usa, P.SA) and not usa.normalized and usa.repulsive and usa.name == "USA"
    assert P.SA(beta).normalized and P.SA(beta).name == "SA"
    same = P.SA(beta, Q=q, repulsive=True, normalized=False)
    assert max_abs(usa.velocity(x), same.velocity(x)) == 0.0
    # USA's field is SA's with Z_i = n (exactly the unnormalized weights).
    w = jnp.exp(beta * (x @ q.T) @ x.T)
    assert max_abs(P.USA(beta, Q=q).field(x), w @ x / n) <= 1e-15
    batch = eqx.filter_vmap(P.USA)(jnp.asarray([0.5, 1.0]))
    assert batch.name == "USA" and batch.beta.shape == (2,)
    with pytest.raises(ValueError, match=r"^SA.normalized=1 must be True or False"):
        P.SA(beta, normalized=1)
    with pytest.raises(ValueError, match=r"USA.V has shape \(4, 4\).*points have d = 3"):
        P.USA(beta, V=jnp.eye(4)).check_dimension(3)


@pytest.mark.slow
def test_attention_velocities_match_a_loop_reference(rng):
    n, d, beta = 5, 3, 0.7
    x = _sphere(rng, n, d)
    Q, K, V = (rng.normal(size=(d, d)) for _ in range(3))
    for cls, normalized in ((P.SA, True), (P.USA, False)):
        got = cls(beta, Q=Q, K=K, V=V).velocity(jnp.asarray(x))
        assert max_abs(got, _sa_numpy(x, beta, Q, K, V, normalized)) <= 1e-13
        # Identity defaults equal explicit identities.
        eye = np.eye(d)
        assert (
            max_abs(
                cls(beta).velocity(jnp.asarray(x)), _sa_numpy(x, beta, eye, eye, eye, normalized)
            )
            <= 1e-14
        )
    # Rectangular Q, K (d_k = 2) and several heads: the sum over heads of the one-head terms.
    Qh, Kh, Vh = rng.normal(size=(3, 2, d)), rng.normal(size=(3, 2, d)), rng.normal(size=(3, d, d))
    multi = P.SA(beta, Q=Qh, K=Kh, V=Vh).velocity(jnp.asarray(x))
    heads = sum(_sa_numpy(x, beta, Qh[h], Kh[h], Vh[h]) for h in range(3))
    assert max_abs(multi, heads) <= 1e-13
    shared_v = P.SA(beta, Q=Qh, K=Kh).velocity(jnp.asarray(x))
    assert (
        max_abs(shared_v, sum(_sa_numpy(x, beta, Qh[h], Kh[h], np.eye(d)) for h in range(3)))
        <= 1e-13
    )


def test_large_beta_softmax_is_stable_and_tends_to_hardmax(rng):
    n, d = 6, 3
    x = jnp.asarray(_sphere(rng, n, d))
    Q, K = jnp.asarray(rng.normal(size=(d, d))), jnp.asarray(rng.normal(size=(d, d)))
    v_sa = P.SA(5000.0, Q=Q, K=K).velocity(x)
    assert bool(jnp.all(jnp.isfinite(v_sa)))
    v_hard = P.Hardmax(Q=Q, K=K).velocity(x)
    assert max_abs(v_sa, v_hard) <= 1e-10
    # Q = K = I: every token is its own maximizer, nothing moves.
    assert max_abs(P.Hardmax().velocity(x), 0.0) <= 1e-15
    # Ties share the weight: with K = −I, token i follows its antipodal-most tokens; duplicate
    # points tie exactly and are averaged.
    y = jnp.concatenate([x[:3], x[:1]])
    s = np.asarray(y @ -y.T)
    v = P.Hardmax(K=-jnp.eye(d)).velocity(y)
    for i in range(4):
        arg = np.flatnonzero(s[i] >= s[i].max() - 1e-12)
        target = np.asarray(y)[arg].mean(0)
        want = target - (np.asarray(y)[i] @ target) * np.asarray(y)[i]
        assert np.max(np.abs(np.asarray(v[i]) - want)) <= 1e-14


def test_ffn_augmented_field(rng):
    n, d, m, beta = 5, 3, 4, 0.8
    x = jnp.asarray(_sphere(rng, n, d))
    w, a, b = rng.normal(size=(d, m)), rng.normal(size=(m, d)), rng.normal(size=(m,))
    dyn = P.FFNAugmented(P.SA(beta), w, a, b, jnp.tanh)
    ffn = np.tanh(np.asarray(x) @ a.T + b) @ w.T
    f = np.asarray(P.SA(beta).field(x)) + ffn
    want = f - np.sum(np.asarray(x) * f, -1, keepdims=True) * np.asarray(x)
    assert max_abs(dyn.velocity(x), want) <= 1e-14
    xs = P.simulate(dyn, x, t1=1.0, dt=0.1, save_ts=[1.0])
    assert np.max(np.abs(np.linalg.norm(np.asarray(xs), axis=-1) - 1)) <= 1e-14
    with pytest.raises(ValueError, match="expected a"):
        P.FFNAugmented(P.SA(beta), w.T, a, b)


# ---------------------------------------------------------------- integrators


@pytest.mark.slow
def test_observed_orders_on_the_sphere(rng):
    n, d, T = 4, 3, 1.0
    x0 = _sphere(rng, n, d)
    dyn = P.SA(
        1.0,
        Q=np.eye(d) + 0.5 * rng.normal(size=(d, d)),
        V=np.eye(d) + 0.3 * rng.normal(size=(d, d)),
    )

    def solve(integrator, steps):
        # One compile per integrator for all its step counts (each count is its own scan).
        run = lambda x: [
            P.simulate(dyn, x, dt=T / s, num_steps=s, integrator=integrator) for s in steps
        ]
        return np.asarray(jax.jit(run)(x0))

    ref = solve(P.ProjectedRK4(), (2048,))[0]
    cases = [
        (P.ProjectedEuler(), (16, 32, 64, 128)),
        (P.GeodesicEuler(), (16, 32, 64, 128)),
        (P.ProjectedRK2(), (16, 32, 64, 128)),
        (P.DiffraxProjected(diffrax.Heun()), (16, 32, 64, 128)),
        (P.ProjectedRK4(), (8, 16, 32, 64)),
        # Tsit5's principal error constant is tiny: at dt >= 1/8 the slope is still > 5
        # (6th-order terms), and below 1/64 the error meets round-off (~1e-14).
        (P.DiffraxProjected(diffrax.Tsit5()), (8, 16, 32, 64)),
    ]
    for integrator, steps in cases:
        xs = solve(integrator, steps)
        assert np.max(np.abs(np.linalg.norm(xs, axis=-1) - 1)) <= 1e-12
        errs = np.max(np.abs(xs - ref), axis=(1, 2))
        slope = np.polyfit(np.log(T / np.array(steps)), np.log(errs), 1)[0]
        name = f"{type(integrator).__name__}({getattr(integrator, 'solver', '')})"
        assert abs(slope - integrator.order()) <= 0.3, (name, slope, errs)


@pytest.mark.slow
def test_rk2_is_heun_and_geodesic_step_is_exact_on_the_sphere(rng):
    x = jnp.asarray(_sphere(rng, 5, 4))
    dyn = P.SA(2.0)
    heun = jax.jit(lambda x: P.DiffraxProjected(diffrax.Heun()).step(dyn, x, 0.1))
    assert max_abs(jax.jit(lambda x: P.ProjectedRK2().step(dyn, x, 0.1))(x), heun(x)) <= 1e-15
    # Geodesic Euler follows the great circle: the angle between x and its image is ‖v‖ dt.
    geo = jax.jit(lambda x, h: P.GeodesicEuler().step(dyn, x, h))
    y = geo(x, 0.3)
    speed = jnp.linalg.norm(dyn.velocity(x), axis=-1)
    assert max_abs(jnp.arccos(jnp.clip(jnp.sum(x * y, -1), -1, 1)), 0.3 * speed) <= 1e-7
    # At rest (all tokens equal) the step is the identity, without NaNs in values or gradients.
    z = jnp.tile(x[:1], (3, 1))
    assert max_abs(geo(z, 0.1), z) <= 1e-15
    assert max_abs(jax.jit(lambda z: P.ProjectedRK4().step(dyn, z, 0.1))(z), z) <= 1e-15
    g = jax.jit(jax.grad(lambda z: jnp.sum(geo(z, 0.1))))(z)
    assert bool(jnp.all(jnp.isfinite(g)))


# ---------------------------------------------------------------- transforms and dtypes


@pytest.mark.slow
def test_jit_equals_eager_and_vmap_equals_loop(rng):
    n, d, dt = 4, 3, 0.05
    starts = np.stack([_sphere(rng, n, d) for _ in range(3)])
    betas = np.array([0.5, 1.0, 3.0])
    ts = [0.0, 0.25, 0.5]
    integ = P.ProjectedRK2()

    def sim(dyn, x0):
        return P.simulate(dyn, x0, t1=0.5, dt=dt, integrator=integ, save_ts=ts)

    eager = sim(P.SA(1.0), starts[0])
    one = jax.jit(lambda b, x: sim(P.SA(b), x))  # one compile serves every loop below
    assert max_abs(eager, one(1.0, starts[0])) <= 1e-15
    assert max_abs(eager[0], starts[0]) == 0.0

    loop = np.stack([one(1.0, x) for x in starts])
    assert max_abs(jax.vmap(lambda x: sim(P.SA(1.0), x))(starts), loop) <= 1e-15

    loop_b = np.stack([one(b, starts[0]) for b in betas])
    assert max_abs(jax.vmap(lambda b: sim(P.SA(b), starts[0]))(betas), loop_b) <= 1e-15
    batched = eqx.filter_vmap(P.SA)(jnp.asarray(betas))
    assert max_abs(eqx.filter_vmap(lambda dyn: sim(dyn, starts[0]))(batched), loop_b) <= 1e-15

    vs = rng.normal(size=(2, d, d))
    usa = jax.jit(lambda v: sim(P.USA(1.0, V=v), starts[0]))
    loop_v = np.stack([usa(v) for v in vs])
    assert max_abs(jax.vmap(lambda v: sim(P.USA(1.0, V=v), starts[0]))(vs), loop_v) <= 1e-15

    dts = np.array([0.01, 0.02, 0.05])
    by_dt = jax.vmap(lambda h: P.simulate(P.SA(1.0), starts[0], dt=h, num_steps=10))(dts)
    loop_dt = np.stack(
        [P.simulate(P.SA(1.0), starts[0], t1=10 * float(h), dt=float(h)) for h in dts]
    )
    assert max_abs(by_dt, loop_dt) <= 1e-15


def test_gradients_through_simulate_match_finite_differences(rng):
    # Reverse mode through the scan and the save buffer, vs a central difference in β.
    x0 = _sphere(rng, 4, 3)

    @jax.jit
    def loss(beta):
        xs = P.simulate(
            P.SA(beta), x0, t1=1.0, dt=0.05, integrator=P.ProjectedRK2(), save_ts=[0.5, 1.0]
        )
        return P.interaction_energy(xs[0], 1.0) + P.interaction_energy(xs[1], 1.0)

    h = 1e-5
    fd = (loss(0.7 + h) - loss(0.7 - h)) / (2 * h)
    grad = jax.jit(jax.grad(loss))(0.7)
    assert abs(float(grad - fd)) <= 1e-8 * max(1.0, abs(float(fd)))
    assert abs(float(grad)) > 1e-3


@pytest.mark.parametrize(
    "integrator",
    [
        P.ProjectedEuler(),
        P.ProjectedRK2(),
        P.ProjectedRK4(),
        P.GeodesicEuler(),
        P.DiffraxProjected(diffrax.Tsit5()),
    ],
)
def test_float32_stays_float32(integrator, rng):
    x0 = _sphere(rng, 4, 3).astype(np.float32)
    dyn = P.SA(1.0, Q=np.eye(3))  # a float64 matrix must not promote the state
    xs = P.simulate(dyn, x0, t1=0.5, dt=0.1, integrator=integrator, save_ts=[0.0, 0.5])
    assert xs.dtype == jnp.float32 and xs.shape == (2, 4, 3)
    x64 = P.simulate(dyn, x0.astype(np.float64), t1=0.5, dt=0.1, integrator=integrator)
    assert max_abs(xs[-1], x64) <= 1e-5


# ---------------------------------------------------------------- errors


def test_bad_input_is_rejected_before_compute(rng):
    x0 = _sphere(rng, 4, 3)
    dyn = P.SA(1.0)
    with pytest.raises(ValueError, match="rows of x0 must be unit vectors"):
        P.simulate(dyn, 1.01 * x0, t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="n >= 2"):
        P.simulate(dyn, x0[:1], t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="d >= 2"):
        P.simulate(dyn, np.ones((3, 1)), t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="shape \\(n, d\\)"):
        P.simulate(dyn, x0[None], t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match=r"dt=-0.1 must be a finite number > 0"):
        P.simulate(dyn, x0, t1=1.0, dt=-0.1)
    with pytest.raises(ValueError, match=r"dt=0.0 must be a finite number > 0"):
        P.simulate(dyn, x0, t1=1.0, dt=0.0)
    with pytest.raises(ValueError, match=r"t1=-1.0 must be a finite number >= 0"):
        P.simulate(dyn, x0, t1=-1.0, dt=0.1)
    with pytest.raises(ValueError, match="t1 = 1.05 is not a multiple of dt = 0.1"):
        P.simulate(dyn, x0, t1=1.05, dt=0.1)
    with pytest.raises(ValueError, match="save_ts entry = 0.015 is not a multiple of dt = 0.01"):
        P.simulate(dyn, x0, t1=1.0, dt=0.01, save_ts=[0.0, 0.015])
    with pytest.raises(ValueError, match="outside \\[0, t1\\]"):
        P.simulate(dyn, x0, t1=1.0, dt=0.01, save_ts=[2.0])
    with pytest.raises(ValueError, match="pass num_steps"):
        jax.vmap(lambda h: P.simulate(dyn, x0, t1=1.0, dt=h))(jnp.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="not a sphere integrator"):
        P.simulate(dyn, x0, t1=1.0, dt=0.1, integrator=diffrax.Tsit5())
    # Q, K, V shapes: against each other at construction, against d at simulate.
    with pytest.raises(ValueError, match=r"Q has shape \(3, 3\), K has shape \(4, 4\)"):
        P.SA(1.0, Q=np.eye(3), K=np.eye(4))
    with pytest.raises(ValueError, match=r"Q and K with the same number of rows"):
        P.USA(1.0, Q=np.ones((2, 3)), K=np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"V must be square"):
        P.SA(1.0, V=np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"head axes"):
        P.SA(1.0, Q=np.ones((2, 3, 3)), V=np.ones((4, 3, 3)))
    with pytest.raises(ValueError, match=r"SA.V has shape \(4, 4\).*points have d = 3"):
        P.simulate(P.SA(1.0, V=np.eye(4)), x0, t1=1.0, dt=0.1)
    with pytest.raises(ValueError, match="beta=inf must be a finite"):
        P.SA(float("inf"))
    with pytest.raises(ValueError, match="beta must be a scalar"):
        P.USA(np.ones(3))
    # Under jit the sphere check runs inside the computation.
    with pytest.raises(eqx.EquinoxRuntimeError, match="unit vectors"):
        eqx.filter_jit(lambda x: P.simulate(dyn, x, t1=0.2, dt=0.1))(2.0 * x0)


@pytest.mark.parametrize(
    "save_ts",
    [
        [1.0, 0.0, 0.5, 0.5, 0.25],  # a regular grid (every 5 steps), any order, repeats: chunked
        [0.1, 0.3, 1.0],  # irregular (multiples of 1 step, 10 >> 3 saves): the save buffer
    ],
)
def test_saved_states_are_the_states_of_single_runs(rng, save_ts):
    """Each saved state equals `simulate` run to that time alone (the same steps), whichever
    of the two save paths (chunked scans for a regular grid, a save buffer otherwise) runs."""
    x0 = jnp.asarray(_sphere(rng, 6, 4))
    dyn, dt = P.SA(1.5), 0.05
    xs = P.simulate(dyn, x0, t1=1.0, dt=dt, save_ts=save_ts)
    for t, x in zip(save_ts, xs):
        alone = x0 if t == 0 else P.simulate(dyn, x0, t1=t, dt=dt)
        assert max_abs(x, alone) <= 1e-14, t
    # Reverse mode through either path: the gradient of the sum of the saved states equals the
    # sum of the single runs' gradients.
    saved = jax.grad(lambda y: jnp.sum(P.simulate(dyn, y, t1=1.0, dt=dt, save_ts=save_ts)))(x0)
    alone = sum(
        jax.grad(lambda y, t=t: jnp.sum(y if t == 0 else P.simulate(dyn, y, t1=t, dt=dt)))(x0)
        for t in save_ts
    )
    assert max_abs(saved, alone) <= 1e-12
