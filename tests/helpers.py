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
