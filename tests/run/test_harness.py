"""Tests of the study harness: atomic IO, JSON conversion, overrides, config checks, registry,
run, tour and report helpers. Every test checks values, not only that code runs."""

import base64
import dataclasses
import io
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import types
from typing import Literal

import numpy as np
import pytest

import studies
from studies._run import cli, harness as _harness, tour as _tour
from studies._run.overrides import OverrideError, describe_fields, parse_overrides, parse_value
from studies._toolkit.config import ConfigError, check_multiple, check_positive, check_range
from studies._toolkit.report import (
    code_block,
    demote_headings,
    markdown_table,
    new_figure,
    save_figure,
)
from workbench.io import (
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    environment,
    new_run_dir,
    to_jsonable,
)

# --------------------------------------------------------------------------------------------
# fixtures: a tiny real study, a failing one, and x64 restored after CLI calls
# --------------------------------------------------------------------------------------------

SQUARES_MODULE = "_workbench_test_squares"
BROKEN_MODULE = "_workbench_test_broken"


def _sum_of_squares(n):
    return n * (n + 1) * (2 * n + 1) // 6


def _make_squares_study():
    module = types.ModuleType(
        SQUARES_MODULE,
        "Does summing k^2 for k = 1..n give n(n+1)(2n+1)/6?\n\nA study for testing the harness.",
    )

    @dataclasses.dataclass(frozen=True)
    class Config:
        n: int = 1000
        label: str = "squares"
        weights: tuple[float, ...] = (1.0,)

        def __post_init__(self):
            check_positive(self, "n")

    @dataclasses.dataclass(frozen=True)
    class Results:
        config: Config
        sum_of_squares: int
        closed_form: int
        weights: np.ndarray

    def smoke_config():
        return Config(n=10)

    def compute(config):
        total = sum(k * k for k in range(1, config.n + 1))
        return Results(config, total, _sum_of_squares(config.n), np.asarray(config.weights))

    def figures(results):
        fig, ax = new_figure(figsize=(2, 2))
        ax.plot(np.arange(1, results.config.n + 1) ** 2)
        return {"squares": fig}

    def report(results):
        return f"# Squares\n\nThe sum of squares 1..{results.config.n} is {results.sum_of_squares}."

    def verdict(results):
        same = results.sum_of_squares == results.closed_form
        return f"{'Yes' if same else 'No'}. {results.sum_of_squares} vs {results.closed_form}."

    module.NAME = "squares"
    module.SUMMARY = "Sum of squares against its closed form."
    Config.__module__ = Results.__module__ = SQUARES_MODULE  # as if defined in the study module
    module.Config, module.Results = Config, Results
    module.smoke_config, module.compute, module.figures = smoke_config, compute, figures
    module.report, module.verdict = report, verdict
    return module


def _make_broken_study():
    module = types.ModuleType(BROKEN_MODULE, "Does a study that raises get reported?")

    @dataclasses.dataclass(frozen=True)
    class Config:
        size: int = 3

    @dataclasses.dataclass(frozen=True)
    class Results:
        config: Config

    def compute(config):
        raise RuntimeError(f"boom {config.size * 14}")

    module.NAME = "broken"
    module.SUMMARY = "Always raises."
    module.Config, module.Results = Config, Results
    module.smoke_config, module.compute = Config, compute
    module.figures = module.report = module.verdict = lambda results: None
    return module


@pytest.fixture
def fake_registry(monkeypatch):
    """studies.STUDIES holding only the squares and broken studies."""
    squares, broken = _make_squares_study(), _make_broken_study()
    monkeypatch.setitem(sys.modules, SQUARES_MODULE, squares)
    monkeypatch.setitem(sys.modules, BROKEN_MODULE, broken)
    monkeypatch.setattr(studies, "STUDIES", {"squares": SQUARES_MODULE, "broken": BROKEN_MODULE})
    monkeypatch.setattr(studies, "TOUR", ("squares", "broken"))
    return squares, broken


def _listing(folder):
    return sorted(p.name for p in pathlib.Path(folder).iterdir())


# --------------------------------------------------------------------------------------------
# atomic writes
# --------------------------------------------------------------------------------------------


def test_atomic_json_failure_keeps_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_json(path, {"error": 0.25})
    before = path.read_bytes()
    with pytest.raises(TypeError, match=r"results\.json\['a'\]\[1\] has type builtins\.object"):
        atomic_write_json(path, {"error": 0.5, "a": [1, object()]})
    assert path.read_bytes() == before
    assert json.loads(before) == {"error": 0.25}
    assert _listing(tmp_path) == ["results.json"]


def test_atomic_open_failure_midway_through_streamed_write(tmp_path):
    # json.dump writes chunk by chunk, so part of the text is in the temp file when it fails.
    path = tmp_path / "data.json"
    atomic_write_text(path, "old contents\n")
    with pytest.raises(TypeError):
        with atomic_open(path, "w") as f:
            json.dump({"first": list(range(1000)), "second": object()}, f)
    assert path.read_text() == "old contents\n"
    assert _listing(tmp_path) == ["data.json"]


def test_atomic_write_replaces_and_sets_ordinary_permissions(tmp_path):
    path = tmp_path / "report.md"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two ✓")
    assert path.read_text(encoding="utf-8") == "two ✓"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert _listing(tmp_path) == ["report.md"]


def test_atomic_open_rejects_missing_folder_and_bad_mode(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        atomic_write_text(tmp_path / "missing" / "x.txt", "x")
    with pytest.raises(ValueError, match=r"mode='a'.*'w', 'wb'"):
        with atomic_open(tmp_path / "x.txt", "a"):
            pass


# --------------------------------------------------------------------------------------------
# JSON conversion
# --------------------------------------------------------------------------------------------


def test_json_round_trip_of_numpy_values(tmp_path):
    import jax.numpy as jnp

    f32 = np.float32(0.1)
    grid = np.linspace(0.0, 1.0, 7).reshape(7, 1) ** 3
    ints = np.arange(-3, 3, dtype=np.int32).reshape(2, 3)
    obj = {
        "f64": np.float64(1 / 3),
        "f32": f32,
        "i64": np.int64(2**40 + 1),
        "u8": np.uint8(255),
        "flag": np.bool_(True),
        "grid": grid,
        "ints": ints,
        "jax": jnp.arange(4),
        "tuple": (1, 2.5, "x"),
        3: "int key",
        "nested": {"list": [np.float64(2.0), None, False]},
    }
    path = tmp_path / "r.json"
    atomic_write_json(path, obj)
    back = json.loads(path.read_text())

    assert back["f64"] == 1 / 3  # repr round-trips a double exactly
    assert back["f32"] == float(f32) and np.float32(back["f32"]) == f32
    assert back["i64"] == 2**40 + 1 and type(back["i64"]) is int
    assert back["u8"] == 255
    assert back["flag"] is True
    np.testing.assert_array_equal(np.asarray(back["grid"]), grid)  # exact, not approximate
    np.testing.assert_array_equal(np.asarray(back["ints"], dtype=np.int32), ints)
    assert back["jax"] == [0, 1, 2, 3]
    assert back["tuple"] == [1, 2.5, "x"]
    assert back["3"] == "int key"
    assert back["nested"] == {"list": [2.0, None, False]}


def test_json_non_finite_floats_become_strings(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(
        path, {"a": math.nan, "b": np.float32(np.inf), "c": np.array([-np.inf, 1.0, np.nan])}
    )
    text = path.read_text()
    assert json.loads(text) == {"a": "NaN", "b": "Infinity", "c": ["-Infinity", 1.0, "NaN"]}
    # Strict JSON: no bare NaN / Infinity tokens a strict parser would reject.
    json.loads(text, parse_constant=lambda token: pytest.fail(f"bare {token} in JSON"))


def test_to_jsonable_dataclass_path_and_errors(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class C:
        steps: tuple[int, ...] = (4, 8)
        where: pathlib.Path = pathlib.Path("a/b")

    assert to_jsonable({"c": C()}) == {"c": {"steps": [4, 8], "where": "a/b"}}
    with pytest.raises(TypeError, match=r"obj\['z'\] has type builtins.complex"):
        to_jsonable({"z": 1 + 2j})
    with pytest.raises(TypeError, match="key"):
        to_jsonable({(1, 2): 3})


# --------------------------------------------------------------------------------------------
# run folders and environment
# --------------------------------------------------------------------------------------------


def test_new_run_dir_is_unique_and_named(tmp_path):
    a = new_run_dir(tmp_path / "runs", "exact-recovery")
    b = new_run_dir(tmp_path / "runs", "exact-recovery")
    assert a != b and a.is_dir() and b.is_dir()
    assert re.fullmatch(r"exact-recovery-\d{8}T\d{6}Z(-\d+)?", a.name)
    assert b.name.startswith("exact-recovery-")
    assert _listing(a) == [] and _listing(b) == []
    with pytest.raises(ValueError, match="'../x'"):
        new_run_dir(tmp_path, "../x")


def test_environment_record():
    import jax

    env = environment()
    assert json.loads(json.dumps(to_jsonable(env))) == env  # already JSON-able
    assert env["packages"]["numpy"] == np.__version__
    assert env["packages"]["jax"] == jax.__version__
    assert env["jax_enable_x64"] is bool(jax.config.jax_enable_x64)
    assert env["jax_backend"] == jax.default_backend()
    assert len(env["jax_devices"]) == len(jax.devices())
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(env["cpu_count"], int) and env["cpu_count"] >= 1
    assert env["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", env["git_commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", env["timestamp_utc"])


# --------------------------------------------------------------------------------------------
# overrides
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _AllTypes:
    steps: int = 4
    tol: float = 1e-6
    plot: bool = True
    name: str = "lie"
    sizes: tuple[int, ...] = (8, 16)
    betas: tuple[float, ...] = (0.5,)
    tags: tuple[str, ...] = ()
    scheme: Literal["lie", "strang"] = "lie"
    seed: int | None = None
    pair: tuple[int, float] = (1, 2.0)


def test_overrides_give_typed_values():
    got = parse_overrides(
        _AllTypes,
        [
            ("steps", "-3"),
            ("tol", "1e-8"),
            ("plot", "no"),
            ("name", "Strang splitting"),
            ("sizes", "8, 16,32"),
            ("betas", "0.25,1,4e0"),
            ("tags", "a,b"),
            ("scheme", "strang"),
            ("seed", "42"),
            ("pair", "3,0.5"),
        ],
    )
    assert got == {
        "steps": -3,
        "tol": 1e-8,
        "plot": False,
        "name": "Strang splitting",
        "sizes": (8, 16, 32),
        "betas": (0.25, 1.0, 4.0),
        "tags": ("a", "b"),
        "scheme": "strang",
        "seed": 42,
        "pair": (3, 0.5),
    }
    assert type(got["steps"]) is int and type(got["tol"]) is float
    assert all(type(x) is float for x in got["betas"])
    assert all(type(x) is int for x in got["sizes"])
    config = dataclasses.replace(_AllTypes(), **got)
    assert config.sizes == (8, 16, 32)


@pytest.mark.parametrize(
    "text, value",
    [("true", True), ("FALSE", False), ("1", True), ("0", False), ("Yes", True), ("no", False)],
)
def test_bool_words(text, value):
    assert parse_value(text, bool) is value


def test_optional_and_empty_tuple_and_dashes():
    assert parse_overrides(_AllTypes, [("seed", "None"), ("tags", "")]) == {
        "seed": None,
        "tags": (),
    }
    assert parse_overrides(_AllTypes, [("steps", "7")]) == {"steps": 7}

    @dataclasses.dataclass(frozen=True)
    class WithUnderscore:
        num_steps: int = 1

    assert parse_overrides(WithUnderscore, [("num-steps", "5")]) == {"num_steps": 5}


def test_unknown_field_error_names_field_value_and_choices():
    with pytest.raises(OverrideError) as info:
        parse_overrides(_AllTypes, [("stpes", "5")], study="demo")
    message = str(info.value)
    assert "'stpes'" in message and "'5'" in message and "'demo'" in message
    valid = "steps, tol, plot, name, sizes, betas, tags, scheme, seed, pair"
    assert f"valid fields: {valid}." in message


@pytest.mark.parametrize(
    "field, text, expected",
    [
        ("steps", "3.5", "int"),
        ("tol", "small", "float"),
        ("plot", "maybe", "bool (use true/false, 1/0 or yes/no)"),
        ("sizes", "8,x", "tuple[int, ...] (item 1 = 'x' is not an int)"),
        ("sizes", "8,,16", "tuple[int, ...] (item 1 is empty)"),
        ("scheme", "yoshida", "one of 'lie', 'strang' (valid choices: lie, strang)"),
        ("seed", "abc", "int | None"),
        ("pair", "1,2,3", "tuple[int, float] (expected 2 comma-separated values, got 3)"),
    ],
)
def test_bad_value_error_names_field_value_and_type(field, text, expected):
    with pytest.raises(OverrideError) as info:
        parse_overrides(_AllTypes, [(field, text)])
    message = str(info.value)
    assert message.startswith(f"field {field!r}: cannot read {text!r} as {expected}")


def test_bool_fields_are_switches():
    assert parse_overrides(_AllTypes, [("plot", None)]) == {"plot": True}
    assert parse_overrides(_AllTypes, [("no-plot", None)]) == {"plot": False}
    with pytest.raises(OverrideError, match=r"--no-plot takes no value \(given 'true'\)"):
        parse_overrides(_AllTypes, [("no-plot", "true")])
    # Only bool fields have a --no- form.
    with pytest.raises(OverrideError, match=r"unknown field 'no-steps'.*valid fields: steps"):
        parse_overrides(_AllTypes, [("no-steps", None)])
    with pytest.raises(OverrideError, match=r"--no-x64: study 'demo' has no precision switch"):
        parse_overrides(_AllTypes, [("no-x64", None)], study="demo")
    # The command line: a switch followed by another option, or by nothing, has no value.
    split = cli._split_run_args
    assert split(["demo", "--no-x64", "--smoke"]) == (["demo", "--smoke"], [("no-x64", None)])
    assert split(["demo", "--x64", "--smoke"]) == (["demo", "--smoke"], [("x64", None)])
    assert split(["demo", "--x64"]) == (["demo"], [("x64", None)])
    assert split(["demo", "--x64", "false"]) == (["demo"], [("x64", "false")])
    assert split(["demo", "--n", "-1"]) == (["demo"], [("n", "-1")])


def test_override_structural_errors():
    with pytest.raises(OverrideError, match=r"'steps' is given twice \('1' and '2'\)"):
        parse_overrides(_AllTypes, [("steps", "1"), ("steps", "2")])
    with pytest.raises(OverrideError, match=r"'steps' has no value; write --steps VALUE"):
        parse_overrides(_AllTypes, [("steps", None)])

    @dataclasses.dataclass(frozen=True)
    class Odd:
        table: dict = dataclasses.field(default_factory=dict)

    with pytest.raises(OverrideError, match=r"'table' has type dict, which cannot be set"):
        parse_overrides(Odd, [("table", "{}")])


def test_describe_fields_shows_types_and_defaults():
    text = describe_fields(_AllTypes, dataclasses.replace(_AllTypes(), steps=2))
    lines = {line.split()[0]: line for line in text.splitlines()}
    assert "int" in lines["--steps"] and "default: 4, smoke: 2" in lines["--steps"]
    assert "tuple[int, ...]" in lines["--sizes"] and "default: 8,16" in lines["--sizes"]


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------


def test_get_study_unknown_lists_valid_names():
    with pytest.raises(ValueError) as info:
        studies.get_study("nope")
    message = str(info.value)
    assert "'nope'" in message
    assert f"valid studies: {', '.join(studies.STUDIES)}." in message
    assert "exact-recovery" in message


def test_registry_points_at_exact_recovery_and_imports_lazily():
    assert studies.STUDIES["exact-recovery"] == "studies.models.exact_recovery"
    assert all(path.startswith("studies.") for path in studies.STUDIES.values())
    # A fresh interpreter: importing the package and the CLI imports no study, no JAX,
    # and does not turn float64 on.
    code = (
        "import sys, studies, studies._run.cli\n"
        "assert 'studies.models.exact_recovery' not in sys.modules\n"
        "import jax\n"
        "assert not jax.config.jax_enable_x64\n"
    )
    repo = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo)
    assert done.returncode == 0, done.stderr


def test_check_study_reports_protocol_violations(fake_registry):
    squares, _ = fake_registry
    assert _harness.check_study(squares, "squares") is squares
    with pytest.raises(_harness.StudyError, match="registered as 'other' but its NAME"):
        _harness.check_study(squares, "other")

    bad = types.ModuleType("_bad_study", "A question?")
    bad.NAME, bad.SUMMARY = "bad", "x"

    @dataclasses.dataclass  # not frozen
    class Config:
        n: int = 1

    bad.Config = Config
    with pytest.raises(_harness.StudyError, match="frozen dataclass"):
        _harness.check_study(bad)

    @dataclasses.dataclass(frozen=True)
    class Clash:
        out: str = "x"

    bad.Config = Clash
    with pytest.raises(_harness.StudyError, match="'out' clash"):
        _harness.check_study(bad)


# --------------------------------------------------------------------------------------------
# run_study
# --------------------------------------------------------------------------------------------


def test_run_study_writes_config_results_figures_and_report(tmp_path, fake_registry):
    squares, _ = fake_registry
    config = squares.Config(n=24, weights=(0.5, 2.0))
    returned = _harness.run_study(squares, config, tmp_path / "run", smoke=True)
    out = tmp_path / "run"
    assert _listing(out) == ["config.json", "report.md", "results.json", "run.json", "squares.png"]
    assert (out / "squares.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    results = json.loads((out / "results.json").read_text())
    assert results == {
        "config": {"n": 24, "label": "squares", "weights": [0.5, 2.0]},
        "sum_of_squares": 4900,
        "closed_form": 4900,
        "weights": [0.5, 2.0],
    }
    assert (out / "report.md").read_text() == (
        "**Verdict.** Yes. 4900 vs 4900.\n\n# Squares\n\nThe sum of squares 1..24 is 4900."
        "\n\n## Figures\n\n![squares](squares.png)\n"
    )
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["study"] == "squares"
    assert recorded["smoke"] is True
    assert recorded["config"] == {"n": 24, "label": "squares", "weights": [0.5, 2.0]}
    assert recorded["environment"]["packages"]["numpy"] == np.__version__
    assert returned.sum_of_squares == 4900 and isinstance(returned, squares.Results)


def test_run_study_rejects_bad_results_without_writing_them(tmp_path, fake_registry):
    squares, _ = fake_registry
    squares.compute = lambda config: {"value": 1}
    with pytest.raises(_harness.StudyError, match="compute\\(\\) must return a Results, got dict"):
        _harness.run_study(squares, squares.Config(), tmp_path)
    assert _listing(tmp_path) == ["config.json", "run.json"]
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["state"] == "failed" and "compute() must return a Results" in record["error"]

    squares.compute = lambda config: squares.Results(config, 1, object(), np.zeros(1))
    with pytest.raises(TypeError, match=r"results\.json\.closed_form"):
        _harness.run_study(squares, squares.Config(), tmp_path)  # the same run, again in place
    assert _listing(tmp_path) == ["config.json", "run.json"]
    assert len(json.loads((tmp_path / "run.json").read_text())["attempts"]) == 1

    squares.compute = lambda config: squares.Results(config, 1, 1, np.zeros(1))
    squares.verdict = lambda results: "Looks fine"
    with pytest.raises(_harness.StudyError, match="first word is one of Yes, No, Partly"):
        _harness.run_study(squares, squares.Config(), tmp_path)
    assert "report.md" not in _listing(tmp_path)

    with pytest.raises(_harness.StudyError, match="Config"):
        _harness.run_study(squares, _AllTypes(), tmp_path)


def test_check_study_needs_every_protocol_function(fake_registry):
    squares, _ = fake_registry
    for name in ("Results", "compute", "figures", "report", "verdict"):
        module = types.ModuleType("_partial", "A question?")
        for attr in (
            "NAME",
            "SUMMARY",
            "Config",
            "smoke_config",
            "Results",
            "compute",
            "figures",
            "report",
            "verdict",
        ):
            if attr != name:
                setattr(module, attr, getattr(squares, attr))
        with pytest.raises(_harness.StudyError, match=f"has no {name}"):
            _harness.check_study(module)


# --------------------------------------------------------------------------------------------
# config checks
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Checked:
    dt: float = 0.1
    t_max: float = 3.0
    betas: tuple[float, ...] = (0.5, 1.0)
    fraction: float = 0.5

    def __post_init__(self):
        check_positive(self, "dt", "betas")
        check_multiple(self, "t_max", of="dt")
        check_range(self, "fraction", 0.0, 1.0, low_open=True)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dt": 0.0}, "_Checked: dt=0.0 is not allowed; every value must be finite and > 0."),
        ({"dt": math.inf}, "_Checked: dt=inf is not allowed; every value must be finite and > 0."),
        (
            {"betas": (1.0, -3.0)},
            "_Checked: betas=(1.0, -3.0) is not allowed; every value must be finite and > 0.",
        ),
        (
            {"t_max": 10.05},
            "_Checked: t_max=10.05 is not allowed; every value must be a positive "
            "whole multiple of dt=0.1.",
        ),
        ({"fraction": 0.0}, "_Checked: fraction=0.0 is not allowed; allowed range (0, 1]."),
        ({"fraction": math.nan}, "_Checked: fraction=nan is not allowed; allowed range (0, 1]."),
    ],
)
def test_config_checks_name_field_value_and_range(changes, message):
    with pytest.raises(ConfigError) as info:
        _Checked(**changes)
    assert str(info.value) == message
    assert _Checked(t_max=30.0).t_max == 30.0  # 300 steps of 0.1: on the grid despite rounding


# --------------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------------


def test_cli_run_with_overrides(tmp_path, fake_registry, capsys):
    out = tmp_path / "r"
    code = cli.main(["run", "squares", "--smoke", "--n=12", "--out", str(out), "--label", "hi"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["sum_of_squares"] == _sum_of_squares(12) == 650
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["smoke"] is True
    assert recorded["config"] == {"n": 12, "label": "hi", "weights": [1.0]}
    import jax

    # The command changes no global JAX setting (the tests run with x64 on, from conftest.py).
    assert recorded["environment"]["jax_enable_x64"] is bool(jax.config.jax_enable_x64) is True
    printed = capsys.readouterr().out
    assert str(out / "results.json") in printed and str(out / "report.md") in printed


def test_cli_run_smoke_defaults_and_negative_values(tmp_path, fake_registry):
    out = tmp_path / "r"
    assert cli.main(["run", "--weights", "-1.5,2", "squares", "--smoke", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["n"] == 10 and results["sum_of_squares"] == 385
    assert results["weights"] == [-1.5, 2.0]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--n", "1.5"], "field 'n': cannot read '1.5' as int"),
        (
            ["--m", "3"],
            "unknown field 'm' (given value '3') of study 'squares'; "
            "valid fields: n, label, weights.",
        ),
        (["--n"], "field 'n' of study 'squares' has no value"),
        (["--n", "-5"], "squares: n=-5 is not allowed; every value must be finite and > 0."),
    ],
)
def test_cli_run_usage_errors(tmp_path, fake_registry, capsys, args, expected):
    out = tmp_path / "never"
    assert cli.main(["run", "squares", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert not out.exists()  # nothing computed, nothing written


def test_cli_run_unknown_study(fake_registry, capsys):
    assert cli.main(["run", "nope"]) == 2
    assert "unknown study 'nope'; valid studies: squares, broken." in capsys.readouterr().err


def test_cli_names_the_closest_study_and_field_in_one_line(fake_registry, capsys):
    """A misspelt study or field is answered with the closest valid name and the valid list,
    on one line of stderr, exit code 2, no traceback."""
    assert cli.main(["run", "squres"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "workbench run: error: unknown study 'squres' (did you mean 'squares'?); "
        "valid studies: squares, broken."
    ]
    assert cli.main(["run", "squares", "--weight", "1,2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "unknown field 'weight' (given value '1,2') of study 'squares' "
        "(did you mean 'weights'?); valid fields: n, label, weights."
        in err[0]
    )


def test_every_study_field_has_a_meaning_in_its_help(capsys):
    """`workbench run <study> --help` gives every Config field its type, default and meaning
    (the field's docstring)."""
    import dataclasses

    import studies
    from studies._run.overrides import field_docs

    missing = [
        f"{name}.{f.name}"
        for name in studies.STUDIES
        for f in dataclasses.fields(studies.get_study(name).Config)
        if f.name not in field_docs(studies.get_study(name).Config)
    ]
    assert not missing, f"Config fields without a docstring: {missing}"
    assert cli.main(["run", "train-digits", "--help"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"--epochs int\s+default: 60, smoke: 10\n\s+\S", printed)


def test_cli_run_study_help(fake_registry, capsys):
    assert cli.main(["run", "squares", "--help"]) == 0
    printed = capsys.readouterr().out
    assert "Does summing k^2 for k = 1..n give n(n+1)(2n+1)/6?" in printed
    assert re.search(r"--n int\s+default: 1000, smoke: 10", printed)


def test_cli_list(fake_registry, capsys):
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "squares  Sum of squares against its closed form.",
        "broken   Always raises.",
    ]


def test_cli_bad_command(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "workbench: error: unknown command 'frobnicate'; valid commands: list, run, tour "
        "(see `workbench --help`)."
    ]
    assert cli.main(["toure"]) == 2
    assert "unknown command 'toure' (did you mean 'tour'?)" in capsys.readouterr().err
    assert cli.main([]) == 2


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["tour", "--jobs", "0"], "workbench tour: error: --jobs 0: give a whole number >= 1."),
        (
            ["tour", "--jbos", "2"],
            "workbench tour: error: unrecognized arguments: --jbos 2 (see `workbench tour --help`)",
        ),
        (["list", "extra"], "workbench list: error: unrecognized arguments: extra"),
    ],
)
def test_cli_usage_errors_are_one_line(capsys, argv, expected):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(expected), err


def test_tour_records_success_and_failure(tmp_path, fake_registry, capsys):
    out = tmp_path / "tour"
    code = cli.main(["tour", "--out", str(out), "--jobs", "1"])
    assert code == 1
    report = (out / "report.md").read_text()
    # The good study: its report, nested under its heading, and its exact number on disk.
    assert "## squares" in report and "### Squares" in report
    assert (
        "The sum of squares 1..10 is 385." in report and "**Verdict.** Yes. 385 vs 385." in report
    )
    assert json.loads((out / "squares" / "results.json").read_text())["sum_of_squares"] == 385
    # The failing one: marked, with its traceback, and it did not stop the tour.
    assert "## broken" in report and "**FAILED**" in report
    assert "RuntimeError: boom 42" in report and "Traceback (most recent call last)" in report
    assert "boom 42" in (out / "broken" / "traceback.txt").read_text()
    assert report.index("## squares") < report.index("## broken")
    # The summary table: verdict answer, its numbers, time; failures with their error.
    assert re.search(r"\| \[squares\]\(#squares\) +\| Yes +\| 385 vs 385\. +\| +\d+\.\d \|", report)
    assert re.search(
        r"\| \[broken\]\(#broken\) +\| \*\*FAILED\*\* +\| RuntimeError: boom 42 +\|", report
    )
    assert re.search(r"tour wall time \*\*\d+ s\*\*", report)
    # The figure is embedded next to its report, in the study's folder and in the tour report.
    assert "![squares](squares.png)" in (out / "squares" / "report.md").read_text()
    assert "![squares](squares/squares.png)" in report
    # report.html: the same content, self-contained (the PNG inlined, nothing loaded from elsewhere).
    page = (out / "report.html").read_text()
    assert "<table>" in page and "385 vs 385." in page and "RuntimeError: boom 42" in page
    png = base64.b64encode((out / "squares" / "squares.png").read_bytes()).decode()
    assert f'src="data:image/png;base64,{png}"' in page
    assert "http://" not in page and "https://" not in page
    summary = json.loads((out / "tour.json").read_text())
    assert summary["wall_time_s"] > 0
    assert summary["mode"] == "smoke"
    assert summary["studies"]["squares"]["ok"] is True
    assert summary["studies"]["squares"]["verdict"] == "Yes. 385 vs 385."
    assert summary["studies"]["broken"] == {
        "ok": False,
        "verdict": None,
        "wall_time_s": summary["studies"]["broken"]["wall_time_s"],
        "kept": False,
        "error": "RuntimeError: boom 42",
    }
    assert "failed: broken" in capsys.readouterr().err


_ON_DISK_STUDY = """\"\"\"Is the sum of 1..n equal to n(n+1)/2?\"\"\"
import dataclasses

NAME = "{name}"
SUMMARY = "Triangular numbers."


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = {n}


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    total: int


def smoke_config():
    return Config()


def compute(config):
    return Results(config, sum(range(1, config.n + 1)))


def figures(results):
    return {{}}


def report(results):
    return f"sum = {{results.total}}"


def verdict(results):
    ok = results.total == results.config.n * (results.config.n + 1) // 2
    return ("Yes" if ok else "No") + f". {{results.total}}"
"""


def test_tour_in_parallel_processes_equals_the_serial_tour(tmp_path, monkeypatch):
    # jobs > 1 spawns fresh interpreters: the study modules must be importable from disk.
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = {}
    for k, n in enumerate((10, 20, 30)):
        module = f"_wb_tour_study_{k}"
        (tmp_path / f"{module}.py").write_text(_ON_DISK_STUDY.format(name=f"tri-{k}", n=n))
        registry[f"tri-{k}"] = module
    stream = io.StringIO()
    first = {"tri-2": 5.0, "tri-0": 1.0}  # start order tri-2, tri-0, tri-1; the report keeps names'
    assert (
        _tour.run_tour(
            tmp_path / "par", registry=registry, stream=stream, jobs=2, expected_seconds=first
        )
        == 0
    )
    assert _tour.run_tour(tmp_path / "ser", registry=registry, stream=io.StringIO()) == 0
    for k, n in enumerate((10, 20, 30)):
        par = json.loads((tmp_path / "par" / f"tri-{k}" / "results.json").read_text())
        ser = json.loads((tmp_path / "ser" / f"tri-{k}" / "results.json").read_text())
        assert par == ser == {"config": {"n": n}, "total": n * (n + 1) // 2}
    summary = json.loads((tmp_path / "par" / "tour.json").read_text())
    assert list(summary["studies"]) == ["tri-0", "tri-1", "tri-2"]  # registry order
    assert summary["studies"]["tri-2"]["verdict"] == "Yes. 465"
    assert "3 studies (smoke), 2 at a time" in stream.getvalue()
    with pytest.raises(ValueError, match="jobs=0 must be an integer >= 1"):
        _tour.run_tour(tmp_path / "x", registry=registry, jobs=0)


def test_a_parallel_tour_leaves_jax_to_its_workers(tmp_path):
    """With `jobs > 1` the tour's own process imports neither JAX nor `workbench` (the workers
    do, and a worker names the default folder and writes the report); the tour is the same."""
    (tmp_path / "_wb_light_study.py").write_text(_ON_DISK_STUDY.format(name="tri", n=12))
    code = (
        "import sys\n"
        "from studies._run import tour as _tour\n"
        "if __name__ == '__main__':\n"
        "    code = _tour.run_tour(None, root='runs', registry={'tri': '_wb_light_study'}, jobs=2)\n"
        "    print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'workbench')))\n"
        "    sys.exit(code)\n"
    )
    repo = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("tour-")
    summary = json.loads((folder / "tour.json").read_text())
    assert summary["studies"]["tri"]["verdict"] == "Yes. 78"
    assert summary["environment"]["jax_devices"]  # described by a worker's JAX
    assert json.loads((folder / "tri" / "results.json").read_text())["total"] == 78


_THREADS_STUDY = """\"\"\"What does a tour's worker compute with?\"\"\"
import dataclasses
import os

NAME = "threads"
SUMMARY = "A worker's compute threads."


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 96


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    xla_threads: int
    masks: list
    environment: dict
    gc_threshold: int


def smoke_config():
    return Config()


def compute(config):
    import gc

    import jax.numpy as jnp

    (jnp.ones((config.n, config.n)) @ jnp.ones((config.n, config.n))).block_until_ready()
    tasks = os.listdir("/proc/self/task")
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks]
    masks = sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in tasks})
    variables = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return Results(config, sum("XLAEigen" in name for name in names), [list(m) for m in masks],
                   {v: os.environ.get(v) for v in variables}, gc.get_threshold()[0])


def figures(results):
    return {}


def report(results):
    return f"{results.xla_threads} compute threads"


def verdict(results):
    return "Yes"
"""


def _xla_compute_threads(code: str, env=None) -> int:
    """The threads named `*XLAEigen*` (XLA's CPU compute pool) in a fresh interpreter after
    `code` has run a matrix product."""
    script = (
        "import os\n" + code + "\nimport jax.numpy as jnp\n"
        "(jnp.ones((96, 96)) @ jnp.ones((96, 96))).block_until_ready()\n"
        "print(sum('XLAEigen' in open(f'/proc/self/task/{t}/comm').read()\n"
        "          for t in os.listdir('/proc/self/task')))\n"
    )
    repo = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1])


@pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or not hasattr(os, "sched_getaffinity"),
    reason="needs Linux: thread names in /proc and affinity masks",
)
def test_tour_workers_share_the_cores(tmp_path, monkeypatch):
    """Each of a tour's workers computes on its share of the cores: JAX's CPU backend with
    `cores // jobs` compute threads (at least one), which may still run on any core, and
    OpenMP / OpenBLAS / MKL told the same number unless the user set it; the tour's own
    process is left as it was, and a process started by itself keeps one thread per core.
    A worker collects garbage after 10 000 new objects, not Python's 700."""
    cores = sorted(os.sched_getaffinity(0))
    alone = _xla_compute_threads("")
    if alone == 0:
        pytest.skip("this jaxlib names its CPU compute threads otherwise (no '*XLAEigen*')")
    assert alone == len(cores)
    from studies._run.workers import threads_per_worker

    assert threads_per_worker(1) == len(cores)
    assert threads_per_worker(2) == max(1, len(cores) // 2)
    assert threads_per_worker(10 * len(cores)) == 1
    assert (
        _xla_compute_threads(
            "from studies._run.workers import start_cpu_backend\nstart_cpu_backend(1, 3)"
        )
        == 1
    )

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "_wb_threads_study.py").write_text(_THREADS_STUDY)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")  # the user's own choice stands
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    registry = {"threads": "_wb_threads_study"}
    assert _tour.run_tour(tmp_path / "t", registry=registry, stream=io.StringIO(), jobs=2) == 0
    share = max(1, len(cores) // 2)
    results = json.loads((tmp_path / "t" / "threads" / "results.json").read_text())
    assert results["xla_threads"] == share
    assert results["masks"] == [cores]  # every thread may run anywhere
    assert results["environment"] == {
        "OMP_NUM_THREADS": str(share),
        "OPENBLAS_NUM_THREADS": "3",
        "MKL_NUM_THREADS": str(share),
    }
    assert results["gc_threshold"] == 10_000
    assert "OMP_NUM_THREADS" not in os.environ and "MKL_NUM_THREADS" not in os.environ
    assert os.environ["OPENBLAS_NUM_THREADS"] == "3"


def test_a_worker_whose_affinity_cannot_be_set_starts_jax_as_usual(monkeypatch):
    """`start_cpu_backend` where the system refuses the affinity mask: no error, nothing
    changed, JAX not started by it (the worker's first computation starts it as usual)."""
    from studies._run import workers as _workers

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs os.sched_setaffinity (Linux)")
    calls = []

    def refuse(pid, cores):
        calls.append((pid, list(cores)))
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    started = []
    monkeypatch.setattr("jax.devices", lambda *a, **k: started.append(a))
    assert _workers.start_cpu_backend(1, 1) is None
    cores = sorted(os.sched_getaffinity(0))
    assert calls == [(0, [cores[1 % len(cores)]])]  # slot 1's core, asked for once
    assert started == []


def test_tour_runs_the_tour_names_unless_all(tmp_path, fake_registry, monkeypatch):
    monkeypatch.setattr(studies, "TOUR", ("squares",))
    assert cli.main(["tour", "--out", str(tmp_path / "t"), "--jobs", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir() if p.is_dir()) == ["squares"]
    report = (tmp_path / "t" / "report.md").read_text()
    assert "1 of the 2 registered studies (`workbench tour --all` runs every one)" in report
    assert cli.main(["tour", "--all", "--out", str(tmp_path / "a"), "--jobs", "1"]) == 1
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_dir()) == [
        "broken",
        "squares",
    ]
    assert "every registered study (2)" in (tmp_path / "a" / "report.md").read_text()
    with pytest.raises(ValueError, match=r"names=\['sqares'\] are not registered.*squares"):
        _tour.run_tour(tmp_path / "x", names=["sqares"])
    assert not (tmp_path / "x" / "sqares").exists()


def test_a_tour_worker_frees_the_programs_of_each_study(tmp_path, fake_registry, monkeypatch):
    """A tour's worker process (jobs > 1) runs study after study; it frees what each compiled
    when the study ends (every program holds memory maps, a finite resource). The tour's own
    process (jobs = 1, or `run_tour` from a notebook) keeps them."""
    import threading

    import jax
    import jax.numpy as jnp

    squares, _ = fake_registry
    traces = []

    @jax.jit
    def program(x):
        traces.append(x.shape)  # runs when JAX traces (compiles) it, not when it reads it back
        return jnp.sum(x * x)

    compute = squares.compute

    def compiling(config):  # the squares study, its sum also computed by a compiled program
        results = compute(config)
        assert int(program(jnp.arange(config.n + 1))) == results.closed_form
        return results

    monkeypatch.setattr(squares, "compute", compiling)
    run = lambda out: _tour._tour_one("squares", studies.STUDIES, out, full=False, overwrite=False)
    kept = run(tmp_path / "kept")
    assert kept.ok and kept.verdict.startswith("Yes")
    again = run(tmp_path / "again")  # the tour's own process: the program is still there
    assert again.ok and len(traces) == 1
    monkeypatch.setattr(_tour, "_TOUR_STOP", threading.Event())  # as in a worker
    freed = run(tmp_path / "freed")  # still the same program: traced before, freed after
    assert freed.ok and freed.verdict.startswith("Yes") and len(traces) == 1
    later = run(tmp_path / "later")  # the worker's next study compiles it anew
    assert later.ok and len(traces) == 2


def test_the_real_tour_names_registered_studies():
    assert studies.TOUR and set(studies.TOUR) <= set(studies.STUDIES)
    assert len(set(studies.TOUR)) == len(studies.TOUR)
    # The tour's scheduling hints name registered studies and cover the tour (positive seconds).
    assert set(studies.TOUR) <= set(studies.SMOKE_SECONDS) <= set(studies.STUDIES)
    assert all(s > 0 for s in studies.SMOKE_SECONDS.values())


def test_tour_all_ok_returns_zero_and_full_uses_default_config(tmp_path, fake_registry):
    out = tmp_path / "tour"
    code = _tour.run_tour(
        out, full=True, registry={"squares": SQUARES_MODULE}, stream=io.StringIO()
    )
    assert code == 0
    assert json.loads((out / "squares" / "results.json").read_text())["sum_of_squares"] == (
        _sum_of_squares(1000)
    )
    assert json.loads((out / "squares" / "config.json").read_text())["smoke"] is False


# --------------------------------------------------------------------------------------------
# report helpers
# --------------------------------------------------------------------------------------------


def test_markdown_table_exact_text():
    table = markdown_table(
        ["h", "error", "scheme"],
        [(0.1, np.float64(1.23456e-4), "lie"), (0.05, None, "a|b"), (np.int64(3), 2.0, True)],
    )
    assert table == (
        "| h    | error    | scheme |\n"
        "| ---: | -------: | ------ |\n"
        "|  0.1 | 0.000123 | lie    |\n"
        "| 0.05 |          | a\\|b   |\n"
        "|    3 |        2 | True   |"
    )
    assert markdown_table(["x"], [(1 / 3,)], floatfmt=".2e").splitlines()[2] == "| 3.33e-01 |"


def test_markdown_table_errors():
    with pytest.raises(ValueError, match=r"row 1 has 1 cells but there are 2 headers"):
        markdown_table(["a", "b"], [(1, 2), (3,)])
    with pytest.raises(ValueError, match=r"floatfmt='%d'"):
        markdown_table(["a"], [(1.0,)], floatfmt="%d")


def test_demote_headings_and_code_block():
    md = "# Title\ntext\n```\n# not a heading\n```\n## Sub"
    assert demote_headings(md, 2) == "### Title\ntext\n```\n# not a heading\n```\n#### Sub"
    assert code_block("a ``` b") == "````\na ``` b\n````"


def test_save_figure_atomic_png(tmp_path):
    pytest.importorskip("matplotlib")
    fig, ax = new_figure(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    path = save_figure(fig, tmp_path / "line.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _listing(tmp_path) == ["line.png"]

    before = path.read_bytes()
    fig, ax = new_figure()
    with pytest.raises(ValueError, match=r"suffix '\.nope'.*valid suffixes:.*\.png"):
        save_figure(fig, tmp_path / "line.nope")
    assert path.read_bytes() == before and _listing(tmp_path) == ["line.png"]


def test_the_command_turns_on_the_compilation_cache_where_it_is_not_set():
    expect = os.path.join(os.path.expanduser("~"), ".cache", "workbench", "jax")
    env = cli.compilation_cache_environment({})
    assert env["JAX_COMPILATION_CACHE_DIR"] == expect
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    assert env["JAX_COMPILATION_CACHE_MAX_SIZE"] == str(2 * 1024**3)
    xdg = cli.compilation_cache_environment({"XDG_CACHE_HOME": "/x"})
    assert xdg["JAX_COMPILATION_CACHE_DIR"] == os.path.join("/x", "workbench", "jax")
    mine = cli.compilation_cache_environment(
        {"WORKBENCH_JAX_CACHE": "/c", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}
    )
    assert mine == {
        "JAX_COMPILATION_CACHE_DIR": "/c",
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(2 * 1024**3),
    }
    assert cli.compilation_cache_environment({"WORKBENCH_JAX_CACHE": "0"}) == {}
    assert cli.compilation_cache_environment({"JAX_COMPILATION_CACHE_DIR": "/j"}) == {}


@pytest.mark.slow
def test_a_second_run_reads_every_program_back_from_the_cache_with_the_same_numbers(tmp_path):
    """Two `workbench run cluster-histograms --smoke` into two folders with one cache: the first
    writes its programs there; the second reads every one of them back (their access times
    change) and compiles nothing afresh (no new entry), and its results are the first's, number
    for number."""
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env.update(WORKBENCH_JAX_CACHE=str(cache), WORKBENCH_PROGRESS="0")
    repo = pathlib.Path(__file__).resolve().parents[2]

    def run(out):
        cmd = [sys.executable, "-m", "studies", "run", "cluster-histograms", "--smoke"]
        cmd += ["--out", out]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        return json.loads((tmp_path / out / "results.json").read_text())

    def read_times():  # when each entry was last read or written (JAX's size limit keeps it)
        return {p.name: p.read_bytes() for p in cache.glob("*-atime")}

    first = run(str(tmp_path / "a"))
    entries, times = set(os.listdir(cache)), read_times()
    assert len(times) >= 5
    second = run(str(tmp_path / "b"))
    assert set(os.listdir(cache)) == entries  # nothing compiled afresh
    assert all(t != times[name] for name, t in read_times().items())  # every one read again
    assert first == second
