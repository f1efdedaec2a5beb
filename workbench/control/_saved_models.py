r"""A trained model as files, read back without the code that built it: `save_model`,
`load_model`, and `load_run` for a training run's folder.

`model.eqx` holds the arrays (`equinox.tree_serialise_leaves`: one `.npy` record per leaf, no
pickle); `model.json` holds the model's *structure* as data — for every module its class (only
workbench's own classes are accepted back) and its fields, for every array its dtype and shape,
for every function (an activation) its name — plus the SHA-256 of the parameters, of the
data file and of the structure. Loading checks the structure's hash, rebuilds the tree from it
with zero arrays of the recorded shapes, reads the arrays into it and checks the other two.
Nothing from the file is executed: a name is resolved only to a class or function that
workbench itself defines (`_resolve`); anything else — another package's, or one reached
through a workbench module's imports such as `workbench.io:os.system` — is refused by name.

A training run with a run folder writes both files into it when it finishes (the `SaveModel`
callback), so

```python
model = wbc.load_run("runs/train-digits")        # the trained ControlledModel
fine = model.rediscretize(wb.schemes.Strang(), 16)
```

works on any machine, without the optimizer's state or the study's code.
"""

import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._sharding import on_host
from ..io import atomic_open, atomic_write_json
from ._checkpoint import _sha256_file, params_sha256

__all__ = ["load_model", "load_run", "model_structure", "run_inputs", "save_model"]

FORMAT = "workbench.model/2"
_READS = ("workbench.model/1", FORMAT)
"""`/2` adds `structure_sha256`, the hash of the structure, checked on load; a `/1` manifest
(written without it) still loads, its structure unchecked."""
MANIFEST, DATA, INPUTS = "model.json", "model.eqx", "inputs.npy"
_PACKAGE = "workbench"


def structure_sha256(structure) -> str:
    """SHA-256 of the structure's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(structure, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _name(obj) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


def _ours(module: str) -> bool:
    return module == _PACKAGE or module.startswith(_PACKAGE + ".")


def model_structure(tree):
    """The structure of `tree` (a model built from workbench's modules) as JSON-able data:
    modules as `{"module": "workbench....:Class", "fields": {...}}`, arrays as `{"array":
    dtype, "shape": [...]}`, functions as `{"function": name}`, tuples, lists, string-keyed
    dicts, numbers, strings, booleans and None as themselves (non-finite floats as
    `{"float": "inf"}`). A value of any other kind, or a class or function from outside
    workbench, is a `ValueError` naming it."""
    return _encode(tree, "model")


def _encode(x, path: str):
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else {"float": repr(x)}
    if eqx.is_array(x) or isinstance(x, np.ndarray):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise ValueError(f"{path}: a PRNG key array cannot be saved with a model.")
        return {"array": str(x.dtype), "shape": [int(n) for n in x.shape]}
    if isinstance(x, eqx.Module):
        cls = type(x)
        if not _ours(cls.__module__):
            raise ValueError(
                f"{path}: {cls.__module__}.{cls.__qualname__} is not a workbench module; a saved "
                "model is rebuilt from workbench's own classes only (the file runs no code)."
            )
        _check_resolves(cls, path)
        fields = {
            f.name: _encode(getattr(x, f.name), f"{path}.{f.name}") for f in dataclasses.fields(x)
        }
        return {"module": _name(cls), "fields": fields}
    if isinstance(x, tuple):
        return {"tuple": [_encode(v, f"{path}[{i}]") for i, v in enumerate(x)]}
    if isinstance(x, list):
        return {"list": [_encode(v, f"{path}[{i}]") for i, v in enumerate(x)]}
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {"dict": {k: _encode(v, f"{path}[{k!r}]") for k, v in x.items()}}
    if callable(x) and hasattr(x, "__qualname__") and "<" not in x.__qualname__:
        if not _ours(getattr(x, "__module__", "") or ""):
            raise ValueError(
                f"{path}: the function {x.__module__}.{x.__qualname__} is not workbench's; a saved "
                "model names its functions (activations) from workbench only."
            )
        _check_resolves(x, path)
        return {"function": _name(x)}
    raise ValueError(f"{path}: a {type(x).__name__} cannot be saved with a model.")


def _refuse(name, path: str, why: str):
    return ValueError(
        f"{path}: {name!r} is not a workbench class or function ({why}); refused: a saved model "
        "is rebuilt from workbench's own classes and functions only."
    )


def _check_resolves(obj, path: str) -> None:
    """Refuse at save time what `load_model` could not find again by its name (a class made
    inside a function, a wrapped or re-exported function)."""
    try:
        found = _resolve(_name(obj), path)
    except ValueError:
        found = None
    if found is not obj:
        raise ValueError(
            f"{path}: {_name(obj)} cannot be saved: it is not reachable by that name as a class "
            "or function of its module, so the saved model could not be read back."
        )


def _resolve(name, path: str):
    """The class or function `name` (`"module:qualname"`, as `_name` writes it) names, when
    workbench defines it: the module is a workbench module, every step of the qualname is a
    plain public-or-private identifier (no dunder, no `<locals>`), every object on the way is a
    class or function whose `__module__` is workbench's, and the object found is the one its own
    `__module__:__qualname__` names. An attribute that is an import (`workbench.io:os.system`)
    or a re-export of something foreign is refused, whatever the module it is reached from."""
    if not isinstance(name, str) or name.count(":") != 1:
        raise _refuse(name, path, "expected 'module:qualname'")
    module, qualname = name.split(":")
    parts, steps = module.split("."), qualname.split(".")
    for part in (*parts, *steps):
        if not part.isidentifier() or part.startswith("__"):
            raise _refuse(name, path, f"{part!r} is not a plain identifier")
    if not _ours(module):
        raise _refuse(name, path, f"the module {module!r} is not workbench's")
    try:
        obj = importlib.import_module(module)
    except ImportError:
        raise _refuse(name, path, f"there is no module {module!r}") from None
    for i, part in enumerate(steps):
        obj = inspect.getattr_static(obj, part, None)
        step = f"{module}:{'.'.join(steps[: i + 1])}"
        if not (isinstance(obj, type) or inspect.isfunction(obj)) or not _ours(
            getattr(obj, "__module__", None) or ""
        ):
            raise _refuse(name, path, f"{step} is not a class or function defined by workbench")
        if _name(obj) != step:
            raise _refuse(name, path, f"{step} is {_name(obj)} under another name")
    return obj


def _decode(spec, path: str):
    if spec is None or isinstance(spec, (bool, int, float, str)):
        return spec
    if isinstance(spec, dict):
        if "array" in spec:
            return jnp.zeros(tuple(spec["shape"]), jnp.dtype(spec["array"]))
        if "float" in spec:
            return float(spec["float"])
        if "tuple" in spec:
            return tuple(_decode(v, f"{path}[{i}]") for i, v in enumerate(spec["tuple"]))
        if "list" in spec:
            return [_decode(v, f"{path}[{i}]") for i, v in enumerate(spec["list"])]
        if "dict" in spec:
            return {k: _decode(v, f"{path}[{k!r}]") for k, v in spec["dict"].items()}
        if "function" in spec:
            fn = _resolve(spec["function"], path)
            if not inspect.isfunction(fn):
                raise _refuse(spec["function"], path, "a class where a function is recorded")
            return fn
        if "module" in spec:
            cls = _resolve(spec["module"], path)
            if not (isinstance(cls, type) and issubclass(cls, eqx.Module)):
                raise ValueError(f"{path}: {spec['module']!r} is not an equinox module.")
            # As equinox unflattens a module: no __init__ (its arguments are not its fields).
            obj = object.__new__(cls)
            names = {f.name for f in dataclasses.fields(cls)}
            given = spec["fields"]
            if set(given) != names:
                raise ValueError(
                    f"{path}: {spec['module']} has the fields {sorted(names)} in this version of "
                    f"workbench; the file records {sorted(given)}."
                )
            for k, v in given.items():
                object.__setattr__(obj, k, _decode(v, f"{path}.{k}"))
            return obj
    raise ValueError(f"{path}: unreadable entry {spec!r}.")


def save_model(
    folder, model: eqx.Module, *, inputs=None, metadata: dict | None = None
) -> pathlib.Path:
    """Write `model` to `folder` as `model.eqx` (its arrays) and `model.json` (its structure,
    hashes and `metadata`), with `inputs` (a few example inputs of the model, e.g. held-out
    images, for the analyses: `run_inputs`) as `inputs.npy`; all atomically, the manifest
    last. **Returns:** the manifest's path."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    structure = model_structure(model)
    model = on_host(model)
    with atomic_open(folder / DATA, "wb") as f:
        eqx.tree_serialise_leaves(f, model)
    info = {
        "format": FORMAT,
        "data": DATA,
        "data_sha256": _sha256_file(folder / DATA),
        "params_sha256": params_sha256(model),
        "structure": structure,
        "structure_sha256": structure_sha256(structure),
        "metadata": metadata or {},
    }
    if inputs is not None:
        with atomic_open(folder / INPUTS, "wb") as f:
            np.save(f, np.asarray(inputs), allow_pickle=False)
        info["inputs"] = INPUTS
        info["inputs_sha256"] = _sha256_file(folder / INPUTS)
    manifest = folder / MANIFEST
    atomic_write_json(manifest, info)
    return manifest


def _manifest(folder: pathlib.Path) -> dict:
    manifest = folder / MANIFEST
    try:
        info = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{manifest} is not a readable saved model ({type(e).__name__}: {e})."
        ) from None
    if info.get("format") not in _READS:
        raise ValueError(
            f"{manifest} has format {info.get('format')!r}; this version of workbench reads "
            f"{' and '.join(map(repr, _READS))}."
        )
    if info["format"] != _READS[0] and info.get("structure_sha256") != structure_sha256(
        info.get("structure")
    ):
        raise ValueError(
            f"{manifest}: the model's structure does not match its structure_sha256 (the file "
            "was edited or damaged); refused, since the arrays would be read into another model."
        )
    return info


def load_model(folder) -> eqx.Module:
    """The model `save_model` wrote to `folder`, its hashes checked (a damaged or replaced
    data file is a `ValueError` naming it)."""
    folder = pathlib.Path(folder)
    manifest = folder / MANIFEST
    info = _manifest(folder)
    data = folder / info["data"]
    if not data.exists() or _sha256_file(data) != info["data_sha256"]:
        raise ValueError(
            f"{data} is missing or does not match the SHA-256 in {manifest} (damaged or replaced)."
        )
    try:
        like = _decode(info["structure"], "model")
    except ValueError as e:
        raise ValueError(f"{manifest}: {e}") from None
    with open(data, "rb") as f:
        model = eqx.tree_deserialise_leaves(f, like)
    if params_sha256(model) != info["params_sha256"]:
        raise ValueError(f"the parameters read from {data} do not match {manifest}'s hash.")
    return model


def load_run(run_dir) -> eqx.Module:
    r"""The trained model of a training run folder (`train(..., run_dir=DIR)`, or
    `workbench run train-digits --out DIR`): a `ControlledModel` with the scheme and steps per
    layer it was trained to be evaluated at, ready for `rediscretize`. No optimizer state, no
    study code: the folder's `model.json` and `model.eqx` are enough. A folder `save_model`
    wrote loads the same way.

    A folder whose run has not finished, or that holds several trainings (a study that trains
    variants keeps one subfolder each), is a `ValueError` naming what to load instead.
    """
    folder = pathlib.Path(run_dir)
    if not folder.is_dir():
        raise ValueError(f"run_dir={str(run_dir)!r} is not a folder.")
    if (folder / MANIFEST).exists():
        return load_model(folder)
    inner = sorted(p.parent.name for p in folder.glob(f"*/{MANIFEST}"))
    if inner:
        raise ValueError(
            f"{folder} holds {len(inner)} trained models, one per subfolder ({', '.join(inner)}); "
            f"load one of them, e.g. load_run({str(folder / inner[0])!r})."
        )
    if (folder / "checkpoints").is_dir():
        raise ValueError(
            f"{folder} holds checkpoints but no finished model ({MANIFEST}): the run has not "
            "finished; rerun its command to resume it, then load it."
        )
    raise ValueError(f"{folder} is not a training run folder (no {MANIFEST}).")


def run_inputs(run_dir) -> np.ndarray:
    """The example inputs saved with a run's model (`inputs.npy`: the first held-out inputs,
    or training inputs without held-out data), checked against the manifest's hash: what the
    analyses embed as initial states `u(0)` of the trained equation."""
    folder = pathlib.Path(run_dir)
    load_run(folder)  # the same checks and messages as the model's
    info = _manifest(folder)
    if "inputs" not in info:
        raise ValueError(f"{folder / MANIFEST} records no example inputs.")
    path = folder / info["inputs"]
    if not path.exists() or _sha256_file(path) != info["inputs_sha256"]:
        raise ValueError(f"{path} is missing or does not match the SHA-256 in {MANIFEST}.")
    return np.load(path, allow_pickle=False)
