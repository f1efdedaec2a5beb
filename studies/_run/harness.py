"""Run studies and write their run folders: the part of `workbench run` (and of each study of
`workbench tour`, `studies._run.tour`) that does not parse a command line, so tests and notebooks
can call it directly.

A run folder holds `run.json` (its state: `running`, `complete`, `failed`, `interrupted`; see
`studies._run.run_folder`, which also locks the folder and refuses another study or config there),
`config.json` (written before the study computes, so even a crashed run says what it was),
`results.json` (the study's `Results`, numbers only), one PNG per figure, and `report.md` (the
verdict first, then the report). A study whose `compute` takes `run_dir=` also writes there
while it computes (training: `checkpoints/`, `metrics.csv`), and running it again on the same
folder resumes. See the `studies` package docstring for the protocol a study module follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from workbench.io import atomic_write_json, atomic_write_text, environment

from .._toolkit.report import have_matplotlib, save_figure
from .overrides import config_fields
from .run_folder import (
    RUN_FILE,
    RunFolder,
    RunFolderError,
    check_memory,
    check_out,
    open_run,
    run_identity,
)

__all__ = [
    "RESERVED_FIELDS",
    "RunFolderError",
    "StudyError",
    "VERDICT_WORDS",
    "check_study",
    "default_config",
    "run_study",
    "study_question",
]

RESERVED_FIELDS = ("smoke", "out", "help", "overwrite", "resume")
"""Config field names a study may not use: the command line uses them for itself."""

VERDICT_WORDS = ("Yes", "No", "Partly")
"""A verdict's first word: the answer to the study's question."""


class StudyError(TypeError):
    """A study module does not follow the protocol, or one of its functions returned a bad value."""


def check_study(module: ModuleType, name: str | None = None) -> ModuleType:
    """Check that `module` follows the study protocol; return it unchanged.

    Checks: a module docstring; `NAME` and `SUMMARY` strings (and `NAME == name` when `name` is
    given); `Config` a frozen dataclass with no field named as a command-line option
    (`RESERVED_FIELDS`), whose fields all have defaults; `Results` a dataclass; callable `smoke_config`, `compute`, `figures`,
    `report` and `verdict`.

    **Raises:** `StudyError` naming the module and what is missing or wrong.
    """
    label = f"study module {module.__name__!r}"
    missing = object()

    def need(attr: str, kind: type, what: str) -> Any:
        value = getattr(module, attr, missing)
        if value is missing:
            raise StudyError(f"{label} has no {attr}; every study defines {what}.")
        if not isinstance(value, kind):
            raise StudyError(
                f"{label}: {attr} must be {what}, got {type(value).__name__} {value!r}."
            )
        return value

    if not (module.__doc__ or "").strip():
        raise StudyError(f"{label} has no docstring; its docstring must state the question.")
    study_name = need("NAME", str, "NAME: str, its command-line name")
    need("SUMMARY", str, "SUMMARY: str, one line for `workbench list`")
    if name is not None and study_name != name:
        raise StudyError(
            f"{label} is registered as {name!r} but its NAME is {study_name!r}; make them equal."
        )
    config_cls = need("Config", type, "a frozen dataclass Config")
    params = getattr(config_cls, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(config_cls) or params is None or not params.frozen:
        raise StudyError(
            f"{label}: Config must be a frozen dataclass (@dataclasses.dataclass(frozen=True))."
        )
    fields = config_fields(config_cls)
    clash = [f for f in fields if f in RESERVED_FIELDS]
    if clash:
        raise StudyError(
            f"{label}: Config field(s) {', '.join(map(repr, clash))} clash with command-line "
            f"options; rename them (reserved: {', '.join(RESERVED_FIELDS)})."
        )
    no_default = [
        f.name
        for f in dataclasses.fields(config_cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if no_default:
        raise StudyError(
            f"{label}: Config field(s) {', '.join(map(repr, no_default))} have no default; "
            "the defaults are the full-size study."
        )
    need("smoke_config", Callable, "smoke_config() -> Config")
    results_cls = need("Results", type, "a dataclass Results (numbers only)")
    if not dataclasses.is_dataclass(results_cls):
        raise StudyError(f"{label}: Results must be a dataclass (numbers only, no prose).")
    need("compute", Callable, "compute(config: Config) -> Results")
    need("figures", Callable, "figures(results: Results) -> dict[str, Figure]")
    need("report", Callable, "report(results: Results) -> str")
    need("verdict", Callable, "verdict(results: Results) -> str")
    return module


def accepts_run_dir(module: ModuleType) -> bool:
    """Whether the study's `compute` takes `run_dir=` (the training studies: their checkpoints
    and metrics go to the run folder, so a killed run resumes)."""
    import inspect

    return "run_dir" in inspect.signature(module.compute).parameters


def study_question(module: ModuleType) -> str:
    """The first paragraph of a study's docstring (its question), on one line."""
    paragraph = (module.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def default_config(module: ModuleType, *, smoke: bool = False) -> Any:
    """`module.smoke_config()` if `smoke` else `module.Config()`, checked to be a `Config`."""
    config = module.smoke_config() if smoke else module.Config()
    if not isinstance(config, module.Config):
        raise StudyError(
            f"study module {module.__name__!r}: smoke_config() returned "
            f"{type(config).__name__}, not Config."
        )
    return config


def checked_verdict(module: ModuleType, results: Any) -> str:
    """`module.verdict(results)`, checked to be a string starting with Yes, No or Partly."""
    text = module.verdict(results)
    if not isinstance(text, str) or not text.strip().startswith(VERDICT_WORDS):
        raise StudyError(
            f"study {module.NAME!r}: verdict() must return a string whose first word is one of "
            f"{', '.join(VERDICT_WORDS)}; got {text!r}."
        )
    return text.strip()


def run_study(
    module: ModuleType,
    config: Any,
    out: str | os.PathLike[str],
    smoke: bool = False,
    *,
    overwrite: bool = False,
    resume: bool = False,
    command: Sequence[str] | None = None,
    on_start: Callable[[RunFolder], None] | None = None,
) -> Any:
    """Run one study and write its run folder `out`, as one transaction.

    Before anything is created: check `module` (`check_study`) and that `config` is a
    `module.Config`; refuse an `out` that cannot be a run folder and a config whose
    `estimated_peak_bytes()` exceeds the available memory (`RunFolderError`). Then lock `out`
    (a second process on it stops with `RunFolderError` naming the first) and compare it with
    the run it holds (`run.json`): another study or config is refused unless `overwrite`; this
    very run, complete, is not run again (returns `None`); this run unfinished runs again in
    place (a study whose `compute` takes `run_dir=` resumes from its checkpoints). Then write
    `run.json` (`running`) and `config.json` = `{"study", "smoke", "config", "environment"}`;
    `results = module.compute(config)`; write `results.json`, each of `module.artifacts(results)`
    (where defined), each of `module.figures(results)` as `<name>.png` (skipped, and said in the
    report, when matplotlib is missing), `report.md` = the verdict, then `module.report(results)`,
    then the figures embedded; and last `run.json` = `complete`, with the verdict and the end
    time. Every file is written atomically. If `compute` raises, `run.json` says `failed` (with
    the error) or, for `KeyboardInterrupt` (Ctrl-C; SIGTERM is turned into one here),
    `interrupted`, and the exception propagates.

    Precision is not changed here: `compute` chooses its own (e.g. `jax.enable_x64(True)`).

    **Arguments:**

    - `module`: the study module.
    - `config`: an instance of `module.Config`.
    - `out`: the run folder; created if missing.
    - `smoke`: recorded in `config.json` (the sizes themselves come from `config`).
    - `overwrite`: remove the outputs of the run `out` holds first, whatever it is.
    - `resume`: require an unfinished run of this config in `out` to continue.
    - `command`: the command line recorded in `run.json` (default `sys.argv`).
    - `on_start`: called with the open `RunFolder` once it is locked and says `running` (the
      command prints its "running" line there, so a refused run prints only the refusal).

    **Returns:** the `Results`, or `None` when `out` already held this run, complete.

    ```python
    import studies, studies._run.harness as h
    m = studies.get_study("repulsion")
    results = h.run_study(m, m.smoke_config(), "runs/try", smoke=True)
    ```
    """
    check_study(module)
    if not isinstance(config, module.Config):
        raise StudyError(
            f"run_study: config must be an instance of {module.__name__}.Config, "
            f"got {type(config).__name__}."
        )
    check_out(out)
    check_memory(module.NAME, config)
    env = environment()
    with (
        open_run(
            out,
            study=module.NAME,
            identity=run_identity(module, config),
            config=config,
            resumable=accepts_run_dir(module),
            overwrite=overwrite,
            resume=resume,
            command=command,
            environment=env,
        ) as folder,
        _signals_as_interrupt() as interrupted,
    ):
        if folder.already_complete:
            return None
        if on_start is not None:
            on_start(folder)
        results = _compute_and_write(
            module, config, folder.path, smoke=smoke, env=env, interrupted=interrupted
        )
        interrupted()
        folder.finish("complete", verdict=checked_verdict(module, results))
    return results


def _compute_and_write(
    module: ModuleType,
    config: Any,
    out: pathlib.Path,
    *,
    smoke: bool,
    env: Mapping[str, Any],
    interrupted: Callable[[], None],
) -> Any:
    atomic_write_json(
        out / "config.json",
        {
            "study": module.NAME,
            "smoke": bool(smoke),
            "config": dataclasses.asdict(config),
            "environment": env,
        },
    )
    if accepts_run_dir(module):
        results = module.compute(config, run_dir=out)
    else:
        results = module.compute(config)
    interrupted()  # a Ctrl-C that landed where Python could not raise it: no results written
    if not isinstance(results, module.Results):
        raise StudyError(
            f"study {module.NAME!r}: compute() must return a Results, got {type(results).__name__}."
        )
    # results.json first: if a value cannot be encoded this raises before report.md exists, so a
    # run folder never has a report without its numbers.
    atomic_write_json(out / "results.json", results)
    verdict = checked_verdict(module, results)
    text = module.report(results)
    if not isinstance(text, str):
        raise StudyError(
            f"study {module.NAME!r}: report() must return a markdown string, "
            f"got {type(text).__name__}."
        )
    artifacts = getattr(module, "artifacts", None)
    for file_name, content in (artifacts(results) if callable(artifacts) else {}).items():
        if not file_name.endswith(".json") or "/" in file_name or file_name.startswith("."):
            raise StudyError(
                f"study {module.NAME!r}: artifacts() file name {file_name!r} must be a plain "
                "'<name>.json' inside the run folder."
            )
        if file_name in (RUN_FILE, "config.json", "results.json"):
            raise StudyError(
                f"study {module.NAME!r}: artifacts() may not replace the harness's {file_name}."
            )
        atomic_write_json(out / file_name, content)
    if have_matplotlib():
        figures = module.figures(results)
        for fig_name, fig in figures.items():
            save_figure(fig, out / f"{fig_name}.png")
        if figures:
            text += "\n\n## Figures\n\n" + "\n\n".join(
                f"![{fig_name}]({fig_name}.png)" for fig_name in figures
            )
    else:
        text += (
            "\n\n*Figures not drawn: matplotlib is not installed (`pip install workbench[plots]`).*"
        )
    atomic_write_text(out / "report.md", f"**Verdict.** {verdict}\n\n{text.strip()}\n")
    return results


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[Callable[[], None]]:
    """SIGTERM raises `KeyboardInterrupt`, as Ctrl-C does, so a killed run is recorded as
    interrupted (the training loop installs its own handler that checkpoints first). Only in
    the main thread, where Python delivers signals.

    A signal's exception can land where Python cannot raise it: in a garbage-collection
    callback (JAX registers one), a `__del__` or a weakref callback, where Python prints
    "Exception ignored in ..." and goes on. Such a `KeyboardInterrupt` is kept here, silently
    (`sys.unraisablehook`), and the function yielded raises it: the caller calls it where the
    run may stop (after compute, before the run is marked complete), so a Ctrl-C is never
    lost."""
    import signal
    import threading

    pending: list[BaseException] = []

    def interrupted() -> None:
        if pending:
            raise KeyboardInterrupt(str(pending[0]))

    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def handler(signum, frame):
        del frame
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    unraisable = sys.unraisablehook

    def keep(info):
        if isinstance(info.exc_value, KeyboardInterrupt):
            pending.append(info.exc_value)
        else:
            unraisable(info)

    previous = signal.signal(signal.SIGTERM, handler)
    sys.unraisablehook = keep
    try:
        yield interrupted
    finally:
        sys.unraisablehook = unraisable
        signal.signal(signal.SIGTERM, previous)
