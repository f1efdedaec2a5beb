"""Shared test setup: precision, seeded keys and generators (the library never flips x64).

The suite runs in float64 (`jax_enable_x64` on): convergence orders and invariants need it. The
default *user* path is float32 (x64 off), so CI runs a second pass with `WORKBENCH_X64=0 pytest
-m float32`: the tests marked `float32` (recovery at 1e-4, particles, `integrate`, dtypes kept)
then run exactly as a user's first session would.
"""

import os

import jax
import numpy as np
import pytest

try:  # pytest-xdist: `--dist loadfile` that ends, rather than hangs, when a worker crashes
    import xdist  # noqa: F401
except ImportError:
    pass
else:
    from xdist_crash import pytest_xdist_make_scheduler  # noqa: F401

X64 = os.environ.get("WORKBENCH_X64", "1") != "0"
jax.config.update("jax_enable_x64", X64)

# XLA compiles at its default optimization level. The test run compiled at backend level 0 for
# a while (`--xla_backend_optimization_level=0`: 1170 s against 1355 s for the suite, one run
# each), and two of the clean-clone CI runs made with it lost a worker inside XLA: a SIGABRT in
# a compile (2026-12-05) and a segmentation fault (2026-12-06). A run at the default level has
# crashed since, reading the compilation cache (below), which may have been the cause of all
# three; level 0 stays off all the same.

# JAX's persistent compilation cache is off for the test run unless asked for:
# `WORKBENCH_JAX_CACHE=DIR` (or `1` for `build/jax-cache/`) keeps every program there, however
# short its compilation, and the environment variables carry it into the subprocesses the
# tests start. A clean-clone CI run (2026-12-06, 09:56) lost an xdist worker to a segmentation
# fault inside `backend.deserialize_executable`, reading back an entry another process of the
# same run had written (jax 0.10.2, CPU); the entries are zlib streams, so a torn or mixed
# file is an error JAX catches, not a crash: reading an intact executable is what crashed (a
# macOS report against jaxlib 0.9.2 found the same, deserializing one intact entry:
# uwplasma/vmex pull request 142; the cause there, LLVM's recursion on a worker's stack, is not
# established here). Two earlier runs with the cache on lost a
# worker inside XLA as well (a SIGABRT in a compile on 2026-12-05, a segmentation fault on
# 2026-12-06, blamed then on XLA's optimization level 0). Off, the suite compiles more (a
# program used by two processes is compiled twice), which a run that can die is not worth.
# `WORKBENCH_JAX_CACHE=0` is set for the subprocesses too, so the commands they run do not
# open the user's `~/.cache/workbench/jax` either.
_CACHE = os.environ.get("WORKBENCH_JAX_CACHE", "0")
if _CACHE not in ("", "0"):
    if _CACHE == "1":
        _CACHE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "build", "jax-cache")
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
else:
    os.environ["WORKBENCH_JAX_CACHE"] = "0"


# Module-scoped fixtures that compute a whole study at smoke size (seconds to tens of seconds
# each). A test that uses one is marked `slow`: `python -m pytest -m "not slow"` is the fast
# inner loop, and CI runs everything.
STUDY_FIXTURES = frozenset(
    {"results", "orders", "planned", "histograms", "meta", "highdim", "phase", "steps"}
)


# The longest test files, longest first (`--durations=0`, summed per file, 2026-12-05). With
# `-n auto --dist loadfile` a file runs whole on one worker, and the files are handed out in
# collection order: the longest go first, so the run does not end on one worker finishing a
# long file while the others wait (xdist's own order, most tests first, put the notebooks last).
# Only the order changes; a file missing here runs after these, in the usual order.
LONGEST_FILES = (
    "test_control_gradients.py", "test_control.py", "test_notebooks.py",
    "test_trained_weights.py", "test_sharding.py", "test_train_step.py",
    "test_scheme_architectures.py", "test_reference.py", "test_trained_model_analysis.py",
    "test_models.py", "test_diffrax.py", "test_training_studies.py", "test_training_inputs.py",
    "test_particles_sweeps.py", "test_pretrained.py", "test_inference.py",
)  # fmt: skip


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order given here
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    for item in items:
        if STUDY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


@pytest.fixture
def getkey():
    """A fresh, deterministic PRNG key on every call."""
    key = jax.random.key(5678)

    def _getkey():
        nonlocal key
        key, sub = jax.random.split(key)
        return sub

    return _getkey


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
