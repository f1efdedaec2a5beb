"""Validation of study configs: one line naming the field, the bad value and what is allowed.

A study's `Config.__post_init__` calls these checks, so an invalid config never exists: the
command line reports the `ConfigError` (exit code 2) before any folder is made or any compute
starts, and a notebook gets the same message from `Config(...)`.

```python
@dataclasses.dataclass(frozen=True)
class Config:
    num_starts: int = 1024
    betas: tuple[float, ...] = (1.0, 4.0)
    dt: float = 0.1
    t_max: float = 30.0

    def __post_init__(self):
        check_positive(self, "num_starts", "betas", "dt")
        check_multiple(self, "t_max", of="dt")
```
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ConfigError",
    "check",
    "check_choices",
    "check_devices",
    "check_divides",
    "check_multiple",
    "check_nonempty",
    "check_positive",
    "check_range",
    "check_seed",
    "chosen_devices",
    "steps_in",
]


class ConfigError(ValueError):
    """A study config has a value outside its allowed range, or values that do not fit together."""


def _study(config: Any) -> str:
    module = sys.modules.get(type(config).__module__)
    return getattr(module, "NAME", type(config).__qualname__)


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check(config: Any, field: str, ok: bool, allowed: str) -> None:
    """Raise `ConfigError` "`<study>: <field>=<value> is not allowed; <allowed>.`" unless `ok`."""
    if not ok:
        value = getattr(config, field)
        raise ConfigError(f"{_study(config)}: {field}={value!r} is not allowed; {allowed}.")


def check_positive(config: Any, *fields: str, allow_zero: bool = False) -> None:
    """Every named field (a number, or each entry of a tuple) is finite and `> 0` (`>= 0` with
    `allow_zero`)."""
    for field in fields:
        values = _values(getattr(config, field))
        ok = all(
            _is_number(v) and math.isfinite(v) and (v >= 0 if allow_zero else v > 0) for v in values
        )
        what = "finite and >= 0" if allow_zero else "finite and > 0"
        check(config, field, ok, f"every value must be {what}")


def check_range(
    config: Any,
    field: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Every value of `field` lies in the interval from `low` to `high` (closed unless
    `low_open` / `high_open`; a `None` end is unbounded). NaN is never in range."""

    def inside(v: Any) -> bool:
        if not _is_number(v) or math.isnan(v):
            return False
        if low is not None and (v <= low if low_open else v < low):
            return False
        if high is not None and (v >= high if high_open else v > high):
            return False
        return True

    left = "-inf" if low is None else f"{low:g}"
    right = "inf" if high is None else f"{high:g}"
    interval = f"{'(' if low_open or low is None else '['}{left}, {right}{')' if high_open or high is None else ']'}"
    check(
        config,
        field,
        all(inside(v) for v in _values(getattr(config, field))),
        f"allowed range {interval}",
    )


def check_choices(config: Any, field: str, valid: Iterable[Any]) -> None:
    """`field` (or each entry of it, for a tuple) is one of `valid`."""
    valid = list(valid)
    ok = all(v in valid for v in _values(getattr(config, field)))
    check(config, field, ok, "valid choices: " + ", ".join(map(repr, valid)))


def check_nonempty(config: Any, *fields: str) -> None:
    """Each named tuple field has at least one entry."""
    for field in fields:
        check(config, field, len(getattr(config, field)) > 0, "give at least one value")


def steps_in(length: float, dt: float) -> int | None:
    """`round(length / dt)` if `length` is a whole, positive number of steps `dt` (relative
    tolerance 1e-9), else `None`."""
    if not (dt > 0 and math.isfinite(dt) and math.isfinite(length)):
        return None
    k = round(length / dt)
    if k < 1 or abs(k * dt - length) > 1e-9 * max(abs(length), dt):
        return None
    return k


def check_multiple(config: Any, field: str, *, of: str) -> None:
    """Every value of `field` is a whole, positive multiple of the field `of` (e.g. a time that
    must fall on the step grid)."""
    dt = getattr(config, of)
    ok = all(steps_in(v, dt) is not None for v in _values(getattr(config, field)))
    check(config, field, ok, f"every value must be a positive whole multiple of {of}={dt!r}")


def check_divides(config: Any, field: str, *, into: str) -> None:
    """The integer `field` divides the integer field `into` (e.g. a head count dividing the model
    width); the message lists the valid values."""
    value, whole = getattr(config, field), getattr(config, into)
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0 and whole % value == 0
    valid = (
        [k for k in range(1, whole + 1) if whole % k == 0]
        if isinstance(whole, int) and whole > 0
        else []
    )
    check(config, field, ok, f"it must divide {into}={whole!r}; valid: {valid}")


def check_devices(config: Any, field: str = "devices") -> None:
    """`field` is 0 (every visible device) or a count of at most the visible devices. The count
    is only compared when it is not 0, so a config of 0 does not start JAX's backend (which
    `jax.distributed.initialize()` must precede)."""
    check_range(config, field, 0)
    k = getattr(config, field)
    if k:
        import jax

        visible = jax.device_count()
        check(config, field, k <= visible, f"{visible} device(s) are visible")


def chosen_devices(k: int) -> list:
    """The devices a study spreads its cells over: every visible one for `k = 0`, else the first
    `k` of `jax.devices()` (every process's devices after `jax.distributed.initialize()`)."""
    import jax

    return jax.devices()[: k or None]


SEED_MAX = 2**32 - 1
"""The largest seed (32 bits): a bound every consumer of a study's seed accepts with room to
spare — NumPy's and JAX's generators (JAX: at most 2**63 − 1), `seed + 1` and `seed + stage`, and
PyTorch's per-layer `manual_seed(seed · 1000 + i)`."""


def check_seed(config: Any, field: str = "seed") -> None:
    """`field` (an integer, or each entry of a tuple of them) is a whole number in `[0,
    SEED_MAX]`: a negative seed fails `check_range` ("allowed range [0, inf)"), a fractional,
    boolean or too large one fails here, before any folder is made."""
    check_range(config, field, 0)
    ok = all(
        isinstance(v, int) and not isinstance(v, bool) and v <= SEED_MAX
        for v in _values(getattr(config, field))
    )
    check(config, field, ok, f"a seed is a whole number in [0, {SEED_MAX}] (2**32 - 1)")
