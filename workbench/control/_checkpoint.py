r"""Training checkpoints: atomic, checksummed, pickle-free, refused when the run's configuration
changed.

A checkpoint of step `k` is two files in the checkpoint folder:

- `step-0000000k.eqx`: the leaves of the state pytree (parameters and optimizer state) in
  `equinox.tree_serialise_leaves` format: one `.npy` record per leaf, read back with the
  structure of a template pytree (no pickle, no code in the file);
- `step-0000000k.json`: the manifest, written after the data: the step, the SHA-256 of the data
  file, the run's fingerprint (its configuration) and free metadata.

Both are written atomically (temporary file, `fsync`, rename), so a kill leaves either the whole
checkpoint or none of it. Restoring walks the manifests from the newest: one whose data file is
missing or does not match its checksum is reported (a `UserWarning` naming it) and skipped for the
previous one. A manifest whose fingerprint differs from the current run's raises
`CheckpointMismatch` naming the fields that changed: a run is never silently continued with
another configuration.

Why equinox serialisation and not orbax-checkpoint: the state is one small pytree on one host;
`tree_serialise_leaves` writes it with the library's own dependencies (orbax adds tensorstore,
an async writer and a directory protocol), the file is a plain sequence of NumPy arrays, and a
restored tree is host arrays that `jax.device_put` places onto any device layout (one device or
a mesh of eight alike).
"""

import hashlib
import json
import pathlib
import re
import warnings

import equinox as eqx
import numpy as np

from ..io import atomic_open, atomic_write_json

__all__ = ["CheckpointManager", "CheckpointMismatch", "params_sha256"]

_NAME = re.compile(r"^step-(\d{8,})\.json$")


class CheckpointMismatch(ValueError):
    """The run folder holds checkpoints of a run with another configuration."""


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


def _differences(old: dict, new: dict) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [
        f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
        for k in keys
        if old.get(k) != new.get(k)
    ]


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
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
            raise ValueError(f"keep={keep!r} must be an integer >= 2.")
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
                "metadata": metadata or {},
            },
        )
        for old in self.steps()[self.keep :]:
            for p in (self._manifest(old), self._data(old)):
                p.unlink(missing_ok=True)
        return data

    def restore(self, like):
        """`(step, state, metadata)` of the newest valid checkpoint, or `None` if there is none.

        `like` is a pytree with the structure, shapes and dtypes of the saved state.

        **Raises:** `CheckpointMismatch` if a checkpoint was written by another configuration.
        """
        for step in self.steps():
            manifest = self._manifest(step)
            try:
                info = json.loads(manifest.read_text(encoding="utf-8"))
                fingerprint = info["fingerprint"]
            except (OSError, ValueError, KeyError) as e:
                warnings.warn(
                    f"checkpoint {manifest} is unreadable ({type(e).__name__}: {e}); using the "
                    "previous checkpoint.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            if fingerprint != self.fingerprint:
                changed = "; ".join(_differences(fingerprint, self.fingerprint))
                raise CheckpointMismatch(
                    f"the checkpoints in {self.folder} were written by a run with another "
                    f"configuration ({changed}); resuming would mix two runs. Rerun with the "
                    "original settings, or use a new output folder."
                )
            data = self._data(step)
            problem = None
            if not data.exists():
                problem = "its data file is missing"
            elif _sha256_file(data) != info.get("sha256"):
                problem = "its data file does not match the manifest's SHA-256 (corrupted)"
            if problem is None:
                try:
                    with open(data, "rb") as f:
                        state = eqx.tree_deserialise_leaves(f, like)
                except Exception as e:  # a truncated or malformed record
                    problem = f"its data cannot be read ({type(e).__name__}: {e})"
            if problem is not None:
                warnings.warn(
                    f"checkpoint of step {step} in {self.folder} is not usable: {problem}; "
                    "using the previous checkpoint.",
                    UserWarning,
                    stacklevel=2,
                )
                continue
            return step, state, info.get("metadata", {})
        return None
