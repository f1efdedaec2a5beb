"""Spreading independent cells over devices and processes.

A sweep (β × start × d × ...) is a grid of independent cells. `CellMesh` lays the devices out on
one mesh axis, `"cells"`, and a sweep cuts its cell axis into equal shards, one per device, with
`jax.shard_map`: each device runs its cells with no communication, and the results are gathered
on the host. This is JAX's own runtime, nothing else: a mesh over `jax.devices()` covers every
device of every process once `jax.distributed.initialize()` has run (one controller per host,
each running the same program), and on one process it covers the local devices — one CPU
(`XLA_FLAGS=--xla_force_host_platform_device_count=8` simulates eight), or GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

CELLS = "cells"


def to_host(array: jax.Array) -> np.ndarray:
    """A global array as a host NumPy array on every process. An array with shards on other
    processes' devices (after `jax.distributed.initialize()`) is gathered first: a collective,
    so every process calls this at the same points."""
    if array.is_fully_addressable or array.sharding.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def on_host(tree):
    """The array leaves of `tree` as host NumPy arrays, gathered across processes where sharded
    (`to_host`: a collective, so every process calls this at the same points)."""
    return jax.tree.map(lambda x: to_host(x) if isinstance(x, jax.Array) else x, tree)


class CellMesh:
    """A one-axis mesh (`"cells"`) over `devices` (default: `jax.devices()`, every device of every
    process).

    - `put(value, sharded)`: a host array as a global `jax.Array`, cut along its leading axis over
      the devices (`sharded=True`; the leading axis must be a multiple of `size`) or replicated.
      Every process must pass the same value (each keeps the shards of its own devices).
    - `gather(array)`: a global array back on the host, in full, on every process.
    """

    def __init__(self, devices: Sequence[jax.Device] | None = None):
        devices = list(jax.devices() if devices is None else devices)
        if not devices:
            raise ValueError("devices: got an empty list; pass at least one jax.Device.")
        bad = [d for d in devices if not isinstance(d, jax.Device)]
        if bad:
            raise ValueError(f"devices: {bad[0]!r} is not a jax.Device (see jax.devices()).")
        platforms = sorted({d.platform for d in devices})
        if len(platforms) > 1:
            raise ValueError(f"devices: all must share one platform; got {platforms}.")
        if len(set(devices)) != len(devices):
            raise ValueError("devices: a device is listed twice.")
        self.devices = devices
        self.mesh = Mesh(np.asarray(devices), (CELLS,))

    @property
    def size(self) -> int:
        """The number of devices."""
        return len(self.devices)

    @property
    def num_processes(self) -> int:
        """The number of processes whose devices are in the mesh."""
        return len({d.process_index for d in self.devices})

    def spec(self, sharded: bool) -> PartitionSpec:
        return PartitionSpec(CELLS) if sharded else PartitionSpec()

    def shard_map(self, fn, cells: Sequence[bool], out_axis: int = 0):
        """`jax.shard_map` of `fn` over the mesh: the arguments marked True in `cells` cut along
        their leading axis, the others replicated; every output cut along `out_axis`. No
        collectives inside, so no varying-axis checks (with them, a scan carry created inside
        the function, e.g. a zero buffer, is refused)."""
        return jax.shard_map(
            fn,
            mesh=self.mesh,
            in_specs=tuple(self.spec(c) for c in cells),
            out_specs=PartitionSpec(*([None] * out_axis), CELLS),
            check_vma=False,
        )

    def put(self, value, sharded: bool) -> jax.Array:
        value = np.asarray(value)
        if sharded and value.shape[0] % self.size:
            raise ValueError(
                f"CellMesh.put: leading axis {value.shape[0]} is not a multiple of the "
                f"{self.size} devices."
            )
        sharding = NamedSharding(self.mesh, self.spec(sharded))
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    def gather(self, array: jax.Array) -> np.ndarray:
        return to_host(array)

    # Equal meshes are equal (a static argument of a jitted sweep: one compilation per mesh, not
    # per call).
    def __eq__(self, other) -> bool:
        return isinstance(other, CellMesh) and self.mesh == other.mesh

    def __hash__(self) -> int:
        return hash(self.mesh)

    def __repr__(self) -> str:
        kind = self.devices[0].platform
        return f"CellMesh({self.size} {kind} devices, {self.num_processes} process(es))"


def map_cells(
    fn,
    *,
    cells: Sequence[bool],
    devices: Sequence[jax.Device] | None = None,
    out_axis: int = 0,
):
    """`fn`, already batched over the leading axis of the arguments marked True in `cells` (the
    cell axis, e.g. the starts of a `jax.vmap`), run with those arguments cut over `devices`
    (default `jax.devices()`: every visible device, every process's after
    `jax.distributed.initialize()`) and the others replicated; compiled once.

    The returned function takes the same arguments (NumPy or JAX arrays), pads the cell axis to
    a multiple of the device count (repeating the first cell), and returns `fn`'s outputs as
    NumPy arrays on the host with the padding removed; `out_axis` is the cell axis of every
    output (e.g. 1 for a `(β, start, ...)` result of nested vmaps). Each cell is computed by the
    same program on its own device, so the values are those of one device (to rounding: each
    device compiles the program for its own share of cells). See docs/scale.md.

    **Example:**

    ```python
    run = jax.vmap(lambda beta, x0: wb.particles.simulate(wb.particles.SA(beta), x0, dt=0.1,
                                                          t1=10.0), in_axes=(None, 0))
    final = wb.map_cells(run, cells=(False, True))(4.0, starts)   # (S, n, d), NumPy
    ```
    """
    mesh = CellMesh(devices)
    cells = tuple(bool(c) for c in cells)
    if not any(cells):
        raise ValueError("map_cells: mark at least one argument as a cell axis.")
    compiled = jax.jit(mesh.shard_map(fn, cells, out_axis))

    def call(*args):
        if len(args) != len(cells):
            raise ValueError(f"map_cells: expected {len(cells)} arguments, got {len(args)}.")
        lengths = {np.shape(a)[0] for a, c in zip(args, cells) if c}
        if len(lengths) != 1:
            raise ValueError(f"map_cells: the cell axes have different lengths {sorted(lengths)}.")
        (length,) = lengths
        size = -(-length // mesh.size) * mesh.size
        placed = []
        for a, c in zip(args, cells):
            a = np.asarray(a)
            if c and size > length:
                a = np.concatenate([a, np.broadcast_to(a[:1], (size - length, *a.shape[1:]))])
            placed.append(mesh.put(a, sharded=c))
        out = compiled(*placed)
        take = lambda y: np.take(mesh.gather(y), np.arange(length), axis=out_axis)
        return jax.tree.map(take, out)

    call.mesh = mesh
    return call
