r"""Control bases: the spaces θ(t) lives in, and the L² projections between them.

Every control of the library is a linear combination of basis functions of depth-time with
parameter-valued coefficients,

$$θ(t) = \sum_{k<n} φ_k(t)\, c_k, \qquad t ∈ [0, T],$$

the coefficients `c_k` being the leading axis of the control's `values` (its trainable leaves):

| basis (the option)            | control           | `φ_k`                                             |
|-------------------------------|-------------------|---------------------------------------------------|
| `PiecewiseConstantBasis(L)`   | `PiecewiseConstant` | the indicator of layer `k` (a network's layers) |
| `PiecewiseLinearBasis(L)`     | `Interpolated`    | hat functions through the layer midpoints         |
| `LegendreBasis(p)`            | `Legendre`        | `√(2k+1) P_k(2t/T − 1)`, `k ≤ p`                  |
| `HypernetworkBasis(K)`        | `Hypernetwork`    | a small network of `t` with `K` outputs (learned) |

`basis.project(control)` (or `control.project(basis)`) is the L² projection onto the basis,
$c = G^{-1} \int φ(t)\, θ(t)\, dt$ with the Gram matrix `G = ∫ φ φᵀ dt`, computed by Gauss–
Legendre quadrature on every interval between the breakpoints of both bases, with enough nodes
to be exact for their polynomial pieces. Where the bases are nested (a sub-grid of layers, a
lower degree) it is exact: refining and projecting back gives the control itself. A projection
onto a *larger* basis that does not contain the control's is refused: it would pretend to add
resolution. Projecting onto fewer functions is the compression of a trained model, with no
data and no retraining.

A *learned* basis (`wb.HypernetworkBasis`: its functions are a small network of `t`, `degree`
`None`) has no polynomial pieces, so no Gauss rule is exact for it: a projection with a learned
source or target uses `LEARNED_NODES` Gauss–Legendre nodes on each of at least
`LEARNED_PIECES` equal subintervals of `[0, T]` (every interval between breakpoints cut into
its share), and is then approximate, to the quadrature error of analytic integrands. Its
Gram system is solved with `jnp`, in the dtype of the control's values, so that it can be
traced.

A Legendre control is smooth in depth, so an adaptive solver can step across many layers' worth
of depth at once and every splitting scheme keeps its order on the whole network.
"""

import abc
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from ._checks import int_in_range, positive_float
from ._controls import (
    AbstractControl,
    Constant,
    Interpolated,
    PiecewiseConstant,
    _check_factor,
    _num_pieces,
    _scalar,
)

__all__ = [
    "AbstractBasis",
    "Legendre",
    "LegendreBasis",
    "PiecewiseConstantBasis",
    "PiecewiseLinearBasis",
    "basis_of",
]

LEARNED_NODES = 16
"""Gauss–Legendre nodes per subinterval in a projection that involves a learned basis."""
LEARNED_PIECES = 8
"""The fewest equal subintervals of `[0, T]` such a projection's quadrature uses."""


def _legendre_values(x, n: int, xp):
    """`[√(2k+1) P_k(x)]_{k<n}` by the three-term recurrence (orthonormal under `½∫_{-1}^{1}`)."""
    p_prev, p = xp.ones_like(x), x
    out = [p_prev]
    for k in range(1, n):
        out.append(p)
        p_prev, p = p, ((2 * k + 1) * x * p - k * p_prev) / (k + 1)
    return xp.stack([math.sqrt(2 * k + 1) * v for k, v in enumerate(out[:n])], axis=-1)


def _gauss(breakpoints: np.ndarray, q: int) -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss–Legendre nodes and weights with `q` nodes on each interval."""
    x, w = np.polynomial.legendre.leggauss(q)
    a, b = breakpoints[:-1, None], breakpoints[1:, None]
    nodes = (a + b) / 2 + (b - a) / 2 * x
    weights = (b - a) / 2 * w
    return nodes.ravel(), weights.ravel()


def _combine(matrix, values: PyTree, name: str) -> PyTree:
    """`Σ_k matrix[j, k] values[k]` on every inexact leaf (leading axis k → j)."""

    def leaf(x):
        if not eqx.is_array(x):
            return x
        if not eqx.is_inexact_array(x):
            if x.shape[0] and bool(jnp.all(x == x[:1])):
                return jnp.repeat(x[:1], matrix.shape[0], axis=0)
            raise ValueError(
                f"{name}: a non-floating array leaf that varies along the basis axis cannot be "
                f"projected (shape {x.shape}, dtype {x.dtype})."
            )
        m = jnp.asarray(matrix, x.dtype)
        return jnp.tensordot(m, x, axes=1)

    return jax.tree.map(leaf, values)


class AbstractBasis(eqx.Module):
    """A finite-dimensional space of controls on `[0, T]`: `θ(t) = Σ_k φ_k(t) c_k` (see the
    module docstring). A basis is an option, like a diffrax solver: it says *which* space, not
    the coefficients; `project` puts a control into it."""

    @property
    @abc.abstractmethod
    def num_functions(self) -> int:
        """`n`, the number of coefficients (each one layer's worth of parameters)."""

    @abc.abstractmethod
    def functions(self, ts: np.ndarray, t1: float) -> np.ndarray:
        """`φ_k(t)` at the times `ts`, shape `(len(ts), n)`: NumPy float64 for the fixed
        bases, a JAX array in its weights' dtype for a learned one."""

    @abc.abstractmethod
    def breakpoints(self, t1: float) -> np.ndarray:
        """`0`, the points where the functions are not smooth, and `T`, in increasing order."""

    @property
    @abc.abstractmethod
    def degree(self) -> int | None:
        """The polynomial degree of the functions between breakpoints; `None` for functions
        that are not polynomials there (a learned basis: its projections are approximate)."""

    @abc.abstractmethod
    def control(self, values: PyTree, t1: float) -> AbstractControl:
        """The control with coefficients `values` (leading axis `n`) on `[0, t1]`."""

    @abc.abstractmethod
    def contains(self, other: "AbstractBasis") -> bool:
        """Whether every function of `other` lies in this space (on the same `[0, T]`)."""

    def project(self, control: AbstractControl) -> AbstractControl:
        """The L² projection of `control` onto this basis, on the control's `[0, T]` (exact
        where the bases are nested). A `ValueError` if this basis is larger than the control's
        and does not contain it."""
        if not isinstance(control, AbstractControl):
            raise ValueError(
                f"project takes a control (wb.PiecewiseConstant, wb.Interpolated, wb.Legendre); "
                f"got {type(control).__name__}."
            )
        source = basis_of(control)
        if _same_basis(source, self):
            return control
        if self.num_functions > source.num_functions and not self.contains(source):
            raise ValueError(
                f"cannot project a control in {source!r} ({source.num_functions} functions) onto "
                f"the larger {self!r} ({self.num_functions} functions): it does not contain the "
                "control's basis, so the projection would only add functions the control cannot "
                "fill. Project onto a basis with at most as many functions, or onto one that "
                "nests it (e.g. a multiple of the layer count, a higher degree)."
            )
        t1 = control.t1
        leaves = [x for x in jax.tree.leaves(control.values) if eqx.is_inexact_array(x)]
        dtype = jnp.result_type(*leaves) if leaves else jnp.result_type(float)
        own = {x.dtype for x in jax.tree.leaves(self) if eqx.is_inexact_array(x)}
        if own and own != {jnp.dtype(dtype)}:
            # A learned basis's weights become part of the control: one dtype for the model.
            raise ValueError(
                f"cannot project a {jnp.dtype(dtype).name} control onto {type(self).__name__}, "
                f"whose own weights are {' and '.join(sorted(d.name for d in own))}: the model "
                f"would mix dtypes. Build the basis in the control's dtype "
                f"(dtype=jnp.{jnp.dtype(dtype).name})."
            )
        matrix = _projection_matrix(source, self, t1, dtype)
        values = _combine(matrix, control.values, f"project onto {type(self).__name__}")
        return self.control(values, t1)


def _same_basis(a: AbstractBasis, b: AbstractBasis) -> bool:
    """`a == b`, concretely: bases holding traced weights (a learned basis under `jit`) are the
    same only when they are the same object."""
    same = a == b
    return bool(same) if isinstance(same, (bool, np.bool_)) else a is b


def _learned_points(points: np.ndarray, t1: float) -> np.ndarray:
    """`points` with every interval cut into equal parts of length at most `T / LEARNED_PIECES`."""
    out = [points[:1]]
    for a, b in zip(points[:-1], points[1:]):
        m = max(1, math.ceil(LEARNED_PIECES * (b - a) / t1 - 1e-9))
        out.append(np.linspace(a, b, m + 1)[1:])
    return np.concatenate(out)


def _projection_matrix(source: AbstractBasis, target: AbstractBasis, t1: float, dtype=None):
    """`P` with `c_target = P c_source`: `G_t⁻¹ ∫ φ_t φ_sᵀ`, exact for polynomial pieces. With a
    learned basis (`degree` `None`): many nodes on subdivided intervals, approximate, solved
    with `jnp` in `dtype` (default float64 where enabled)."""
    points = np.union1d(source.breakpoints(t1), target.breakpoints(t1))
    if source.degree is None or target.degree is None:
        degrees = [b.degree for b in (source, target) if b.degree is not None]
        q = max([LEARNED_NODES] + [d + 1 for d in degrees])
        nodes, weights = _gauss(_learned_points(points, t1), q)
        dtype = jnp.result_type(float) if dtype is None else dtype
        a = jnp.asarray(target.functions(nodes, t1), dtype)
        s = jnp.asarray(source.functions(nodes, t1), dtype)
        w = jnp.asarray(weights, dtype)[:, None]
        return jnp.linalg.solve(a.T @ (w * a), a.T @ (w * s))
    q = max(1, (source.degree + target.degree) // 2 + 1)  # exact up to degree 2q − 1
    q = max(q, target.degree + 1)  # the Gram matrix (degree 2 · target's) exact too
    nodes, weights = _gauss(points, q)
    a = target.functions(nodes, t1)
    s = source.functions(nodes, t1)
    gram = a.T @ (weights[:, None] * a)
    return np.linalg.solve(gram, a.T @ (weights[:, None] * s))


def _is_constants(basis: AbstractBasis) -> bool:
    """Whether `basis` is the constants alone (one function: PC(1), PL(1), Legendre(0)), a
    subspace of every basis."""
    return basis.num_functions == 1 and isinstance(
        basis, (PiecewiseConstantBasis, PiecewiseLinearBasis, LegendreBasis)
    )


class PiecewiseConstantBasis(AbstractBasis):
    """Indicators of `num_pieces` equal pieces of `[0, T]`: a network's layers
    (`wb.PiecewiseConstant`)."""

    num_pieces: int = eqx.field(static=True)

    def __check_init__(self):
        int_in_range("PiecewiseConstantBasis.num_pieces", self.num_pieces, 1)

    @property
    def num_functions(self) -> int:
        return self.num_pieces

    @property
    def degree(self) -> int:
        return 0

    def functions(self, ts, t1):
        i = np.clip(np.floor(np.asarray(ts) / (t1 / self.num_pieces)), 0, self.num_pieces - 1)
        return (i[:, None] == np.arange(self.num_pieces)).astype(np.float64)

    def breakpoints(self, t1):
        return np.linspace(0.0, t1, self.num_pieces + 1)

    def control(self, values, t1):
        return PiecewiseConstant(values, t1 / self.num_pieces)

    def contains(self, other):
        if isinstance(other, PiecewiseConstantBasis):
            return self.num_pieces % other.num_pieces == 0
        return _is_constants(other)


class PiecewiseLinearBasis(AbstractBasis):
    """Continuous piecewise-linear functions through the midpoints of `num_pieces` equal
    pieces, constant before the first and after the last (`wb.Interpolated`)."""

    num_pieces: int = eqx.field(static=True)

    def __check_init__(self):
        int_in_range("PiecewiseLinearBasis.num_pieces", self.num_pieces, 1)

    @property
    def num_functions(self) -> int:
        return self.num_pieces

    @property
    def degree(self) -> int:
        return 1

    def functions(self, ts, t1):
        n = self.num_pieces
        s = np.clip(np.asarray(ts) / (t1 / n) - 0.5, 0.0, n - 1)
        i = np.clip(np.floor(s).astype(int), 0, max(n - 2, 0))
        w = s - i
        out = np.zeros((len(s), n))
        rows = np.arange(len(s))
        out[rows, i] += 1 - w
        out[rows, np.minimum(i + 1, n - 1)] += w
        return out

    def breakpoints(self, t1):
        h = t1 / self.num_pieces
        return np.concatenate([[0.0], (np.arange(self.num_pieces) + 0.5) * h, [t1]])

    def control(self, values, t1):
        return Interpolated(values, t1 / self.num_pieces)

    def contains(self, other):
        if isinstance(other, PiecewiseLinearBasis):
            f, r = divmod(self.num_pieces, other.num_pieces)
            return r == 0 and f % 2 == 1  # odd factors keep the old midpoints as nodes
        return _is_constants(other)


class LegendreBasis(AbstractBasis):
    r"""Polynomials of degree at most `max_degree` on `[0, T]`, in the orthonormal Legendre
    basis `φ_k(t) = √(2k+1) P_k(2t/T − 1)` (`(1/T)∫ φ_j φ_k dt = δ_jk`), `n = max_degree + 1`
    coefficients (`wb.Legendre`). Nested by degree: projecting onto a lower degree truncates."""

    max_degree: int = eqx.field(static=True)

    def __check_init__(self):
        int_in_range(
            "LegendreBasis.max_degree",
            self.max_degree,
            0,
            hint="the highest polynomial degree; max_degree + 1 coefficients",
        )

    @property
    def num_functions(self) -> int:
        return self.max_degree + 1

    @property
    def degree(self) -> int:
        return self.max_degree

    def functions(self, ts, t1):
        x = 2 * np.asarray(ts, np.float64) / t1 - 1
        return _legendre_values(x, self.num_functions, np)

    def breakpoints(self, t1):
        return np.array([0.0, float(t1)])

    def control(self, values, t1):
        return Legendre(values, t1=t1)

    def contains(self, other):
        if isinstance(other, LegendreBasis):
            return other.max_degree <= self.max_degree
        return isinstance(other, (PiecewiseConstantBasis, PiecewiseLinearBasis)) and (
            other.num_pieces == 1
        )


def _check_t1(value) -> None:
    positive_float("t1", value, arrays=True, hint="the depth T of the control's interval [0, T]")


class AbstractOnePieceControl(AbstractControl):
    """A control that is one smooth piece over the whole depth `[0, T]` (`piece_length = T`):
    no layers to localize to, any step grid."""

    @property
    def num_pieces(self) -> int:
        return 1

    @property
    def is_piecewise_constant(self) -> bool:
        return False

    def localize(self, piece) -> "AbstractOnePieceControl":
        del piece
        return self


class Legendre(AbstractOnePieceControl):
    r"""θ(t) a polynomial in depth-time: `θ(t) = Σ_{k≤p} √(2k+1) P_k(2t/T − 1) c_k`.

    The coefficients `c_k` are the leading axis of `values` (`p + 1` of them, each one layer's
    worth of parameters); `c_0` is the mean of θ over `[0, T]`. θ is smooth, so every
    splitting scheme and every diffrax solver keeps its order on the whole depth, and a solve
    may take any number of steps, or adaptive ones, across `[0, T]`. The control is one piece
    (`num_pieces = 1`, `piece_length = T`): a `Transformer` with Legendre controls takes
    `steps_per_layer` steps over the whole depth.

    **Arguments:**

    - `values`: the stacked coefficients (leading axis `p + 1`), e.g. a term's pytree.
    - `t1`: the depth `T`.

    `wb.LegendreBasis(p).project(network_control)` maps a network's layers into the basis;
    `control.project(wb.LegendreBasis(q))` with `q < p` truncates (compression).
    """

    values: PyTree
    piece_length: float = eqx.field(static=True, converter=_scalar)

    def __init__(self, values: PyTree, *, t1: float = 1.0):
        self.values = values
        self.piece_length = t1

    def __check_init__(self):
        _num_pieces(self.values)
        _check_t1(self.piece_length)

    @property
    def num_functions(self) -> int:
        return _num_pieces(self.values)

    @property
    def max_degree(self) -> int:
        return self.num_functions - 1

    def evaluate(self, t) -> PyTree:
        """θ(t), the polynomial itself at every `t`, also just outside `[0, T]`: Yoshida4's
        clock leaves the step (to `t − 0.35τ` in the first, `T + 0.35τ` in the last), and the
        polynomial continues θ smoothly there, where a value held constant past the ends would
        be a kink that brings Yoshida4 down to order 2."""
        x = 2 * jnp.asarray(t) / self.piece_length - 1
        phi = _legendre_values(x, self.num_functions, jnp)
        return _at(phi, self.values)

    def coarsen(self, factor: int) -> "Legendre":
        """The projection onto the first `n / factor` functions (degree `n / factor − 1`):
        truncation, since the basis is orthonormal. `factor` must divide `n`."""
        factor = _check_factor(factor)
        n = self.num_functions
        if n % factor:
            raise ValueError(
                f"factor={factor} must divide the number of Legendre coefficients ({n}); valid: "
                f"{[f for f in range(1, n + 1) if n % f == 0]}."
            )
        keep = n // factor
        values = jax.tree.map(lambda x: x[:keep] if eqx.is_array(x) else x, self.values)
        return Legendre(values, t1=self.piece_length)

    def coarsen_transpose(self, factor: int) -> "Legendre":
        """The adjoint of `coarsen(factor)` on a direction shaped like the coarse control:
        zeros appended up to `factor · n` coefficients."""
        factor = _check_factor(factor)
        n = self.num_functions

        def pad(x):
            if not eqx.is_array(x):
                return x
            return jnp.concatenate([x, jnp.zeros(((factor - 1) * n, *x.shape[1:]), x.dtype)])

        return Legendre(jax.tree.map(pad, self.values), t1=self.piece_length)

    def norm_terms(self) -> list:
        """`∫_0^T ‖θ‖² dt = T Σ_k ‖c_k‖²` (orthonormal basis), one term per leaf."""
        leaves = jax.tree.leaves(eqx.filter(self.values, eqx.is_inexact_array))
        return [self.piece_length * jnp.sum(x**2) for x in leaves]

    def smoothness_terms(self) -> list:
        r"""`∫_0^T ‖θ'(t)‖² dt = Σ_{jk} D_{jk} ⟨c_j, c_k⟩` with `D = ∫ φ_j' φ_k' dt` exact."""
        d = _derivative_gram(self.num_functions, self.piece_length)
        out = []
        for x in jax.tree.leaves(eqx.filter(self.values, eqx.is_inexact_array)):
            flat = x.reshape(x.shape[0], -1)
            out.append(jnp.sum((jnp.asarray(d, x.dtype) @ flat) * flat))
        return out


def _at(phi, values):
    """`Σ_k phi[k] values[k]` on the inexact leaves; other leaves as they are."""

    def leaf(x):
        if not eqx.is_array(x):
            return x
        if not eqx.is_inexact_array(x):
            return x[0]
        return jnp.tensordot(phi.astype(x.dtype), x, axes=1)

    return jax.tree.map(leaf, values)


def _derivative_gram(n: int, t1: float) -> np.ndarray:
    """`D_jk = ∫_0^T φ_j'(t) φ_k'(t) dt` for the orthonormal Legendre functions (exact)."""
    x, w = np.polynomial.legendre.leggauss(max(n, 1))
    derivs = []
    for k in range(n):
        coef = np.zeros(k + 1)
        coef[k] = math.sqrt(2 * k + 1)
        derivs.append(np.polynomial.legendre.legval(x, np.polynomial.legendre.legder(coef)))
    p = np.stack(derivs, axis=-1)  # dφ/dx at the nodes
    # dφ/dt = (2/T) dφ/dx and dt = (T/2) dx.
    return (2.0 / t1) * p.T @ (w[:, None] * p)


def basis_of(control: AbstractControl) -> AbstractBasis:
    """The basis a control lives in."""
    if isinstance(control, Legendre):
        return LegendreBasis(control.max_degree)
    if isinstance(control, PiecewiseConstant):
        return PiecewiseConstantBasis(control.num_pieces)
    if isinstance(control, Interpolated):
        return PiecewiseLinearBasis(control.num_pieces)
    if isinstance(control, Constant):
        return PiecewiseConstantBasis(1)
    basis = getattr(control, "basis", None)
    if isinstance(basis, AbstractBasis):
        return basis
    raise ValueError(f"{type(control).__name__} does not say which basis it lives in.")
