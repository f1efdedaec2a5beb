"""Run folders belong to a study's name, not to where its module lives: a study of each theme
(`studies/<theme>/`) runs into a folder and a rerun finds it complete; no file of the folder
names the theme's package; and a training run written by the flat layout (`studies/<module>.py`,
whose identity names the study `studies.<module>`) is the same run, so it resumes from its
checkpoints."""

import dataclasses
import json

import pytest

import studies
from studies._run import harness as _harness, run_folder as _run_folder
from studies._toolkit import training as T

THEMES = {
    "particles": ("metastability", {}),
    "numerics": ("plan", {}),
    "training": (
        "train-sequence",
        {"steps": 20, "checkpoint_every": 10, "warmup": 5, "certificate_examples": 0},
    ),
    "models": ("real-model-dynamics", {}),
}
"""Per theme, a quick study and the changes to its smoke config that keep it quick."""

FLAT_LAYOUT_IDS = {
    "train-digits": "studies.train_digits",
    "train-sequence": "studies.train_sequence",
    "depth-refinement": "studies.depth_refinement",
    "regularization-cost": "studies.regularization_cost",
    "msa-vs-gradient": "studies.msa_vs_gradient",
    "continuous-depth": "studies.continuous_depth",
    "trained-model-analysis": "studies.trained_model_analysis",
    "scheme-architectures": "studies.scheme_architectures",
}
"""The `study` entry of each training study's run identity, as the flat layout wrote it into
`run.json` and into every checkpoint."""


def _files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("theme", THEMES)
def test_a_study_of_each_theme_runs_into_a_folder_and_a_rerun_finds_it_complete(theme, tmp_path):
    name, changes = THEMES[theme]
    module = studies.get_study(name)
    assert module.__name__.startswith(f"studies.{theme}.")
    config = dataclasses.replace(module.smoke_config(), **changes)
    folder = tmp_path / name
    results = _harness.run_study(module, config, folder, smoke=True)
    assert isinstance(results, module.Results)
    record = _run_folder.read_run(folder)
    assert record["state"] == "complete"
    assert record["study"] == name
    assert record["identity"] == _run_folder.run_identity(module, config)
    assert json.loads((folder / "config.json").read_text())["study"] == name
    # The folder records the study's name, never its theme's package: moving a study to
    # another theme leaves its folders its own.
    for path, content in _files(folder).items():
        if path.suffix == ".json":
            assert f"studies.{theme}" not in content.decode(), path
    before = _files(folder)
    assert _harness.run_study(module, config, folder, smoke=True) is None  # already complete
    assert _files(folder) == before


@pytest.mark.parametrize("name", FLAT_LAYOUT_IDS)
def test_a_training_identity_names_the_study_as_the_flat_layout_did(name):
    module = studies.get_study(name)
    identity = _run_folder.run_identity(module, module.smoke_config())
    assert identity["study"] == FLAT_LAYOUT_IDS[name]
    assert T.study_id(module.__name__) == FLAT_LAYOUT_IDS[name]
    assert set(T.ANALYSIS_FIELDS) == set(FLAT_LAYOUT_IDS.values())


@pytest.mark.slow
def test_an_interrupted_run_of_the_flat_layout_resumes_from_its_checkpoints(tmp_path):
    """A finished train-sequence folder rewritten to what the flat layout's code wrote when
    interrupted after its last checkpoint: the identity's and the checkpoints' `study` is
    `studies.train_sequence`, the command `workbench run train-sequence ...`, the state
    `interrupted`. The rerun recognizes the same run, resumes from the last checkpoint without
    a step of training, and ends with the same parameters."""
    name, changes = THEMES["training"]
    module = studies.get_study(name)
    config = dataclasses.replace(module.smoke_config(), **changes)
    folder = tmp_path / name
    first = _harness.run_study(module, config, folder, smoke=True)

    record = _run_folder.read_run(folder)
    identity = {**record["identity"], "study": "studies.train_sequence"}
    record.update(
        state="interrupted",
        identity=identity,
        identity_sha256=_run_folder.fingerprint(identity),
        command=["workbench", "run", name, "--smoke", "--out", str(folder)],
        interrupted_utc=record["ended_utc"],
    )
    record.pop("verdict", None)
    (folder / "run.json").write_text(json.dumps(record, indent=2))
    checkpoints = sorted((folder / "checkpoints").glob("*.json"))
    assert checkpoints
    for path in checkpoints:
        assert '"study": "studies.train_sequence"' in path.read_text(), path

    again = _harness.run_study(module, config, folder, smoke=True)
    resumed = _run_folder.read_run(folder)
    assert resumed["state"] == "complete" and resumed["resumed"] is True
    assert [a["state"] for a in resumed["attempts"]] == ["interrupted"]
    assert again.resumed_from == config.steps
    assert again.final_params_sha256 == first.final_params_sha256
    assert again.test_accuracy == first.test_accuracy
