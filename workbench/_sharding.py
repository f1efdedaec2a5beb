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
        if array.is_fully_addressable:
            return np.asarray(array)
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(array, tiled=True))

    def __repr__(self) -> str:
        kind = self.devices[0].platform
        return f"CellMesh({self.size} {kind} devices, {self.num_processes} process(es))"
