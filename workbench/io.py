"""Run folders, atomic writes and the environment record of a run.

Nothing a study writes may be left half-written: every file goes to a temporary file in the
destination folder, is flushed and `fsync`-ed, and is then moved over the destination with
`os.replace`, which is atomic on POSIX and Windows when both paths are on the same file system
(which is why the temporary file lives in the destination folder, not in `/tmp`). A reader
therefore sees either the old file or the complete new one, and a failure half-way through
(a value JSON cannot encode, a full disk, Ctrl-C) leaves the old file untouched and no
temporary file behind.

JSON is written strictly (no bare `NaN`/`Infinity` tokens, which most JSON readers reject):
non-finite floats become the *strings* `"NaN"`, `"Infinity"` and `"-Infinity"`. Strings rather
than `null` keep the sign of an infinity and the difference between "diverged" and "missing".
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import enum
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import numpy as np

from ._solution import is_result, result_name

__all__ = [
    "atomic_open",
    "atomic_write_json",
    "atomic_write_text",
    "environment",
    "new_run_dir",
    "to_jsonable",
]

NAN_STRING = "NaN"
POSINF_STRING = "Infinity"
NEGINF_STRING = "-Infinity"

# Packages whose versions every run records; `None` where one is not installed.
_RECORDED_PACKAGES = (
    "jax",
    "jaxlib",
    "equinox",
    "diffrax",
    "optax",
    "jaxtyping",
    "numpy",
    "matplotlib",
)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# --------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "w", *, encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temporary file that replaces `path` only if the `with` block succeeds.

    The temporary file is created next to `path` (same folder, hence same file system), named
    `.<name>.<random>.tmp`. On normal exit of the block it is flushed, `fsync`-ed and moved over
    `path` with `os.replace`; if the block raises, it is deleted and `path` keeps its old
    contents (or stays absent).

    **Arguments:**

    - `path`: the destination file. Its folder must exist.
    - `mode`: `"w"` (text) or `"wb"` (bytes).
    - `encoding`: text encoding for `"w"`; ignored for `"wb"`.

    **Returns:** a context manager yielding the open temporary file.

    ```python
    with atomic_open(out / "figure.png", "wb") as f:
        fig.savefig(f, format="png")
    ```
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode={mode!r} is not supported; valid modes: 'w', 'wb'.")
    path = pathlib.Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(
            f"atomic_open: the folder {str(folder)!r} of {str(path)!r} does not exist; "
            "create it first (e.g. with new_run_dir or Path.mkdir(parents=True))."
        )
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    tmp = pathlib.Path(tmp_name)
    try:
        if mode == "wb":
            f = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding=encoding, newline="")
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates files readable by the owner only; give the result the permissions an
        # ordinary `open(path, "w")` would have.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_folder(folder)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically (see `atomic_open`).

    **Arguments:**

    - `path`: the destination file; its folder must exist.
    - `text`: the whole new contents.
    - `encoding`: text encoding.
    """
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text: text must be a str, got {type(text).__name__}.")
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write `obj` as strict JSON to `path` atomically.

    `obj` is first converted with `to_jsonable` (numpy and JAX values become plain Python values;
    NaN and infinities become the strings `"NaN"`, `"Infinity"`, `"-Infinity"`), then encoded in
    full, and only then written; a value that cannot be encoded raises `TypeError` naming where
    it sits (e.g. `results.json['errors'][2]`), and `path` keeps its old contents.

    **Arguments:**

    - `path`: the destination file; its folder must exist.
    - `obj`: a tree of dicts, lists, tuples, strings, numbers, booleans, `None`, numpy/JAX arrays
      and scalars, dataclass instances, enums and paths.
    - `indent`: passed to `json.dumps`.
    """
    path = pathlib.Path(path)
    jsonable = to_jsonable(obj, where=path.name)
    text = json.dumps(jsonable, indent=indent, allow_nan=False, ensure_ascii=False)
    atomic_write_text(path, text + "\n")


def to_jsonable(obj: Any, *, where: str = "obj") -> Any:
    """Convert `obj` into values `json.dumps(..., allow_nan=False)` accepts.

    - numpy and JAX arrays become (nested) lists; numpy scalars become Python scalars;
    - floats that are NaN or infinite become `"NaN"`, `"Infinity"`, `"-Infinity"`;
    - tuples become lists; dataclass instances become dicts of their fields;
      enums become their value; paths become strings;
    - dict keys must be strings, or ints/floats/bools (converted with `str`).

    **Arguments:**

    - `obj`: the value to convert.
    - `where`: the name used for `obj` in error messages.

    **Returns:** the converted value (a new tree; `obj` is not modified).

    **Raises:** `TypeError` naming the position (e.g. `results['errors'][2]`) and type of the
    first value with no JSON form.
    """
    # Order matters: bool before int (bool is an int), numpy scalars before Python numbers.
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return _float_to_json(obj)
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item(), where=where)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist(), where=where)
    if _is_jax_array(obj):
        return to_jsonable(np.asarray(obj), where=where)
    if isinstance(obj, Mapping):
        return {
            _json_key(k, where): to_jsonable(v, where=f"{where}[{k!r}]") for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v, where=f"{where}[{i}]") for i, v in enumerate(obj)]
    if is_result(obj):  # `RESULTS.successful`, ... (an equinox Module, so before dataclasses)
        return result_name(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_jsonable(getattr(obj, f.name), where=f"{where}.{f.name}")
            for f in dataclasses.fields(obj)
        }
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value, where=where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(
        f"{where} has type {type(obj).__module__}.{type(obj).__qualname__}, which has no JSON "
        "form; convert it to a number, string, list or dict (numpy/JAX arrays, dataclasses, "
        "enums, enumeration items and paths are converted automatically)."
    )


def _float_to_json(x: float) -> float | str:
    if math.isnan(x):
        return NAN_STRING
    if math.isinf(x):
        return POSINF_STRING if x > 0 else NEGINF_STRING
    return x


def _json_key(key: Any, where: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, np.generic):
        key = key.item()
    # The same conversions `json.dumps` applies to non-string keys.
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    if isinstance(key, (int, float)):
        return str(key)
    raise TypeError(
        f"{where} has a key {key!r} of type {type(key).__name__}; JSON object keys must be "
        "strings (ints, floats and bools are converted)."
    )


def _is_jax_array(obj: Any) -> bool:
    # Only look at JAX if it has been imported: if it has not, no JAX array can exist, and
    # writing a file should not pay for importing it.
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(obj, jax.Array)


def _umask() -> int:
    # os.umask can only be read by setting it; restore it at once.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_folder(folder: pathlib.Path) -> None:
    # Make the rename itself durable. Not possible on every platform (e.g. Windows); the write
    # is still atomic there, only not yet guaranteed to survive a power cut.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Run folders
# --------------------------------------------------------------------------------------------


def new_run_dir(root: str | os.PathLike[str], study_name: str) -> pathlib.Path:
    """Create and return a new, empty folder `root/<study_name>-<UTC timestamp>`.

    The timestamp has the form `20250131T142501Z`. If that folder already exists (two runs in the
    same second), `-2`, `-3`, ... is appended; creation uses `mkdir(exist_ok=False)`, so two
    processes never get the same folder.

    **Arguments:**

    - `root`: parent folder, created if missing (e.g. `"runs"`).
    - `study_name`: letters, digits, `.`, `_` and `-` only, starting with a letter or digit.

    **Returns:** the path of the new folder.
    """
    if not isinstance(study_name, str) or not _SAFE_NAME.match(study_name):
        raise ValueError(
            f"new_run_dir: study_name={study_name!r} is not a valid folder name; use letters, "
            "digits, '.', '_' and '-', starting with a letter or digit."
        )
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = f"{study_name}-{stamp}"
    for attempt in range(1, 10_000):
        candidate = root / (base if attempt == 1 else f"{base}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise RuntimeError(f"new_run_dir: could not create a fresh folder for {base!r} in {root}.")


# --------------------------------------------------------------------------------------------
# Environment record
# --------------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Describe the software and hardware a run used, for `config.json`.

    Imports JAX (to ask for its backend and devices). Every entry is JSON-able.

    **Returns:** a dict with keys

    - `timestamp_utc`: ISO 8601 time of the call, UTC;
    - `python`, `python_implementation`, `platform`, `machine`, `cpu_count`
      (CPUs this process may use where the OS says so, else all CPUs);
    - `packages`: `{name: version or None}` for jax, jaxlib, equinox, diffrax, optax, jaxtyping,
      numpy, matplotlib and workbench;
    - `jax_backend`, `jax_devices` (strings), `jax_device_kinds`, `jax_enable_x64`;
    - `git_commit` (`None` outside a git checkout or before the first commit) and `git_dirty`
      (`None` when unknown).
    """
    import jax

    packages = {name: _version(name) for name in (*_RECORDED_PACKAGES, "workbench")}
    try:
        devices = jax.devices()
        backend = jax.default_backend()
    except RuntimeError as e:  # no usable backend: record why instead of failing the run
        devices, backend = [], f"unavailable: {e}"
    commit, dirty = _git_state(pathlib.Path(__file__).resolve().parent.parent)
    return {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": _cpu_count(),
        "packages": packages,
        "jax_backend": backend,
        "jax_devices": [str(d) for d in devices],
        "jax_device_kinds": sorted({d.device_kind for d in devices}),
        "jax_enable_x64": bool(jax.config.jax_enable_x64),
        "git_commit": commit,
        "git_dirty": dirty,
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_count() -> int | None:
    if sys.platform.startswith("linux"):
        try:
            return len(os.sched_getaffinity(0))
        except OSError:
            pass
    return os.cpu_count()


def _git_state(folder: pathlib.Path) -> tuple[str | None, bool | None]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "--quiet", "HEAD")
    if not commit:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else bool(status))
