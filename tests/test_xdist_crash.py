"""The test run's `--dist loadfile` ends, naming the test, when a worker crashes (`xdist_crash.py`).

A small project whose second file kills its worker in its second test (SIGSEGV, or a hang that
pytest's `faulthandler_timeout` ends, as `pyproject.toml` sets it for this suite) runs under
pytest-xdist with the scheduler of `tests/xdist_crash.py`. xdist's own scheduler hangs on it
(the finished first file goes back to the queue as an empty work unit); ours must end within
the time limit, report exactly the crashed test as failed, and run every other test once.
"""

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("xdist", reason="the scheduler is a pytest-xdist plugin")

TESTS = pathlib.Path(__file__).resolve().parent
THREE = "def test_1(): log('1')\ndef test_2(): log('2')\ndef test_3(): log('3')\n"
LOG = """
import os, pathlib

def log(name):
    with open(pathlib.Path(__file__).parent / "ran.txt", "a") as f:
        f.write(f"{pathlib.Path(__file__).stem}::{name}\\n")
"""


KILL = {
    "segfault": "os.kill(os.getpid(), signal.SIGSEGV)",
    "hang": "time.sleep(600)",  # the run below sets faulthandler_timeout=2
}


def _project(root: pathlib.Path, kill: str) -> None:
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from xdist_crash import pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    for name in ("a", "c", "d"):
        (root / f"test_{name}.py").write_text(LOG + THREE)
    (root / "test_b.py").write_text(
        LOG + "import signal, time\n"
        "def test_1(): log('1')\n"
        f"def test_crash(): log('crash'); {KILL[kill]}\n"
        "def test_3(): log('3')\n"
    )


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kill", sorted(KILL))
def test_a_crashed_worker_fails_its_test_and_the_run_goes_on(tmp_path, kill, workers):
    _project(tmp_path, kill)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        str(workers),
        "--dist",
        "loadfile",
        "-rf",
        "-o",
        "faulthandler_timeout=2",
        "-o",
        "faulthandler_exit_on_timeout=true",
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung after the worker crashed (xdist's own scheduler does)")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "1 failed, 11 passed" in out, out[-3000:]
    assert "FAILED test_b.py::test_crash - worker" in out, out[-3000:]
    ran = sorted((tmp_path / "ran.txt").read_text().split())
    expected = sorted(
        [f"test_{f}::{n}" for f in "acd" for n in "123"]
        + ["test_b::1", "test_b::crash", "test_b::3"]
    )
    assert ran == expected  # every test once, the crashed one not again
