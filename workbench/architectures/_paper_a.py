"""Paper A's literal scheme: attention, S1 projection, J ReLU-projected linear substeps, average, S1."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._controls import stack
from .._equation import PostNorm
from .._integrate import check_dtype, check_tokens
from .._types import Tokens
from ..schemes._paper_a import PaperALiteral
from ..terms._activations import relu
from ..terms._attention import MultiHeadAttention
from ..terms._feedforward import FeedForward, LinearKernel
from ..terms._projections import LayerNormProjection, NonnegativeProjection
from ._model import Transformer, transformer_equation


class PaperAEncoder(eqx.Module):
    r"""A post-norm encoder advanced by paper A's literal `M = 4 + J` substep scheme, τ = 1.

    Controls per layer: attention, `J` width-`d` linear kernels `(W_j, b_j)` (the vector field
    `u W_j + b_j`), and the two exact S1 projections. See `workbench.schemes.PaperALiteral` for the
    substeps. `post_ln_equivalent()` gives the standard post-LN network with `W̃_j = I + W_j`, which
    this model equals exactly when the projections are exact (`eps = 0`).

    **Arguments:** stacked (leading layer axis) `attention`, `kernels` (weights `(L, J, d, d)`),
    `norm1`, `norm2`.
    """

    attention: MultiHeadAttention
    kernels: LinearKernel
    norm1: LayerNormProjection
    norm2: LayerNormProjection

    @property
    def scheme(self) -> PaperALiteral:
        return PaperALiteral(num_linear=self.kernels.weight.shape[1])

    @property
    def d(self) -> int:
        return self.attention.query.shape[-2]

    @classmethod
    def random(
        cls,
        rng: np.random.Generator,
        *,
        d: int,
        num_heads: int,
        num_layers: int,
        num_linear: int = 2,
        eps: float = 0.0,
        dtype=np.float64,
    ) -> "PaperAEncoder":
        """Random controls (numpy generator), exact projections when `eps = 0`."""
        w = lambda *s: jnp.asarray(
            rng.standard_normal(s) / np.sqrt(s[-2] if len(s) > 1 else 10), dtype
        )
        layers = []
        for _ in range(num_layers):
            attn = MultiHeadAttention(
                w(d, d), w(d, d), w(d, d), w(d, d), w(d), w(d), w(d), w(d), num_heads=num_heads
            )
            kern = LinearKernel(w(num_linear, d, d), w(num_linear, d))
            ln = lambda: LayerNormProjection(
                jnp.asarray(1 + 0.1 * rng.standard_normal(d), dtype),
                jnp.asarray(0.1 * rng.standard_normal(d), dtype),
                eps,
            )
            layers.append((attn, kern, ln(), ln()))
        return cls(*(stack(x[i] for x in layers) for i in range(4)))

    def layer(self, u: Tokens, attention, kernels, norm1, norm2) -> Tokens:
        """One layer of the literal scheme (the substeps of `PaperALiteral.substeps()`)."""
        z = norm1(attention.substep(u, 1.0))  # Euler(attention), P_S1
        w = z
        J = kernels.weight.shape[0]
        for j in range(J):  # J linear Euler substeps
            w = LinearKernel(kernels.weight[j], kernels.bias[j]).substep(w, 1.0)
            if j < J - 1:
                w = NonnegativeProjection()(w)  # P_S2 (ReLU)
        return norm2(0.5 * (z + w))  # average, P_S1

    def __call__(self, u: Tokens) -> Tokens:
        """One sequence `(n, d)` in the weights' dtype (another floating dtype is a `ValueError`)."""
        check_tokens(u, "u", self.d)
        check_dtype(self, u, "u")

        def body(u, layer):
            return self.layer(u, *layer), None

        u, _ = jax.lax.scan(body, u, (self.attention, self.kernels, self.norm1, self.norm2))
        return u

    def post_ln_equivalent(self) -> Transformer:
        """The standard post-LN encoder with feed-forward `relu(z W̃_1 + b_1) W̃_2 + b_2`, `W̃ = I + W`.

        Only for `J = 2` (one hidden layer of width d).
        """
        J = self.kernels.weight.shape[1]
        if J != 2:
            raise ValueError(
                f"post_ln_equivalent needs J = 2 linear kernels; this model has J = {J}."
            )
        eye = jnp.eye(self.d, dtype=self.kernels.weight.dtype)
        W, b = self.kernels.weight + eye, self.kernels.bias
        ffn = FeedForward(W[:, 0], b[:, 0], W[:, 1], b[:, 1], activation=relu)
        return Transformer(
            transformer_equation(self.attention, self.norm1, ffn, self.norm2, PostNorm())
        )

    def post_ln_state_dict(self) -> dict[str, np.ndarray]:
        """The `torch.nn.TransformerEncoder` state dict of `post_ln_equivalent()` (J = 2).

        Attention kernels are stored `x @ W`; torch stores `y = x Wᵀ + b`. The feed-forward weight
        of substep j is `I + W_j` (explicit Euler with τ = 1). Load it into a post-LN ReLU encoder
        with `dim_feedforward = d` and `layer_norm_eps = 0` to compare with PyTorch.
        """
        self.post_ln_equivalent()  # checks J = 2
        # Every array to NumPy once (indexing JAX arrays layer by layer compiles per shape).
        a, kern, norm1, norm2 = jax.tree.map(
            np.asarray, (self.attention, self.kernels, self.norm1, self.norm2)
        )
        eye = np.eye(self.d)
        sd = {}
        for i in range(kern.weight.shape[0]):
            pre = f"layers.{i}."
            sd[pre + "self_attn.in_proj_weight"] = np.concatenate(
                [a.query[i].T, a.key[i].T, a.value[i].T]
            )
            sd[pre + "self_attn.in_proj_bias"] = np.concatenate(
                [a.query_bias[i], a.key_bias[i], a.value_bias[i]]
            )
            sd[pre + "self_attn.out_proj.weight"] = a.output[i].T
            sd[pre + "self_attn.out_proj.bias"] = a.output_bias[i]
            for j in (0, 1):
                sd[pre + f"linear{j + 1}.weight"] = (eye + kern.weight[i, j]).T
                sd[pre + f"linear{j + 1}.bias"] = kern.bias[i, j]
            for k, norm in (("norm1", norm1), ("norm2", norm2)):
                sd[pre + k + ".weight"] = norm.weight[i]
                sd[pre + k + ".bias"] = norm.bias[i]
        return sd
