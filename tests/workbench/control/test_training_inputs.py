"""What training is given: every control cost reaches the MSA's Hamiltonian step (checked
against a built-in twin, the discrete gradient and closed forms), and bad data or loop
arguments are refused with one clear error before step 0."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import workbench.control as wbc
from workbench.control._data import check_data

from helpers import randomize_head, tiny_data, tiny_model, train

# --- user-written control costs (the public AbstractControlCost interface) ---------------------


def _control_arrays(transformer):
    """The stacked floating arrays of every operator's controls, written from the public API."""
    out = []
    for op in transformer.equation.operators:
        for control in (op.term, op.projection):
            if control is not None:
                out += jax.tree.leaves(eqx.filter(control.values, eqx.is_inexact_array))
    return out


class UserNorm(wbc.AbstractControlCost):
    """`λ h Σ‖θ‖²`, the value of `ControlNorm(λ)`, written by a user."""

    weight: float

    def __call__(self, transformer):
        h = transformer.equation.piece_length
        return self.weight * h * sum(jnp.sum(x**2) for x in _control_arrays(transformer))


class UserL1(wbc.AbstractControlCost):
    """`λ Σ|θ|`: a sparsity cost no built-in class has."""

    weight: float

    def __call__(self, transformer):
        return self.weight * sum(jnp.sum(jnp.abs(x)) for x in _control_arrays(transformer))


class OutputMapCost(wbc.AbstractControlCost):
    """`μ ‖γ_out‖²` on the final LayerNorm, a parameter that is not a control."""

    weight: float

    def __call__(self, transformer):
        return self.weight * jnp.sum(transformer.equation.output.weight**2)


class VectorCost(wbc.AbstractControlCost):
    def __call__(self, transformer):
        return jnp.stack([jnp.sum(x) for x in _control_arrays(transformer)])


def _msa(**kwargs):
    return eqx.filter_jit(wbc.SuccessiveApproximations(**kwargs).value_and_direction)


def _control_directions(direction):
    return _control_arrays(direction.transformer)


def _batch(rng, n=8):
    data = tiny_data(rng, n=n)
    return jnp.asarray(data.inputs), jnp.asarray(data.targets)


def test_msa_custom_twin_of_control_norm_gives_the_built_in_update(getkey, rng):
    """A user subclass equal in value to `ControlNorm(λ)` must give the built-in's MSA update to
    round-off (extended MSA, several inner steps, so the cost's gradient is used away from the
    current controls too); and the cost must matter (the update without it differs)."""
    model = randomize_head(tiny_model(getkey(), layers=3), getkey())
    xs, ys = _batch(rng)
    msa = _msa(rho=0.5, inner_steps=4, inner_learning_rate=1e-2, outer_learning_rate=0.1)
    runs = {
        name: msa(wbc.Objective(kinetic=wbc.KineticEnergy(0.1), controls=costs), model, xs, ys)
        for name, costs in (
            ("built-in", (wbc.ControlNorm(0.05),)),
            ("user", (UserNorm(0.05),)),
            ("none", ()),
        )
    }
    (v_builtin, aux_builtin), d_builtin = runs["built-in"]
    (v_user, aux_user), d_user = runs["user"]
    assert float(v_user) == pytest.approx(float(v_builtin), rel=1e-14)
    assert float(aux_user["control"]) == pytest.approx(float(aux_builtin["control"]), rel=1e-14)
    for a, b in zip(jax.tree.leaves(d_builtin), jax.tree.leaves(d_user), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12, atol=1e-15)
    # Non-vacuous: the cost moves the controls' update by far more than the tolerance above.
    change = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(_control_directions(d_builtin), _control_directions(runs["none"][1]))
    )
    assert change > 1e-4, change


def test_msa_l1_cost_first_inner_step_follows_the_discrete_gradient(getkey, rng):
    """Basic MSA, one Adam step of size η: each control moves by η g/(|g| + 1e-8) with
    g = ∂J/∂θ the gradient of the *reported* objective, L1 cost included (autodiff through the
    whole model, `DiscretizeThenOptimize`); the embedding, output map and head move by
    `outer_learning_rate` × their gradient, including a cost on the output map. λ is chosen so
    that the L1 term flips the sign of many entries of the gradient."""
    model = randomize_head(tiny_model(getkey()), getkey())
    xs, ys = _batch(rng)
    eta, outer = 1e-4, 0.5
    objective = wbc.Objective(controls=(UserL1(0.2), OutputMapCost(0.3)))
    (v_dto, _), g = eqx.filter_jit(wbc.DiscretizeThenOptimize().value_and_direction)(
        objective, model, xs, ys
    )
    (v_msa, _), d = _msa(
        rho=0.0, inner_steps=1, inner_learning_rate=eta, outer_learning_rate=outer
    )(objective, model, xs, ys)
    assert float(v_msa) == pytest.approx(float(v_dto), rel=1e-13)
    (_, _), g_plain = eqx.filter_jit(wbc.DiscretizeThenOptimize().value_and_direction)(
        wbc.Objective(), model, xs, ys
    )
    flipped, checked = 0, 0
    for a, b, a0 in zip(
        _control_directions(g), _control_directions(d), _control_directions(g_plain), strict=True
    ):
        a, b, a0 = np.asarray(a), np.asarray(b), np.asarray(a0)
        big = np.abs(a) > 1e-9
        np.testing.assert_allclose(b[big], eta * a[big] / (np.abs(a[big]) + 1e-8), rtol=1e-8)
        flipped += int(np.sum(np.sign(a[big]) != np.sign(a0[big])))
        checked += int(big.sum())
    assert checked > 0.9 * sum(x.size for x in _control_directions(g))
    assert flipped > 0.1 * checked, (flipped, checked)  # the L1 term decides these entries
    for part in (
        lambda m: m.embedding,
        lambda m: m.head,
        lambda m: m.transformer.equation.output,
    ):
        for a, b in zip(jax.tree.leaves(part(g)), jax.tree.leaves(part(d)), strict=True):
            np.testing.assert_allclose(np.asarray(b), outer * np.asarray(a), rtol=1e-10, atol=1e-14)
    # the output-map cost is in that step: μ · 2γ = 0.6 on γ = 1 dominates the loss's part
    gamma = np.asarray(d.transformer.equation.output.weight)
    gamma_plain = np.asarray(g_plain.transformer.equation.output.weight) * outer
    np.testing.assert_allclose(gamma - gamma_plain, outer * 0.3 * 2.0, rtol=1e-10)


def test_msa_l1_cost_with_zero_costates_moves_by_the_closed_form(getkey, rng):
    """With the zero-initialized head the costates vanish (∂logits/∂u = W = 0) and, with no
    kinetic cost and ρ = 0, layer l's inner problem is λ Σ|θ_l| alone: K Adam steps of a
    constant gradient s = λ sign(θ̄) move each entry by K η λ/(λ + 1e-8) against sign(θ̄)
    (entries farther than Kη from 0, which keep their sign). Without the cost nothing moves."""
    model = tiny_model(getkey())  # zero head
    xs, ys = _batch(rng)
    lam, eta, K = 0.01, 1e-3, 4
    msa = _msa(rho=0.0, inner_steps=K, inner_learning_rate=eta, outer_learning_rate=0.1)
    _, d = msa(wbc.Objective(controls=(UserL1(lam),)), model, xs, ys)
    _, d0 = msa(wbc.Objective(), model, xs, ys)
    step = K * eta * lam / (lam + 1e-8)
    checked = 0
    for theta, b, b0 in zip(
        _control_arrays(model.transformer),
        _control_directions(d),
        _control_directions(d0),
        strict=True,
    ):
        theta, b = np.asarray(theta), np.asarray(b)
        assert np.all(np.asarray(b0) == 0.0)
        far = np.abs(theta) > K * eta
        np.testing.assert_allclose(b[far], step * np.sign(theta[far]), rtol=1e-10)
        checked += int(far.sum())
    total = sum(x.size for x in _control_arrays(model.transformer))
    assert checked > 0.8 * total, (checked, total)  # all but the zero-initialized biases and β


def test_msa_smoothness_is_minimized_layer_by_layer_with_neighbours_held(getkey, rng):
    """Zero costates again: layer l minimizes C(θ^(l)) = (λ_s/h) Σ_{m ∈ nb(l)} ‖θ_l − θ̄_m‖² + const
    (its neighbours held at their current values). An independent optax Adam run on that
    hand-written function, layer by layer, gives the same displacement."""
    model = tiny_model(getkey(), layers=3)
    xs, ys = _batch(rng)
    lam, eta, K = 0.2, 1e-2, 5
    h = model.transformer.equation.piece_length
    msa = _msa(rho=0.0, inner_steps=K, inner_learning_rate=eta, outer_learning_rate=0.1)
    _, d = msa(wbc.Objective(controls=(wbc.ControlSmoothness(lam),)), model, xs, ys)
    thetas = _control_arrays(model.transformer)
    L = thetas[0].shape[0]
    adam = optax.adam(eta)
    for layer in range(L):
        neighbours = [m for m in (layer - 1, layer + 1) if 0 <= m < L]

        def cost(th):
            return sum(
                lam / h * jnp.sum((x - full[m]) ** 2)
                for x, full in zip(th, thetas)
                for m in neighbours
            )

        th = [full[layer] for full in thetas]
        state = adam.init(th)
        for _ in range(K):
            upd, state = adam.update(jax.grad(cost)(th), state, th)
            th = optax.apply_updates(th, upd)
        for full, new, b in zip(thetas, th, _control_directions(d), strict=True):
            np.testing.assert_allclose(
                np.asarray(b[layer]), np.asarray(full[layer] - new), rtol=1e-9, atol=1e-14
            )
    assert max(float(jnp.max(jnp.abs(b))) for b in _control_directions(d)) > 1e-2


def test_msa_refuses_a_cost_that_is_not_a_scalar_by_name(getkey, rng):
    model = tiny_model(getkey())
    xs, ys = _batch(rng)
    with pytest.raises(TypeError, match=r"VectorCost returns .*real scalar"):
        _msa()(wbc.Objective(controls=(VectorCost(),)), model, xs, ys)


# --- bad data and loop arguments: one error before step 0 --------------------------------------


def _train(model, data, run_dir, **kwargs):
    kwargs = {"steps": 2, "batch_size": 8, "log_every": 1, "progress": False, **kwargs}
    return train(model, data, run_dir=run_dir, **kwargs)


def _refused(model, data, tmp_path, error, words, **kwargs):
    run_dir = tmp_path / "run"
    with pytest.raises(error) as info:
        _train(model, data, run_dir, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert not run_dir.exists()  # raised before the run folder, the first step, any checkpoint
    return str(info.value)


def _with_target(data, index, value):
    targets = data.targets.copy()
    targets[index] = value
    return wbc.Dataset(data.inputs, targets)


def test_class_labels_outside_the_models_classes_are_refused(getkey, rng, tmp_path):
    model = tiny_model(getkey(), classes=3)
    data = tiny_data(rng, n=16, classes=3)
    _refused(
        model,
        _with_target(data, 5, 3),
        tmp_path,
        ValueError,
        ["data: targets[5] = 3", "3 classes", "[0, 3)", "1 of 16"],
    )
    # -1 is no "ignore" for one label per example (CrossEntropy would read it as class 2)
    _refused(model, _with_target(data, 7, -1), tmp_path, ValueError, ["targets[7] = -1"])
    bad_eval = _with_target(tiny_data(rng, n=8, classes=3), 2, 9)
    _refused(
        model,
        data,
        tmp_path,
        ValueError,
        ["eval_data: targets[2] = 9", "[0, 3)"],
        eval_data=bad_eval,
        eval_every=1,
    )
    with pytest.raises(ValueError, match=r"data: targets\[2\] = 9 .*\[0, 3\)"):
        wbc.evaluate(model, bad_eval)  # was an accuracy of 0.0


def test_float_and_column_labels_are_refused(getkey, rng, tmp_path):
    model = tiny_model(getkey())
    data = tiny_data(rng, n=16)
    floats = wbc.Dataset(data.inputs, data.targets.astype(np.float64))
    _refused(model, floats, tmp_path, TypeError, ["data: targets have dtype float64", "astype"])
    column = wbc.Dataset(data.inputs, data.targets[:, None])
    _refused(model, column, tmp_path, ValueError, ["(16, 1)", "pass shape (16,)"])
    with pytest.raises(TypeError, match="dtype float64"):
        wbc.evaluate(model, floats)


def _sequence_model(key, vocab=6, n=5, d=8):
    k1, k2 = jax.random.split(key)
    return wbc.ControlledModel(
        wbc.TokenEmbedding(vocab, n, d, key=k1, dtype=jnp.float64),
        wbc.random_transformer(
            k2, d=d, num_heads=2, num_layers=2, hidden=12, causal=True, dtype=jnp.float64
        ),
        wbc.SequenceHead(d, vocab, dtype=jnp.float64),
    )


def test_token_ids_and_sequence_targets_outside_the_vocabulary_are_refused(getkey, rng, tmp_path):
    model = _sequence_model(getkey(), vocab=6, n=5)
    ids = rng.integers(0, 6, (16, 5)).astype(np.int32)
    targets = np.where(np.arange(5) < 2, -1, np.roll(ids, -1, axis=1)).astype(np.int32)
    good = wbc.Dataset(ids, targets)
    check_data(model, good)  # -1 on the prompt positions: ignored, accepted
    for bad in (6, -2):
        inputs = ids.copy()
        inputs[3, 4] = bad
        _refused(
            model,
            wbc.Dataset(inputs, targets),
            tmp_path,
            ValueError,
            [f"data: inputs[3, 4] = {bad}", "vocabulary of 6", "[0, 6)"],
        )
    _refused(
        model,
        _with_target(good, (9, 3), 6),
        tmp_path,
        ValueError,
        ["data: targets[9, 3] = 6", "6 classes", "negative to ignore a position"],
    )
    floats = wbc.Dataset(ids.astype(np.float32), targets)
    _refused(model, floats, tmp_path, TypeError, ["inputs have dtype float32", "token ids"])
    with pytest.raises(ValueError, match=r"data: inputs\[0, 0\] = 7"):
        ids_bad = ids.copy()
        ids_bad[0, 0] = 7
        wbc.evaluate(model, wbc.Dataset(ids_bad, targets))


def test_eval_data_needs_eval_every(getkey, rng, tmp_path):
    model = tiny_model(getkey())
    data = tiny_data(rng, n=16)
    for every in (None, 0):
        _refused(
            model,
            data,
            tmp_path,
            ValueError,
            [f"eval_every={every!r} with eval_data given", "pass eval_every=N"],
            eval_data=data,
            eval_every=every,
        )


def test_loop_counts_accept_numpy_integers_and_refuse_bools(getkey, rng, tmp_path):
    """`np.int64` counts give the very run that Python ints give (same logged steps, same
    evaluations, same parameters); a bool is refused by name."""
    model = tiny_model(getkey())
    data = tiny_data(rng, n=16)
    common = {"batch_size": 8, "optimizer": optax.sgd(0.1), "eval_data": data, "progress": False}
    plain = train(model, data, steps=4, log_every=2, checkpoint_every=2, eval_every=4, **common)
    numpy = train(
        model,
        data,
        steps=np.int64(4),
        log_every=np.int64(2),
        checkpoint_every=np.int32(2),
        eval_every=np.int64(4),
        **common,
    )
    assert numpy.params_sha256 == plain.params_sha256
    assert [r["step"] for r in numpy.history] == [r["step"] for r in plain.history] == [2, 4]
    assert [r["eval_accuracy"] for r in numpy.history] == [
        r["eval_accuracy"] for r in plain.history
    ]
    assert numpy.history[-1]["eval_accuracy"] is not None
    for name in ("steps", "log_every", "checkpoint_every"):
        _refused(
            model, data, tmp_path, ValueError, [f"{name}=True", "positive integer"], **{name: True}
        )
    _refused(
        model, data, tmp_path, ValueError, ["eval_every=True"], eval_data=data, eval_every=True
    )
