"""Clustering diagnostics and theory curves of paper B (docs/particles.md): values against NumPy loops,
hand-made configurations with known answers, SciPy / mpmath-free references and closed forms."""

import itertools
import math
from fractions import Fraction

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.optimize import linprog
from scipy.sparse.csgraph import connected_components

from workbench.particles import (
    SA,
    USA,
    FFNAugmented,
    Hardmax,
    Plateau,
    cluster_count,
    cluster_count_rank,
    cluster_labels,
    fraction_clustered,
    gram,
    inner_product_histogram,
    pair_inner_products,
    plateaus,
    time_to_one_cluster,
)
from workbench.particles._theory import (
    clustering_rate_bound,
    gamma_beta,
    gamma_infinity,
    hemisphere_margin,
    large_beta_condition,
    large_beta_threshold,
    tau_star,
    wendel_probability,
)

# ----------------------------------------------------------------------------------------------
# helpers


def _unit_rows(a):
    a = np.asarray(a, dtype=float)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _clusters(rng, sizes, d, jitter=0.0):
    """Exact clusters (copies of orthonormal centres) of the given sizes, optionally jittered."""
    centres = np.linalg.qr(rng.standard_normal((d, len(sizes))))[0].T  # orthonormal rows
    x = np.concatenate([np.repeat(c[None], s, axis=0) for c, s in zip(centres, sizes)])
    if jitter:
        x = x + jitter * rng.standard_normal(x.shape)
    return _unit_rows(x)


def _arc(angles, d=3):
    """Points at the given angles on a great circle of S^{d-1}."""
    x = np.zeros((len(angles), d))
    x[:, 0], x[:, 1] = np.cos(angles), np.sin(angles)
    return x


def _gamma_rhs(kind, beta, n):
    if kind == "SA":
        return lambda t, g: [
            2
            * np.exp(beta * (g[0] - 1))
            * (1 - g[0])
            * ((n - 1) * g[0] + 1)
            / (1 + (n - 1) * np.exp(beta * (g[0] - 1)))
        ]
    return lambda t, g: [(2 / n) * np.exp(beta * g[0]) * (1 - g[0]) * ((n - 1) * g[0] + 1)]


def _particle_rhs(kind, beta, n, d):
    """Independent NumPy vector field of SA / USA with Q = K = V = I (docs/particles.md)."""

    def rhs(t, y):
        x = y.reshape(n, d)
        s = beta * (x @ x.T)
        if kind == "SA":
            a = np.exp(s - s.max(axis=1, keepdims=True))
            a = a / a.sum(axis=1, keepdims=True)
        else:
            a = np.exp(s) / n
        v = a @ x
        return (v - np.sum(v * x, axis=1, keepdims=True) * x).ravel()

    return rhs


# ----------------------------------------------------------------------------------------------
# raw statistics


def test_gram_and_pairs_match_loops(rng):
    x = _unit_rows(rng.standard_normal((7, 5)))
    g = np.asarray(gram(jnp.asarray(x)))
    loop = np.array([[x[i] @ x[j] for j in range(7)] for i in range(7)])
    np.testing.assert_allclose(g, loop, rtol=0, atol=1e-15)
    pairs = np.asarray(pair_inner_products(jnp.asarray(x)))
    loop_pairs = [x[i] @ x[j] for i in range(7) for j in range(i + 1, 7)]
    assert pairs.shape == (21,)
    np.testing.assert_allclose(pairs, loop_pairs, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.diag(g), 1.0, atol=1e-15)


def test_histogram_matches_numpy_over_ordered_pairs(rng):
    x = _unit_rows(rng.standard_normal((30, 4)))
    counts, edges = jax.jit(inner_product_histogram, static_argnames="bins")(
        jnp.asarray(x), bins=16
    )
    values = [x[i] @ x[j] for i in range(30) for j in range(30) if i != j]
    ref_counts, ref_edges = np.histogram(values, bins=16, range=(-1.0, 1.0))
    np.testing.assert_array_equal(np.asarray(counts), ref_counts)
    np.testing.assert_allclose(np.asarray(edges), ref_edges, atol=1e-15)
    assert int(counts.sum()) == 30 * 29
    # exact clusters: all mass of in-cluster pairs in the last bin, which is closed at 1
    y = jnp.asarray(_clusters(rng, (3, 2), 4))
    counts, _ = inner_product_histogram(y, bins=4)
    assert int(counts[-1]) == 3 * 2 + 2 * 1 and int(counts.sum()) == 20


@pytest.mark.parametrize("sizes", [(3, 1, 4, 2), (5,), (1, 1, 1), (2, 2, 2, 2, 2, 2)])
def test_fraction_clustered_exact_clusters(rng, sizes):
    n = sum(sizes)
    x = jnp.asarray(_clusters(rng, sizes, d=8, jitter=1e-6))
    expected = float(Fraction(sum(s * (s - 1) for s in sizes), n * (n - 1)))
    # to the last bit or one ulp: under jit XLA may divide by the pair count as x * (1 / count)
    assert float(fraction_clustered(x)) == pytest.approx(expected, rel=2.3e-16, abs=0)
    assert float(jax.jit(fraction_clustered)(x, delta=1e-3)) == pytest.approx(
        expected, rel=2.3e-16, abs=0
    )


def test_fraction_clustered_threshold_is_inclusive():
    # <x_1, x_2> = cos(a) = 1 - delta exactly up to rounding; shift a hair either side.
    delta = 1e-3
    a = math.acos(1 - delta)
    near = jnp.asarray(_arc([0.0, a * (1 - 1e-9)]))
    far = jnp.asarray(_arc([0.0, a * (1 + 1e-9)]))
    assert float(fraction_clustered(near, delta=delta)) == 1.0
    assert float(fraction_clustered(far, delta=delta)) == 0.0


# ----------------------------------------------------------------------------------------------
# cluster counts


@pytest.mark.parametrize("sizes", [(3, 1, 4, 2), (6,), (1, 1, 1, 1, 1), (10, 2)])
def test_counts_on_exact_clusters(rng, sizes):
    x = jnp.asarray(_clusters(rng, sizes, d=6, jitter=1e-6))
    assert int(cluster_count(x)) == len(sizes)
    assert int(cluster_count_rank(x)) == len(sizes)
    labels = np.asarray(cluster_labels(x))
    starts = np.cumsum((0,) + sizes[:-1])
    np.testing.assert_array_equal(labels, np.repeat(starts, sizes))


def test_chain_components_versus_rank():
    """A chain x1 ~ x2 ~ x3 with x1 !~ x3 is one component, but the thresholded Gram has rank 3.

    Spacing 0.01 rad: 1 - cos(0.01) = 5.0e-5 < 1e-4 (neighbours close), 1 - cos(0.02) = 2.0e-4 > 1e-4.
    The tridiagonal all-ones matrix of size m has determinant D_m = D_{m-1} - D_{m-2} (1, 0, -1,
    -1, 0, 1, ...), so its rank is m except m = 2, 5, 8, ... where it is m - 1.
    """
    for m, rank in [(2, 1), (3, 3), (4, 4), (5, 4), (6, 6)]:
        x = jnp.asarray(_arc(0.01 * np.arange(m)))
        assert int(cluster_count(x)) == 1
        assert int(cluster_count_rank(x)) == rank
    # a chain of three next to a separate tight pair: 2 components, rank 3 + 1 = 4
    x = np.concatenate([_arc(0.01 * np.arange(3)), _arc([2.0, 2.0 + 1e-4])])
    assert int(cluster_count(jnp.asarray(x))) == 2
    assert int(cluster_count_rank(jnp.asarray(x))) == 4
    np.testing.assert_array_equal(np.asarray(cluster_labels(jnp.asarray(x))), [0, 0, 0, 3, 3])


def test_long_chain_converges():
    # worst case for label propagation: a chain of 200 in reversed index order
    x = _arc(0.01 * np.arange(200)[::-1], d=2)
    assert int(jax.jit(cluster_count)(jnp.asarray(x))) == 1
    assert int(cluster_count(jnp.asarray(x), threshold=1e-5)) == 200


def _noisy_clusters(rng, n=40, d=3, centres=5, spread=0.03):
    c = _unit_rows(rng.standard_normal((centres, d)))
    return _unit_rows(c[rng.integers(centres, size=n)] + spread * rng.standard_normal((n, d)))


def test_counts_vmap_and_jit_equal_loop_and_scipy(rng):
    batch = np.stack([_noisy_clusters(rng) for _ in range(12)])
    threshold = 2e-3
    xs = jnp.asarray(batch)
    count_v = np.asarray(jax.vmap(lambda x: cluster_count(x, threshold=threshold))(xs))
    rank_v = np.asarray(jax.vmap(lambda x: cluster_count_rank(x, threshold=threshold))(xs))
    count_j = jax.jit(cluster_count, static_argnames="threshold")
    ref_components, ref_rank = [], []
    for i, x in enumerate(batch):
        adj = x @ x.T > 1 - threshold
        ref_components.append(connected_components(adj, directed=False)[0])
        ref_rank.append(np.linalg.matrix_rank(adj.astype(float)))
        assert int(count_j(xs[i], threshold=threshold)) == count_v[i]
    np.testing.assert_array_equal(count_v, ref_components)
    np.testing.assert_array_equal(rank_v, ref_rank)
    assert np.all(rank_v >= count_v)  # rank never undercounts components
    assert len(set(count_v.tolist())) > 1, "batch should hold different cluster numbers"
    # labels are component minima: same partition as SciPy's labelling
    for x, labels in zip(batch, np.asarray(jax.vmap(cluster_labels, (0, None))(xs, threshold))):
        ref = connected_components(x @ x.T > 1 - threshold, directed=False)[1]
        for i, j in itertools.combinations(range(len(x)), 2):
            assert (labels[i] == labels[j]) == (ref[i] == ref[j])
        assert np.all(labels <= np.arange(len(x)))


# ----------------------------------------------------------------------------------------------
# time series


def test_time_to_one_cluster():
    ts = 0.5 * np.arange(10)
    counts = np.array([5, 3, 3, 2, 1, 1, 2, 1, 1, 1])
    assert float(time_to_one_cluster(ts, counts)) == 3.5  # the return to 2 resets the clock
    never = np.array([5, 3, 3, 2, 1, 1, 2, 1, 1, 2])
    assert float(time_to_one_cluster(ts, never)) == np.inf
    assert float(time_to_one_cluster(ts, np.ones(10, int))) == 0.0
    batch = jnp.asarray(np.stack([counts, never, np.ones(10, int), np.r_[np.full(9, 2), 1]]))
    got = jax.jit(jax.vmap(time_to_one_cluster, (None, 0)))(jnp.asarray(ts), batch)
    np.testing.assert_array_equal(np.asarray(got), [3.5, np.inf, 0.0, 4.5])


def test_plateaus():
    ts = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 9.0])
    counts = np.array([5, 5, 3, 3, 3, 2, 1, 1])
    got = plateaus(ts, counts)
    assert got == [
        Plateau(0.0, 2.0, 5),
        Plateau(2.0, 6.0, 3),
        Plateau(6.0, 8.0, 2),
        Plateau(8.0, 9.0, 1),
    ]
    assert sum(p.duration for p in got) == ts[-1] - ts[0]
    assert max(got, key=lambda p: p.duration if p.count > 1 else -1) == Plateau(2.0, 6.0, 3)
    assert plateaus([0.0], [4]) == [Plateau(0.0, 0.0, 4)]
    with pytest.raises(ValueError, match="non-decreasing"):
        plateaus([1.0, 0.0], [1, 1])
    with pytest.raises(ValueError, match="one cluster count per time"):
        plateaus([0.0, 1.0], [1, 1, 1])


def test_diagnostics_errors():
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        cluster_count(jnp.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="threshold=0"):
        cluster_count(jnp.eye(3), threshold=0)
    with pytest.raises(ValueError, match="delta=3"):
        fraction_clustered(jnp.eye(3), delta=3.0)
    with pytest.raises(ValueError, match="at least 2"):
        fraction_clustered(jnp.eye(1))
    with pytest.raises(ValueError, match="bins"):
        inner_product_histogram(jnp.eye(3), bins=0)


# ----------------------------------------------------------------------------------------------
# Wendel (Thm 6.7)


def test_wendel_exact_cases():
    assert wendel_probability(3, 2, exact=True) == Fraction(3, 4)
    assert wendel_probability(3, 2) == 0.75
    assert wendel_probability(6, 3, exact=True) == Fraction(1, 2)
    for d in range(2, 6):
        assert wendel_probability(2, d) == 1.0
    for n in range(1, 8):
        assert wendel_probability(n, n) == 1.0 and wendel_probability(n, n + 3) == 1.0
        assert wendel_probability(n, 1, exact=True) == Fraction(1, 2 ** (n - 1))  # S^0 = {-1, 1}
    # d = n - 1: the sum misses only C(n-1, n-1) = 1 of the 2^{n-1}
    assert wendel_probability(10, 9, exact=True) == 1 - Fraction(1, 2**9)
    with pytest.raises(ValueError, match="n=0"):
        wendel_probability(0, 3)
    with pytest.raises(ValueError, match="d=2.5"):
        wendel_probability(3, 2.5)


def _zero_in_hull(x):
    """Batched test that 0 lies in conv(x_1..x_n) in R^d, for points in general position.

    Carathéodory: 0 is in the hull iff it is in the simplex of some d + 1 of the points, i.e. the
    barycentric solve [x_S; 1] mu = [0; 1] has mu >= 0. Points lie in an open hemisphere iff 0 is
    not in their hull (strict separation of the compact convex hull from 0).
    """
    b, n, d = x.shape
    inside = np.zeros(b, dtype=bool)
    rhs = np.zeros(d + 1)
    rhs[-1] = 1.0
    for subset in itertools.combinations(range(n), d + 1):
        m = np.concatenate([x[:, subset, :].transpose(0, 2, 1), np.ones((b, 1, d + 1))], axis=1)
        mu = np.linalg.solve(m, np.broadcast_to(rhs, (b, d + 1))[..., None])[..., 0]
        inside |= np.all(mu >= 0, axis=1)
    return inside


def test_hull_criterion_agrees_with_linprog(rng):
    x = rng.standard_normal((150, 6, 3))
    hull = _zero_in_hull(x)
    for xi, h in zip(x, hull):
        # find w with <x_i, w> >= 1 for all i (feasible iff an open hemisphere contains all x_i)
        res = linprog(np.zeros(3), A_ub=-xi, b_ub=-np.ones(6), bounds=[(None, None)] * 3)
        assert (res.status == 0) == (not h)


@pytest.mark.parametrize("n, d", [(6, 3), (5, 2), (7, 4)])
def test_wendel_monte_carlo(rng, n, d):
    draws = 20000
    x = rng.standard_normal((draws, n, d))  # Gaussian directions are uniform on the sphere
    p_hat = 1.0 - _zero_in_hull(x).mean()
    p = wendel_probability(n, d)
    se = math.sqrt(p * (1 - p) / draws)
    assert abs(p_hat - p) < 4 * se, (p_hat, p, se)


# ----------------------------------------------------------------------------------------------
# Thm 6.8: gamma_beta


# One output grid size for every gamma_beta call below: gamma_beta is jitted per (kind, shape), so
# the tests compile each kind once.
_T = 49


@pytest.mark.parametrize("kind", ["SA", "USA"])
@pytest.mark.parametrize("n", [2, 5, 32])
def test_gamma_beta_matches_solve_ivp(kind, n):
    ts = np.linspace(0.0, 12.0, _T)
    for beta in [0.0, 0.7, 4.0, 9.0]:
        # tolerances tighter than DOP853's usual 1e-12 so that the reference error (~2e-12)
        # stays well below the asserted 1e-10
        ref = solve_ivp(
            _gamma_rhs(kind, beta, n),
            (0.0, ts[-1]),
            [0.0],
            method="DOP853",
            rtol=1e-13,
            atol=1e-14,
            t_eval=ts,
        ).y[0]
        got = np.asarray(gamma_beta(jnp.asarray(ts), beta, n, kind))
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("n", [2, 3, 32, 1024])
def test_gamma_beta_closed_form_at_beta_zero(n):
    # SA and USA coincide at beta = 0: gamma' = 2(1 - gamma)((n-1) gamma + 1)/n, logistic in L
    ts = np.linspace(0.0, 24.0, _T)
    exact = np.expm1(2 * ts) / (np.exp(2 * ts) + n - 1)
    for kind in ["SA", "USA"]:
        got = np.asarray(gamma_beta(jnp.asarray(ts), 0.0, n, kind))
        np.testing.assert_allclose(got, exact, rtol=0, atol=1e-13)
    if n == 2:
        np.testing.assert_allclose(got, np.tanh(ts), atol=1e-13)  # docs/particles.md, oracle 1


def test_gamma_beta_vmap_over_beta_equals_loop():
    ts = jnp.linspace(0.0, 30.0, _T)
    betas = jnp.linspace(0.1, 9.0, 6)
    sweep = jax.jit(jax.vmap(lambda b: gamma_beta(ts, b, 32)))(betas)
    loop = jnp.stack([gamma_beta(ts, b, 32) for b in betas])
    # Equal to the solver's accuracy, not bitwise: at rtol = 1e-13 the batched and unbatched
    # programs round differently and the step-size controller may accept different steps.
    np.testing.assert_allclose(np.asarray(sweep), np.asarray(loop), rtol=0, atol=1e-11)
    assert np.all(np.diff(np.asarray(sweep), axis=1) >= 0)  # gamma increases in t


@pytest.mark.slow
def test_gamma_beta_lengths_share_a_compilation():
    # Output lengths 9 … 16 are padded to 16: one compilation, and the padding changes nothing
    # (equal to the unpadded solve bit for bit).
    from workbench.particles import _theory

    grids = [jnp.linspace(0.0, 10.0, size) for size in range(9, 17)]
    before = _theory._gamma_beta._cache_size()
    got = [gamma_beta(ts, 3.0, 16) for ts in grids]
    assert _theory._gamma_beta._cache_size() - before <= 1  # 0 if another test compiled it
    kw = dict(kind="SA", rtol=1e-13, atol=1e-13, max_steps=16384)
    for ts, g in zip(grids, got):
        direct = _theory._gamma_beta(ts, jnp.asarray(3.0), jnp.asarray(16.0), **kw)
        assert g.shape == ts.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(direct))


@pytest.mark.parametrize("kind", ["SA", "USA"])
def test_gamma_matches_particle_system_from_orthogonal_start(kind):
    """Thm 6.8 / oracle 2: from x(0) = I every off-diagonal Gram entry equals gamma_beta(t)."""
    n, beta = 4, 1.5
    ts = np.linspace(0.0, 3.0, _T)
    sol = solve_ivp(
        _particle_rhs(kind, beta, n, n),
        (0.0, ts[-1]),
        np.eye(n).ravel(),
        method="DOP853",
        rtol=1e-12,
        atol=1e-13,
        t_eval=ts,
    )
    pairs = np.stack(
        [np.asarray(pair_inner_products(jnp.asarray(y.reshape(n, n)))) for y in sol.y.T]
    )
    gamma = np.asarray(gamma_beta(jnp.asarray(ts), beta, n, kind))
    np.testing.assert_allclose(pairs, np.broadcast_to(gamma[:, None], pairs.shape), atol=1e-9)


# ----------------------------------------------------------------------------------------------
# Thm 6.9: Gamma_infinity


@pytest.mark.parametrize("kind", ["SA", "USA"])
@pytest.mark.parametrize("n, delta", [(32, 1e-3), (2, 1e-3), (8, 1e-6), (512, 1e-2)])
def test_gamma_infinity_quadrature_vs_root_finding(kind, n, delta):
    betas = np.array([0.0, 0.5, 2.0, 5.0, 9.0])
    got = np.asarray(gamma_infinity(jnp.asarray(betas), delta, n, kind))
    assert got.shape == betas.shape
    for beta, t_star in zip(betas, got):
        event = lambda t, g: g[0] - (1 - delta)
        event.terminal = True
        sol = solve_ivp(
            _gamma_rhs(kind, beta, n),
            (0.0, 1e5),
            [0.0],
            method="DOP853",
            rtol=1e-13,
            atol=1e-14,
            events=event,
        )
        assert abs(t_star / sol.t_events[0][0] - 1) < 1e-8
    # the other route: our own ODE solution at t* is 1 - delta, up to 1e-12 plus the slope times a
    # relative time error of 1e-13 (the USA slope reaches ~150 for n = 512, beta = 9)
    for beta, t_star in zip(betas, got):
        g = float(gamma_beta(jnp.linspace(0.0, t_star, _T), beta, n, kind)[-1])
        slope = _gamma_rhs(kind, beta, n)(0.0, [1 - delta])[0]
        assert abs(g - (1 - delta)) < 1e-12 + 1e-13 * t_star * slope
    # beta = 0: dt/dL = 1/2, so t* = L_delta / 2
    l_delta = math.log((n - (n - 1) * delta) / delta)
    assert abs(got[0] - l_delta / 2) < 1e-14 * l_delta


def test_gamma_infinity_paper_sweep():
    """Fig. 3's overlay: SA, n = 32, delta = 1e-3, 90 values of beta in (0, 9], one call."""
    betas = jnp.linspace(0.1, 9.0, 90)
    t_star = np.asarray(jax.jit(gamma_infinity)(betas))
    assert t_star.shape == (90,) and np.all(np.isfinite(t_star))
    # SA: dL/dt = 2n / (e^{beta (1 - gamma)} + n - 1) decreases in beta, so t* increases
    assert np.all(np.diff(t_star) > 0)
    # reference values: mpmath quadrature of dt/dgamma at 30 digits
    np.testing.assert_allclose(t_star[[0, -1]], [5.192063118174005, 178.73092951903913], rtol=1e-13)
    # USA: dL/dt = 2 e^{beta gamma} increases in beta, so t* decreases
    assert np.all(np.diff(np.asarray(gamma_infinity(betas, kind="USA"))) < 0)


@pytest.mark.parametrize("cls", [SA, USA])
def test_gamma_infinity_takes_the_dynamics_object(cls):
    # β and the kind come from the object: a filter_vmap batch gives bitwise the numbers of the
    # old call with an array of β and kind="SA" / "USA"; one instance gives its scalar, and jit
    # the same to 1e-15 (XLA's fusion may move the last bit).
    betas = jnp.linspace(0.1, 9.0, 20)
    want = np.asarray(gamma_infinity(betas, 1e-3, 32, cls.__name__))
    batch = eqx.filter_vmap(cls)(betas)
    np.testing.assert_array_equal(np.asarray(gamma_infinity(batch, 1e-3, 32)), want)
    jitted = np.asarray(jax.jit(gamma_infinity)(batch))
    np.testing.assert_allclose(jitted, want, rtol=1e-15, atol=0)
    one = gamma_infinity(cls(float(betas[3])), delta=1e-3, n=32)
    assert one.shape == ()
    np.testing.assert_allclose(float(one), want[3], rtol=1e-15, atol=0)
    np.testing.assert_array_equal(
        np.asarray(gamma_infinity(batch, 1e-6, 8)),
        np.asarray(gamma_infinity(betas, 1e-6, 8, kind=cls.__name__)),
    )
    assert np.all(np.diff(want) > 0) if cls is SA else np.all(np.diff(want) < 0)


def test_gamma_infinity_refuses_what_the_theorem_does_not_cover():
    q = jnp.eye(3)
    ffn = FFNAugmented(SA(1.0), w=np.zeros((3, 2)), a=np.zeros((2, 3)), b=np.zeros(2))
    cases = [
        (SA(1.0, Q=q), "has Q given; Thm 6.9 .* Q = K = V = I"),
        (eqx.filter_vmap(lambda b: USA(b, K=q, V=q))(jnp.ones(2)), "has K, V given"),
        (SA(1.0, repulsive=True), "repulsive=True"),
        (SA, "dynamics=SA is a constructor; pass an instance"),
        (Hardmax(), "type Hardmax is not supported; valid choices"),
        (ffn, "type FFNAugmented is not supported"),
    ]
    for dynamics, match in cases:
        with pytest.raises(ValueError, match=match):
            gamma_infinity(dynamics)
    with pytest.raises(ValueError, match="kind='USA' with a dynamics object"):
        gamma_infinity(SA(1.0), kind="USA")


def test_theory_argument_errors():
    with pytest.raises(ValueError, match="kind='MHA'.*'SA', 'USA'"):
        gamma_beta(jnp.array([1.0]), 1.0, 4, kind="MHA")
    with pytest.raises(ValueError, match="n=1"):
        gamma_infinity(1.0, n=1)
    with pytest.raises(ValueError, match="delta=1.5"):
        gamma_infinity(1.0, delta=1.5)
    with pytest.raises(ValueError, match="ts must be"):
        gamma_beta(jnp.ones((2, 2)), 1.0, 4)
    with pytest.raises(ValueError, match="d=1"):
        tau_star(1.0, 1)
    with pytest.raises(ValueError, match=r"w has shape \(2,\)"):
        hemisphere_margin(jnp.eye(3), jnp.ones(2))


# ----------------------------------------------------------------------------------------------
# rates, Thm 5.1, Lemma 6.4


def test_clustering_rate_bound():
    betas = jnp.array([0.0, 1.0, 9.0])
    np.testing.assert_allclose(
        np.asarray(clustering_rate_bound(32, betas)),
        1 / (64 * np.exp(2 * np.asarray(betas))),
        rtol=1e-15,
    )


def test_tau_star_solves_its_equation():
    betas = np.array([0.0, 1e-3, 0.3, 1.0, 9.0, 100.0, 1e4, 1e8])
    for d in [2, 3, 8, 128, 1024]:
        tau = np.asarray(tau_star(jnp.asarray(betas), d))
        assert np.all((tau > 0) & (tau <= np.pi / 2))
        assert np.all(np.diff(tau) < 0)  # decreasing in beta
        residual = betas * np.sin(tau) ** 2 - (d - 1) * np.cos(tau)
        assert np.max(np.abs(residual) / np.maximum(betas, d - 1)) < 1e-12
    assert float(tau_star(0.0, 3)) == np.pi / 2
    # large beta: tau* ~ sqrt((d - 1)/beta), kept to full relative accuracy (no arccos cancellation)
    np.testing.assert_allclose(float(tau_star(1e12, 5)), math.sqrt(4 / 1e12), rtol=1e-11)


@pytest.mark.parametrize("n, d", [(2, 3), (3, 2), (32, 2), (32, 128), (100, 8)])
def test_large_beta_threshold_and_condition(n, d):
    beta_c = float(large_beta_threshold(n, d))
    if n == 2:
        assert beta_c == 0.0
        assert bool(large_beta_condition(1e-6, n, d))
        return
    # tau*(beta_c) = pi / (2 (n - 1)) and the condition switches there
    np.testing.assert_allclose((n - 1) * float(tau_star(beta_c, d)), np.pi / 2, rtol=1e-13)
    assert not bool(large_beta_condition(beta_c * (1 - 1e-9), n, d))
    assert bool(large_beta_condition(beta_c * (1 + 1e-9), n, d))
    betas = jnp.asarray(beta_c * np.array([0.5, 0.99, 1.01, 2.0]))
    np.testing.assert_array_equal(
        np.asarray(jax.vmap(lambda b: large_beta_condition(b, n, d))(betas)),
        [False, False, True, True],
    )
    # Thm 5.1's C(d) n^2 scaling: beta_c / (4 (d-1)(n-1)^2 / pi^2) -> 1 (error O(1/n^2))
    ratio = beta_c / (4 * (d - 1) * (n - 1) ** 2 / np.pi**2)
    assert abs(ratio - 1) < 1.0 / (n - 1) ** 2


def test_hemisphere_margin_value_and_invariance(rng):
    n, d, beta = 8, 3, 2.0
    w = _unit_rows(rng.standard_normal(d))
    x0 = _unit_rows(rng.standard_normal((n, d)))
    x0 = x0 * np.sign(x0 @ w)[:, None]  # flip into the open hemisphere of w
    assert float(hemisphere_margin(jnp.asarray(x0), jnp.asarray(w))) == pytest.approx(
        np.min(x0 @ w)
    )
    assert float(hemisphere_margin(jnp.asarray(x0), jnp.asarray(w))) > 0
    for kind in ["SA", "USA"]:
        ts = np.linspace(0.0, 6.0, 121)
        sol = solve_ivp(
            _particle_rhs(kind, beta, n, d),
            (0.0, 6.0),
            x0.ravel(),
            rtol=1e-11,
            atol=1e-12,
            t_eval=ts,
        )
        margins = np.array(
            [
                float(hemisphere_margin(jnp.asarray(y.reshape(n, d)), jnp.asarray(w)))
                for y in sol.y.T
            ]
        )
        assert np.all(np.diff(margins) >= -1e-10), np.min(np.diff(margins))
        assert margins[-1] > margins[0]
