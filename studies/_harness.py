"""Run studies and write their run folders: the part of `workbench run` / `workbench tour` that
does not parse a command line, so tests and notebooks can call it directly.

A run folder holds `run.json` (its state: `running`, `complete`, `failed`, `interrupted`; see
`studies._run_folder`, which also locks the folder and refuses another study or config there),
`config.json` (written before the study computes, so even a crashed run says what it was),
`results.json` (the study's `Results`, numbers only), one PNG per figure, and `report.md` (the
verdict first, then the report). A study whose `compute` takes `run_dir=` also writes there
while it computes (training: `checkpoints/`, `metrics.csv`), and running it again on the same
folder resumes. See the `studies` package docstring for the protocol a study module follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, TextIO

from workbench.io import atomic_write_json, atomic_write_text, environment, new_run_dir

from ._overrides import config_fields
from ._report import code_block, demote_headings, have_matplotlib, markdown_table, save_figure
from ._run_folder import (
    RUN_FILE,
    RunFolder,
    RunFolderError,
    check_memory,
    check_out,
    open_run,
    read_run,
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
    "run_tour",
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
    import studies, studies._harness as h
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


# --------------------------------------------------------------------------------------------
# Tour
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Outcome:
    name: str
    summary: str
    ok: bool
    wall_time_s: float
    report: str  # the study's report, or the traceback when it failed
    error: str = ""  # one line: "ValueError: boom"
    verdict: str = ""


def run_tour(
    out: str | os.PathLike[str] | None = None,
    *,
    full: bool = False,
    registry: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] = "runs",
    stream: TextIO | None = None,
    jobs: int = 1,
    names: Sequence[str] | None = None,
    expected_seconds: Mapping[str, float] | None = None,
    overwrite: bool = False,
) -> int:
    """Run registered studies into `out/<name>/` and combine their reports.

    Each study runs with `smoke_config()` (or `Config()` when `full`). A study that fails — on
    import, protocol check, or while running — is recorded as FAILED with its traceback, and the
    remaining studies still run. Writes `out/report.md` (summary table with the status and wall
    time of each study, then each report under a `## <name>` heading, figures embedded), the same
    as a self-contained `out/report.html` (figures inlined), and `out/tour.json` (status and
    wall time per study, the tour's wall time, and the environment).

    **Arguments:**

    - `out`: the tour folder; default a new `root/tour-<timestamp>` folder.
    - `full`: run the full-size configs instead of the smoke ones.
    - `registry`: `{name: module path}`; default `studies.STUDIES` at call time.
    - `root`: parent of the default `out`.
    - `stream`: where to print one progress line per study; default `sys.stderr`.
    - `jobs`: studies run at once, each in its own process (`spawn`: a fresh interpreter, so no
      JAX state is shared). Smoke studies spend most of their time compiling, which XLA does on
      one core, so two jobs on two cores finish the tour sooner. `1` runs them here, in order.
      The modules of `registry` must be importable by a fresh interpreter when `jobs > 1`.
    - `names`: the studies to run, in this order; default every study of `registry`. An
      unregistered name raises `ValueError` (naming it and the valid ones) before anything runs.
    - `overwrite`: replace what a study's folder `out/<name>/` holds (another config: e.g. a
      smoke tour's folder for a full tour); without it such a study is reported as failed, its
      folder untouched, and a study whose folder holds this very run, complete, is not run again.
    - `expected_seconds`: `{name: seconds}`, when `jobs > 1`: start the longest first (a study
      missing here starts last), so the last to finish does not run alone; the report keeps the
      order of `names`. The command passes `studies.SMOKE_SECONDS` for smoke tours.

    **Returns:** the exit code: 0 if every study succeeded, 1 otherwise.
    """
    import studies

    registry = studies.STUDIES if registry is None else registry
    stream = sys.stderr if stream is None else stream
    out = new_run_dir(root, "tour") if out is None else pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tour_start = time.perf_counter()
    env = environment()
    mode = "full" if full else "smoke"
    outcomes = []
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"run_tour: jobs={jobs!r} must be an integer >= 1.")
    names = list(registry) if names is None else list(names)
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ValueError(
            f"run_tour: names={unknown!r} are not registered studies; valid: {', '.join(registry)}."
        )
    total = len(names)

    def done(i: int, outcome: _Outcome) -> _Outcome:
        status = "ok" if outcome.ok else f"FAILED: {outcome.error}"
        print(
            f"[{i}/{total}] {outcome.name}: {status} ({outcome.wall_time_s:.1f} s)",
            file=stream,
            flush=True,
        )
        return outcome

    if jobs == 1:
        for i, name in enumerate(names, 1):
            print(f"[{i}/{total}] {name} ({mode}) ...", file=stream, flush=True)
            outcomes.append(
                done(i, _tour_one(name, dict(registry), out / name, full=full, overwrite=overwrite))
            )
    else:
        import concurrent.futures
        import multiprocessing

        print(f"tour: {total} studies ({mode}), {jobs} at a time", file=stream, flush=True)
        context = multiprocessing.get_context("spawn")
        stop = context.Event()  # set on Ctrl-C: the studies not yet started are not started
        with concurrent.futures.ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_tour_worker, initargs=(stop,)
        ) as pool:
            cost = expected_seconds or {}
            started = sorted(names, key=lambda name: -cost.get(name, 0.0))  # stable
            futures = {
                pool.submit(
                    _tour_one, name, dict(registry), out / name, full=full, overwrite=overwrite
                ): name
                for name in started
            }
            finished = {}
            try:
                for i, future in enumerate(concurrent.futures.as_completed(futures), 1):
                    finished[futures[future]] = done(i, future.result())
            except BaseException:
                # Ctrl-C reaches the running studies too (one process group): they mark their
                # folders interrupted. The queued ones must not start after it.
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        outcomes = [finished[name] for name in names]
    elapsed = time.perf_counter() - tour_start
    text = _tour_report(outcomes, env, full=full, total_s=elapsed, registered=len(registry))
    atomic_write_text(out / "report.md", text)
    atomic_write_text(out / "report.html", markdown_to_html(text, out, title="Workbench tour"))
    atomic_write_json(
        out / "tour.json",
        {
            "mode": mode,
            "studies": {
                o.name: {
                    "ok": o.ok,
                    "verdict": o.verdict or None,
                    "wall_time_s": o.wall_time_s,
                    "error": o.error or None,
                }
                for o in outcomes
            },
            "wall_time_s": elapsed,
            "environment": env,
        },
    )
    failed = [o.name for o in outcomes if not o.ok]
    print(
        f"tour: {len(outcomes) - len(failed)}/{len(outcomes)} studies ok"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"; {elapsed:.0f} s; report in {out / 'report.md'} and {out / 'report.html'}",
        file=stream,
        flush=True,
    )
    return 1 if failed else 0


_TOUR_STOP = None
"""In a tour's worker process: the tour's stop event (`run_tour`, `jobs > 1`)."""


def _tour_worker(stop) -> None:
    global _TOUR_STOP
    _TOUR_STOP = stop


def _tour_one(
    name: str, registry: Mapping[str, str], out: pathlib.Path, *, full: bool, overwrite: bool
) -> _Outcome:
    import importlib

    if _TOUR_STOP is not None and _TOUR_STOP.is_set():
        return _Outcome(name, "", False, 0.0, "", "not started: the tour was interrupted")
    start = time.perf_counter()
    summary = ""
    try:
        module = check_study(importlib.import_module(registry[name]), name)
        summary = module.SUMMARY
        config = default_config(module, smoke=not full)
        results = run_study(module, config, out, smoke=not full, overwrite=overwrite)
        if results is None:  # the folder already held this run, complete: keep it as it is
            verdict = (read_run(out) or {}).get("verdict") or ""
        else:
            verdict = checked_verdict(module, results)
    except KeyboardInterrupt:
        if _TOUR_STOP is not None:  # this worker's next study may come before the tour's stop
            _TOUR_STOP.set()
        raise
    except Exception as e:
        wall = time.perf_counter() - start
        trace = traceback.format_exc()
        if not isinstance(e, RunFolderError):  # the folder is another run's: write nothing there
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "traceback.txt", trace)
        _release_programs()
        return _Outcome(name, summary, False, wall, trace, f"{type(e).__name__}: {e}")
    wall = time.perf_counter() - start
    _release_programs()
    report = (out / "report.md").read_text(encoding="utf-8")
    return _Outcome(name, summary, True, wall, report, verdict=verdict)


def _release_programs() -> None:
    """In a tour's worker process, free every program the study just compiled
    (`jax.clear_caches()`): a worker runs study after study, JAX keeps each program for the life
    of the process, and on CPU each holds about 17 of its memory maps, of which Linux allows
    65 530 (docs/extending.md, "Running it"). A smoke tour in one process ends at about 8 900;
    a full tour is not measured. The tour's own process (`jobs=1`, or `run_tour` called from a
    notebook) keeps its programs, and so does an interrupted study (its computation may still
    be running)."""
    if _TOUR_STOP is None:
        return
    import jax

    jax.clear_caches()


def _tour_report(
    outcomes: list[_Outcome],
    env: Mapping[str, Any],
    *,
    full: bool,
    total_s: float,
    registered: int,
) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    jax_version = env["packages"].get("jax")
    x64 = "on" if env["jax_enable_x64"] else "off (each study sets its own precision)"
    commit = f"git {env['git_commit'][:12]}" if env["git_commit"] else "no git commit"
    ok = sum(o.ok for o in outcomes)
    lines = [
        "# Workbench tour",
        "",
        f"{'Full-size' if full else 'Smoke-size'} run of "
        + (
            f"every registered study ({registered}), "
            if len(outcomes) == registered
            else f"{len(outcomes)} of the {registered} registered studies "
            "(`workbench tour --all` runs every one), "
        )
        + f"{stamp}; "
        f"jax {jax_version} on {env['jax_backend']}, global float64 {x64}, {commit}. "
        f"{ok} of {len(outcomes)} studies ran; tour wall time **{total_s:.0f} s** (the studies' "
        f"own times add up to {sum(o.wall_time_s for o in outcomes):.0f} s; they run in "
        "parallel processes).",
        "",
        'Each verdict is computed from the study\'s numbers; at smoke sizes a "No" can come from '
        "the small sizes (few starts, short runs, wide confidence intervals) rather than from the "
        "question: rerun the study at full size (`workbench run <study>`) before reading it as an "
        "answer.",
        "",
        markdown_table(
            ["study", "verdict", "key numbers", "wall time (s)"],
            [(f"[{o.name}](#{o.name})", *_verdict_parts(o), o.wall_time_s) for o in outcomes],
            floatfmt=".1f",
        ),
        "",
    ]
    for o in outcomes:
        lines += [f"## {o.name}", ""]
        if o.summary:
            lines += [f"*{o.summary}*", ""]
        if o.ok:
            report = _relink_images(demote_headings(o.report.strip(), 2), o.name)
            lines += [f"Outputs in `{o.name}/`; wall time {o.wall_time_s:.2f} s.", "", report, ""]
        else:
            lines += [
                f"**FAILED** after {o.wall_time_s:.2f} s: `{o.error.splitlines()[0]}`",
                "",
                code_block(o.report, "text"),
                "",
            ]
    return "\n".join(lines)


def _verdict_parts(o: _Outcome) -> tuple[str, str]:
    """(the answer — Yes, No, Partly, … — and the first sentence after it, shortened), or
    ("**FAILED**", the error) for a study that failed."""
    if not o.ok:
        return "**FAILED**", o.error.splitlines()[0][:160] if o.error else "—"
    answer, dot, rest = o.verdict.partition(". ")
    if not dot:
        return _first_sentence(o.verdict), ""
    numbers = _first_sentence(rest)
    return answer, numbers if len(numbers) <= 200 else numbers[:197].rstrip() + "…"


def _relink_images(text: str, folder: str) -> str:
    """`![a](b.png)` → `![a](folder/b.png)` for relative image paths."""
    import re

    return re.sub(r"!\[([^\]]*)\]\((?![a-z]+:|/)([^)]+)\)", rf"![\1]({folder}/\2)", text)


def markdown_to_html(text: str, folder: pathlib.Path, *, title: str) -> str:
    """A self-contained HTML page of the Markdown `text`: tables and code blocks rendered
    (Python-Markdown), every relative PNG under `folder` inlined as a `data:` URI, a small
    stylesheet; nothing is loaded from elsewhere when it is opened."""
    import base64
    import html
    import re

    try:
        import markdown
    except ImportError:  # pragma: no cover - the studies extra installs it
        body = f"<pre>{html.escape(text)}</pre>"
    else:
        body = markdown.markdown(text, extensions=["tables", "fenced_code", "toc"])

    def inline(match):
        src = match.group(1)
        path = pathlib.Path(folder) / html.unescape(src)
        if src.startswith(("data:", "http:", "https:")) or not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="([^"]+\.png)"', inline, body)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:70rem;margin:2rem auto;padding:0 1rem;"
        "line-height:1.45;color:#222}table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}"
        "th,td{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}"
        "th{background:#f3f3f3}img{max-width:100%;height:auto}code{background:#f5f5f5;"
        "padding:0 .2rem}pre{background:#f5f5f5;padding:.6rem;overflow-x:auto}"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{style}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "") if text else "—"
