"""Runnable studies: one module per question, run with `workbench run <name>`.

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
  checks of `studies._config` (a `ConfigError`, one line naming the field, the value and what
  is allowed). Field types the command line can set: `int`, `float`, `bool`, `str`,
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

The harness (`studies._harness.run_study`) locks the run folder, refuses another study or config
there, records the run's state in `run.json`, writes `config.json` (the config, whether it is a
smoke run, and the environment) before calling `compute`, then `results.json`, the figures and
`report.md` (the verdict, then the report), all atomically. In a notebook::

    import studies.repulsion as s
    r = s.compute(s.smoke_config())
    s.figures(r)["gaps"]          # a matplotlib Figure
    print(s.verdict(r))

Registering a study
-------------------
Add `NAME: "studies.<module>"` to `STUDIES`. Modules are imported only when a study is asked
for (`get_study`), so importing this package stays cheap and a broken study does not break the
others.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ._config import ConfigError as ConfigError

__all__ = ["SMOKE_SECONDS", "STUDIES", "TOUR", "ConfigError", "get_study"]

STUDIES: dict[str, str] = {
    "exact-recovery": "studies.exact_recovery",
    "cluster-histograms": "studies.cluster_histograms",
    "metastability": "studies.metastability",
    "high-dimension": "studies.high_dimension",
    "repulsion": "studies.repulsion",
    "phase-diagram": "studies.phase_diagram",
    "step-convergence": "studies.step_convergence",
    "convergence-order": "studies.convergence_order",
    "penalty-form": "studies.penalty",
    "splitting-error": "studies.splitting_error",
    "plan": "studies.plan",
    "resolution": "studies.resolution",
    "stability": "studies.stability",
    "train-digits": "studies.train_digits",
    "train-sequence": "studies.train_sequence",
    "adjoint-accuracy": "studies.adjoint_accuracy",
    "msa-vs-gradient": "studies.msa_vs_gradient",
    "depth-refinement": "studies.depth_refinement",
    "regularization-cost": "studies.regularization_cost",
    "continuous-depth": "studies.continuous_depth",
    "scheme-architectures": "studies.scheme_architectures",
    "trained-model-analysis": "studies.trained_model_analysis",
    "real-model-dynamics": "studies.real_model_dynamics",
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
error, the step-size plan, training as control, a real pretrained model), in 63–79 s on 2 CPU
cores with an empty compilation cache and 48–52 s with a filled one (2026-12-07, README).
`workbench tour --all` runs every registered study."""

SMOKE_SECONDS: dict[str, float] = {
    "continuous-depth": 100.0,
    "trained-model-analysis": 120.0,
    "scheme-architectures": 96.0,
    "adjoint-accuracy": 90.0,
    "depth-refinement": 86.0,
    "train-digits": 47.0,
    "splitting-error": 11.0,
    "msa-vs-gradient": 38.0,
    "real-model-dynamics": 14.0,
    "exact-recovery": 20.0,
    "regularization-cost": 33.0,
    "convergence-order": 21.0,
    "train-sequence": 21.0,
    "step-convergence": 18.0,
    "penalty-form": 15.0,
    "stability": 14.0,
    "resolution": 13.0,
    "cluster-histograms": 6.0,
    "phase-diagram": 7.0,
    "repulsion": 8.0,
    "high-dimension": 8.0,
    "plan": 7.0,
    "metastability": 4.0,
}
"""Measured smoke-size wall times (seconds, one 2-core CPU, 2 studies at a time), used only to
start the slowest studies first when the tour runs several at once (longest-processing-time
order: the cores stay busy to the end); a study missing here starts last. The report keeps
the tour's order."""


def get_study(name: str) -> ModuleType:
    """Import and return the study module registered as `name`.

    **Arguments:**

    - `name`: a key of `STUDIES`, e.g. `"exact-recovery"`.

    **Returns:** the module (not yet checked against the protocol; see
    `studies._harness.check_study`).

    **Raises:** `ValueError` listing the valid names if `name` is not registered. Errors raised
    while importing the module propagate unchanged.
    """
    try:
        module_path = STUDIES[name]
    except (KeyError, TypeError):
        from ._overrides import did_you_mean

        valid = ", ".join(STUDIES) if STUDIES else "(none registered)"
        hint = did_you_mean(str(name), STUDIES)
        raise ValueError(f"unknown study {name!r}{hint}; valid studies: {valid}.") from None
    return importlib.import_module(module_path)
