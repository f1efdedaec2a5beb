"""Adaptive inference of a trained model (`wbc.adaptive_accuracy`) against fixed-step solves of
the same equation, and the `continuous-depth` study's verdict, config checks and numbers."""

import dataclasses
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.control as wbc
from studies._toolkit.config import ConfigError
from studies.training import continuous_depth as CD

from helpers import randomize_head, tiny_data, tiny_model, well_conditioned


def _model(getkey, layers=2):
    m = tiny_model(getkey(), layers=layers)
    return well_conditioned(randomize_head(m, getkey()), getkey())


def _fixed_logits(model, xs, solver, steps_per_layer):
    eq = model.transformer.equation
    n = steps_per_layer * model.transformer.num_layers

    def one(x):
        sol = wb.integrate(eq, model.embedding(x), solver, num_steps=n)
        return model.head(sol.y)

    return np.asarray(jax.vmap(one)(jnp.asarray(xs)))


def _accuracy(logits, ys):
    return float(np.mean(np.argmax(logits, -1) == ys))


def test_a_loose_tolerance_takes_one_step_per_layer_and_is_that_fixed_solve(getkey, rng):
    """With rtol = atol = 1e3 every first step (a whole layer, `dt0 = h`) is accepted: the
    solve is one Bosh3 step per layer, 4 field evaluations each (4 stages; the first-same-as-last
    stage is recomputed on each layer, since the controls jump there), and its accuracy is that
    of the fixed one-step Bosh3 solve (predictions compared one by one)."""
    m, data = _model(getkey), tiny_data(rng, n=40)
    out = wbc.adaptive_accuracy(m, data, rtol=1e3, atol=1e3, batch_size=16)
    assert out.failed == 0
    np.testing.assert_array_equal(out.evaluations, np.full(40, 4 * m.transformer.num_layers))
    fixed = _fixed_logits(m, data.inputs, diffrax.Bosh3(), 1)
    assert out.accuracy == _accuracy(fixed, data.targets)


def test_a_tight_tolerance_is_the_converged_equation_and_costs_more(getkey, rng):
    """At rtol = atol = 1e-9 the predictions are those of a 64-step-per-layer Dopri8 solve (the
    logits agree to 1e-7, far below the gaps between classes here), and every example spends more
    evaluations than at 1e-2; the mean and spread are those of the per-example counts."""
    m, data = _model(getkey), tiny_data(rng, n=32)
    tight = wbc.adaptive_accuracy(m, data, rtol=1e-9, atol=1e-9, max_steps=4096)
    loose = wbc.adaptive_accuracy(m, data, rtol=1e-2, atol=1e-2)
    reference = _fixed_logits(m, data.inputs, diffrax.Dopri8(), 64)
    top2 = np.sort(reference, -1)
    assert np.min(top2[:, -1] - top2[:, -2]) > 1e-6  # no near-tie that 1e-7 could flip
    assert tight.accuracy == _accuracy(reference, data.targets)
    assert np.all(tight.evaluations > loose.evaluations)
    assert tight.mean_evaluations == pytest.approx(np.mean(tight.evaluations), rel=1e-15)
    d = tight.to_dict()
    assert d["std_evaluations"] == pytest.approx(np.std(tight.evaluations), rel=1e-15)
    assert d["min_evaluations"] == tight.evaluations.min()


def test_adaptive_accuracy_compiles_once_for_every_tolerance_and_model(getkey, rng, monkeypatch):
    """Three tolerances on two models of the same structure trace the batched solve once (the
    tolerances and the weights are arguments of one program; 23 examples in batches of at most
    12 are two batches of 12, the second padded, not 12 and 11), and the results equal a solve
    of all 23 with the tolerance and weights as constants, evaluation by evaluation (checked for
    the loosest tolerance on one model and the tightest on the other)."""
    from workbench.control import _inference

    traces = []
    integrate = _inference.integrate

    def counted(*args, **kwargs):
        traces.append(None)
        return integrate(*args, **kwargs)

    monkeypatch.setattr(_inference, "integrate", counted)
    models, data = [_model(getkey), _model(getkey)], tiny_data(rng, n=23)
    for i, m in enumerate(models):
        for j, tol in enumerate((1e-1, 1e-3, 1e-6)):
            out = wbc.adaptive_accuracy(m, data, rtol=tol, atol=tol, batch_size=12)
            if (i, j) not in ((0, 0), (1, 2)):  # the oracle is a program per model and tolerance
                continue
            eq, ctrl = m.transformer.equation, diffrax.PIDController(rtol=tol, atol=tol)

            @jax.jit
            def constant(xs):
                def one(x):
                    sol = integrate(
                        eq,
                        m.embedding(x),
                        diffrax.Bosh3(),
                        stepsize_controller=ctrl,
                        dt0=eq.piece_length,
                        max_steps=256,
                        throw=False,
                    )
                    return m.head(sol.y), sol.stats["num_evaluations"]

                return jax.vmap(one)(xs)

            logits, evals = constant(jnp.asarray(data.inputs))
            np.testing.assert_array_equal(out.evaluations, evals)
            assert out.accuracy == _accuracy(np.asarray(logits), data.targets)
    assert len(traces) == 1  # one trace: 6 calls, 12 batches of 12


def test_held_out_accuracy_runs_one_batch_shape_and_counts_every_example_once(getkey, rng):
    """23 examples in batches of at most 10: three batches of 8 (the last padded by repeating
    its last example), one batch shape for the compiled prediction, and the accuracy of all 23
    predicted at once; per-position targets < 0 still count as nothing."""
    from workbench.control._callbacks import held_out_accuracy

    model, data = _model(getkey), tiny_data(rng, n=23)
    shapes = []

    def predict(m, xs):
        shapes.append(xs.shape[0])
        return jax.vmap(m)(xs)

    got = held_out_accuracy(model, data, batch_size=10, predict=predict)
    logits = np.asarray(jax.vmap(model)(jnp.asarray(data.inputs)))
    assert shapes == [8, 8, 8]
    assert got == pytest.approx(_accuracy(logits, data.targets), abs=1e-12)
    ignored = wbc.Dataset(data.inputs, np.where(np.arange(23) < 20, data.targets, -1))
    want = _accuracy(logits[:20], data.targets[:20])
    assert held_out_accuracy(model, ignored, batch_size=10) == pytest.approx(want, abs=1e-12)


def test_adaptive_accuracy_rejects_bad_input_naming_it(getkey, rng):
    m, data = _model(getkey), tiny_data(rng, n=8)
    with pytest.raises(ValueError, match="rtol=0 must be a positive number"):
        wbc.adaptive_accuracy(m, data, rtol=0)
    with pytest.raises(ValueError, match="has no error estimate; pass an adaptive diffrax"):
        wbc.adaptive_accuracy(m, data, solver=diffrax.Euler())
    with pytest.raises(ValueError, match="model must be a ControlledModel"):
        wbc.adaptive_accuracy(m.transformer, data)


def _alone(model, xs, **kwargs):
    """Logits, steps and success of each example solved alone (unbatched) by Bosh3 with
    `adaptive_accuracy`'s controller and first step."""
    eq = model.transformer.equation
    out = []
    for x in xs:
        sol = wb.integrate(
            eq,
            model.embedding(jnp.asarray(x)),
            diffrax.Bosh3(),
            dt0=eq.piece_length,
            throw=False,
            **kwargs,
        )
        out.append(
            (
                np.asarray(model.head(sol.y)),
                int(sol.stats["num_steps"]),
                bool(sol.result == wb.RESULTS.successful),
            )
        )
    logits, steps, ok = zip(*out)
    return np.stack(logits), np.asarray(steps), np.asarray(ok)


def test_an_example_past_max_steps_or_non_finite_is_named_and_changes_nothing_else(getkey, rng):
    """With `max_steps` the median of the steps the examples need (counted one by one), the
    examples that need more are `failed_examples`, exactly; the others keep their evaluations
    and the accuracy counts the failed ones wrong. An example with a NaN pixel fails alone:
    its index is reported and nothing is raised."""
    m, data = _model(getkey), tiny_data(rng, n=12)
    pid = diffrax.PIDController(rtol=1e-6, atol=1e-6)
    logits, steps, ok = _alone(m, data.inputs, stepsize_controller=pid, max_steps=4096)
    assert ok.all()
    full = wbc.adaptive_accuracy(m, data, rtol=1e-6, atol=1e-6, max_steps=4096)
    assert full.failed == 0 and full.failed_examples.size == 0
    cap = int(np.median(steps))
    over = np.flatnonzero(steps > cap)
    assert 0 < len(over) < len(data)
    capped = wbc.adaptive_accuracy(m, data, rtol=1e-6, atol=1e-6, max_steps=cap)
    np.testing.assert_array_equal(capped.failed_examples, over)
    assert capped.failed == len(over)
    kept = np.setdiff1d(np.arange(len(data)), over)
    np.testing.assert_array_equal(capped.evaluations[kept], full.evaluations[kept])
    right = np.argmax(logits, -1) == data.targets
    assert capped.accuracy == pytest.approx(np.mean(right & (steps <= cap)), abs=1e-12)
    assert full.accuracy == pytest.approx(np.mean(right), abs=1e-12)

    inputs = data.inputs.copy()
    inputs[5, 0, 0] = np.nan
    broken = wbc.adaptive_accuracy(
        m, wbc.Dataset(inputs, data.targets), rtol=1e-6, atol=1e-6, max_steps=64
    )
    np.testing.assert_array_equal(broken.failed_examples, [5])
    others = np.arange(len(data)) != 5
    np.testing.assert_array_equal(broken.evaluations[others], full.evaluations[others])
    assert broken.accuracy == pytest.approx(np.mean(right & others), abs=1e-12)
    assert broken.to_dict()["failed_examples"] == [5]


def test_adaptive_accuracy_in_a_smooth_basis_steps_across_the_depth(getkey, rng):
    """A Legendre model (one piece over [0, T], no jumps): at a loose tolerance the first step
    tried, the whole depth, is accepted: 4 Bosh3 evaluations and the predictions of the fixed
    one-step Bosh3 solve; from `dt0 = T / 2` two steps (the second FSAL: 4 + 3 evaluations),
    those of the fixed two-step solve. The time is measured apart from the compilation."""
    m = _model(getkey)
    leg = wbc.ControlledModel(m.embedding, wb.to_basis(m.transformer, wb.LegendreBasis(1)), m.head)
    data = tiny_data(rng, n=16)
    T = leg.transformer.equation.t1
    start = time.perf_counter()
    whole = wbc.adaptive_accuracy(leg, data, rtol=1e3, atol=1e3)
    wall = time.perf_counter() - start
    assert whole.dt0 == T == 2.0
    np.testing.assert_array_equal(whole.evaluations, np.full(16, 4))
    assert whole.accuracy == _accuracy(
        _fixed_logits(leg, data.inputs, diffrax.Bosh3(), 1), data.targets
    )
    half = wbc.adaptive_accuracy(leg, data, rtol=1e3, atol=1e3, dt0=T / 2)
    assert half.dt0 == T / 2
    np.testing.assert_array_equal(half.evaluations, np.full(16, 7))
    assert half.accuracy == _accuracy(
        _fixed_logits(leg, data.inputs, diffrax.Bosh3(), 2), data.targets
    )
    # the parts of the call's time
    assert whole.compile_seconds > 0 and whole.seconds_per_example > 0
    assert whole.compile_seconds + 16 * whole.seconds_per_example <= wall


def test_adaptive_steps_are_the_solves_steps(getkey, rng):
    """`wb.analysis.adaptive_steps` of one example: the step times increase from 0 to T, the
    sizes sum to T, the accepted steps are the solve's (`Solution.stats`) and its evaluations
    are those `adaptive_accuracy` reports for the example; network layers and Legendre."""
    m, data = _model(getkey), tiny_data(rng, n=1)
    leg = wbc.ControlledModel(m.embedding, wb.to_basis(m.transformer, wb.LegendreBasis(1)), m.head)
    for model in (m, leg):
        eq = model.transformer.equation
        u0 = model.embedding(jnp.asarray(data.inputs[0]))
        s = wb.analysis.adaptive_steps(eq, u0, rtol=1e-6, atol=1e-6)
        assert s.times[0] == 0.0 and s.times[-1] == eq.t1
        assert np.all(np.diff(s.times) > 0) and len(s.times) == s.accepted + 1
        assert np.sum(s.sizes) == pytest.approx(eq.t1, rel=1e-14)
        sol = wb.integrate(
            eq,
            u0,
            diffrax.Bosh3(),
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
            dt0=eq.piece_length,
        )
        assert s.accepted == int(sol.stats["num_accepted_steps"]) > 2
        assert s.rejected == int(sol.stats["num_rejected_steps"])
        out = wbc.adaptive_accuracy(model, data, rtol=1e-6, atol=1e-6)
        assert s.evaluations == int(out.evaluations[0]) == int(sol.stats["num_evaluations"])


# --------------------------------------------------------------------------------------------
# continuous-depth


def _results(own, spreads, consistent, recipes=("one-step", "multi-resolution")):
    c = dataclasses.replace(CD.Config(), recipes=recipes)
    n = len(recipes)
    acc = np.asarray([[a] * len(CD.FACTORS) for a in own])
    return CD.Results(
        config=c,
        accuracy=acc,
        second_scheme=["Strang"] * n,
        second_accuracy=acc[:, -1],
        spread=np.asarray(spreads),
        consistent=np.asarray(consistent, float),
        observed_order=np.ones(n),
        expected_order=np.ones(n),
        training_time_s=np.ones(n),
        compression=[],
        adaptive=[],
        wall_time_s=1.0,
    )


def test_refinement_accuracy_is_the_rediscretized_models_and_compiles_once_per_scheme(
    getkey, rng, monkeypatch
):
    """`wbc.refinement_accuracy` at 2-16x and with Strang equals `evaluate` of the rediscretized
    models (the logits are bitwise those of `rediscretize`), and traces the solve twice: once
    for Lie-Trotter at every refined step count (a run-time `num_steps`), once for Strang."""
    from workbench.control import _certificate

    model, data = _model(getkey, layers=2), tiny_data(rng, n=24)
    traces = []
    real = _certificate.integrate

    def counted(*args, **kwargs):
        traces.append(type(args[2]).__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(_certificate, "integrate", counted)
    r = wbc.refinement_accuracy(model, data)
    assert sorted(traces) == ["LieTrotter", "Strang"]
    lie, strang = wb.schemes.LieTrotter(), wb.schemes.Strang()
    want = [wbc.evaluate(model.rediscretize(lie, k), data) for k in (2, 4, 8, 16)]
    assert r.refined_accuracies == want and r.refined_steps_per_layer == [2, 4, 8, 16]
    assert r.second_accuracy == wbc.evaluate(model.rediscretize(strang, 16), data)
    xs = jnp.asarray(data.inputs)
    ours = _certificate._logits_at(model, strang, xs, jnp.asarray(16 * 2, jnp.int32))
    theirs = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(model.rediscretize(strang, 16), xs)
    assert ours.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-12, atol=1e-12)
    spread = max(abs(a - r.accuracy) for a in [*want, r.second_accuracy])
    assert r.spread == pytest.approx(spread, abs=1e-12)
    # the paired comparisons: each discretization against the model's own on the same examples,
    # from the per-example predictions of the rediscretized models
    predict = eqx.filter_jit(lambda m, x: jnp.argmax(jax.vmap(m)(x), -1))
    ys = np.asarray(data.targets)
    own = np.asarray(predict(model, xs)) == ys
    others = [(lie, k) for k in (2, 4, 8, 16)] + [(strang, 16)]
    assert [(p["scheme"], p["steps_per_layer"]) for p in r.paired] == [
        (type(s).__name__, k) for s, k in others
    ]
    for p, (s, k) in zip(r.paired, others):
        theirs = np.asarray(predict(model.rediscretize(s, k), xs)) == ys
        want_paired = wb.analysis.paired_difference(own, theirs)
        assert p == {
            "scheme": type(s).__name__,
            "steps_per_layer": k,
            **dataclasses.asdict(want_paired),
        }
        assert p["accuracy_b"] == pytest.approx(wbc.evaluate(model.rediscretize(s, k), data))
    assert r.paired[0]["accuracy_a"] == pytest.approx(r.accuracy, abs=1e-6)
    with pytest.raises(ValueError, match=r"refinement_accuracy: confidence=1.5 must be"):
        wbc.refinement_accuracy(model, data, confidence=1.5)


def test_continuous_depth_verdict_follows_the_numbers():
    yes = CD.verdict(_results([0.989, 0.990], [0.47, 0.004], [0, 1]))
    assert yes.startswith("Yes.") and "spread 47.00 points, not consistent" in yes
    assert "multi-resolution: 99.00 % at its own discretization, spread 0.40 points" in yes
    # the multi-resolution network misses the accuracy target, or its spread, or consistency
    assert CD.verdict(_results([0.99, 0.97], [0.4, 0.004], [0, 1])).startswith("No.")
    assert CD.verdict(_results([0.99, 0.99], [0.4, 0.006], [0, 1])).startswith("No.")
    assert CD.verdict(_results([0.99, 0.99], [0.4, 0.004], [0, 0])).startswith("No.")
    both = CD.verdict(_results([0.99, 0.99], [0.003, 0.004], [1, 1]))
    assert both.startswith("Partly (the one-step network is consistent too).")
    alone = CD.verdict(_results([0.99], [0.4], [0], recipes=("one-step",)))
    assert alone.startswith("No answer: the multi-resolution recipe was not trained")


def test_continuous_depth_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="recipes"):
        CD.Config(recipes=("one-step", "euler"))
    with pytest.raises(ConfigError, match="num_layers"):
        CD.Config(num_layers=3)
    with pytest.raises(ConfigError, match=r"continuous-depth: resolutions=\(0, 2\) is not allowed"):
        CD.Config(resolutions=(0, 2))
    with pytest.raises(ConfigError, match="tolerances"):
        CD.Config(tolerances=(2.0,))
    with pytest.raises(ConfigError, match=r"adaptive_solvers=\('euler',\).*'heun'"):
        CD.Config(adaptive_solvers=("euler",))  # no error estimate
    with pytest.raises(ConfigError, match="adaptive_solvers"):
        CD.Config(adaptive_solvers=("heun", "heun"))
    # every recipe is a train-digits config with the recipe's fields
    c = CD.Config(kinetic=0.02)
    assert c.digits_config("one-step").kinetic == 0.0
    assert c.digits_config("multi-resolution").kinetic == 0.02
    assert c.digits_config("multi-resolution").depth == "multi-resolution"
    assert c.digits_config("strang").scheme == "strang"
    # coarse-basis draws: the multi-resolution recipe's only; factors must divide the layers
    assert c.digits_config("multi-resolution").coarsen == (2,)
    assert c.digits_config("one-step").coarsen == ()
    with pytest.raises(
        ConfigError,
        match=r"coarsen=\(3,\) is not allowed; factors dividing "
        r"num_layers=4 \(not 3\)",
    ):
        CD.Config(coarsen=(3,))
    with pytest.raises(ConfigError, match=r"coarsen=\(2, 2\) is not allowed; distinct integers"):
        CD.Config(coarsen=(2, 2))


def test_coarse_draws_reach_the_training_step_and_stay_out_of_old_identities():
    """`--coarsen` becomes `wbc.MultiResolution(coarsen=)` of the study's step; an empty
    `coarsen` leaves the run's identity as it was before the field existed, so earlier run
    folders resume, while any factor makes another run."""
    from studies._toolkit import training as T
    from studies.training import train_digits

    step = T.train_step(train_digits.Config(coarsen=(2,)), 10)
    assert step.discretization == wbc.MultiResolution((1, 2, 4), coarsen=(2,))
    assert T.train_step(train_digits.Config(coarsen=()), 10).discretization.coarsen == ()
    none = T.fingerprint(train_digits.Config(coarsen=()))
    assert "coarsen" not in none and "coarse_weight" not in none
    uniform = T.fingerprint(train_digits.Config(coarsen=(2,)))
    assert uniform["coarsen"] == [2] and "coarse_weight" not in uniform
    # The default draws uniformly; `coarse_weight` 2 weighs the coarse draw twice:
    # probabilities 1/5, 1/5, 1/5, 2/5, and another run.
    assert T.train_step(train_digits.Config(), 10).discretization.probabilities is None
    assert "coarse_weight" not in T.fingerprint(train_digits.Config())
    step = T.train_step(train_digits.Config(coarse_weight=2.0), 10)
    assert step.discretization == wbc.MultiResolution((1, 2, 4), (0.2, 0.2, 0.2, 0.4), coarsen=(2,))
    assert T.fingerprint(train_digits.Config(coarse_weight=2.0))["coarse_weight"] == 2.0
    step = T.train_step(
        train_digits.Config(resolutions=(1, 2), coarsen=(2, 4), coarse_weight=3), 10
    )
    assert step.discretization.probabilities == pytest.approx(
        (1 / 8, 1 / 8, 3 / 8, 3 / 8), abs=1e-15
    )
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=rf"coarse_weight={bad} is not allowed; a positive"):
            train_digits.Config(coarse_weight=bad)


def test_compression_numbers_are_those_of_the_models_they_name(getkey, rng):
    """`_compression`'s accuracies are `evaluate` of the model at 2 and 1 steps per layer and of
    `coarsen_depth(model, 2)`; its time ratios are the ratios of its own timings."""
    m, data = _model(getkey, layers=2), tiny_data(rng, n=24)
    out = CD._compression(m, data, repeats=2)
    h, b = out["half_steps"], out["half_basis"]
    assert h["accuracy_from"] == wbc.evaluate(m.rediscretize(None, 2), data)
    assert h["accuracy_to"] == b["accuracy_from"] == wbc.evaluate(m, data)
    assert b["accuracy_to"] == wbc.evaluate(wbc.coarsen_depth(m, 2), data)
    assert h["points_lost"] == pytest.approx(100 * (h["accuracy_from"] - h["accuracy_to"]))
    # The images lost and gained account exactly for the accuracy each change loses.
    n = len(data)
    for d in (h, b):
        net = d["images_lost"] - d["images_gained"]
        assert net == round(n * (d["accuracy_from"] - d["accuracy_to"]))
        assert d["mcnemar_p"] == CD.mcnemar_p(d["images_lost"], d["images_gained"])
    assert h["speedup"] == pytest.approx(h["seconds_from"] / h["seconds_to"])
    assert b["layers_to"] == 1


def test_mcnemar_p_is_the_exact_binomial_test():
    """`mcnemar_p(lost, gained)` equals SciPy's exact two-sided binomial test of `lost` out of
    `lost + gained` at 1/2 (1e-12), and is 1 with no discordant example."""
    stats = pytest.importorskip("scipy.stats", reason="the oracle is scipy.stats.binomtest")
    for lost, gained in [(4, 0), (1, 2), (2, 0), (7, 3), (0, 9), (15, 15), (30, 12)]:
        want = stats.binomtest(lost, lost + gained, 0.5).pvalue
        assert CD.mcnemar_p(lost, gained) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert CD.mcnemar_p(0, 0) == 1.0


def test_adaptive_rows_per_solver_and_the_cheapest_accurate_one(getkey, rng):
    """`_adaptive` solves with each named solver at each tolerance: at a loose tolerance every
    step is the whole layer (Heun 2, Bosh3 4 evaluations per layer, flagged as such), the
    accuracies are `adaptive_accuracy`'s, and the cheapest adaptive solve within the margin of
    the 16x grid is the cheapest such row, its ratio to the cheapest accurate fixed Lie grid
    computed from the rows."""
    m, data = _model(getkey, layers=2), tiny_data(rng, n=24)
    by_factor = [wbc.evaluate(m.rediscretize(None, k), data) for k in CD.FACTORS]
    out = CD._adaptive(m, data, by_factor, (1e3,), margin=1.0, solvers=("heun", "bosh3"))
    heun, bosh3 = out["runs"]
    assert (heun["solver"], bosh3["solver"]) == ("Heun", "Bosh3")
    assert heun["mean_evaluations"] == 2 * 2 and bosh3["mean_evaluations"] == 4 * 2
    assert heun["whole_layer_steps"] and bosh3["whole_layer_steps"]
    expected = wbc.adaptive_accuracy(m, data, solver=diffrax.Heun(), rtol=1e3, atol=1e3)
    assert heun["accuracy"] == expected.accuracy
    # margin 1.0: every grid and row counts as accurate, so the cheapest of each is chosen
    assert out["cheapest_fixed_evaluations"] == 1 * 2
    assert out["cheapest_adaptive"] == heun
    assert out["evaluations_ratio"] == pytest.approx(4 / 2)
