"""Checks of scalar arguments, with the house error message.

Every failed check raises one `ValueError` that names the argument (and the function or class it
belongs to, when given), shows the bad value and says what is allowed:

    simulate: num_steps=-1 must be a nonnegative integer.
    CheckpointEvery.every=0 must be a positive integer.
    num_steps=2.5 must be a positive integer (the step is T/num_steps).

A `bool` is never a number here (`True` is an `int` to Python, never a step count to a user).
NumPy scalars are shown by value (`num_steps=0`, not `np.int64(0)`).
"""

import math
from typing import NoReturn

import numpy as np

__all__ = [
    "boolean",
    "finite_float",
    "int_in_range",
    "is_int",
    "is_number",
    "number_in_range",
    "positive_float",
    "positive_int",
]


def is_int(value, *, numpy_ints: bool = True) -> bool:
    """Whether `value` is a Python integer (or a NumPy integer, with `numpy_ints`), not a bool."""
    kinds = (int, np.integer) if numpy_ints else int
    return isinstance(value, kinds) and not isinstance(value, (bool, np.bool_))


def is_number(value, *, numpy_scalars: bool = False) -> bool:
    """Whether `value` is a real Python number (`int` or `float`; with `numpy_scalars` also a
    NumPy integer or floating scalar), not a bool. `float` subclasses such as `np.float64`
    count as Python floats."""
    kinds = (int, float, np.integer, np.floating) if numpy_scalars else (int, float)
    return isinstance(value, kinds) and not isinstance(value, (bool, np.bool_))


def _scalar(value, arrays: bool):
    """With `arrays`, a concrete 0-d NumPy or JAX array as its Python number. Anything else (a
    traced value, a larger array, a non-array) is returned as it is, for the check to refuse."""
    if arrays and hasattr(value, "__array__") and not isinstance(value, np.generic):
        try:
            if np.ndim(value) == 0:
                return np.asarray(value).item()
        except Exception:  # a tracer has no concrete value
            return value
    return value


def _fail(owner: str | None, name: str, value, what: str, hint: str | None) -> NoReturn:
    shown = value.item() if isinstance(value, np.generic) else value
    prefix = f"{owner}: " if owner else ""
    extra = f" ({hint})" if hint else ""
    raise ValueError(f"{prefix}{name}={shown!r} must be {what}{extra}.")


def positive_int(
    name: str,
    value,
    *,
    owner: str | None = None,
    allow_zero: bool = False,
    allow_none: bool = False,
    numpy_ints: bool = True,
    hint: str | None = None,
) -> int | None:
    """`value` as an `int`, if it is an integer `> 0` (`>= 0` with `allow_zero`).

    **Arguments:**

    - `name`: the argument, as the user wrote it (`"num_steps"`, `"CheckpointEvery.every"`).
    - `value`: the value to check.
    - `owner`: the function or class, shown as `owner: name=value ...` (default: none).
    - `allow_zero`: accept 0 ("a nonnegative integer").
    - `allow_none`: accept `None` (returned as is; "None or a positive integer").
    - `numpy_ints`: accept NumPy integers (else Python `int` only).
    - `hint`: what the number means, appended in parentheses.

    **Returns:** `int(value)`, or `None` for an accepted `None`.

    **Raises:** `ValueError` naming `name`, the value and what is allowed; bools are refused.
    """
    if allow_none and value is None:
        return None
    low = 0 if allow_zero else 1
    if not (is_int(value, numpy_ints=numpy_ints) and value >= low):
        what = "a nonnegative integer" if allow_zero else "a positive integer"
        _fail(owner, name, value, f"None or {what}" if allow_none else what, hint)
    return int(value)


def int_in_range(
    name: str,
    value,
    low: int,
    high: int | None = None,
    *,
    owner: str | None = None,
    numpy_ints: bool = True,
    hint: str | None = None,
) -> int:
    """`value` as an `int`, if it is an integer in `[low, high)` (`>= low` without `high`).

    **Arguments:** as `positive_int`; `low` (inclusive) and `high` (exclusive, optional).

    **Returns:** `int(value)`.

    **Raises:** `ValueError` naming `name`, the value and the range ("an integer >= 2", "an
    integer in [0, 3)"); bools are refused.
    """
    ok = is_int(value, numpy_ints=numpy_ints) and value >= low and (high is None or value < high)
    if not ok:
        what = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})"
        _fail(owner, name, value, what, hint)
    return int(value)


def positive_float(
    name: str,
    value,
    *,
    owner: str | None = None,
    allow_zero: bool = False,
    finite: bool = True,
    numpy_scalars: bool = False,
    arrays: bool = False,
    hint: str | None = None,
) -> float:
    """`value` as a `float`, if it is a number `> 0` (`>= 0` with `allow_zero`).

    **Arguments:** as `positive_int`, and

    - `finite`: refuse `inf` (NaN is always refused: it compares false with 0).
    - `numpy_scalars`: accept NumPy integer and floating scalars (`np.float64` is a `float`
      and always accepted).
    - `arrays`: accept concrete 0-d NumPy and JAX arrays too (implies `numpy_scalars`).

    **Returns:** `float(value)`.

    **Raises:** `ValueError` naming `name`, the value and what is allowed ("a finite number
    > 0", "a number >= 0", ...); bools are refused.
    """
    value = _scalar(value, arrays)
    numpy_scalars = numpy_scalars or arrays
    ok = is_number(value, numpy_scalars=numpy_scalars) and (value >= 0 if allow_zero else value > 0)
    if not ok or (finite and not math.isfinite(value)):
        what = ("a finite number" if finite else "a number") + (" >= 0" if allow_zero else " > 0")
        _fail(owner, name, value, what, hint)
    return float(value)


def finite_float(
    name: str,
    value,
    *,
    owner: str | None = None,
    allow_none: bool = False,
    numpy_scalars: bool = False,
    arrays: bool = False,
    hint: str | None = None,
) -> float | None:
    """`value` as a `float`, if it is a finite number (neither NaN nor ±inf).

    **Arguments:** as `positive_float`; `allow_none` accepts `None` (returned as is).

    **Returns:** `float(value)`, or `None` for an accepted `None`.

    **Raises:** `ValueError` naming `name`, the value and "a finite number"; bools are refused.
    """
    if allow_none and value is None:
        return None
    value = _scalar(value, arrays)
    numpy_scalars = numpy_scalars or arrays
    if not (is_number(value, numpy_scalars=numpy_scalars) and math.isfinite(value)):
        what = "None or a finite number" if allow_none else "a finite number"
        _fail(owner, name, value, what, hint)
    return float(value)


def number_in_range(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    include_low: bool = False,
    include_high: bool = False,
    owner: str | None = None,
    numpy_scalars: bool = True,
    arrays: bool = False,
    hint: str | None = None,
) -> float:
    """`value` as a `float`, if it is a number in the interval from `low` to `high`.

    **Arguments:** as `positive_float`, and `low`, `high` (`None`: unbounded on that side; the
    interval is open at a bound unless `include_low` / `include_high`).

    **Returns:** `float(value)`.

    **Raises:** `ValueError` naming `name`, the value and the interval ("a number in (0, 1)",
    "a number in (0, 2]", "a number > 1"); NaN and bools are refused.
    """
    value = _scalar(value, arrays)
    ok = is_number(value, numpy_scalars=numpy_scalars or arrays) and not math.isnan(value)
    if ok and low is not None:
        ok = value >= low if include_low else value > low
    if ok and high is not None:
        ok = value <= high if include_high else value < high
    if not ok:
        if low is not None and high is not None:
            left, right = "[" if include_low else "(", "]" if include_high else ")"
            what = f"a number in {left}{low:g}, {high:g}{right}"
        elif low is not None:
            what = f"a number {'>=' if include_low else '>'} {low:g}"
        elif high is not None:
            what = f"a number {'<=' if include_high else '<'} {high:g}"
        else:
            what = "a number"
        _fail(owner, name, value, what, hint)
    return float(value)


def boolean(name: str, value, *, owner: str | None = None, hint: str | None = None) -> bool:
    """`value` as a `bool`, if it is `True` or `False` (a NumPy bool too; `0` and `1` are not).

    **Raises:** `ValueError` naming `name`, the value and "True or False".
    """
    if not isinstance(value, bool | np.bool_):
        _fail(owner, name, value, "True or False", hint)
    return bool(value)
