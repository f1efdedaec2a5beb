"""Shared test setup: float64 on, seeded keys and generators (the library never flips x64)."""

import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def getkey():
    """A fresh, deterministic PRNG key on every call."""
    key = jax.random.key(5678)

    def _getkey():
        nonlocal key
        key, sub = jax.random.split(key)
        return sub

    return _getkey


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
