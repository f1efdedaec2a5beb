"""Runnable studies: one module per question, run with `workbench run <name>`.

The package
-----------
- this module: the registry (`STUDIES`, `TOUR`, `get_study`) and `ConfigError`;
- the studies, by theme: `particles` (the particle model of self-attention, paper B),
  `numerics` (orders, splitting error, stability, resolution, the discretization plan),
  `training` (training as optimal control, gradient methods, costs, depth refinement) and
  `models` (published, pretrained and trained Transformers as discretizations);
- `_toolkit`: what the studies share (config checks and fields, memory estimates, tables and
  figures, trained weights, the training studies' recipe, identity, certificate and outcome);
- `_run`: the `workbench` command (`_run.cli`), the harness, run folders and the tour. No study
  imports it.

The study protocol
------------------
A study is a plain module in this package. Its computation is separate from its presentation,
so a notebook, a test or the training loop can call `compute` and get numbers without files:

- a **module docstring** whose first paragraph states the question the study answers;
- `NAME: str` — the command-line name, lowercase words joined by `-` (e.g. `"exact-recovery"`);
  it must equal the study's key in `STUDIES`;
- `SUMMARY: str` — one line, shown by `workbench list`;
- `Config` — a frozen dataclass whose typed fields have defaults giving the full-size study, and
  whose `__post_init__` validates every field's range and the relations between fields with the
  checks of `studies._toolkit.config` (a `ConfigError`, one line naming the field, the value
  and what is allowed). Field types the command line can set: `int`, `float`, `bool`, `str`,
  `tuple[int, ...]`, `tuple[float, ...]`, `tuple[str, ...]`, `typing.Literal[...]` of strings or
  ints, and `X | None` of those;
- `smoke_config() -> Config` — the same study sized to run in seconds on a CPU, used by
  `--smoke`, by `workbench tour` and by the tests;
- `Results` — a dataclass of numbers (floats, ints, strings that label rows, numpy arrays,
  lists/dicts/dataclasses of those) whose first field is `config: Config`;
- `compute(config) -> Results` — the computation: no files, no plots, no prose. It chooses its
  own precision in a scoped context (`with jax.enable_x64(True):`) and never changes global JAX
  configuration. A long computation that must survive a kill (training) takes a keyword
  `run_dir=None`: the harness passes the run folder, where it keeps checkpoints and metrics and
  from which a rerun resumes; without one it runs in memory;
- `figures(results) -> dict[str, Figure]` — matplotlib figures by name (saved as `<name>.png`);
- `report(results) -> str` — markdown (no top-level title) describing the numbers;
- `verdict(results) -> str` — the answer to the question, computed from the numbers: its first
  word is `Yes`, `No` or `Partly`, and it says `No` when the numbers do. Every study has a test
  that builds failing `Results` and checks that the verdict flips.

Optional: `Config.estimated_peak_bytes() -> int` (the harness refuses, before any folder is
made, a config that cannot fit in the memory available) and `run_identity(config) -> dict` (the
fields that make two runs the same run; default: every field but `devices` and `shard_params`).

The harness (`studies._run.harness.run_study`) locks the run folder, refuses another study or config
there, records the run's state in `run.json`, writes `config.json` (the config, whether it is a
smoke run, and the environment) before calling `compute`, then `results.json`, the figures and
`report.md` (the verdict, then the report), all atomically. In a notebook::

    import studies.particles.repulsion as s
    r = s.compute(s.smoke_config())
    s.figures(r)["gaps"]          # a matplotlib Figure
    print(s.verdict(r))

Registering a study
-------------------
Put the module in its theme's folder and add `NAME: "studies.<theme>.<module>"` to `STUDIES`.
Modules are imported only when a study is asked for (`get_study`), so importing this package
stays cheap and a broken study does not break the others. A run folder records the study's
name, not its module path (and a training study's identity names the module without its theme,
`studies._toolkit.training.study_id`), so a study can move to another theme and keep its run
folders.
"""

from __future__ import annotations

import importlib
import json
import pathlib
from types import ModuleType

from ._toolkit.config import ConfigError as ConfigError

__all__ = ["SMOKE_SECONDS", "STUDIES", "TOUR", "ConfigError", "get_study"]

STUDIES: dict[str, str] = {
    "exact-recovery": "studies.models.exact_recovery",
    "cluster-histograms": "studies.particles.cluster_histograms",
    "metastability": "studies.particles.metastability",
    "high-dimension": "studies.particles.high_dimension",
    "repulsion": "studies.particles.repulsion",
    "phase-diagram": "studies.particles.phase_diagram",
    "step-convergence": "studies.particles.step_convergence",
    "convergence-order": "studies.numerics.convergence_order",
    "penalty-form": "studies.numerics.penalty",
    "splitting-error": "studies.numerics.splitting_error",
    "plan": "studies.numerics.plan",
    "resolution": "studies.numerics.resolution",
    "stability": "studies.numerics.stability",
    "train-digits": "studies.training.train_digits",
    "train-sequence": "studies.training.train_sequence",
    "adjoint-accuracy": "studies.training.adjoint_accuracy",
    "msa-vs-gradient": "studies.training.msa_vs_gradient",
    "depth-refinement": "studies.training.depth_refinement",
    "regularization-cost": "studies.training.regularization_cost",
    "continuous-depth": "studies.training.continuous_depth",
    "control-bases": "studies.training.control_bases",
    "scheme-architectures": "studies.models.scheme_architectures",
    "trained-model-analysis": "studies.models.trained_model_analysis",
    "real-model-dynamics": "studies.models.real_model_dynamics",
}
"""The registered studies: command-line name -> module path, in the order `workbench list` and
`workbench tour` use."""

TOUR: tuple[str, ...] = (
    "exact-recovery",
    "cluster-histograms",
    "metastability",
    "phase-diagram",
    "convergence-order",
    "splitting-error",
    "plan",
    "train-digits",
    "real-model-dynamics",
)
"""The studies `workbench tour` runs by default, at smoke size: the headline result of each theme
(exact recovery, the particle model's clustering and phase diagrams, convergence and splitting
error, the step-size plan, training as control, a real pretrained model); its cost on 2 CPU
cores is in `benchmarks/README.md` (`tour_cost.py`). `workbench tour --all` runs every
registered study."""


def _smoke_seconds() -> dict[str, float]:
    path = pathlib.Path(__file__).parent / "_run" / "smoke_seconds.json"
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text("utf-8")).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


SMOKE_SECONDS: dict[str, float] = _smoke_seconds()
"""Each study's wall time at smoke size in a tour (seconds), read from `_run/smoke_seconds.json`
(`benchmarks/tour_cost.py --all --smoke-seconds` writes it; empty when the file is missing).
Used only to start the slowest studies first when the tour runs several at once
(longest-processing-time order: the cores stay busy to the end); a study missing here starts
last. The report keeps the tour's order."""


def get_study(name: str) -> ModuleType:
    """Import and return the study module registered as `name`.

    **Arguments:**

    - `name`: a key of `STUDIES`, e.g. `"exact-recovery"`.

    **Returns:** the module (not yet checked against the protocol; see
    `studies._run.harness.check_study`).

    **Raises:** `ValueError` listing the valid names if `name` is not registered. Errors raised
    while importing the module propagate unchanged.
    """
    try:
        module_path = STUDIES[name]
    except (KeyError, TypeError):
        from ._run.overrides import did_you_mean

        valid = ", ".join(STUDIES) if STUDIES else "(none registered)"
        hint = did_you_mean(str(name), STUDIES)
        raise ValueError(f"unknown study {name!r}{hint}; valid studies: {valid}.") from None
    return importlib.import_module(module_path)
