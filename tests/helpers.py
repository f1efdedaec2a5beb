"""Test helpers: tree comparison, small models, the list of schemes every conformance test runs."""

import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.control as wbc
from workbench.control._certificate import Certificate, RefinementAccuracy

A = wb.architectures

ALL_SCHEMES = (
    wb.schemes.LieTrotter(),
    wb.schemes.Strang(),
    wb.schemes.Yoshida4(),
    wb.schemes.Suzuki4(),
)


def xla_flags(*flags: str) -> str:
    """`XLA_FLAGS` for a subprocess: the test run's own (a user's, kept) followed by `flags`."""
    return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


def max_abs(a, b) -> float:
    return float(jnp.max(jnp.abs(jnp.asarray(a) - jnp.asarray(b))))


def small_encoder(
    rng,
    *,
    d=12,
    heads=3,
    layers=3,
    dff=20,
    norm_first=False,
    activation="relu",
    final_norm=False,
    dtype=np.float64,
):
    sd = A.random_encoder_state_dict(
        rng, d=d, num_layers=layers, dim_feedforward=dff, final_norm=final_norm, dtype=dtype
    )
    m = A.encoder_from_torch(sd, num_heads=heads, norm_first=norm_first, activation=activation)
    return sd, m


SKIP_REFERENCE_VARIABLE = "WORKBENCH_SKIP_REFERENCE"


def require_reference():
    """Import torch and transformers for the reference tests, or fail loudly.

    A missing reference must not pass silently: without the `reference` extra these tests fail,
    unless `WORKBENCH_SKIP_REFERENCE=1` is set, an explicit opt-out that turns them into skips.
    """
    import os

    import pytest

    try:
        import torch
        import transformers
    except ImportError as e:
        if os.environ.get(SKIP_REFERENCE_VARIABLE) == "1":
            pytest.skip(
                f"{SKIP_REFERENCE_VARIABLE}=1: reference tests opted out ({e.name} is missing)",
                allow_module_level=True,
            )
        raise ImportError(
            f"The reference tests compare against PyTorch / Hugging Face, but {e.name} is not "
            "installed: `pip install -e '.[reference]'` (CI installs it), or set "
            f"{SKIP_REFERENCE_VARIABLE}=1 to skip them explicitly."
        ) from e
    return torch, transformers


# --------------------------------------------------------------------------------------------
# A study run through the command line, killed and resumed
# --------------------------------------------------------------------------------------------

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def study_cli(study: str, out, *args: str, wait: bool = True, timeout: float = 900, jax_cache=None):
    """`python -m studies run <study> --smoke --out <out> <args>` from the repository root,
    progress bars off: the finished process (`wait`) or the running one. `jax_cache`: a folder
    for the command's compilation cache (`WORKBENCH_JAX_CACHE`, in place of the test run's;
    default: the test run's)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "studies", "run", study, "--smoke", "--out", str(out), *args]
    env = dict(os.environ, WORKBENCH_PROGRESS="0")
    if jax_cache is not None:
        env = {k: v for k, v in env.items() if not k.startswith("JAX_COMPILATION_CACHE")}
        env["WORKBENCH_JAX_CACHE"] = str(jax_cache)
    if wait:
        return subprocess.run(
            cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
        )
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)


def kill_and_resume(run, folder, *, after_step: int = 20, timeout: float = 600):
    """The durability check of a training study: `run(out, wait=..., jax_cache=...)` launches
    it.

    Runs it uninterrupted in `folder/whole`; starts it again in `folder/killed`, SIGKILLs it as
    soon as a checkpoint of step `>= after_step` exists, and reruns it there to the end. The
    three processes share one compilation cache, `folder/jax-cache`, one after another, as a
    user's commands share theirs: the later two read the training step the first compiled, so
    the resumed run's hash also shows that results do not depend on the cache.
    **Returns:** `(uninterrupted results.json, resumed results.json, metric rows' steps of the
    resumed run)`."""
    import json
    import os
    import signal
    import time

    cache = folder / "jax-cache"
    reference = run(folder / "whole", jax_cache=cache)
    assert reference.returncode == 0, reference.stderr[-3000:]
    want = json.loads((folder / "whole" / "results.json").read_text())
    assert cache.is_dir() and any(cache.iterdir()), "the first run wrote no compilation cache"
    proc = run(folder / "killed", wait=False, jax_cache=cache)
    checkpoints = folder / "killed" / "checkpoints"
    mark = f"step-{after_step:08d}.json"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if checkpoints.exists() and any(p.name >= mark for p in checkpoints.glob("step-*.json")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (folder / "killed" / "results.json").exists()
    resumed = run(folder / "killed", jax_cache=cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = json.loads((folder / "killed" / "results.json").read_text())
    rows = (folder / "killed" / "metrics.csv").read_text().split()[1:]
    return want, got, [int(r.split(",")[0]) for r in rows]


# --------------------------------------------------------------------------------------------
# Tiny controlled models and data for the training tests
# --------------------------------------------------------------------------------------------


def tiny_model(
    key,
    *,
    d=8,
    layers=2,
    scheme=wb.schemes.LieTrotter(),
    steps_per_layer=1,
    dtype=jnp.float64,
    image=(4, 4),
    classes=3,
):
    """A ViT-style controlled model on `image`-sized inputs (2×2 patches, 2 heads)."""
    k1, k2 = jax.random.split(key)
    return wbc.ControlledModel(
        wbc.PatchEmbedding(image, d, kernel_size=2, stride=2, key=k1, dtype=dtype),
        wbc.random_transformer(
            k2,
            d=d,
            num_heads=2,
            num_layers=layers,
            hidden=12,
            scheme=scheme,
            steps_per_layer=steps_per_layer,
            dtype=dtype,
            output_scale=0.5,
        ),
        wbc.ClassifierHead(d, classes, dtype=dtype),
    )


def tiny_data(rng, n=48, image=(4, 4), classes=3, dtype=np.float64):
    """Noise images whose bright row is the class."""
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, *image)) * 0.3
    x[np.arange(n), y % image[0], :] += 1.0  # a learnable signal: the bright row is the class
    return wbc.Dataset(x.astype(dtype), y.astype(np.int32))


def randomize_head(model, key):
    """A random classifier head (the zero-initialized one has no gradient through u)."""
    head = model.head
    w = jax.random.normal(key, head.weight.shape, head.weight.dtype)
    return eqx.tree_at(lambda m: m.head.weight, model, w)


def well_conditioned(model, key):
    """Positions of unit size: an untrained ViT's class token starts near zero, where its
    LayerNorm is nearly singular and every discretization is far from its limit."""
    pos = jax.random.normal(key, model.embedding.position.shape, model.embedding.position.dtype)
    return eqx.tree_at(lambda m: m.embedding.position, model, pos)


def run_processes(code: str, args, *, num_processes: int = 2, env=None, timeout: float = 600):
    """Run `python -c code PORT NUM_PROCESSES PROCESS_ID *args` as `num_processes` processes on
    this machine (the code calls `jax.distributed.initialize(f"localhost:{PORT}", ...)`; CPU
    collectives are gloo) and return the JSON each printed on its last stdout line (gloo prints
    its connection line on stdout too)."""
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = str(s.getsockname()[1])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, port, str(num_processes), str(pid), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for pid in range(num_processes)
    ]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, stderr[-3000:]
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
    return outs


def train(
    model,
    data,
    *,
    steps,
    optimizer=None,
    objective=None,
    method=None,
    augment=None,
    max_skipped=0,
    **kwargs,
):
    """`wbc.train` with the step's parts as keywords (the tests' shorthand): a `TrainStep` of
    `optimizer` (default `wbc.default_optimizer(steps=steps)`), `objective`, `method`,
    `augment`, `max_skipped`; `kwargs` go to `wbc.train`."""
    parts = {"objective": objective, "method": method}
    step = wbc.TrainStep(
        wbc.default_optimizer(steps=int(steps)) if optimizer is None else optimizer,
        **{k: v for k, v in parts.items() if v is not None},
        augment=augment,
        max_skipped=max_skipped,
    )
    return wbc.train(step, model, data, steps=steps, **kwargs)


def certificate_dict(
    spread: float, *, order: float = 1.0, expected: int = 1, k: int = 1, threshold: float = 0.005
) -> dict:
    """A certificate's dict as `wbc.certify` writes it, for verdict tests: an accuracy that moves
    by `spread` under refinement, an observed `order`; `consistent` and `reasons` decided by
    `Certificate`'s own rule (spread and order reduction)."""
    import dataclasses

    accuracy = RefinementAccuracy(
        scheme="LieTrotter",
        steps_per_layer=k,
        accuracy=0.99,
        refined_steps_per_layer=[2 * k, 16 * k],
        refined_accuracies=[0.99, 0.99 - spread],
        second_scheme="Strang",
        second_steps_per_layer=16 * k,
        second_accuracy=0.99,
        spread=spread,
    )
    reasons = []
    if order < expected - 0.3:
        reasons.append(f"observed order {order:.2f} against the expected {expected}")
    if spread > threshold:
        reasons.append(f"held-out accuracy moves by {100 * spread:.2f} points under refinement")
    cert = Certificate(
        scheme="LieTrotter",
        steps_per_layer=k,
        error=0.1,
        reference_error_estimate=1e-9,
        ladder_steps_per_layer=[k, 2 * k],
        ladder_errors=[0.1, 0.05],
        observed_order=order,
        order_ci=(order - 0.1, order + 0.1),
        expected_order=expected,
        largest_stable_step=2.0,
        step=1.0 / k,
        stable=True,
        num_decaying_eigenvalues=3,
        max_real_eigenvalue=0.1,
        accuracy=dataclasses.asdict(accuracy),
        max_accuracy_spread=threshold,
        order_reduced=order < expected - 0.3,
        order_raised=order > expected + 0.3,
        consistent=not reasons,
        reasons=reasons,
    )
    return cert.to_dict()
