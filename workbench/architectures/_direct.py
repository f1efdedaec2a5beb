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


def _heads_attention(q, k, v, heads, scale, allowed=None):
    """concat_h softmax(scale q_h k_hᵀ) v_h for queries `(n, d)` and keys/values `(m, d)`;
    `allowed` an optional `(n, m)` boolean mask."""
    dh = q.shape[1] // heads
    out = np.empty((q.shape[0], v.shape[1]), v.dtype)
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        s = scale * q[:, sl] @ k[:, sl].T
        if allowed is not None:
            s = np.where(allowed, s, -np.inf)
        out[:, sl] = _softmax(s) @ v[:, sl]
    return out


def _mha(x, wq, bq, wk, bk, wv, bv, wo, bo, heads, causal=False, key_mask=None, scale=None):
    """x @ W convention; returns concat_h softmax(s q kᵀ) v, then @ wo + bo."""
    n, _ = x.shape
    q, k, v = x @ wq + bq, x @ wk + bk, x @ wv + bv
    dh = q.shape[1] // heads
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    allowed = np.ones((n, n), bool)
    if causal:
        allowed &= np.tril(np.ones((n, n), bool))
    if key_mask is not None:
        allowed &= np.asarray(key_mask, bool)[None, :]
    return _heads_attention(q, k, v, heads, scale, allowed) @ wo + bo


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def _conv2d(x, w, b=None, *, stride=1, padding=0, depthwise=False):
    """PyTorch `Conv2d` on one image `x (c, h, w)` with weight `w (o, c, kh, kw)` (or
    `(c, 1, kh, kw)` with `depthwise`, i.e. `groups = c`), zero padding, optional bias: the sum
    over kernel offsets of strided slices of the padded image. Returns `(o, rows, cols)`."""
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw)))
    rows, cols = (xp.shape[1] - kh) // sh + 1, (xp.shape[2] - kw) // sw + 1
    out = np.zeros((w.shape[0], rows, cols), np.result_type(x, w))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i : i + sh * (rows - 1) + 1 : sh, j : j + sw * (cols - 1) + 1 : sw]
            if depthwise:
                out += w[:, 0, i, j][:, None, None] * patch
            else:
                out += np.einsum("oc,chw->ohw", w[:, :, i, j], patch)
    return out if b is None else out + b[:, None, None]


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
    `src_key_padding_mask`), checked by `workbench.terms._mask.check_mask`.
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


def _check_image(x, want, arch):
    if x.shape != want:
        raise ValueError(
            f"image has shape {x.shape}; this {arch} takes one image of shape "
            f"(channels, height, width) = {want}."
        )


def direct_vit(state_dict, config, image):
    """Hugging Face `ViTModel(pixel_values).last_hidden_state[0]` for one image `(c, h, w)`.

    `state_dict` with the transformers 5 names (`layers.{i}.attention.q_proj.weight`, …);
    `config` a `ViTConfig`-style dict (`image_size`, `patch_size` an int or `(rows, cols)`).
    Returns `(1 + patches, d)`: the class token first, then the patches in row-major order.
    """
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    cfg = dict(config)
    eps, H = cfg.get("layer_norm_eps", 1e-12), cfg["num_attention_heads"]
    act = _act(cfg.get("hidden_act", "gelu"))
    w = sd["embeddings.patch_embeddings.projection.weight"]
    x = np.asarray(image, w.dtype)
    _check_image(x, (cfg.get("num_channels", 3), *_pair(cfg["image_size"])), "ViT")
    patch = _pair(cfg["patch_size"])
    y = _conv2d(x, w, sd["embeddings.patch_embeddings.projection.bias"], stride=patch)
    x = np.concatenate([sd["embeddings.cls_token"][0], y.reshape(y.shape[0], -1).T])
    x = x + sd["embeddings.position_embeddings"][0]
    d = x.shape[1]
    for i in range(cfg["num_hidden_layers"]):
        g = lambda k: sd[f"layers.{i}.{k}"]
        bias = lambda p: sd.get(f"layers.{i}.attention.{p}_proj.bias", np.zeros(d, x.dtype))
        y = _layer_norm(x, g("layernorm_before.weight"), g("layernorm_before.bias"), eps)
        x = x + _mha(
            y,
            g("attention.q_proj.weight").T,
            bias("q"),
            g("attention.k_proj.weight").T,
            bias("k"),
            g("attention.v_proj.weight").T,
            bias("v"),
            g("attention.o_proj.weight").T,
            bias("o"),
            H,
        )
        y = _layer_norm(x, g("layernorm_after.weight"), g("layernorm_after.bias"), eps)
        x = (
            x
            + act(y @ g("mlp.fc1.weight").T + g("mlp.fc1.bias")) @ g("mlp.fc2.weight").T
            + g("mlp.fc2.bias")
        )
    return _layer_norm(x, sd["layernorm.weight"], sd["layernorm.bias"], eps)


# Hugging Face's CvT uses nn.LayerNorm's and nn.BatchNorm2d's default eps, whatever the config says.
_CVT_EPS = 1e-5


def _cvt_attention(x, g, cfg, s, grid):
    """`CvtSelfAttention` + `attention.output.dense` on the tokens `x` (class token first when
    the stage has one) of a stage whose grid is `grid = (rows, cols)`."""
    d, H = x.shape[1], cfg["num_heads"][s]
    cls = bool(cfg["cls_token"][s])
    token, x = (x[:1], x[1:]) if cls else (x[:0], x)
    fmap = x.T.reshape(d, *grid)

    def project(r, stride, padding):
        p = f"attention.attention.convolution_projection_{r}.convolution_projection."
        n = lambda k: g(p + "normalization." + k)[:, None, None]
        y = _conv2d(
            fmap, g(p + "convolution.weight"), stride=stride, padding=padding, depthwise=True
        )
        y = (y - n("running_mean")) / np.sqrt(n("running_var") + _CVT_EPS) * n("weight") + n("bias")
        y = np.concatenate([token, y.reshape(d, -1).T])
        b = f"attention.attention.projection_{r}."
        bias = g(b + "bias") if cfg["qkv_bias"][s] else 0
        return y @ g(b + "weight").T + bias

    q = project("query", cfg["stride_q"][s], cfg["padding_q"][s])
    k = project("key", cfg["stride_kv"][s], cfg["padding_kv"][s])
    v = project("value", cfg["stride_kv"][s], cfg["padding_kv"][s])
    out = _heads_attention(q, k, v, H, float(d) ** -0.5)  # the full width, not the head's
    return out @ g("attention.output.dense.weight").T + g("attention.output.dense.bias")


def direct_cvt(state_dict, config, image):
    """Hugging Face `CvtModel(pixel_values)` for one image `(c, h, w)`, stage by stage.

    `config` a `CvtConfig`-style dict (one entry per stage; `qkv_projection_method` "dw_bn").
    Returns `(tokens, class_token)`: the last stage's grid tokens `(rows · cols, d)` in row-major
    order (`last_hidden_state[0].reshape(d, -1).T`) and `cls_token_value[0, 0]` `(d,)`, or
    `None` when the last stage has no class token.
    """
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    cfg = dict(config)
    gelu = _act("gelu")
    w0 = sd["encoder.stages.0.embedding.convolution_embeddings.projection.weight"]
    x = np.asarray(image, w0.dtype)
    if x.ndim != 3 or x.shape[0] != cfg.get("num_channels", 3):
        raise ValueError(
            f"image has shape {x.shape}; this CvT takes one image of shape (channels, height, "
            f"width) with {cfg.get('num_channels', 3)} channels."
        )
    cls = None
    for s in range(len(cfg["depth"])):
        p = f"encoder.stages.{s}."
        e = lambda k: sd[f"{p}embedding.convolution_embeddings.{k}"]
        y = _conv2d(
            x,
            e("projection.weight"),
            e("projection.bias"),
            stride=cfg["patch_stride"][s],
            padding=cfg["patch_padding"][s],
        )
        d, grid = y.shape[0], y.shape[1:]
        u = _layer_norm(
            y.reshape(d, -1).T, e("normalization.weight"), e("normalization.bias"), _CVT_EPS
        )
        if cfg["cls_token"][s]:
            u = np.concatenate([sd[p + "cls_token"][0], u])
        for i in range(cfg["depth"][s]):
            g = lambda k: sd[f"{p}layers.{i}.{k}"]
            ln = lambda y, n: _layer_norm(y, g(n + ".weight"), g(n + ".bias"), _CVT_EPS)
            u = u + _cvt_attention(ln(u, "layernorm_before"), g, cfg, s, grid)
            f = gelu(
                ln(u, "layernorm_after") @ g("intermediate.dense.weight").T
                + g("intermediate.dense.bias")
            )
            u = u + f @ g("output.dense.weight").T + g("output.dense.bias")
        cls, u = (u[0], u[1:]) if cfg["cls_token"][s] else (None, u)
        x = u.T.reshape(d, *grid)
    return x.reshape(x.shape[0], -1).T, cls
