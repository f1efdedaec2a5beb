"""The `trained-model-analysis` study: its layer maps, spectra and stability rows against
independent computations (the network's own solve, the traces of the operators' Jacobians, the
closed-form stability function of Lie–Trotter, Liouville's formula for the Lyapunov sum), its
verdict against the numbers and its config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.analysis as wa
import workbench.control as wbc
from studies import ConfigError
from studies.models import trained_model_analysis as TMA


@pytest.fixture
def transformer():
    """A random 3-layer pre-norm equation in float64 and a random state (5 tokens)."""
    from studies._toolkit.training import to_float64

    with jax.enable_x64(True):
        tr = wbc.random_transformer(jax.random.key(3), d=8, num_heads=2, num_layers=3, hidden=16)
        yield to_float64(tr), jnp.asarray(np.random.default_rng(0).normal(size=(5, 8)))


@pytest.mark.parametrize("k", [1, 4])
def test_layer_maps_compose_to_the_networks_solve(transformer, k):
    """The layer maps at k steps per layer, composed, are the network solved with k steps per
    layer (1e-12)."""
    tr, u0 = transformer
    with jax.enable_x64(True):
        u = u0
        for phi in TMA.layer_maps(tr, k):
            u = phi(u)
        want = tr.rediscretize(None, k).solve(u0).u1
        np.testing.assert_allclose(np.asarray(u), np.asarray(want), atol=1e-12)


def test_spectra_sum_to_the_traces_of_the_operators_jacobians(transformer):
    """At every layer, the eigenvalues of the full field's Jacobian sum to the trace of the
    attention field's Jacobian plus the feed-forward field's (dense `jax.jacfwd`, 1e-9)."""
    tr, u0 = transformer
    with jax.enable_x64(True):
        eigs = TMA.spectra(tr, u0)
        sol = tr.solve(u0, save_steps=True)
        states = [u0, *(sol.us[i] for i in range(tr.num_layers - 1))]
        assert len(eigs) == tr.num_layers
        for i, (e, u) in enumerate(zip(eigs, states)):
            fields = wa.term_fields(tr.equation, i + 0.5)
            trace = sum(
                np.trace(np.asarray(jax.jacfwd(fields[n])(u)).reshape(u.size, u.size))
                for n in ("attention", "feed-forward")
            )
            assert e.size == u.size
            assert abs(e.sum() - trace) <= 1e-9 * max(1.0, abs(trace))


def test_stability_row_follows_lie_trotters_closed_form():
    """Lie–Trotter (commuting estimate) has R(z) = (1 + z/2)²: on real λ = −a it is stable up
    to τ* = 4 / max a, and at h = 3 only a > 4/3 lies outside."""
    eigs = np.asarray([-1.0, -2.0, -0.5, 0.3], complex)  # 0.3 grows: not a decaying mode
    row = TMA._layer_row(eigs, wb.schemes.LieTrotter(), 3.0)
    assert row["num_decaying"] == 3 and row["max_real"] == pytest.approx(0.3)
    assert row["largest_stable_step"] == pytest.approx(2.0, rel=1e-12)
    assert row["outside_fraction"] == pytest.approx(1 / 3)
    assert TMA._layer_row(eigs, wb.schemes.LieTrotter(), 1.5)["outside_fraction"] == 0.0


def _net(recipe, order, reduced, gap):
    return {
        "recipe": recipe,
        "orders": [{"observed_order": order, "order_reduced": reduced, "expected_order": 1}],
        "lyapunov_difference": gap,
        "layers": [{"outside_fraction": 0.1}],
    }


def _results(*nets):
    return TMA.Results(config=TMA.Config(), networks=list(nets), wall_time_s=1.0)


def test_verdict_follows_the_numbers():
    yes = TMA.verdict(
        _results(_net("one-step", 0.42, True, 0.3), _net("multi-resolution", 1.03, False, 0.02))
    )
    assert yes.startswith("Yes. one-step: order 0.42 (expected 1), Lyapunov gap 0.3000, not ")
    assert "multi-resolution: order 1.03 (expected 1), Lyapunov gap 0.0200, faithful" in yes
    assert TMA.verdict(
        _results(_net("one-step", 0.4, True, 0.3), _net("multi-resolution", 1.0, False, 0.2))
    ).startswith("No.")
    assert TMA.verdict(
        _results(_net("one-step", 0.4, True, 0.3), _net("multi-resolution", None, False, 0.0))
    ).startswith("No.")
    both = TMA.verdict(
        _results(_net("one-step", 1.0, False, 0.05), _net("multi-resolution", 1.0, False, 0.02))
    )
    assert both.startswith("Partly (the one-step network passes too).")
    assert TMA.verdict(_results(_net("one-step", 1.0, False, 0.0))).startswith("No answer")


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="recipes"):
        TMA.Config(recipes=("one-step", "euler"))
    with pytest.raises(ConfigError, match="fine_factor"):
        TMA.Config(fine_factor=1)
    with pytest.raises(ConfigError, match="certificate_examples"):
        TMA.Config(certificate_examples=0)
    with pytest.raises(ConfigError, match="methods"):  # the plan's own check
        TMA.Config(plan_methods=("lie", "nope"))
    assert TMA.Config(kinetic=0.02).digits_config("one-step").kinetic == 0.0
    assert TMA.Config(kinetic=0.02).digits_config("multi-resolution").depth == "multi-resolution"


def test_a_tiny_run_lyapunov_sum_is_liouvilles(tmp_path):
    """With the full frame, the sum of the layer maps' Lyapunov exponents is the mean of
    log |det DΦ_l| along the orbit (the dense Jacobians of the trained layer maps, read back
    from the run folder; 1e-8); the plan's rows are those of `plan --weights <folder>`."""
    c = TMA.Config(
        epochs=1,
        d=8,
        num_heads=2,
        num_layers=2,
        hidden=16,
        warmup=2,
        checkpoint_every=50,
        certificate_examples=1,
        num_exponents=10**6,
        plan_methods=("lie",),
        tolerance=0.1,
        recipes=("one-step",),
    )
    r = TMA.compute(c, run_dir=tmp_path)
    (net,) = r.networks
    with jax.enable_x64(True):
        from studies._toolkit.training import to_float64

        model = to_float64(wbc.load_run(tmp_path / "one-step"))
        task = wbc.digits(0)
        u = model.embedding(jnp.asarray(task.test.inputs[0]))
        assert len(net["lyapunov_own"]) == u.size
        logdets = []
        for phi in TMA.layer_maps(model.transformer, 1):
            jac = np.asarray(jax.jacfwd(phi)(u)).reshape(u.size, u.size)
            logdets.append(np.linalg.slogdet(jac)[1])
            u = phi(u)
    assert net["lyapunov_own"].sum() == pytest.approx(np.mean(logdets), rel=1e-8, abs=1e-8)
    assert net["plan_candidates"][0]["method"] == "lie"
    assert net["orders"][0]["scheme"] == "LieTrotter" and net["orders"][1]["scheme"] == "Strang"
