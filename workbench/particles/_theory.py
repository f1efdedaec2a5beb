r"""Theory curves and constants for particles on the sphere (docs/particles.md, Paper B).

- `wendel_probability` (Thm 6.7): probability that n uniform points lie in an open hemisphere.
- `gamma_beta` (Thm 6.8): the common pairwise inner product from an orthogonal start.
- `gamma_infinity` (Thm 6.9): the time at which $\gamma_\beta$ reaches $1 - \delta$, the curve
  $\Gamma_\infty$ overlaid on the phase diagram of Fig. 3.
- `clustering_rate_bound` (Thm 6.3), `tau_star`, `large_beta_condition`, `large_beta_threshold`
  (Thm 5.1), `hemisphere_margin` (Lemma 6.4).

**The logit variable.** Both ODEs of Thm 6.8 have the factor $(1-\gamma)((n-1)\gamma+1)$. With

$$L = \log\frac{(n-1)\gamma + 1}{1 - \gamma}, \qquad \frac{dL}{d\gamma} = \frac{n}{(1-\gamma)((n-1)\gamma+1)},
  \qquad \gamma(L) = 1 - \frac{n}{e^L + n - 1},$$

they become *(derived)*

$$\text{SA: } \frac{dL}{dt} = \frac{2n}{e^{\beta(1-\gamma)} + n - 1}, \qquad
  \text{USA: } \frac{dL}{dt} = 2 e^{\beta\gamma}, \qquad L(0) = 0,$$

with bounded, smooth right-hand sides: the approach $\gamma \to 1$, exponentially slow in $\gamma$,
is linear growth in $L$, so error control on $L$ stays meaningful (relative in $1 - \gamma$) however
close $\gamma$ gets to 1. At $\beta = 0$ both read
$dL/dt = 2$, i.e. $\gamma(t) = (e^{2t} - 1)/(e^{2t} + n - 1)$ ($= \tanh t$ for $n = 2$).
"""

import functools
import math
from fractions import Fraction

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._checks import int_in_range, number_in_range, positive_int
from .._types import Tokens
from ._dynamics import _MATRIX_NAMES, SA, USA

__all__ = [
    "clustering_rate_bound",
    "gamma_beta",
    "gamma_infinity",
    "hemisphere_margin",
    "large_beta_condition",
    "large_beta_threshold",
    "tau_star",
    "wendel_probability",
]

_KINDS = ("SA", "USA")


# ----------------------------------------------------------------------------------------------
# checks


def _check_int(name: str, value, minimum: int, why: str) -> None:
    """Concrete values are checked; traced or array values pass (they may be vmapped)."""
    if not isinstance(value, np.ndarray | jax.Array):
        int_in_range(name, value, minimum, hint=why)


def _check_kind(kind) -> str:
    if kind not in _KINDS:
        raise ValueError(
            f"kind={kind!r} is not a known attention normalization; valid choices: "
            f"{', '.join(repr(k) for k in _KINDS)} (self-attention with softmax normalization Z_i, "
            "or unnormalized self-attention with Z_i = n)."
        )
    return kind


def _check_delta(delta) -> None:
    """A concrete number is checked; traced or array values pass."""
    if not isinstance(delta, np.ndarray | jax.Array):
        number_in_range(
            "delta",
            delta,
            0,
            1,
            hint="gamma_beta rises from 0 towards 1 and Gamma_infinity is the time it reaches "
            "1 - delta",
        )


# ----------------------------------------------------------------------------------------------
# Wendel (Thm 6.7)


def wendel_probability(n: int, d: int, *, exact: bool = False) -> float | Fraction:
    r"""Probability that $n$ i.i.d. uniform points on $S^{d-1}$ lie in an open hemisphere (Thm 6.7).

    $$p_{n,d} = 2^{-(n-1)} \sum_{k=0}^{d-1} \binom{n-1}{k},$$

    which is $1$ when $d \ge n$ (the sum is then all of $2^{n-1}$). Computed exactly in rational
    arithmetic. It enters Thm 6.3 (d ≥ n): with probability one the uniform start lies in a
    hemisphere, where Lemma 6.4 applies.

    **Arguments:**

    - `n`: number of points, a positive integer.
    - `d`: ambient dimension (the sphere is $S^{d-1}$), a positive integer.
    - `exact`: return a `fractions.Fraction` instead of a float.

    **Returns:**

    $p_{n,d} \in (0, 1]$ as a float (or an exact `Fraction`).

    **Example:** `wendel_probability(3, 2) == 0.75`.
    """
    for name, value in (("n", n), ("d", d)):
        positive_int(name, value)
    n, d = int(n), int(d)
    p = Fraction(sum(math.comb(n - 1, k) for k in range(min(d, n))), 2 ** (n - 1))
    return p if exact else float(p)


# ----------------------------------------------------------------------------------------------
# Thm 6.8: gamma_beta


def _one_minus_gamma(logit, n):
    # 1 - gamma = n / (e^L + n - 1), written with e^{-L} (L >= 0 along the flow): no overflow.
    e = jnp.exp(-logit)
    return n * e / (1.0 + (n - 1) * e)


def _gamma_of_logit(logit, n):
    e = jnp.exp(-logit)
    return -jnp.expm1(-logit) / (1.0 + (n - 1) * e)


def _sa_logit_rate(logit, beta, n):
    # dL/dt = 2n / (e^{β(1-γ)} + n - 1), multiplied through by e^{-β(1-γ)} for large β.
    e = jnp.exp(-beta * _one_minus_gamma(logit, n))
    return 2.0 * n * e / (1.0 + (n - 1) * e)


def _usa_logit_rate(logit, beta, n):
    # dL/dt = 2 e^{βγ}
    return 2.0 * jnp.exp(beta * _gamma_of_logit(logit, n))


def _sa_time_per_logit(logit, beta, n):
    # dt/dL = (e^{β(1-γ)} + n - 1) / (2n): the reciprocal of the rate, written without division
    # by e^{-β(1-γ)}, which underflows for large β.
    return (jnp.exp(beta * _one_minus_gamma(logit, n)) + (n - 1)) / (2.0 * n)


def _usa_time_per_logit(logit, beta, n):
    return 0.5 * jnp.exp(-beta * _gamma_of_logit(logit, n))


_LOGIT_RATES = {"SA": _sa_logit_rate, "USA": _usa_logit_rate}
_TIMES_PER_LOGIT = {"SA": _sa_time_per_logit, "USA": _usa_time_per_logit}


def _default_tol(dtype) -> float:
    return 1e-13 if jnp.finfo(dtype).bits >= 64 else 1e-6


def gamma_beta(
    ts: Float[ArrayLike, " T"],
    beta: Float[ArrayLike, ""],
    n: int,
    kind: str = "SA",
    *,
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int = 16384,
) -> Float[Array, " T"]:
    r"""The common pairwise inner product $\gamma_\beta(t)$ from an orthogonal start (Thm 6.8).

    If $\langle x_i(0), x_j(0)\rangle = 0$ for $i \ne j$ (so $d \ge n$), all pairwise inner products
    stay equal to $\gamma_\beta(t)$, the solution of $\gamma(0) = 0$ and

    $$\text{SA: } \gamma' = \frac{2 e^{\beta\gamma}(1-\gamma)((n-1)\gamma+1)}{e^\beta + (n-1)e^{\beta\gamma}}
      = \frac{2 e^{\beta(\gamma-1)}(1-\gamma)((n-1)\gamma+1)}{1 + (n-1)e^{\beta(\gamma-1)}},\qquad
      \text{USA: } \gamma' = \tfrac{2}{n} e^{\beta\gamma}(1-\gamma)((n-1)\gamma+1).$$

    Thm 6.9: random starts in high dimension track $\gamma_\beta$.

    **How it is solved.** In the logit variable $L$ of the module docstring, where the right-hand
    side is bounded and smooth however close $\gamma$ gets to 1, with
    diffrax's 8th-order `Dopri8` and a PID controller (default `rtol = atol = 1e-13` in float64,
    `1e-6` in float32); output at `ts` through `SaveAt(ts=ts)`. Agrees with SciPy's DOP853 on the
    $\gamma$ equation to about $10^{-12}$ in float64. `beta` may be traced: a sweep over β is one call
    with `jax.vmap(lambda b: gamma_beta(ts, b, n))(betas)`.

    **Arguments:**

    - `ts`: output times, shape `(T,)`, non-decreasing, `ts[0] >= 0`.
    - `beta`: the inverse temperature $\beta$ (a scalar, may be traced).
    - `n`: number of particles, $n \ge 2$ (may be traced).
    - `kind`: `"SA"` (softmax-normalized self-attention) or `"USA"` (normalization by $n$).
    - `rtol`, `atol`: tolerances of the step-size controller on $L$.
    - `max_steps`: step budget of the solver (raises if exceeded).

    **Returns:**

    $\gamma_\beta$ at `ts`, shape `(T,)`, values in $[0, 1]$.

    **Example:** `gamma_beta(jnp.array([0.0, 1.0]), 0.0, 2)` is `[0, tanh(1)]`.
    """
    kind = _check_kind(kind)
    _check_int("n", n, 2, "the pairwise inner product needs two particles")
    ts = jnp.asarray(ts)
    ts = ts.astype(jnp.result_type(ts.dtype, float))
    if ts.ndim != 1 or ts.shape[0] < 1:
        raise ValueError(f"ts must be a non-empty 1-D array of output times; got shape {ts.shape}.")
    tol = _default_tol(ts.dtype)
    rtol = float(tol if rtol is None else rtol)
    atol = float(tol if atol is None else atol)
    positive_int("max_steps", max_steps)
    beta = jnp.asarray(beta, dtype=ts.dtype)
    n = jnp.asarray(n, dtype=ts.dtype)
    # Pad the output times to a power of two by repeating the last (saving at a repeated time
    # changes nothing): one compilation serves every length in the bucket (~3 s each).
    size = ts.shape[0]
    bucket = 1 << (size - 1).bit_length()
    padded = jnp.concatenate([ts, jnp.broadcast_to(ts[-1], (bucket - size,))])
    out = _gamma_beta(padded, beta, n, kind=kind, rtol=rtol, atol=atol, max_steps=int(max_steps))
    return out[:size]


def _logit_field(rate):
    return lambda t, logit, args: rate(logit, *args)


# Jitted once per (kind, tolerances, shapes): repeated calls and β sweeps reuse the compilation.
@functools.partial(jax.jit, static_argnames=("kind", "rtol", "atol", "max_steps"))
def _gamma_beta(ts, beta, n, *, kind, rtol, atol, max_steps):
    dtype = ts.dtype
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(_logit_field(_LOGIT_RATES[kind])),
        diffrax.Dopri8(),
        t0=jnp.zeros((), dtype),
        t1=ts[-1],
        dt0=None,
        y0=jnp.zeros((), dtype),
        args=(beta, n),
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
    )
    return _gamma_of_logit(sol.ys, n)


# ----------------------------------------------------------------------------------------------
# Thm 6.9: Gamma_infinity


def _kind_and_betas(dynamics, kind):
    """`(kind, betas)` from an `SA` / `USA` object (one or a batch over β), or from the old form
    (an array of β and the string `kind`, default `"SA"`)."""
    if isinstance(dynamics, type) or dynamics is USA:
        raise ValueError(
            f"gamma_infinity: dynamics={dynamics.__name__} is a constructor; pass an instance, e.g. "
            f"{dynamics.__name__}(beta=1.0), or a batch over β, "
            f"eqx.filter_vmap({dynamics.__name__})(betas)."
        )
    if isinstance(dynamics, SA):
        given = [name for name in _MATRIX_NAMES if getattr(dynamics, name) is not None]
        if given or dynamics.repulsive:
            what = f"{', '.join(given)} given" if given else "repulsive=True (V = -I)"
            raise ValueError(
                f"gamma_infinity: the dynamics has {what}; Thm 6.9 (and γ_β) is for "
                f"Q = K = V = I: pass {dynamics.name}(beta) without matrices."
            )
        if kind is not None:
            raise ValueError(
                f"gamma_infinity: kind={kind!r} with a dynamics object; the kind comes from the "
                f"object ({dynamics.name}): drop kind."
            )
        return dynamics.name, dynamics.beta
    if isinstance(dynamics, eqx.Module):
        raise ValueError(
            f"gamma_infinity: dynamics of type {type(dynamics).__name__} is not supported; valid "
            "choices: a wb.particles.SA or wb.particles.USA instance (one β or a batch over β), "
            "or (old form) an array of β with kind='SA' or 'USA'."
        )
    return _check_kind("SA" if kind is None else kind), dynamics


def gamma_infinity(
    dynamics: SA | Float[ArrayLike, "*b"],
    delta: float = 1e-3,
    n: int = 32,
    kind: str | None = None,
    *,
    panels: int = 64,
    nodes: int = 16,
) -> Float[Array, "*b"]:
    r"""The curve $\Gamma_\infty = \{(t, \beta) : \gamma_\beta(t) = 1 - \delta\}$ of Thm 6.9, as $t^*(\beta)$.

    Since $\gamma_\beta$ increases strictly from 0 to 1, each $\beta$ has one crossing time

    $$t^*(\beta) = \int_0^{1-\delta} \frac{d\gamma}{\gamma'(\gamma)}
      = \int_0^{L_\delta} \frac{dt}{dL}\, dL, \qquad L_\delta = \log\frac{n - (n-1)\delta}{\delta},$$

    with, in the logit variable of the module docstring *(derived)*,

    $$\text{SA: } \frac{dt}{dL} = \frac{e^{\beta(1-\gamma(L))} + n - 1}{2n}, \qquad
      \text{USA: } \frac{dt}{dL} = \tfrac12 e^{-\beta\gamma(L)}.$$

    The integrand is smooth and bounded (analytic in the strip $|\operatorname{Im} L| < \pi$), so
    composite Gauss–Legendre quadrature (`panels` equal panels of `nodes` points) converges
    geometrically: relative error near machine precision while each panel spans at most a few of
    the integrand's length scales, $n/\beta$ in $L$ near $L = 0$ for SA (e.g. $\beta \lesssim 100$
    for $n = 2$ with the defaults; more for larger $n$). Raise `panels` for larger $\beta/n$.
    At $\beta = 0$, $t^* = L_\delta / 2$ exactly. This is the curve overlaid on the phase diagram of
    Fig. 3 (SA, $n = 32$, $\delta = 10^{-3}$).

    **Arguments:**

    - `dynamics`: the dynamics whose curve is wanted: `SA(beta)` or `USA(beta)` with
      `Q = K = V = I` (no matrices, not repulsive: the theorem's case), or a batch of them over
      β (`eqx.filter_vmap(SA)(betas)`); β and the kind come from it (β may be traced). Also
      accepted: an array of inverse temperatures, any shape, with `kind`.
    - `delta`: the level $1 - \delta$, $\delta \in (0, 1)$.
    - `n`: number of particles, $n \ge 2$.
    - `kind`: only with an array of β: `"SA"` (default) or `"USA"`.
    - `panels`, `nodes`: the quadrature rule (static positive integers).

    **Returns:**

    $t^*(\beta)$, the shape of β (`(B,)` for a batch, `()` for one instance).

    **Example:** `gamma_infinity(eqx.filter_vmap(SA)(jnp.linspace(0.1, 9.0, 90)))` is the Fig. 3
    overlay; `gamma_infinity(jnp.linspace(0.1, 9.0, 90), kind="SA")` the same numbers.
    """
    kind, betas = _kind_and_betas(dynamics, kind)
    _check_int("n", n, 2, "the pairwise inner product needs two particles")
    _check_delta(delta)
    for name, value in (("panels", panels), ("nodes", nodes)):
        positive_int(name, value, hint="quadrature rule size")
    betas = jnp.asarray(betas)
    betas = betas.astype(jnp.result_type(betas.dtype, float))
    dtype = betas.dtype

    x, w = np.polynomial.legendre.leggauss(int(nodes))
    # Reference points and weights of the composite rule on [0, 1]; scaled by L_delta below.
    left = np.arange(panels)[:, None] / panels
    ref_points = jnp.asarray((left + (x[None, :] + 1.0) / (2.0 * panels)).ravel(), dtype)
    ref_weights = jnp.asarray(np.tile(w / (2.0 * panels), panels), dtype)

    l_end = jnp.log(n - (n - 1) * jnp.asarray(delta, dtype)) - jnp.log(jnp.asarray(delta, dtype))
    logit = l_end * ref_points  # (nodes * panels,)
    b = betas[..., None]
    dtdl = _TIMES_PER_LOGIT[kind](logit, b, n)
    return l_end * jnp.sum(ref_weights * dtdl, axis=-1)


# ----------------------------------------------------------------------------------------------
# rates and thresholds


def clustering_rate_bound(n: int, beta: Float[ArrayLike, "*b"]) -> Float[Array, "*b"]:
    r"""The exponential clustering rate in the proof of Thm 6.3: $\lambda = 1 / (2 n e^{2\beta})$.

    Thm 6.3 (d ≥ n, uniform i.i.d. start): the particles converge to one cluster exponentially
    fast; the proof's rate is $\lambda = (2 n e^{2\beta})^{-1}$ (docs/particles.md). A lower bound on the
    speed, not the observed rate: compare observed decay rates with it, expecting them faster.

    **Arguments:**

    - `n`: number of particles (positive).
    - `beta`: inverse temperature(s), any shape.

    **Returns:**

    $\lambda$, shape of `beta`.
    """
    _check_int("n", n, 1, "a number of particles")
    beta = jnp.asarray(beta)
    beta = beta.astype(jnp.result_type(beta.dtype, float))
    return 0.5 / n * jnp.exp(-2.0 * beta)


def tau_star(beta: Float[ArrayLike, "*b"], d: int) -> Float[Array, "*b"]:
    r"""The angle $\tau^*_\beta \in (0, \pi/2]$ of Thm 5.1, solving $\beta \sin^2\tau = (d-1)\cos\tau$.

    With $c = \cos\tau$ the equation is the quadratic $\beta c^2 + (d-1)c - \beta = 0$, whose root in
    $[0, 1]$ gives, in cancellation-free form with $R = \sqrt{(d-1)^2 + 4\beta^2}$,

    $$\cos\tau^* = \frac{2\beta}{d - 1 + R}, \qquad \sin\tau^* = \sqrt{\frac{2(d-1)}{d - 1 + R}},
      \qquad \tau^* = \operatorname{atan2}(\sin\tau^*, \cos\tau^*)$$

    (atan2 keeps full relative accuracy at large β, where $\tau^* \approx \sqrt{(d-1)/\beta}$ is small
    and `arccos` would lose digits). $\tau^*$ decreases from $\pi/2$ at $\beta = 0$ to 0 as
    $\beta \to \infty$.

    **Arguments:**

    - `beta`: inverse temperature(s) $\beta \ge 0$, any shape.
    - `d`: dimension, $d \ge 2$.

    **Returns:**

    $\tau^*_\beta$ in radians, shape of `beta`.
    """
    _check_int("d", d, 2, "the sphere S^{d-1} must have positive dimension")
    beta = jnp.asarray(beta)
    beta = beta.astype(jnp.result_type(beta.dtype, float))
    dm1 = jnp.asarray(d, beta.dtype) - 1
    denom = dm1 + jnp.sqrt(dm1**2 + 4.0 * beta**2)
    return jnp.arctan2(jnp.sqrt(2.0 * dm1 / denom), 2.0 * beta / denom)


def large_beta_condition(beta: Float[ArrayLike, "*b"], n: int, d: int) -> Bool[Array, "*b"]:
    r"""Whether the large-β hypothesis of Thm 5.1 holds: $(n-1)\,\tau^*_\beta < \pi/2$.

    Under it (essentially $\beta \ge C(d)\, n^2$), almost every start clusters to one point.
    Equivalent to $\beta >$ `large_beta_threshold(n, d)`.

    **Arguments:**

    - `beta`: inverse temperature(s), any shape.
    - `n`: number of particles, $n \ge 2$.
    - `d`: dimension, $d \ge 2$.

    **Returns:**

    A boolean array, shape of `beta`.
    """
    _check_int("n", n, 2, "a pairwise condition needs two particles")
    return (n - 1) * tau_star(beta, d) < jnp.pi / 2


def large_beta_threshold(n: int, d: int) -> Float[Array, ""]:
    r"""The smallest β of Thm 5.1's hypothesis: $(n-1)\tau^*_\beta < \pi/2 \iff \beta > \beta_c$.

    $\tau^*_\beta$ decreases in β, so the condition holds exactly above the β at which
    $\tau^*_\beta = \tau_c = \pi / (2(n-1))$; substituting in $\beta\sin^2\tau = (d-1)\cos\tau$,

    $$\beta_c(n, d) = \frac{(d-1)\cos\tau_c}{\sin^2\tau_c} \approx \frac{4(d-1)(n-1)^2}{\pi^2}
      \quad (n \text{ large}),$$

    the $C(d)\,n^2$ scaling of Thm 5.1. $\beta_c = 0$ for $n = 2$.

    **Arguments:**

    - `n`: number of particles, $n \ge 2$.
    - `d`: dimension, $d \ge 2$.

    **Returns:**

    $\beta_c$ as a float scalar.
    """
    _check_int("n", n, 2, "a pairwise condition needs two particles")
    _check_int("d", d, 2, "the sphere S^{d-1} must have positive dimension")
    tau_c = jnp.pi / (2.0 * (jnp.asarray(n, float) - 1.0))
    beta_c = (d - 1) * jnp.cos(tau_c) / jnp.sin(tau_c) ** 2
    # cos(pi/2) rounds to 6e-17; n = 2 has the exact answer 0.
    return jnp.where(jnp.asarray(n) == 2, 0.0, beta_c)


# ----------------------------------------------------------------------------------------------
# Lemma 6.4


def hemisphere_margin(x: Tokens, w: Float[ArrayLike, " d"]) -> Float[Array, ""]:
    r"""The hemisphere margin $m(x) = \min_i \langle x_i, w\rangle$ (Lemma 6.4's invariant).

    Lemma 6.4: if all particles start in the open hemisphere $\{\langle x, w\rangle > 0\}$, then
    $t \mapsto \min_i \langle x_i(t), w\rangle$ never decreases (and collapse to one cluster is
    exponential). Only the monotone invariant is implemented: docs/particles.md does not state the lemma's
    constants (the exponential rate), so no bound built on them is provided. `w` is used as given;
    its scale does not affect the sign or the monotonicity.

    **Arguments:**

    - `x`: particles, shape `(n, d)`.
    - `w`: the hemisphere's pole, shape `(d,)`.

    **Returns:**

    The scalar margin; positive iff all particles are in the open hemisphere of `w`.
    """
    shape = getattr(x, "shape", None)
    w = jnp.asarray(w)
    if shape is None or len(shape) != 2:
        raise ValueError(f"x must be one configuration of shape (n, d); got shape {shape}.")
    if w.shape != (shape[1],):
        raise ValueError(f"w has shape {w.shape}; expected ({shape[1]},), a vector of R^d.")
    return jnp.min(x @ w)
