"""A run folder belongs to one run: `wbc.train` fingerprints what determines the trajectory and
refuses anything else without touching the old run; corruption falls back to the previous
checkpoint; the training time continues across resumes; the host prepares the next batch while
a step runs; the training studies identify a plan by its contents and check it against the model.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

import workbench.analysis as wba
import workbench.control as wbc
from workbench.control import _callbacks, _checkpoint, _fingerprint, _mesh, _trainer
from workbench.control._tasks import random_shift

from helpers import tiny_data, tiny_model, train

REPO = pathlib.Path(__file__).resolve().parents[3]
STEPS, BATCH, EVERY = 6, 4, 3


def _model(d=8):
    return tiny_model(jax.random.key(0), d=d, layers=1)


def _data():
    return tiny_data(np.random.default_rng(0), n=24)


def _optimizer(learning_rate=1e-2, steps=STEPS):
    return wbc.default_optimizer(learning_rate, steps=steps, warmup=2)


def _train(run_dir, *, model=None, data=None, **kwargs):
    kwargs = {
        "steps": STEPS,
        "batch_size": BATCH,
        "optimizer": _optimizer(),
        "log_every": 1,
        "checkpoint_every": EVERY,
        "fingerprint": {"study": "test"},
        "progress": False,
        **kwargs,
    }
    return train(
        _model() if model is None else model,
        _data() if data is None else data,
        run_dir=run_dir,
        **kwargs,
    )


def _snapshot(folder: pathlib.Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 6-step run (checkpoints at 3 and 6, a metrics row per step) and its result."""
    folder = tmp_path_factory.mktemp("finished")
    return folder, _train(folder)


# --------------------------------------------------------------------------------------------
# 1, 2. The library's fingerprint; a mismatch refused with the old run untouched
# --------------------------------------------------------------------------------------------

# Each change as a function, so that nothing is built while the module is collected (the
# float32 pass collects it with x64 off).
CHANGES = {
    "batch size": (lambda: {"batch_size": 2}, r"trainer\.batch_size: 4 -> 2"),
    "seed": (lambda: {"seed": 1}, r"trainer\.seed: 0 -> 1"),
    "steps": (lambda: {"steps": 7}, r"trainer\.steps: 6 -> 7"),
    "learning rate": (
        lambda: {"optimizer": _optimizer(2e-2)},
        r"trainer\.optimizer\.arguments\.default_optimizer\.learning_rate: 0\.01 -> 0\.02",
    ),
    "optimizer": (lambda: {"optimizer": optax.sgd(0.1)}, r"trainer\.optimizer\.state"),
    "width": (
        lambda: {"model": _model(d=12)},
        r"trainer\.model\.embedding\.bias: 'float64\[8\]' -> 'float64\[12\]'",
    ),
    "objective": (
        lambda: {"objective": wbc.Objective(kinetic=wbc.KineticEnergy(0.1))},
        r"trainer\.objective\.kinetic: None -> ",
    ),
    "caller's fingerprint": (
        lambda: {"fingerprint": {"study": "other"}},
        r"fingerprint\.study: 'test' -> 'other'",
    ),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_another_run_on_the_folder_is_refused_and_the_old_run_kept(finished, change):
    """Each change of what determines the trajectory raises `CheckpointMismatch` naming the
    field with its old and new value; every file of the old run stays byte for byte."""
    folder, _ = finished
    before = _snapshot(folder)
    make, message = CHANGES[change]
    with pytest.raises(wbc.CheckpointMismatch, match=message) as info:
        _train(folder, **make())
    assert "\n" not in str(info.value) and "new run folder" in str(info.value)
    assert _snapshot(folder) == before


def test_changed_data_contents_are_refused(finished):
    """One input value changed (same size, dtype and shape): the data hash differs."""
    folder, _ = finished
    before = _snapshot(folder)
    data = _data()
    inputs = data.inputs.copy()
    inputs[5, 1, 2] += 1e-3
    with pytest.raises(wbc.CheckpointMismatch, match=r"trainer\.data\.sha256: '[0-9a-f]{64}' ->"):
        _train(folder, data=wbc.Dataset(inputs, data.targets))
    assert _snapshot(folder) == before


def test_a_run_killed_before_its_first_checkpoint_is_refused_too(finished, tmp_path):
    """No checkpoint yet, only `metrics.csv` and the identity written at the start: another
    batch size is refused from `checkpoints/fingerprint.json`, and `metrics.csv` is kept."""
    folder = tmp_path / "run"
    shutil.copytree(finished[0], folder)
    for p in (folder / "checkpoints").glob("step-*"):
        p.unlink()
    before = _snapshot(folder)
    with pytest.raises(wbc.CheckpointMismatch, match=r"trainer\.batch_size: 4 -> 2"):
        _train(folder, batch_size=2)
    assert _snapshot(folder) == before and len(before[pathlib.Path("metrics.csv")]) > 100


def test_checkpoints_without_a_trainer_fingerprint_are_refused(finished, tmp_path):
    """Checkpoints of an older version (no trainer fingerprint in the manifests, no
    `fingerprint.json`) cannot be checked: refused, saying so, nothing changed."""
    folder = tmp_path / "run"
    shutil.copytree(finished[0], folder)
    (folder / "checkpoints" / "fingerprint.json").unlink()
    for manifest in (folder / "checkpoints").glob("step-*.json"):
        info = json.loads(manifest.read_text())
        del info["metadata"]["trainer"]
        manifest.write_text(json.dumps(info))
    before = _snapshot(folder)
    with pytest.raises(wbc.CheckpointMismatch, match=r"record no trainer fingerprint \(written by"):
        _train(folder)
    assert _snapshot(folder) == before


def test_the_fingerprint_is_the_same_in_another_process():
    """The fingerprint holds no object addresses: a fresh process describes the same model,
    optimizer, objective, method, augmentation and data identically (else no run could ever
    resume after a kill)."""
    code = textwrap.dedent(
        """
        import json, sys
        sys.path.insert(0, "tests")
        import jax
        jax.config.update("jax_enable_x64", True)
        import equinox as eqx, numpy as np
        import workbench.control as wbc
        from workbench.control import _fingerprint
        from workbench.control._tasks import random_shift
        from helpers import tiny_data, tiny_model

        model = tiny_model(jax.random.key(0), d=8, layers=1)
        data = tiny_data(np.random.default_rng(0), n=24)
        opt = wbc.default_optimizer(1e-2, steps=6, warmup=2)
        state = opt.init(eqx.filter(model, eqx.is_inexact_array))
        step = wbc.TrainStep(opt, augment=random_shift(1))
        fp = _fingerprint.run_fingerprint(model, data, train_step=step, opt_state=state,
                                          seed=0, batch_size=4, steps=6)
        print(json.dumps(fp))
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    import equinox as eqx

    model, opt = _model(), _optimizer()
    here = _fingerprint.run_fingerprint(
        model,
        _data(),
        train_step=wbc.TrainStep(opt, augment=random_shift(1)),
        opt_state=opt.init(eqx.filter(model, eqx.is_inexact_array)),
        seed=0,
        batch_size=4,
        steps=6,
    )
    assert child == json.loads(json.dumps(here))
    assert child["augment"] == {
        "function": "workbench.control._tasks.random_shift.<locals>.augment",
        "closure": {"max_shift": 1},
    }


def test_structure_mismatch_is_refused_and_corruption_falls_back(tmp_path):
    """`CheckpointManager.restore`: a state with fewer leaves (which equinox would read without
    complaint) or another shape raises `CheckpointMismatch` and changes nothing; a truncated
    newest data file is corruption: a warning and the previous checkpoint."""
    manager = _checkpoint.CheckpointManager(tmp_path, fingerprint={"run": 1})
    saved = {1: (np.arange(3.0), np.ones((2, 2))), 2: (np.arange(3.0) + 1, np.ones((2, 2)))}
    for step, state in saved.items():
        manager.save(step, state)
    before = _snapshot(tmp_path)
    with pytest.raises(
        wbc.CheckpointMismatch, match=r"state\[1\]: 'float64\[2,2\]' -> '\(absent\)'"
    ):
        manager.restore((np.zeros(3),))
    with pytest.raises(
        wbc.CheckpointMismatch, match=r"state\[0\]: 'float64\[3\]' -> 'float64\[4\]'"
    ):
        manager.restore((np.zeros(4), np.zeros((2, 2))))
    assert _snapshot(tmp_path) == before
    newest = tmp_path / "step-00000002.eqx"
    newest.write_bytes(newest.read_bytes()[:-7])
    with pytest.warns(UserWarning, match=r"step 2 .* does not match the manifest's SHA-256"):
        step, state, _ = manager.restore((np.zeros(3), np.zeros((2, 2))))
    assert step == 1
    np.testing.assert_array_equal(state[0], saved[1][0])


# --------------------------------------------------------------------------------------------
# 3. Cumulative training time
# --------------------------------------------------------------------------------------------


def test_training_time_continues_across_a_resume(finished, tmp_path):
    """Kill after step 3 (the step-6 checkpoint removed), resume: `elapsed_s` never decreases;
    the resumed process's first step (its compilation) adds no time, so row 4 repeats row 3's
    time, which is the step-3 checkpoint's; the first run's compile time is kept; the throughput
    is the run's timed steps (6 - 2 first steps) over its final `elapsed_s`. Called once more
    (nothing left), the stored timings come back."""
    folder = tmp_path / "run"
    shutil.copytree(finished[0], folder)
    first = finished[1]
    for p in (folder / "checkpoints").glob("step-00000006.*"):
        p.unlink()
    manifest = json.loads((folder / "checkpoints" / "step-00000003.json").read_text())
    resumed = _train(folder)
    assert resumed.resumed_from == 3 and resumed.params_sha256 == first.params_sha256
    elapsed = np.asarray([r["elapsed_s"] for r in resumed.history])
    assert [r["step"] for r in resumed.history] == list(range(1, STEPS + 1))
    assert np.all(np.diff(elapsed) >= 0) and elapsed[-1] > 0
    assert elapsed[2] == manifest["metadata"]["train_seconds"] == elapsed[3]
    assert resumed.compile_time_s == first.compile_time_s == manifest["metadata"]["compile_time_s"]
    assert resumed.steps_per_second * elapsed[-1] == pytest.approx(STEPS - 2, rel=1e-12)
    rows = (folder / "metrics.csv").read_text().splitlines()[1:]
    column = _callbacks.METRICS.index("elapsed_s")
    np.testing.assert_allclose([float(r.split(",")[column]) for r in rows], elapsed, rtol=1e-15)
    from studies._toolkit import training as T

    np.testing.assert_array_equal(T.curve(resumed)["seconds"], elapsed)
    again = _train(folder)
    assert again.resumed_from == STEPS and again.params_sha256 == first.params_sha256
    assert again.steps_per_second == resumed.steps_per_second > 0
    assert again.compile_time_s == first.compile_time_s > 0
    assert again.history == resumed.history


# --------------------------------------------------------------------------------------------
# 4. The next batch is prepared while the step runs
# --------------------------------------------------------------------------------------------


def test_the_next_batch_is_prepared_before_waiting_for_the_step(monkeypatch):
    """The order of the host's work: batch s+1 is gathered and placed after step s is
    dispatched and before the host waits for step s's result; the parameters equal those of
    a step-by-step reference loop (optax on the same batches)."""
    events = []
    real_batch = _mesh.batch_indices
    real_wait = _trainer._finite_on_host

    def batch(seed, step, n, size):
        events.append(("batch", int(step)))
        return real_batch(seed, step, n, size)

    def wait(flag):
        events.append(("wait", sum(e[0] == "wait" for e in events)))
        return real_wait(flag)

    monkeypatch.setattr(_mesh, "batch_indices", batch)
    monkeypatch.setattr(_trainer, "_finite_on_host", wait)
    steps = 4
    result = train(
        _model(), _data(), steps=steps, batch_size=BATCH, optimizer=optax.sgd(0.1), progress=False
    )
    want = [("batch", 0)]
    for s in range(steps):
        want += ([("batch", s + 1)] if s + 1 < steps else []) + [("wait", s)]
    assert [e for e in events if e[0] in ("batch", "wait")] == want

    import equinox as eqx

    model, data = _model(), _data()
    params, static = eqx.partition(model, eqx.is_inexact_array)
    opt = optax.sgd(0.1)
    state = opt.init(params)
    for s in range(steps):
        idx = real_batch(0, s, len(data), BATCH)
        grads = jax.grad(
            lambda p: wbc.Objective()(eqx.combine(p, static), data.inputs[idx], data.targets[idx])[
                0
            ]
        )(params)
        updates, state = opt.update(grads, state, params)
        params = eqx.apply_updates(params, updates)
    trained = eqx.filter(result.model, eqx.is_inexact_array)
    for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(params)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# 5. The plan: by contents, checked against the model, refused early when not a plan
# --------------------------------------------------------------------------------------------


def _plan(steps_per_layer=2, **model):
    model = {
        "d": 64,
        "num_layers": 4,
        "num_heads": 4,
        "dim_feedforward": 128,
        "equation": "pre-norm",
        "activation": "gelu",
        **model,
    }
    return wba.DiscretizationPlan(
        method="strang",
        steps_per_layer=steps_per_layer,
        tolerance=1e-4,
        measured_error=1e-5,
        evaluations=0,
        largest_stable_step=1.0,
        step=1 / steps_per_layer,
        stable=True,
        model=model,
    )


def test_the_plan_enters_the_fingerprint_by_its_contents(tmp_path):
    """Regenerated at the same path with other steps, the plan changes the study's fingerprint;
    the same plan at another path does not."""
    import studies.training.train_digits as s
    from studies._toolkit import training as T

    path, moved = tmp_path / "plan.json", tmp_path / "moved" / "plan.json"
    _plan(2).save(path)
    before = T.fingerprint(s.Config(plan=str(path)))
    moved.parent.mkdir()
    shutil.copy(path, moved)
    assert T.fingerprint(s.Config(plan=str(moved))) == before
    _plan(3).save(path)
    after = T.fingerprint(s.Config(plan=str(path)))
    changed = wbc._checkpoint.differences(before, after)
    assert changed[0].startswith("plan.sha256: ") and changed[1] == "plan.steps_per_layer: 2 -> 3"
    assert len(changed) == 2


def test_a_plan_for_another_activation_is_refused(tmp_path):
    """A GELU plan (recorded, or recorded by no field: made before the field, always GELU) is
    refused for a ReLU model, naming both; accepted for a GELU model."""
    import studies.training.train_digits as s
    from studies import ConfigError
    from studies._toolkit import training as T

    path = tmp_path / "plan.json"
    _plan().save(path)
    assert T.load_plan(s.Config(plan=str(path))) == _plan()
    with pytest.raises(
        ConfigError, match=r"another model \(activation: plan 'gelu', model 'relu'\)"
    ):
        T.load_plan(s.Config(plan=str(path), activation="relu"))
    legacy = _plan().to_dict()
    del legacy["model"]["activation"]
    path.write_text(json.dumps(legacy))
    with pytest.raises(ConfigError, match=r"activation: plan 'gelu', model 'relu'"):
        T.load_plan(s.Config(plan=str(path), activation="relu"))


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", r"not JSON \(JSONDecodeError: Expecting property name"),
        ("[1, 2]", r"a JSON list, not a plan object"),
        (
            '{"schema": "workbench.discretization-plan/1", "method": "lie"}',
            r"not a valid plan \(missing field 'largest_stable_step'\)",
        ),
    ],
    ids=["not json", "a list", "missing fields"],
)
def test_a_plan_file_that_is_not_a_plan_is_a_config_error(tmp_path, text, reason):
    """The config's validation reads the plan: one line naming the study, the field and the
    file, and why."""
    import studies.training.train_digits as s
    from studies import ConfigError

    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=reason) as info:
        s.Config(plan=str(path))
    message = str(info.value)
    assert message.startswith(f"train-digits: plan={str(path)!r} is not allowed;")
    assert "\n" not in message


ANALYSIS_CHANGES = {
    "train_digits": {"certificate_examples": 0, "target_accuracy": 0.5, "max_spread": 0.02},
    "train_sequence": {"certificate_examples": 0, "target_accuracy": 0.5, "max_spread": 0.02},
    "depth_refinement": {"ladder": (1, 2), "examples": 3, "max_change": 2.5},
    "regularization_cost": {
        "plan_scheme": "lie",
        "tolerance": 0.5,
        "ladder": (1, 3),
        "examples": 3,
        "max_drop": 2.5,
    },
    "msa_vs_gradient": {"window": 3, "max_excess": 0.5},
    "continuous_depth": {
        "certificate_examples": 0,
        "target_accuracy": 0.6,
        "max_spread": 0.02,
        "tolerances": (0.5,),
        "adaptive_solvers": ("bosh3",),
        "adaptive_margin": 0.01,
        "timing_repeats": 2,
    },
    "trained_model_analysis": {
        "certificate_examples": 2,
        "target_accuracy": 0.6,
        "max_spread": 0.02,
        "num_exponents": 3,
        "fine_factor": 4,
        "lyapunov_tolerance": 0.5,
        "tolerance": 0.05,
        "plan_methods": ("lie",),
    },
    "scheme_architectures": {
        "certificate_examples": 0,
        "target_accuracy": 0.6,
        "max_spread": 0.02,
        "timing_repeats": 3,
    },
}


@pytest.mark.parametrize("study", ANALYSIS_CHANGES)
def test_analysis_only_fields_leave_the_study_fingerprint_unchanged(study):
    """Fields read only after training (and the checkpoint interval) do not change the
    fingerprint, so changing them does not block a resume; the learning rate does. The
    fingerprint is JSON as it is."""
    import importlib

    import studies
    from studies._toolkit import training as T

    module = importlib.import_module(studies.STUDIES[study.replace("_", "-")])
    assert set(T.ANALYSIS_FIELDS[T.study_id(module.__name__)]) == set(ANALYSIS_CHANGES[study])
    config = module.smoke_config()
    base = T.fingerprint(config)
    assert json.loads(json.dumps(base)) == base
    for field, value in {**ANALYSIS_CHANGES[study], "checkpoint_every": 7}.items():
        other = dataclasses.replace(config, **{field: value})
        assert getattr(other, field) != getattr(config, field)
        assert T.fingerprint(other) == base, field
    faster = T.fingerprint(dataclasses.replace(config, learning_rate=2 * config.learning_rate))
    assert wbc._checkpoint.differences(base, faster) == [
        f"learning_rate: {config.learning_rate!r} -> {2 * config.learning_rate!r}"
    ]


class _SignalAt(_callbacks.AbstractCallback):
    """Sends `signum` to this process after step `step` (the loop sees it at the next step)."""

    def __init__(self, signum, step):
        self.signum, self.step = signum, step

    def on_start(self, run):
        del run

    def on_log(self, run, row):
        del run, row

    def on_step(self, run):
        if run.done == self.step:
            os.kill(os.getpid(), self.signum)

    def on_end(self, run):
        del run


def _signal_at(monkeypatch, signum, step):
    """`train`'s own callbacks followed by `_SignalAt(signum, step)`."""
    standard = _callbacks.standard_callbacks
    monkeypatch.setattr(
        _trainer,
        "standard_callbacks",
        lambda *a, **k: [*standard(*a, **k), _SignalAt(signum, step)],
    )


@pytest.mark.parametrize("ignored", [False, True])
def test_sigint_stops_a_run_unless_the_process_ignores_it(tmp_path, ignored, monkeypatch):
    """SIGINT after step 2 stops the run after step 3 with a checkpoint there (Ctrl-C), unless
    the process ignores SIGINT (a shell script's background job): then the run trains on to
    its last step, and SIGINT is still ignored afterwards."""
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    _signal_at(monkeypatch, signal.SIGINT, 2)
    try:
        if ignored:
            result = _train(tmp_path)
            assert [row["step"] for row in result.history] == list(range(1, STEPS + 1))
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        else:
            with pytest.raises(KeyboardInterrupt, match="SIGINT after step 3"):
                _train(tmp_path)
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            steps = [
                json.loads(p.read_text())["step"]
                for p in (tmp_path / "checkpoints").rglob("*.json")
                if p.name != "fingerprint.json"
            ]
            assert max(steps) == 3, steps
    finally:
        signal.signal(signal.SIGINT, before)
