"""Checking plain numpy state dicts against the keys and shapes an architecture expects."""

import re
from collections.abc import Mapping

import numpy as np

_SIGNATURES = {
    "torch.nn.TransformerEncoder": "self_attn.in_proj_weight",
    "Hugging Face BertModel": "attention.self.query.weight",
    "Hugging Face GPT2Model": "attn.c_attn.weight",
    "Hugging Face ViTModel": "patch_embeddings.projection.weight",
    "Hugging Face CvtModel": "convolution_embeddings.projection.weight",
}


def guess_architecture(keys) -> str | None:
    """Name the architecture a state dict's keys look like, or None."""
    for name, marker in _SIGNATURES.items():
        if any(k.endswith(marker) for k in keys):
            return name
    return None


def as_numpy_state_dict(state_dict) -> dict[str, np.ndarray]:
    """Accept a mapping of name → array-like (numpy arrays; torch tensors are converted)."""
    if not isinstance(state_dict, Mapping):
        raise ValueError(
            f"state_dict must be a mapping of parameter name -> array; got {type(state_dict).__name__}."
        )
    out = {}
    for k, v in state_dict.items():
        if hasattr(v, "detach"):  # a torch tensor; no torch import needed
            v = v.detach().cpu().numpy()
        out[str(k)] = np.asarray(v)
    return out


def count_layers(keys, pattern: str, *, architecture: str) -> int:
    """Number of layers `L` from keys matching `pattern` (a regex with one group, the index)."""
    idx = {int(m.group(1)) for k in keys if (m := re.match(pattern, k))}
    if not idx:
        guess = guess_architecture(keys)
        hint = f" It looks like a {guess} state dict." if guess and guess != architecture else ""
        sample = ", ".join(sorted(keys)[:5])
        raise ValueError(
            f"state dict has no layer keys for {architecture} (pattern {pattern!r}).{hint} "
            f"First keys: {sample or '(empty)'}."
        )
    if idx != set(range(max(idx) + 1)):
        raise ValueError(f"state dict layer indices are not contiguous: {sorted(idx)}.")
    return max(idx) + 1


def check_state_dict(
    state_dict: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]],
    *,
    architecture: str,
    ignore=(),
) -> None:
    """Raise one ValueError listing missing, unexpected and mis-shaped keys (none → return).

    `ignore` lists regexes of keys that may be present and are not parameters (buffers such as
    `position_ids`, a pooler the model does not use).
    """
    keys = set(state_dict)
    missing = sorted(set(expected) - keys)
    unexpected = sorted(
        k for k in keys - set(expected) if not any(re.fullmatch(p, k) for p in ignore)
    )
    misshaped = sorted(
        (k, tuple(state_dict[k].shape), tuple(shape))
        for k, shape in expected.items()
        if k in keys and tuple(state_dict[k].shape) != tuple(shape)
    )
    if not (missing or unexpected or misshaped):
        return
    parts = [f"state dict does not match {architecture}:"]
    guess = guess_architecture(keys)
    if guess is not None and guess != architecture:
        parts.append(f"  it looks like a {guess} state dict.")
    if missing:
        parts.append(f"  missing keys ({len(missing)}): {_some(missing)}")
    if unexpected:
        parts.append(f"  unexpected keys ({len(unexpected)}): {_some(unexpected)}")
    if misshaped:
        rows = [f"{k}: got {got}, expected {want}" for k, got, want in misshaped]
        parts.append(f"  mis-shaped keys ({len(rows)}): {_some(rows)}")
        parts.append("  (check num_heads, the hidden width and the config against the weights)")
    raise ValueError("\n".join(parts))


def _some(items, limit=8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def check_weights(
    state_dict: Mapping[str, np.ndarray],
    keys,
    *,
    architecture: str,
    layer_norm_weights=(),
    cast: bool = False,
) -> None:
    """Value checks of the parameters `keys` at load, each error naming the keys.

    - every entry finite (no NaN/inf);
    - no zero entry in a LayerNorm γ (`layer_norm_weights`): LayerNorm is the projection onto
      `S1(0, 1)` followed by the affine map `w ↦ γ ⊙ w + β`, which must be invertible for the
      layer to be a projection onto a constraint set (the set's retraction and tangent spaces,
      used by `formulation=Projected()` and `Penalty(ε)`, divide by γ);
    - one floating dtype for all of them as JAX will hold them (with x64 off float64 loads as
      float32), unless the loader casts them (`cast=True`).
    """
    keys = sorted(keys)
    nonfinite = []
    for k in keys:
        v = state_dict[k]
        if np.issubdtype(v.dtype, np.inexact):
            bad = ~np.isfinite(v)
            if bad.any():
                first = tuple(int(i) for i in np.argwhere(bad)[0])
                nonfinite.append(f"{k} ({int(bad.sum())} of {v.size}, first at index {first})")
    if nonfinite:
        raise ValueError(
            f"state dict for {architecture}: NaN/inf weights in {len(nonfinite)} key(s): "
            f"{_some(nonfinite)}. The weights must be finite; check the checkpoint (a diverged "
            "run, a failed conversion or an overflowing cast)."
        )
    zeros = []
    for k in sorted(layer_norm_weights):
        v = state_dict[k]
        z = v == 0
        if z.any():
            first = tuple(int(i) for i in np.argwhere(z)[0])
            zeros.append(f"{k} ({int(z.sum())} of {v.size}, first at index {first})")
    if zeros:
        raise ValueError(
            f"state dict for {architecture}: zero LayerNorm weight (γ) entries in "
            f"{len(zeros)} key(s): {_some(zeros)}. LayerNorm's γ must be non-zero: the layer is "
            "the projection onto S1(0, 1) followed by the affine map w -> γ * w + β, which must "
            "be invertible for the layer to be a projection onto a constraint set (the set's "
            "retraction and tangent spaces, used by formulation=Projected() and Penalty(ε), "
            "divide by γ)."
        )
    if not cast:
        import jax

        kinds = {}
        for k in keys:
            dt = state_dict[k].dtype
            if np.issubdtype(dt, np.floating):
                # As JAX will hold them: with x64 off float64 arrays load as float32.
                kinds.setdefault(str(jax.dtypes.canonicalize_dtype(dt)), k)
        if len(kinds) > 1:
            shown = ", ".join(f"{k} is {dt}" for dt, k in sorted(kinds.items()))
            raise ValueError(
                f"state dict for {architecture}: the weights mix floating dtypes ({shown}); "
                "pass dtype= (e.g. dtype=np.float32) to load them in one dtype."
            )
