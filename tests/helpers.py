"""Test helpers: tree comparison, small models, the list of schemes every conformance test runs."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb

A = wb.architectures

ALL_SCHEMES = (
    wb.schemes.LieTrotter(),
    wb.schemes.Strang(),
    wb.schemes.Yoshida4(),
    wb.schemes.Suzuki4(),
)


def tree_allclose(x, y, *, rtol=1e-12, atol=1e-12) -> bool:
    same = eqx.tree_equal(jax.tree.structure(x), jax.tree.structure(y))
    if not same:
        return False
    leaves = zip(jax.tree.leaves(x), jax.tree.leaves(y))
    return all(np.allclose(a, b, rtol=rtol, atol=atol) for a, b in leaves)


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
