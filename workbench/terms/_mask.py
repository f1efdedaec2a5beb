"""Key-padding masks: the one check every mask passes through before any compute."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

MASK_CONVENTION = (
    "True (or 1) = attend to this token, False (or 0) = padding: the convention of Hugging "
    "Face's `attention_mask`, and the OPPOSITE of torch's `src_key_padding_mask` (True = "
    "padding; convert it with `~mask`)"
)


def _torch_hint(name: str) -> str:
    return f"If {name} is torch's src_key_padding_mask (True = padding), pass ~{name}."


def check_mask(mask, n: int, *, name: str = "mask", causal: bool = False, traced: bool = True):
    r"""Check a key-padding mask for a sequence of `n` tokens; return it as a boolean `(n,)` array.

    The convention: `mask[j]` True (or 1) means "token j is real, attend to it", False (or 0)
    means padding — the same as Hugging Face's `attention_mask`, the opposite of torch's
    `src_key_padding_mask` (True = padding; pass `~mask`).

    Accepted: a boolean array of shape `(n,)`, or an integer array of shape `(n,)` holding only
    0 and 1 (Hugging Face's `attention_mask`). Rejected, with a `ValueError` naming `name`:

    - another shape (a `(1,)` mask would broadcast to every key; batches go through `jax.vmap`);
    - a floating mask (Hugging Face's additive `0 / -inf` or `0 / -10000` masks, float `0/1`):
      pass a boolean one;
    - an integer mask holding values other than 0 and 1;
    - a mask with no real token (all False: the attention softmax would run over no keys), and,
      for `causal` attention, a mask whose first token is padding (the first row would have no
      admissible key: left padding is not supported).

    Shape and dtype are checked at trace time. The value checks run at once on a concrete mask
    and, on a traced one (inside `jax.jit` / `jax.vmap`), through `eqx.error_if` when
    `traced=True` (a run-time error when the compiled function runs).

    **Arguments:**

    - `mask`: the mask, or `None` (returned as is).
    - `n`: the number of tokens.
    - `name`: how error messages call the mask (`"mask"`, `"attention_mask"`, ...).
    - `causal`: the mask feeds causal attention (its first entry must then be True).
    - `traced`: attach the value checks to a traced mask with `eqx.error_if`.
    """
    if mask is None:
        return None
    if isinstance(mask, (list, tuple)):
        mask = np.asarray(mask)
    shape = tuple(np.shape(mask))
    dtype = getattr(mask, "dtype", None)
    dtype = np.dtype(np.asarray(mask).dtype if dtype is None else dtype)
    if shape != (n,):
        hint = " Batch with jax.vmap." if len(shape) == 2 and shape[-1] == n else ""
        raise ValueError(
            f"{name} has shape {shape}; expected ({n},): one entry per token of the sequence "
            f"(n = {n}), {MASK_CONVENTION}. A mask of another length is not broadcast.{hint}"
        )
    is_bool = dtype == np.bool_
    is_int = np.issubdtype(dtype, np.integer)
    if not (is_bool or is_int):
        raise ValueError(
            f"{name} has dtype {dtype}; pass a boolean mask where True means 'attend' (an "
            "integer 0/1 mask such as Hugging Face's attention_mask is accepted too). "
            f"An additive float mask (0 = attend, -inf or -10000 = padding) converts with "
            f"`{name} == 0`; a float 0/1 mask with `{name} > 0.5`. {_torch_hint(name)}"
        )
    not_01 = (
        f"{name} must hold only 0 and 1 (1 = attend, 0 = padding, as Hugging Face's attention_mask)"
    )
    empty = (
        f"{name} masks every token (all False/0): attention would be a softmax over no keys. "
        f"True (or 1) = attend, False (or 0) = padding, as Hugging Face's attention_mask. If "
        f"{name} is torch's src_key_padding_mask (True = padding, so all False = no padding), "
        f"pass ~{name}."
    )
    first = (
        f"{name}[0] is padding, but the attention is causal: token 0 would have no key to attend "
        "to (left padding is not supported; pad on the right)."
    )
    if isinstance(mask, jax.core.Tracer):
        if not traced:
            return mask if is_bool else mask != 0
        if is_int:
            mask = eqx.error_if(mask, jnp.any((mask != 0) & (mask != 1)), not_01 + ".")
            mask = mask != 0
        mask = eqx.error_if(mask, ~jnp.any(mask), empty)
        if causal:
            mask = eqx.error_if(mask, ~mask[0], first)
        return mask
    values = np.asarray(mask)
    if is_int:
        bad = np.unique(values[(values != 0) & (values != 1)])
        if bad.size:
            raise ValueError(f"{not_01}; got the values {bad[:5].tolist()}.")
    if not values.any():
        raise ValueError(empty)
    if causal and not values[0]:
        raise ValueError(first)
    if isinstance(mask, jax.Array):
        return mask if is_bool else mask != 0
    return values.astype(bool)
