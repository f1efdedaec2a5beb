"""Runnable studies: one module per question, run with `workbench run <name>`.

The study protocol
------------------
A study is a plain module in this package. It must define:

- a **module docstring** whose first paragraph states the question the study answers;
- `NAME: str` — the command-line name, lowercase words joined by `-` (e.g. `"exact-recovery"`);
  it must equal the study's key in `STUDIES`;
- `SUMMARY: str` — one line, shown by `workbench list`;
- `Config` — a frozen dataclass (`@dataclasses.dataclass(frozen=True)`) whose typed fields have
  defaults giving the full-size study. Field types the command line can set:
  `int`, `float`, `bool`, `str`, `tuple[int, ...]`, `tuple[float, ...]`, `tuple[str, ...]`,
  `typing.Literal[...]` of strings or ints, and `X | None` of those;
- `smoke_config() -> Config` — the same study shrunk to run in seconds on a CPU (smaller sizes,
  fewer steps), used by `--smoke`, by `workbench tour` and by the tests;
- `main(config: Config, out: pathlib.Path) -> dict` — runs the study, writes its plots (PNG)
  into the existing folder `out` (with `workbench._report.save_figure`, after checking
  `have_matplotlib()`), and returns a JSON-able dict of results that contains the key
  `"report"`: a short markdown text (no top-level title needed) answering the question.

`main` chooses its own precision (`workbench run` and `workbench tour` turn on float64 before
running it), must not read the command line, and must not write outside `out`. The harness
(`workbench._harness.run_study`) writes `out/config.json` (the config, whether it is a smoke
run, and the environment) before calling `main`, then pops `"report"` from the returned dict,
and writes it to `out/report.md` and the rest to `out/results.json`, all atomically.

A minimal study::

    \"\"\"Does the sum of squares 1..n equal n(n+1)(2n+1)/6?\"\"\"
    import dataclasses, pathlib

    NAME = "squares"
    SUMMARY = "Sum of squares against its closed form."

    @dataclasses.dataclass(frozen=True)
    class Config:
        n: int = 1000

    def smoke_config() -> Config:
        return Config(n=10)

    def main(config: Config, out: pathlib.Path) -> dict:
        total = sum(k * k for k in range(1, config.n + 1))
        exact = config.n * (config.n + 1) * (2 * config.n + 1) // 6
        return {"total": total, "exact": exact,
                "report": f"Sum of squares to {config.n}: {total} (closed form {exact})."}

Registering a study
-------------------
Add `NAME: "studies.<module>"` to `STUDIES`. Modules are imported only when a study is asked
for (`get_study`), so importing this package stays cheap and a broken study does not break the
others.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["STUDIES", "get_study"]

STUDIES: dict[str, str] = {
    "exact-recovery": "studies.exact_recovery",
    "cluster-histograms": "studies.cluster_histograms",
    "metastability": "studies.metastability",
    "high-dimension": "studies.high_dimension",
    "repulsion": "studies.repulsion",
    "phase-diagram": "studies.phase_diagram",
    "step-convergence": "studies.step_convergence",
    "convergence-order": "studies.convergence_order",
    "splitting-error": "studies.splitting_error",
    "plan": "studies.plan",
    "resolution": "studies.resolution",
    "stability": "studies.stability",
}
"""The registered studies: command-line name -> module path, in the order `workbench list` and
`workbench tour` use."""


def get_study(name: str) -> ModuleType:
    """Import and return the study module registered as `name`.

    **Arguments:**

    - `name`: a key of `STUDIES`, e.g. `"exact-recovery"`.

    **Returns:** the module (not yet checked against the protocol; see
    `workbench._harness.check_study`).

    **Raises:** `ValueError` listing the valid names if `name` is not registered. Errors raised
    while importing the module propagate unchanged.
    """
    try:
        module_path = STUDIES[name]
    except (KeyError, TypeError):
        valid = ", ".join(STUDIES) if STUDIES else "(none registered)"
        raise ValueError(f"unknown study {name!r}; valid studies: {valid}.") from None
    return importlib.import_module(module_path)
