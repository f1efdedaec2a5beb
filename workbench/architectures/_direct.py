"""Direct layer-by-layer NumPy forward passes: the workbench's own reference, independent of the
equation, control and scheme machinery (and of torch). Used by tests and the exact-recovery study.
"""

import math

import numpy as np

from ..terms._mask import check_mask

_erf = np.vectorize(math.erf, otypes=[float])


def _act(name: str):
    if name == "relu":
        return lambda x: np.maximum(x, 0)
    if name == "gelu":
        return lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(x.dtype))
    if name in ("gelu_tanh", "gelu_new", "gelu_pytorch_tanh"):
        c = math.sqrt(2.0 / math.pi)
        return lambda x: 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))
    raise ValueError(f"activation={name!r}; valid: relu, gelu, gelu_tanh.")


def _layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def _softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def _mha(x, wq, bq, wk, bk, wv, bv, wo, bo, heads, causal=False, key_mask=None, scale=None):
    """x @ W convention; returns concat_h softmax(s q kᵀ) v, then @ wo + bo."""
    n, _ = x.shape
    q, k, v = x @ wq + bq, x @ wk + bk, x @ wv + bv
    dh = q.shape[1] // heads
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    out = np.empty((n, v.shape[1]), x.dtype)
    allowed = np.ones((n, n), bool)
    if causal:
        allowed &= np.tril(np.ones((n, n), bool))
    if key_mask is not None:
        allowed &= np.asarray(key_mask, bool)[None, :]
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        s = scale * q[:, sl] @ k[:, sl].T
        s = np.where(allowed, s, -np.inf)
        out[:, sl] = _softmax(s) @ v[:, sl]
    return out @ wo + bo


def direct_encoder(
    state_dict,
    u,
    *,
    num_heads,
    norm_first=False,
    activation="relu",
    layer_norm_eps=1e-5,
    key_mask=None,
):
    """`torch.nn.TransformerEncoder` forward on one sequence `u (n, d)`, layer by layer.

    `key_mask`: optional `(n,)`, True (or 1) = real token (the opposite of torch's
    `src_key_padding_mask`), checked by `workbench.terms.check_mask`.
    """
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    x = np.asarray(u, sd["layers.0.linear1.weight"].dtype)
    key_mask = check_mask(key_mask, x.shape[0], name="key_mask")
    d = x.shape[1]
    act = _act(activation)
    L = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    for i in range(L):
        g = lambda k: sd[f"layers.{i}.{k}"]
        w, b = g("self_attn.in_proj_weight"), g("self_attn.in_proj_bias")
        attn = lambda y: _mha(
            y,
            w[:d].T,
            b[:d],
            w[d : 2 * d].T,
            b[d : 2 * d],
            w[2 * d :].T,
            b[2 * d :],
            g("self_attn.out_proj.weight").T,
            g("self_attn.out_proj.bias"),
            num_heads,
            key_mask=key_mask,
        )
        ffn = lambda y: (
            act(y @ g("linear1.weight").T + g("linear1.bias")) @ g("linear2.weight").T
            + g("linear2.bias")
        )
        n1 = lambda y: _layer_norm(y, g("norm1.weight"), g("norm1.bias"), layer_norm_eps)
        n2 = lambda y: _layer_norm(y, g("norm2.weight"), g("norm2.bias"), layer_norm_eps)
        if norm_first:
            x = x + attn(n1(x))
            x = x + ffn(n2(x))
        else:
            x = n1(x + attn(x))
            x = n2(x + ffn(x))
    if "norm.weight" in sd:
        x = _layer_norm(x, sd["norm.weight"], sd["norm.bias"], layer_norm_eps)
    return x


def direct_bert(state_dict, config, input_ids, token_type_ids=None, attention_mask=None):
    """Hugging Face `BertModel(...).last_hidden_state[0]` for one sequence.

    `attention_mask`: optional `(n,)`, 1 (or True) = token, 0 = padding, as Hugging Face's.
    """
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    cfg = dict(config)
    eps, H = cfg.get("layer_norm_eps", 1e-12), cfg["num_attention_heads"]
    act = _act(cfg.get("hidden_act", "gelu"))
    ids = np.asarray(input_ids)
    attention_mask = check_mask(attention_mask, len(ids), name="attention_mask")
    tt = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
    e = lambda k: sd[f"embeddings.{k}"]
    x = e("word_embeddings.weight")[ids] + e("position_embeddings.weight")[: len(ids)]
    x = _layer_norm(
        x + e("token_type_embeddings.weight")[tt], e("LayerNorm.weight"), e("LayerNorm.bias"), eps
    )
    for i in range(cfg["num_hidden_layers"]):
        g = lambda k: sd[f"encoder.layer.{i}.{k}"]
        s = lambda p, w: g(f"attention.self.{p}.{w}")
        a = _mha(
            x,
            s("query", "weight").T,
            s("query", "bias"),
            s("key", "weight").T,
            s("key", "bias"),
            s("value", "weight").T,
            s("value", "bias"),
            g("attention.output.dense.weight").T,
            g("attention.output.dense.bias"),
            H,
            key_mask=attention_mask,
        )
        x = _layer_norm(
            x + a, g("attention.output.LayerNorm.weight"), g("attention.output.LayerNorm.bias"), eps
        )
        f = act(x @ g("intermediate.dense.weight").T + g("intermediate.dense.bias"))
        f = f @ g("output.dense.weight").T + g("output.dense.bias")
        x = _layer_norm(x + f, g("output.LayerNorm.weight"), g("output.LayerNorm.bias"), eps)
    return x


def direct_gpt2(state_dict, config, input_ids):
    """Hugging Face `GPT2Model(...).last_hidden_state[0]` for one sequence."""
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    cfg = dict(config)
    eps, H, d = cfg.get("layer_norm_epsilon", 1e-5), cfg["n_head"], cfg["n_embd"]
    act = _act(cfg.get("activation_function", "gelu_new"))
    ids = np.asarray(input_ids)
    x = sd["wte.weight"][ids] + sd["wpe.weight"][: len(ids)]
    for i in range(cfg["n_layer"]):
        g = lambda k: sd[f"h.{i}.{k}"]
        w, b = g("attn.c_attn.weight"), g("attn.c_attn.bias")
        y = _layer_norm(x, g("ln_1.weight"), g("ln_1.bias"), eps)
        x = x + _mha(
            y,
            w[:, :d],
            b[:d],
            w[:, d : 2 * d],
            b[d : 2 * d],
            w[:, 2 * d :],
            b[2 * d :],
            g("attn.c_proj.weight"),
            g("attn.c_proj.bias"),
            H,
            causal=True,
        )
        y = _layer_norm(x, g("ln_2.weight"), g("ln_2.bias"), eps)
        x = (
            x
            + act(y @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias")) @ g("mlp.c_proj.weight")
            + g("mlp.c_proj.bias")
        )
    return _layer_norm(x, sd["ln_f.weight"], sd["ln_f.bias"], eps)
