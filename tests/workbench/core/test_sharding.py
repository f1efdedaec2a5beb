"""Cells spread over devices and processes give the numbers of one device.

Oracle: the same computation on one device (float64, exact equality: each cell is computed by the
same program on its own, so no reduction order changes). Several devices are simulated CPU
devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`) in a subprocess, since the test
process's backend is already up; several processes are two `jax.distributed` controllers on
this machine (JAX's CPU collectives, gloo, for the gather).
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from workbench._sharding import CellMesh
from workbench.particles._chunking import _block_sizes

from helpers import run_processes, xla_flags

REPO = Path(__file__).resolve().parents[3]

_SWEEP = textwrap.dedent(
    """
    import json, sys
    import jax
    port, nproc, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if nproc > 1:
        jax.distributed.initialize(f"localhost:{port}", num_processes=nproc, process_id=pid)
    jax.config.update("jax_enable_x64", True)
    import equinox as eqx
    import numpy as np
    from workbench import particles as P
    # 13 starts: not a multiple of 2, 4 or 8 devices (the last block is padded).
    starts = P.random_starts(jax.random.key(0), 13, 16, 8)
    sa = eqx.filter_vmap(P.SA)(jax.numpy.asarray(np.linspace(0.5, 6.0, 5)))
    kw = dict(dt=0.1, save_ts=np.arange(21) * 0.5, per_start=True, progress=False)
    out = {"devices": len(jax.devices()), "processes": jax.process_count(), "runs": {}}
    counts = [len(jax.devices())] if nproc > 1 else [1, 2, 4, len(jax.devices())]
    for k in counts:
        # chunk_size=8: several chunks per diagram, so padding and chunk order are exercised.
        pd = P.phase_diagram(sa, starts, devices=jax.devices()[:k], chunk_size=8, **kw)
        out["runs"][k] = [pd.fraction.tolist(), pd.sem.tolist(), pd.per_start.tolist()]
    if nproc == 1 and len(jax.devices()) == 8:
        from workbench._sharding import CellMesh
        try:
            CellMesh().put(np.zeros(3), sharded=True)
        except ValueError as e:
            out["error"] = str(e)
    print(json.dumps(out))
    """
)


def _env(devices: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", WORKBENCH_PROGRESS="0")
    env["XLA_FLAGS"] = xla_flags(f"--xla_force_host_platform_device_count={devices}")
    return env


def _last_json(stdout: str) -> dict:
    # gloo prints its connection line on stdout: the result is the last line.
    return json.loads(stdout.strip().splitlines()[-1])


def _sweep_one_process(devices: int) -> dict:
    """The sweep driver in one process seeing `devices` CPU devices."""
    done = subprocess.run(
        [sys.executable, "-c", _SWEEP, "0", "1", "0"],
        capture_output=True,
        text=True,
        env=_env(devices),
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return _last_json(done.stdout)


@pytest.mark.slow
def test_eight_simulated_devices_give_the_statistics_of_one():
    out = _sweep_one_process(8)
    assert out["devices"] == 8
    assert out["error"] == "CellMesh.put: leading axis 3 is not a multiple of the 8 devices."
    one = out["runs"]["1"]
    for k in ("2", "4", "8"):
        for got, want in zip(out["runs"][k], one):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=k)
    # Not a degenerate diagram: some cells cluster, some do not yet.
    fraction = np.asarray(one[0])
    assert fraction.min() == 0.0 and fraction.max() > 0.9


@pytest.mark.slow
def test_two_processes_give_the_statistics_of_one_process():
    want = _sweep_one_process(1)["runs"]["1"]

    outs = run_processes(_SWEEP, [], env=_env(1))
    for out in outs:  # every process holds the gathered diagram
        assert (out["devices"], out["processes"]) == (2, 2)
        for got, ref in zip(out["runs"]["2"], want):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_block_sizes_give_every_device_an_equal_shard():
    for lengths, chunk, multiple in [((5, 13), 8, 8), ((90, 1024), 2048, 8), ((3, 7), 100, 2)]:
        sizes = _block_sizes(lengths, chunk, multiple)
        assert sizes[-1] % multiple == 0, (lengths, chunk, multiple, sizes)
        assert sizes[-1] >= min(lengths[-1], multiple)
    # One device: the old cut (nearly equal blocks, the last axis first).
    assert _block_sizes((90, 1024), 256) == [1, 256]
    assert _block_sizes((9, 8), 256) == [9, 8]


def test_cell_mesh_refuses_bad_device_lists():
    with pytest.raises(ValueError, match="devices: got an empty list"):
        CellMesh([])
    with pytest.raises(ValueError, match=r"devices: 'cpu' is not a jax.Device"):
        CellMesh(["cpu"])
    d = jax.devices()[0]
    with pytest.raises(ValueError, match="devices: a device is listed twice"):
        CellMesh([d, d])
    mesh = CellMesh([d])
    x = np.arange(12.0).reshape(3, 4)
    for sharded in (True, False):  # one device: put and gather give the value back
        np.testing.assert_array_equal(mesh.gather(mesh.put(x, sharded=sharded)), x)


def _numbers(tree, path=""):
    """The numeric leaves of a results.json tree, by path (wall times and device counts left
    out)."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            if "wall" in k or k in ("num_devices_used", "environment"):
                continue
            out.update(_numbers(v, f"{path}/{k}"))
        return out
    if isinstance(tree, list):
        out = {}
        for i, v in enumerate(tree):
            out.update(_numbers(v, f"{path}[{i}]"))
        return out
    return {path: tree}


def _study(name: str, out: Path, devices: int, *args: str) -> dict:
    env = _env(devices)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from studies._run.cli import main; sys.exit(main())",
            "run",
            name,
            "--smoke",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """`one_device(name)`: the study's smoke results on one device, computed once per module
    (metastability's serve two tests)."""
    done = {}

    def results(name: str) -> dict:
        if name not in done:
            done[name] = _study(name, tmp_path_factory.mktemp(name) / "one", 1)
        return done[name]

    return results


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, abs_tol",
    [
        ("cluster-histograms", None),
        ("metastability", None),
        ("high-dimension", 1e-12),
        ("step-convergence", 1e-12),
        # Distances between Gram matrices after thousands of RK4 steps: both ~1e-11 (rounding).
        ("repulsion", 1e-10),
    ],
)
def test_studies_over_starts_give_the_numbers_of_one_device(name, abs_tol, one_device, tmp_path):
    """The studies whose starts are a grid of independent cells (`wb.map_cells`) give on 8
    simulated devices the numbers of one: counts and histograms exactly (`abs_tol=None`); the
    continuous deviations, errors, Gram matrices and energies to rounding (rel 1e-9 and
    `abs_tol`: each device compiles the program for its own share of the starts, so XLA may
    order a reduction differently)."""
    one = one_device(name)
    eight = _study(name, tmp_path / "eight", 8)
    assert (one["num_devices_used"], eight["num_devices_used"]) == (1, 8)
    a, b = _numbers(one), _numbers(eight)
    assert a.keys() == b.keys()
    for path, x in a.items():
        y = b[path]
        if abs_tol is None or not isinstance(x, float):
            assert x == y, (path, x, y)
        else:
            assert math.isclose(x, y, rel_tol=1e-9, abs_tol=abs_tol), (path, x, y)


@pytest.mark.slow
def test_a_study_on_the_first_two_of_eight_devices_gives_the_numbers_of_one(one_device, tmp_path):
    """`--devices 2` with 8 visible: the starts go to two devices (recorded), the counts are the
    one-device counts exactly."""
    one = one_device("metastability")
    two = _study("metastability", tmp_path / "two", 8, "--devices", "2")
    assert (one["num_devices_used"], two["num_devices_used"]) == (1, 2)
    a, b = _numbers(one), _numbers(two)
    assert {k for k in a if "devices" in k} == {"/config/devices"}
    assert (a.pop("/config/devices"), b.pop("/config/devices")) == (0, 2)
    assert a == b


@pytest.mark.parametrize(
    "module",
    [
        "phase_diagram",
        "cluster_histograms",
        "metastability",
        "high_dimension",
        "repulsion",
        "step_convergence",
    ],
)
def test_studies_refuse_more_devices_than_visible(module):
    import importlib

    import jax

    from studies._toolkit.config import ConfigError

    mod = importlib.import_module(f"studies.particles.{module}")
    visible = jax.device_count()
    with pytest.raises(ConfigError) as err:
        mod.Config(devices=visible + 1)
    assert str(err.value) == (
        f"{mod.NAME}: devices={visible + 1} is not allowed; {visible} device(s) are visible."
    )
    with pytest.raises(ConfigError, match=r"devices=-1 is not allowed; allowed range \[0, inf\)"):
        mod.Config(devices=-1)
    assert mod.Config(devices=visible).devices == visible


def test_map_cells_equals_the_jitted_function_and_refuses_bad_calls():
    import jax.numpy as jnp

    import workbench as wb

    fn = jax.vmap(lambda a, x: (a * jnp.sin(x), jnp.sum(x**2, axis=-1)), in_axes=(None, 0))
    x = np.random.default_rng(0).standard_normal((5, 3))
    mapped = wb.map_cells(fn, cells=(False, True))
    for got, want in zip(mapped(2.0, x), jax.jit(fn)(2.0, x)):
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, np.asarray(want))
    nested = jax.vmap(fn, in_axes=(0, None))  # (β, cell, ...) out: the cell axis is 1
    got = wb.map_cells(nested, cells=(False, True), out_axis=1)(np.arange(2.0), x)
    np.testing.assert_array_equal(got[1], np.asarray(jax.jit(nested)(np.arange(2.0), x)[1]))
    with pytest.raises(ValueError, match="mark at least one argument as a cell axis"):
        wb.map_cells(fn, cells=(False, False))
    with pytest.raises(ValueError, match="expected 2 arguments, got 1"):
        mapped(x)
    two = wb.map_cells(jax.vmap(lambda x, y: x + y), cells=(True, True))
    with pytest.raises(ValueError, match=r"the cell axes have different lengths \[4, 5\]"):
        two(x, x[:4])
