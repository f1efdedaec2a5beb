"""Worker processes that share the machine's cores (a tour's studies, `studies._run.tour`), and
the garbage collector of the processes that run studies.

Left alone, every worker sizes its thread pools to the whole machine: JAX's CPU backend starts
one compute thread per core it may run on, and NumPy's OpenBLAS and PyTorch's OpenMP do the
same. Two workers on two cores then run four compute threads, which spin while they wait for
work and take turns on the cores: each step costs more CPU and more wall time than with one
thread per core (`benchmarks/README.md`, "The tour's workers"). So each worker gets its share
of the cores, `threads_per_worker`, as joblib's workers do:

- `thread_environment`: `OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS` and `MKL_NUM_THREADS` for the
  processes a pool starts (read when those libraries load, so set before the workers start);
- `start_cpu_backend`: JAX's CPU backend started with that many compute threads. XLA sizes its
  pool to the cores the process may run on when the backend starts (its affinity mask), so
  the worker narrows its mask to its own cores while JAX starts, then gives every thread the
  whole mask back: the pool keeps its size, and the threads go wherever the system has room.

None of this touches a process that is not a worker: `workbench run`, a tour with one job and
a user's own session keep every core for one computation.

`collect_garbage_less_often` is for the command's processes, workers or not: tracing a JAX
program makes many short-lived containers, and with Python's default thresholds the collector
runs a full collection (over every object of jax, torch, matplotlib, ... loaded) every few
programs. Starting a collection after 10 000 new containers instead of 700 collects far less
often, and spends a fraction of the time (`benchmarks/README.md`, "The tour's workers").
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

__all__ = [
    "collect_garbage_less_often",
    "start_cpu_backend",
    "thread_environment",
    "threads_per_worker",
]

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def threads_per_worker(workers: int) -> int:
    """The cores this process may run on, shared among `workers` processes: at least one."""
    return max(1, len(_usable_cores()) // max(1, workers))


def thread_environment(threads: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The thread-count variables of OpenMP, OpenBLAS and MKL, each `threads`, for the ones
    `environ` does not set already (a user's own choice stands)."""
    return {name: str(threads) for name in _THREAD_VARIABLES if name not in environ}


def start_cpu_backend(threads: int, slot: int) -> None:
    """Start JAX's backends in this process with `threads` compute threads on the CPU: the
    cores `[slot · threads, (slot + 1) · threads)` (modulo the usable ones) while it starts,
    then every core again for every thread of the process. Call it before anything else
    starts JAX's backends; later it changes nothing (the pool is made once). Where the affinity
    mask cannot be set (not Linux, or refused) it does nothing: the backend then starts as it
    would have, on first use. A backend that fails to start is left to fail again, with its own
    message, where it is first used."""
    if not (hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")):
        return
    cores = _usable_cores()
    first = (slot * threads) % len(cores)
    mine = (cores + cores)[first : first + min(threads, len(cores))]
    try:
        os.sched_setaffinity(0, mine)
    except OSError:
        return
    try:
        import jax

        jax.devices()
    except Exception:  # noqa: BLE001 - reported by the first computation that needs it
        pass
    finally:
        _every_thread_on(cores)


def _every_thread_on(cores: list[int]) -> None:
    """Let every thread of this process run on `cores` (a thread keeps the mask it was started
    with: the compute threads started above would otherwise stay on the worker's own cores)."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread has ended
            pass


def collect_garbage_less_often() -> None:
    """Let Python's cyclic garbage collector start a collection after 10 000 new container
    objects instead of 700 (the older generations' thresholds unchanged): a process that traces
    many JAX programs then collects about a sixteenth as often, and rarely scans its whole heap.
    Garbage in cycles waits a little longer; nothing else changes."""
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
