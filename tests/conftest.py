"""Shared test setup: precision, seeded keys and generators (the library never flips x64).

The suite runs in float64 (`jax_enable_x64` on): convergence orders and invariants need it. The
default *user* path is float32 (x64 off), so CI runs a second pass with `WORKBENCH_X64=0 pytest
-m float32`: the tests marked `float32` (recovery at 1e-4, particles, `integrate`, dtypes kept)
then run exactly as a user's first session would.
"""

import gc
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

# Each compiled program holds about 17 memory maps of the process (on CPU), JAX keeps every
# program it compiled for the life of the process, and Linux refuses a map past
# `vm.max_map_count` (65 530 by default). An xdist worker that runs half the suite passes that
# limit, and XLA then dies inside whatever it was doing (a SIGABRT or a segmentation fault in a
# compile, or in reading an executable back from the compilation cache).
# `_release_compiled_programs` (below) frees the programs when each test file ends.

# XLA's backend optimization level (LLVM's -O) for the test run: 0, where JAX's default is 3.
# Most programs of the suite are small and run once, so compiling them is most of their cost;
# at level 0 the HLO passes (fusion, simplification) are the same and only the machine code is
# less optimized, so values agree to round-off and the tolerances are the same either way. The
# compile-heavy files (test_train_step, test_models, test_control_gradients) take about a
# quarter less time at level 0 than at the default; the training runs the tests start in
# subprocesses and the notebooks are no slower. The level is not what crashed workers inside
# XLA (the memory maps above are). It goes through `XLA_FLAGS`, so that the subprocesses and
# notebook kernels the tests start use it too; the library, the studies and the benchmarks
# never set it. `WORKBENCH_TEST_XLA_OPT=3` (or an `--xla_backend_optimization_level` in your
# own `XLA_FLAGS`) compiles as a user's session does; CI's float32 pass, the default user path,
# does so. Set before the CPU backend starts.
_OPT = os.environ.get("WORKBENCH_TEST_XLA_OPT", "0")
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), f"--xla_backend_optimization_level={_OPT}"]
    ).strip()

# JAX's persistent compilation cache, for the test run only (the library never sets it): many
# tests compile the same programs (a study's smoke run in-process and again through the command
# line, in a subprocess or another xdist worker), and a program compiled once is read back from
# disk. The environment variables carry it into the subprocesses the tests start. Every program is
# kept, however short its compilation. The key is the program, the jax/jaxlib version and the
# compile options, so a change of code or version compiles afresh. It lives in `build/jax-cache/`
# (`rm -rf` it to empty it; `.ci/run` keeps it in `~/.cache/workbench/jax-ci`, from one CI run
# to the next); `WORKBENCH_JAX_CACHE=DIR` puts it elsewhere, `WORKBENCH_JAX_CACHE=0`
# turns it off (and keeps the commands the tests run out of the user's `~/.cache/workbench/jax`).
_CACHE = os.environ.get("WORKBENCH_JAX_CACHE", "")
if _CACHE != "0":
    if _CACHE in ("", "1"):
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


# The longest test files, longest first (`--durations=0`, summed per file). With
# `-n auto --dist loadfile` a file runs whole on one worker, and the files are handed out in
# collection order: the longest go first, so the run does not end on one worker finishing a
# long file while the others wait (xdist's own order, most tests first, put the notebooks last).
# Only the order changes; a file missing here runs after these, in the usual order.
LONGEST_FILES = (
    "test_control_gradients.py",
    "test_control.py",
    "test_notebooks.py",
    "test_trained_weights.py",
    "test_sharding.py",
    "test_train_step.py",
    "test_scheme_architectures.py",
    "test_reference.py",
    "test_trained_model_analysis.py",
    "test_models.py",
    "test_diffrax.py",
    "test_training_studies.py",
    "test_training_inputs.py",
    "test_particles_sweeps.py",
    "test_pretrained.py",
    "test_inference.py",
)


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


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Free every compiled program when a test file ends: JAX keeps each one for the life of
    the process, and on CPU each holds about 17 memory maps (its code, data and guard pages).
    Linux lets a process have `vm.max_map_count` = 65530 maps; past them `mmap` fails, and
    XLA dies in whatever it was doing: compiling, or reading an executable back. An xdist
    worker runs half the suite in one process, enough to reach the limit (the comment near the
    top of this file); one test file alone stays well under it."""
    yield
    jax.clear_caches()
    gc.collect()
