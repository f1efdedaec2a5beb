"""The `control-bases` study: its verdict follows its numbers (a run that meets every goal says
Yes, each miss is named and turns it to No) and its config names bad fields."""

import copy

import pytest

from studies._toolkit.config import ConfigError
from studies.training import control_bases as CB


def _entry(difference, low, high, **extra):
    return {"difference": difference, "low": low, "high": high, "p_value": 1.0, **extra}


def _run(basis="legendre"):
    one_piece = basis == "legendre"
    return {
        "basis": basis,
        "seed": 0,
        "layers_worth": 8,
        "one_piece": one_piece,
        "accuracy": 0.965,
        "own_steps": 8,
        "refinement": [_entry(0.05, -0.1, 0.2, steps=8 * f, accuracy=0.965) for f in (2, 4, 8, 16)],
        "second_scheme": _entry(-0.02, -0.2, 0.15, steps=128, scheme="Strang", accuracy=0.965),
        "off_grid": [_entry(0.0, -0.1, 0.1, steps=3, accuracy=0.965)] if one_piece else [],
        "orders": {
            "LieTrotter": {"observed": 1.05, "ci": None, "expected": 1},
            "Strang": {"observed": 2.1, "ci": None, "expected": 2},
        },
        "compression": [
            {"factor": 1, "functions": 8, "parameters": 10, "evaluations": 8, "accuracy": 0.965},
            {
                "factor": 2,
                "functions": 4,
                "parameters": 5,
                "evaluations": 4,
                **_entry(-0.3, -0.5, -0.1, accuracy=0.962),
            },
        ],
        "fixed": [],
        "fine_accuracy": 0.965,
        "cheapest_fixed": None,
        "adaptive": [],
        "cheapest_adaptive": {"mean_evaluations": 4.2, "solver": "Bosh3", "rtol": 0.1},
        "training_time_s": 1.0,
        "certificate_consistent": True,
    }


def _results(*runs):
    config = CB.Config(bases=tuple(dict.fromkeys(r["basis"] for r in runs)), seeds=(0,))
    return CB.Results(config=config, runs=list(runs), wall_time_s=0.0)


def test_a_run_that_meets_every_goal_says_yes():
    r = _results(_run())
    assert CB.misses(r.config, r.runs[0]) == []
    assert CB.verdict(r).startswith("Yes.")


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda r: r.update(accuracy=0.955), "accuracy 95.50 % < 96.0 %"),
        (lambda r: r["refinement"][3].update(high=0.31), "Lie at 128 steps"),
        (lambda r: r["second_scheme"].update(low=-0.4), "Strang at 128 steps"),
        (lambda r: r["off_grid"][0].update(low=-0.35), "Lie at 3 steps"),
        (lambda r: r["compression"][1].update(difference=-0.6), "half basis and steps lose 0.60"),
        (
            lambda r: r["cheapest_adaptive"].update(mean_evaluations=4.9),
            "cheapest adaptive solve 4.9 evaluations > 4.8",
        ),
        (lambda r: r.update(cheapest_adaptive=None), "no adaptive solve within"),
        (lambda r: r["orders"]["Strang"].update(observed=1.6), "Strang order 1.60, expected 2"),
        (lambda r: r["orders"]["LieTrotter"].update(observed=None), "LieTrotter order none"),
    ],
)
def test_each_miss_is_named_and_turns_the_verdict_to_no(edit, words):
    run = copy.deepcopy(_run())
    edit(run)
    r = _results(run)
    assert words in CB.verdict(r)
    assert CB.verdict(r).startswith("No.")


def test_a_basis_with_layers_is_not_held_to_the_adaptive_goal_and_without_legendre_no_answer():
    layers = _run("layers")
    layers["cheapest_adaptive"] = None
    r = _results(layers)
    assert CB.misses(r.config, layers) == []
    assert CB.verdict(r).startswith("No answer")


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"bases": ("layers", "chebyshev")}, "bases"),
        ({"compress": (3,)}, "dividing num_layers=8"),
        ({"grid_steps": (0, 2)}, "grid_steps"),
        ({"seeds": (-1,)}, "seeds"),
        ({"task": "cifar"}, "task"),
        ({"steps_per_layer": 2}, "steps_per_layer"),
        ({"first_step": 0.0}, r"first_step.*\(0, 1\]"),
        ({"first_step": 1.5}, "first_step"),
        ({"first_step": "half"}, "first_step"),
    ],
)
def test_the_config_names_bad_fields(fields, words):
    with pytest.raises(ConfigError, match=words):
        CB.Config(**fields)


def test_each_basis_trains_with_its_own_draws():
    """A basis with layers draws steps per layer (`resolutions`), a one-piece basis total steps
    over [0, T] (`grid_steps`); the interpolated basis has no coarse draws."""
    c = CB.Config()
    assert c.digits_config("layers", 1).resolutions == c.resolutions
    assert c.digits_config("legendre", 2).resolutions == c.grid_steps
    assert c.digits_config("legendre", 2).seed == 2
    assert c.digits_config("interpolated", 0).coarsen == ()


@pytest.mark.parametrize(
    "num_layers, basis, unit",
    [
        (4, "layers", "steps per layer"),
        (4, "legendre", "steps in all"),
        (1, "layers", "steps in all"),
    ],
)
def test_the_certificate_names_what_its_step_counts_count(num_layers, basis, unit):
    """A network's step counts are per layer; a one-piece basis's (and a single layer's) are over
    the whole depth, and the report says which."""
    import jax

    import workbench.control as wbc
    from studies._toolkit import training as T
    from studies._toolkit.training.certificate import certificate_lines, step_unit

    transformer = wbc.random_transformer(
        jax.random.key(0),
        d=8,
        num_heads=2,
        num_layers=num_layers,
        hidden=16,
        basis=T.BASES[basis](num_layers, jax.random.key(1)),
    )
    model = wbc.ControlledModel(
        embedding=lambda x: x, transformer=transformer, head=lambda u: u.mean(0)
    )
    assert step_unit(model) == unit
    cert = {
        "step_unit": unit,
        "observed_order": 1.0,
        "plan_holds": None,
        "scheme": "LieTrotter",
        "steps_per_layer": 8,
        "error": 0.1,
        "expected_order": 1,
        "largest_stable_step": 3.0,
        "step": 1.0,
        "consistent": True,
        "reasons": [],
    }
    table = "\n".join(certificate_lines(cert))
    assert f"LieTrotter, 8 {unit}" in table
