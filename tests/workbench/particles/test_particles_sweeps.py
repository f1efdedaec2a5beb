"""The batched phase-diagram kernel (`workbench.particles._sweeps`): the Gram form against the
particle form, the sweep against a direct loop over `simulate` + `fraction_clustered`, the
one-cluster regime, the orthogonal-start oracle γ_β(t) (Thm 6.8), jit / vmap / chunking
consistency, the dynamics-object form against the old (class, β, Q, K, V) form, and input
errors. Float64 (conftest)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from workbench import particles as P
from workbench.particles._diagnostics import fraction_clustered
from workbench.particles._sweeps import (
    GramForm,
    ParticleForm,
    ReducedForm,
    _at_least,
    _euler_rows,
    _pair_fraction,
    _pair_fraction_of_rows,
    _reduce,
    clustering_curve,
    gram_step,
    phase_diagram,
    random_starts,
)
from workbench.particles._theory import gamma_beta, gamma_infinity

INTEGRATORS = {
    "euler": P.ProjectedEuler(),
    "rk2": P.ProjectedRK2(),
    "rk4": P.ProjectedRK4(),
    "geodesic": P.GeodesicEuler(),
}


def _sphere(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _direct(dynamics, betas, starts, ts, dt, integrator, delta=1e-3):
    """The reference: `simulate` then `fraction_clustered`, one (β, start) at a time."""

    @jax.jit
    def states(b, x0):
        return P.simulate(
            dynamics(b), x0, t1=float(max(ts)), dt=dt, integrator=integrator, save_ts=ts
        )

    out = np.zeros((len(betas), len(starts), len(ts)))
    for i, b in enumerate(betas):
        for j, x0 in enumerate(starts):
            xs = states(jnp.asarray(b, jnp.float64), jnp.asarray(x0))
            out[i, j] = [float(fraction_clustered(x, delta)) for x in xs]
    return out


# ---------------------------------------------------------------- Gram form == particle form


@pytest.mark.parametrize("name", list(INTEGRATORS))
@pytest.mark.parametrize("dynamics, beta", [(P.SA, 3.0), (P.USA, 1.5)])
def test_gram_form_equals_particle_form(name, dynamics, beta, rng):
    # 150 steps through the whole collapse to one cluster. (USA at larger β/n reaches
    # configurations with tiny λ_min(G), where the Gram form's normal-equations conditioning shows
    # as ~1e-12..1e-10 differences: see `GramForm`.)
    integrator = INTEGRATORS[name]
    n, d, dt, steps = 8, 12, 0.1, 150
    x0 = jnp.asarray(_sphere(rng, n, d))
    ts = np.arange(0, steps + 1, 10) * dt
    xs = P.simulate(dynamics(beta), x0, t1=steps * dt, dt=dt, integrator=integrator, save_ts=ts)
    want = np.asarray(jnp.einsum("tid,tjd->tij", xs, xs))

    @jax.jit
    def run(g):
        def body(g, _):
            g = jax.lax.fori_loop(
                0,
                10,
                lambda _, h: gram_step(h, beta, dt, integrator=integrator, dynamics=dynamics),
                g,
            )
            return g, g

        return jnp.concatenate([g[None], jax.lax.scan(body, g, None, length=steps // 10)[1]])

    got = np.asarray(run(x0 @ x0.T))
    assert np.max(np.abs(got - want)) <= 1e-12
    # the trajectory really moved (not a trivial agreement near the start)
    assert np.max(np.abs(want[-1] - want[0])) > 0.1


@pytest.mark.parametrize("name", ["euler", "rk4"])
def test_reduced_coordinates_follow_the_same_flow(name, rng):
    # ReducedForm: R = X U in an orthonormal basis of the row space has the same Gram matrix, and
    # the particle system run on R has the Gram matrices of the system run on X.
    integrator = INTEGRATORS[name]
    x0 = jnp.asarray(_sphere(rng, 6, 20))
    r0 = _reduce(x0)
    assert r0.shape == (6, 6)
    ts = np.arange(0, 11) * 1.0
    run = lambda x: P.simulate(P.SA(4.0), x, t1=10.0, dt=0.1, integrator=integrator, save_ts=ts)
    gx, gr = (jnp.einsum("tid,tjd->tij", xs, xs) for xs in (run(x0), run(r0)))
    assert np.max(np.abs(np.asarray(gx - gr))) <= 1e-12
    # d < n: the points themselves, with zero columns up to a multiple of 8 (exact)
    small = _reduce(x0[:, :5])
    assert small.shape == (6, 8)
    assert np.array_equal(np.asarray(small[:, :5]), np.asarray(x0[:, :5]))
    assert not np.any(np.asarray(small[:, 5:]))


@pytest.mark.parametrize("dynamics", [P.SA, P.USA])
def test_fast_euler_rows_equal_projected_euler(dynamics, rng):
    # The sweep's Euler step normalize(E X + diag(z/dt − e) X) is ProjectedEuler().step.
    x = jnp.asarray(_sphere(rng, 10, 7))
    for beta in (0.0, 2.0, -1.0):
        want = P.ProjectedEuler().step(dynamics(beta), x, 0.1)
        got = _euler_rows(x, jnp.asarray(beta), jnp.asarray(0.1), dynamics is P.SA)
        assert np.max(np.abs(np.asarray(got - want))) <= 1e-14


def test_arithmetic_threshold_is_exact():
    # `_at_least` (sign arithmetic, fusable on XLA:CPU) equals the comparison `a >= b` exactly,
    # including a = b and one ulp either side.
    b = 0.999
    a = np.array([b, np.nextafter(b, 0.0), np.nextafter(b, 2.0), -1.0, 1.0, 0.0, b - 1e-17])
    assert np.array_equal(np.asarray(_at_least(jnp.asarray(a), b)), (a >= b).astype(np.float64))
    assert np.isnan(float(_at_least(jnp.asarray(np.nan), b)))


def test_pair_fraction_of_rows_counts_exactly_at_the_threshold():
    # Rows with inner products exactly 1 − δ (counted) and one ulp below (not counted): the fused
    # count from the rows equals the comparison on x xᵀ and the hand count.
    thr = 0.75  # δ = 0.25, exact in binary
    below = np.nextafter(thr, 0.0)
    x = np.array(
        [
            [1.0, 0.0, 0.0],
            [thr, np.sqrt(1 - thr**2), 0.0],  # ⟨x0, x1⟩ = 0.75 exactly
            [below, 0.0, np.sqrt(1 - below**2)],  # ⟨x0, x2⟩ one ulp below
            [0.0, 0.0, 1.0],
        ]
    )
    g = x @ x.T
    upper = np.triu(np.ones((4, 4), dtype=bool), k=1)
    want = np.count_nonzero(g[upper] >= thr) / 6
    assert g[0, 1] == thr and g[0, 2] < thr and want == 1 / 6
    assert float(_pair_fraction_of_rows(jnp.asarray(x), 0.25)) == want
    assert float(_pair_fraction(jnp.asarray(g), 0.25)) == want


def test_pair_fraction_of_rows_equals_the_comparison_on_clustered_states(rng):
    # Along clustering trajectories (many pairs near 1), for several δ.
    x0 = jnp.asarray(_sphere(rng, 16, 12))
    xs = P.simulate(P.SA(6.0), x0, t1=20.0, dt=0.1, save_ts=np.arange(0, 21, 2.0))
    distinct = 0
    for delta in (1e-1, 1e-3, 1e-6, 1e-9):
        got = jax.vmap(lambda x: _pair_fraction_of_rows(x, delta))(xs)
        want = jax.vmap(lambda x: _pair_fraction(x @ x.T, delta))(xs)
        assert np.array_equal(np.asarray(got), np.asarray(want))
        distinct += len(np.unique(np.asarray(want)))
    assert distinct > 8  # the counts really change along the trajectories


# ---------------------------------------------------------------- sweep == direct loop


@pytest.mark.parametrize(
    "form, integrator, dynamics",
    [
        (None, P.ProjectedEuler(), P.SA),  # auto: ReducedForm (8 -> 6 coordinates)
        (ParticleForm(), P.ProjectedEuler(), P.SA),
        (GramForm(), P.ProjectedEuler(), P.SA),
        (GramForm(), P.ProjectedRK4(), P.USA),
        (ReducedForm(), P.GeodesicEuler(), P.USA),
    ],
)
def test_sweep_equals_direct_loop(form, integrator, dynamics, rng):
    betas = np.array([0.5, 3.0, 8.0])
    starts = _sphere(rng, 3, 6, 8)
    ts = np.array([0.0, 1.0, 2.5, 6.0, 4.0])  # any order, t = 0 included
    dt = 0.1
    pd = phase_diagram(
        eqx.filter_vmap(dynamics)(jnp.asarray(betas)),
        starts,
        dt=dt,
        save_ts=ts,
        integrator=integrator,
        form=form,
        per_start=True,
        progress=False,
    )
    want = _direct(dynamics, betas, starts, ts, dt, integrator)
    np.testing.assert_array_equal(pd.per_start, want)
    np.testing.assert_allclose(pd.fraction, want.mean(axis=1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(pd.sem, want.std(axis=1, ddof=1) / np.sqrt(3), rtol=0, atol=1e-12)
    assert isinstance(pd.form, ReducedForm if form is None else type(form))
    assert pd.num_steps == 60
    assert 0.0 < pd.fraction.max() and pd.fraction[:, 0].max() == 0.0  # not a trivial diagram


@pytest.mark.parametrize("integrator", [P.ProjectedEuler(), P.ProjectedRK4()])
def test_sweep_with_d_below_n_equals_direct_loop(integrator, rng):
    # d < n: the reduced form runs the points padded with zero columns (d = 3 -> 8).
    betas, starts, ts, dt = np.array([1.0, 6.0]), _sphere(rng, 3, 10, 3), np.array([1.0, 5.0]), 0.1
    sa = eqx.filter_vmap(P.SA)(jnp.asarray(betas))
    pd = phase_diagram(
        sa, starts, dt=dt, save_ts=ts, integrator=integrator, per_start=True, progress=False
    )
    want = _direct(P.SA, betas, starts, ts, dt, integrator)
    pairs = 10 * 9 / 2  # the same clustered-pair counts (fractions can differ in the last bit)
    np.testing.assert_array_equal(np.rint(pd.per_start * pairs), np.rint(want * pairs))
    assert isinstance(pd.form, ReducedForm) and 0.0 < want.max()


def test_sweep_with_matrices_equals_direct_loop(rng):
    d = 6
    Q, K, V = (rng.normal(size=(d, d)) / np.sqrt(d) for _ in range(3))
    betas, starts, ts, dt = np.array([1.0, 5.0]), _sphere(rng, 2, 5, d), np.array([2.0, 8.0]), 0.1
    dyn = lambda b: P.SA(b, Q=Q, K=K, V=V)
    want = _direct(dyn, betas, starts, ts, dt, P.ProjectedEuler())
    batch = eqx.filter_vmap(dyn)(jnp.asarray(betas))  # Q, K, V broadcast to (2, d, d)
    for form in (None, ParticleForm(fuse_qk=False)):
        pd = phase_diagram(
            batch, starts, dt=dt, save_ts=ts, form=form, per_start=True, progress=False
        )
        assert isinstance(pd.form, ParticleForm)
        np.testing.assert_array_equal(pd.per_start, want)


# ---------------------------------------------------------------- oracles


def test_small_beta_gives_one_cluster_by_t30(getkey):
    # Fig. 3: below β ≈ 1 every start collapses to one cluster well before t = 30.
    starts = random_starts(getkey(), 4, 32, 32)
    sa = eqx.filter_vmap(P.SA)(jnp.array([0.1, 0.5, 1.0]))
    pd = phase_diagram(sa, starts, dt=0.1, save_ts=[30.0], progress=False)
    assert np.all(pd.fraction[:, -1] >= 0.99)


@pytest.mark.slow
@pytest.mark.parametrize(
    "dynamics, kind, betas", [(P.SA, "SA", (0.0, 2.0, 5.0)), (P.USA, "USA", (0.0, 1.0, 2.0))]
)
def test_orthogonal_start_follows_gamma_beta(dynamics, kind, betas):
    # Thm 6.8: from an orthogonal start all pairwise inner products equal γ_β(t), so the
    # statistic is the indicator 1[γ_β(t) ≥ 1 − δ]; compared away from the crossing t*(β).
    n, delta, dt = 8, 1e-3, 0.05
    x0 = np.eye(n)[None]
    ts = np.arange(1, 61) * 0.25
    betas = np.array(betas)
    for form in (GramForm(), ParticleForm()):
        pd = phase_diagram(
            eqx.filter_vmap(dynamics)(jnp.asarray(betas)),
            x0,
            dt=dt,
            save_ts=ts,
            integrator=P.ProjectedRK4(),
            delta=delta,
            form=form,
            progress=False,
        )
        for i, b in enumerate(betas):
            crossing = float(gamma_infinity(dynamics(b), delta, n))
            assert 0.5 < crossing < ts[-1] - 0.5
            gamma = np.asarray(gamma_beta(jnp.asarray(ts), b, n, kind))
            away = np.abs(ts - crossing) > 0.05
            want = (gamma >= 1 - delta).astype(float)
            np.testing.assert_array_equal(pd.fraction[i, away], want[away])
            assert want[away].min() == 0.0 and want[away].max() == 1.0


# ---------------------------------------------------------------- transforms


@pytest.mark.slow
def test_clustering_curve_jit_vmap_and_chunking_consistency(rng):
    starts = jnp.asarray(_sphere(rng, 4, 6, 8))
    betas = jnp.asarray([0.5, 4.0, 9.0])
    ts = np.array([0.5, 2.0, 5.0, 9.0])
    kw = dict(dt=0.1, save_ts=ts)
    eager = np.array([[clustering_curve(P.SA(b), x, **kw) for x in starts] for b in betas])
    jitted = jax.jit(lambda dyn, x: clustering_curve(dyn, x, **kw))
    looped = np.array([[jitted(P.SA(b), x) for x in starts] for b in betas])
    vmapped = jax.jit(
        jax.vmap(jax.vmap(lambda b, x: clustering_curve(P.SA(b), x, **kw), (None, 0)), (0, None))
    )(betas, starts)
    np.testing.assert_array_equal(eager, looped)
    np.testing.assert_array_equal(eager, np.asarray(vmapped))
    for chunk, flight in ((1, 1), (5, 3), (None, None)):
        pd = phase_diagram(
            eqx.filter_vmap(P.SA)(betas),
            starts,
            chunk_size=chunk,
            in_flight=flight,
            per_start=True,
            progress=False,
            **kw,
        )
        np.testing.assert_array_equal(pd.per_start, eager)
    assert eager.max() > 0 and eager.min() == 0


def test_float32_starts_run_in_float32(getkey):
    starts = random_starts(getkey(), 2, 8, 8, jnp.float32)
    assert starts.dtype == jnp.float32
    curve = clustering_curve(P.SA(0.5), starts[0], dt=0.1, save_ts=[0.0, 20.0])
    assert curve.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(curve), [0.0, 1.0])


# ---------------------------------------------------------------- the dynamics object


def _old_call(fn, *args, **kwargs):
    """A call in the old form (β first, the class and matrices as keywords): it warns."""
    with pytest.warns(DeprecationWarning, match="old form"):
        return fn(*args, **kwargs)


@pytest.mark.parametrize("dynamics", [P.SA, P.USA])
@pytest.mark.parametrize("matrices", ["identity", "qkv", "heads"])
def test_object_form_equals_old_form(dynamics, matrices, rng):
    # A batch from eqx.filter_vmap (matrices broadcast to (B, ...)) and the same batch sharing
    # its matrices (β leaf swapped by eqx.tree_at) give bitwise the numbers of the old call
    # phase_diagram(betas, ..., dynamics=cls, Q=Q, K=K, V=V); both equal simulate +
    # fraction_clustered cell by cell (in clustered-pair counts).
    d = 6
    mats = {
        "identity": {},
        "qkv": {name: rng.normal(size=(d, d)) / np.sqrt(d) for name in "QKV"},
        "heads": {name: rng.normal(size=(2, 3, d)) / np.sqrt(d) for name in "QK"},
    }[matrices]
    mats = {name: jnp.asarray(m) for name, m in mats.items()}
    betas = np.array([0.5, 1.5, 3.0])  # B = 3, not the head count
    starts = _sphere(rng, 3, 5, d)
    ts = np.array([0.0, 1.0, 4.0, 2.5])
    kw = dict(dt=0.1, save_ts=ts, integrator=P.ProjectedRK2(), per_start=True, progress=False)
    old = _old_call(phase_diagram, betas, starts, dynamics=dynamics, **mats, **kw)
    broadcast = eqx.filter_vmap(lambda b: dynamics(b, **mats))(jnp.asarray(betas))
    shared = eqx.tree_at(lambda s: s.beta, dynamics(0.0, **mats), jnp.asarray(betas))
    if mats:
        assert broadcast.Q.shape[0] == 3 and shared.Q.shape == mats["Q"].shape
    for batch in (broadcast, shared):
        new = phase_diagram(batch, starts, **kw)
        np.testing.assert_array_equal(new.per_start, old.per_start)
        np.testing.assert_array_equal(new.fraction, old.fraction)
        np.testing.assert_array_equal(new.sem, old.sem)
        np.testing.assert_array_equal(new.betas, betas)
        assert type(new.form) is type(old.form) is (ParticleForm if mats else ReducedForm)
    direct = _direct(
        lambda b: dynamics(b, **mats), betas, starts, ts, dt=0.1, integrator=kw["integrator"]
    )
    pairs = 5 * 4 / 2
    np.testing.assert_array_equal(np.rint(old.per_start * pairs), np.rint(direct * pairs))
    assert direct.max() > 0 and np.all(np.isfinite(direct))  # not a trivial diagram
    # the single-trajectory entry points: object form == old form, bitwise
    one = dict(dt=0.1, save_ts=ts, integrator=kw["integrator"])
    for fn in (clustering_curve, P.gram_trajectory):
        got = fn(dynamics(1.5, **mats), starts[1], **one)
        want = _old_call(fn, 1.5, starts[1], dynamics=dynamics, **mats, **one)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(
        np.asarray(clustering_curve(dynamics(1.5, **mats), starts[1], **one)), old.per_start[1, 1]
    )


def test_single_instance_equals_batch_of_one(rng):
    d = 8
    starts = _sphere(rng, 3, 6, d)
    q = jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d))
    kw = dict(dt=0.1, save_ts=[0.0, 2.0, 5.0], per_start=True, progress=False)
    for make in (P.SA, lambda b: P.USA(b, Q=q), lambda b: P.SA(b, repulsive=True)):
        one = phase_diagram(make(2.0), starts, **kw)
        batch = phase_diagram(eqx.filter_vmap(make)(jnp.array([2.0])), starts, **kw)
        wider = phase_diagram(eqx.filter_vmap(make)(jnp.array([0.5, 2.0])), starts, **kw)
        assert one.betas.tolist() == [2.0] and one.per_start.shape == (1, 3, 3)
        assert type(one.form) is type(batch.form) is type(wider.form)
        np.testing.assert_array_equal(one.per_start, batch.per_start)
        np.testing.assert_array_equal(one.fraction, batch.fraction)
        np.testing.assert_array_equal(one.per_start[0], wider.per_start[1])
    # repulsive is V = -I: the particle form, and the particles spread (nothing clusters)
    assert isinstance(one.form, ParticleForm) and one.fraction.max() == 0.0
    want = _direct(
        lambda b: P.SA(b, repulsive=True), [2.0], starts, [0.0, 2.0, 5.0], 0.1, P.ProjectedEuler()
    )
    np.testing.assert_array_equal(one.per_start, want)


def test_bad_dynamics_objects_raise_clear_errors(rng):
    x = _sphere(rng, 2, 4, 4)
    kw = dict(dt=0.1, save_ts=[1.0], progress=False)
    betas = jnp.array([1.0, 2.0])
    varying_q = eqx.filter_vmap(lambda b, q: P.SA(b, Q=q))(
        betas, jnp.asarray(_sphere(rng, 2, 4, 4))
    )
    ffn = P.FFNAugmented(P.SA(1.0), w=np.zeros((4, 3)), a=np.zeros((3, 4)), b=np.zeros(3))
    cases = [
        (P.SA, "dynamics=SA is a constructor; pass an instance, e.g. SA\\(beta=1.0\\)"),
        (P.Hardmax(), "type Hardmax is not supported; valid choices: a wb.particles.SA or"),
        (ffn, "type FFNAugmented is not supported"),
        ("SA", "type str is not supported"),
        (varying_q, r"dynamics.Q has shape \(2, 4, 4\), read as one Q per β .* differs across"),
    ]
    for dynamics, match in cases:
        with pytest.raises(ValueError, match=match):
            phase_diagram(dynamics, x, **kw)
    with pytest.raises(ValueError, match="dynamics=USA is a constructor"):
        clustering_curve(P.USA, x[0], dt=0.1, save_ts=[1.0])
    with pytest.raises(ValueError, match="Hardmax is not supported"):
        P.gram_trajectory(P.Hardmax(), x[0], dt=0.1, save_ts=[1.0])
    with pytest.raises(ValueError, match="Q= belong to the old form"):
        phase_diagram(P.SA(1.0), x, Q=np.eye(4), **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'betas'"):
        phase_diagram(P.SA(1.0), x, betas=[1.0], **kw)
    with pytest.raises(ValueError, match="concrete, not traced"):
        jax.jit(lambda b: phase_diagram(P.SA(b), x, **kw))(1.0)


def test_old_form_still_checks_its_arguments(rng):
    x = _sphere(rng, 2, 4, 4)
    kw = dict(dt=0.1, save_ts=[1.0], progress=False)
    cases = [
        ((np.ones((2, 2)),), {}, "betas must be a non-empty 1-D array"),
        ((1.0,), {}, "1-D array"),
        ((np.array([1.0, np.nan]),), {}, "betas must be finite"),
        ((np.ones(2),), dict(dynamics=P.Hardmax), "pass the class SA or USA"),
        ((np.ones(2),), dict(Q=np.ones((4, 3))), "must all act on the same d|shape"),
        ((np.ones(2),), dict(Q=np.ones((5, 5))), "d = 4"),
        ((np.ones(2),), dict(Q=np.eye(4), form=GramForm()), "Q = K = V = I"),
    ]
    for args, change, match in cases:
        with pytest.raises(ValueError, match=match), pytest.warns(DeprecationWarning):
            phase_diagram(*args, x, **kw, **change)
    with pytest.raises(ValueError, match="scalar"), pytest.warns(DeprecationWarning):
        clustering_curve(jnp.ones(2), x[0], dt=0.1, save_ts=[1.0])


# ---------------------------------------------------------------- errors


def test_bad_inputs_raise_clear_errors(rng):
    x = _sphere(rng, 2, 4, 4)
    ok = dict(dt=0.1, save_ts=[1.0], progress=False)
    sa = lambda **m: eqx.filter_vmap(lambda b: P.SA(b, **m))(jnp.array([1.0, 2.0]))
    cases = [
        (dict(dynamics=eqx.tree_at(lambda s: s.beta, P.SA(0.0), jnp.ones((2, 2)))), r"\(B,\)"),
        (
            dict(dynamics=eqx.tree_at(lambda s: s.beta, P.SA(0.0), jnp.array([1.0, jnp.nan]))),
            "dynamics.beta must be finite",
        ),
        (dict(starts=x * 1.01), "unit vectors"),
        (dict(starts=x[0]), "starts\\[None\\]"),
        (dict(starts=_sphere(rng, 2, 1, 4)), "n >= 2"),
        (dict(starts=np.ones((2, 4, 1))), "d >= 2"),
        (dict(dt=0.0), "dt=0.0 must be a finite number > 0"),
        (dict(dt=-0.1), "> 0"),
        (dict(save_ts=[0.15]), "not a multiple of dt"),
        (dict(save_ts=[]), "non-empty"),
        (dict(save_ts=[-1.0]), ">= 0"),
        (dict(delta=0.0), "delta"),
        (dict(integrator="euler"), "not a sphere integrator"),
        (dict(dynamics=sa(Q=jnp.ones((5, 5)))), "d = 4"),
        (dict(dynamics=sa(Q=jnp.eye(4)), form=GramForm()), "Q = K = V = I"),
        (dict(dynamics=sa(V=jnp.eye(4)), form=ReducedForm()), "Q = K = V = I"),
        (dict(dynamics=P.SA(1.0, repulsive=True), form=ReducedForm()), "Q = K = V = I"),
        (
            dict(integrator=P.DiffraxProjected(__import__("diffrax").Tsit5()), form=GramForm()),
            "no Gram recursion",
        ),
        (dict(form="gram"), "not a sweep form"),
        (dict(chunk_size=0), "chunk_size"),
    ]
    for change, match in cases:
        kw = {"dynamics": sa(), "starts": x, **ok, **change}
        with pytest.raises(ValueError, match=match):
            phase_diagram(kw.pop("dynamics"), kw.pop("starts"), **kw)
    with pytest.raises(ValueError, match="scalar"):
        clustering_curve(sa(), x[0], dt=0.1, save_ts=[1.0])
    with pytest.raises(ValueError, match="unit vectors"):
        clustering_curve(P.SA(1.0), 2 * x[0], dt=0.1, save_ts=[1.0])
    with pytest.raises(ValueError, match="no Gram form"):
        gram_step(
            x[0] @ x[0].T, 1.0, 0.1, integrator=P.DiffraxProjected(__import__("diffrax").Tsit5())
        )
    with pytest.raises(ValueError, match="integer >= 2"):
        random_starts(jax.random.key(0), 3, 1, 4)
