"""Trained models as weights for the analysis studies: `--weights DIR` names a training run's
folder (`workbench run train-digits --out DIR`, or any `wbc.train(..., run_dir=DIR)`), next to
the built-in weight sets (`random`, `recovered`).

The analyses see what training produced: the trained equation (`wbc.load_run`, cast to float64)
and, as the initial state `u(0)`, the first example input saved with the model (a held-out
input where the run had held-out data), embedded by the trained embedding.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.control as wbc
from workbench.control._saved_models import run_inputs

from .config import check


def is_run_folder(value: Any) -> bool:
    """Whether `value` names a folder holding a trained model (`model.json`)."""
    return isinstance(value, str) and (pathlib.Path(value) / "model.json").is_file()


def check_weights(config: Any, field: str, builtin: tuple[str, ...]) -> None:
    """Every entry of `field` is a built-in weight set or a training run folder with its
    trained model; one `ConfigError` naming the bad entry otherwise."""
    values = getattr(config, field)
    for v in values if isinstance(values, tuple) else (values,):
        if v in builtin:
            continue
        why = (
            f"{', '.join(map(repr, builtin))}, or a training run folder holding model.json "
            f"(workbench run train-digits --out DIR); {v!r} is neither"
        )
        if isinstance(v, str) and pathlib.Path(v).is_dir():
            why = f"a finished training run; {v!r} holds no model.json (not finished, or not a run)"
        check(config, field, is_run_folder(v), why)


def trained(folder: str):
    """`(transformer, u0, model)` of a run folder, in float64 (call inside
    `jax.enable_x64(True)`): the trained `Transformer` (its scheme and steps per layer as
    trained), the first saved example input embedded, and the whole `ControlledModel`."""
    from .training import to_float64

    model = to_float64(wbc.load_run(folder))
    if not isinstance(model, wbc.ControlledModel):
        raise ValueError(f"{folder} holds a {type(model).__name__}, not a ControlledModel.")
    inputs = run_inputs(folder)
    x = jnp.asarray(inputs[0])
    if jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float64)
    return model.transformer, model.embedding(x), model


def equation_kind(transformer) -> str:
    """`"pre-norm"` or `"post-norm"`: where the trained equation's constraints act."""
    return "pre-norm" if isinstance(transformer.equation.placement, wb.PreNorm) else "post-norm"


def sizes(folder: str) -> dict:
    """`{"n", "d", "layers", "heads", "hidden", "equation"}` of a run folder's trained model and its first
    example input (in the model's own precision: for sizes only)."""
    model = wbc.load_run(folder)
    u0 = model.embedding(jnp.asarray(np.asarray(run_inputs(folder)[0])))
    tr = model.transformer
    ops = tr.equation.operators
    return {
        "n": int(u0.shape[0]),
        "d": int(u0.shape[1]),
        "layers": tr.num_layers,
        "heads": ops[0].term.values.num_heads,
        "hidden": int(ops[1].term.values.hidden.shape[-1]),
        "equation": equation_kind(tr),
    }


def weights_label(value: str) -> str:
    """A short name of a weight set for tables and file names: a built-in set's own name,
    `trained-<folder name>` for a run folder (letters, digits, `-`, `_` and `.` only)."""
    if not is_run_folder(value):
        return value
    import re

    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", pathlib.Path(value).resolve().name).strip("-.")
    return f"trained-{name or 'run'}"
