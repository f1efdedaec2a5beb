"""Run folders as transactions (`studies._run.run_folder`, `workbench run`): the state in `run.json`,
one writer at a time, another study or config refused, a finished run left as it was, Ctrl-C
and SIGTERM recorded as `interrupted` with one line, usage errors before any folder, sizes that
cannot fit refused before compute.

The studies here are small modules written to disk (so subprocesses can import them too); the
reproductions with real studies (phase-diagram) are marked slow."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import studies
from studies._run import cli, harness as _harness, run_folder as _run_folder, tour as _tour

REPO = pathlib.Path(__file__).resolve().parents[2]

_STUDY = '''"""Is the sum of 1..n equal to n(n+1)/2?"""
import dataclasses
import time

NAME = "{name}"
SUMMARY = "Triangular numbers."


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 20
    seconds: float = 0.0
    devices: int = 0
    gib: float = 0.0

    def estimated_peak_bytes(self):
        return int(self.gib * 2**30)


@dataclasses.dataclass(frozen=True)
class Results:
    config: Config
    total: int


def smoke_config():
    return Config(n=10)


def compute(config):
    deadline = time.monotonic() + config.seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return Results(config, sum(range(1, config.n + 1)))


def figures(results):
    return {{}}


def report(results):
    return f"sum = {{results.total}}"


def verdict(results):
    ok = results.total == results.config.n * (results.config.n + 1) // 2
    return ("Yes" if ok else "No") + f". {{results.total}}"
'''

_NAMES = {"tri": "_wb_runfolder_tri", "other": "_wb_runfolder_other"}


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """Two on-disk studies, `tri` and `other`, registered; `PYTHONPATH` for subprocesses."""
    source = tmp_path / "src"
    source.mkdir()
    for name, module in _NAMES.items():
        (source / f"{module}.py").write_text(_STUDY.format(name=name))
    monkeypatch.syspath_prepend(str(source))
    monkeypatch.setattr(studies, "STUDIES", dict(_NAMES))
    return source


def _snapshot(folder: pathlib.Path) -> dict:
    """Every file under `folder` with its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _run(*argv) -> int:
    return cli.main(["run", *map(str, argv)])


def _record(folder) -> dict:
    return json.loads((pathlib.Path(folder) / "run.json").read_text())


@pytest.fixture(autouse=True)
def _sigint_not_ignored():
    """The children these tests interrupt get SIGINT as at a terminal. A test run started as a
    background job inherits SIGINT ignored, and so would its children (Python then never raises
    KeyboardInterrupt); with a handler in this process instead, a child starts with the default
    disposition (handlers are reset by exec, an ignored signal is not)."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, before)


def _subprocess(source, argv, **kwargs) -> subprocess.Popen:
    """`workbench run ...` in a fresh interpreter with the on-disk studies registered."""
    code = (
        "import sys, studies\n"
        f"studies.STUDIES.update({_NAMES!r})\n"
        "from studies._run.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(REPO)])}
    return subprocess.Popen(
        [sys.executable, "-c", code, "run", *map(str, argv)],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _wait_for_state(folder: pathlib.Path, state: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = _run_folder.read_run(folder)
        if record and record.get("state") == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"{folder} never reached state {state!r}")


# --------------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------------


def test_a_complete_run_records_its_state(registry, tmp_path):
    out = tmp_path / "run"
    assert _run("tri", "--n", 24, "--out", out) == 0
    record = _record(out)
    assert record["state"] == "complete" and record["study"] == "tri"
    assert record["command"] == ["workbench", "run", "tri", "--n", "24", "--out", str(out)]
    assert record["config"] == {"n": 24, "seconds": 0.0, "devices": 0, "gib": 0.0}
    # The identity leaves out the device layout; its hash is the canonical JSON's sha256.
    assert record["identity"] == {"n": 24, "seconds": 0.0, "gib": 0.0}
    assert record["identity_sha256"] == _run_folder.fingerprint(record["identity"])
    assert record["verdict"] == "Yes. 300"
    assert record["pid"] == os.getpid() and record["attempts"] == []
    assert record["started_utc"] <= record["ended_utc"] and record["wall_time_s"] >= 0
    env = json.loads((out / "config.json").read_text())["environment"]
    assert record["git_commit"] == env["git_commit"]
    assert record["workbench_version"] == env["packages"]["workbench"]


# --------------------------------------------------------------------------------------------
# another study or config: refused, nothing written; --overwrite replaces
# --------------------------------------------------------------------------------------------


def test_another_config_is_refused_and_the_folder_is_untouched(registry, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run("tri", "--n", 10, "--out", out) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert _run("tri", "--n", 12, "--out", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "holds a run of tri with another config (n=10 there, 12 now), complete" in err[0]
    # A field an identity leaves out (added later, at its default) is named as the default.
    from studies._run.run_folder import _occupied_message

    old = {"study": "tri", "state": "complete", "identity": {"n": 10, "coarse_weight": 2.0}}
    msg = _occupied_message(out, old, "tri", {"n": 10})
    assert "another config (coarse_weight=2.0 there, its default now)" in msg
    assert "--overwrite" in err[0]
    assert _snapshot(out) == before
    # The device layout is not part of the identity: the same run, already complete.
    assert _run("tri", "--n", 10, "--devices", 2, "--out", out) == 0
    assert "already complete" in capsys.readouterr().out
    assert _snapshot(out) == before


def test_another_study_is_refused_then_overwrite_removes_the_old_outputs(
    registry, tmp_path, capsys
):
    out = tmp_path / "run"
    assert _run("tri", "--out", out) == 0
    (out / "old-figure.png").write_bytes(b"\x89PNG stale")
    before = _snapshot(out)
    assert _run("other", "--out", out) == 2
    assert "holds a run of 'tri', complete" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert _run("other", "--n", 5, "--out", out, "--overwrite") == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "report.md",
        "results.json",
        "run.json",
    ]
    assert _record(out)["study"] == "other" and _record(out)["attempts"] == []
    assert json.loads((out / "results.json").read_text())["total"] == 15


def test_a_folder_of_other_files_is_never_a_run_folder(registry, tmp_path, capsys):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    for extra in ((), ("--overwrite",)):
        assert _run("tri", "--out", out, *extra) == 2
        assert "holds files that are not a workbench run ('thesis.tex')" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


# --------------------------------------------------------------------------------------------
# a finished run, rerun
# --------------------------------------------------------------------------------------------


def test_a_finished_run_rerun_changes_nothing(registry, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run("tri", "--n", 7, "--out", out) == 0
    before = _snapshot(out)
    capsys.readouterr()
    assert _run("tri", "--n", 7, "--out", out) == 0
    said = capsys.readouterr().out
    assert f"tri: already complete in {out}" in said and "nothing was run" in said
    assert _snapshot(out) == before  # bytes and modification times
    assert (
        _harness.run_study(studies.get_study("tri"), studies.get_study("tri").Config(n=7), out)
        is None
    )


def test_resume_flag_needs_an_unfinished_run_of_a_resumable_study(registry, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run("tri", "--out", out, "--resume") == 2
    assert "tri cannot resume" in capsys.readouterr().err
    assert not out.exists()
    assert _run("tri", "--out", out, "--resume", "--overwrite") == 2
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# one writer at a time
# --------------------------------------------------------------------------------------------


def test_a_second_process_on_a_locked_folder_stops_at_once(registry, tmp_path):
    out = tmp_path / "run"
    first = _subprocess(registry, ["tri", "--seconds", 60, "--out", out])
    try:
        _wait_for_state(out, "running")
        start = time.monotonic()
        second = _subprocess(registry, ["tri", "--seconds", 60, "--out", out])
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, lines
        assert f"is in use by process {first.pid} on " in lines[0]
        assert "`workbench run tri --seconds 60 --out" in lines[0]
        assert time.monotonic() - start < 60  # it did not wait for the first
        assert _record(out)["pid"] == first.pid and _record(out)["state"] == "running"
    finally:
        first.kill()
        first.communicate()


# --------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_says_one_line_and_is_marked(registry, tmp_path, signum):
    out = tmp_path / "run"
    proc = _subprocess(registry, ["tri", "--seconds", 60, "--out", out])
    try:
        _wait_for_state(out, "running")
        # The "running" line comes just after the folder says so: wait for it, or the signal
        # may arrive in between (and the run then rightly prints only the interrupted line).
        first = proc.stderr.readline()
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    err = first + err
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    record = _record(out)
    assert record["state"] == "interrupted" and record["ended_utc"]
    assert lines[1] == (
        f"tri: interrupted at {record['ended_utc']} after {lines[1].split(' after ')[1].split()[0]}"
        f" s; run folder {out} marked interrupted; rerun the same command to run it again."
    )


_SWALLOWED = """

def compute(config):
    class Collected:
        def __del__(self):  # where a Ctrl-C can land and Python cannot raise it (as in a gc
            raise KeyboardInterrupt  # callback): it prints "Exception ignored in ..." and goes on

    Collected()
    return Results(config, sum(range(1, config.n + 1)))
"""


def test_a_ctrl_c_python_could_not_raise_still_interrupts_the_run(
    registry, tmp_path, capsys, monkeypatch
):
    """A `KeyboardInterrupt` raised in a `__del__` or a garbage-collection callback is not
    lost: no "Exception ignored" text, the run stops after compute with one line, exit 130,
    marked interrupted, no results written; the same command runs it again (and, this compute
    being always interrupted, stops it again)."""
    (registry / "_wb_runfolder_swallow.py").write_text(_STUDY.format(name="swallow") + _SWALLOWED)
    monkeypatch.setitem(studies.STUDIES, "swallow", "_wb_runfolder_swallow")
    out, hook = tmp_path / "run", sys.unraisablehook
    assert _run("swallow", "--out", out) == 130
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err
    assert "marked interrupted; rerun the same command to run it again." in err
    assert _record(out)["state"] == "interrupted"
    assert not (out / "results.json").exists()
    assert sys.unraisablehook is hook  # put back
    assert _run("swallow", "--out", out) == 130
    assert [a["state"] for a in _record(out)["attempts"]] == ["interrupted"]


def test_an_interrupted_run_resumes_with_its_history(registry, tmp_path):
    out = tmp_path / "run"
    proc = _subprocess(registry, ["tri", "--seconds", 0.5, "--out", out])
    # Interrupt it while it runs, then run the same command to the end.
    _wait_for_state(out, "running")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert _run("tri", "--seconds", 0.5, "--out", out) == 0
    record = _record(out)
    assert record["state"] == "complete" and record["resumed"] is True
    assert [a["state"] for a in record["attempts"]] == ["interrupted"]
    assert record["attempts"][0]["wall_time_s"] >= 0


# --------------------------------------------------------------------------------------------
# usage errors: one line, exit 2, no folder
# --------------------------------------------------------------------------------------------


def test_out_that_cannot_be_a_run_folder(registry, tmp_path, capsys):
    a_file = tmp_path / "results.txt"
    a_file.write_text("mine")
    cases = [
        ("", "--out '' is empty"),
        (a_file, "is an existing file, not a folder"),
        (a_file / "sub", "is a file, so the folder cannot be made"),
    ]
    for out, words in cases:
        assert _run("tri", "--out", out) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert a_file.read_text() == "mine"


def test_out_in_a_folder_that_cannot_be_written(registry, tmp_path, capsys):
    if os.geteuid() == 0:  # root writes through permission bits: use a kernel folder
        parent = pathlib.Path("/proc/sys")
        if os.access(parent, os.W_OK | os.X_OK):
            pytest.skip("no folder on this machine is read-only for root")
    else:
        parent = tmp_path / "locked"
        parent.mkdir()
        parent.chmod(0o555)
    out = parent / "run"
    assert _run("tri", "--out", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not writable by this user" in err[0], err
    assert not out.exists()


def test_a_config_that_cannot_fit_is_refused_before_compute(registry, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run("tri", "--gib", 2**20, "--out", out) == 2  # a PiB
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tri: this config needs an estimated 1.0 PiB at its peak" in err[0]
    assert "available" in err[0]
    assert not out.exists()
    available, _ = _run_folder.available_memory_bytes()
    assert 0 < available < 2**50


@pytest.mark.slow
def test_ctrl_c_of_a_real_study_over_a_finished_folder_of_another_seed(tmp_path):
    """The reproduction: phase-diagram seed 0 finished in P; seed 1 there is refused without
    touching it; seed 1 in a fresh folder, Ctrl-C while it computes: one line, exit 130, the
    folder marked interrupted; the same command again finishes it."""
    out = tmp_path / "P"
    cmd = [sys.executable, "-m", "studies", "run", "phase-diagram", "--smoke", "--out", str(out)]
    env = dict(os.environ, WORKBENCH_PROGRESS="0")
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    before = _snapshot(out)
    refused = subprocess.run(
        [*cmd, "--seed", "1"], capture_output=True, text=True, cwd=REPO, env=env, timeout=600
    )
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "another config (seed=0 there, 1 now)" in refused.stderr
    assert _snapshot(out) == before

    other = tmp_path / "P1"
    cmd1 = [*cmd[:-1], str(other), "--seed", "1"]
    proc = subprocess.Popen(
        cmd1, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    _wait_for_state(other, "running")
    time.sleep(1.0)  # inside compute
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert "marked interrupted; rerun the same command to run it again." in err
    assert _record(other)["state"] == "interrupted"
    assert not (other / "results.json").exists()
    done = subprocess.run(cmd1, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert _record(other)["state"] == "complete"
    assert [a["state"] for a in _record(other)["attempts"]] == ["interrupted"]
    # Seeds 0 and 1 give different starts: the two folders hold two different runs.
    r0 = json.loads((out / "results.json").read_text())
    r1 = json.loads((other / "results.json").read_text())
    assert r0["config"]["seed"] == 0 and r1["config"]["seed"] == 1


def test_a_training_studys_identity_leaves_out_what_is_evaluated_after_training():
    module = studies.get_study("train-digits")
    base = module.smoke_config()
    same = dataclasses.replace(base, target_accuracy=0.5, certificate_examples=0, shard_params=True)
    assert _run_folder.run_identity(module, same) == _run_folder.run_identity(module, base)
    other = dataclasses.replace(base, learning_rate=base.learning_rate * 2)
    assert _run_folder.run_identity(module, other) != _run_folder.run_identity(module, base)
    # A study without its own rule: every field but the device layout.
    tri = studies.get_study("phase-diagram")
    config = tri.smoke_config()
    assert _run_folder.run_identity(tri, dataclasses.replace(config, devices=1)) == (
        _run_folder.run_identity(tri, config)
    )


@pytest.mark.slow
@pytest.mark.parametrize("study", ["phase-diagram", "repulsion"])
def test_absurd_sizes_of_real_studies_are_refused(tmp_path, capsys, study):
    out = tmp_path / "run"
    assert (
        cli.main(["run", study, "--smoke", "--num_starts", "1000000000000", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs an estimated" in err[0] and "PiB" in err[0], err
    assert not out.exists()


def test_a_tour_rerun_keeps_its_complete_studies_and_refuses_another_config(registry, tmp_path):
    import io

    out = tmp_path / "tour"
    assert _tour.run_tour(out, registry=_NAMES, stream=io.StringIO()) == 0
    before = _snapshot(out / "tri")
    # The same tour again: every study already complete, its folder byte for byte as it was.
    assert _tour.run_tour(out, registry=_NAMES, stream=io.StringIO()) == 0
    assert _snapshot(out / "tri") == before
    first_time = json.loads((out / "tour.json").read_text())["studies"]["tri"]["wall_time_s"]
    stream = io.StringIO()
    assert _tour.run_tour(out, registry=_NAMES, stream=stream) == 0
    assert _snapshot(out / "tri") == before
    again = json.loads((out / "tour.json").read_text())["studies"]["tri"]
    assert again["verdict"] == "Yes. 55" and again["kept"] is True
    # The kept study's time is the run's (its run.json), not the tour's look at its folder.
    recorded = json.loads((out / "tri" / "run.json").read_text())["wall_time_s"]
    assert again["wall_time_s"] == recorded > 0 and abs(recorded - first_time) < 1.0
    assert f"tri: ok (kept, {recorded:.1f} s earlier)" in stream.getvalue()
    report = (out / "report.md").read_text()
    assert "2 of them complete from an earlier run, not run again" in report
    assert f"not run again (its wall time {recorded:.2f} s)" in report
    # The full configs into the smoke folders: refused per study (one line), nothing changed.
    stream = io.StringIO()
    assert _tour.run_tour(out, registry=_NAMES, full=True, stream=stream) == 1
    assert _snapshot(out / "tri") == before
    assert (
        "RunFolderError" in json.loads((out / "tour.json").read_text())["studies"]["tri"]["error"]
    )
    assert not (out / "tri" / "traceback.txt").exists()


def test_a_closed_output_pipe_ends_the_command_quietly():
    """`workbench run <study> --help | head -1`: no BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "studies", "run", "depth-refinement", "--help"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line, as `head -1` does
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert first.startswith("usage: workbench run depth-refinement")
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_ctrl_c_of_a_parallel_tour_starts_no_further_study(tmp_path):
    """`workbench tour` with 2 jobs and 4 studies of 60 s each: Ctrl-C (SIGINT to the process
    group, as a terminal sends it) while the first two run ends the tour within seconds, exit
    130; the two running studies' folders are marked interrupted and the two queued ones are
    never started (no folder). It runs the command's own exit path (`entry`, which leaves
    through `os._exit`), and Python's resource tracker reports no leaked semaphore."""
    source = tmp_path / "src"
    source.mkdir()
    names = {f"slow{k}": f"_wb_tour_slow_{k}" for k in range(4)}
    for name, module in names.items():
        text = _STUDY.format(name=name).replace("Config(n=10)", "Config(n=10, seconds=60.0)")
        (source / f"{module}.py").write_text(text)
    code = (
        "import sys, studies\n"
        f"studies.STUDIES.update({names!r})\n"
        f"studies.TOUR = {tuple(names)!r}\n"
        "from studies._run.cli import entry\n"
        "entry()\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(source), str(REPO)]),
        "WORKBENCH_JAX_CACHE": "0",
    }
    out = tmp_path / "tour"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "tour", "--out", str(out), "--jobs", "2"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_state(out / "slow0", "running")
        _wait_for_state(out / "slow1", "running")
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=50)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "leaked semaphore" not in err, err
    assert took < 30, took  # the running studies had 50 s left; the queued ones did not start
    assert [_record(out / f"slow{k}")["state"] for k in (0, 1)] == ["interrupted"] * 2
    assert not (out / "slow2").exists() and not (out / "slow3").exists()
