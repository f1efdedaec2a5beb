r"""The Transformer equation on the continuum `Ω_x × Ω_y = [0, 1]²`, and its resolution limits.

Paper A writes the model as an equation in a token variable `x` and a feature variable `y`
(docs/equations.md). Here the kernels are smooth functions on the feature interval and the input is a
smooth function of `(x, y)`; a quadrature rule turns every integral into a weighted sum, so the
same continuous model can be sampled on token grids of any size `n` and feature grids of any size
`d`, and the discrete outputs converge to the continuous one as `n, d → ∞` at the rule's order.

One layer `l` (pre-norm, explicit Euler steps of size `τ`):

$$\begin{aligned}
v &= P_l(u),\qquad P_l(u)(x, y) = g_l(y)\,\frac{u(x, y) - m(x)}{s(x)} + \beta_l(y),\quad
  m = \textstyle\int u\,dy,\ s^2 = \int (u - m)^2 dy,\\
Q(x, y) &= \textstyle\int W^Q_l(ξ, y)\, v(x, ξ)\, dξ \quad(\text{likewise } K, V),\\
s(x, \tilde x) &= |Ω_y|^{-1/2} \textstyle\int Q(x, ξ) K(\tilde x, ξ)\, dξ,\qquad
γ(x, \tilde x) = e^{s(x, \tilde x)} \big/ \textstyle\int e^{s(x, η)}\, dη,\\
u &\leftarrow u + τ \textstyle\int γ(x, \tilde x)\, V(\tilde x, y)\, d\tilde x,\\
u &\leftarrow u + τ\Big(\textstyle\int W^2_l(z, y)\, σ\big(\int W^1_l(ξ, z)\, P'_l(u)(x, ξ)\, dξ
  + b^1_l(z)\big)\, dz + b^2_l(y)\Big),
\end{aligned}$$

with `|Ω_y| = 1` and the hidden variable `z ∈ [0, 1]` discretized on the feature grid. On a grid
with token weights `w_x̃` and feature weights `w_ξ`: each `y`-integral is `Σ_ξ w_ξ (·)`, so the
sampled kernel enters as the folded matrix `diag(w) W(ξ_i, y_j)`, and the token integral gives
`softmax_x̃(s + log w_x̃) V` — with uniform weights `log w` is a constant that cancels, and the model
is exactly the ordinary discrete pre-LN Transformer (`folded_encoder_state_dict`).

A smooth activation (GELU, tanh) keeps every integrand smooth; ReLU's kink in `z` leaves the
low-order rules at order 2 but takes Gauss down from exponential to algebraic convergence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import int_in_range, positive_float
from ._quadrature import AbstractQuadratureRule, Grid

__all__ = [
    "ContinuousLayer",
    "ContinuousTransformer",
    "SmoothFunction",
    "SmoothKernel",
    "folded_encoder_state_dict",
    "refinement_errors",
]


def _basis(freq, phase, t):
    """`sin(a_k t + b_k)` for every node `t` (rows) and term `k` (columns)."""
    t = jnp.asarray(t)
    return jnp.sin(t[:, None] * freq[None, :] + phase[None, :])


def _random_basis(key, rank, min_frequency, max_frequency):
    kf, kp = jax.random.split(key)
    freq = jax.random.uniform(kf, (rank,), jnp.float64, minval=min_frequency, maxval=max_frequency)
    phase = jax.random.uniform(kp, (rank,), jnp.float64, minval=0.0, maxval=2 * math.pi)
    return freq, phase


class SmoothFunction(eqx.Module):
    r"""A smooth function of one variable on `[0, 1]`: `b(t) = c_0 + Σ_k c_k sin(a_k t + φ_k)`.

    Random frequencies `a_k` and phases `φ_k` make it neither periodic on `[0, 1]` (so the
    trapezoid rule is not spectral) nor a polynomial (so Gauss is not exact).

    **Fields:** `offset` `c_0`, `coeff` `(r,)`, `freq` `(r,)`, `phase` `(r,)`.
    """

    offset: jax.Array
    coeff: jax.Array
    freq: jax.Array
    phase: jax.Array

    @classmethod
    def random(
        cls,
        *,
        key,
        rank: int = 3,
        amplitude: float = 1.0,
        offset: float = 0.0,
        min_frequency: float = 1.0,
        max_frequency: float = 3.0,
    ) -> SmoothFunction:
        """Coefficients `N(0, amplitude²/rank)`, frequencies uniform in
        `[min_frequency, max_frequency]`, phases uniform in `[0, 2π)` (float64: run with x64)."""
        kc, kb = jax.random.split(key)
        freq, phase = _random_basis(kb, rank, min_frequency, max_frequency)
        coeff = amplitude / math.sqrt(rank) * jax.random.normal(kc, (rank,), jnp.float64)
        return cls(jnp.asarray(offset, jnp.float64), coeff, freq, phase)

    def __call__(self, t) -> jax.Array:
        """Values at the nodes `t`, shape `(len(t),)`."""
        return self.offset + _basis(self.freq, self.phase, t) @ self.coeff


class SmoothKernel(eqx.Module):
    r"""A smooth function of two variables on `[0, 1]²`, separable of rank `r`:

    $$W(s, t) = \sum_{j,k} C_{jk} \sin(a_j s + φ_j) \sin(c_k t + ψ_k).$$

    Used for the kernels `W(ξ, y)` (first argument: the integrated variable) and for inputs
    `f(x, y)` (first argument: token, second: feature).

    **Fields:** `coeff` `(r, r)`, `freq_in`, `phase_in`, `freq_out`, `phase_out` `(r,)`.
    """

    coeff: jax.Array
    freq_in: jax.Array
    phase_in: jax.Array
    freq_out: jax.Array
    phase_out: jax.Array

    @classmethod
    def random(
        cls,
        *,
        key,
        rank: int = 3,
        amplitude: float = 1.0,
        min_frequency: float = 1.0,
        max_frequency: float = 3.0,
    ) -> SmoothKernel:
        """Coefficients `N(0, amplitude²/rank)`, random frequencies and phases (see
        `SmoothFunction.random`)."""
        kc, ki, ko = jax.random.split(key, 3)
        fi, pi = _random_basis(ki, rank, min_frequency, max_frequency)
        fo, po = _random_basis(ko, rank, min_frequency, max_frequency)
        coeff = amplitude / math.sqrt(rank) * jax.random.normal(kc, (rank, rank), jnp.float64)
        return cls(coeff, fi, pi, fo, po)

    def __call__(self, s, t) -> jax.Array:
        """The matrix `W(s_i, t_j)`, shape `(len(s), len(t))`."""
        return (
            _basis(self.freq_in, self.phase_in, s)
            @ self.coeff
            @ _basis(self.freq_out, self.phase_out, t).T
        )


class ContinuousLayer(eqx.Module):
    """The kernels of one pre-norm layer (see the module docstring for the equation).

    **Fields:** `query`, `key`, `value` (`W(ξ, y)`), `hidden` (`W^1(ξ, z)`), `hidden_bias`
    (`b^1(z)`), `output` (`W^2(z, y)`), `output_bias` (`b^2(y)`), and the layer norms' gains and
    shifts `norm1_gain`, `norm1_shift`, `norm2_gain`, `norm2_shift` (functions of `y`).
    """

    query: SmoothKernel
    key: SmoothKernel
    value: SmoothKernel
    hidden: SmoothKernel
    hidden_bias: SmoothFunction
    output: SmoothKernel
    output_bias: SmoothFunction
    norm1_gain: SmoothFunction
    norm1_shift: SmoothFunction
    norm2_gain: SmoothFunction
    norm2_shift: SmoothFunction

    @classmethod
    def random(
        cls, *, key, rank: int = 3, max_frequency: float = 3.0, score_amplitude: float = 1.5
    ) -> ContinuousLayer:
        """Random smooth kernels of rank `rank`; `score_amplitude` scales `W^Q`, `W^K` (the
        attention scores grow like its square)."""
        keys = iter(jax.random.split(key, 11))
        kern = lambda a: SmoothKernel.random(  # noqa: E731
            key=next(keys), rank=rank, amplitude=a, max_frequency=max_frequency
        )
        fun = lambda a, c=0.0: SmoothFunction.random(  # noqa: E731
            key=next(keys), rank=rank, amplitude=a, offset=c, max_frequency=max_frequency
        )
        return cls(
            query=kern(score_amplitude),
            key=kern(score_amplitude),
            value=kern(1.0),
            hidden=kern(2.0),
            hidden_bias=fun(0.5),
            output=kern(1.0),
            output_bias=fun(0.3),
            norm1_gain=fun(0.2, 1.0),
            norm1_shift=fun(0.2),
            norm2_gain=fun(0.2, 1.0),
            norm2_shift=fun(0.2),
        )


class ContinuousTransformer(eqx.Module):
    r"""A few pre-norm layers of the continuous Transformer equation (explicit Euler, step `τ`).

    Call it on an input function `f(x, y)` (or its values on the grid) and a token grid and a
    feature grid (`Grid`): the result is `u(T)` at every grid node, probes included.

    **Fields:**

    - `layers`: a tuple of `ContinuousLayer`.
    - `tau`: the Euler step per layer (`T = τ · len(layers)`).
    - `activation`: the pointwise activation `σ` (smooth for the convergence study).
    - `norm`: apply the layer-norm projections (`False`: `P = identity`).
    - `scale`: the score factor `|Ω_y|^{-1/2}` (1 on `[0, 1]`).
    """

    layers: tuple[ContinuousLayer, ...]
    tau: float = eqx.field(static=True, default=1.0)
    activation: Callable = eqx.field(static=True, default=jax.nn.gelu)
    norm: bool = eqx.field(static=True, default=True)
    scale: float = eqx.field(static=True, default=1.0)

    def __check_init__(self):
        if not self.layers:
            raise ValueError("ContinuousTransformer.layers is empty; give at least one layer.")
        positive_float("ContinuousTransformer.tau", self.tau, finite=False)

    @classmethod
    def random(
        cls,
        *,
        key,
        num_layers: int = 2,
        rank: int = 3,
        max_frequency: float = 3.0,
        score_amplitude: float = 1.5,
        tau: float = 1.0,
        activation: Callable = jax.nn.gelu,
        norm: bool = True,
    ) -> ContinuousTransformer:
        """`num_layers` random layers (`ContinuousLayer.random`)."""
        int_in_range("num_layers", num_layers, 1, numpy_ints=False)
        keys = jax.random.split(key, num_layers)
        layers = tuple(
            ContinuousLayer.random(
                key=k, rank=rank, max_frequency=max_frequency, score_amplitude=score_amplitude
            )
            for k in keys
        )
        return cls(layers, tau=tau, activation=activation, norm=norm)

    def __call__(self, f, tokens: Grid, features: Grid) -> jax.Array:
        """`u(T)` on `tokens × features`, shape `(len(tokens.nodes), len(features.nodes))`.

        **Arguments:**

        - `f`: the input, a `SmoothKernel` (evaluated as `f(x, y)`) or an array of its values on
          the grid.
        - `tokens`, `features`: `Grid`s on `Ω_x` and `Ω_y` (probes have weight 0).
        """
        _check_grid(tokens, "tokens")
        _check_grid(features, "features")
        x, wx = jnp.asarray(tokens.nodes), jnp.asarray(tokens.weights)
        y, wy = jnp.asarray(features.nodes), jnp.asarray(features.weights)
        if not isinstance(f, SmoothKernel):
            f = jnp.asarray(f)
            if f.shape != (x.size, y.size):
                raise ValueError(
                    f"input of shape {f.shape} does not match the grid ({x.size} tokens, "
                    f"{y.size} features)."
                )
        return _forward(self, f, x, wx, y, wy)

    def _norm(self, gain, shift, u, y, wy):
        if not self.norm:
            return u
        m = u @ wy
        c = u - m[:, None]
        s = jnp.sqrt((c * c) @ wy)
        return gain(y) * c / s[:, None] + shift(y)

    def _layer(self, layer: ContinuousLayer, u, log_wx, y, wy):
        def integral_operator(kernel, v):  # ∫ W(ξ, ·) v(x, ξ) dξ = v @ diag(w) W
            return v @ (wy[:, None] * kernel(y, y))

        v = self._norm(layer.norm1_gain, layer.norm1_shift, u, y, wy)
        q = integral_operator(layer.query, v)
        k = integral_operator(layer.key, v)
        val = integral_operator(layer.value, v)
        s = self.scale * (q * wy) @ k.T
        gamma = jax.nn.softmax(s + log_wx[None, :], axis=-1)
        u = u + self.tau * gamma @ val
        v = self._norm(layer.norm2_gain, layer.norm2_shift, u, y, wy)
        h = self.activation(integral_operator(layer.hidden, v) + layer.hidden_bias(y))
        return u + self.tau * (integral_operator(layer.output, h) + layer.output_bias(y))

    def _apply(self, f, x, wx, y, wy):
        u = f(x, y) if isinstance(f, SmoothKernel) else f
        # log w = −inf at probe and padding tokens: they never act as keys, only as queries.
        log_wx = jnp.where(wx > 0, jnp.log(jnp.where(wx > 0, wx, 1.0)), -jnp.inf)
        for layer in self.layers:
            u = self._layer(layer, u, log_wx, y, wy)
        return u

    def functional(self, u, psi: SmoothKernel, tokens: Grid, features: Grid) -> jax.Array:
        r"""`J = ∫∫ u(x, y) ψ(x, y) dx dy` with the grids' own rules."""
        x, y = jnp.asarray(tokens.nodes), jnp.asarray(features.nodes)
        return jnp.asarray(tokens.weights) @ (u * psi(x, y)) @ jnp.asarray(features.weights)


@eqx.filter_jit
def _forward(model, f, x, wx, y, wy):
    # Arrays only: grids of one length (see `Grid.padded`) share one compilation.
    return model._apply(f, x, wx, y, wy)


def _check_grid(grid, field):
    if not isinstance(grid, Grid):
        raise ValueError(f"{field}={grid!r} is not a Grid; build one with Grid.from_rule.")


def folded_encoder_state_dict(
    model: ContinuousTransformer, features: Grid
) -> dict[str, np.ndarray]:
    r"""The `torch.nn.TransformerEncoder` state dict (`norm_first=True`, one head, `d_ff = d`)
    that computes `model` exactly on a grid with uniform weights.

    Every `y`-integral becomes a matrix product with the folded kernel `diag(w) W(ξ_i, y_j)`.
    The continuous score is `scale · Σ_ξ w_ξ Q K` and the standard attention's is `q·k/√d`, so
    with uniform `w` the query matrix carries the extra factor `scale · w · √d`:
    `W_Q = scale · w · √d · diag(w) W^Q` (`w = 1/d` on a midpoint grid). `τ` goes into the output
    projection and the second feed-forward matrix. Load with
    `encoder_from_torch(sd, num_heads=1, norm_first=True, layer_norm_eps=0.0, activation=…)`.

    **Arguments:**

    - `model`: a `ContinuousTransformer` with `norm=True`.
    - `features`: the feature grid; its weights must be uniform and it must have no probes
      (token weights, if uniform, cancel inside the softmax and are not needed).

    **Raises:** `ValueError` for non-uniform weights, probes, or `model.norm=False`.
    """
    _check_grid(features, "features")
    w = np.asarray(features.weights)
    if features.num_nodes != w.size or not np.allclose(w, w[0], rtol=1e-14, atol=0):
        raise ValueError(
            "folded_encoder_state_dict: the feature grid must have uniform weights and no "
            "probes (use MidpointRule()); the standard Transformer has no quadrature weights."
        )
    if not model.norm:
        raise ValueError("folded_encoder_state_dict: model.norm=False has no pre-LN equivalent.")
    y = jnp.asarray(features.nodes)
    d = y.size
    fold = lambda kernel: np.asarray(w[:, None] * kernel(y, y))  # noqa: E731  x @ W convention
    sd = {}
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        wq = model.scale * w[0] * math.sqrt(d) * fold(layer.query)
        sd[p + "self_attn.in_proj_weight"] = np.concatenate(
            [wq.T, fold(layer.key).T, fold(layer.value).T]
        )
        sd[p + "self_attn.in_proj_bias"] = np.zeros(3 * d)
        sd[p + "self_attn.out_proj.weight"] = model.tau * np.eye(d)
        sd[p + "self_attn.out_proj.bias"] = np.zeros(d)
        sd[p + "linear1.weight"] = fold(layer.hidden).T
        sd[p + "linear1.bias"] = np.asarray(layer.hidden_bias(y))
        sd[p + "linear2.weight"] = model.tau * fold(layer.output).T
        sd[p + "linear2.bias"] = model.tau * np.asarray(layer.output_bias(y))
        for k, (gain, shift) in {
            "norm1": (layer.norm1_gain, layer.norm1_shift),
            "norm2": (layer.norm2_gain, layer.norm2_shift),
        }.items():
            sd[p + k + ".weight"] = np.asarray(gain(y))
            sd[p + k + ".bias"] = np.asarray(shift(y))
    return sd


def refinement_errors(
    model: ContinuousTransformer,
    f: SmoothKernel,
    rule: AbstractQuadratureRule,
    sizes: Sequence[int],
    *,
    refine: str,
    fixed: Grid,
    reference: Grid,
    probes: Sequence[float],
    psi: SmoothKernel | None = None,
    pad_to: int | None = None,
) -> dict:
    r"""Errors of `u(T)` as one grid is refined with `rule` and the other is held fixed.

    For every size `m` in `sizes`, the refined variable (`refine="features"` or `"tokens"`) is
    discretized by `rule` with `m` nodes plus the `probes` (weight 0), the other by `fixed` (whose
    probes must be the same points); the error is the largest `|u(T) − u_ref(T)|` at the
    probe points `(x_p, y_q)` (Nyström values), where `u_ref` uses `reference` for the refined
    variable and the same `fixed` grid. Because the fixed grid is identical in both, only the
    refined variable's quadrature error is measured. With `psi`, the error of the functional
    `J = ∫∫ u ψ` (each grid's own rule) is returned too. Every grid of the refined variable is
    padded with zero-weight nodes to one length (at least `pad_to` nodes plus probes), so the
    whole ladder compiles once.

    **Returns:** a dict with `sizes`, `spacings` (`rule.spacing(m)`), `errors` (probe max),
    `functional_errors` (or `None`), and `reference_values` (the probe values).

    **Raises:** `ValueError` for an unknown `refine`, sizes below 2, or probes missing from
    `fixed`/`reference`.
    """
    if refine not in ("features", "tokens"):
        raise ValueError(f"refine={refine!r} is not known; valid: features, tokens.")
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes=(): give the grid sizes to refine through (each >= 2).")
    for m in sizes:
        Grid.from_rule(rule, m, field="sizes")  # validates before any compute
    p = np.asarray(probes, dtype=np.float64)
    for name, g in (("fixed", fixed), ("reference", reference)):
        if g.probes.shape != p.shape or not np.allclose(g.probes, p, rtol=0, atol=0):
            raise ValueError(
                f"{name} grid carries probes {g.probes.tolist()}; it must carry exactly the "
                f"probes {p.tolist()} (Grid.from_rule(..., probes=probes))."
            )

    # Pad every grid of the refined variable to one length: one compilation for the ladder.
    length = max(max(sizes), reference.num_nodes, pad_to or 0) + p.size

    def solve(grid):
        grid = grid.padded(length)
        tok, feat = (fixed, grid) if refine == "features" else (grid, fixed)
        u = model(f, tok, feat)
        values = u[tok.probe_slice, feat.probe_slice]
        j = None if psi is None else model.functional(u, psi, tok, feat)
        return np.asarray(values), (None if j is None else float(j))

    ref_values, ref_j = solve(reference)
    errors, j_errors = [], []
    for m in sizes:
        values, j = solve(Grid.from_rule(rule, m, probes=p))
        errors.append(float(np.max(np.abs(values - ref_values))))
        if psi is not None:
            j_errors.append(abs(j - ref_j))
    return {
        "sizes": sizes,
        "spacings": [rule.spacing(m) for m in sizes],
        "errors": errors,
        "functional_errors": j_errors if psi is not None else None,
        "reference_values": ref_values.tolist(),
    }
