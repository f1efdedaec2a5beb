r"""Vision Transformers recovered from the equation: Hugging Face `ViTModel`.

The image enters only the initial condition. A patch embedding is an integral operator over each
patch, `u(0)_p = Σ_{q ∈ patch(p)} W_{q − q_p} x_q + b` (a convolution whose stride is its
kernel: the patches tile the image); the class token is one more grid point, with a learned
initial state and no patch; position embeddings are added to `u(0)`. The tokens then follow the
pre-norm equation (attention and GELU feed-forward, each behind its LayerNorm), and the final
LayerNorm is the output map at `T`. Lie–Trotter with one step per layer is the network exactly.
"""

import re
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import is_int
from .._controls import stack
from .._equation import PreNorm
from .._types import Tokens
from ..terms._activations import ACTIVATIONS, activation_name
from ..terms._projections import LayerNormProjection
from ._loaders import (
    _array,
    _config,
    _eps,
    _heads_divide,
    _linear_layer,
    _positive_int,
    _require,
)
from ._model import Transformer, transformer_equation
from ._state_dict import as_numpy_state_dict, check_state_dict, check_weights, count_layers


def _pair(value, name: str) -> tuple[int, int]:
    """An int or a pair of ints (Hugging Face's `image_size`, `patch_size`) as `(rows, cols)`."""
    if is_int(value):
        value = (value, value)
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise ValueError(f"{name}={value!r} must be an integer or a pair of integers (rows, cols).")
    return tuple(_positive_int(v, name) for v in value)


class ViTEmbeddings(eqx.Module):
    r"""The initial condition of a ViT: patches, class token and positions.

    `u(0) = [c; (Σ_{q ∈ patch(p)} K_{q − q_p} x_q + b)_p] + E`: `kernel` `K` of shape
    `(d, channels, patch rows, patch cols)` applied with the patch as stride (patches in
    row-major order over the grid), the class token `c` first, position embeddings `E`
    `(1 + patches, d)`. A one-channel embedding also takes an image `(height, width)`.
    """

    kernel: Float[Array, "d c ph pw"]
    bias: Float[Array, " d"]
    class_token: Float[Array, " d"]
    position: Float[Array, "n d"]
    image_size: tuple[int, int] = eqx.field(static=True)

    @property
    def patch_size(self) -> tuple[int, int]:
        return tuple(self.kernel.shape[2:])

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row: `(rows // patch rows, cols // patch cols)`."""
        (h, w), (ph, pw) = self.image_size, self.patch_size
        return h // ph, w // pw

    def __call__(self, image: Float[Array, "c h w"]) -> Tokens:
        want = (self.kernel.shape[1], *self.image_size)
        if want[0] == 1 and jnp.shape(image) == want[1:]:
            image = jnp.asarray(image)[None]  # one channel: (height, width) is accepted too
        if jnp.shape(image) != want:
            raise ValueError(
                f"image has shape {tuple(jnp.shape(image))}; this ViT takes one image of shape "
                f"(channels, height, width) = {want} (batch with jax.vmap; resize or crop the "
                "image, the position embeddings are fixed)."
            )
        x = jax.lax.conv_general_dilated(
            image[None].astype(self.kernel.dtype),
            self.kernel,
            window_strides=self.patch_size,
            padding="VALID",
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )[0]
        patches = x.reshape(x.shape[0], -1).T + self.bias
        return jnp.concatenate([self.class_token[None], patches]) + self.position


class ViT(eqx.Module):
    """Hugging Face `ViTModel` recovered: `ViTEmbeddings` + the pre-norm equation (final
    LayerNorm as output map). `model(image)` is `last_hidden_state[0]`, `(1 + patches, d)`."""

    embeddings: ViTEmbeddings
    transformer: Transformer

    def __call__(self, image: Float[Array, "c h w"]) -> Tokens:
        return self.transformer(self.embeddings(image))

    def rediscretize(self, scheme=None, steps_per_layer=None) -> "ViT":
        return ViT(self.embeddings, self.transformer.rediscretize(scheme, steps_per_layer))


# The per-layer names of `ViTModel.state_dict()` in transformers 5, and the classic names (the
# checkpoints on the Hub, transformers 4) they replace.
_VIT_CLASSIC = (
    (r"encoder\.layer\.(\d+)\.attention\.attention\.query\.", r"layers.\1.attention.q_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.key\.", r"layers.\1.attention.k_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.attention\.value\.", r"layers.\1.attention.v_proj."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attention.o_proj."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.mlp.fc1."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.mlp.fc2."),
    (r"encoder\.layer\.(\d+)\.layernorm_(before|after)\.", r"layers.\1.layernorm_\2."),
)


def _modern_vit_keys(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        for pattern, new in _VIT_CLASSIC:
            k2 = re.sub("^" + pattern, new, k)
            if k2 != k:
                k = k2
                break
        out[k] = v
    return out


def vit_from_hf(state_dict: Mapping, config, *, dtype=None) -> ViT:
    r"""Recover Hugging Face `ViTModel` (`last_hidden_state`; the pooler is not used).

    The patch embedding is the integral operator of `ViTEmbeddings` (the initial condition);
    the layers are the pre-norm equation with the config's activation (exact GELU by default)
    and the final `layernorm` is its output map; Lie–Trotter with τ = 1.

    **Arguments:** `state_dict` of `ViTModel` as numpy arrays (transformers 5 names
    `layers.{i}.attention.q_proj…`, or the classic `encoder.layer.{i}.attention.attention.query…`
    of transformers 4 and the Hub's checkpoints; the `vit.`-prefixed state dict of
    `ViTForImageClassification` is accepted, its classifier ignored); `config`: `ViTConfig.to_dict()` (`image_size`
    and `patch_size` an integer or a `(rows, cols)` pair); `dtype`: cast the weights (default:
    keep theirs).

    **Raises** `ValueError` at load for mismatched keys or shapes (another model's state dict
    included), NaN/inf weights, a zero LayerNorm γ, mixed dtypes without `dtype`, and bad or
    unsupported config values; the model raises for an image of the wrong shape.
    """
    arch = "Hugging Face ViTModel"
    sd = as_numpy_state_dict(state_dict)
    if any(k.startswith("vit.") for k in sd):  # ViTForImageClassification: its head is not used
        sd = {k[4:]: v for k, v in sd.items() if k.startswith("vit.")}
    sd = _modern_vit_keys(sd)
    cfg = _config(config, arch)
    d = _positive_int(_require(cfg, "hidden_size", arch), "hidden_size")
    H = _positive_int(_require(cfg, "num_attention_heads", arch), "num_attention_heads")
    L = _positive_int(_require(cfg, "num_hidden_layers", arch), "num_hidden_layers")
    m = _positive_int(cfg.get("intermediate_size", 4 * d), "intermediate_size")
    _heads_divide(d, H, "num_attention_heads")
    eps = _eps(cfg.get("layer_norm_eps", 1e-12), "layer_norm_eps")
    act = ACTIVATIONS.lookup(cfg.get("hidden_act", "gelu"), field="hidden_act")
    C = _positive_int(cfg.get("num_channels", 3), "num_channels")
    image = _pair(_require(cfg, "image_size", arch), "image_size")
    patch = _pair(_require(cfg, "patch_size", arch), "patch_size")
    if any(i % p for i, p in zip(image, patch)):
        raise ValueError(
            f"image_size={list(image)} is not a whole number of patches of patch_size="
            f"{list(patch)} in each direction; ViTModel drops the remainder only when resizing."
        )
    qkv_bias = cfg.get("qkv_bias", True)
    P = (image[0] // patch[0]) * (image[1] // patch[1])
    count_layers(sd, r"layers\.(\d+)\.", architecture=arch)
    per_layer = {
        **{f"attention.{p}_proj.weight": (d, d) for p in "qkvo"},
        **{f"attention.{p}_proj.bias": (d,) for p in ("qkvo" if qkv_bias else "o")},
        "layernorm_before.weight": (d,),
        "layernorm_before.bias": (d,),
        "layernorm_after.weight": (d,),
        "layernorm_after.bias": (d,),
        "mlp.fc1.weight": (m, d),
        "mlp.fc1.bias": (m,),
        "mlp.fc2.weight": (d, m),
        "mlp.fc2.bias": (d,),
    }
    expected = {f"layers.{i}.{k}": s for i in range(L) for k, s in per_layer.items()}
    expected.update(
        {
            "embeddings.cls_token": (1, 1, d),
            "embeddings.position_embeddings": (1, P + 1, d),
            "embeddings.patch_embeddings.projection.weight": (d, C, *patch),
            "embeddings.patch_embeddings.projection.bias": (d,),
            "layernorm.weight": (d,),
            "layernorm.bias": (d,),
        }
    )
    ignore = (r"pooler\.dense\.(weight|bias)", r"embeddings\.mask_token")
    check_state_dict(sd, expected, architecture=arch, ignore=ignore)
    check_weights(
        sd,
        expected,
        architecture=arch,
        layer_norm_weights=[k for k in expected if "layernorm" in k and k.endswith(".weight")],
        cast=dtype is not None,
    )
    names = {
        "q": "attention.q_proj",
        "k": "attention.k_proj",
        "v": "attention.v_proj",
        "o": "attention.o_proj",
        "fc1": "mlp.fc1",
        "fc2": "mlp.fc2",
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
    }

    def layer(i):
        return _linear_layer(
            lambda k: sd[f"layers.{i}.{k}"],
            names,
            num_heads=H,
            activation=act,
            eps=eps,
            dtype=dtype,
            zero_bias=() if qkv_bias else ("q", "k", "v"),
        )

    layers = [layer(i) for i in range(L)]
    output = LayerNormProjection(
        _array(sd["layernorm.weight"], dtype), _array(sd["layernorm.bias"], dtype), eps
    )
    equation = transformer_equation(
        *(stack(x[j] for x in layers) for j in range(4)), PreNorm(), output
    )
    e = lambda k: _array(sd[f"embeddings.{k}"], dtype)
    embeddings = ViTEmbeddings(
        e("patch_embeddings.projection.weight"),
        e("patch_embeddings.projection.bias"),
        e("cls_token")[0, 0],
        e("position_embeddings")[0],
        image,
    )
    return ViT(embeddings, Transformer(equation))


def vit_to_hf(vit: ViT) -> tuple[dict[str, np.ndarray], dict]:
    """The Hugging Face `ViTModel` state dict (transformers 5 names, numpy) and
    `ViTConfig`-style dict of a recovered or trained `ViT` with the network's own
    discretization (Lie–Trotter, one step per layer): `vit_from_hf(*vit_to_hf(v))` is `v`.

    Raises `ValueError` for a model that is not a ViT network: another scheme or step count
    (re-discretized: a torch ViT cannot run it), controls that are not piecewise constant,
    biases missing, or no final LayerNorm.
    """
    from .._controls import PiecewiseConstant
    from ..schemes._splitting import LieTrotter
    from ..terms._attention import MultiHeadAttention
    from ..terms._feedforward import FeedForward

    t, e = vit.transformer, vit.embeddings
    if type(t.scheme) is not LieTrotter or t.steps_per_layer != 1:
        raise ValueError(
            f"vit_to_hf: the model is solved by {type(t.scheme).__name__} with "
            f"{t.steps_per_layer} step(s) per layer; a Hugging Face ViT is Lie-Trotter with one "
            "step per layer: export vit.rediscretize(wb.schemes.LieTrotter(), 1)."
        )
    eq = t.equation
    (attn, ln1), (ffn, ln2) = [(op.term, op.projection) for op in eq.operators]
    controls = (attn, ln1, ffn, ln2)
    if not all(isinstance(c, PiecewiseConstant) for c in controls) or eq.output is None:
        raise ValueError(
            "vit_to_hf: a ViT has piecewise-constant controls (one value per layer) and a final "
            "LayerNorm; interpolated controls or a missing output map have no ViT counterpart."
        )
    a, f, n1, n2 = attn.values, ffn.values, ln1.values, ln2.values
    if not (isinstance(a, MultiHeadAttention) and isinstance(f, FeedForward)):
        raise ValueError("vit_to_hf: the terms must be MultiHeadAttention and FeedForward.")
    if a.causal or any(
        b is None
        for b in (
            a.query_bias,
            a.key_bias,
            a.value_bias,
            a.output_bias,
            f.hidden_bias,
            f.output_bias,
        )
    ):
        raise ValueError("vit_to_hf: a ViT's attention is not causal and every term has biases.")
    L, d = a.query.shape[0], a.query.shape[-1]
    if abs(a.scale * np.sqrt(d // a.num_heads) - 1) > 1e-6:
        raise ValueError(f"vit_to_hf: attention scale {a.scale} is not 1/sqrt(head width).")
    eps = {n1.eps, n2.eps, eq.output.eps}
    if len(eps) != 1:
        raise ValueError(f"vit_to_hf: the LayerNorms use different eps {sorted(eps)}.")
    np_ = lambda x: np.asarray(x)
    sd = {
        "embeddings.cls_token": np_(e.class_token)[None, None],
        "embeddings.position_embeddings": np_(e.position)[None],
        "embeddings.patch_embeddings.projection.weight": np_(e.kernel),
        "embeddings.patch_embeddings.projection.bias": np_(e.bias),
        "layernorm.weight": np_(eq.output.weight),
        "layernorm.bias": np_(eq.output.bias),
    }
    lin = {
        "attention.q_proj": (a.query, a.query_bias),
        "attention.k_proj": (a.key, a.key_bias),
        "attention.v_proj": (a.value, a.value_bias),
        "attention.o_proj": (a.output, a.output_bias),
        "mlp.fc1": (f.hidden, f.hidden_bias),
        "mlp.fc2": (f.output, f.output_bias),
    }
    for i in range(L):
        for name, (w, b) in lin.items():
            sd[f"layers.{i}.{name}.weight"] = np_(w[i]).T
            sd[f"layers.{i}.{name}.bias"] = np_(b[i])
        for name, ln in (("layernorm_before", n1), ("layernorm_after", n2)):
            sd[f"layers.{i}.{name}.weight"] = np_(ln.weight[i])
            sd[f"layers.{i}.{name}.bias"] = np_(ln.bias[i])
    config = {
        "hidden_size": int(d),
        "num_attention_heads": int(a.num_heads),
        "num_hidden_layers": int(L),
        "intermediate_size": int(f.hidden.shape[-1]),
        "image_size": list(e.image_size),
        "patch_size": list(e.patch_size),
        "num_channels": int(e.kernel.shape[1]),
        "qkv_bias": True,
        "layer_norm_eps": float(eps.pop()),
        "hidden_act": activation_name(f.activation),
    }
    return sd, config
