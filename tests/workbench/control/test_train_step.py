"""The training step as a value (`wbc.TrainStep`): a loop written by hand around it is `train`;
the NaN guard stops (naming the step and the arrays) or skips; a gradient method brings its own
update rule; the callbacks see every logged row, evaluation filled in."""

import json

import chex
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import workbench.control as wbc
from workbench.control import _callbacks
from workbench.control._data import batch_indices
from workbench.control._discretizations import with_discretization
from workbench.control._tasks import random_shift

from helpers import tiny_data, tiny_model

STEPS, BATCH = 8, 4


def _step(**kwargs):
    return wbc.TrainStep(wbc.default_optimizer(1e-2, steps=STEPS, warmup=2), **kwargs)


def test_a_hand_written_loop_around_the_step_is_train(getkey, rng):
    """The loop a user writes — `step.init`, `eqx.filter_jit(step)`, `batch_indices` — gives
    `train`'s parameters and metrics exactly (same batches, same augmentation keys)."""
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    step = _step(augment=random_shift(1))
    result = wbc.train(
        step, model, data, steps=STEPS, batch_size=BATCH, seed=3, log_every=1, progress=False
    )

    state = step.init(model, key=jax.random.key(3))
    run = eqx.filter_jit(step)
    losses = []
    for s in range(STEPS):
        idx = batch_indices(3, s, len(data), BATCH)
        state, info = run(state, (jnp.asarray(data.inputs[idx]), jnp.asarray(data.targets[idx])))
        assert bool(info["finite"])
        losses.append(float(info["loss"]))
    assert int(state.step) == STEPS
    # One program per loop: XLA may fuse them differently, so equal to float64 round-off.
    chex.assert_trees_all_close(
        eqx.filter(state.model, eqx.is_inexact_array),
        eqx.filter(result.model, eqx.is_inexact_array),
        rtol=1e-12,
        atol=1e-14,
    )
    np.testing.assert_allclose([r["loss"] for r in result.history], losses, rtol=1e-12)


def test_runs_that_differ_only_in_their_seed_compile_one_program(getkey, rng):
    """The augmentation's key is an argument of the compiled step, not a constant in it: the
    programs of two seeds are the same text, so the second is read back from JAX's persistent
    compilation cache instead of compiled again (in another process: here the process's traced
    programs are cleared, so each run lowers its own)."""
    from workbench.control._mesh import BatchMesh, CompiledStep, _step_program

    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    step = _step(augment=random_shift(1))
    params = eqx.filter(model, eqx.is_inexact_array)
    xs, ys = jnp.asarray(data.inputs[:BATCH]), jnp.asarray(data.targets[:BATCH])
    texts = []
    for seed in (0, 1):
        _step_program.clear_cache()
        state = step.init(model, key=jax.random.key(seed))
        compiled = CompiledStep(step, state, BatchMesh(None, BATCH), shard_params=False)
        texts.append(compiled.lower(params, state.opt_state, xs, ys, 0).as_text())
    assert texts[0] == texts[1]


def test_a_later_run_of_an_equal_step_reuses_the_program_and_ends_where_a_fresh_one_does(
    getkey, rng, monkeypatch
):
    """Within one process, `train` traces the step once for runs of equal steps on models of one
    structure (another seed, another `default_optimizer` setting, another `random_shift(1)`
    call), and a run on the reused program ends with the parameters of a run on a program of its
    own, bit for bit. Another objective weight, or an optax transformation made anew, is another
    program. The reuse is JAX's own cache of the module-level `jax.jit` of the step."""
    from workbench.control._mesh import _step_program

    traces = []
    call = wbc.TrainStep.__call__

    def counted(self, state, batch):
        traces.append(None)
        return call(self, state, batch)

    monkeypatch.setattr(wbc.TrainStep, "__call__", counted)
    _step_program.clear_cache()
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)

    def run(seed, lr=1e-2, kinetic=None, optimizer=None):
        step = wbc.TrainStep(
            optimizer or wbc.default_optimizer(lr, steps=STEPS, warmup=2),
            objective=wbc.Objective(
                kinetic=None if kinetic is None else wbc.KineticEnergy(kinetic)
            ),
            augment=random_shift(1),
        )
        return wbc.train(
            step, model, data, steps=STEPS, batch_size=BATCH, seed=seed, progress=False
        ).params_sha256

    first = run(0)
    reused = [run(1), run(2, lr=3e-3)]
    assert len(traces) == 1
    fresh = []
    for seed, lr in ((1, 1e-2), (2, 3e-3)):  # each run on a program traced anew
        _step_program.clear_cache()
        fresh.append(run(seed, lr=lr))
    assert fresh == reused and len(traces) == 3
    assert len({first, *reused}) == 3  # the seeds and rates do change the runs
    run(0, kinetic=0.1), run(1, kinetic=0.1), run(0, kinetic=0.2)
    assert len(traces) == 5
    run(0, optimizer=optax.adam(1e-2)), run(0, optimizer=optax.adam(1e-2))
    assert len(traces) == 7


def test_runs_that_differ_in_their_optimizer_settings_compile_one_program(getkey, rng):
    """`default_optimizer`'s numbers (peak rate, warm-up, length, weight decay, clipping norm)
    are its state, not constants of the step: the training steps of two settings are the same
    program text (each lowered on its own: the process's traced programs are cleared)."""
    from workbench.control._mesh import BatchMesh, CompiledStep, _step_program

    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    params = eqx.filter(model, eqx.is_inexact_array)
    xs, ys = jnp.asarray(data.inputs[:BATCH]), jnp.asarray(data.targets[:BATCH])
    texts = []
    for lr, steps, warmup, wd, clip in [(1e-2, 8, 2, 0.05, 1.0), (3e-3, 500, 0, 0.1, 0.5)]:
        _step_program.clear_cache()
        step = wbc.TrainStep(
            wbc.default_optimizer(lr, steps=steps, warmup=warmup, weight_decay=wd, clip=clip)
        )
        state = step.init(model, key=jax.random.key(0))
        compiled = CompiledStep(step, state, BatchMesh(None, BATCH), shard_params=False)
        texts.append(compiled.lower(params, state.opt_state, xs, ys, 0).as_text())
    assert texts[0] == texts[1]


@pytest.mark.parametrize("warmup", [0, 5])
def test_default_optimizer_is_optax_adamw_with_its_warmup_cosine_schedule(getkey, warmup):
    """Against optax's own `chain(clip_by_global_norm, inject_hyperparams(adamw))` with
    `warmup_cosine_decay_schedule`: the same rates (float64: to 1e-14 of the closed form
    η·c/w, then η((1-α)(1 + cos(π(c-w)/D))/2 + α); optax's warm-up is computed in float32, so
    against optax 1e-6) and the same float32 parameters after 43 updates (3 past the end),
    with clipped and unclipped gradients (1e-6, relative)."""
    lr, steps, clip = 1e-2, 40, 1.0
    ours = wbc.default_optimizer(lr, steps=steps, warmup=warmup, clip=clip)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, lr * 0.01)
    theirs = optax.chain(
        optax.clip_by_global_norm(clip),
        optax.inject_hyperparams(optax.adamw)(learning_rate=schedule, weight_decay=0.05),
    )
    params = {"w": jax.random.normal(getkey(), (6, 5), jnp.float32), "b": jnp.ones(5)}
    params["b"] = params["b"].astype(jnp.float32)
    s_ours, s_theirs, p_ours, p_theirs = ours.init(params), theirs.init(params), params, params
    update_ours, update_theirs = jax.jit(ours.update), jax.jit(theirs.update)
    rates = []
    for c in range(steps + 3):
        scale = 3.0 if c % 3 else 0.05  # a norm above the clip, then below it
        g = jax.tree.map(lambda p: scale * jax.random.normal(getkey(), p.shape, p.dtype), params)
        u, s_ours = update_ours(g, s_ours, p_ours)
        p_ours = optax.apply_updates(p_ours, u)
        u, s_theirs = update_theirs(g, s_theirs, p_theirs)
        p_theirs = optax.apply_updates(p_theirs, u)
        rates.append(float(s_ours.hyperparams["learning_rate"]))
        assert rates[-1] == pytest.approx(float(schedule(c)), rel=1e-6, abs=1e-12)
    chex.assert_trees_all_close(p_ours, p_theirs, rtol=1e-6, atol=1e-7)
    assert jax.tree.map(lambda p: p.dtype, p_ours) == jax.tree.map(lambda p: p.dtype, params)

    from workbench.control._optimizer import _rate

    decay, alpha = steps - warmup, 0.01
    state = ours.init({"w": jnp.zeros(3, jnp.float64)})
    for c in range(steps + 3):
        a = min(c - warmup, decay)
        want = (
            lr * c / warmup
            if c < warmup
            else lr * ((1 - alpha) * 0.5 * (1 + np.cos(np.pi * a / decay)) + alpha)
        )
        got = _rate(jnp.asarray(c, jnp.int32), state.schedule)
        assert got.dtype == jnp.float64 and float(got) == pytest.approx(want, rel=1e-14, abs=0)


def _poisoned(rng, steps_with_nan):
    """Data whose batches at `steps_with_nan` (batch size 2, seed 0) hold a NaN pixel."""
    data = tiny_data(rng, n=24)
    x = data.inputs.copy()
    for s in steps_with_nan:
        x[batch_indices(0, s, len(x), 2)[0], 0, 0] = np.nan
    return wbc.Dataset(x, data.targets)


def test_the_nan_guard_stops_naming_the_step_and_the_arrays(getkey, rng):
    data = _poisoned(rng, [5])
    with pytest.raises(wbc.TrainingDiverged) as info:
        wbc.train(_step(), tiny_model(getkey()), data, steps=STEPS, batch_size=2, progress=False)
    message = str(info.value)
    assert message.startswith("training diverged at step 5: the objective is nan")
    # The direction's non-finite arrays by their path in the model (the patch embedding first).
    assert "array(s) of the direction: .embedding" in message
    assert "no checkpoint was written" in message


def test_skipped_steps_leave_the_parameters_and_stop_after_too_many(getkey, rng):
    """`max_skipped=k`: a non-finite step changes nothing (optax.apply_if_finite), so a run with
    a NaN batch at step 5 equals, parameter for parameter, the same run with step 5's update
    removed; k + 1 non-finite steps in a row stop it."""
    model, data = tiny_model(getkey()), _poisoned(rng, [5])
    step = wbc.TrainStep(optax.sgd(0.1), max_skipped=1)
    result = wbc.train(step, model, data, steps=STEPS, batch_size=2, log_every=1, progress=False)
    # By hand: the same updates, step 5 skipped.
    state = wbc.TrainStep(optax.sgd(0.1)).init(model, key=jax.random.key(0))
    plain = eqx.filter_jit(wbc.TrainStep(optax.sgd(0.1)))
    for s in range(STEPS):
        idx = batch_indices(0, s, len(data), 2)
        if s == 5:
            continue
        state, _ = plain(state, (jnp.asarray(data.inputs[idx]), jnp.asarray(data.targets[idx])))
    chex.assert_trees_all_close(
        eqx.filter(state.model, eqx.is_inexact_array),
        eqx.filter(result.model, eqx.is_inexact_array),
        rtol=1e-12,
        atol=1e-14,
    )
    assert np.isnan(result.history[5]["objective"]) and np.isfinite(result.history[6]["objective"])

    with pytest.raises(wbc.TrainingDiverged, match=r"diverged at step 4 after 1 skipped step"):
        wbc.train(step, model, _poisoned(rng, [3, 4]), steps=STEPS, batch_size=2, progress=False)


def test_a_method_brings_its_own_update_rule(getkey, rng):
    """MSA's direction is its update: whatever optimizer the step holds, it applies sgd(1.0)."""
    model, data = tiny_model(getkey()), tiny_data(rng, n=16)
    msa = wbc.SuccessiveApproximations(
        rho=0.5, inner_steps=2, inner_learning_rate=1e-3, outer_learning_rate=0.05
    )
    runs = [
        wbc.train(
            wbc.TrainStep(opt, method=msa), model, data, steps=3, batch_size=8, progress=False
        )
        for opt in (optax.adam(0.3), optax.sgd(1.0))
    ]
    assert runs[0].params_sha256 == runs[1].params_sha256
    assert wbc.TrainStep(optax.adam(0.3)).update_rule is not None
    with pytest.raises(ValueError, match=r"TrainStep.optimizer='adam' is not an optax"):
        wbc.TrainStep("adam")
    with pytest.raises(ValueError, match=r"TrainStep.max_skipped=-1 must be an integer >= 0"):
        wbc.TrainStep(optax.sgd(0.1), max_skipped=-1)
    with pytest.raises(ValueError, match=r"first argument must be a workbench.control.TrainStep"):
        wbc.train(model, model, data, steps=3, batch_size=8)


def _probe(monkeypatch, callback):
    """`train`'s own callbacks followed by `callback` (the test's view of the hooks)."""
    from workbench.control import _callbacks, _trainer

    standard = _callbacks.standard_callbacks
    monkeypatch.setattr(
        _trainer, "standard_callbacks", lambda *a, **k: [*standard(*a, **k), callback]
    )


class _Recorder(_callbacks.AbstractCallback):
    def __init__(self):
        self.events = []

    def on_start(self, run):
        self.events.append(("start", run.done))

    def on_log(self, run, row):
        self.events.append(("log", dict(row)))

    def on_step(self, run):
        self.events.append(("step", run.done))

    def on_end(self, run):
        self.events.append(("end", run.done))


def test_callbacks_see_every_row_after_the_standard_ones(getkey, rng, tmp_path, monkeypatch):
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    recorder = _Recorder()
    _probe(monkeypatch, recorder)
    result = wbc.train(
        _step(),
        model,
        data,
        steps=STEPS,
        batch_size=BATCH,
        log_every=3,
        eval_data=data,
        eval_every=3,
        run_dir=tmp_path,
        progress=False,
    )
    kinds = [e[0] for e in recorder.events]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert [e[1] for e in recorder.events if e[0] == "step"] == list(range(1, STEPS + 1))
    rows = [e[1] for e in recorder.events if e[0] == "log"]
    # The rows the callback saw are the history, evaluation included (filled in before it).
    assert rows == result.history and [r["step"] for r in rows] == [3, 6, 8]
    assert all(r["eval_accuracy"] is not None for r in rows)
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(lines) == 1 + len(rows)
    # Resumed on the finished folder: the start sees the restored step, no step runs.
    again = _Recorder()
    _probe(monkeypatch, again)
    wbc.train(
        _step(),
        model,
        data,
        steps=STEPS,
        batch_size=BATCH,
        log_every=3,
        eval_data=data,
        eval_every=3,
        run_dir=tmp_path,
        progress=False,
    )
    assert again.events == [("start", STEPS), ("end", STEPS)]


def test_divergence_as_a_value_keeps_the_last_good_model(getkey, rng):
    """`throw=False`: the run ends at the step that is not finite with `result` diverged, the
    message `TrainingDiverged` would carry, and the model before that step — the model of the
    same run stopped one step earlier."""
    model, data = tiny_model(getkey()), _poisoned(rng, [5])
    failed = wbc.train(
        _step(), model, data, steps=STEPS, batch_size=2, log_every=1, progress=False, throw=False
    )
    assert failed.result == wbc.RESULTS.diverged
    assert failed.message.startswith("training diverged at step 5:")
    assert [r["step"] for r in failed.history] == [1, 2, 3, 4, 5]
    state = _step().init(model, key=jax.random.key(0))
    run = eqx.filter_jit(_step())
    for s in range(5):
        idx = batch_indices(0, s, len(data), 2)
        state, _ = run(state, (jnp.asarray(data.inputs[idx]), jnp.asarray(data.targets[idx])))
    chex.assert_trees_all_close(
        eqx.filter(state.model, eqx.is_inexact_array),
        eqx.filter(failed.model, eqx.is_inexact_array),
        rtol=1e-12,
        atol=1e-14,
    )
    ok = wbc.train(_step(), model, tiny_data(rng, n=24), steps=2, batch_size=2, progress=False)
    assert ok.result == wbc.RESULTS.successful and ok.message == ""


def test_multi_resolution_solves_each_batch_at_the_drawn_step_count(getkey, rng):
    """`MultiResolution((1, 2, 4))`: step s is, parameter for parameter (1e-12), the plain step
    of the model solved with the k drawn from the step's key, the direction mapped back onto
    the model, which keeps its own discretization (one step per layer); the draws follow the
    probabilities."""
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    ks, probabilities = (1, 2, 4), (0.5, 0.25, 0.25)
    multi = wbc.MultiResolution(ks, probabilities)
    step = _step(discretization=multi)
    state = step.init(model, key=jax.random.key(5))
    run, plain = eqx.filter_jit(step), eqx.filter_jit(_step())  # plain: a program per k
    drawn = []
    for s in range(6):
        idx = batch_indices(5, s, len(data), BATCH)
        batch = (jnp.asarray(data.inputs[idx]), jnp.asarray(data.targets[idx]))
        key = jax.random.fold_in(jax.random.fold_in(state.key, s), 1)
        k = ks[int(multi.index(key, jnp.asarray(s)))]
        drawn.append(k)
        # The same update by hand: the model (and the optimizer's model-shaped moments) at k
        # steps per layer, the plain step.
        fine = with_discretization((state.model, state.opt_state), None, k)
        by_hand, _ = plain(wbc.TrainState(*fine, state.step, state.key), batch)
        state, info = run(state, batch)
        assert state.model.transformer.steps_per_layer == 1
        chex.assert_trees_all_close(
            eqx.filter(state.model, eqx.is_inexact_array),
            eqx.filter(with_discretization(by_hand.model, None, 1), eqx.is_inexact_array),
            rtol=1e-10,
            atol=1e-12,  # two programs (a switch and a plain step): round-off
        )
    assert len(set(drawn)) > 1, drawn  # six steps drew more than one step count
    # The draws: frequencies within 4 standard deviations of the probabilities.
    keys = jax.random.split(jax.random.key(0), 4000)
    counts = np.bincount(np.asarray(jax.vmap(lambda k: multi.index(k, 0))(keys)), minlength=3)
    p = np.asarray(probabilities)
    assert np.all(np.abs(counts / 4000 - p) <= 4 * np.sqrt(p * (1 - p) / 4000)), counts
    assert multi.cost == pytest.approx(0.5 * 1 + 0.25 * 2 + 0.25 * 4)


def test_a_coarse_basis_draw_is_the_gradient_of_the_coarsened_model(getkey, rng):
    """`MultiResolution((1,), coarsen=(2,))`: on a step that draws the coarse basis, the
    direction is the gradient (1e-12) of `θ ↦ J(coarsen_depth(θ, 2))` taken by autodiff
    through the projection (an independent oracle of the mapped-back direction), with all
    control costs on; the cost counts the coarse draw as half a step per layer."""
    model, data = tiny_model(getkey(), layers=4), tiny_data(rng, n=24)
    multi = wbc.MultiResolution((1,), (0.5, 0.5), coarsen=(2,))
    objective = wbc.Objective(
        wbc.CrossEntropy(),
        wbc.KineticEnergy(0.1),
        (wbc.ControlNorm(1e-3), wbc.ControlSmoothness(0.1)),
    )
    step = _step(discretization=multi, objective=objective)
    xs, ys = jnp.asarray(data.inputs[:BATCH]), jnp.asarray(data.targets[:BATCH])
    key = jax.random.key(2)
    draws = [
        int(multi.index(jax.random.fold_in(jax.random.fold_in(key, s), 1), s)) for s in range(20)
    ]
    s = draws.index(1)  # the first step that draws the coarse basis
    (value, _), direction = step.value_and_direction(model, (xs, ys), key, jnp.asarray(s))

    @eqx.filter_value_and_grad(has_aux=True)
    def oracle(m):
        return objective(wbc.coarsen_depth(m, 2), xs, ys, {})

    (expected, _), grad = oracle(model)
    assert float(value) == pytest.approx(float(expected), rel=1e-12)
    chex.assert_trees_all_close(
        eqx.filter(direction, eqx.is_inexact_array),
        eqx.filter(grad, eqx.is_inexact_array),
        rtol=1e-12,
        atol=1e-14,
    )
    assert direction.transformer.num_layers == 4
    assert multi.cost == pytest.approx(0.5 * 1 + 0.5 * 0.5)
    with pytest.raises(ValueError, match=r"coarsen=\(3,\): factor\(s\) \[3\] do not divide"):
        wbc.MultiResolution((1,), coarsen=(3,)).candidates(model)


def test_one_resolution_at_the_models_own_step_count_is_the_plain_step(getkey, rng):
    model, data = tiny_model(getkey(), steps_per_layer=2), tiny_data(rng, n=24)
    plain = wbc.train(_step(), model, data, steps=4, batch_size=BATCH, progress=False)
    one = wbc.train(
        _step(discretization=wbc.MultiResolution((2,))),
        model,
        data,
        steps=4,
        batch_size=BATCH,
        progress=False,
    )
    chex.assert_trees_all_close(
        eqx.filter(one.model, eqx.is_inexact_array),
        eqx.filter(plain.model, eqx.is_inexact_array),
        rtol=1e-12,
        atol=1e-14,
    )


def test_the_training_discretization_is_part_of_the_runs_identity(getkey, rng, tmp_path):
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    wbc.train(_step(), model, data, steps=2, batch_size=BATCH, run_dir=tmp_path, progress=False)
    with pytest.raises(wbc.CheckpointMismatch, match="discretization"):
        wbc.train(
            _step(discretization=wbc.MultiResolution((1, 2))),
            model,
            data,
            steps=2,
            batch_size=BATCH,
            run_dir=tmp_path,
            progress=False,
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"steps_per_layer": (1, 1)}, "distinct positive integers"),
        ({"steps_per_layer": (0, 2)}, "distinct positive integers"),
        ({"steps_per_layer": [1, 2]}, "tuple"),
        ({"steps_per_layer": (1, 2), "probabilities": (0.5, 0.6)}, "summing to 1"),
        ({"steps_per_layer": (1, 2), "probabilities": (1.0,)}, "one per entry"),
        ({"steps_per_layer": (1, 2), "scheme": "strang"}, "splitting scheme object"),
        ({"steps_per_layer": (1,), "coarsen": (1,)}, r"coarsen=\(1,\) must be .* >= 2"),
        ({"steps_per_layer": (1,), "coarsen": (2, 2)}, "distinct integers"),
        ({"steps_per_layer": (1,), "coarsen": (2,), "probabilities": (1.0,)}, "2 positive"),
    ],
)
def test_bad_multi_resolution_is_refused_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        wbc.MultiResolution(**kwargs)
    with pytest.raises(ValueError, match="TrainStep.discretization"):
        _step(discretization="multi")


def test_coarse_basis_draws_enter_the_fingerprint_only_when_asked_for():
    """`coarsen` was added after runs were written: at its default it is left out of the run's
    fingerprint (so those runs still resume), and any other value is recorded."""
    from workbench.control._checkpoint import describe

    plain = describe(wbc.MultiResolution((1, 2, 4)))
    coarse = describe(wbc.MultiResolution((1, 2, 4), coarsen=(2,)))
    assert "coarsen" not in plain
    assert coarse["coarsen"] == [2]
    assert {k: v for k, v in coarse.items() if k != "coarsen"} == plain


def test_a_multi_resolution_run_folder_without_coarsen_resumes_exactly(getkey, rng, tmp_path):
    """End to end: a multi-resolution run folder whose fingerprint has no `coarsen` entry (as
    every folder written before the field existed) resumes from its last checkpoint to the
    uninterrupted run's parameters bit for bit, and asking for coarse-basis draws on it is
    refused naming the field."""
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    multi = wbc.MultiResolution((1, 2))
    kwargs = dict(steps=STEPS, batch_size=BATCH, progress=False, checkpoint_every=4)
    full = wbc.train(_step(discretization=multi), model, data, **kwargs)
    wbc.train(_step(discretization=multi), model, data, run_dir=tmp_path, **kwargs)
    identity = json.loads((tmp_path / "checkpoints" / "fingerprint.json").read_text())
    written = identity["trainer"]["discretization"]
    assert written["type"].endswith("MultiResolution") and "coarsen" not in written
    for p in (tmp_path / "checkpoints").glob(f"step-{STEPS:08d}.*"):
        p.unlink()
    with pytest.raises(wbc.CheckpointMismatch, match="coarsen"):
        wbc.train(
            _step(discretization=wbc.MultiResolution((1, 2), coarsen=(2,))),
            model,
            data,
            run_dir=tmp_path,
            **kwargs,
        )
    again = wbc.train(_step(discretization=multi), model, data, run_dir=tmp_path, **kwargs)
    assert again.resumed_from == 4
    assert again.params_sha256 == full.params_sha256
