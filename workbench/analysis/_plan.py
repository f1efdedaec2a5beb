r"""A discretization plan: for given controls and a tolerance, the cheapest method and step count
that meet the tolerance, and the largest linearly stable step. Written as JSON by
`workbench run plan`, read back by `DiscretizationPlan.load` (the training loop's input).

The error model is the asymptotic `e(h) ≈ C h^p` fitted on a short ladder of each candidate
(`error_ladder`), which predicts the step count meeting the tolerance; the prediction is then
checked by solving at that count (and refined upward until the measured error meets the
tolerance). The cost is the number of vector-field evaluations of a solve (equal for all inputs
of one shape); wall time is recorded too.
"""

import dataclasses
import json
import math
import os
import pathlib

import diffrax

from .._checks import int_in_range, positive_float
from .._table import Table
from ..io import atomic_write_json
from ..schemes._splitting import SPLITTING_SCHEMES
from ..solvers._table import ODE_SOLVERS

_ODE = diffrax.ODETerm(lambda t, y, args: y)

METHODS: Table = Table(
    "method",
    "method (ODE solver or splitting scheme)",
    {**ODE_SOLVERS, **SPLITTING_SCHEMES},
)
"""The methods a plan or a convergence study chooses from, by name: the registry's ODE solvers and
splitting schemes together (their names are disjoint). Public as `workbench.registry.METHODS`."""

SCHEMA = "workbench.discretization-plan/1"


def declared_order(method) -> int:
    """The order a method declares: a splitting scheme's `order()`, a diffrax solver's
    `order(terms)` for an ODE term."""
    if isinstance(method, diffrax.AbstractSolver):
        return method.order(_ODE)
    return method.order()


@dataclasses.dataclass(frozen=True)
class DiscretizationPlan:
    """The discretization chosen for a model and a tolerance.

    **Fields:**

    - `method`: the method's name (a key of `workbench.registry.METHODS`; `method_object()` is
      the method).
    - `steps_per_layer`: steps per layer (unit piece length) that meet `tolerance`.
    - `tolerance`: the requested max-abs error at `T`.
    - `measured_error`: the error measured at `steps_per_layer` against the reference.
    - `evaluations`: vector-field evaluations of one solve.
    - `largest_stable_step`: the predicted largest linearly stable step of `method` for the
      decaying part of the Jacobian spectra along the trajectory (`inf`: unconstrained).
    - `step`: `piece_length / steps_per_layer`; `stable`: `step ≤ largest_stable_step`.
    - `candidates`: per method considered, the same numbers (for the record).
    - `model`: what the plan was made for: `workbench run plan` records the sizes (`d`, `n`,
      `num_layers`, `num_heads`, `dim_feedforward`), the `equation` (pre-norm or post-norm),
      the feed-forward `activation`, the weights and the error measure. Training checks the
      sizes, equation and activation against its model (a plan without `activation` predates
      the field; every such plan was made with GELU).
    """

    method: str
    steps_per_layer: int
    tolerance: float
    measured_error: float
    evaluations: int
    largest_stable_step: float
    step: float
    stable: bool
    candidates: tuple = ()
    model: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        METHODS.lookup(self.method, field="plan.method")
        int_in_range("plan.steps_per_layer", self.steps_per_layer, 1, numpy_ints=False)
        positive_float("plan.tolerance", self.tolerance, finite=False, numpy_scalars=True)

    def method_object(self):
        """The method, ready for `workbench.integrate(..., method, num_steps=...)`."""
        return METHODS[self.method]

    def num_steps(self, num_layers: int) -> int:
        """The `num_steps` argument of `workbench.integrate` for a model of `num_layers`."""
        return self.steps_per_layer * num_layers

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["candidates"] = list(self.candidates)
        return {"schema": SCHEMA, **d}

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON (atomically)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DiscretizationPlan":
        """Read a plan written by `save` (or by `workbench run plan`: its `plan.json`).

        **Raises:** `ValueError` naming the file, on one line, when it is not a plan: not UTF-8
        JSON, not a JSON object, another schema, missing or unknown fields, invalid values.
        (`OSError` when it cannot be read at all, e.g. missing.)"""
        hint = "expected a plan.json written by `workbench run plan`"
        try:
            data = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise ValueError(f"{path}: not JSON ({type(e).__name__}: {e}); {hint}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a JSON {type(data).__name__}, not a plan object; {hint}")
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path}: schema {data.get('schema')!r} is not {SCHEMA!r}; {hint}")
        data = {k: v for k, v in data.items() if k != "schema"}
        try:
            data["candidates"] = tuple(data.get("candidates", ()))
            data["largest_stable_step"] = float(data["largest_stable_step"])
            if not isinstance(data.get("model", {}), dict):
                raise ValueError(f"model={data['model']!r} must be an object")
            return cls(**data)
        except (KeyError, TypeError, ValueError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"{path}: not a valid plan ({what}); {hint}") from None


def steps_for_tolerance(fit, tolerance: float, piece_length: float, *, safety: float = 0.8) -> int:
    """Steps per layer predicted by `e(h) = C h^p` to reach `safety × tolerance`."""
    positive_float("tolerance", tolerance, finite=False, numpy_scalars=True)
    h = (safety * tolerance / fit.constant) ** (1.0 / fit.order)
    return max(1, math.ceil(piece_length / h - 1e-9))
