r"""CvT recovered from the equation: Hugging Face `CvtModel`.

A CvT is a sequence of stages, and each stage is the pre-norm equation on its own discretization
grid. The multiscale structure is a change of grid between stages:

- **convolutional token embedding** (the initial condition of a stage): an integral operator
  over a `k × k` neighbourhood, `u(0)_p = Σ_{|q − s p| ≤ r} K_{q − s p} x_q + b`, evaluated on a
  grid `s` times coarser than the previous stage's (a strided convolution with overlapping
  windows), then LayerNorm — the projection onto `S1` followed by its affine map. The width
  changes from stage to stage (`d_s`), so does the number of grid points;
- **attention** (`workbench.terms.ConvolutionalAttention`): before the linear maps, Q, K, V each
  apply a local integral operator in space (a depthwise `k × k` convolution, diagonal in the
  feature variable) and batch normalization in inference form (a per-channel affine map); keys
  and values are sampled on a grid `stride_kv` times coarser, i.e. the nonlocal attention
  integral uses a coarser quadrature in the token variable;
- **feed-forward**: the integral operator in the feature variable with GELU, as in ViT;
- **class token**: in the last stage only, one more point of the state that is not on the grid:
  a learned initial value, skipped by the convolutions, attended to by every token.

Each stage's layers are `u + A(LN₁(u))`, `u + F(LN₂(u))` (the pre-norm placement);
Lie–Trotter with one step per layer is the network exactly. `CvtModel` has no final LayerNorm.
"""

from collections.abc import Mapping, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._checks import boolean, is_number, positive_int
from .._controls import stack
from .._equation import PreNorm
from ..terms._activations import gelu
from ..terms._convolution import ConvolutionalAttention, DepthwiseConvolution
from ..terms._feedforward import FeedForward
from ..terms._projections import LayerNormProjection
from ._loaders import _array, _config, _heads_divide, _positive_int, _require
from ._model import Transformer, transformer_equation
from ._state_dict import as_numpy_state_dict, check_state_dict, check_weights
from ._vision import _pair

# nn.LayerNorm and nn.BatchNorm2d defaults: Hugging Face's CvT does not read `layer_norm_eps`.
_EPS = 1e-5


def _grid_after(grid, kernel: int, stride: int, padding: int) -> tuple[int, int]:
    return tuple((g + 2 * padding - kernel) // stride + 1 for g in grid)


class ConvTokenEmbedding(eqx.Module):
    r"""A stage's initial condition: `u(0) = LN(K * x + b)` on the coarser grid.

    `kernel` `(d, c, k, k)` applied with `stride` and zero `padding` (PyTorch `Conv2d` layout),
    tokens in row-major order over the output grid, then the LayerNorm `norm` row by row.
    """

    kernel: Float[Array, "d c k k"]
    bias: Float[Array, " d"]
    norm: LayerNormProjection
    stride: int = eqx.field(static=True)
    padding: int = eqx.field(static=True)

    def output_grid(self, grid: tuple[int, int]) -> tuple[int, int]:
        return _grid_after(grid, self.kernel.shape[-1], self.stride, self.padding)

    def __call__(self, x: Float[Array, "c h w"]) -> Float[Array, "n d"]:
        p = self.padding
        y = jax.lax.conv_general_dilated(
            x[None].astype(self.kernel.dtype),
            self.kernel,
            window_strides=(self.stride, self.stride),
            padding=((p, p), (p, p)),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )[0]
        return self.norm(y.reshape(y.shape[0], -1).T + self.bias)


class CvTStage(eqx.Module):
    """One stage: token embedding onto the stage's grid, an optional class token, and the
    pre-norm equation on that grid. Maps an image or feature map `(c, h, w)` to the stage's
    feature map `(d, rows, cols)` and its class token (or `None`)."""

    embedding: ConvTokenEmbedding
    transformer: Transformer
    class_token: Float[Array, " d"] | None
    grid: tuple[int, int] = eqx.field(static=True)

    def __call__(self, x):
        u = self.embedding(x)
        if self.class_token is not None:
            u = jnp.concatenate([self.class_token[None], u])
        u = self.transformer(u)
        cls, u = (u[0], u[1:]) if self.class_token is not None else (None, u)
        return u.T.reshape(-1, *self.grid), cls


class CvT(eqx.Module):
    """Hugging Face `CvtModel` recovered: stages of the pre-norm equation on coarsening grids.

    `model(image)` with `image` `(channels, *image_size)` returns `(tokens, class_token)`:
    `tokens` `(rows · cols, d)` are the last stage's grid tokens in row-major order
    (`last_hidden_state[0].reshape(d, -1).T`), `class_token` `(d,)` is `cls_token_value[0, 0]`
    (or `None` when the last stage has none). Batch with `jax.vmap`.
    """

    stages: tuple[CvTStage, ...]
    image_size: tuple[int, int] = eqx.field(static=True)

    @property
    def grids(self) -> tuple[tuple[int, int], ...]:
        """The discretization grid `(rows, cols)` of each stage."""
        return tuple(s.grid for s in self.stages)

    def feature_maps(self, image: Float[Array, "c h w"]) -> list:
        """Every stage's output `(feature map (d, rows, cols), class token or None)`."""
        want = (self.stages[0].embedding.kernel.shape[1], *self.image_size)
        if jnp.shape(image) != want:
            raise ValueError(
                f"image has shape {tuple(jnp.shape(image))}; this CvT was built for one image of "
                f"shape (channels, height, width) = {want} (batch with jax.vmap; for another "
                "size load it again with cvt_from_hf(..., image_size=(height, width)): the "
                "stages' grids depend on it)."
            )
        out, x = [], image
        for stage in self.stages:
            x, cls = stage(x)
            out.append((x, cls))
        return out

    def __call__(self, image: Float[Array, "c h w"]):
        x, cls = self.feature_maps(image)[-1]
        return x.reshape(x.shape[0], -1).T, cls

    def rediscretize(self, scheme=None, steps_per_layer=None) -> "CvT":
        """Every stage's equation solved with another scheme and/or step count."""
        stages = tuple(
            eqx.tree_at(
                lambda s: s.transformer, s, s.transformer.rediscretize(scheme, steps_per_layer)
            )
            for s in self.stages
        )
        return CvT(stages, self.image_size)


_STAGE_FIELDS = (
    "patch_sizes",
    "patch_stride",
    "patch_padding",
    "embed_dim",
    "num_heads",
    "depth",
    "mlp_ratio",
    "qkv_bias",
    "cls_token",
    "qkv_projection_method",
    "kernel_qkv",
    "padding_kv",
    "stride_kv",
    "padding_q",
    "stride_q",
)


def _stage_lists(cfg: dict, arch: str) -> tuple[int, dict]:
    lists = {}
    for f in _STAGE_FIELDS:
        v = _require(cfg, f, arch)
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v:
            raise ValueError(f"{f}={v!r} must be a non-empty list with one entry per stage.")
        lists[f] = list(v)
    lengths = {f: len(v) for f, v in lists.items()}
    S = len(lists["depth"])
    if set(lengths.values()) != {S}:
        raise ValueError(
            f"config for {arch}: the per-stage lists have different lengths "
            f"({', '.join(f'{f}: {n}' for f, n in lengths.items())}); each needs one entry per stage."
        )
    return S, lists


def _nonneg_int(value, name: str) -> int:
    return positive_int(name, value, allow_zero=True)


def cvt_from_hf(state_dict: Mapping, config, *, image_size=(224, 224), dtype=None) -> CvT:
    r"""Recover Hugging Face `CvtModel` (`last_hidden_state` and `cls_token_value`).

    Each stage is the pre-norm equation on its grid (`ConvTokenEmbedding` gives its initial
    condition, `ConvolutionalAttention` and a GELU `FeedForward` are its terms), solved by
    Lie–Trotter with τ = 1; see the module docstring for which parts are integral operators.

    **Arguments:** `state_dict` of `CvtModel` as numpy arrays (the `cvt.`-prefixed state dict of
    `CvtForImageClassification` is accepted; its head is ignored); `config`: `CvtConfig.to_dict()`;
    `image_size`: `(height, width)` of the images the model will take (an int for a square), which
    fixes every stage's grid — 224 for the published CvT-13/21; `dtype`: cast the weights (default:
    keep theirs).

    Supported options: `qkv_projection_method` `"dw_bn"` only (Hugging Face builds no projection
    for `"avg"` or `"linear"` and cannot run them); a class token only in the last stage (Hugging
    Face gives it the last stage's width and drops it at the end of its stage). Dropout and
    drop-path rates are ignored (inference). LayerNorm and BatchNorm use ε = 1e-5, as Hugging
    Face does whatever `layer_norm_eps` says.

    **Raises** `ValueError` at load for unsupported options (naming the stage and the valid
    choice), per-stage lists of different lengths, an image too small for the stages' kernels,
    mismatched keys or shapes (another model's state dict included), NaN/inf weights, a zero
    LayerNorm γ, a negative BatchNorm running variance, and mixed dtypes without `dtype`; the model
    raises for an image of the wrong shape or channel count.
    """
    arch = "Hugging Face CvtModel"
    sd = as_numpy_state_dict(state_dict)
    if any(k.startswith("cvt.") for k in sd):  # CvtForImageClassification
        sd = {k[4:]: v for k, v in sd.items() if k.startswith("cvt.")}
    cfg = _config(config, arch)
    S, st = _stage_lists(cfg, arch)
    C = _positive_int(cfg.get("num_channels", 3), "num_channels")
    image = _pair(image_size, "image_size")

    grids, grid = [], image
    for s in range(S):
        method = st["qkv_projection_method"][s]
        if method != "dw_bn":
            raise ValueError(
                f"qkv_projection_method[{s}]={method!r} is not supported; valid: 'dw_bn' "
                "(Hugging Face's CvtModel builds no convolutional projection for 'avg' or "
                "'linear' and fails on them)."
            )
        if st["cls_token"][s] and s != S - 1:
            raise ValueError(
                f"cls_token[{s}]=True is not supported: a class token is valid only in the last "
                f"stage (stage {S - 1}); Hugging Face gives it the last stage's width and drops "
                "it at the end of its own stage."
            )
        for f in ("cls_token", "qkv_bias"):
            boolean(f"{f}[{s}]", st[f][s])
        d = _positive_int(st["embed_dim"][s], f"embed_dim[{s}]")
        _heads_divide(d, _positive_int(st["num_heads"][s], f"num_heads[{s}]"), f"num_heads[{s}]")
        _positive_int(st["depth"][s], f"depth[{s}]")
        r = st["mlp_ratio"][s]
        if not is_number(r) or int(d * r) < 1:
            raise ValueError(
                f"mlp_ratio[{s}]={r!r} must be a positive number (hidden width d·ratio)."
            )
        k = _positive_int(st["patch_sizes"][s], f"patch_sizes[{s}]")
        stride = _positive_int(st["patch_stride"][s], f"patch_stride[{s}]")
        pad = _nonneg_int(st["patch_padding"][s], f"patch_padding[{s}]")
        grid = _grid_after(grid, k, stride, pad)
        kq = _positive_int(st["kernel_qkv"][s], f"kernel_qkv[{s}]")
        for f in ("stride_q", "stride_kv"):
            _positive_int(st[f][s], f"{f}[{s}]")
        for f in ("padding_q", "padding_kv"):
            _nonneg_int(st[f][s], f"{f}[{s}]")
        q_grid = _grid_after(grid, kq, st["stride_q"][s], st["padding_q"][s])
        kv_grid = _grid_after(grid, kq, st["stride_kv"][s], st["padding_kv"][s])
        if min(grid) < 1 or min(q_grid) < 1 or min(kv_grid) < 1:
            raise ValueError(
                f"image_size={list(image)} is too small for stage {s}: its grid would be "
                f"{list(grid)} (queries {list(q_grid)}, keys/values {list(kv_grid)}); the "
                "stages' kernels, strides and paddings need a larger image."
            )
        if q_grid != grid:
            raise ValueError(
                f"stride_q[{s}]={st['stride_q'][s]} with padding_q[{s}]={st['padding_q'][s]} "
                f"maps the {list(grid)} grid to {list(q_grid)}: the queries must stay on the "
                "stage's grid (one query per token, as the residual connection needs); valid: "
                "stride_q 1 and 2 * padding_q = kernel_qkv - 1."
            )
        grids.append(grid)

    expected, ln_keys = {}, []
    for s in range(S):
        d = st["embed_dim"][s]
        c_in = C if s == 0 else st["embed_dim"][s - 1]
        k, kq = st["patch_sizes"][s], st["kernel_qkv"][s]
        m = int(d * st["mlp_ratio"][s])
        p = f"encoder.stages.{s}."
        e = p + "embedding.convolution_embeddings."
        expected.update(
            {
                e + "projection.weight": (d, c_in, k, k),
                e + "projection.bias": (d,),
                e + "normalization.weight": (d,),
                e + "normalization.bias": (d,),
            }
        )
        ln_keys.append(e + "normalization.weight")
        if st["cls_token"][s]:
            expected[p + "cls_token"] = (1, 1, st["embed_dim"][-1])
        for i in range(st["depth"][s]):
            lp = f"{p}layers.{i}."
            a = lp + "attention.attention."
            for r in ("query", "key", "value"):
                cp = f"{a}convolution_projection_{r}.convolution_projection."
                expected[cp + "convolution.weight"] = (d, 1, kq, kq)
                for b in ("weight", "bias", "running_mean", "running_var"):
                    expected[cp + "normalization." + b] = (d,)
                expected[f"{a}projection_{r}.weight"] = (d, d)
                if st["qkv_bias"][s]:
                    expected[f"{a}projection_{r}.bias"] = (d,)
            expected.update(
                {
                    lp + "attention.output.dense.weight": (d, d),
                    lp + "attention.output.dense.bias": (d,),
                    lp + "intermediate.dense.weight": (m, d),
                    lp + "intermediate.dense.bias": (m,),
                    lp + "output.dense.weight": (d, m),
                    lp + "output.dense.bias": (d,),
                }
            )
            for n in ("layernorm_before", "layernorm_after"):
                expected[f"{lp}{n}.weight"] = (d,)
                expected[f"{lp}{n}.bias"] = (d,)
                ln_keys.append(f"{lp}{n}.weight")
    ignore = (r".*\.num_batches_tracked", r"layernorm\.(weight|bias)", r"classifier\..*")
    check_state_dict(sd, expected, architecture=arch, ignore=ignore)
    check_weights(
        sd, expected, architecture=arch, layer_norm_weights=ln_keys, cast=dtype is not None
    )
    negative = sorted(k for k in expected if k.endswith("running_var") and (sd[k] < 0).any())
    if negative:
        raise ValueError(
            f"state dict for {arch}: negative BatchNorm running variances in {len(negative)} "
            f"key(s), e.g. {negative[0]}; a variance must be >= 0."
        )

    a = lambda k: _array(sd[k], dtype)
    stages = []
    for s in range(S):
        p = f"encoder.stages.{s}."
        e = p + "embedding.convolution_embeddings."
        embedding = ConvTokenEmbedding(
            a(e + "projection.weight"),
            a(e + "projection.bias"),
            LayerNormProjection(a(e + "normalization.weight"), a(e + "normalization.bias"), _EPS),
            st["patch_stride"][s],
            st["patch_padding"][s],
        )
        d, cls = st["embed_dim"][s], bool(st["cls_token"][s])

        def conv(lp, r, stride, padding):
            cp = f"{lp}attention.attention.convolution_projection_{r}.convolution_projection."
            bn = lambda b: a(cp + "normalization." + b)
            return DepthwiseConvolution(
                a(cp + "convolution.weight"),
                bn("weight"),
                bn("bias"),
                bn("running_mean"),
                bn("running_var"),
                _EPS,
                int(stride),
                int(padding),
            )

        def layer(i):
            lp = f"{p}layers.{i}."
            lin = lambda n: _array(sd[lp + n + ".weight"].T, dtype)
            qkv_b = lambda r: (
                a(f"{lp}attention.attention.projection_{r}.bias") if st["qkv_bias"][s] else None
            )
            q_conv = conv(lp, "query", st["stride_q"][s], st["padding_q"][s])
            kv = [conv(lp, r, st["stride_kv"][s], st["padding_kv"][s]) for r in ("key", "value")]
            attn = ConvolutionalAttention(
                q_conv,
                *kv,
                *(lin(f"attention.attention.projection_{r}") for r in ("query", "key", "value")),
                lin("attention.output.dense"),
                *(qkv_b(r) for r in ("query", "key", "value")),
                a(lp + "attention.output.dense.bias"),
                num_heads=int(st["num_heads"][s]),
                scale=float(d) ** -0.5,
                grid=grids[s],
                class_token=cls,
            )
            ffn = FeedForward(
                lin("intermediate.dense"),
                a(lp + "intermediate.dense.bias"),
                lin("output.dense"),
                a(lp + "output.dense.bias"),
                activation=gelu,
            )
            ln = lambda n: LayerNormProjection(a(f"{lp}{n}.weight"), a(f"{lp}{n}.bias"), _EPS)
            return attn, ln("layernorm_before"), ffn, ln("layernorm_after")

        layers = [layer(i) for i in range(st["depth"][s])]
        equation = transformer_equation(*(stack(x[j] for x in layers) for j in range(4)), PreNorm())
        token = a(p + "cls_token")[0, 0] if cls else None
        stages.append(CvTStage(embedding, Transformer(equation), token, grids[s]))
    return CvT(tuple(stages), image)
