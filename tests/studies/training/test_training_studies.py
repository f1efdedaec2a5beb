"""Depth refinement of controls (exact identities and the corner-cutting bound), and the
training studies msa-vs-gradient, depth-refinement and regularization-cost: verdicts that follow
their numbers, config errors, and one smoke run that checks its numbers against each other."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench.control as wbc
from studies._toolkit.config import ConfigError
from studies.training import depth_refinement, msa_vs_gradient, regularization_cost


def _transformer(key, layers=3, steps_per_layer=1):
    return wbc.random_transformer(
        key,
        d=8,
        num_heads=2,
        num_layers=layers,
        hidden=12,
        steps_per_layer=steps_per_layer,
        dtype=jnp.float64,
        output_scale=0.5,
    )


def _theta(control, ts):
    return jax.vmap(control.evaluate)(ts)


def _max_diff(a, b) -> float:
    return max(
        float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def test_piecewise_constant_refinement_is_the_same_control_and_the_same_network(getkey):
    """Repeating every layer `f` times leaves θ(t) unchanged, and Lie with 1 step per refined
    piece takes exactly the steps of Lie with `f` steps per original layer (to round-off)."""
    m = _transformer(getkey())
    r = wbc.refine_depth(m, 2)
    assert r.num_layers == 6 and r.equation.piece_length == 0.5
    ts = jnp.linspace(0.0, 2.999, 61)
    for a, b in zip(m.equation.operators, r.equation.operators):
        assert _max_diff(_theta(a.term, ts), _theta(b.term, ts)) == 0.0
    u = jax.random.normal(getkey(), (5, 8), jnp.float64)
    np.testing.assert_allclose(r(u), m.rediscretize(steps_per_layer=2)(u), rtol=0, atol=1e-13)


def test_coarsening_is_the_mean_over_each_coarse_piece_and_undoes_refinement(getkey):
    """`coarsen_depth(m, f)` puts on each coarse piece `[j f h, (j + 1) f h)` the average of θ(t)
    over it (the L² projection onto piecewise constants, measured by the midpoint rule on 600
    points per piece, exact for piecewise-constant θ), keeps T, undoes `refine_depth`, and with
    Lie at one step per coarse piece is the network of the averaged layers with step `f h`:
    `u + f·MHA(LN(u))`, then `u + f·FFN(LN(u))` (against a hand-written solve, 1e-13)."""
    m = _transformer(getkey(), layers=4)
    c = wbc.coarsen_depth(m, 2)
    assert c.num_layers == 2 and c.equation.piece_length == 2.0 and c.equation.t1 == m.equation.t1
    ts = (np.arange(600) + 0.5) / 600
    for a, b in zip(m.equation.operators, c.equation.operators):
        for j in range(2):
            mean = jax.tree.map(lambda x: x.mean(0), _theta(a.term, 2.0 * (j + ts)))
            assert (
                _max_diff(
                    eqx.filter(mean, eqx.is_inexact_array),
                    eqx.filter(b.term.piece(j), eqx.is_inexact_array),
                )
                < 1e-13
            )
    back = wbc.coarsen_depth(wbc.refine_depth(m, 3), 3)
    assert (
        _max_diff(eqx.filter(back, eqx.is_inexact_array), eqx.filter(m, eqx.is_inexact_array))
        < 1e-15
    )

    u0 = jax.random.normal(getkey(), (5, 8), jnp.float64)
    u = u0
    for j in range(2):
        for op in c.equation.operators:
            layer = op.projection.piece(j), op.term.piece(j)
            u = u + 2.0 * layer[1].vector_field(layer[0](u))
    u = c.equation.output(u) if c.equation.output is not None else u
    np.testing.assert_allclose(c(u0), u, rtol=0, atol=1e-13)

    with pytest.raises(
        ValueError, match=r"factor=3 must divide the number of pieces \(4\); valid: \[1, 2, 4\]"
    ):
        wbc.coarsen_depth(m, 3)
    with pytest.raises(ValueError, match="needs controls with a nested coarser basis"):
        wbc.coarsen_depth(wbc.interpolate_controls(m), 2)


def _second_difference(values):
    """max |θ_{l+1} − 2θ_l + θ_{l−1}| over layers and entries, θ extended constantly."""
    out = 0.0
    for v in jax.tree.leaves(values):
        p = jnp.concatenate([v[:1], v, v[-1:]])
        out = max(out, float(jnp.max(jnp.abs(p[2:] - 2 * p[1:-1] + p[:-2]))))
    return out


@pytest.mark.parametrize("factor", [2, 3, 4])
def test_interpolated_refinement_samples_theta_and_cuts_corners_by_the_second_difference(
    getkey, factor
):
    """`Interpolated.refine(f)` equals θ at the new midpoints; it differs from θ only around
    the old kinks, by at most max |θ_{l+1} − 2θ_l + θ_{l−1}| / (4 f) for even f, and not at all
    for odd f (a new midpoint sits on every old one)."""
    m = wbc.interpolate_controls(_transformer(getkey()))
    r = wbc.refine_depth(m, factor)
    h = r.equation.piece_length
    assert r.num_layers == 3 * factor and abs(h - 1 / factor) < 1e-15
    mids = (jnp.arange(r.num_layers) + 0.5) * h
    ts = jnp.linspace(0.0, 3.0, 12 * 25 + 1)
    for a, b in zip(m.equation.operators, r.equation.operators):
        assert _max_diff(_theta(a.term, mids), _theta(b.term, mids)) < 1e-14
        gap = _max_diff(_theta(a.term, ts), _theta(b.term, ts))
        if factor % 2:
            assert gap < 1e-14
        else:
            bound = _second_difference(a.term.values) / (4 * factor)
            assert 0.5 * bound < gap <= bound * (1 + 1e-12)
        # Between the new midpoints next to old kinks θ is linear on both: equal there.
        inner = jnp.linspace(0.5 + h / 2, 1.5 - h / 2, 11)
        assert _max_diff(_theta(a.term, inner), _theta(b.term, inner)) < 1e-14


def test_interpolate_controls_passes_through_the_layer_values(getkey):
    m = _transformer(getkey())
    i = wbc.interpolate_controls(m)
    assert not i.equation.is_piecewise_constant and i.num_layers == m.num_layers
    mids = jnp.arange(3) + 0.5
    for a, b in zip(m.equation.operators, i.equation.operators):
        assert _max_diff(_theta(a.term, mids), _theta(b.term, mids)) == 0.0
    with pytest.raises(ValueError, match="factor=0 must be a positive integer"):
        wbc.refine_depth(i, 0)
    with pytest.raises(ValueError, match="expected a ControlledModel or a"):
        wbc.refine_depth(object(), 2)


# --------------------------------------------------------------------------------------------
# Verdicts follow the numbers
# --------------------------------------------------------------------------------------------


def _msa_results(adam, emsa):
    c = msa_vs_gradient.smoke_config()
    return msa_vs_gradient.Results(
        config=c,
        methods=["adam", "emsa"],
        steps=np.arange(10, 70, 10),
        seconds=np.tile(np.linspace(0.1, 1.0, 6), (2, 1)),
        objective=np.ones((2, 6)),
        test_accuracy=np.array([0.9, 0.8]),
        steps_per_second=np.array([100.0, 10.0]),
        compile_time_s=np.array([1.0, 2.0]),
        equal_time_s=1.0,
        objective_at_equal_time=np.array([adam, emsa]),
        objective_at_end=np.array([adam, emsa]),
        emsa_over_adam_at_equal_time=emsa / adam,
        wall_time_s=3.0,
    )


def test_msa_verdict_follows_the_ratio_at_equal_time():
    assert msa_vs_gradient.verdict(_msa_results(1.0, 1.09)).startswith("Yes.")
    no = msa_vs_gradient.verdict(_msa_results(1.0, 1.2))
    assert no.startswith("No.") and "1.20×" in no and "10.0× slower" in no


def test_msa_objective_average_at_a_time():
    seconds = np.array([0.5, 1.0, 1.5, 2.0, 2.5])
    objective = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    assert msa_vs_gradient._averaged(seconds, objective, 2.0, 2) == 2.5  # rows at 1.5 and 2.0
    assert msa_vs_gradient._averaged(seconds, objective, 0.1, 3) == 5.0  # nothing yet: the first
    assert msa_vs_gradient._averaged(seconds, objective, 9.0, 5) == 3.0


def _depth_results(change_without, change_with):
    c = depth_refinement.smoke_config()
    acc = np.full((2, 3, 3), 0.9)
    acc[0, 0, 2] += change_without / 100
    acc[1, 0, 2] += change_with / 100
    return depth_refinement.Results(
        config=c,
        accuracy=acc,
        refined_accuracy=np.full((2, 3), 0.9),
        errors=np.ones((2, 3, 3)),
        observed_order=np.array([[1.0, np.nan, 1.0]] * 2),
        smoothness=np.ones((2, 3)),
        accuracy_change=np.array([change_without, change_with]),
        expected_order=1,
        wall_time_s=1.0,
    )


def test_depth_refinement_verdict_follows_the_accuracy_change():
    yes = depth_refinement.verdict(_depth_results(-3.0, 0.5))
    assert yes.startswith("Yes.") and "+0.50 points" in yes and "-3.00" in yes
    assert depth_refinement.verdict(_depth_results(0.0, -1.2)).startswith("No.")


def _reg_results(needed, acc):
    c = regularization_cost.smoke_config()
    r = regularization_cost.Results(
        config=c,
        kinetic_weight=np.array([0.0, 0.01]),
        smoothness_weight=np.zeros(2),
        test_accuracy=np.asarray(acc),
        kinetic_energy=np.ones(2),
        errors=np.ones((2, 4)),
        steps_needed=np.asarray(needed),
        observed_order=np.ones(2),
        reference=0,
        cheapest=0,
        wall_time_s=1.0,
    )
    return r


def test_regularization_verdict_follows_steps_and_accuracy():
    yes = _reg_results([8, 2], [0.9, 0.895])
    yes.cheapest = 1
    text = regularization_cost.verdict(yes)
    assert text.startswith("Yes.") and "needs 2 step(s)" in text and "needs 8" in text
    assert regularization_cost.verdict(_reg_results([8, 2], [0.9, 0.8])).startswith("No.")
    assert "> 8" in regularization_cost.verdict(_reg_results([0, 0], [0.9, 0.9]))


def test_training_study_configs_name_bad_fields():
    with pytest.raises(ConfigError, match=r"patch=3"):
        msa_vs_gradient.Config(patch=3)
    with pytest.raises(ConfigError, match=r"controls='linear'.*'interpolated', 'piecewise'"):
        depth_refinement.Config(controls="linear")
    with pytest.raises(ConfigError, match=r"kinetic_weights=.*including 0"):
        regularization_cost.Config(kinetic_weights=(1e-3,))
    with pytest.raises(ConfigError, match=r"plan_scheme='rk4'"):
        regularization_cost.Config(plan_scheme="rk4")


@pytest.mark.slow
def test_regularization_cost_smoke_is_consistent():
    """The smoke run's numbers agree with each other: the steps needed are the first ladder
    entry under the tolerance, errors fall along the ladder, the kinetic cost lowers the
    trajectory's kinetic energy, and the cheapest model is within the allowed accuracy drop."""
    r = regularization_cost.compute(regularization_cost.smoke_config())
    c = r.config
    for errors, needed in zip(r.errors, r.steps_needed):
        assert np.all(np.diff(np.log(errors)) < 0)
        under = [k for k, e in zip(c.ladder, errors) if e <= c.tolerance]
        assert needed == (under[0] if under else 0)
    assert r.kinetic_energy[1] < r.kinetic_energy[0]  # λ_K = 0.01 against 0
    assert 100 * (r.test_accuracy[r.reference] - r.test_accuracy[r.cheapest]) <= c.max_drop
    assert dataclasses.asdict(r.config) == dataclasses.asdict(c)


def test_extend_depth_keeps_the_network_and_holds_the_last_layer(getkey):
    """The extended model's state at the old T is the network's output; past it, every step
    uses the last layer's controls (θ(t) = θ_{L−1} for t ≥ (L − 1) h)."""
    m = _transformer(getkey())
    e = wbc.extend_depth(m, 5)
    assert e.num_layers == 5 and e.equation.t1 == 5.0
    u = jax.random.normal(getkey(), (4, 8), jnp.float64)
    states = e.solve(u, save_steps=True).us
    np.testing.assert_allclose(states[2], m.solve(u).u1, rtol=0, atol=1e-13)
    for op in e.equation.operators:
        last = op.term.piece(2)
        for t in (2.5, 3.0, 4.9):
            assert _max_diff(op.term.evaluate(jnp.asarray(t)), last) == 0.0
    with pytest.raises(ValueError, match="fewer than the model's 3 layers"):
        wbc.extend_depth(m, 2)


def test_real_model_dynamics_verdict_follows_the_means():
    from studies.models import real_model_dynamics as s

    c = s.smoke_config()

    def results(means):
        k = len(means)
        return s.Results(
            config=c,
            layers=np.arange(k),
            trained=np.arange(k) <= 6,
            mean_inner_product=np.asarray(means),
            fraction_clustered=np.zeros(k),
            num_clusters=np.ones((k, 3), int),
            histograms=np.ones((7, c.bins)),
            num_tokens=np.array([10, 10, 10]),
            steps=np.array([1, 2, 4]),
            distance_to_network=np.zeros(3),
            distance_to_reference=np.ones(3),
            observed_order=None,
            paraphrase_cosines=np.ones((3, 4)),
            unrelated_cosines=np.zeros(3),
            eigenvalues_real=np.zeros((6, 2)),
            eigenvalues_imag=np.zeros((6, 2)),
            max_real_eigenvalue=np.zeros(6),
            largest_stable_step=np.ones(6),
            lyapunov=np.zeros((6, 2)),
            wall_time_s=1.0,
        )

    base = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    assert s.verdict(results(base + [0.2, 0.5])).startswith("Yes.")
    assert s.verdict(results(base + [0.2, 0.21])).startswith("Partly.")
    assert s.verdict(results(base + [0.12, 0.5])).startswith("Partly.")
    no = s.verdict(results(base + [0.12, 0.13]))
    assert no.startswith("No.") and "0.100 at the embedding to 0.120 after layer 6" in no
    with pytest.raises(ConfigError, match=r"steps=\(2, 4\)"):
        s.Config(steps=(2, 4))


def test_real_model_dynamics_says_order_only_when_the_ladder_converges():
    import dataclasses

    from studies.models import real_model_dynamics as s

    r = s.Results(
        config=s.smoke_config(),
        layers=np.arange(7),
        trained=np.arange(7) <= 6,
        mean_inner_product=np.linspace(0.1, 0.3, 7),
        fraction_clustered=np.zeros(7),
        num_clusters=np.ones((7, 3), int),
        histograms=np.ones((7, 10)),
        num_tokens=np.array([10, 10, 10]),
        steps=np.array([1, 2, 4]),
        distance_to_network=np.array([0.0, 5.0, 6.0]),
        distance_to_reference=np.array([8.4, 7.8, 8.0]),
        observed_order=-0.01,
        paraphrase_cosines=np.ones((3, 4)),
        unrelated_cosines=np.zeros(3),
        eigenvalues_real=np.zeros((6, 2)),
        eigenvalues_imag=np.zeros((6, 2)),
        max_real_eigenvalue=np.zeros(6),
        largest_stable_step=np.ones(6),
        lyapunov=np.zeros((6, 2)),
        wall_time_s=1.0,
    )
    text = s._convergence_sentence(r)
    assert text.startswith("no convergence over k = 1..4: the distance to the reference goes 8.4")
    assert "observed order" not in text.replace("no observed order", "")
    good = dataclasses.replace(
        r, distance_to_reference=np.array([0.4, 0.2, 0.1]), observed_order=1.0
    )
    assert s._convergence_sentence(good).startswith("observed order 1.00")


def test_the_device_layout_is_not_part_of_a_training_runs_identity():
    """A run checkpointed with replicated parameters resumes with sharded ones (and back): the
    checkpoint fingerprint leaves `shard_params` out, and every other field in."""
    import dataclasses

    import studies._toolkit.training as T
    import studies.training.train_digits as s

    c = s.smoke_config()
    assert T.fingerprint(dataclasses.replace(c, shard_params=True)) == T.fingerprint(c)
    assert "shard_params" not in T.fingerprint(c)
    assert T.fingerprint(dataclasses.replace(c, seed=1)) != T.fingerprint(c)


def test_the_certificate_table_prints_the_paired_intervals():
    """A certificate with paired comparisons prints, per refinement, the change in points with
    its interval and McNemar p; one without (an older certificate) prints no such row."""
    import workbench.analysis as wba
    from studies._toolkit.training import certificate_lines

    from helpers import certificate_dict

    cert = certificate_dict(0.0004)
    assert not any("paired" in line for line in certificate_lines(cert))
    own = np.ones(10_000, bool)
    lost = own.copy()
    lost[:4] = False
    result = wba.paired_difference(own, lost)
    cert["accuracy"]["paired"] = [
        {"scheme": "LieTrotter", "steps_per_layer": 16, **dataclasses.asdict(result)}
    ]
    table = "\n".join(certificate_lines(cert))
    want = f"LieTrotter 16: -0.04 [{result.low:+.2f}, {result.high:+.2f}] (p 0.12)"
    assert "paired change vs own, points [95 % interval] (McNemar p)" in table and want in table
    assert result.low < -0.04 < 0 < result.high


def test_train_digits_task_field_is_checked_and_absent_from_a_digits_runs_identity():
    """`--task` picks the data; a digits run's identity has no `task` (so run folders written
    without the field resume), another task's has it; bad combinations are named."""
    import studies._toolkit.training as T
    import studies.training.train_digits as s

    c = s.smoke_config()
    assert c.task == "digits" and "task" not in T.fingerprint(c)
    m = dataclasses.replace(c, task="mnist1d")
    assert T.fingerprint(m) == {**T.fingerprint(c), "task": "mnist1d"}
    with pytest.raises(ConfigError, match=r"task='mnist'.*'digits', 'mnist1d', 'mnist5000'"):
        s.Config(task="mnist")
    with pytest.raises(ConfigError, match=r"embedding='vit'.*'conv' with a task other than"):
        s.Config(task="mnist1d", embedding="vit")
    with pytest.raises(ConfigError, match=r"batch_size=2000.*at most 1347"):
        s.Config(batch_size=2000)
    assert s.Config(task="mnist1d", batch_size=2000).batch_size == 2000
    assert s.Config(task="mnist1d").estimated_peak_bytes() > 0


def test_train_digits_builds_a_model_for_each_task():
    """One token per sample of MNIST-1D's signal (40, plus the class token) and per 4×4 patch of
    a 28×28 MNIST image (49 + 1); each model classifies its task's inputs into 10 classes."""
    import studies._toolkit.training as T
    import studies.training.train_digits as s

    for task, tokens, x in (
        ("mnist1d", 41, np.zeros((1, 40), np.float32)),
        ("mnist5000", 50, np.zeros((28, 28), np.float32)),
    ):
        config = s.Config(task=task, d=16, num_heads=2, num_layers=2, hidden=32)
        scheme, spl = T.discretization(config, None)
        model = s._model(config, jax.random.key(0), scheme, spl)
        assert model.embedding.num_tokens == tokens
        assert model(jnp.asarray(x)).shape == (10,)


@pytest.mark.slow
def test_train_digits_learns_mnist1d():
    """Two epochs (250 steps) of the smoke model on MNIST-1D: held-out accuracy (10 000
    examples) well above chance (10 %) and above logistic regression's (about 32 %)."""
    import studies.training.train_digits as s

    pytest.importorskip("mnist1d", reason="the mnist1d task needs mnist1d (the tasks extra)")
    config = dataclasses.replace(s.smoke_config(), task="mnist1d", epochs=2, certificate_examples=0)
    r = s.compute(config)
    assert r.num_steps == 250
    assert r.test_accuracy > 0.4
    assert 0.3 < r.baseline_accuracy < 0.35
