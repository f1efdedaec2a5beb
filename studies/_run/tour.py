"""`workbench tour`: run studies at smoke (or full) size, several at once in worker processes,
and combine their reports into one page (`report.md`, a self-contained `report.html`) and
`tour.json`.

With several jobs the tour's own process stays light: it imports neither JAX nor any study.
The workers import what they run, a worker writes the combined report, and each worker leaves
without the interpreter's teardown once the pool closes: the first study starts without waiting
for the tour's own imports, and the last one's end is the tour's end. Each worker computes on
its own share of the cores (`studies._run.workers`). `run_tour` with `jobs=1` runs everything in
the calling process.
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
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from .workers import (
    collect_garbage_less_often,
    start_cpu_backend,
    thread_environment,
    threads_per_worker,
)

__all__ = ["run_tour"]


@dataclasses.dataclass(frozen=True)
class _Outcome:
    name: str
    summary: str
    ok: bool
    wall_time_s: float
    report: str  # the study's report, or the traceback when it failed
    error: str = ""  # one line: "ValueError: boom"
    verdict: str = ""
    kept: bool = False  # complete from an earlier run, not run again: `wall_time_s` is that run's


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
      one core, so two jobs on two cores finish the tour sooner. Each worker runs its
      computations on its share of the cores (one core each for two jobs on two cores: JAX's
      CPU compute threads, OpenMP, OpenBLAS and MKL; `studies._run.workers`), so that the workers
      do not take turns on the same cores. `1` runs them here, in order, on every core.
      The modules of `registry` must be importable by a fresh interpreter when `jobs > 1`.
      This process then imports neither JAX nor a study: the workers do (and one of them writes
      the combined report), so the first studies start as soon as the workers have imported
      what they run, not after this process has imported the same.
    - `names`: the studies to run, in this order; default every study of `registry`. An
      unregistered name raises `ValueError` (naming it and the valid ones) before anything runs.
    - `overwrite`: replace what a study's folder `out/<name>/` holds (another config: e.g. a
      smoke tour's folder for a full tour); without it such a study is reported as failed, its
      folder untouched, and a study whose folder holds this very run, complete, is not run again.
    - `expected_seconds`: `{name: seconds}`, when `jobs > 1`: start the longest first (a study
      missing here starts last), so the last to finish does not run alone; the report keeps the
      order of `names`. The command passes `studies.SMOKE_SECONDS` for smoke tours.

    The tour's wall time (printed, and in the report and `tour.json`) runs from this call to
    the end of the last study.

    **Returns:** the exit code: 0 if every study succeeded, 1 otherwise.
    """
    import studies

    tour_start = time.perf_counter()
    registry = dict(studies.STUDIES if registry is None else registry)
    stream = sys.stderr if stream is None else stream
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"run_tour: jobs={jobs!r} must be an integer >= 1.")
    names = list(registry) if names is None else list(names)
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ValueError(
            f"run_tour: names={unknown!r} are not registered studies; valid: {', '.join(registry)}."
        )
    mode = "full" if full else "smoke"
    total = len(names)

    def done(i: int, outcome: _Outcome) -> _Outcome:
        status = "ok" if outcome.ok else f"FAILED: {outcome.error}"
        took = (
            f"kept, {outcome.wall_time_s:.1f} s earlier"
            if outcome.kept
            else (f"{outcome.wall_time_s:.1f} s")
        )
        print(
            f"[{i}/{total}] {outcome.name}: {status} ({took})",
            file=stream,
            flush=True,
        )
        return outcome

    finish = {"full": full, "registered": len(registry)}
    if jobs == 1:
        out = _tour_folder(out, root)
        outcomes = []
        for i, name in enumerate(names, 1):
            print(f"[{i}/{total}] {name} ({mode}) ...", file=stream, flush=True)
            outcome = _tour_one(name, registry, out / name, full=full, overwrite=overwrite)
            outcomes.append(done(i, outcome))
        elapsed = time.perf_counter() - tour_start
        _finish_tour(out, outcomes, total_s=elapsed, **finish)
    else:
        import concurrent.futures
        import multiprocessing

        print(f"tour: {total} studies ({mode}), {jobs} at a time", file=stream, flush=True)
        context = multiprocessing.get_context("spawn")
        stop = context.Event()  # set on Ctrl-C: the studies not yet started are not started
        slots = context.Value("i", 0)  # numbers the workers: worker k takes the k-th cores
        threads = threads_per_worker(jobs)
        pool = concurrent.futures.ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_tour_worker, initargs=(stop, slots, threads)
        )
        # The workers start within the block (at the first submissions), in its environment.
        with _environment(thread_environment(threads, os.environ)), pool:
            # A default folder's name comes from `workbench.io`: a worker, which imports it
            # anyway, makes it.
            out = (
                pathlib.Path(out)
                if out is not None
                else pool.submit(_tour_folder, None, root).result()
            )
            out.mkdir(parents=True, exist_ok=True)
            cost = expected_seconds or {}
            started = sorted(names, key=lambda name: -cost.get(name, 0.0))  # stable
            futures = {
                pool.submit(
                    _tour_one, name, registry, out / name, full=full, overwrite=overwrite
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
            pool.submit(_finish_tour, out, outcomes, total_s=elapsed, **finish).result()
    failed = [o.name for o in outcomes if not o.ok]
    print(
        f"tour: {len(outcomes) - len(failed)}/{len(outcomes)} studies ok"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"; {elapsed:.0f} s; report in {out / 'report.md'} and {out / 'report.html'}",
        file=stream,
        flush=True,
    )
    return 1 if failed else 0


def _tour_folder(out, root) -> pathlib.Path:
    """`out`, created if missing, or a new `root/tour-<timestamp>` folder when it is None."""
    if out is None:
        from workbench.io import new_run_dir

        return new_run_dir(root, "tour")
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


_TOUR_STOP = None
"""In a tour's worker process: the tour's stop event (`run_tour`, `jobs > 1`)."""

_IN_WORKER = False
"""Whether this process is a tour's worker (started by `_tour_worker`)."""


def _tour_worker(stop, slots, threads: int) -> None:
    """A tour worker's start: keep the tour's stop event, start JAX with this worker's share of
    the cores (`threads` compute threads, `studies._run.workers`; the k-th worker to start takes
    slot k), collect garbage less often, and leave without the interpreter's teardown at exit
    (`_leave_now`)."""
    global _TOUR_STOP, _IN_WORKER
    _TOUR_STOP, _IN_WORKER = stop, True
    with slots.get_lock():
        slot = slots.value
        slots.value += 1
    start_cpu_backend(threads, slot)
    collect_garbage_less_often()
    _leave_now_at_exit()


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]):
    """`os.environ` with `variables` added while the block runs (the processes a pool starts
    there inherit them), then as it was."""
    added = [name for name in variables if name not in os.environ]
    os.environ.update({name: variables[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _leave_now_at_exit() -> None:
    """Make `_leave_now` the first exit handler to run (they run last registered first): again
    after each study, which may have imported modules that register their own (JAX does)."""
    import atexit

    atexit.unregister(_leave_now)
    atexit.register(_leave_now)


def _leave_now() -> None:
    """End a tour worker at exit without the interpreter's teardown (`os._exit`, after flushing
    the output), which takes 0.6 s with JAX loaded (2-core AMD EPYC). Everything a worker writes
    is written before it returns a result, and nothing reads a worker's exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _tour_one(
    name: str, registry: Mapping[str, str], out: pathlib.Path, *, full: bool, overwrite: bool
) -> _Outcome:
    """Run one study of a tour into `out` (in a worker process when `jobs > 1`) and return its
    outcome; a failure is recorded (`traceback.txt` in its folder), not raised."""
    import importlib

    from workbench.io import atomic_write_text

    from .harness import check_study, checked_verdict, default_config, run_study
    from .run_folder import RunFolderError, read_run

    if _TOUR_STOP is not None and _TOUR_STOP.is_set():
        return _Outcome(name, "", False, 0.0, "", "not started: the tour was interrupted")
    start = time.perf_counter()
    summary = ""
    try:
        module = check_study(importlib.import_module(registry[name]), name)
        summary = module.SUMMARY
        config = default_config(module, smoke=not full)
        results = run_study(module, config, out, smoke=not full, overwrite=overwrite)
        kept = results is None  # the folder already held this run, complete: keep it as it is
        record = (read_run(out) or {}) if kept else {}
        verdict = (record.get("verdict") or "") if kept else checked_verdict(module, results)
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
    # A kept study's time is its run's (run.json), not this look at its folder.
    wall = float(record.get("wall_time_s") or 0.0) if kept else time.perf_counter() - start
    _release_programs()
    report = (out / "report.md").read_text(encoding="utf-8")
    return _Outcome(name, summary, True, wall, report, verdict=verdict, kept=kept)


def _release_programs() -> None:
    """In a tour's worker process, free every program the study just compiled
    (`jax.clear_caches()`): a worker runs study after study, JAX keeps each program for the life
    of the process, and on CPU each holds about 17 of its memory maps, of which Linux allows
    65 530 (docs/extending.md, "Running it"). A smoke tour in one process ends at about 8 900;
    a full tour is not measured. The tour's own process (`jobs=1`, or `run_tour` called from a
    notebook) keeps its programs, and so does an interrupted study (its computation may still
    be running). A worker (`_tour_worker`) also makes `_leave_now` its first exit handler again
    here."""
    if _TOUR_STOP is None:
        return
    import jax

    jax.clear_caches()
    if _IN_WORKER:
        _leave_now_at_exit()


def _finish_tour(
    out: pathlib.Path,
    outcomes: list[_Outcome],
    *,
    full: bool,
    total_s: float,
    registered: int,
) -> None:
    """Write the tour's `report.md`, `report.html` and `tour.json` (with the environment of the
    process that runs this: a worker's when `jobs > 1`, the one the studies ran in)."""
    from workbench.io import atomic_write_json, atomic_write_text, environment

    env = environment()
    text = _tour_report(outcomes, env, full=full, total_s=total_s, registered=registered)
    atomic_write_text(out / "report.md", text)
    atomic_write_text(out / "report.html", markdown_to_html(text, out, title="Workbench tour"))
    atomic_write_json(
        out / "tour.json",
        {
            "mode": "full" if full else "smoke",
            "studies": {
                o.name: {
                    "ok": o.ok,
                    "verdict": o.verdict or None,
                    "wall_time_s": o.wall_time_s,
                    "kept": o.kept,
                    "error": o.error or None,
                }
                for o in outcomes
            },
            "wall_time_s": total_s,
            "environment": env,
        },
    )


def _tour_report(
    outcomes: list[_Outcome],
    env: Mapping[str, Any],
    *,
    full: bool,
    total_s: float,
    registered: int,
) -> str:
    from .._toolkit.report import code_block, demote_headings, markdown_table

    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    jax_version = env["packages"].get("jax")
    x64 = "on" if env["jax_enable_x64"] else "off (each study sets its own precision)"
    commit = f"git {env['git_commit'][:12]}" if env["git_commit"] else "no git commit"
    ok = sum(o.ok for o in outcomes)
    kept = [o for o in outcomes if o.kept]
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
        f"{ok} of {len(outcomes)} studies ran"
        + (f" ({len(kept)} of them complete from an earlier run, not run again)" if kept else "")
        + f"; tour wall time **{total_s:.0f} s** (the own times of the studies run now add up to "
        f"{sum(o.wall_time_s for o in outcomes if not o.kept):.0f} s; they run in parallel "
        "processes).",
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
            took = (
                f"complete from an earlier run, not run again (its wall time {o.wall_time_s:.2f} s)"
                if o.kept
                else f"wall time {o.wall_time_s:.2f} s"
            )
            lines += [f"Outputs in `{o.name}/`; {took}.", "", report, ""]
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
