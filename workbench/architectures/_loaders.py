"""Exact recovery from standard weights: torch encoders, Hugging Face BERT and GPT-2.

Weights arrive as plain numpy state dicts (no torch at runtime). PyTorch `Linear` stores
`W` with `y = x Wᵀ + b`; the terms use `y = x W + b`, so those weights are transposed here.
GPT-2's `Conv1D` already stores `(in, out)`.
"""

from collections.abc import Mapping

import jax.numpy as jnp

from .._checks import boolean, positive_float, positive_int
from .._controls import stack
from .._equation import PostNorm, PreNorm
from .._host import device_array
from ..terms._activations import ACTIVATIONS
from ..terms._attention import MultiHeadAttention
from ..terms._feedforward import FeedForward
from ..terms._projections import LayerNormProjection
from ._model import (
    BERT,
    GPT2,
    BertEmbeddings,
    GPT2Embeddings,
    Transformer,
    transformer_equation,
)
from ._state_dict import as_numpy_state_dict, check_state_dict, check_weights, count_layers


def _positive_int(value, name: str) -> int:
    return positive_int(name, value)


def _heads_divide(d: int, num_heads: int, name: str = "num_heads") -> None:
    if d % num_heads != 0:
        divisors = [k for k in range(1, d + 1) if d % k == 0]
        raise ValueError(
            f"{name}={num_heads} does not divide the model width d={d}; valid: {divisors}."
        )


def _eps(value, name: str) -> float:
    """A finite number >= 0: Python, NumPy scalar, or a concrete 0-d NumPy/JAX array."""
    return positive_float(name, value, allow_zero=True, arrays=True, hint="e.g. 1e-5")


def _array(x, dtype):
    return device_array(x, dtype)


def _linear_layer(
    get, names: Mapping, *, num_heads: int, activation, eps: float, dtype, zero_bias: tuple = ()
) -> tuple:
    """One layer's terms from PyTorch-`Linear` weights (`y = x Wᵀ + b`, so transposed here):
    `(attention, its LayerNorm, feed-forward, its LayerNorm)`.

    `get(key)` returns the array of a layer key; `names` maps the roles `q k v o fc1 fc2 norm1
    norm2` to key prefixes (`prefix.weight`, `prefix.bias`); the roles in `zero_bias` have no
    bias in the checkpoint (zeros of the weights' dtype)."""

    def bias(role):
        if role in zero_bias:
            w = _array(get(f"{names[role]}.weight"), dtype)
            return jnp.zeros(w.shape[0], w.dtype)
        return _array(get(f"{names[role]}.bias"), dtype)

    weight = lambda role: _array(get(f"{names[role]}.weight").T, dtype)
    attn = MultiHeadAttention(
        *(weight(r) for r in "qkvo"), *(bias(r) for r in "qkvo"), num_heads=num_heads
    )
    ffn = FeedForward(weight("fc1"), bias("fc1"), weight("fc2"), bias("fc2"), activation=activation)
    ln = lambda role: LayerNormProjection(
        _array(get(f"{names[role]}.weight"), dtype), _array(get(f"{names[role]}.bias"), dtype), eps
    )
    return attn, ln("norm1"), ffn, ln("norm2")


def encoder_from_torch(
    state_dict: Mapping,
    *,
    num_heads: int,
    norm_first: bool = False,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    dtype=None,
) -> Transformer:
    r"""Recover `torch.nn.TransformerEncoder` (of `TransformerEncoderLayer`s, `batch_first` or not).

    Post-LN (`norm_first=False`): Lie–Trotter, τ = 1, `Euler(attention) → P → Euler(FFN) → P`.
    Pre-LN (`norm_first=True`): the projections sit inside the operators, `u + MHA(LN(u))`.
    A final `norm.*` in the state dict becomes the output map.

    **Arguments:**

    - `state_dict`: `{name: numpy array}` as from `{k: v.numpy() for k, v in enc.state_dict().items()}`.
    - `num_heads`, `norm_first`, `activation` (`"relu"`, `"gelu"`), `layer_norm_eps`: the layer's
      constructor arguments.
    - `dtype`: cast the weights (default: keep theirs).

    **Returns:** a `Transformer` `m` that takes one sequence `u` of shape `(n, d)` and equals the
    encoder on it (up to round-off), in the layout the encoder was built with:

        m = encoder_from_torch(sd, num_heads=H, norm_first=..., activation=..., layer_norm_eps=...)
        x = torch.from_numpy(u)
        m(jnp.asarray(u))   # == enc(x[None])[0]        with batch_first=True
        m(jnp.asarray(u))   # == enc(x[:, None])[:, 0]  with batch_first=False (torch's default)

    torch's default layout is `(seq, batch, d)`: for such an encoder `enc(x[None])` is a batch
    of n sequences of length 1, not the sequence. Batches go through `jax.vmap(m)`. A key-padding
    mask `m(u, mask=keep)` uses True = real token: pass `keep = ~src_key_padding_mask`.

    **Raises** `ValueError` before building anything for: missing, unexpected or mis-shaped keys,
    NaN/inf weights, a zero entry in a LayerNorm γ (`norm*.weight`; LayerNorm must be a
    projection followed by an invertible affine map), weights of mixed floating dtypes when
    `dtype` is `None`, a `norm_first` that is not a bool, a negative or non-finite
    `layer_norm_eps` (NumPy scalars are accepted).
    """
    arch = "torch.nn.TransformerEncoder"
    sd = as_numpy_state_dict(state_dict)
    num_heads = _positive_int(num_heads, "num_heads")
    norm_first = boolean("norm_first", norm_first, hint="True: pre-LN, False: post-LN, as in torch")
    act = ACTIVATIONS.lookup(activation)
    eps = _eps(layer_norm_eps, "layer_norm_eps")
    L = count_layers(sd, r"layers\.(\d+)\.", architecture=arch)
    first = sd.get("layers.0.self_attn.in_proj_weight")
    if first is None or first.ndim != 2 or first.shape[0] != 3 * first.shape[1]:
        raise ValueError(
            f"state dict for {arch}: layers.0.self_attn.in_proj_weight must have shape (3d, d); "
            f"got {None if first is None else first.shape}."
        )
    d = first.shape[1]
    _heads_divide(d, num_heads)
    m = sd["layers.0.linear1.weight"].shape[0] if "layers.0.linear1.weight" in sd else 4 * d
    per_layer = {
        "self_attn.in_proj_weight": (3 * d, d),
        "self_attn.in_proj_bias": (3 * d,),
        "self_attn.out_proj.weight": (d, d),
        "self_attn.out_proj.bias": (d,),
        "linear1.weight": (m, d),
        "linear1.bias": (m,),
        "linear2.weight": (d, m),
        "linear2.bias": (d,),
        "norm1.weight": (d,),
        "norm1.bias": (d,),
        "norm2.weight": (d,),
        "norm2.bias": (d,),
    }
    expected = {f"layers.{i}.{k}": s for i in range(L) for k, s in per_layer.items()}
    final = "norm.weight" in sd or "norm.bias" in sd
    if final:
        expected.update({"norm.weight": (d,), "norm.bias": (d,)})
    check_state_dict(sd, expected, architecture=arch)
    check_weights(
        sd,
        expected,
        architecture=arch,
        layer_norm_weights=[k for k in expected if "norm" in k and k.endswith(".weight")],
        cast=dtype is not None,
    )

    def layer(i):
        g = lambda k: sd[f"layers.{i}.{k}"]
        w, b = g("self_attn.in_proj_weight"), g("self_attn.in_proj_bias")
        attn = MultiHeadAttention(
            *(_array(w[j * d : (j + 1) * d].T, dtype) for j in range(3)),
            _array(g("self_attn.out_proj.weight").T, dtype),
            *(_array(b[j * d : (j + 1) * d], dtype) for j in range(3)),
            _array(g("self_attn.out_proj.bias"), dtype),
            num_heads=num_heads,
        )
        ffn = FeedForward(
            _array(g("linear1.weight").T, dtype),
            _array(g("linear1.bias"), dtype),
            _array(g("linear2.weight").T, dtype),
            _array(g("linear2.bias"), dtype),
            activation=act,
        )
        ln = lambda k: LayerNormProjection(
            _array(g(f"{k}.weight"), dtype), _array(g(f"{k}.bias"), dtype), eps
        )
        return attn, ln("norm1"), ffn, ln("norm2")

    layers = [layer(i) for i in range(L)]
    output = (
        LayerNormProjection(_array(sd["norm.weight"], dtype), _array(sd["norm.bias"], dtype), eps)
        if final
        else None
    )
    equation = transformer_equation(
        stack(a for a, _, _, _ in layers),
        stack(n1 for _, n1, _, _ in layers),
        stack(f for _, _, f, _ in layers),
        stack(n2 for _, _, _, n2 in layers),
        PreNorm() if norm_first else PostNorm(),
        output,
    )
    return Transformer(equation)


def _config(config, architecture: str) -> dict:
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise ValueError(
            f"config for {architecture} must be a dict as in config.json; got {type(config).__name__}."
        )
    return dict(config)


def _require(config: dict, key: str, architecture: str):
    if key not in config:
        raise ValueError(f"config for {architecture} lacks {key!r} (keys: {sorted(config)}).")
    return config[key]


def bert_from_hf(state_dict: Mapping, config, *, dtype=None) -> BERT:
    r"""Recover Hugging Face `BertModel` (`last_hidden_state`; the pooler is not used).

    Embeddings (word + position + token type, then LN) give the initial condition; the encoder is
    the post-norm equation with exact-GELU feed-forward, Lie–Trotter with τ = 1.

    **Arguments:** `state_dict` of `BertModel` as numpy arrays; `config`: the `config.json` dict;
    `dtype`: cast the weights (default: keep theirs).

    **Raises** `ValueError` at load for mismatched keys or shapes, NaN/inf weights, a zero entry
    in a LayerNorm γ (`*.LayerNorm.weight`), weights of mixed floating dtypes when `dtype` is
    `None`, and bad config values. The model's `attention_mask` is Hugging Face's (1 = token,
    0 = padding), checked before any compute.
    """
    arch = "Hugging Face BertModel"
    sd = as_numpy_state_dict(state_dict)
    cfg = _config(config, arch)
    d = _positive_int(_require(cfg, "hidden_size", arch), "hidden_size")
    H = _positive_int(_require(cfg, "num_attention_heads", arch), "num_attention_heads")
    L = _positive_int(_require(cfg, "num_hidden_layers", arch), "num_hidden_layers")
    m = _positive_int(cfg.get("intermediate_size", 4 * d), "intermediate_size")
    _heads_divide(d, H, "num_attention_heads")
    eps = _eps(cfg.get("layer_norm_eps", 1e-12), "layer_norm_eps")
    act = ACTIVATIONS.lookup(cfg.get("hidden_act", "gelu"), field="hidden_act")
    pos_type = cfg.get("position_embedding_type", "absolute") or "absolute"
    if pos_type != "absolute":
        raise ValueError(
            f"position_embedding_type={pos_type!r} is not supported; valid: 'absolute'."
        )
    V = _positive_int(_require(cfg, "vocab_size", arch), "vocab_size")
    P = _positive_int(cfg.get("max_position_embeddings", 512), "max_position_embeddings")
    T = _positive_int(cfg.get("type_vocab_size", 2), "type_vocab_size")
    count_layers(sd, r"encoder\.layer\.(\d+)\.", architecture=arch)
    per_layer = {
        **{
            f"attention.self.{p}.{w}": (d, d) if w == "weight" else (d,)
            for p in ("query", "key", "value")
            for w in ("weight", "bias")
        },
        "attention.output.dense.weight": (d, d),
        "attention.output.dense.bias": (d,),
        "attention.output.LayerNorm.weight": (d,),
        "attention.output.LayerNorm.bias": (d,),
        "intermediate.dense.weight": (m, d),
        "intermediate.dense.bias": (m,),
        "output.dense.weight": (d, m),
        "output.dense.bias": (d,),
        "output.LayerNorm.weight": (d,),
        "output.LayerNorm.bias": (d,),
    }
    expected = {f"encoder.layer.{i}.{k}": s for i in range(L) for k, s in per_layer.items()}
    expected.update(
        {
            "embeddings.word_embeddings.weight": (V, d),
            "embeddings.position_embeddings.weight": (P, d),
            "embeddings.token_type_embeddings.weight": (T, d),
            "embeddings.LayerNorm.weight": (d,),
            "embeddings.LayerNorm.bias": (d,),
        }
    )
    ignore = (
        r"embeddings\.position_ids",
        r"embeddings\.token_type_ids",
        r"pooler\.dense\.(weight|bias)",
    )
    check_state_dict(sd, expected, architecture=arch, ignore=ignore)
    check_weights(
        sd,
        expected,
        architecture=arch,
        layer_norm_weights=[k for k in expected if k.endswith("LayerNorm.weight")],
        cast=dtype is not None,
    )

    names = {
        "q": "attention.self.query",
        "k": "attention.self.key",
        "v": "attention.self.value",
        "o": "attention.output.dense",
        "fc1": "intermediate.dense",
        "fc2": "output.dense",
        "norm1": "attention.output.LayerNorm",
        "norm2": "output.LayerNorm",
    }

    def layer(i):
        return _linear_layer(
            lambda k: sd[f"encoder.layer.{i}.{k}"],
            names,
            num_heads=H,
            activation=act,
            eps=eps,
            dtype=dtype,
        )

    layers = [layer(i) for i in range(L)]
    equation = transformer_equation(
        stack(x[0] for x in layers),
        stack(x[1] for x in layers),
        stack(x[2] for x in layers),
        stack(x[3] for x in layers),
        PostNorm(),
    )
    e = lambda k: _array(sd[f"embeddings.{k}"], dtype)
    embeddings = BertEmbeddings(
        e("word_embeddings.weight"),
        e("position_embeddings.weight"),
        e("token_type_embeddings.weight"),
        LayerNormProjection(e("LayerNorm.weight"), e("LayerNorm.bias"), eps),
    )
    return BERT(embeddings, Transformer(equation))


def gpt2_from_hf(state_dict: Mapping, config, *, dtype=None) -> GPT2:
    r"""Recover Hugging Face `GPT2Model` (`last_hidden_state`).

    Causal (Volterra) attention, pre-norm placement, tanh-GELU feed-forward, the final `ln_f` as
    the output map at `T`; Lie–Trotter with τ = 1.

    **Arguments:** `state_dict` of `GPT2Model` as numpy arrays; `config`: the `config.json` dict;
    `dtype`: cast the weights (default: keep theirs).

    **Raises** `ValueError` at load for mismatched keys or shapes, NaN/inf weights, a zero entry
    in a LayerNorm γ (`ln_1`, `ln_2`, `ln_f`), weights of mixed floating dtypes when `dtype` is
    `None`, and bad config values.
    """
    arch = "Hugging Face GPT2Model"
    sd = as_numpy_state_dict(state_dict)
    cfg = _config(config, arch)
    d = _positive_int(_require(cfg, "n_embd", arch), "n_embd")
    H = _positive_int(_require(cfg, "n_head", arch), "n_head")
    L = _positive_int(_require(cfg, "n_layer", arch), "n_layer")
    _heads_divide(d, H, "n_head")
    m = _positive_int(cfg.get("n_inner") or 4 * d, "n_inner")
    V = _positive_int(_require(cfg, "vocab_size", arch), "vocab_size")
    P = _positive_int(cfg.get("n_positions", 1024), "n_positions")
    eps = _eps(cfg.get("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    act = ACTIVATIONS.lookup(
        cfg.get("activation_function", "gelu_new"), field="activation_function"
    )
    if cfg.get("scale_attn_by_inverse_layer_idx", False):
        raise ValueError("scale_attn_by_inverse_layer_idx=True is not supported; valid: False.")
    scale = None if cfg.get("scale_attn_weights", True) else 1.0
    count_layers(sd, r"h\.(\d+)\.", architecture=arch)
    per_layer = {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "attn.c_attn.weight": (d, 3 * d),
        "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d),
        "attn.c_proj.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "mlp.c_fc.weight": (d, m),
        "mlp.c_fc.bias": (m,),
        "mlp.c_proj.weight": (m, d),
        "mlp.c_proj.bias": (d,),
    }
    expected = {f"h.{i}.{k}": s for i in range(L) for k, s in per_layer.items()}
    expected.update(
        {"wte.weight": (V, d), "wpe.weight": (P, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    )
    ignore = (r"h\.\d+\.attn\.(bias|masked_bias)",)
    check_state_dict(sd, expected, architecture=arch, ignore=ignore)
    check_weights(
        sd,
        expected,
        architecture=arch,
        layer_norm_weights=[k for k in expected if ".ln_" in f".{k}" and k.endswith(".weight")],
        cast=dtype is not None,
    )

    def layer(i):
        g = lambda k: sd[f"h.{i}.{k}"]
        w, b = g("attn.c_attn.weight"), g("attn.c_attn.bias")
        attn = MultiHeadAttention(
            *(_array(w[:, j * d : (j + 1) * d], dtype) for j in range(3)),
            _array(g("attn.c_proj.weight"), dtype),
            *(_array(b[j * d : (j + 1) * d], dtype) for j in range(3)),
            _array(g("attn.c_proj.bias"), dtype),
            num_heads=H,
            scale=scale,
            causal=True,
        )
        ffn = FeedForward(
            _array(g("mlp.c_fc.weight"), dtype),
            _array(g("mlp.c_fc.bias"), dtype),
            _array(g("mlp.c_proj.weight"), dtype),
            _array(g("mlp.c_proj.bias"), dtype),
            activation=act,
        )
        ln = lambda p: LayerNormProjection(
            _array(g(f"{p}.weight"), dtype), _array(g(f"{p}.bias"), dtype), eps
        )
        return attn, ln("ln_1"), ffn, ln("ln_2")

    layers = [layer(i) for i in range(L)]
    output = LayerNormProjection(
        _array(sd["ln_f.weight"], dtype), _array(sd["ln_f.bias"], dtype), eps
    )
    equation = transformer_equation(
        stack(x[0] for x in layers),
        stack(x[1] for x in layers),
        stack(x[2] for x in layers),
        stack(x[3] for x in layers),
        PreNorm(),
        output,
    )
    embeddings = GPT2Embeddings(_array(sd["wte.weight"], dtype), _array(sd["wpe.weight"], dtype))
    return GPT2(embeddings, Transformer(equation))
