"""The `workbench` command: list, run and tour the studies.

```
workbench list
workbench run <study> [--smoke] [--out DIR] [--overwrite | --resume] [--FIELD VALUE ...]
workbench run <study> --help        # the study's question and its Config fields
workbench tour [--out DIR] [--full]
```

A run folder holds one run (`studies._run.run_folder`): its `run.json` says `running`, `complete`,
`failed` or `interrupted`; one process writes it at a time (a second one on the same `--out`
stops at once, exit 2); another study or config is refused there unless `--overwrite`; the same
command on a complete folder says "already complete" and changes nothing; on an unfinished one
it runs again in place (the training studies resume from their checkpoints). Ctrl-C or SIGTERM
end with one line, the folder marked `interrupted`, exit code 130.

Each study chooses its own precision inside `compute` (float64 for the numerical-analysis
studies, in a scoped `jax.enable_x64` context); this command changes no JAX setting that
affects results. It turns on JAX's persistent compilation cache
(`compilation_cache_environment`: `~/.cache/workbench/jax`, `WORKBENCH_JAX_CACHE=0` for none),
so that what one run compiled is read back by the next.
Mistakes on the command line (an unknown study or field, a value of the wrong type, a value out
of its allowed range) are reported on stderr in one line with exit code 2, before any folder is
made and before any compute; so are an `--out` that cannot be a run folder and a config whose
estimated peak memory exceeds what the machine has.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from types import ModuleType

__all__ = ["compilation_cache_environment", "entry", "main"]

_PROG = "workbench"
_EXIT_USAGE = 2
_EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C
_RUN_SWITCHES = ("--smoke", "--overwrite", "--resume", "-h", "--help")


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (the message and where to look), exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(_EXIT_USAGE)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `workbench` command with `argv` (default `sys.argv[1:]`); return the exit code.

    Exit codes: 0 success (or the run was already complete); 1 a study failed (or, for `list`,
    could not be loaded); 2 a usage error (unknown command, study or field, an unreadable value,
    a run folder in use or holding another run); 130 interrupted (Ctrl-C, SIGTERM).
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before or after a run (the run itself reports its own)
        print(f"{_PROG}: interrupted.", file=sys.stderr)
        return _EXIT_INTERRUPTED


def entry() -> None:
    """The `workbench` console command: `main()`, then exit with its code. An interrupted run
    leaves the process at once (`os._exit`, after flushing the output): XLA's threads may still
    be running the interrupted computation, and tearing the interpreter down under them can
    crash it (a segmentation fault instead of the exit code 130); what it left in reference
    cycles is collected first, so that an interrupted tour's semaphores are unlinked. A closed
    output pipe (`| head`) ends it quietly, exit code 1, as other command-line tools do. The
    command's process collects garbage less often
    (`studies._run.workers.collect_garbage_less_often`)."""
    import gc
    import os

    from .workers import collect_garbage_less_often

    os.environ.update(compilation_cache_environment(os.environ))
    collect_garbage_less_often()
    try:
        code = main()
    except BrokenPipeError:  # the reader went away (`workbench list | head -1`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's flush does not fail again
        raise SystemExit(1) from None
    if code == _EXIT_INTERRUPTED:
        # `os._exit` runs no finalizer: free what the interrupted command left in reference
        # cycles first. When a tour's interrupt comes back from a worker (a study's
        # `KeyboardInterrupt` raised again from its future), the traceback keeps the tour's
        # frame in such a cycle, and with it the pool's stop event and slot counter: named
        # semaphores that Python's resource tracker would otherwise report as "leaked".
        gc.collect()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def compilation_cache_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that turn on JAX's persistent compilation cache for the
    command and the processes it starts (a tour's studies), given the environment `environ`;
    `entry` adds them to `os.environ` before JAX is imported. Empty when the cache is off.

    A second `workbench run` or `tour` then reads the programs an earlier one compiled from disk
    instead of compiling them again (a smoke tour takes about a sixth less time with a filled
    cache, `benchmarks/README.md`). The folder is `$WORKBENCH_JAX_CACHE`, else
    `$XDG_CACHE_HOME/workbench/jax` (`~/.cache/workbench/jax`), kept under 2 GiB (least recently
    used entries go first); `WORKBENCH_JAX_CACHE=0` turns it off, and a `JAX_COMPILATION_CACHE_DIR`
    already set is left as it is. JAX keys every entry by the program, the jax/jaxlib versions,
    the device and the compile options (`XLA_FLAGS` included), so a change of any of them compiles
    afresh, and results do not depend on the cache; the compile times a study reports are then
    those of reading it. Only the command does this: `main()`, called from Python, changes
    nothing in the calling process. (The size limit needs `filelock`, which the `studies` extra
    installs; without it the cache grows.)
    """
    import importlib.util
    import os

    folder = environ.get("WORKBENCH_JAX_CACHE", "")
    if environ.get("JAX_COMPILATION_CACHE_DIR") or folder == "0":
        return {}
    if not folder:
        base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "workbench", "jax")
    out = {"JAX_COMPILATION_CACHE_DIR": folder}
    defaults = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    if importlib.util.find_spec("filelock") is not None:  # what JAX's size limit needs
        defaults["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(2 * 1024**3)
    for name, value in defaults.items():
        if name not in environ:
            out[name] = value
    return out


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _top_parser()
    if argv and not argv[0].startswith("-") and argv[0] not in _COMMANDS:
        from .overrides import did_you_mean

        print(
            f"{_PROG}: error: unknown command {argv[0]!r}{did_you_mean(argv[0], _COMMANDS)}; "
            f"valid commands: {', '.join(_COMMANDS)} (see `{_PROG} --help`).",
            file=sys.stderr,
        )
        return _EXIT_USAGE
    if not argv or argv[0] not in _COMMANDS:
        # Let argparse print the usage (or --help) and choose the exit code.
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            return _exit_code(e)
        parser.print_help(sys.stderr)
        return _EXIT_USAGE
    return _COMMANDS[argv[0]](argv[1:])


# --------------------------------------------------------------------------------------------
# list
# --------------------------------------------------------------------------------------------


def _cmd_list(argv: list[str]) -> int:
    parser = _Parser(prog=f"{_PROG} list", description="Name the studies, one line each.")
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        return _exit_code(e)
    import studies

    from .harness import check_study

    lines, failed = [], False
    for name in studies.STUDIES:
        try:
            summary = check_study(studies.get_study(name), name).SUMMARY
        except Exception as e:  # one broken study must not hide the others
            summary, failed = f"(cannot load: {type(e).__name__}: {e})", True
        lines.append((name, summary))
    width = max((len(n) for n, _ in lines), default=0)
    for name, summary in lines:
        print(f"{name.ljust(width)}  {summary}")
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------
# run
# --------------------------------------------------------------------------------------------


def _run_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"{_PROG} run",
        usage=f"{_PROG} run <study> [--smoke] [--out DIR] [--overwrite | --resume] [--FIELD VALUE ...]",
        description=(
            "Run one study. Extra --FIELD VALUE pairs override fields of the study's Config "
            f"(see `{_PROG} run <study> --help`)."
        ),
        add_help=False,
    )
    parser.add_argument("study", nargs="?", help="the study name (see `workbench list`)")
    parser.add_argument("--smoke", action="store_true", help="shrunken sizes, runs in seconds")
    parser.add_argument(
        "--out", metavar="DIR", help="output folder (default: runs/<study>-<timestamp>)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="remove the outputs of the run the folder holds (another study or config) first",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the folder's unfinished run of this config (training studies)",
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def _split_run_args(tokens: Sequence[str]) -> tuple[list[str], list[tuple[str, str | None]]]:
    """Separate `run`'s own arguments from `--FIELD VALUE` overrides.

    Done by hand rather than with `parse_known_args` so that a value such as `-1` or `-0.5` is
    always taken as the value of the field before it, and overrides may come before or after the
    study name. `--no-FIELD`, and `--FIELD` followed by another `--` option or nothing, carry no
    value: the switches of `bool` fields (`--no-x64`, `--x64 --smoke`).
    """
    known: list[str] = []
    overrides: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in _RUN_SWITCHES or token.startswith("--out="):
            known.append(token)
            i += 1
        elif token == "--out":
            known.extend(tokens[i : i + 2])
            i += 2
        elif token.startswith("--") and len(token) > 2:
            name, has_equals, value = token[2:].partition("=")
            if has_equals:
                overrides.append((name, value))
                i += 1
            elif name.startswith(("no-", "no_")) or (
                i + 1 < len(tokens) and tokens[i + 1].startswith("--")
            ):
                overrides.append((name, None))  # a switch: --no-x64, or --x64 --smoke
                i += 1
            elif i + 1 < len(tokens):
                overrides.append((name, tokens[i + 1]))
                i += 2
            else:
                overrides.append((name, None))
                i += 1
        else:
            known.append(token)
            i += 1
    return known, overrides


def _cmd_run(argv: list[str]) -> int:
    parser = _run_parser()
    known, override_pairs = _split_run_args(argv)
    try:
        args = parser.parse_args(known)
    except SystemExit as e:
        return _exit_code(e)
    if args.study is None:
        if args.help:
            parser.print_help()
            return 0
        return _usage_error(parser, "the study name is missing; see `workbench list`.")

    import studies
    from workbench.io import new_run_dir

    from .harness import StudyError, accepts_run_dir, check_study, default_config, run_study
    from .overrides import OverrideError, apply_overrides, parse_overrides

    try:
        module = studies.get_study(args.study)
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)  # one line: it names the choices
        return _EXIT_USAGE
    try:
        check_study(module, args.study)
        base = default_config(module, smoke=args.smoke)
    except StudyError as e:
        return _usage_error(parser, str(e))
    if args.help:
        _print_study_help(module)
        return 0
    try:
        overrides = parse_overrides(module.Config, override_pairs, study=args.study)
        config = apply_overrides(base, overrides)
    except (OverrideError, TypeError, ValueError) as e:
        # ValueError includes ConfigError: Config.__post_init__ rejecting a value or a
        # combination of values. One line, no usage text: the message names the field.
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return _EXIT_USAGE

    from .run_folder import RunFolderError, check_memory, check_out, read_run

    try:  # before any folder exists: an --out that cannot be one, a run that cannot fit
        if args.out is not None:
            check_out(args.out)
        check_memory(args.study, config)
    except RunFolderError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return _EXIT_USAGE
    out = pathlib.Path(args.out) if args.out is not None else new_run_dir("runs", args.study)
    mode = "smoke" if args.smoke else "full"
    start = time.perf_counter()

    def started(folder) -> None:
        what = "resuming its unfinished run" if folder.resuming else "running"
        print(f"{args.study} ({mode}): {what}, outputs in {out}", file=sys.stderr, flush=True)

    try:
        results = run_study(
            module,
            config,
            out,
            smoke=args.smoke,
            overwrite=args.overwrite,
            resume=args.resume,
            command=[_PROG, "run", *argv],
            on_start=started,
        )
    except RunFolderError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return _EXIT_USAGE
    except KeyboardInterrupt:
        record = read_run(out) or {}
        again = "resume" if accepts_run_dir(module) else "run it again"
        print(
            f"{args.study}: interrupted at {record.get('ended_utc', 'an unknown time')} after "
            f"{time.perf_counter() - start:.1f} s; run folder {out} marked interrupted; rerun "
            f"the same command to {again}.",
            file=sys.stderr,
        )
        return _EXIT_INTERRUPTED
    except Exception:
        traceback.print_exc()
        print(
            f"{args.study}: FAILED after {time.perf_counter() - start:.1f} s; run folder {out} "
            "marked failed (its run.json has the error); rerun the same command to try again.",
            file=sys.stderr,
        )
        return 1
    if results is None:
        record = read_run(out) or {}
        print(
            f"{args.study}: already complete in {out} (finished {record.get('ended_utc')}); "
            "nothing was run and every file is as it was. Give --overwrite to run it again."
        )
        return 0
    print(f"{args.study}: done in {time.perf_counter() - start:.1f} s; outputs in {out}:")
    for path in sorted(p for p in out.iterdir() if not p.name.startswith(".")):
        print(f"  {path}")
    return 0


def _print_study_help(module: ModuleType) -> None:
    from .harness import study_question
    from .overrides import describe_fields

    print(f"usage: {_PROG} run {module.NAME} [--smoke] [--out DIR] [--FIELD VALUE ...]\n")
    print(f"{module.NAME}: {module.SUMMARY}\n")
    print(study_question(module) + "\n")
    print(
        "fields (--FIELD VALUE or --FIELD=VALUE; '-' may replace '_'; tuples as a,b,c; defaults are"
    )
    print("the full-size study, --smoke starts from the smoke values):")
    print(describe_fields(module.Config, module.smoke_config()))


# --------------------------------------------------------------------------------------------
# tour
# --------------------------------------------------------------------------------------------


def _cmd_tour(argv: list[str]) -> int:
    parser = _Parser(
        prog=f"{_PROG} tour",
        description=(
            "Run the tour's studies (the headline study of each theme; --all: every registered "
            "study), at smoke sizes unless --full, into DIR/<study>/, and write DIR/report.md and "
            "a self-contained DIR/report.html combining their reports."
        ),
    )
    parser.add_argument("--out", metavar="DIR", help="default: runs/tour-<timestamp>")
    parser.add_argument("--full", action="store_true", help="full-size configs (slow)")
    parser.add_argument(
        "--all", action="store_true", help="every registered study, not only the tour's"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the studies' folders that hold another config (e.g. a smoke tour's)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=_default_jobs(),
        metavar="N",
        help="studies run at once, each in its own process (default: the CPU count, at most 4)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return _exit_code(e)
    if args.jobs < 1:
        return _usage_error(parser, f"--jobs {args.jobs}: give a whole number >= 1.")
    import studies

    from .tour import run_tour

    names = None if args.all else [name for name in studies.TOUR if name in studies.STUDIES]
    expected = None if args.full else studies.SMOKE_SECONDS
    return run_tour(
        args.out,
        full=args.full,
        jobs=args.jobs,
        names=names,
        expected_seconds=expected,
        overwrite=args.overwrite,
    )


def _default_jobs() -> int:
    """As many studies as there are cores, at most 4: smoke studies spend most of their time
    compiling, which XLA does on one core, so one study per core keeps the cores busy; a third
    study on two cores only adds contention (`benchmarks/README.md`, "The tour's workers")."""
    import os

    return max(1, min(4, os.cpu_count() or 1))


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

_COMMANDS = {"list": _cmd_list, "run": _cmd_run, "tour": _cmd_tour}


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=_PROG,
        description="A JAX workbench for Transformers seen as differential equations.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{list,run,tour}")
    sub.add_parser("list", help="name the studies, one line each")
    sub.add_parser("run", help="run one study: run <study> [--smoke] [--out DIR] [--FIELD VALUE]")
    sub.add_parser(
        "tour", help="run the headline studies (--all: every study) and combine their reports"
    )
    return parser


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return _EXIT_USAGE


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    return e.code if isinstance(e.code, int) else 1
