"""A trained model as files (`wbc.save_model`, `wbc.load_run`, and `load_model` under it): read back
bit for bit without the code that built it, its hashes checked, nothing executed from the
file."""

import hashlib
import json
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import workbench as wb
import workbench.control as wbc
from workbench.control._checkpoint import params_sha256
from workbench.control._saved_models import load_model, model_structure, run_inputs

from helpers import tiny_data, tiny_model


def _same(a, b):
    la, lb = (
        jax.tree.leaves(eqx.filter(a, eqx.is_array)),
        jax.tree.leaves(eqx.filter(b, eqx.is_array)),
    )
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("kind", ["conv", "vit", "sequence"])
def test_a_saved_model_comes_back_bit_for_bit_and_predicts_the_same(getkey, tmp_path, kind):
    if kind == "conv":
        model = tiny_model(getkey(), scheme=wb.schemes.Strang(), steps_per_layer=3)
        x = jax.random.normal(getkey(), (4, 4), jnp.float64)
    elif kind == "vit":
        vit = wbc.random_vit(
            getkey(),
            image_size=(4, 4),
            patch_size=2,
            d=8,
            num_heads=2,
            num_layers=2,
            hidden=12,
            dtype=jnp.float32,
        )
        model = wbc.interpolate_controls(wbc.vit_classifier(vit, 3))
        x = jax.random.normal(getkey(), (4, 4), jnp.float32)
    else:
        k1, k2 = jax.random.split(getkey())
        model = wbc.ControlledModel(
            wbc.TokenEmbedding(6, 5, 8, key=k1),
            wbc.random_transformer(
                k2, d=8, num_heads=2, num_layers=2, hidden=12, causal=True, activation=wb.terms.relu
            ),
            wbc.SequenceHead(8, 6),
        )
        x = jnp.asarray([1, 2, 3, 0, 5])
    # Values that are not the initial ones (a zero head would hide a mix-up).
    model = jax.tree.map(
        lambda a: (
            a + 0.01 * jnp.arange(a.size, dtype=a.dtype).reshape(a.shape)
            if eqx.is_inexact_array(a)
            else a
        ),
        model,
    )
    wbc.save_model(tmp_path, model)
    back = load_model(tmp_path)
    _same(back, model)
    assert back.transformer.scheme == model.transformer.scheme
    assert back.transformer.steps_per_layer == model.transformer.steps_per_layer
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(model(x)))
    fine = back.rediscretize(wb.schemes.Strang(), 4)
    np.testing.assert_array_equal(
        np.asarray(fine(x)), np.asarray(model.rediscretize(wb.schemes.Strang(), 4)(x))
    )


def test_load_run_returns_the_trained_model_of_a_run_folder(getkey, rng, tmp_path):
    model, data = tiny_model(getkey(), steps_per_layer=2), tiny_data(rng, n=24)
    step = wbc.TrainStep(optax.adam(1e-2))
    result = wbc.train(
        step,
        model,
        data,
        steps=6,
        batch_size=4,
        run_dir=tmp_path,
        checkpoint_every=3,
        progress=False,
    )
    back = wbc.load_run(tmp_path)
    _same(back, result.model)
    assert params_sha256(back) == json.loads((tmp_path / "model.json").read_text())["params_sha256"]
    assert back.transformer.steps_per_layer == 2
    # The first training inputs (no held-out data given) come with it, for the analyses.
    np.testing.assert_array_equal(run_inputs(tmp_path), data.inputs[:8])
    # A finished run called again leaves the files as they are.
    stamp = (tmp_path / "model.eqx").stat().st_mtime_ns
    wbc.train(
        step,
        model,
        data,
        steps=6,
        batch_size=4,
        run_dir=tmp_path,
        checkpoint_every=3,
        progress=False,
    )
    assert (tmp_path / "model.eqx").stat().st_mtime_ns == stamp


def test_an_unfinished_or_damaged_run_is_refused_naming_what_to_do(getkey, rng, tmp_path):
    model, data = tiny_model(getkey()), tiny_data(rng, n=24)
    run = tmp_path / "run"
    wbc.train(
        wbc.TrainStep(optax.sgd(0.1)),
        model,
        data,
        steps=4,
        batch_size=4,
        run_dir=run,
        checkpoint_every=2,
        progress=False,
    )
    (run / "model.json").rename(tmp_path / "model.json")
    with pytest.raises(ValueError, match="the run has not finished"):
        wbc.load_run(run)
    (tmp_path / "model.json").rename(run / "model.json")
    with pytest.raises(ValueError, match="one per subfolder \\(run\\)"):
        wbc.load_run(tmp_path)
    raw = bytearray((run / "model.eqx").read_bytes())
    raw[-1] ^= 1
    (run / "model.eqx").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="does not match the SHA-256"):
        wbc.load_run(run)
    with pytest.raises(ValueError, match="not a training run folder"):
        wbc.load_run(tmp_path / "run" / "checkpoints")


def test_nothing_outside_workbench_is_rebuilt(getkey, tmp_path):
    class Foreign(eqx.Module):
        w: jax.Array

    with pytest.raises(ValueError, match="is not a workbench module"):
        wbc.save_model(tmp_path, Foreign(jnp.ones(2)))
    model = tiny_model(getkey())
    with pytest.raises(ValueError, match=r"model\['f'\]: the function numpy.tanh is not"):
        model_structure({"f": np.tanh})
    wbc.save_model(tmp_path, model)
    info = json.loads((tmp_path / "model.json").read_text())
    info["structure"]["module"] = "os:system"
    _write_with_hash(tmp_path / "model.json", info)
    with pytest.raises(ValueError, match="'os:system' is not a workbench class"):
        load_model(tmp_path)


def _write_with_hash(path, info):
    """`info` written to `path` with a structure hash that matches its (edited) structure: a
    crafted file, which only the name checks can refuse."""
    text = json.dumps(info["structure"], sort_keys=True, separators=(",", ":"))
    info["structure_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    path.write_text(json.dumps(info))


def _entries(spec, key):
    """The dicts of a saved structure that hold `key` ("module" or "function")."""
    if isinstance(spec, dict):
        if key in spec:
            yield spec
        for v in spec.values():
            yield from _entries(v, key)
    elif isinstance(spec, list):
        for v in spec:
            yield from _entries(v, key)


REFUSED = [
    "os:system",
    "workbench.io:os.system",
    "workbench.io:subprocess.run",
    "workbench.control._saved_models:importlib.import_module",
    "workbench.control:load_model.__globals__",
    "workbench.control._models:ControlledModel.__init__.__globals__",
    "workbench.__init__:io",
    "workbench.control._models:<locals>.Hidden",
    "workbench.control._models:jnp.zeros",
    "workbench.io:Path.home",
    "workbench.control:ControlledModel",  # a re-export: the class, but not under its own name
]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished training run's folder (one step), made once for the module."""
    folder = tmp_path_factory.mktemp("run")
    model = tiny_model(jax.random.key(0), steps_per_layer=2)
    data = tiny_data(np.random.default_rng(0), n=8)
    result = wbc.train(
        wbc.TrainStep(optax.sgd(0.1)),
        model,
        data,
        steps=1,
        batch_size=4,
        run_dir=folder,
        progress=False,
    )
    return folder, result.model


@pytest.mark.parametrize("where", ["module", "function"])
@pytest.mark.parametrize("name", REFUSED)
def test_a_name_that_workbench_does_not_define_is_refused(trained_run, tmp_path, where, name):
    """A real run folder's `model.json`, edited to name something outside workbench (directly,
    or through a workbench module's imports or attributes), with a matching structure hash:
    `load_run` refuses it naming the file, the place in the model and the name; the folder as
    written loads, by value."""
    run, trained = trained_run
    _same(wbc.load_run(run), trained)
    shutil.copytree(run, tmp_path, dirs_exist_ok=True)
    info = json.loads((tmp_path / "model.json").read_text())
    entry = next(_entries(info["structure"], where))
    entry[where] = name
    _write_with_hash(tmp_path / "model.json", info)
    with pytest.raises(ValueError) as refused:
        wbc.load_run(tmp_path)
    message = str(refused.value)
    assert str(tmp_path / "model.json") in message
    assert f"{name!r} is not a workbench class or function" in message
    assert "refused" in message
    with pytest.raises(ValueError, match="is not a workbench class or function"):
        load_model(tmp_path)


def test_an_edited_structure_is_refused_and_an_old_manifest_still_loads(getkey, tmp_path):
    """`model.json`'s structure is covered by `structure_sha256`: a changed static field (steps
    per layer, the scheme) is refused naming `model.json`; a manifest of format
    `workbench.model/1` (no structure hash) still loads, by value."""
    model = tiny_model(getkey(), scheme=wb.schemes.Strang(), steps_per_layer=3)
    model = jax.tree.map(
        lambda a: (
            a + 0.01 * jnp.arange(a.size, dtype=a.dtype).reshape(a.shape)
            if eqx.is_inexact_array(a)
            else a
        ),
        model,
    )
    manifest = wbc.save_model(tmp_path, model)
    original = json.loads(manifest.read_text())
    assert original["format"] == "workbench.model/2"
    _same(load_model(tmp_path), model)

    def edited(change):
        info = json.loads(json.dumps(original))
        change(info["structure"])
        manifest.write_text(json.dumps(info))
        with pytest.raises(ValueError, match="model.json: the model's structure does not match"):
            load_model(tmp_path)

    def steps_per_layer(structure):
        transformer = structure["fields"]["transformer"]["fields"]
        assert transformer["steps_per_layer"] == 3
        transformer["steps_per_layer"] = 4

    def scheme(structure):
        (entry,) = [e for e in _entries(structure, "module") if "Strang" in e["module"]]
        entry["module"] = entry["module"].replace("_splitting:Strang", "_splitting:LieTrotter")

    edited(steps_per_layer)
    edited(scheme)
    old = json.loads(json.dumps(original))
    old["format"] = "workbench.model/1"
    del old["structure_sha256"]
    manifest.write_text(json.dumps(old))
    back = load_model(tmp_path)
    _same(back, model)
    assert back.transformer.steps_per_layer == 3
    assert back.transformer.scheme == model.transformer.scheme


@pytest.mark.parametrize(
    "basis",
    [
        wb.PiecewiseConstantBasis(4),
        wb.PiecewiseLinearBasis(2),
        wb.LegendreBasis(2),
        wb.HypernetworkBasis(2, width=6, key=jax.random.key(3), dtype=jnp.float64),
    ],
    ids=["layers", "interpolated", "legendre", "hypernetwork"],
)
def test_a_model_in_every_basis_comes_back_bit_for_bit(getkey, tmp_path, basis):
    """`save_model` / `load_model` (under `wbc.load_run`) for every control basis: the same
    arrays, the same structure (the basis's static fields included) and the same outputs, at
    the saved grid and at another."""
    model = wb.to_basis(tiny_model(getkey(), layers=4, steps_per_layer=3), basis)
    model = jax.tree.map(
        lambda a: (
            a + 0.01 * jnp.sin(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape)
            if eqx.is_inexact_array(a)
            else a
        ),
        model,
    )
    x = jax.random.normal(getkey(), (4, 4), jnp.float64)
    wbc.save_model(tmp_path, model)
    back = load_model(tmp_path)
    _same(back, model)
    np.testing.assert_array_equal(np.asarray(back(x)), np.asarray(model(x)))
    other = lambda m: m.rediscretize(wb.schemes.Strang(), 5)(x)
    np.testing.assert_array_equal(np.asarray(other(back)), np.asarray(other(model)))
