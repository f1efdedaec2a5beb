"""The exact-recovery study: errors within tolerance against PyTorch/HF and NumPy, and a verdict
that says "No" on failing numbers and never "Yes" without the reference."""

import dataclasses

import pytest

from studies._run.cli import main as cli
from studies._toolkit.config import ConfigError
from studies.models import exact_recovery


@pytest.fixture(scope="module")
def results():
    config = dataclasses.replace(
        exact_recovery.smoke_config(), architectures=("encoder-post-relu", "gpt2")
    )
    return exact_recovery.compute(config)


def test_errors_within_tolerance(results):
    assert results.reference_installed  # the reference extra is part of the test install
    assert len(results.cases) == 4
    for r in results.cases:
        limit = 1e-4 if r.dtype == "float32" else 1e-10
        assert r.error_vs_direct <= limit and r.error_vs_reference <= limit


def test_verdict_flips(results):
    assert exact_recovery.verdict(results).startswith("Yes. All 4 cases")
    bad = dataclasses.replace(results.cases[1], error_vs_reference=3e-6)  # float64 case
    assert bad.dtype == "float64"
    failing = dataclasses.replace(results, cases=(results.cases[0], bad, *results.cases[2:]))
    assert exact_recovery.verdict(failing).startswith("No. 1 of 4 cases exceed")
    no_ref = dataclasses.replace(
        results,
        reference_installed=False,
        cases=tuple(dataclasses.replace(r, error_vs_reference=None) for r in results.cases),
    )
    text = exact_recovery.verdict(no_ref)
    assert text.startswith("Partly. PyTorch/HF reference not run")
    assert "not run" in exact_recovery.report(no_ref)


def test_vision_rows_within_tolerance():
    """The smoke run covers ViT and CvT; their rows agree with Hugging Face and with the direct
    NumPy forward within 1e-10 (float64 only, to keep the test short: each dtype compiles the
    models again; `workbench run exact-recovery --smoke` runs float32 too)."""
    smoke = exact_recovery.smoke_config()
    assert {"vit", "cvt"} <= set(smoke.architectures)
    config = dataclasses.replace(smoke, architectures=("vit", "cvt"), dtypes=("float64",))
    results = exact_recovery.compute(config)
    assert [(r.architecture, r.dtype) for r in results.cases] == [
        ("vit", "float64"),
        ("cvt", "float64"),
    ]
    for r in results.cases:
        assert r.error_vs_reference is not None and r.passed, r
        assert max(r.error_vs_direct, r.error_vs_reference) <= 1e-10
    assert exact_recovery.verdict(results).startswith("Yes. All 2 cases")
    report = exact_recovery.report(results)
    assert "| vit " in report and "| cvt " in report


@pytest.mark.parametrize(
    "changes, match",
    [
        (
            {"dtypes": ("float16",)},
            r"dtypes=\('float16',\) is not allowed; valid choices: "
            r"'float32', 'float64'",
        ),
        ({"architectures": ("swin",)}, r"architectures=\('swin',\) is not allowed"),
        ({"num_layers": 0}, r"num_layers=0"),
        ({"widths": ()}, r"widths=\(\) is not allowed; give at least one value"),
    ],
)
def test_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        dataclasses.replace(exact_recovery.Config(), **changes)


def test_cli_bad_dtype_exits_2_without_a_folder(tmp_path):
    out = tmp_path / "run"
    assert cli(["run", "exact-recovery", "--smoke", "--out", str(out), "--dtypes", "float16"]) == 2
    assert not out.exists()
