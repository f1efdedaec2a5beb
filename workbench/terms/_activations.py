"""Pointwise activations of the feed-forward block, addressed by name only at the edges."""

import jax
import jax.numpy as jnp


def relu(x):
    """`max(x, 0)`: the projection onto the nonnegative orthant S2 (docs/equations.md)."""
    return jnp.maximum(x, 0)


def gelu(x):
    """Exact GELU, `x Φ(x)` with the Gaussian CDF Φ (PyTorch `gelu`, BERT `"gelu"`)."""
    return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x):
    """Tanh GELU, `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` (GPT-2 `"gelu_new"`)."""
    return jax.nn.gelu(x, approximate=True)


ACTIVATIONS = {
    "relu": relu,
    "gelu": gelu,
    "gelu_tanh": gelu_tanh,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
}


def activation_from_name(name: str, *, field: str = "activation"):
    """Map a user-facing activation name to its function, or raise naming the valid choices."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        choices = ", ".join(sorted(ACTIVATIONS))
        raise ValueError(
            f"{field}={name!r} is not a known activation; valid choices: {choices}."
        ) from None


def activation_name(fn) -> str:
    """The Hugging Face name of a known activation function (the inverse of
    `activation_from_name`): `"relu"`, `"gelu"` or `"gelu_new"`."""
    names = {relu: "relu", gelu: "gelu", gelu_tanh: "gelu_new"}
    if fn not in names:
        raise ValueError(
            f"activation {fn!r} has no Hugging Face name; known: {sorted(names.values())}."
        )
    return names[fn]
