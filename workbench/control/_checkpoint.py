r"""Training checkpoints: atomic, checksummed, pickle-free, refused when the run's configuration
changed.

A checkpoint of step `k` is two files in the checkpoint folder:

- `step-0000000k.eqx`: the leaves of the state pytree (parameters and optimizer state) in
  `equinox.tree_serialise_leaves` format: one `.npy` record per leaf, read back with the
  structure of a template pytree (no pickle, no code in the file);
- `step-0000000k.json`: the manifest, written after the data: the step, the SHA-256 of the data
  file, the run's fingerprint (its configuration) and free metadata.

Both are written atomically (temporary file, `fsync`, rename), so a kill leaves either the whole
checkpoint or none of it. The manifest also records the state's structure: the path, dtype and
shape of every leaf.

Restoring walks the manifests from the newest and tells corruption from a mismatch:

- *corruption* — an unreadable manifest, a missing data file, or one that does not match its
  checksum (a truncated or damaged file) — is reported (a `UserWarning` naming it) and skipped
  for the previous checkpoint;
- a *mismatch* — the manifest's fingerprint differs from the current run's, or the state's
  structure differs from the one saved (another width, depth or optimizer), or an intact data
  file does not fit the state — raises `CheckpointMismatch` naming what differs. Nothing in the
  folder is touched: a run is never silently continued, restarted or overwritten with another
  configuration.

Why equinox serialisation and not orbax-checkpoint: the state is one small pytree on one host;
`tree_serialise_leaves` writes it with the library's own dependencies (orbax adds tensorstore,
an async writer and a directory protocol), the file is a plain sequence of NumPy arrays, and a
restored tree is host arrays that `jax.device_put` places onto any device layout (one device or
a mesh of eight alike).
"""

import dataclasses
import functools
import hashlib
import json
import math
import pathlib
import re
import warnings

import equinox as eqx
import numpy as np

from .._checks import int_in_range
from ..io import atomic_open, atomic_write_json

__all__ = [
    "CheckpointManager",
    "CheckpointMismatch",
    "array_text",
    "describe",
    "differences",
    "params_sha256",
    "state_structure",
]

_NAME = re.compile(r"^step-(\d{8,})\.json$")


class CheckpointMismatch(ValueError):
    """The run folder holds a run with another configuration, model or optimizer: the message
    names what differs (old -> new). Nothing of the old run was changed; use a new run folder
    (or the original settings)."""


def params_sha256(tree) -> str:
    """SHA-256 of a pytree's array leaves: dtype, shape and bytes of each, in `jax.tree.leaves`
    order (non-array leaves are skipped). Equal trees give equal hashes on every machine of
    the same byte order."""
    h = hashlib.sha256()
    for leaf in _array_leaves(tree):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _array_leaves(tree):
    import jax

    return [x for x in jax.tree.leaves(tree) if eqx.is_array(x)]


def _sha256_file(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_ABSENT = "(absent)"


def differences(old, new, prefix: str = "") -> list[str]:
    """`"path: old -> new"` for every leaf where two JSON-like values differ, dicts and lists
    compared entry by entry (so a changed width names the arrays whose shapes changed, not the
    whole model); a key present on one side only shows `(absent)` on the other."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            k = str(k)
            name = f"{prefix}{'' if k[:1] in '.[' else '.'}{k}" if prefix else k
            out += differences(old.get(k, _ABSENT), new.get(k, _ABSENT), name)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new)):
            out += differences(a, b, f"{prefix}[{i}]")
        return out
    if old == new:
        return []
    return [f"{prefix or '(value)'}: {_short(old)} -> {_short(new)}"]


def _short(value, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def mismatch_message(folder, changed: list[str], limit: int = 8) -> str:
    """The one-line `CheckpointMismatch` message: the first `limit` differences, how many more,
    and what to do."""
    shown = "; ".join(changed[:limit])
    if len(changed) > limit:
        shown += f"; and {len(changed) - limit} more"
    return (
        f"the run in {folder} was written with another configuration or model ({shown}); "
        "resuming would mix two runs, and nothing of the old run was changed. Rerun with the "
        "original settings, or use a new run folder."
    )


def array_text(a) -> str:
    """`"dtype[shape]"` of an array, e.g. `"float32[64,8]"` (`"key<fry>[2]"` for PRNG keys)."""
    return f"{a.dtype}[{','.join(str(int(n)) for n in np.shape(a))}]"


def describe(value, *, array_values: bool = True, _depth: int = 0):
    """A JSON-able description of `value`, stable across processes and machines, for a run's
    fingerprint.

    Equinox modules, dataclasses and named tuples become `{"type": qualified name, field:
    description, ...}`; lists, tuples and dicts are described entry by entry; numbers, strings,
    booleans and None are themselves (non-finite floats as the strings `"nan"`, `"inf"`,
    `"-inf"`, so that equal values compare equal); a function is its qualified name, with the
    values of its closure cells (a factory's arguments) and a `functools.partial`'s arguments;
    any other object is its type's qualified name. Arrays are `"dtype[shape]"` and, with
    `array_values` (or for a non-floating array: indices, masks), also their values (up to 16
    entries) or a SHA-256 of them (larger). `array_values=False` describes a model's parameters
    by structure only. Object addresses never appear (a default `repr` would differ between
    processes). A class's `_fingerprint_optional` names fields left out at their default."""
    import jax

    if _depth > 32:  # a self-referencing closure or structure
        return _qualname(type(value))
    deeper = functools.partial(describe, array_values=array_values, _depth=_depth + 1)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (complex, np.complexfloating)):
        return repr(complex(value))
    if eqx.is_array(value) or isinstance(value, np.ndarray):
        text = array_text(value)
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        elif not array_values and jax.dtypes.issubdtype(value.dtype, np.inexact):
            return text
        host = np.asarray(jax.device_get(value))
        if host.size <= 16:
            return {"array": text, "values": [describe(x) for x in host.ravel().tolist()]}
        return {"array": text, "sha256": params_sha256(host)}
    if isinstance(value, eqx.Module) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        # Fields named in `_fingerprint_optional` are left out at their default, so that a
        # fingerprint without them matches one where they hold it.
        optional = getattr(type(value), "_fingerprint_optional", ())
        fields = {
            f.name: deeper(getattr(value, f.name, None))
            for f in dataclasses.fields(value)
            if not (f.name in optional and getattr(value, f.name, None) == f.default)
        }
        return {"type": _qualname(type(value)), **fields}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple (optax states)
        return {
            "type": _qualname(type(value)),
            **{k: deeper(getattr(value, k)) for k in value._fields},
        }
    if isinstance(value, (list, tuple)):
        return [deeper(x) for x in value]
    if isinstance(value, dict):
        return {str(k): deeper(v) for k, v in value.items()}
    if isinstance(value, functools.partial):
        return {
            "partial": deeper(value.func),
            "args": [deeper(x) for x in value.args],
            "keywords": {k: deeper(v) for k, v in value.keywords.items()},
        }
    if callable(value) and hasattr(value, "__qualname__"):
        name = _qualname(value)
        cells = getattr(value, "__closure__", None) or ()
        names = getattr(getattr(value, "__code__", None), "co_freevars", ())
        closure = {}
        for cell_name, cell in zip(names, cells):
            try:
                closure[cell_name] = deeper(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        return {"function": name, "closure": closure} if closure else name
    return _qualname(type(value))


def _qualname(obj) -> str:
    module = getattr(obj, "__module__", None) or ""
    return f"{module}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def state_structure(tree) -> dict:
    """`{leaf path: "dtype[shape]"}` of a pytree's array and number leaves: what
    `eqx.tree_deserialise_leaves` must find again to read a checkpoint back."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if eqx.is_array(leaf) or isinstance(leaf, np.ndarray):
            out[jax.tree_util.keystr(path)] = array_text(leaf)
        elif isinstance(leaf, (bool, int, float, complex, np.generic)):
            out[jax.tree_util.keystr(path)] = type(leaf).__name__
    return out


class CheckpointManager:
    """Save and restore the training state in `folder`, keeping the newest `keep` checkpoints.

    **Arguments:**

    - `folder`: the checkpoint folder (created when missing).
    - `fingerprint`: a JSON-able dict describing the run (its configuration); stored in every
      manifest and compared on restore.
    - `keep`: how many checkpoints to keep (older ones are deleted after a save), ≥ 2 so that a
      corrupted newest one has a predecessor.
    """

    def __init__(self, folder, *, fingerprint: dict, keep: int = 3):
        int_in_range("keep", keep, 2, numpy_ints=False)
        self.folder = pathlib.Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.fingerprint = json.loads(json.dumps(fingerprint))
        self.keep = keep

    def _data(self, step: int) -> pathlib.Path:
        return self.folder / f"step-{step:08d}.eqx"

    def _manifest(self, step: int) -> pathlib.Path:
        return self.folder / f"step-{step:08d}.json"

    def steps(self) -> list[int]:
        """The steps with a manifest, newest first."""
        found = []
        for p in self.folder.iterdir():
            m = _NAME.match(p.name)
            if m:
                found.append(int(m.group(1)))
        return sorted(found, reverse=True)

    def save(self, step: int, state, metadata: dict | None = None) -> pathlib.Path:
        """Write the checkpoint of `step` (data, then manifest, both atomic); prune old ones."""
        data = self._data(step)
        with atomic_open(data, "wb") as f:
            eqx.tree_serialise_leaves(f, state)
        atomic_write_json(
            self._manifest(step),
            {
                "format": "workbench.checkpoint/1",
                "step": int(step),
                "data": data.name,
                "sha256": _sha256_file(data),
                "fingerprint": self.fingerprint,
                "structure": state_structure(state),
                "metadata": metadata or {},
            },
        )
        for old in self.steps()[self.keep :]:
            for p in (self._manifest(old), self._data(old)):
                p.unlink(missing_ok=True)
        return data

    def restore(self, like):
        """`(step, state, metadata)` of the newest valid checkpoint, or `None` if there is none.

        `like` is a pytree with the structure, shapes and dtypes of the saved state. A corrupted
        checkpoint (unreadable manifest, missing data file, checksum mismatch) is skipped with a
        `UserWarning` for the previous one.

        **Raises:** `CheckpointMismatch` if a checkpoint was written by another configuration
        (fingerprint) or for a state of another structure; nothing in the folder is changed.
        """
        want = state_structure(like)
        for step in self.steps():
            manifest = self._manifest(step)
            try:
                info = json.loads(manifest.read_text(encoding="utf-8"))
                fingerprint = info["fingerprint"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                warnings.warn(
                    f"checkpoint {manifest} is unreadable ({type(e).__name__}: {e}); using the "
                    "previous checkpoint.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            changed = differences(fingerprint, self.fingerprint)
            # A manifest without a structure (the field is optional): an intact data file that
            # does not fit `like` below is then the mismatch.
            if "structure" in info:
                changed += differences(info["structure"], want, "state")
            if changed:
                raise CheckpointMismatch(mismatch_message(self.folder, changed))
            data = self._data(step)
            problem = None
            if not data.exists():
                problem = "its data file is missing"
            elif _sha256_file(data) != info.get("sha256"):
                problem = "its data file does not match the manifest's SHA-256 (corrupted)"
            if problem is not None:
                warnings.warn(
                    f"checkpoint of step {step} in {self.folder} is not usable: {problem}; "
                    "using the previous checkpoint.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            try:
                with open(data, "rb") as f:
                    state = eqx.tree_deserialise_leaves(f, like)
            except (
                Exception
            ) as e:  # the file is intact (checksum): it was written for another state
                raise CheckpointMismatch(
                    mismatch_message(
                        self.folder,
                        [
                            f"state: the intact step-{step} data does not fit "
                            f"({type(e).__name__}: {e})"
                        ],
                    )
                ) from e
            return step, state, info.get("metadata", {})
        return None
