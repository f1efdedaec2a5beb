"""Every Python block of the README runs as written, in a fresh interpreter."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: f"block{i}")
def test_readme_block_runs_as_written(index, tmp_path):
    """Each block in a new process (its own JAX state), in an empty folder; it must exit 0.
    The first example's two printed numbers are checked against what it claims."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if "pairs within 1e-3" in BLOCKS[index]:
        lines = dict(line.split(": ") for line in done.stdout.strip().splitlines())
        assert float(lines["network vs its equation"]) > 1e-3  # the network is not its ODE
        assert float(lines["pairs within 1e-3 of each other"]) == 1.0  # one cluster (paper B)
