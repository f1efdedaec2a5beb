"""PyTorch / Hugging Face reference forward passes from numpy state dicts (the `reference` extra).

torch and transformers are imported lazily: the rest of the package never needs them.
"""

import numpy as np


def have_reference() -> bool:
    """True when torch and transformers can be imported."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the PyTorch reference needs the `reference` extra: pip install 'workbench[reference]'"
        ) from e
    return torch


def _dtype(torch, dtype):
    return {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}[
        np.dtype(dtype)
    ]


def _load(model, state_dict, dtype):
    torch = _torch()
    # Cast *before* loading: load_state_dict copies into the existing parameters, so float64
    # weights loaded into float32 parameters would be rounded.
    model = model.to(_dtype(torch, dtype)).eval()
    tensors = {k: torch.tensor(np.asarray(v, dtype)) for k, v in state_dict.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    params = dict(model.named_parameters())
    missing = [
        k for k in missing if k in params
    ]  # buffers (position ids, causal masks) may be absent
    if missing or unexpected:
        raise ValueError(
            f"reference model keys: missing parameters {missing}, unexpected {unexpected}"
        )
    return model


def torch_encoder(
    state_dict,
    *,
    num_heads,
    norm_first=False,
    activation="relu",
    layer_norm_eps=1e-5,
    dtype=np.float64,
):
    """A `torch.nn.TransformerEncoder` (eval mode, batch_first) holding the given weights."""
    torch = _torch()
    d = state_dict["layers.0.self_attn.in_proj_weight"].shape[1]
    dff = state_dict["layers.0.linear1.weight"].shape[0]
    L = 1 + max(int(k.split(".")[1]) for k in state_dict if k.startswith("layers."))
    layer = torch.nn.TransformerEncoderLayer(
        d,
        num_heads,
        dff,
        dropout=0.0,
        activation=activation,
        layer_norm_eps=layer_norm_eps,
        batch_first=True,
        norm_first=norm_first,
    )
    norm = torch.nn.LayerNorm(d, eps=layer_norm_eps) if "norm.weight" in state_dict else None
    enc = torch.nn.TransformerEncoder(layer, L, norm=norm, enable_nested_tensor=False)
    return _load(enc, state_dict, dtype)


def hf_bert(state_dict, config, *, dtype=np.float64):
    """A Hugging Face `BertModel` (no pooler, eval mode) holding the given weights."""
    _torch()
    from transformers import BertConfig, BertModel

    return _load(BertModel(BertConfig(**config), add_pooling_layer=False), state_dict, dtype)


def hf_gpt2(state_dict, config, *, dtype=np.float64):
    """A Hugging Face `GPT2Model` (eval mode) holding the given weights."""
    _torch()
    from transformers import GPT2Config, GPT2Model

    cfg = dict(config)
    cfg.setdefault("bos_token_id", 0)
    cfg.setdefault("eos_token_id", 0)
    return _load(GPT2Model(GPT2Config(**cfg)), state_dict, dtype)


def hf_vit(state_dict, config, *, dtype=np.float64):
    """A Hugging Face `ViTModel` (no pooler, eval mode) holding the given weights."""
    _torch()
    from transformers import ViTConfig, ViTModel

    return _load(ViTModel(ViTConfig(**config), add_pooling_layer=False), state_dict, dtype)


def hf_cvt(state_dict, config, *, dtype=np.float64):
    """A Hugging Face `CvtModel` (eval mode) holding the given weights. Per-stage lists become
    tuples (transformers 5 validates `CvtConfig`'s float lists strictly)."""
    _torch()
    from transformers import CvtConfig, CvtModel

    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in dict(config).items()}
    return _load(CvtModel(CvtConfig(**cfg)), state_dict, dtype)


def run_reference(model, *args, **kwargs) -> np.ndarray:
    """Call a torch model on numpy inputs (batch of one added and removed), returning numpy."""
    torch = _torch()
    tensors = [None if a is None else torch.as_tensor(np.asarray(a))[None] for a in args]
    kw = {k: None if v is None else torch.as_tensor(np.asarray(v))[None] for k, v in kwargs.items()}
    with torch.inference_mode():
        out = model(*tensors, **kw)
    out = getattr(out, "last_hidden_state", out)
    return out[0].detach().cpu().numpy()
