"""The time grid of a sweep: `save_ts` (any order, multiples of `dt`) turned into a static plan of
blocks of steps between observations, the slot each block writes, and the gather back to the
order of `save_ts`."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._simulate import _grid_index


class _Plan(NamedTuple):
    """The static part of the time grid (hashable: a jit static argument)."""

    block: int  # steps between two observations
    size: int  # number of distinct saved steps
    initial: bool  # whether t = 0 is saved (slot 0)


def _time_plan(owner: str, save_ts, dt: float):
    """The static `_Plan`, the slot of each block `(num_blocks,)`, the gather back to the order of
    `save_ts` `(T,)` and the saved times as an array."""
    ts = np.asarray(save_ts, dtype=np.float64)
    if ts.ndim != 1 or ts.size == 0:
        raise ValueError(
            f"{owner}: save_ts must be a non-empty 1-D array of times; got shape {ts.shape}."
        )
    if not np.all(np.isfinite(ts)) or np.any(ts < -1e-9 * dt):
        raise ValueError(f"{owner}: save_ts must be finite and >= 0; got min {ts.min()!r}.")
    try:
        index = np.array([_grid_index(float(t), dt, "save_ts entry") for t in ts], dtype=np.int64)
    except ValueError as e:
        raise ValueError(f"{owner}: {str(e).removeprefix('simulate: ')}") from None
    unique, inverse = np.unique(index, return_inverse=True)
    # Observe every `block` steps, block = gcd of the saved steps (5 for saves every 0.5 at
    # dt = 0.1); blocks whose end is not saved write to the scratch slot.
    block = int(np.gcd.reduce(unique)) or 1
    num_blocks = int(unique[-1]) // block
    slots = np.full(num_blocks, unique.size, dtype=np.int32)
    later = unique[unique > 0]
    slots[later // block - 1] = np.searchsorted(unique, later)
    plan = _Plan(block=block, size=int(unique.size), initial=bool(unique[0] == 0))
    return plan, slots, inverse.reshape(-1).astype(np.int32), ts
