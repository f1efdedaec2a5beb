"""Training as optimal control: the objective's costs against closed forms, and the trainer's
durability (exact resume after SIGKILL, corrupted checkpoints, changed configs, NaN guard, bad
input), data parallelism and the training studies' command line. The gradients are tested in
test_control_gradients.py."""

import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import workbench as wb
import workbench.control as wbc
from workbench.control._checkpoint import CheckpointManager
from workbench.control._data import batch_indices

from helpers import (
    certificate_dict,
    kill_and_resume,
    require_reference,
    study_cli,
    tiny_data,
    tiny_model,
    train,
    xla_flags,
)

REPO = pathlib.Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------------------------
# Objective
# --------------------------------------------------------------------------------------------


def test_kinetic_cost_is_the_sum_of_squared_residual_updates(getkey):
    """With Lie–Trotter and τ = 1 the kinetic cost is Σ_layers (1/n)‖u_{l+1} − u_l‖² (the
    network's residual updates), computed here from `save_steps` states."""
    model = tiny_model(getkey(), layers=3)
    u = model.embedding(jax.random.normal(getkey(), (4, 4), jnp.float64))
    sol = model.transformer.solve(u, running_cost=wbc.KineticEnergy(0.5).step_cost, save_steps=True)
    states = jnp.concatenate([u[None], sol.us])
    expected = 0.5 * sum(
        float(jnp.sum((states[i + 1] - states[i]) ** 2)) / u.shape[0] for i in range(3)
    )
    assert float(sol.running_cost) == pytest.approx(expected, rel=1e-12)


def test_kinetic_cost_converges_to_the_integral(getkey):
    """(1/n)∫‖u_t‖² dt: Strang steps converge to the same value at second order in τ."""
    model = tiny_model(getkey(), layers=1)
    u = jax.random.normal(getkey(), (5, 8), jnp.float64)
    eq = model.transformer.equation
    cost = wbc.KineticEnergy(1.0).step_cost
    solve = lambda k: wb.integrate(eq, u, wb.schemes.Strang(), num_steps=k, running_cost=cost)
    values = {k: float(solve(k).running_cost) for k in (16, 32, 64, 1024)}
    e = [abs(values[k] - values[1024]) for k in (16, 32, 64)]
    orders = np.log2(np.asarray(e[:-1]) / np.asarray(e[1:]))
    assert np.all(np.abs(orders - 2) < 0.3), orders


def test_control_costs_closed_forms(getkey):
    model = tiny_model(getkey(), layers=3)
    tr = model.transformer
    leaves = []
    for op in tr.equation.operators:
        for c in (op.term, op.projection):
            leaves += jax.tree.leaves(eqx.filter(c.values, eqx.is_inexact_array))
    norm = sum(float(jnp.sum(x**2)) for x in leaves)
    jumps = sum(float(jnp.sum((x[1:] - x[:-1]) ** 2)) for x in leaves)
    assert float(wbc.ControlNorm(0.3)(tr)) == pytest.approx(0.3 * norm, rel=1e-12)
    assert float(wbc.ControlSmoothness(0.2)(tr)) == pytest.approx(0.2 * jumps, rel=1e-12)
    with pytest.raises(ValueError, match=r"KineticEnergy.weight=-1 must be a finite number >= 0"):
        wbc.KineticEnergy(-1)


def test_cross_entropy_ignores_negative_labels():
    logits = jnp.asarray([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    labels = jnp.asarray([0, -1, 1])
    lse = lambda z: float(jnp.log(jnp.sum(jnp.exp(z))))
    expected = ((lse(logits[0]) - 2.0) + (lse(logits[2]) - 1.0)) / 2
    assert float(wbc.CrossEntropy()(logits, labels)) == pytest.approx(expected, rel=1e-12)


def test_patch_embedding_is_a_convolution(getkey):
    emb = wbc.PatchEmbedding((6, 4), 5, kernel_size=2, stride=2, key=getkey(), dtype=jnp.float64)
    x = np.asarray(jax.random.normal(getkey(), (6, 4), jnp.float64))
    tokens = np.asarray(emb(x))
    w = np.asarray(emb.kernel)[0]  # (k, k, d)
    expected = [
        np.einsum("ij,ijd->d", x[2 * a : 2 * a + 2, 2 * b : 2 * b + 2], w)
        for a in range(3)
        for b in range(2)
    ]
    np.testing.assert_allclose(
        tokens[1:], np.asarray(expected) + np.asarray(emb.position)[1:], atol=1e-13
    )
    np.testing.assert_allclose(tokens[0], np.asarray(emb.cls + emb.position[0]), atol=0)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.bfloat16])
def test_random_controls_are_jaxs_plain_draws_bit_for_bit(dtype):
    """`random_transformer` and the embeddings draw `scale * jax.random.normal(key, shape)`
    through a draw of a power-of-two size, at least 4 096, cut on the host
    (`workbench._random.normal`): the same bits, eagerly and under `jit`/`vmap`, and one
    compiled sampler for shapes of one size class."""
    from workbench._random import normal

    key = jax.random.key(11)
    plain = lambda k, shape, scale: scale * jax.random.normal(k, shape, dtype)
    bits = lambda x: (x.dtype, x.shape, np.asarray(x).tobytes())
    for shape, scale in [((2, 16, 16), 0.25), ((3, 5, 7), 3**-0.5), ((65, 32), 0.02), ((1,), 1.0)]:
        assert bits(normal(key, shape, dtype, scale)) == bits(plain(key, shape, scale))
    traced = jax.jit(lambda k: normal(k, (3, 4), dtype, 0.5))(key)
    assert bits(traced) == bits(plain(key, (3, 4), 0.5))
    keys = jax.random.split(key, 3)
    mapped = jax.vmap(lambda k: normal(k, (2, 3), dtype, 0.5))(keys)
    assert bits(mapped) == bits(jax.vmap(lambda k: plain(k, (2, 3), 0.5))(keys))
    # Shapes of up to 4 096 numbers share the one sampler of 4 096: it is not compiled again.
    normal(key, (5, 13), dtype)
    compiled = []
    handler = logging.Handler()
    handler.emit = lambda record: compiled.append(record.getMessage())
    logger = logging.getLogger("jax._src.dispatch")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            for shape in [(6, 12), (2, 40), (100,), (4, 4, 8)]:
                normal(key, shape, dtype, 0.1).block_until_ready()
    finally:
        logger.removeHandler(handler)
    samplers = [m for m in compiled if m.startswith("Finished XLA compilation of jit(_normal)")]
    assert samplers == [], samplers


# --------------------------------------------------------------------------------------------
# Trainer
# --------------------------------------------------------------------------------------------


def _train(model, data, tmp_path=None, **kwargs):
    kwargs.setdefault("steps", 30)
    kwargs.setdefault("batch_size", 8)
    kwargs.setdefault("progress", False)
    return train(model, data, run_dir=tmp_path, **kwargs)


def test_logged_learning_rate_is_the_schedule_or_empty(getkey, rng, tmp_path):
    """Row `s` logs the rate its update used: optax's own warm-up-cosine schedule at `s - 1`
    for the default optimizer; no rate (None, an empty CSV cell) for one without an injected
    learning rate."""
    import optax

    model, data = tiny_model(getkey()), tiny_data(rng)
    res = _train(
        model,
        data,
        steps=12,
        log_every=1,
        optimizer=wbc.default_optimizer(1e-2, steps=12, warmup=4),
    )
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 4, 12, 1e-2 * 0.01)
    want = [float(schedule(r["step"] - 1)) for r in res.history]
    np.testing.assert_allclose([r["learning_rate"] for r in res.history], want, rtol=1e-6)
    plain = _train(model, data, tmp_path, steps=3, log_every=1, optimizer=optax.sgd(0.1))
    assert [r["learning_rate"] for r in plain.history] == [None, None, None]
    header, *rows = (tmp_path / "metrics.csv").read_text().splitlines()
    column = header.split(",").index("learning_rate")
    assert [row.split(",")[column] for row in rows] == ["", "", ""]


def test_training_reduces_the_loss_and_resume_is_exact(getkey, rng, tmp_path):
    model = tiny_model(getkey())
    data = tiny_data(rng)
    full = _train(
        model,
        data,
        steps=40,
        log_every=5,
        optimizer=wbc.default_optimizer(1e-2, steps=40, warmup=5),
    )
    losses = [r["loss"] for r in full.history]
    assert losses[-1] < 0.7 * losses[0]
    # The same run in two pieces: stop after 20 steps (a checkpoint at 20), resume to 40.
    opt = wbc.default_optimizer(1e-2, steps=40, warmup=5)
    part = _train(model, data, tmp_path, steps=40, log_every=5, optimizer=opt, checkpoint_every=10)
    assert part.params_sha256 == full.params_sha256
    ck = CheckpointManager(tmp_path / "checkpoints", fingerprint={})
    assert ck.steps()[0] == 40
    # Delete the newest checkpoint: a rerun restarts from 30 and finishes identically,
    # with exactly one metrics row per logged step.
    for p in (tmp_path / "checkpoints").glob("step-00000040.*"):
        p.unlink()
    again = _train(model, data, tmp_path, steps=40, log_every=5, optimizer=opt, checkpoint_every=10)
    assert again.resumed_from == 30
    assert again.params_sha256 == full.params_sha256
    steps = [r["step"] for r in again.history]
    assert steps == list(range(5, 41, 5))
    with open(tmp_path / "metrics.csv") as f:
        rows = f.read().strip().splitlines()
    assert [int(r.split(",")[0]) for r in rows[1:]] == list(range(5, 41, 5))
    np.testing.assert_allclose([r["loss"] for r in again.history], losses, rtol=0, atol=0)


def test_corrupted_checkpoint_falls_back_to_the_previous_one(getkey, rng, tmp_path):
    model = tiny_model(getkey())
    data = tiny_data(rng)
    full = _train(model, data, steps=30)
    _train(model, data, tmp_path, steps=30, checkpoint_every=10)
    newest = tmp_path / "checkpoints" / "step-00000030.eqx"
    raw = bytearray(newest.read_bytes())
    raw[-5] ^= 0xFF
    newest.write_bytes(bytes(raw))
    with pytest.warns(
        UserWarning, match=r"checkpoint of step 30 .* does not match the manifest's SHA-256"
    ):
        again = _train(model, data, tmp_path, steps=30, checkpoint_every=10)
    assert again.resumed_from == 20
    assert again.params_sha256 == full.params_sha256


def test_resume_with_another_config_is_refused(getkey, rng, tmp_path):
    model = tiny_model(getkey())
    data = tiny_data(rng)
    _train(model, data, tmp_path, steps=10, fingerprint={"learning_rate": 0.01, "seed": 0})
    with pytest.raises(wbc.CheckpointMismatch, match=r"learning_rate: 0.01 -> 0.02"):
        _train(model, data, tmp_path, steps=10, fingerprint={"learning_rate": 0.02, "seed": 0})


def test_nan_guard_names_the_step_and_keeps_good_checkpoints(getkey, rng, tmp_path):
    model = tiny_model(getkey())
    data = tiny_data(rng)
    x = data.inputs.copy()
    bad = batch_indices(0, 13, len(x), 2)[0]  # batch 2: 24 steps per epoch
    x[bad, 0, 0] = np.nan
    first = min(s for s in range(40) if bad in batch_indices(0, s, len(x), 2))
    assert first == 13
    with pytest.raises(
        wbc.TrainingDiverged, match=r"diverged at step 13: .* last good checkpoint is step 10"
    ):
        _train(
            model,
            wbc.Dataset(x, data.targets),
            tmp_path,
            steps=40,
            batch_size=2,
            checkpoint_every=5,
        )
    ck = CheckpointManager(tmp_path / "checkpoints", fingerprint={})
    assert ck.steps() == [10, 5]
    params = eqx.filter(model, eqx.is_inexact_array)
    step, state, _ = ck.restore((params, wbc.default_optimizer(steps=40).init(params)))
    assert step == 10 and all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(state))


def test_bad_training_input_is_refused_before_training(getkey, rng):
    model = tiny_model(getkey())
    data = tiny_data(rng, n=10)
    with pytest.raises(
        ValueError, match=r"batch_size=16 is larger than the training data \(10 examples\)"
    ):
        _train(model, data, batch_size=16)
    with pytest.raises(ValueError, match="not a gradient method"):
        _train(model, data, method="adam")
    with pytest.raises(ValueError, match=r"Dataset: inputs \(3, 2\) and targets \(4,\)"):
        wbc.Dataset(np.zeros((3, 2)), np.zeros(4))


# --------------------------------------------------------------------------------------------
# Data parallel and the command line
# --------------------------------------------------------------------------------------------

_DRIVER = textwrap.dedent(
    """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    sys.path[:0] = {tests!r}
    from test_control import tiny_model, tiny_data
    import workbench.control as wbc
    run_dir, shard = sys.argv[1] or None, sys.argv[2] == "shard"
    with jax.enable_x64(False):
        model = tiny_model(jax.random.key(0), dtype=jnp.float32)
        data = tiny_data(np.random.default_rng(0), n=64, dtype=np.float32)
        res = wbc.train(wbc.TrainStep(wbc.default_optimizer(steps=20)), model, data, steps=20,
                        batch_size=16, log_every=1, progress=False,
                        run_dir=run_dir, checkpoint_every=5, shard_params=shard)
    leaves = [x for x in jax.tree.leaves(res.model) if isinstance(x, jax.Array)]
    sharded = sum(not x.sharding.is_fully_replicated for x in leaves)
    print(json.dumps({{"devices": res.num_devices, "loss": [r["loss"] for r in res.history],
                      "sharded_leaves": sharded, "leaves": len(leaves),
                      "steps": [r["step"] for r in res.history], "resumed_from": res.resumed_from}}))
    """
)


# The driver imports this file's tiny model, and the file imports `helpers` from tests/.
_TEST_PATHS = [str(pathlib.Path(__file__).parent), str(REPO / "tests")]


def _run_driver(devices: int, run_dir="", shard: bool = False) -> dict:
    env = dict(
        os.environ,
        XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"),
        JAX_PLATFORMS="cpu",
    )
    code = _DRIVER.format(tests=_TEST_PATHS)
    done = subprocess.run(
        [sys.executable, "-c", code, str(run_dir), "shard" if shard else "replicate"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def one_device():
    """The driver's run on one device, without a folder: the reference of the multi-device
    tests below, run once for them all."""
    return _run_driver(1)


@pytest.mark.slow
def test_eight_devices_give_the_loss_trajectory_of_one(one_device):
    one, eight = one_device, _run_driver(8)
    assert (one["devices"], eight["devices"]) == (1, 8)
    np.testing.assert_allclose(eight["loss"], one["loss"], rtol=0, atol=1e-5)
    assert eight["sharded_leaves"] == 0


@pytest.mark.slow
def test_parameters_sharded_over_eight_devices_give_the_loss_trajectory_of_one(one_device):
    one, eight = one_device, _run_driver(8, shard=True)
    # Every leaf with an axis divisible by 8 is cut over the devices (d = 8: all weights).
    assert eight["devices"] == 8 and eight["sharded_leaves"] >= eight["leaves"] // 2
    np.testing.assert_allclose(eight["loss"], one["loss"], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_checkpoint_written_on_eight_devices_continues_on_one(tmp_path):
    """Checkpoints hold host arrays: written by a run on 8 devices, the step-10 checkpoint
    restores on 1 device and the next 10 steps give the 8-device run's losses to 1e-6."""
    eight = _run_driver(8, tmp_path)
    assert (eight["devices"], eight["steps"]) == (8, list(range(1, 21)))
    for step in (15, 20):  # keep only the step-10 checkpoint (keep=3: 10, 15, 20)
        for p in (tmp_path / "checkpoints").glob(f"step-{step:08d}.*"):
            p.unlink()
    one = _run_driver(1, tmp_path)
    assert (one["devices"], one["resumed_from"]) == (1, 10)
    assert one["steps"] == list(range(1, 21))  # metrics rows 1..10 kept from the 8-device run
    np.testing.assert_array_equal(one["loss"][:10], eight["loss"][:10])
    np.testing.assert_allclose(one["loss"][10:], eight["loss"][10:], rtol=0, atol=1e-6)


# The same driver as N `jax.distributed` processes on this machine (one CPU device each).
_DISTRIBUTED = (
    textwrap.dedent(
        """
    import sys, jax
    port, n, pid = sys.argv[1:4]
    jax.distributed.initialize(f"localhost:{{port}}", num_processes=int(n), process_id=int(pid))
    sys.argv = [sys.argv[0], *sys.argv[4:]]
    """
    )
    + _DRIVER
)


@pytest.mark.slow
def test_two_processes_with_sharded_parameters_train_and_checkpoint_as_one(tmp_path, one_device):
    """Two `jax.distributed` processes, the parameters cut over both: the one-process losses to
    1e-5, the same on both processes; process 0 alone writes the checkpoints and metrics, and its
    step-10 checkpoint resumes in one process with the two-process losses to 1e-6."""
    from helpers import run_processes

    env = dict(
        os.environ,
        XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=1"),
        JAX_PLATFORMS="cpu",
    )
    code = _DISTRIBUTED.format(tests=_TEST_PATHS)
    outs = run_processes(code, [tmp_path, "shard"], env=env)
    one = one_device
    for out in outs:
        assert out["devices"] == 2 and out["sharded_leaves"] >= out["leaves"] // 2
        np.testing.assert_allclose(out["loss"], one["loss"], rtol=0, atol=1e-5)
        assert out["loss"] == outs[0]["loss"]
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(lines) == 21  # the header and one row per step, written once
    for step in (15, 20):  # keep only the step-10 checkpoint
        for p in (tmp_path / "checkpoints").glob(f"step-{step:08d}.*"):
            p.unlink()
    resumed = _run_driver(1, tmp_path)
    assert (resumed["devices"], resumed["resumed_from"]) == (1, 10)
    np.testing.assert_allclose(resumed["loss"][10:], outs[0]["loss"][10:], rtol=0, atol=1e-6)


def test_train_digits_verdict_follows_the_accuracy():
    import dataclasses

    import studies.training.train_digits as s

    c = s.smoke_config()
    r = s.Results(
        config=c,
        test_accuracy=0.9,
        final_params_sha256="0" * 64,
        baseline_accuracy=0.96,
        num_steps=210,
        resumed_from=0,
        steps_per_second=20.0,
        compile_time_s=6.0,
        wall_time_s=30.0,
        num_devices=1,
        history_steps=np.arange(1),
        history_objective=np.ones(1),
        history_eval_steps=np.arange(1),
        history_eval_accuracy=np.ones(1),
        certificate=None,
    )
    # No certificate: nothing says the network is a discretization of its equation.
    assert s.verdict(r).startswith("No. Held-out accuracy 90.00 % against the target 75.0 %")
    assert "no certificate decided" in s.verdict(r)
    good = dataclasses.replace(r, certificate=certificate_dict(0.002))
    assert s.verdict(good).startswith("Yes. Held-out accuracy 90.00 % against the target 75.0 %")
    assert "accuracy within 0.20 points from 1 to 16 steps per layer" in s.verdict(good)
    worse = dataclasses.replace(good, test_accuracy=0.5)
    assert s.verdict(worse).startswith("No. Held-out accuracy 50.00 %")
    # Accurate, but the accuracy moves by 2 points under refinement: "No", with the spread.
    leaning = dataclasses.replace(r, certificate=certificate_dict(0.02))
    assert s.verdict(leaning).startswith("No. Held-out accuracy 90.00 %")
    assert "moves by 2.00 points under refinement" in s.verdict(leaning)


def test_training_configs_refuse_bad_names_and_foreign_plans(tmp_path):
    """Unknown optimizer / gradient names list the valid ones; a plan made for another model is
    refused before training, naming what differs."""
    import studies.training.train_digits as s
    from studies import ConfigError

    with pytest.raises(
        ConfigError, match=r"gradient='adam' is not allowed; valid choices: 'dto', 'otd', 'msa'"
    ):
        s.Config(gradient="adam")
    with pytest.raises(
        ConfigError, match=r"optimizer='lion' is not allowed; valid choices: 'adamw', 'adam', 'sgd'"
    ):
        s.Config(optimizer="lion")
    with pytest.raises(ConfigError, match=r"batch_size=5000 is not allowed; at most 1347"):
        s.Config(batch_size=5000)
    plan = wb.analysis.DiscretizationPlan(
        method="strang",
        steps_per_layer=2,
        tolerance=1e-4,
        measured_error=1e-5,
        evaluations=0,
        largest_stable_step=1.0,
        step=0.5,
        stable=True,
        model={
            "d": 32,
            "num_layers": 6,
            "num_heads": 4,
            "dim_feedforward": 128,
            "equation": "pre-norm",
        },
    )
    plan.save(tmp_path / "plan.json")
    config = s.Config(plan=str(tmp_path / "plan.json"))
    with pytest.raises(
        ConfigError,
        match=r"was written for another model \(d: plan 32, model 64; num_layers: plan 6, model 4\)",
    ):
        s.compute(config)
    with pytest.raises(ConfigError, match=r"plan=.* is not allowed; a plan.json written by"):
        s.Config(plan=str(tmp_path / "missing.json"))


def test_adjoint_accuracy_verdict_follows_the_orders():
    import dataclasses

    import studies.training.adjoint_accuracy as s

    c = s.smoke_config()
    lie = s.Ladder("lie", 1, [2, 4, 8], [0.2, 0.1, 0.05], 1.0, (0.9, 1.1))
    strang = s.Ladder("strang", 2, [2, 4, 8], [4e-3, 1e-3, 2.5e-4], 2.0, (1.9, 2.1))
    costs = [
        s.Cost("dto", [2, 8], [100, 400], [1e-3, 2e-3], [1.0, 1.0]),
        s.Cost("dto-every-step", [2, 8], [60, 80], [2e-3, 3e-3], [1.0, 1.0]),
    ]
    r = s.Results(c, [lie, strang], costs, 10.0)
    text = s.verdict(r)
    assert text.startswith("Yes.") and "lie 1.00 (expected 1)" in text and "0.20×" in text
    bad = dataclasses.replace(strang, observed_order=1.4)
    assert s.verdict(dataclasses.replace(r, ladders=[lie, bad])).startswith("Partly.")
    none = dataclasses.replace(lie, observed_order=None)
    assert s.verdict(dataclasses.replace(r, ladders=[none, bad])).startswith("No.")


@pytest.mark.slow
def test_train_digits_vit_exports_a_hugging_face_classifier_with_its_accuracy(tmp_path):
    """train-digits with `embedding="vit"` trains the recovered ViT family (a Hugging Face ViT
    with fresh weights) and exports it; Hugging Face's `ViTForImageClassification` holding the
    exported weights has the logits of the trained network (float32, 1e-4) and so the study's
    held-out accuracy."""
    import dataclasses

    import studies.training.train_digits as s

    torch, transformers = require_reference()
    config = dataclasses.replace(
        s.smoke_config(), embedding="vit", epochs=3, certificate_examples=0
    )
    results = s.compute(config, run_dir=tmp_path)
    cfg = json.loads((tmp_path / "vit_for_image_classification.json").read_text())
    with np.load(tmp_path / "vit_for_image_classification.npz", allow_pickle=False) as f:
        weights = {k: torch.from_numpy(f[k]) for k in f.files}
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(**cfg)).eval()
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected and not [k for k in missing if k in dict(hf.named_parameters())]
    test = wbc.digits(config.seed).test
    with torch.inference_mode():
        logits = hf(pixel_values=torch.from_numpy(test.inputs[:, None])).logits.numpy()
    ours = wbc.vit_classifier(wb.architectures.vit_from_hf(weights, cfg), 10)
    ours = eqx.tree_at(
        lambda m: (m.head.weight, m.head.bias),
        ours,
        (
            jnp.asarray(weights["classifier.weight"].numpy().T),
            jnp.asarray(weights["classifier.bias"].numpy()),
        ),
    )
    assert np.max(np.abs(np.asarray(jax.vmap(ours)(jnp.asarray(test.inputs))) - logits)) <= 1e-4
    hf_accuracy = float(np.mean(logits.argmax(1) == test.targets))
    assert abs(hf_accuracy - results.test_accuracy) <= 1 / len(test.targets), (
        hf_accuracy,
        results.test_accuracy,
    )


def _cli(out, *extra, wait=True, jax_cache=None):
    return study_cli(
        "train-digits",
        out,
        "--epochs",
        "2",
        "--d",
        "16",
        "--hidden",
        "32",
        "--warmup",
        "10",
        "--checkpoint-every",
        "10",
        "--certificate-examples",
        "0",
        *extra,
        wait=wait,
        jax_cache=jax_cache,
    )


@pytest.mark.slow
def test_train_digits_resumes_after_sigkill_with_the_same_hash(tmp_path):
    want, got, steps = kill_and_resume(_cli, tmp_path)
    assert 0 < got["resumed_from"] < got["num_steps"]
    assert got["final_params_sha256"] == want["final_params_sha256"]
    assert got["test_accuracy"] == want["test_accuracy"]
    assert (
        steps
        == sorted(set(steps))
        == list(range(10, want["num_steps"] + 1, 10))
        + ([] if want["num_steps"] % 10 == 0 else [want["num_steps"]])
    )
    # The same folder with another learning rate: refused before training, naming the field,
    # and every file as it was (the run folder's lock and run.json, before the checkpoints).
    folder = tmp_path / "killed"
    before = {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    changed = _cli(folder, "--learning-rate", "0.01")
    assert changed.returncode == 2
    from studies.training import train_digits

    was = train_digits.smoke_config().learning_rate
    assert f"another config (learning_rate={was} there, 0.01 now)" in changed.stderr
    # The finished run, rerun: "already complete", its timings and every file kept.
    again = _cli(folder)
    assert again.returncode == 0 and "already complete" in again.stdout
    assert {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()} == before
    assert json.loads((folder / "run.json").read_text())["state"] == "complete"
    assert got["steps_per_second"] > 0 and got["compile_time_s"] > 0
