r"""Trainable models of the equation: an initial condition (embedding), the controlled equation
(a `Transformer`: equation + controls + scheme), and a readout head.

`u(0) = embed(x)`, `u_t = Σ_k G_k(u; θ(t))` on `[0, T]`, prediction `= head(u(T))`: training the
controls θ, the embedding and the head is the optimal-control problem of docs/control.md.
"""

import math
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._checks import int_in_range, is_int
from .._controls import AbstractControl, Interpolated, PiecewiseConstant
from .._equation import Equation, Operator, PostNorm, PreNorm
from .._random import normal
from .._types import Tokens
from ..architectures._model import Transformer, to_basis
from ..architectures._vision import ViT, ViTEmbeddings
from ..schemes._splitting import AbstractSplittingScheme, LieTrotter
from ..terms._activations import gelu
from ..terms._attention import MultiHeadAttention
from ..terms._feedforward import FeedForward
from ..terms._projections import LayerNormProjection

__all__ = [
    "ClassifierHead",
    "ControlledModel",
    "PatchEmbedding",
    "SequenceHead",
    "TokenEmbedding",
    "extend_depth",
    "interpolate_controls",
    "random_transformer",
    "random_vit",
    "refine_depth",
    "vit_classifier",
]


def _check_int(name: str, value, low: int = 1) -> int:
    return int_in_range(name, value, low)


def random_transformer(
    key: PRNGKeyArray,
    *,
    d: int,
    num_heads: int,
    num_layers: int,
    hidden: int,
    activation: Callable = gelu,
    causal: bool = False,
    pre_norm: bool = True,
    scheme: AbstractSplittingScheme = LieTrotter(),
    steps_per_layer: int = 1,
    layer_norm_eps: float = 1e-5,
    output_scale: float = 0.1,
    dtype=jnp.float32,
    basis=None,
) -> Transformer:
    r"""A Transformer equation with freshly initialized controls, ready to train.

    Attention and feed-forward kernels are `N(0, 1/fan_in)`, biases zero, LayerNorms `γ = 1,
    β = 0`; the output kernels of both terms are scaled by `output_scale`, so the initial field
    is small and `u(T)` starts near `u(0)` (a short flow, as for a residual network whose
    branches start small). Pre-norm (the default) puts the LayerNorm inside each operator and a
    final LayerNorm as the output map (GPT-2, ViT); post-norm projects after each sub-flow.

    **Arguments:** `key`; `d` (width), `num_heads` (divides `d`), `num_layers` (the controls'
    pieces, each of duration 1), `hidden` (feed-forward width); `activation`; `causal`
    (GPT-style attention); `pre_norm`; `scheme`, `steps_per_layer` (the discretization);
    `layer_norm_eps`; `output_scale`; `dtype`; `basis`: the controls' basis, `None` for a
    network's layers (`wb.PiecewiseConstantBasis(num_layers)`), or e.g.
    `wb.LegendreBasis(num_layers - 1)`: the fresh layers projected onto it (`wb.to_basis`, at
    most `num_layers` functions; the total number of steps is kept).
    """
    d = _check_int("d", d)
    num_heads = _check_int("num_heads", num_heads)
    if d % num_heads:
        divisors = [k for k in range(1, d + 1) if d % k == 0]
        raise ValueError(f"num_heads={num_heads} must divide d={d}; choose among {divisors}.")
    num_layers = _check_int("num_layers", num_layers)
    hidden = _check_int("hidden", hidden)
    L = num_layers
    kq, kk, kv, ko, k1, k2 = jax.random.split(key, 6)
    zeros = lambda *shape: jnp.zeros((L, *shape), dtype)
    attention = MultiHeadAttention(
        normal(kq, (L, d, d), dtype, 1 / math.sqrt(d)),
        normal(kk, (L, d, d), dtype, 1 / math.sqrt(d)),
        normal(kv, (L, d, d), dtype, 1 / math.sqrt(d)),
        normal(ko, (L, d, d), dtype, output_scale / math.sqrt(d)),
        zeros(d),
        zeros(d),
        zeros(d),
        zeros(d),
        num_heads=num_heads,
        causal=causal,
    )
    feedforward = FeedForward(
        normal(k1, (L, d, hidden), dtype, 1 / math.sqrt(d)),
        zeros(hidden),
        normal(k2, (L, hidden, d), dtype, output_scale / math.sqrt(hidden)),
        zeros(d),
        activation=activation,
    )

    def norm():
        return LayerNormProjection(jnp.ones((L, d), dtype), zeros(d), layer_norm_eps)

    final = LayerNormProjection(jnp.ones(d, dtype), jnp.zeros(d, dtype), layer_norm_eps)
    equation = Equation(
        (
            Operator(PiecewiseConstant(attention), PiecewiseConstant(norm())),
            Operator(PiecewiseConstant(feedforward), PiecewiseConstant(norm())),
        ),
        PreNorm() if pre_norm else PostNorm(),
        final if pre_norm else None,
    )
    transformer = Transformer(equation, scheme, steps_per_layer)
    if basis is None:
        return transformer
    return to_basis(transformer, basis)


def random_vit(
    key: PRNGKeyArray,
    *,
    image_size: tuple[int, int],
    patch_size: int | tuple[int, int],
    num_channels: int = 1,
    d: int,
    num_heads: int,
    num_layers: int,
    hidden: int,
    layer_norm_eps: float = 1e-5,
    output_scale: float = 0.1,
    dtype=jnp.float32,
) -> ViT:
    r"""A Hugging Face-compatible ViT (`wb.architectures.ViT`) with fresh controls, to train.

    The embedding is `ViTEmbeddings` (non-overlapping patches as an integral operator, a class
    token, position embeddings), the equation `random_transformer`'s pre-norm GELU equation with
    a final LayerNorm. `wb.architectures.vit_to_hf` exports it (trained or not) as a `ViTModel`
    state dict and config. Patch kernel `N(0, 1/fan_in)`, bias and class token zero, positions
    `N(0, 0.02²)`.
    """
    from ..architectures._vision import _pair

    image, patch = _pair(image_size, "image_size"), _pair(patch_size, "patch_size")
    if any(i % p for i, p in zip(image, patch)):
        raise ValueError(
            f"image_size={list(image)} is not a whole number of patches of patch_size={list(patch)}."
        )
    c = _check_int("num_channels", num_channels)
    d = _check_int("d", d)
    grid = (image[0] // patch[0]) * (image[1] // patch[1])
    k1, k2, k3 = jax.random.split(key, 3)
    embeddings = ViTEmbeddings(
        normal(k1, (d, c, *patch), dtype, 1 / math.sqrt(c * patch[0] * patch[1])),
        jnp.zeros(d, dtype),
        jnp.zeros(d, dtype),
        normal(k2, (1 + grid, d), dtype, 0.02),
        image,
    )
    transformer = random_transformer(
        k3,
        d=d,
        num_heads=num_heads,
        num_layers=num_layers,
        hidden=hidden,
        layer_norm_eps=layer_norm_eps,
        output_scale=output_scale,
        dtype=dtype,
    )
    return ViT(embeddings, transformer)


def vit_classifier(vit: ViT, num_classes: int) -> "ControlledModel":
    """A ViT (recovered with `vit_from_hf` or from `random_vit`) with a linear head on its class
    token, ready for `train`: `ViTForImageClassification`'s logits, `W · LN(u(T))_0 + b` (head
    zero-initialized)."""
    if not isinstance(vit, ViT):
        raise ValueError(
            f"vit_classifier takes a workbench.architectures.ViT; got {type(vit).__name__}."
        )
    return ControlledModel(
        vit.embeddings,
        vit.transformer,
        ClassifierHead(vit.transformer.d, num_classes, dtype=vit.embeddings.kernel.dtype),
    )


class PatchEmbedding(eqx.Module):
    r"""Images to tokens: `u(0)_p = Σ_{q ∈ patch(p)} x_q W_q + b + pos_p`, plus a class token.

    The patch map is an integral operator over each patch of the image (a convolution with
    kernel `kernel_size` and stride `stride`, zero padding `padding`); the class token is one
    more grid point, with its own learned value. Position embeddings make the initial
    condition depend on where a patch is.

    Input: one image `(H, W)` (one channel) or `(C, H, W)`; output `(1 + patches, d)`, the class
    token first.
    """

    kernel: Float[Array, "c kh kw d"]
    bias: Float[Array, " d"]
    cls: Float[Array, " d"]
    position: Float[Array, "tokens d"]
    image_shape: tuple[int, int, int] = eqx.field(static=True)
    kernel_size: int = eqx.field(static=True)
    stride: int = eqx.field(static=True)
    padding: int = eqx.field(static=True)

    def __init__(
        self,
        image_shape: tuple[int, ...],
        d: int,
        *,
        kernel_size: int,
        stride: int | None = None,
        padding: int = 0,
        key: PRNGKeyArray,
        dtype=jnp.float32,
    ):
        shape = tuple(int(s) for s in image_shape)
        if len(shape) == 2:
            shape = (1, *shape)
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"image_shape={image_shape!r} must be (H, W) or (C, H, W).")
        self.image_shape = shape
        self.kernel_size = _check_int("kernel_size", kernel_size)
        self.stride = _check_int("stride", self.kernel_size if stride is None else stride)
        self.padding = _check_int("padding", padding, 0)
        c = shape[0]
        grid = [(s + 2 * self.padding - self.kernel_size) // self.stride + 1 for s in shape[1:]]
        if min(grid) < 1:
            raise ValueError(
                f"kernel_size={kernel_size} with padding={padding} does not fit the image "
                f"{shape[1:]}."
            )
        fan_in = c * self.kernel_size**2
        k1, k2 = jax.random.split(key)
        self.kernel = normal(
            k1, (c, self.kernel_size, self.kernel_size, d), dtype, 1 / math.sqrt(fan_in)
        )
        self.bias = jnp.zeros(d, dtype)
        self.cls = jnp.zeros(d, dtype)
        self.position = normal(k2, (1 + grid[0] * grid[1], d), dtype, 0.02)

    @property
    def num_tokens(self) -> int:
        return self.position.shape[0]

    def __call__(self, image) -> Tokens:
        x = jnp.asarray(image, self.kernel.dtype)
        if x.ndim == 2:
            x = x[None]
        if tuple(x.shape) != self.image_shape:
            raise ValueError(
                f"image has shape {tuple(jnp.shape(image))}; this embedding takes "
                f"{self.image_shape} (or {self.image_shape[1:]} for one channel)."
            )
        w = jnp.transpose(self.kernel, (3, 0, 1, 2))  # (d, c, kh, kw): OIHW
        p = self.padding
        y = jax.lax.conv_general_dilated(x[None], w, (self.stride, self.stride), [(p, p), (p, p)])[
            0
        ]  # (d, gh, gw)
        tokens = y.reshape(y.shape[0], -1).T + self.bias
        return jnp.concatenate([self.cls[None], tokens]) + self.position


class TokenEmbedding(eqx.Module):
    """Token ids to the initial condition: `u(0)_i = E[x_i] + pos_i` (GPT-2's embedding)."""

    word: Float[Array, "vocab d"]
    position: Float[Array, "positions d"]

    def __init__(self, vocab: int, positions: int, d: int, *, key: PRNGKeyArray, dtype=jnp.float32):
        k1, k2 = jax.random.split(key)
        self.word = normal(k1, (_check_int("vocab", vocab), d), dtype, 0.5)
        self.position = normal(k2, (_check_int("positions", positions), d), dtype, 0.5)

    def __call__(self, ids: Int[Array, " n"]) -> Tokens:
        n = jnp.shape(ids)[0]
        if n > self.position.shape[0]:
            raise ValueError(
                f"ids has length {n}; this embedding takes at most {self.position.shape[0]}."
            )
        return self.word[ids] + self.position[:n]


class ClassifierHead(eqx.Module):
    """Logits from the class token: `W u(T)_0 + b` (the final LayerNorm is the equation's output
    map)."""

    weight: Float[Array, "d classes"]
    bias: Float[Array, " classes"]

    def __init__(self, d: int, num_classes: int, *, dtype=jnp.float32):
        self.weight = jnp.zeros((d, _check_int("num_classes", num_classes, 2)), dtype)
        self.bias = jnp.zeros(num_classes, dtype)

    def __call__(self, u: Tokens):
        return u[0] @ self.weight + self.bias


class SequenceHead(eqx.Module):
    """Logits at every position: `u(T)_i W + b`, shape `(n, vocab)`."""

    weight: Float[Array, "d vocab"]
    bias: Float[Array, " vocab"]

    def __init__(self, d: int, vocab: int, *, dtype=jnp.float32):
        self.weight = jnp.zeros((d, _check_int("vocab", vocab, 2)), dtype)
        self.bias = jnp.zeros(vocab, dtype)

    def __call__(self, u: Tokens):
        return u @ self.weight + self.bias


class ControlledModel(eqx.Module):
    r"""`x ↦ head(u(T))` with `u(0) = embedding(x)` and `u` solving `transformer`'s equation.

    `transformer` carries the equation, its controls and the discretization (scheme and steps
    per layer); `rediscretize` changes the latter and keeps everything trained.
    """

    embedding: eqx.Module
    transformer: Transformer
    head: eqx.Module

    def solve(self, x, **kwargs):
        """The `Solution` of the equation from `embedding(x)` (keyword arguments go to
        `workbench.integrate`: `adjoint=`, `running_cost=`, `throw=`)."""
        return self.transformer.solve(self.embedding(x), **kwargs)

    def __call__(self, x):
        return self.head(self.transformer(self.embedding(x)))

    def rediscretize(self, scheme=None, steps_per_layer=None) -> "ControlledModel":
        return ControlledModel(
            self.embedding, self.transformer.rediscretize(scheme, steps_per_layer), self.head
        )


def _map_controls(model, fn: Callable[[AbstractControl], AbstractControl]):
    """`model` (a `Transformer` or a `ControlledModel`) with `fn` applied to every control."""
    if isinstance(model, ControlledModel):
        return ControlledModel(model.embedding, _map_controls(model.transformer, fn), model.head)
    if not isinstance(model, Transformer):
        raise ValueError(
            f"expected a ControlledModel or a workbench.architectures.Transformer, got "
            f"{type(model).__name__}."
        )
    eq = model.equation
    ops = tuple(
        Operator(fn(op.term), None if op.projection is None else fn(op.projection))
        for op in eq.operators
    )
    return Transformer(Equation(ops, eq.placement, eq.output), model.scheme, model.steps_per_layer)


def interpolate_controls(model):
    r"""The model with every control made `Interpolated` through the same layer values: θ(t)
    piecewise linear through `θ_l` at the layer midpoints instead of piecewise constant. Its
    steps need not align with layers, so it can be solved (and trained) on any grid.
    Accepts a `ControlledModel` or a `Transformer`; the scheme and steps are kept."""

    def fn(c):
        return c if isinstance(c, Interpolated) else Interpolated(c.values, c.piece_length)

    return _map_controls(model, fn)


def refine_depth(model, factor: int):
    r"""The model on `factor` times as many layers of duration `h / factor` (same `T`): every
    control refined (`PiecewiseConstant.refine` repeats each layer, `Interpolated.refine`
    samples θ at the new midpoints). With the same `steps_per_layer`, the refined model takes
    `factor` times as many steps: train at `N` steps, refine, continue training at `2N`."""
    return _map_controls(model, lambda c: c.refine(factor))


def coarsen_depth(model, factor: int):
    r"""The model on `1 / factor` of its basis functions (same `T`): every control projected
    onto the coarser basis. For a network's layers (`PiecewiseConstant.coarsen`) that is
    `num_layers / factor` layers of duration `factor · h`, each the mean of a run of `factor`
    layers (the L² projection); with the same scheme and `steps_per_layer` it takes `factor`
    times fewer steps of `factor` times the size. For `wb.Legendre` controls it keeps the first
    `n / factor` coefficients (`Legendre.coarsen`, the L² projection onto the lower degree) and
    the model's steps; solve it with fewer steps with `rediscretize`. Either way it is the
    compression of a trained model without retraining or data (half the basis for
    `factor = 2`). Interpolated controls have no nested coarser basis and are refused (project
    them with `wb.to_basis`); the inverse of `refine_depth` for layers."""

    def fn(c):
        if not hasattr(c, "coarsen"):
            raise ValueError(
                f"coarsen_depth needs controls with a nested coarser basis (a network's layers, "
                f"wb.PiecewiseConstant, or wb.Legendre); got {type(c).__name__}. Project it "
                "with wb.to_basis(model, basis) instead."
            )
        return c.coarsen(factor)

    return _map_controls(model, fn)


def extend_depth(model, num_layers: int):
    r"""The model solved past its depth: `num_layers` layers of the same duration, the last
    layer's controls held on `[T, T']` (`T' = num_layers · h`). The trained layers are kept as
    they are; with the same scheme and steps the extended model's state at `T` is the
    original's output. Accepts a `ControlledModel` or a `Transformer`."""
    if not is_int(num_layers):
        raise ValueError(f"num_layers={num_layers!r} must be an integer.")

    def fn(c):
        if num_layers < c.num_pieces:
            raise ValueError(
                f"num_layers={num_layers} is fewer than the model's {c.num_pieces} layers; "
                "extend_depth only adds layers."
            )
        extra = num_layers - c.num_pieces

        def grow(x):
            if not eqx.is_array(x):
                return x
            return jnp.concatenate([x, jnp.repeat(x[-1:], extra, axis=0)])

        return type(c)(jax.tree.map(grow, c.values), c.piece_length)

    return _map_controls(model, fn)
