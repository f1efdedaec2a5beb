"""Pointwise activations of the feed-forward block, addressed by name only at the edges."""

import jax
import jax.numpy as jnp

from .._table import Table


def relu(x):
    """`max(x, 0)`: the projection onto the nonnegative orthant S2 (docs/equations.md)."""
    return jnp.maximum(x, 0)


def gelu(x):
    """Exact GELU, `x Φ(x)` with the Gaussian CDF Φ (PyTorch `gelu`, BERT `"gelu"`)."""
    return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x):
    """Tanh GELU, `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` (GPT-2 `"gelu_new"`)."""
    return jax.nn.gelu(x, approximate=True)


def tanh(x):
    """`tanh(x)`: smooth and bounded (Hugging Face `"tanh"`)."""
    return jnp.tanh(x)


ACTIVATIONS: Table = Table(
    "activation",
    "activation",
    {
        "gelu": gelu,
        "gelu_new": gelu_tanh,
        "gelu_pytorch_tanh": gelu_tanh,
        "gelu_tanh": gelu_tanh,
        "relu": relu,
        "tanh": tanh,
    },
)
"""The activations by name, in alphabetical order (`workbench.registry.ACTIVATIONS`):
`"gelu"` is the exact GELU; `"gelu_new"` and `"gelu_pytorch_tanh"` are the Hugging Face names of
the tanh GELU (`"gelu_tanh"`)."""


def activation_name(fn) -> str:
    """The Hugging Face name of a known activation function (the inverse of
    `ACTIVATIONS`): `"relu"`, `"gelu"`, `"gelu_new"` or `"tanh"`."""
    names = {relu: "relu", gelu: "gelu", gelu_tanh: "gelu_new", tanh: "tanh"}
    if fn not in names:
        raise ValueError(
            f"activation {fn!r} has no Hugging Face name; known: {sorted(names.values())}."
        )
    return names[fn]
