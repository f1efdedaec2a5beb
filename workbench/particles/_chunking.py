"""Chunked, asynchronously dispatched mapping over a batch: `chunked_map` runs a (jitted) function
on blocks of the Cartesian product of a few batch axes, padded to full blocks (one compilation),
with a bounded number of chunks in flight and a progress bar, and hands each chunk's host result
to a callback (bounded memory: nothing is stacked)."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .._progress import progress_bar
from .._sharding import CellMesh


def _split(total: int, size: int) -> int:
    """The block size that cuts `total` into `ceil(total / size)` nearly equal blocks."""
    return -(-total // -(-total // size))


def _block(length: int, budget: int, multiple: int) -> int:
    """A block size for an axis of `length` items with about `budget` per block, a multiple of
    `multiple`: the whole axis when it fits; else, among the multiples in `[budget/2, budget]`
    and the nearly-equal cut, the one that pads least (ties: the larger, fewer calls)."""
    up = lambda b: -(-b // multiple) * multiple
    if length <= budget:
        return up(length)
    candidates = {up(_split(length, budget))}
    candidates |= {b for b in range(up(max(1, budget // 2)), budget + 1, multiple)}
    waste = lambda b: -(-length // b) * b - length
    return min(candidates, key=lambda b: (waste(b), -b))


def _block_sizes(lengths: Sequence[int], chunk_size: int, multiple: int = 1) -> list[int]:
    """Block sizes per axis with about `chunk_size` items per block: the last axis takes as many
    as it can (a multiple of `multiple`: one equal shard per device), each earlier axis what
    remains of the budget; blocks are chosen to pad the axes as little as possible."""
    sizes = []
    budget = chunk_size
    for axis, length in enumerate(reversed(lengths)):
        block = _block(length, max(1, budget), multiple if axis == 0 else 1)
        sizes.append(block)
        budget //= block
    return sizes[::-1]


def _pad(a, size: int):
    """`a` with its first entry repeated along the leading axis up to `size` entries."""
    missing = size - a.shape[0]
    if not missing:
        return a
    xp = jnp if isinstance(a, jax.Array) else np
    return xp.concatenate([a, xp.broadcast_to(a[:1], (missing, *a.shape[1:]))])


def _default_chunk_size(item_bytes: int, platform: str) -> int:
    """Items per compiled call from the bytes of per-item arrays and the device platform."""
    if platform == "cpu":
        # About 4 MiB of per-trajectory arrays (the state and the n × n attention matrices)
        # per call: larger batches leave the caches and run slower per step.
        budget, cap = 4 << 20, 1024
    else:  # accelerators want wide batches: about 256 MiB per call
        budget, cap = 256 << 20, 1 << 16
    return int(min(cap, max(8, budget // item_bytes)))


def chunked_map(
    fn: Callable,
    batch: Sequence,
    chunk_size: int,
    consume: Callable[[tuple[slice, ...], np.ndarray], None],
    *,
    mesh: CellMesh,
    in_flight: int | None = None,
    progress: bool | None = None,
    desc: str = "chunks",
) -> None:
    """Apply `fn` to every block of the product of the leading axes of `batch`, chunk by chunk.

    **Arguments:**

    - `fn`: `fn(*blocks) -> result` with one block per array of `batch` (the leading axis cut to
      the block size; the last block padded by repeating the array's first entry), returning an
      array whose leading axes follow the blocks, e.g. `(len(block_0), len(block_1), ...)`. Its
      result is read back only when the chunk is collected: an asynchronously dispatched (e.g.
      `jax.jit`) `fn` runs while the host prepares the next chunk.
    - `batch`: the arrays (NumPy or JAX) whose leading axes are mapped over, outermost first.
    - `chunk_size`: about how many items (entries of the product) per call.
    - `consume`: `consume(where, values)` for every chunk, in order: `where` the slices of the
      chunk along each batch axis, `values` its result on the host (a NumPy array), padding
      removed.
    - `mesh`: the devices each chunk is spread over (one device: `CellMesh([device])`): the
      last batch axis's blocks are a multiple of `mesh.size` and are cut over the devices, the
      other blocks replicated (`fn` is a `jax.shard_map` over the `"cells"` axis, its result cut
      along the last block axis); the result is gathered on every process.
    - `in_flight`: chunks dispatched before waiting for the oldest (default 2).
    - `progress`: show a progress bar over chunks (`None`: unless `WORKBENCH_PROGRESS=0`).
    - `desc`: the progress bar's label.
    """
    workers = in_flight or 2
    lengths = [a.shape[0] for a in batch]
    sizes = _block_sizes(lengths, chunk_size, mesh.size)
    counts = [-(-length // size) for length, size in zip(lengths, sizes)]
    # On the host: each chunk goes to the devices from there.
    padded = [np.asarray(_pad(a, count * size)) for a, count, size in zip(batch, counts, sizes)]
    last = len(batch) - 1

    def place(parts):
        return [mesh.put(part, sharded=axis == last) for axis, part in enumerate(parts)]

    def collect(index, result):
        where = tuple(
            slice(i * size, min((i + 1) * size, length))
            for i, size, length in zip(index, sizes, lengths)
        )
        values = mesh.gather(result)
        consume(where, values[tuple(slice(0, w.stop - w.start) for w in where)])

    blocks = list(itertools.product(*(range(count) for count in counts)))
    pending: collections.deque = collections.deque()
    disable = None if progress is None else not progress
    with progress_bar(len(blocks), desc=desc, disable=disable) as bar:
        for index in blocks:
            parts = [a[i * size : (i + 1) * size] for a, i, size in zip(padded, index, sizes)]
            # Dispatch is asynchronous: the host slices the next chunk while this one runs.
            pending.append((index, fn(*place(parts))))
            while len(pending) >= workers:
                collect(*pending.popleft())
                bar.update()
        while pending:
            collect(*pending.popleft())
            bar.update()
