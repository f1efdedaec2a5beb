"""A run folder as a transaction: one writer at a time, a recorded state, nothing mixed or lost.

`workbench run` (and `run_study`) open the output folder through `open_run`, which

1. refuses, before anything is created, an `--out` that cannot be a run folder (empty, an
   existing file, a folder that cannot be written) and a config whose estimated peak memory
   exceeds what the machine has (`Config.estimated_peak_bytes`, where the study defines it);
2. takes an OS lock on the folder (`fcntl.flock` on the folder itself, so no lock file is left
   behind): a second process on the same folder stops at once, naming the first;
3. compares the folder's `run.json` with the new run: another study, or another *identity* (the
   config less the fields that only choose where it runs), is refused unless the caller asked
   for `overwrite` (the old outputs are removed first); the same run, complete, is not run
   again; the same run, unfinished (`running` after a kill, `failed`, `interrupted`), starts
   again in place (a study that takes `run_dir=` resumes from its checkpoints);
4. records the state in `run.json`, written atomically: `running` with the command, the study,
   the config's identity and its fingerprint, the start time, the library version and the git
   revision; then `complete`, `failed` (with the error) or `interrupted` (with the time), with
   the end time. Earlier attempts on the folder are kept in `attempts`, so no timing is lost.

See `docs/extending.md` ("Running it").
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import hashlib
import json
import os
import pathlib
import shutil
import socket
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from workbench.io import atomic_write_json, to_jsonable

__all__ = [
    "LAYOUT_FIELDS",
    "RUN_FILE",
    "STATES",
    "RunFolder",
    "RunFolderError",
    "available_memory_bytes",
    "check_memory",
    "check_out",
    "open_run",
    "read_run",
    "run_identity",
]

RUN_FILE = "run.json"
"""The file in every run folder that records its state."""

STATES = ("running", "complete", "failed", "interrupted")
"""The states of a run folder, in `run.json["state"]`."""

LAYOUT_FIELDS = ("devices", "shard_params")
"""Config fields that choose where a study runs, not what it computes (its numbers are the same
on any device count and layout): left out of the run's identity."""

_ATTEMPT_FIELDS = ("state", "started_utc", "ended_utc", "wall_time_s", "command", "error")
_LEGACY_CONFIG = "config.json"  # what a run folder without run.json records of its run


class RunFolderError(Exception):
    """The run folder cannot take this run: in use by another process, holding another study or
    config, not a folder, not writable, or the run would not fit in memory. The message is one
    line naming the folder, what is there and what to do; the command exits with code 2."""


# --------------------------------------------------------------------------------------------
# Checks before anything is created
# --------------------------------------------------------------------------------------------


def check_out(out: str | os.PathLike[str]) -> pathlib.Path:
    """`out` as a path, refused (`RunFolderError`) when it cannot be a run folder: an empty
    string, an existing file, or a folder (or nearest existing parent) this process cannot
    write. Nothing is created."""
    if isinstance(out, str) and not out.strip():
        raise RunFolderError("--out '' is empty; give a folder for the run's outputs.")
    path = pathlib.Path(out)
    if path.exists() and not path.is_dir():
        raise RunFolderError(
            f"--out {str(path)!r} is an existing file, not a folder; give a new or existing folder."
        )
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise RunFolderError(
            f"--out {str(path)!r}: {str(existing)!r} is a file, so the folder cannot be made."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "folder" if existing == path else f"parent folder {str(existing)!r}"
        raise RunFolderError(
            f"--out {str(path)!r}: the {what} is not writable by this user; choose another folder."
        )
    return path


def available_memory_bytes() -> tuple[int, str] | None:
    """(bytes this process can still allocate, where that figure comes from), or `None` when the
    platform does not say. Linux: `MemAvailable` of `/proc/meminfo` (free memory plus what the
    kernel can reclaim); elsewhere the available physical pages. On an accelerator the device's
    own memory limit is the tighter bound and is used when JAX reports one."""
    device = _device_memory_bytes()
    if device is not None:
        return device
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    return int(pages) * int(size), "available physical pages"


def _device_memory_bytes() -> tuple[int, str] | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        device = jax.devices()[0]
        if device.platform == "cpu":
            return None
        stats = device.memory_stats() or {}
    except Exception:  # no backend, or a backend without memory statistics
        return None
    limit = stats.get("bytes_limit")
    if not limit:
        return None
    used = stats.get("bytes_in_use", 0)
    return int(limit) - int(used), f"free memory of {device.device_kind} ({device.platform})"


RUNTIME_BYTES = 512 * 2**20
"""What a study process holds besides its arrays (Python, the JAX runtime, compiled programs),
added to a config's `estimated_peak_bytes()` (which counts arrays only)."""


def check_memory(study: str, config: Any) -> None:
    """Refuse (`RunFolderError`) a config whose `estimated_peak_bytes()` plus `RUNTIME_BYTES`
    exceeds the memory available (`available_memory_bytes`), naming both. A study whose `Config` has no estimate,
    or a platform that reports no figure, is not checked."""
    estimate_fn = getattr(type(config), "estimated_peak_bytes", None)
    if estimate_fn is None:
        return
    estimate = int(estimate_fn(config)) + RUNTIME_BYTES
    available = available_memory_bytes()
    if available is None or estimate <= available[0]:
        return
    bytes_free, source = available
    raise RunFolderError(
        f"{study}: this config needs an estimated {_bytes(estimate)} at its peak, more than the "
        f"{_bytes(bytes_free)} available ({source}); reduce its sizes (see "
        f"`workbench run {study} --help`)."
    )


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError  # pragma: no cover


# --------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------


def run_identity(module: Any, config: Any) -> dict:
    """What makes two runs of a study the same run: `module.run_identity(config)` where the study
    defines it (the training studies: the fields that determine the trajectory, so an
    analysis-only field does not block a resume), else every config field but `LAYOUT_FIELDS`.
    A JSON-able dict."""
    own = getattr(module, "run_identity", None)
    if callable(own):
        identity = own(config)
    else:
        fields = dataclasses.asdict(config)
        identity = {k: v for k, v in fields.items() if k not in LAYOUT_FIELDS}
    return to_jsonable(identity, where="run identity")


def fingerprint(value: Any) -> str:
    """sha256 of the canonical JSON of `value` (sorted keys)."""
    text = json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# The folder
# --------------------------------------------------------------------------------------------


def read_run(folder: str | os.PathLike[str]) -> dict | None:
    """The folder's `run.json` as a dict, or `None` when there is none (or it is unreadable)."""
    path = pathlib.Path(folder) / RUN_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class RunFolder:
    """An open run folder (from `open_run`), locked by this process until it is closed.

    - `path`: the folder; `record`: the `run.json` being kept (a dict);
    - `already_complete`: the folder holds this very run, complete; nothing is to be computed;
    - `resuming`: the folder holds this run unfinished (a rerun continues it in place).
    """

    path: pathlib.Path
    record: dict
    already_complete: bool
    resuming: bool

    def write(self) -> None:
        atomic_write_json(self.path / RUN_FILE, self.record)

    def finish(self, state: str, **fields: Any) -> None:
        """Record the end of the run: `state` (`complete`, `failed` or `interrupted`), the end
        time, the wall time since this attempt started, and `fields` (e.g. the verdict or the
        error), atomically."""
        if state not in STATES[1:]:
            raise ValueError(f"finish: state={state!r}; valid: {', '.join(STATES[1:])}.")
        started = datetime.datetime.fromisoformat(self.record["started_utc"])
        ended = datetime.datetime.now(datetime.timezone.utc)
        self.record.update(
            state=state,
            ended_utc=ended.isoformat(timespec="seconds"),
            wall_time_s=(ended - started).total_seconds(),
            **fields,
        )
        self.write()


@contextlib.contextmanager
def open_run(
    out: str | os.PathLike[str],
    *,
    study: str,
    identity: Mapping[str, Any],
    config: Any,
    resumable: bool,
    overwrite: bool = False,
    resume: bool = False,
    command: Sequence[str] | None = None,
    environment: Mapping[str, Any] | None = None,
) -> Iterator[RunFolder]:
    """Open `out` for one run of `study` and hold its lock for the `with` block.

    Refuses with `RunFolderError`, before writing anything, when `out` cannot be a run folder
    (`check_out`), another process holds it, it holds files that are not a workbench run, or it
    holds another study or another identity and `overwrite` is false; `resume` asks for an
    unfinished run of this identity to continue and refuses when there is none or the study
    cannot resume. On entry the folder's `run.json` says `running` (unless the run is already
    complete: then nothing is written and `already_complete` is true); the caller records the
    end with `RunFolder.finish`. A block that raises without a recorded end leaves the state
    `failed` (or `interrupted` for `KeyboardInterrupt`).

    **Arguments:**

    - `out`: the folder; created (with parents) when missing.
    - `study`: the study's name; `identity`: `run_identity(module, config)`; `config`: the
      config itself (recorded, and compared to tell "already complete" from "resume").
    - `resumable`: whether the study continues an unfinished run from the folder.
    - `overwrite`: remove the outputs of whatever run the folder holds, then run.
    - `resume`: require an unfinished run of this identity to continue.
    - `command`: the command line to record (default `sys.argv`).
    - `environment`: `workbench.io.environment()`, for the version and git revision.
    """
    path = check_out(out)
    if overwrite and resume:
        raise RunFolderError("--overwrite and --resume exclude each other; give one of them.")
    if resume and not resumable:
        raise RunFolderError(
            f"{study} cannot resume (only the training studies keep checkpoints); rerun it, or "
            "give --overwrite to replace the folder's run."
        )
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    with _locked(path, study=study):
        old = read_run(path)
        config_json = to_jsonable(dataclasses.asdict(config), where="config")
        identity = dict(identity)
        same = _same_run(path, old, study=study, identity=identity, config=config_json)
        if same is None:  # an empty folder
            if resume:
                raise RunFolderError(
                    f"--resume: {str(path)!r} holds no run of {study} to resume; leave out "
                    "--resume to start one."
                )
        elif not same:
            if not overwrite:
                raise RunFolderError(_occupied_message(path, old, study, identity))
            _clear(path)
            old, same = None, None
        elif resume and (old or {}).get("state") == "complete":
            raise RunFolderError(
                f"--resume: the run of {study} in {str(path)!r} is already complete; nothing to "
                "resume."
            )
        elif overwrite:
            _clear(path)
            old, same = None, None
        env = dict(environment or {})
        complete = (
            old is not None
            and old.get("state") == "complete"
            and (old.get("config") == config_json or not resumable)
        )
        if complete:
            yield RunFolder(path, old, already_complete=True, resuming=False)
            return
        attempts = list((old or {}).get("attempts", []))
        if old is not None and old.get("started_utc"):
            attempts.append({k: old.get(k) for k in _ATTEMPT_FIELDS})
        record = {
            "state": "running",
            "study": study,
            "identity": identity,
            "identity_sha256": fingerprint(identity),
            "config": config_json,
            "config_sha256": fingerprint(config_json),
            "command": list(sys.argv if command is None else command),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_utc": _now(),
            "ended_utc": None,
            "wall_time_s": None,
            "workbench_version": env.get("packages", {}).get("workbench"),
            "git_commit": env.get("git_commit"),
            "git_dirty": env.get("git_dirty"),
            "resumed": bool(same),
            "attempts": attempts,
        }
        folder = RunFolder(path, record, already_complete=False, resuming=bool(same))

        def written() -> bool:
            """Whether run.json holds this attempt (a signal may land just after it is written,
            before `write` returns)."""
            now = read_run(path) or {}
            return (now.get("pid"), now.get("started_utc")) == (
                record["pid"],
                record["started_utc"],
            )

        # One block from the first write on: an interrupt or error at any point of it is
        # recorded once run.json says `running`; before that, a folder this call made goes.
        try:
            folder.write()
            yield folder
        except KeyboardInterrupt:
            if written():
                if folder.record["state"] == "running":
                    folder.finish("interrupted", interrupted_utc=_now())
            elif created:
                shutil.rmtree(path, ignore_errors=True)
            raise
        except BaseException as e:
            if written():
                if folder.record["state"] == "running":
                    folder.finish("failed", error=_one_line(e))
            elif created:
                shutil.rmtree(path, ignore_errors=True)
            raise


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _same_run(
    path: pathlib.Path, old: dict | None, *, study: str, identity: dict, config: dict
) -> bool | None:
    """None: the folder holds nothing; True: it holds this run; False: another run.
    Raises when it holds files that are not a run."""
    if old is not None:
        return old.get("study") == study and old.get("identity") == identity
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    if not entries:
        return None
    legacy = path / _LEGACY_CONFIG
    if legacy.is_file():  # a run folder without run.json: compare its study and config
        try:
            recorded = json.loads(legacy.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False

        def layout_free(fields: Any) -> dict:
            fields = fields if isinstance(fields, dict) else {}
            return {k: v for k, v in fields.items() if k not in LAYOUT_FIELDS}

        return recorded.get("study") == study and layout_free(recorded.get("config")) == (
            layout_free(config)
        )
    names = ", ".join(repr(p.name) for p in sorted(entries)[:3])
    raise RunFolderError(
        f"{str(path)!r} holds files that are not a workbench run ({names}"
        f"{', …' if len(entries) > 3 else ''}); give a new or empty folder."
    )


def _value(identity: dict, key) -> str:
    """A field of a run's identity as the refusal shows it: a field the identity leaves out (one
    a config leaves out while it has no effect) is at its default, not None."""
    return repr(identity[key]) if key in identity else "its default"


def _occupied_message(path: pathlib.Path, old: dict | None, study: str, identity: dict) -> str:
    fix = f"give a new folder, or --overwrite to remove its outputs and run {study} there."
    if old is None:
        return f"{str(path)!r} holds an earlier run of another study or config (config.json); {fix}"
    if old.get("study") != study:
        what = f"a run of {old.get('study')!r}"
    else:
        before = old.get("identity") or {}
        keys = sorted(set(before) | set(identity), key=str)
        changed = [
            f"{k}={_value(before, k)} there, {_value(identity, k)} now"
            for k in keys
            if before.get(k) != identity.get(k)
        ]
        shown = "; ".join(changed[:3]) + ("; …" if len(changed) > 3 else "")
        what = f"a run of {study} with another config ({shown})"
    return f"{str(path)!r} holds {what}, {old.get('state', '?')}; {fix}"


def _clear(path: pathlib.Path) -> None:
    """Remove every entry of the run folder (the caller holds its lock)."""
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@contextlib.contextmanager
def _locked(path: pathlib.Path, *, study: str) -> Iterator[None]:
    """An exclusive, non-blocking OS lock on the folder itself (released when the process ends,
    however it ends). Platforms without `fcntl` run unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunFolderError(_busy_message(path, study)) from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _busy_message(path: pathlib.Path, study: str) -> str:
    holder = read_run(path) or {}
    if holder.get("state") == "running" and holder.get("pid"):
        command = " ".join(holder.get("command") or [])
        who = (
            f"process {holder['pid']} on {holder.get('host', '?')}"
            f"{f' (`{command}`)' if command else ''}, running since {holder.get('started_utc')}"
        )
    else:
        who = "another process"
    return (
        f"{str(path)!r} is in use by {who}; wait for it to finish or give another --out for "
        f"{study}."
    )
