"""Random weights in the standard state-dict layouts (numpy), for studies, tests and benchmarks."""

import numpy as np


def _w(rng, shape, fan_in, dtype):
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(dtype)


def _ln(rng, d, dtype):
    return (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype), (
        0.1 * rng.standard_normal(d)
    ).astype(dtype)


def random_encoder_state_dict(
    rng: np.random.Generator,
    *,
    d: int,
    num_layers: int,
    dim_feedforward: int,
    final_norm: bool = False,
    dtype=np.float64,
) -> dict[str, np.ndarray]:
    """Random weights with the keys and shapes of `torch.nn.TransformerEncoder.state_dict()`."""
    sd = {}
    for i in range(num_layers):
        p = f"layers.{i}."
        sd[p + "self_attn.in_proj_weight"] = _w(rng, (3 * d, d), d, dtype)
        sd[p + "self_attn.in_proj_bias"] = _w(rng, (3 * d,), 10, dtype)
        sd[p + "self_attn.out_proj.weight"] = _w(rng, (d, d), d, dtype)
        sd[p + "self_attn.out_proj.bias"] = _w(rng, (d,), 10, dtype)
        sd[p + "linear1.weight"] = _w(rng, (dim_feedforward, d), d, dtype)
        sd[p + "linear1.bias"] = _w(rng, (dim_feedforward,), 10, dtype)
        sd[p + "linear2.weight"] = _w(rng, (d, dim_feedforward), dim_feedforward, dtype)
        sd[p + "linear2.bias"] = _w(rng, (d,), 10, dtype)
        for k in ("norm1", "norm2"):
            sd[p + k + ".weight"], sd[p + k + ".bias"] = _ln(rng, d, dtype)
    if final_norm:
        sd["norm.weight"], sd["norm.bias"] = _ln(rng, d, dtype)
    return sd


def bert_config(
    *,
    d: int,
    num_heads: int,
    num_layers: int,
    intermediate: int,
    vocab: int = 97,
    positions: int = 64,
    type_vocab: int = 2,
) -> dict:
    """A `BertConfig`-style dict (the keys `bert_from_hf` reads)."""
    return {
        "hidden_size": d,
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": positions,
        "type_vocab_size": type_vocab,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
    }


def gpt2_config(
    *,
    d: int,
    num_heads: int,
    num_layers: int,
    inner: int | None = None,
    vocab: int = 97,
    positions: int = 64,
) -> dict:
    """A `GPT2Config`-style dict (the keys `gpt2_from_hf` reads)."""
    return {
        "n_embd": d,
        "n_head": num_heads,
        "n_layer": num_layers,
        "n_inner": inner,
        "vocab_size": vocab,
        "n_positions": positions,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
    }


def random_bert_state_dict(rng, config: dict, dtype=np.float64) -> dict[str, np.ndarray]:
    """Random weights with the keys and shapes of Hugging Face `BertModel.state_dict()` (no pooler)."""
    d, m = config["hidden_size"], config["intermediate_size"]
    sd = {
        "embeddings.word_embeddings.weight": _w(rng, (config["vocab_size"], d), 1, dtype),
        "embeddings.position_embeddings.weight": _w(
            rng, (config["max_position_embeddings"], d), 4, dtype
        ),
        "embeddings.token_type_embeddings.weight": _w(
            rng, (config["type_vocab_size"], d), 4, dtype
        ),
    }
    sd["embeddings.LayerNorm.weight"], sd["embeddings.LayerNorm.bias"] = _ln(rng, d, dtype)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for k in ("query", "key", "value"):
            sd[p + f"attention.self.{k}.weight"] = _w(rng, (d, d), d, dtype)
            sd[p + f"attention.self.{k}.bias"] = _w(rng, (d,), 10, dtype)
        sd[p + "attention.output.dense.weight"] = _w(rng, (d, d), d, dtype)
        sd[p + "attention.output.dense.bias"] = _w(rng, (d,), 10, dtype)
        sd[p + "attention.output.LayerNorm.weight"], sd[p + "attention.output.LayerNorm.bias"] = (
            _ln(rng, d, dtype)
        )
        sd[p + "intermediate.dense.weight"] = _w(rng, (m, d), d, dtype)
        sd[p + "intermediate.dense.bias"] = _w(rng, (m,), 10, dtype)
        sd[p + "output.dense.weight"] = _w(rng, (d, m), m, dtype)
        sd[p + "output.dense.bias"] = _w(rng, (d,), 10, dtype)
        sd[p + "output.LayerNorm.weight"], sd[p + "output.LayerNorm.bias"] = _ln(rng, d, dtype)
    return sd


def random_gpt2_state_dict(rng, config: dict, dtype=np.float64) -> dict[str, np.ndarray]:
    """Random weights with the keys and shapes of Hugging Face `GPT2Model.state_dict()` (no buffers)."""
    d = config["n_embd"]
    m = config.get("n_inner") or 4 * d
    sd = {
        "wte.weight": _w(rng, (config["vocab_size"], d), 1, dtype),
        "wpe.weight": _w(rng, (config["n_positions"], d), 4, dtype),
    }
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = _ln(rng, d, dtype)
        sd[p + "attn.c_attn.weight"] = _w(rng, (d, 3 * d), d, dtype)
        sd[p + "attn.c_attn.bias"] = _w(rng, (3 * d,), 10, dtype)
        sd[p + "attn.c_proj.weight"] = _w(rng, (d, d), d, dtype)
        sd[p + "attn.c_proj.bias"] = _w(rng, (d,), 10, dtype)
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = _ln(rng, d, dtype)
        sd[p + "mlp.c_fc.weight"] = _w(rng, (d, m), d, dtype)
        sd[p + "mlp.c_fc.bias"] = _w(rng, (m,), 10, dtype)
        sd[p + "mlp.c_proj.weight"] = _w(rng, (m, d), m, dtype)
        sd[p + "mlp.c_proj.bias"] = _w(rng, (d,), 10, dtype)
    sd["ln_f.weight"], sd["ln_f.bias"] = _ln(rng, d, dtype)
    return sd


def vit_config(
    *,
    d: int,
    num_heads: int,
    num_layers: int,
    intermediate: int,
    image_size=(8, 8),
    patch_size=(4, 4),
    num_channels: int = 3,
    qkv_bias: bool = True,
) -> dict:
    """A `ViTConfig`-style dict (the keys `vit_from_hf` reads); sizes an int or `(rows, cols)`."""
    pair = lambda v: list(v) if isinstance(v, (tuple, list)) else v
    return {
        "hidden_size": d,
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "intermediate_size": intermediate,
        "image_size": pair(image_size),
        "patch_size": pair(patch_size),
        "num_channels": num_channels,
        "qkv_bias": qkv_bias,
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
    }


def random_vit_state_dict(rng, config: dict, dtype=np.float64) -> dict[str, np.ndarray]:
    """Random weights with the keys and shapes of Hugging Face `ViTModel.state_dict()`
    (transformers 5 names; no pooler)."""
    d, m, c = config["hidden_size"], config["intermediate_size"], config["num_channels"]
    size = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v, v)
    (h, w), (ph, pw) = size(config["image_size"]), size(config["patch_size"])
    patches = (h // ph) * (w // pw)
    sd = {
        "embeddings.cls_token": _w(rng, (1, 1, d), 1, dtype),
        "embeddings.position_embeddings": _w(rng, (1, patches + 1, d), 4, dtype),
        "embeddings.patch_embeddings.projection.weight": _w(
            rng, (d, c, ph, pw), c * ph * pw, dtype
        ),
        "embeddings.patch_embeddings.projection.bias": _w(rng, (d,), 10, dtype),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        for k in "qkvo":
            sd[p + f"attention.{k}_proj.weight"] = _w(rng, (d, d), d, dtype)
            if k == "o" or config.get("qkv_bias", True):
                sd[p + f"attention.{k}_proj.bias"] = _w(rng, (d,), 10, dtype)
        sd[p + "layernorm_before.weight"], sd[p + "layernorm_before.bias"] = _ln(rng, d, dtype)
        sd[p + "layernorm_after.weight"], sd[p + "layernorm_after.bias"] = _ln(rng, d, dtype)
        sd[p + "mlp.fc1.weight"] = _w(rng, (m, d), d, dtype)
        sd[p + "mlp.fc1.bias"] = _w(rng, (m,), 10, dtype)
        sd[p + "mlp.fc2.weight"] = _w(rng, (d, m), m, dtype)
        sd[p + "mlp.fc2.bias"] = _w(rng, (d,), 10, dtype)
    sd["layernorm.weight"], sd["layernorm.bias"] = _ln(rng, d, dtype)
    return sd


def cvt_config(
    *,
    embed_dim=(16, 24),
    num_heads=(1, 2),
    depth=(1, 2),
    patch_sizes=(7, 3),
    patch_stride=(4, 2),
    patch_padding=(2, 1),
    cls_token_last: bool = True,
    stride_kv=2,
    num_channels: int = 3,
    qkv_bias: bool = True,
    mlp_ratio: float = 4.0,
) -> dict:
    """A `CvtConfig`-style dict (the keys `cvt_from_hf` reads), one entry per stage; `stride_kv`
    an int for every stage or a list."""
    S = len(depth)
    per = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * S
    return {
        "num_channels": num_channels,
        "patch_sizes": list(patch_sizes),
        "patch_stride": list(patch_stride),
        "patch_padding": list(patch_padding),
        "embed_dim": list(embed_dim),
        "num_heads": list(num_heads),
        "depth": list(depth),
        "mlp_ratio": [float(mlp_ratio)] * S,
        "attention_drop_rate": [0.0] * S,
        "drop_rate": [0.0] * S,
        "drop_path_rate": [0.0] * S,
        "qkv_bias": [bool(qkv_bias)] * S,
        "cls_token": [False] * (S - 1) + [bool(cls_token_last)],
        "qkv_projection_method": ["dw_bn"] * S,
        "kernel_qkv": [3] * S,
        "padding_kv": [1] * S,
        "stride_kv": per(stride_kv),
        "padding_q": [1] * S,
        "stride_q": [1] * S,
    }


def random_cvt_state_dict(rng, config: dict, dtype=np.float64) -> dict[str, np.ndarray]:
    """Random weights with the keys and shapes of Hugging Face `CvtModel.state_dict()`, with
    non-trivial BatchNorm statistics (running means ≠ 0, running variances ≠ 1)."""
    sd = {}
    for s, d in enumerate(config["embed_dim"]):
        c = config["num_channels"] if s == 0 else config["embed_dim"][s - 1]
        k, kq = config["patch_sizes"][s], config["kernel_qkv"][s]
        m = int(d * config["mlp_ratio"][s])
        p = f"encoder.stages.{s}."
        e = p + "embedding.convolution_embeddings."
        sd[e + "projection.weight"] = _w(rng, (d, c, k, k), c * k * k, dtype)
        sd[e + "projection.bias"] = _w(rng, (d,), 10, dtype)
        sd[e + "normalization.weight"], sd[e + "normalization.bias"] = _ln(rng, d, dtype)
        if config["cls_token"][s]:
            sd[p + "cls_token"] = _w(rng, (1, 1, config["embed_dim"][-1]), 1, dtype)
        for i in range(config["depth"][s]):
            a = f"{p}layers.{i}.attention.attention."
            for r in ("query", "key", "value"):
                cp = f"{a}convolution_projection_{r}.convolution_projection."
                sd[cp + "convolution.weight"] = _w(rng, (d, 1, kq, kq), kq * kq, dtype)
                sd[cp + "normalization.weight"], sd[cp + "normalization.bias"] = _ln(rng, d, dtype)
                sd[cp + "normalization.running_mean"] = (0.3 * rng.standard_normal(d)).astype(dtype)
                sd[cp + "normalization.running_var"] = rng.uniform(0.5, 2.0, d).astype(dtype)
                sd[cp + "normalization.num_batches_tracked"] = np.array(100, np.int64)
                sd[f"{a}projection_{r}.weight"] = _w(rng, (d, d), d, dtype)
                if config["qkv_bias"][s]:
                    sd[f"{a}projection_{r}.bias"] = _w(rng, (d,), 10, dtype)
            lp = f"{p}layers.{i}."
            sd[lp + "attention.output.dense.weight"] = _w(rng, (d, d), d, dtype)
            sd[lp + "attention.output.dense.bias"] = _w(rng, (d,), 10, dtype)
            sd[lp + "intermediate.dense.weight"] = _w(rng, (m, d), d, dtype)
            sd[lp + "intermediate.dense.bias"] = _w(rng, (m,), 10, dtype)
            sd[lp + "output.dense.weight"] = _w(rng, (d, m), m, dtype)
            sd[lp + "output.dense.bias"] = _w(rng, (d,), 10, dtype)
            for n in ("layernorm_before", "layernorm_after"):
                sd[f"{lp}{n}.weight"], sd[f"{lp}{n}.bias"] = _ln(rng, d, dtype)
    return sd
