r"""A learned control basis: the functions of depth-time are a small network of `t`.

Neural ODE Transformers (Tong et al., "Neural ODE Transformers: Analyzing Internal Dynamics
and Adaptive Fine-tuning", ICLR 2025, arXiv:2503.01329) do not store one set of weights per
layer: the weights at depth `t` are the output of a hypernetwork that reads an embedding of
`t`. Here that construction is put into the library's basis framework (`workbench._bases`),
where every control is `θ(t) = Σ_k φ_k(t) c_k`:

$$φ(t) = W_2\, σ\big(W_1\, e(t/T) + b_1\big) + b_2 ∈ ℝ^K,
\qquad e(s) = \big(\sin(π j s), \cos(π j s)\big)_{j=1}^{F},$$

a one-hidden-layer perceptron of width `W` (activation `σ`, tanh or exact GELU) applied to
`F` sinusoidal features of the normalized depth `s = t/T`, and

$$θ(t) = \sum_{k<K} φ_k(t)\, c_k,$$

with `K` coefficient banks `c_k`, each one layer's worth of parameters, shared by every depth.
The banks *and* the small network are trainable: the basis functions are learned together
with the coefficients, where the Legendre or layer bases fix them. A control has

    K · P  +  (2F · W + W + W · K + K)

parameters, `P` being one layer's count: the `K` banks plus the network of `t`.

`HypernetworkBasis` is the option (it holds the network's weights, so it is a *learned*
basis; `degree` is `None`); `Hypernetwork` is the control (the banks and its network).
Projections onto or from it are L² projections as for the other bases (`AbstractBasis.project`),
but the functions are not polynomials, so the Gauss quadrature is not exact: it uses
`workbench._bases.LEARNED_NODES` Gauss–Legendre nodes on each of at least
`workbench._bases.LEARNED_PIECES` equal subintervals of every interval between breakpoints
(the integrands are analytic between breakpoints, so the composite rule converges fast; it is
still an approximation, not an exact rule). Onto it, the banks are the projection onto the span of the
current `φ` (the network is kept): that maps a network's layers into the basis. From it onto
`wb.LegendreBasis` or layers: the compression of a trained hypernetwork.

θ is analytic in `t` and defined on all of ℝ (no clipping to `[0, T]`), so every splitting
scheme keeps its order on the whole depth, with any number of steps.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PRNGKeyArray, PyTree

from ._bases import (
    LEARNED_NODES,
    AbstractBasis,
    AbstractOnePieceControl,
    _at,
    _check_t1,
    _gauss,
    _learned_points,
)
from ._checks import int_in_range
from ._controls import _inexact_leaves, _num_pieces, _scalar

__all__ = ["Hypernetwork", "HypernetworkBasis"]

ACTIVATIONS = ("tanh", "gelu")


def _activation(name: str):
    if name == "tanh":
        return jnp.tanh
    return lambda x: jax.nn.gelu(x, approximate=False)


def _check_key(key) -> None:
    if key is None or not (eqx.is_array(key) or isinstance(key, np.ndarray)):
        raise ValueError(
            f"HypernetworkBasis: key={key!r} must be a JAX PRNG key (jax.random.PRNGKey(0) or "
            "jax.random.key(0)); it draws the network's initial weights."
        )


class HypernetworkBasis(AbstractBasis):
    r"""`K` learned functions of depth-time, `φ(t) = W_2 σ(W_1 e(t/T) + b_1) + b_2` (see the
    module docstring), for `wb.Hypernetwork` controls.

    **Arguments:**

    - `num_functions`: `K`, the number of coefficient banks (each one layer's worth of
      parameters).
    - `width`: `W`, the hidden width of the network of `t` (default 32).
    - `num_frequencies`: `F`, the sinusoidal features `sin(π j t/T), cos(π j t/T)`, `j ≤ F`
      (default 4).
    - `activation`: `"tanh"` (default) or `"gelu"` (exact GELU).
    - `dtype`: of the network's weights (default float32).
    - `key`: draws the weights: `W_1 ~ N(0, 1/F)` (a unit-variance pre-activation, the features
      having mean square ½), `b_1 ~ N(0, 1)`, `W_2 ~ N(0, 1/W)`, `b_2 = 0`.

    The weights are trainable leaves (`w1` `(2F, W)`, `b1` `(W,)`, `w2` `(W, K)`, `b2` `(K,)`):
    the basis is learned. `functions(ts, t1)` is a JAX array in the weights' dtype.
    """

    w1: Array
    b1: Array
    w2: Array
    b2: Array
    activation: str = eqx.field(static=True)

    def __init__(
        self,
        num_functions: int,
        *,
        width: int = 32,
        num_frequencies: int = 4,
        activation: str = "tanh",
        dtype=jnp.float32,
        key: PRNGKeyArray | None = None,
    ):
        k = int_in_range(
            "HypernetworkBasis.num_functions",
            num_functions,
            1,
            hint="the number of coefficient banks K, at least 1",
        )
        w = int_in_range("HypernetworkBasis.width", width, 1, hint="the hidden width")
        f = int_in_range(
            "HypernetworkBasis.num_frequencies",
            num_frequencies,
            1,
            hint="the sinusoidal features sin(π j t/T), cos(π j t/T), j = 1..F",
        )
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"HypernetworkBasis.activation={activation!r} must be one of {ACTIVATIONS}."
            )
        if not jnp.issubdtype(jnp.dtype(dtype), jnp.floating):
            raise ValueError(
                f"HypernetworkBasis.dtype={dtype!r} must be a floating dtype (float32, float64)."
            )
        _check_key(key)
        k1, k2, k3 = jax.random.split(key, 3)
        self.w1 = jax.random.normal(k1, (2 * f, w), dtype) / np.sqrt(f)
        self.b1 = jax.random.normal(k2, (w,), dtype)
        self.w2 = jax.random.normal(k3, (w, k), dtype) / np.sqrt(w)
        self.b2 = jnp.zeros((k,), dtype)
        self.activation = activation

    @property
    def num_functions(self) -> int:
        return self.w2.shape[-1]

    @property
    def width(self) -> int:
        return self.w2.shape[0]

    @property
    def num_frequencies(self) -> int:
        return self.w1.shape[0] // 2

    @property
    def num_parameters(self) -> int:
        """The network's parameter count, `2F · W + W + W · K + K`."""
        return sum(x.size for x in (self.w1, self.b1, self.w2, self.b2))

    @property
    def degree(self) -> None:
        """`None`: the functions are not polynomials (projections use many Gauss nodes)."""
        return None

    def functions(self, ts, t1) -> Array:
        """`φ_k(t)` at the times `ts`, shape `(len(ts), K)`, in the weights' dtype."""
        dtype = self.w1.dtype
        s = jnp.asarray(ts, dtype) / jnp.asarray(t1, dtype)
        j = jnp.arange(1, self.num_frequencies + 1, dtype=dtype)
        angle = jnp.pi * s[..., None] * j
        features = jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)
        hidden = _activation(self.activation)(features @ self.w1 + self.b1)
        return hidden @ self.w2 + self.b2

    def breakpoints(self, t1):
        return np.array([0.0, float(t1)])

    def control(self, values, t1) -> "Hypernetwork":
        return Hypernetwork(values, self, t1=t1)

    def contains(self, other) -> bool:
        """Only itself (the same weights): a learned span contains no other basis in general,
        so a larger projection onto it is refused as for any non-nested basis."""
        if not isinstance(other, HypernetworkBasis):
            return False
        same = other == self
        return bool(same) if isinstance(same, (bool, np.bool_)) else other is self


def _quadrature(t1: float, dtype):
    """Composite Gauss–Legendre nodes and weights on `[0, T]` for the learned functions."""
    nodes, weights = _gauss(_learned_points(np.array([0.0, float(t1)]), t1), LEARNED_NODES)
    return jnp.asarray(nodes, dtype), jnp.asarray(weights, dtype)


class Hypernetwork(AbstractOnePieceControl):
    r"""θ(t) from a small network of depth-time: `θ(t) = Σ_{k<K} φ_k(t) c_k`, `φ` the network of
    a `wb.HypernetworkBasis` (see `workbench._hypernetwork`; Tong et al., ICLR 2025).

    **Arguments:**

    - `values`: the `K` coefficient banks (leading axis `K`), e.g. a term's pytree.
    - `net`: the `wb.HypernetworkBasis` whose `K` functions weigh them.
    - `t1`: the depth `T`.

    Both the banks and the network are trainable leaves: `K · P + 2F · W + W + W · K + K`
    parameters (`P` one layer's). The control is one piece (`num_pieces = 1`,
    `piece_length = T`): a `Transformer` with hypernetwork controls takes `steps_per_layer`
    steps over the whole depth, any number of them. `wb.HypernetworkBasis(K, key=...)
    .project(network_control)` maps a network's layers into the span of the current `φ`;
    `control.project(wb.LegendreBasis(q))` (`q < K`) compresses it (approximate quadrature).
    """

    values: PyTree
    net: HypernetworkBasis
    piece_length: float = eqx.field(static=True, converter=_scalar)

    def __init__(self, values: PyTree, net: HypernetworkBasis, *, t1: float = 1.0):
        self.values = values
        self.net = net
        self.piece_length = t1

    def __check_init__(self):
        if not isinstance(self.net, HypernetworkBasis):
            raise ValueError(
                f"Hypernetwork: net={self.net!r} must be a wb.HypernetworkBasis (the network of t)."
            )
        n = _num_pieces(self.values)
        if n != self.net.num_functions:
            raise ValueError(
                f"Hypernetwork: values have {n} coefficient banks (leading axis) but net has "
                f"num_functions={self.net.num_functions}; they must agree."
            )
        _check_t1(self.piece_length)

    @property
    def basis(self) -> HypernetworkBasis:
        return self.net

    @property
    def num_functions(self) -> int:
        return self.net.num_functions

    def evaluate(self, t) -> PyTree:
        phi = self.net.functions(jnp.asarray(t)[None], self.piece_length)[0]
        return _at(phi, self.values)

    def _grams(self, derivative: bool):
        dtype = self.net.w1.dtype
        nodes, weights = _quadrature(self.piece_length, dtype)
        fn = lambda ts: self.net.functions(ts, self.piece_length)
        if derivative:  # φ_k acts on each node separately: the jvp along ones is dφ/dt there
            _, phi = jax.jvp(fn, (nodes,), (jnp.ones_like(nodes),))
        else:
            phi = fn(nodes)
        return phi.T @ (weights[:, None] * phi)

    def _quadratic(self, gram) -> list:
        out = []
        for x in _inexact_leaves(self.values):
            flat = x.reshape(x.shape[0], -1)
            out.append(jnp.sum((gram.astype(x.dtype) @ flat) * flat))
        return out

    def norm_terms(self) -> list:
        r"""`∫_0^T ‖θ‖² dt = Σ_jk G_jk ⟨c_j, c_k⟩`, `G = ∫ φ φᵀ dt` by composite Gauss
        quadrature (approximate, see the module docstring), one term per leaf."""
        return self._quadratic(self._grams(derivative=False))

    def smoothness_terms(self) -> list:
        r"""`∫_0^T ‖θ'‖² dt = Σ_jk D_jk ⟨c_j, c_k⟩`, `D = ∫ φ' φ'ᵀ dt` (`φ'` by `jax.jvp` in
        `t`) by composite Gauss quadrature, one term per leaf."""
        return self._quadratic(self._grams(derivative=True))
