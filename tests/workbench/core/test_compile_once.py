"""The documentation's "compiles once" claims, counted with `chex.assert_max_traces`.

A function wrapped by `chex.assert_max_traces(fn, n)` raises once it has been called more than
`n` times with tracers, i.e. traced more than `n` times. Each test wraps the Python function that
runs inside the claimed compilation (a method called while the library's own jitted function is
traced, or the un-jitted body of a module-level jit re-jitted with the library's layout), calls
the library repeatedly with new values of the same shapes, checks the number of traces (at most
`n` through chex, and at least once, so the wrapper was really on the path), and compares the
values with an independent computation.

- `phase_diagram` compiles its chunk kernel once per mesh (`_phase_kernel._chunk`, `CellMesh`
  is a static argument: equal meshes are equal), whatever the number of chunks or calls.
- A composition scheme (`Yoshida4`, `Suzuki4`) traces the operators of one Strang step, not one
  per weight (docs/equations.md: a `lax.scan` over the weights).
- `cluster_labels` / `cluster_count` compile once per `n` when called eagerly (`_diagnostics`).
- Gaussian draws (models, random starts, Krylov start vectors) share a few sampler programs.
"""

import functools
import math

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.sparse.csgraph import connected_components

import workbench as wb
from workbench import particles as P
from workbench._equation import Equation
from workbench.particles import _diagnostics
from workbench.particles._phase_kernel import _chunk, _Kernel

from helpers import small_encoder


@pytest.fixture(autouse=True)
def _fresh_trace_counter():
    chex.clear_trace_counter()
    yield
    chex.clear_trace_counter()


def _counted(fn, calls: list):
    """`fn`, appending to `calls` on every call made with tracers (a trace), as chex counts."""

    @functools.wraps(fn)
    def counted(*args, **kwargs):
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((args, kwargs))):
            calls.append(None)
        return fn(*args, **kwargs)

    return counted


def test_phase_diagram_compiles_once_per_mesh(monkeypatch):
    """Two diagrams of the same shapes (new β, new starts, several padded chunks each, and a
    second, equal `CellMesh` built from an explicit device list) trace the chunk kernel once:
    `_Kernel.curve` runs once per trace of the library's jitted `_chunk`. The second diagram's
    cells equal jitted `clustering_curve` runs exactly (float64)."""
    kw = dict(dt=0.1, save_ts=np.array([0.0, 2.0, 5.0, 9.0]))
    sa = eqx.filter_vmap(P.SA)
    first = (sa(jnp.asarray([0.5, 3.0, 8.0])), P.random_starts(jax.random.key(1), 5, 6, 4))
    second = (sa(jnp.asarray([1.0, 4.0, 9.0])), P.random_starts(jax.random.key(2), 5, 6, 4))
    curve = jax.jit(lambda b, x: P.clustering_curve(P.SA(b), x, **kw))
    want = np.array([[curve(b, x) for x in second[1]] for b in second[0].beta])
    assert want.max() > 0 and want.min() == 0  # not a degenerate diagram

    _chunk.clear_cache()  # the count must not depend on what earlier tests compiled
    calls = []
    monkeypatch.setattr(_Kernel, "curve", chex.assert_max_traces(_counted(_Kernel.curve, calls), 1))
    # chunk_size=4 over 3 × 5 cells: several chunks, the last padded, per diagram.
    run = dict(chunk_size=4, per_start=True, progress=False, **kw)
    P.phase_diagram(*first, **run)
    got = P.phase_diagram(*second, devices=jax.devices(), **run)
    assert len(calls) == 1
    chex.assert_trees_all_equal(got.per_start, want)
    chex.assert_trees_all_close(got.fraction, want.mean(axis=1), rtol=0, atol=1e-15)


def _unrolled_step(eq, scheme, t, u, tau):
    """One step by the definition: the sub-flows of `scheme.stages` left to right, unrolled
    (piecewise-constant controls: localized to the step's layer)."""
    local = eq.localize(math.floor((t + tau / 2) / eq.piece_length))
    clock = t
    for k, a in scheme.stages(len(eq.operators)):
        u = local.subflow(k, scheme.inner, clock, u, a * tau, None, clock_moves=(k == 0))
        clock = clock + a * tau if k == 0 else clock
    return u


@pytest.mark.parametrize(
    "scheme", [wb.schemes.Yoshida4(), wb.schemes.Suzuki4()], ids=["yoshida4", "suzuki4"]
)
def test_a_composition_traces_the_operators_of_one_strang_step(scheme, monkeypatch, rng):
    """A jitted composition step, called with two equations of the same shapes and new
    (t, u, τ) (a step in another layer), traces `Equation.subflow` as often as one Strang step
    has substeps (3 for two operators), not once per substep of the composition (9 or 15).
    The second call equals the unrolled stages to 1e-13 (float64)."""
    _, first = small_encoder(rng, d=8, heads=2, layers=2, dff=16, norm_first=True)
    _, other = small_encoder(
        np.random.default_rng(7), d=8, heads=2, layers=2, dff=16, norm_first=True
    )
    eq1, eq2 = first.equation, other.equation
    u1, u2 = (jnp.asarray(rng.normal(size=(6, 8))) for _ in range(2))
    want = _unrolled_step(eq2, scheme, 1.2, u2, 0.3)

    per_strang = len(wb.schemes.Strang(inner=scheme.inner).stages(len(eq1.operators)))
    assert per_strang == 3 and len(scheme.stages(len(eq1.operators))) >= 3 * per_strang
    calls = []
    subflow = _counted(Equation.subflow, calls)
    monkeypatch.setattr(Equation, "subflow", chex.assert_max_traces(subflow, per_strang))
    step = eqx.filter_jit(lambda eq, t, u, tau: wb.step(eq, scheme, t, u, tau))
    step(eq1, jnp.asarray(0.3), u1, jnp.asarray(0.4))
    got = step(eq2, jnp.asarray(1.2), u2, jnp.asarray(0.3))
    assert len(calls) == per_strang
    chex.assert_trees_all_close(got, want, rtol=0, atol=1e-13)


def _clustered(rng, n, d, centers, spread):
    """`n` unit vectors around `centers` random directions, each `spread` away (radians)."""
    c = rng.normal(size=(centers, d))
    x = c[rng.integers(centers, size=n)] + spread * rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _component_minima(x, threshold):
    """SciPy's connected components of `<x_i, x_j> > 1 − threshold`, each labelled by its
    smallest index."""
    _, comp = connected_components(x @ x.T > 1 - threshold, directed=False)
    return np.array([np.flatnonzero(comp == c).min() for c in comp])


def test_cluster_labels_compile_once_per_n(monkeypatch, rng):
    """Eager `cluster_labels` / `cluster_count` over many states (new values, thresholds and
    widths d) trace the label propagation once per particle count n: twice for n ∈ {8, 12}.
    The labels are SciPy's components labelled by their minima, the counts their number."""
    body = _diagnostics._component_labels
    assert isinstance(body, type(jax.jit(abs)))  # jitted once, at module level
    calls = []
    # The module-level jit's own body, re-jitted as the library does (`jax.jit`, no static
    # arguments), looked up by `cluster_labels` at call time.
    wrapped = jax.jit(chex.assert_max_traces(_counted(body.__wrapped__, calls), 2))
    monkeypatch.setattr(_diagnostics, "_component_labels", wrapped)
    counts = set()
    for n in (8, 12, 8, 12):
        for d, threshold in ((3, 1e-2), (5, 1e-3), (3, 0.5)):
            x = _clustered(rng, n, d, centers=3, spread=0.02)
            want = _component_minima(x, threshold)
            got = P.cluster_labels(jnp.asarray(x), threshold)
            chex.assert_trees_all_equal(np.asarray(got), want)
            count = int(P.cluster_count(jnp.asarray(x), threshold))
            assert count == len(set(want.tolist()))
            counts.add(count)
    assert len(calls) == 2
    assert len(counts) > 1  # the states hold different numbers of clusters


def test_gaussian_draws_of_many_shapes_share_one_sampler():
    """`workbench._random.normal` is `scale * jax.random.normal` bit for bit (float32 and
    float64, shapes of 1 to 5 000 numbers, a traced key too), and every shape up to 4 096
    numbers is cut from one compiled draw of 4 096: JAX's `normal` of the flat draw is
    compiled for two sizes (4 096, 8 192) here, not for nine shapes."""
    from workbench._random import normal

    shapes = [(1,), (3, 5), (8, 32, 8), (32, 32), (4, 32, 32), (7,), (65, 32), (100, 40), (5000,)]
    key = jax.random.key(3)
    jax.clear_caches()
    with jax.enable_x64(True):
        for dtype in (jnp.float32, jnp.float64):
            for i, shape in enumerate(shapes):
                k = jax.random.fold_in(key, i)
                want = 0.5 * jax.random.normal(k, shape, dtype)
                got = normal(k, shape, dtype, 0.5)
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        traced = jax.jit(lambda k: normal(k, (3, 5), jnp.float64))(key)
        np.testing.assert_array_equal(traced, jax.random.normal(key, (3, 5), jnp.float64))
    sizes = []
    original = jax.random.normal

    def counting(k, shape=(), dtype=float):
        sizes.append(tuple(shape))
        return original(k, shape, dtype)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jax.random, "normal", counting)
        for shape in shapes:
            normal(key, shape, jnp.float32)
    assert sorted(set(sizes)) == [(4096,), (8192,)]
