"""Training and saving models whose controls live in a basis (`wb.to_basis`, `wb.Legendre`):
the direction of a coarse multi-resolution draw is the exact gradient of `θ ↦ J(coarsen(θ))`,
and a saved model comes back with identical outputs. Float64 (tests/conftest.py)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import workbench as wb
import workbench.control as wbc
from workbench.control._discretizations import with_discretization
from workbench.control._saved_models import load_model

from helpers import tiny_data, tiny_model


def _bumped(tree):
    """Values that are not the initial ones (a zero bias or head hides a mix-up)."""
    return jax.tree.map(
        lambda a: (
            a + 0.05 * jnp.sin(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape)
            if eqx.is_inexact_array(a)
            else a
        ),
        tree,
    )


def _models(key):
    """A 4-layer model as layers (PC(4), 2 steps per layer) and in Legendre(3) (8 steps)."""
    layers = _bumped(tiny_model(key, layers=4, steps_per_layer=2))
    return {"layers": layers, "legendre": wb.to_basis(layers, wb.LegendreBasis(3))}


def _coarse_step(step, model, key):
    """The first training step whose drawn candidate is the coarse one (`coarsen = 2`)."""
    candidates = step.discretization.candidates(model)
    coarse = [i for i, c in enumerate(candidates) if c[2] == 2]
    assert len(coarse) == 1
    for k in range(64):
        step_key = jax.random.fold_in(key, k)
        if int(step.discretization.index(jax.random.fold_in(step_key, 1), k)) == coarse[0]:
            return k, candidates[coarse[0]]
    raise AssertionError("no coarse draw in 64 steps")


@pytest.mark.parametrize("kind", ["layers", "legendre"])
def test_a_coarse_draw_applies_the_exact_gradient_of_the_coarsened_objective(getkey, rng, kind):
    """For a coarse draw (`MultiResolution(..., coarsen=(2,))`), the direction `TrainStep`
    applies equals `jax.grad` of `θ ↦ J(P θ)` with `P` the L² projection onto half the basis
    (computed here by `wb.to_basis`, the quadrature projection, not by `coarsen`), `J` the
    objective (cross-entropy, kinetic energy, control norm and smoothness) of the coarse model
    solved with the drawn scheme and steps (float64, 1e-10 relative to the gradient's size)."""
    model = _models(getkey())[kind]
    data = tiny_data(rng, n=6)
    batch = (jnp.asarray(data.inputs), jnp.asarray(data.targets))
    objective = wbc.Objective(
        kinetic=wbc.KineticEnergy(0.1),
        controls=(wbc.ControlNorm(1e-2), wbc.ControlSmoothness(1e-2)),
    )
    step = wbc.TrainStep(
        optax.sgd(1.0),
        objective=objective,
        discretization=wbc.MultiResolution((3,), coarsen=(2,)),
    )
    key = getkey()
    k, (scheme, steps, factor) = _coarse_step(step, model, key)
    coarse_basis = wb.LegendreBasis(1) if kind == "legendre" else wb.PiecewiseConstantBasis(2)
    # Half the steps of the model's own grid: 8 → 4 over [0, T] (Legendre) or 2 per layer of
    # the coarse grid, twice as long (layers).
    assert steps == (4 if kind == "legendre" else 1) and factor == 2

    def coarse_objective(params):
        m = eqx.combine(params, static)
        coarse = with_discretization(wb.to_basis(m, coarse_basis), scheme, steps)
        return objective(coarse, *batch)[0]

    params, static = eqx.partition(model, eqx.is_inexact_array)
    value, grad = jax.jit(jax.value_and_grad(coarse_objective))(params)
    (got_value, _), direction = eqx.filter_jit(step.value_and_direction)(model, batch, key, k)
    np.testing.assert_allclose(float(got_value), float(value), rtol=1e-12)
    want = jax.tree.leaves(grad)
    got = jax.tree.leaves(eqx.filter(direction, eqx.is_inexact_array))
    assert len(got) == len(want)
    scale = max(float(jnp.max(jnp.abs(g))) for g in want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-10 * scale)
    # The coarse draw leaves the fine half of the Legendre coefficients untouched.
    if kind == "legendre":
        term = direction.transformer.equation.operators[0].term
        np.testing.assert_array_equal(np.asarray(term.values.query[2:]), 0.0)


def _same(a, b):
    la = jax.tree.leaves(eqx.filter(a, eqx.is_array))
    lb = jax.tree.leaves(eqx.filter(b, eqx.is_array))
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("basis", [wb.LegendreBasis(2), wb.PiecewiseLinearBasis(3)])
def test_a_model_in_a_basis_is_saved_and_read_back(getkey, tmp_path, basis):
    """`save_model` / `load_model` of a Legendre (and an Interpolated) model: the same arrays,
    tree and controls (`t1` kept), identical outputs at its own and at another discretization."""
    model = wb.to_basis(_bumped(tiny_model(getkey(), layers=3)), basis)
    x = jax.random.normal(getkey(), (2, 4, 4), jnp.float64)
    wbc.save_model(tmp_path, model)
    back = load_model(tmp_path)
    _same(back, model)
    term = back.transformer.equation.operators[0].term
    assert type(term) is type(model.transformer.equation.operators[0].term)
    assert term.t1 == pytest.approx(3.0)
    predict = eqx.filter_jit(lambda m: jax.vmap(m)(x))
    np.testing.assert_array_equal(np.asarray(predict(back)), np.asarray(predict(model)))
    fine = lambda m: predict(m.rediscretize(wb.schemes.Strang(), 7))
    np.testing.assert_array_equal(np.asarray(fine(back)), np.asarray(fine(model)))


def test_multi_resolution_training_of_a_legendre_model_and_load_run(getkey, rng, tmp_path):
    """`wbc.MultiResolution((2, 3, 5), coarsen=(2,))` trains a Legendre(3) model (4
    coefficients, 8 steps over `[0, T]`; coarse draws solve the first 2 with 4 steps) in a run
    folder: the objective on the data at the model's own discretization falls by a fifth or
    more in 24 Adam steps, and `wbc.load_run` gives the trained model bit for bit, with
    identical outputs."""
    model = wb.to_basis(tiny_model(getkey(), layers=4, steps_per_layer=2), wb.LegendreBasis(3))
    discretization = wbc.MultiResolution((2, 3, 5), coarsen=(2,))
    lie = wb.schemes.LieTrotter()
    assert discretization.candidates(model) == ((lie, 2, 1), (lie, 3, 1), (lie, 5, 1), (lie, 4, 2))
    data = tiny_data(rng, n=16)
    step = wbc.TrainStep(optax.adam(2e-2), discretization=discretization)
    result = wbc.train(step, model, data, steps=24, batch_size=8, run_dir=tmp_path, progress=False)
    objective = eqx.filter_jit(
        lambda m: wbc.Objective()(m, jnp.asarray(data.inputs), jnp.asarray(data.targets))[0]
    )
    before, after = float(objective(model)), float(objective(result.model))
    assert after < 0.8 * before, (before, after)
    back = wbc.load_run(tmp_path)
    _same(back, result.model)
    assert isinstance(back.transformer.equation.operators[1].projection, wb.Legendre)
    assert back.transformer.steps_per_layer == 8
    x = jnp.asarray(data.inputs[:3])
    predict = eqx.filter_jit(lambda m: jax.vmap(m)(x))
    np.testing.assert_array_equal(np.asarray(predict(back)), np.asarray(predict(result.model)))


@pytest.mark.parametrize("steps_per_layer, expected", [(3, 2), (5, 3), (4, 2)])
def test_to_basis_keeps_the_total_steps_or_rounds_half_up(getkey, steps_per_layer, expected):
    """Two layers of `k` steps onto four: `2k` steps where 4 divides it, else the nearest
    multiple of 4, a tie (6, 10) to the larger."""
    model = tiny_model(getkey(), layers=2, steps_per_layer=steps_per_layer)
    moved = wb.to_basis(model, wb.PiecewiseConstantBasis(4))
    assert moved.transformer.num_layers == 4
    assert moved.transformer.steps_per_layer == expected
