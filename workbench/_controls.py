"""Controls θ(t): the time-dependent parameters of the equation, stacked for `lax.scan`."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

from ._checks import positive_float, positive_int
from ._host import stack_arrays


def _num_pieces(values) -> int:
    leaves = [x for x in jax.tree.leaves(values) if eqx.is_array(x)]
    if not leaves:
        raise ValueError("a control needs at least one array leaf with a leading layer axis.")
    sizes = {x.shape[0] if x.ndim else None for x in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"every array leaf of a control must share one leading layer axis; got sizes {sizes}."
        )
    return sizes.pop()


def _scalar(value):
    """NumPy scalars and 0-d arrays to Python numbers (static fields must not hold arrays)."""
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        return value.item()
    return value


def _check_piece_length(value) -> None:
    """`piece_length` must be a finite positive number (the duration of one layer)."""
    positive_float(
        "piece_length",
        value,
        arrays=True,
        hint="the duration of one layer; 1.0 for the exact recovery of a network",
    )


def _check_factor(factor) -> int:
    return positive_int("factor", factor, hint="pieces per old piece")


def _inexact_leaves(values) -> list:
    return jax.tree.leaves(eqx.filter(values, eqx.is_inexact_array))


def _index(values, i):
    # dynamic_index_in_dim skips the negative-index normalization that `x[i]` emits per leaf.
    take = lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False) if eqx.is_array(x) else x
    return jax.tree.map(take, values)


class AbstractControl(eqx.Module):
    """θ(t) on `[0, T]`, `T = num_pieces · piece_length`, whose value is a pytree (e.g. a term).

    `values` is a pytree whose array leaves carry a leading axis of length `num_pieces`
    (one entry per layer); non-array leaves (head counts, activations) are shared.
    """

    values: eqx.AbstractVar[PyTree]
    piece_length: eqx.AbstractVar[float]

    @property
    def num_pieces(self) -> int:
        return _num_pieces(self.values)

    @property
    def t1(self) -> float:
        return self.num_pieces * self.piece_length

    def piece(self, i) -> PyTree:
        """The stored value of piece (layer) `i`."""
        return _index(self.values, i)

    @abc.abstractmethod
    def localize(self, piece) -> "AbstractControl":
        """A control equal to this one on piece `piece`, cheap to evaluate many times there."""

    @abc.abstractmethod
    def evaluate(self, t) -> PyTree:
        """θ(t)."""

    @property
    @abc.abstractmethod
    def is_piecewise_constant(self) -> bool: ...

    def project(self, basis) -> "AbstractControl":
        """The L² projection of θ onto `basis` (a `wb.LegendreBasis`, ...): see
        `AbstractBasis.project`."""
        if not callable(getattr(basis, "project", None)) or isinstance(basis, AbstractControl):
            raise ValueError(
                f"basis={basis!r} is not a control basis; pass wb.PiecewiseConstantBasis(L), "
                "wb.PiecewiseLinearBasis(L), wb.LegendreBasis(degree) or wb.HypernetworkBasis(K, key=...)."
            )
        return basis.project(self)

    def norm_terms(self) -> list:
        """`h Σ_l ‖θ_l‖²` per floating leaf: `∫‖θ‖² dt` for piecewise-constant controls (the
        same layer sum stands for it with interpolated ones)."""
        h = self.piece_length
        return [h * jnp.sum(x**2) for x in _inexact_leaves(self.values)]

    def smoothness_terms(self) -> list:
        """`Σ_l ‖θ_{l+1} − θ_l‖² / h` per floating leaf: `∫‖θ'‖² dt` for the piecewise-linear
        controls through the layer values, the same sum for piecewise-constant ones."""
        h = self.piece_length
        return [jnp.sum((x[1:] - x[:-1]) ** 2) / h for x in _inexact_leaves(self.values)]


class PiecewiseConstant(AbstractControl):
    """Layer `l` acts on `[l h, (l + 1) h)`, `h = piece_length`: a network's weights, exactly.

    **Arguments:**

    - `values`: the stacked per-layer pytree (leading axis = layer).
    - `piece_length`: the duration `h` of one layer (1 for the exact recovery of networks).
    """

    values: PyTree
    piece_length: float = eqx.field(static=True, default=1.0, converter=_scalar)

    def __check_init__(self):
        _num_pieces(self.values)
        _check_piece_length(self.piece_length)

    @property
    def is_piecewise_constant(self) -> bool:
        return True

    def localize(self, piece) -> "Constant":
        return Constant(self.piece(piece))

    def piece_index(self, t):
        """The layer that acts at time `t`: `⌊t / h⌋` clipped to `[0, L − 1]`, computed in the
        dtype of `t` (which decides the layer of the floats next to a boundary `l h`)."""
        return jnp.clip(jnp.floor(t / self.piece_length), 0, self.num_pieces - 1).astype(int)

    def evaluate(self, t) -> PyTree:
        return self.piece(self.piece_index(t))

    def refine(self, factor: int) -> "PiecewiseConstant":
        """The same θ(t) on `factor` times as many pieces of length `h / factor` (every value
        repeated `factor` times)."""
        factor = _check_factor(factor)
        values = jax.tree.map(
            lambda x: jnp.repeat(x, factor, axis=0) if eqx.is_array(x) else x, self.values
        )
        return PiecewiseConstant(values, self.piece_length / factor)

    def coarsen(self, factor: int) -> "PiecewiseConstant":
        r"""θ projected onto `num_pieces / factor` pieces of length `factor · h` (same `T`): the
        L² projection onto piecewise-constant functions on the coarse pieces, i.e. the mean of
        each run of `factor` consecutive layers, `θ̄_j = (1/factor) Σ_{i<factor} θ_{j·factor+i}`.
        The inverse of `refine` (`c.refine(f).coarsen(f) == c`); `factor` must divide
        `num_pieces`."""
        factor = _check_factor(factor)
        if self.num_pieces % factor:
            raise ValueError(
                f"factor={factor} must divide the number of pieces ({self.num_pieces}); valid: "
                f"{[f for f in range(1, self.num_pieces + 1) if self.num_pieces % f == 0]}."
            )

        def mean(x):
            if not eqx.is_inexact_array(x):
                return x[::factor] if eqx.is_array(x) else x
            return x.reshape(x.shape[0] // factor, factor, *x.shape[1:]).mean(axis=1)

        return PiecewiseConstant(jax.tree.map(mean, self.values), self.piece_length * factor)

    def coarsen_transpose(self, factor: int) -> "PiecewiseConstant":
        """The adjoint of `coarsen(factor)` on a direction shaped like the coarse control: each
        value repeated on the `factor` fine pieces and divided by `factor` (the mean's
        transpose)."""
        fine = self.refine(factor)
        values = jax.tree.map(lambda x: x / factor if eqx.is_inexact_array(x) else x, fine.values)
        return PiecewiseConstant(values, fine.piece_length)


class Interpolated(AbstractControl):
    r"""Piecewise-linear θ(t) through the layer values placed at the layer midpoints.

    `θ((l + ½) h) = values[l]`, linear in between, constant before the first and after the last
    midpoint. A model with interpolated controls can be solved with any number of steps: the step
    grid need not align with layers.

    θ is only continuous, with kinks at the midpoints, and that limits the order of the
    splitting schemes of `integrate` (measured on the pre-norm encoder, float64):

    - steps that put the kinks on step boundaries (`num_steps` a multiple of `2 · num_pieces`):
      Lie, Strang and Suzuki4 keep their orders 1, 2 and 4, since their clock stays inside each
      step. Yoshida4 does not: its negative middle weight makes the clock overshoot the step (to
      `t + 1.35τ`, then back to `t − 0.35τ`), so it crosses the kinks, and it converges at
      order 2 (4 with piecewise-constant controls and steps aligned to layers);
    - kinks inside steps: Lie keeps 1 and Strang 2, both fourth-order compositions drop to 2.
    """

    values: PyTree
    piece_length: float = eqx.field(static=True, default=1.0, converter=_scalar)

    def __check_init__(self):
        _num_pieces(self.values)
        _check_piece_length(self.piece_length)

    @property
    def is_piecewise_constant(self) -> bool:
        return False

    def localize(self, piece) -> "Interpolated":
        del piece
        return self

    def evaluate(self, t) -> PyTree:
        n = self.num_pieces
        s = jnp.clip(t / self.piece_length - 0.5, 0.0, n - 1)
        i = jnp.clip(jnp.floor(s).astype(int), 0, max(n - 2, 0))
        w = s - i
        lo, hi = self.piece(i), self.piece(jnp.minimum(i + 1, n - 1))
        return jax.tree.map(
            lambda a, b: (
                (1 - w).astype(a.dtype) * a + w.astype(a.dtype) * b
                if eqx.is_inexact_array(a)
                else a
            ),
            lo,
            hi,
        )

    def refine(self, factor: int) -> "Interpolated":
        r"""Controls on `factor` times as many pieces of length `h' = h / factor`: θ sampled at
        the new midpoints `(j + ½) h'`. Equal to θ on its linear stretches. At an old midpoint
        (a kink of θ) an odd `factor` puts a new midpoint, so nothing changes; an even one cuts
        the corner by `|θ_{l+1} − 2θ_l + θ_{l−1}| / (4 factor)` (the layer values' second
        difference; `θ_{−1} = θ_0` and `θ_L = θ_{L−1}` at the ends, where θ is constant). The
        depth refinement of a trained network: train with `L` pieces, refine, continue training
        at `factor · L`."""
        factor = _check_factor(factor)
        h = self.piece_length / factor
        ts = (jnp.arange(self.num_pieces * factor) + 0.5) * h
        static = eqx.filter(self.values, eqx.is_array, inverse=True)
        sampled = jax.vmap(lambda t: eqx.filter(self.evaluate(t), eqx.is_array))(ts)
        return Interpolated(eqx.combine(sampled, static), h)


class Constant(AbstractControl):
    """A control constant in time (a single piece)."""

    value: PyTree
    piece_length: float = eqx.field(static=True, default=1.0, converter=_scalar)

    def __check_init__(self):
        _check_piece_length(self.piece_length)

    @property
    def values(self):
        return jax.tree.map(lambda x: x[None] if eqx.is_array(x) else x, self.value)

    @property
    def is_piecewise_constant(self) -> bool:
        return True

    def localize(self, piece) -> "Constant":
        del piece
        return self

    def evaluate(self, t) -> PyTree:
        del t
        return self.value


def stack(layers) -> PyTree:
    """Stack a sequence of equal-structure pytrees (e.g. per-layer terms) along a new leading axis."""
    layers = list(layers)
    if not layers:
        raise ValueError("stack needs at least one layer.")
    arrays = [eqx.filter(x, eqx.is_array) for x in layers]
    static = eqx.filter(layers[0], eqx.is_array, inverse=True)
    stacked = jax.tree.map(lambda *xs: stack_arrays(xs), *arrays)
    return eqx.combine(stacked, static)


def steps_grid(num_steps: int, num_pieces: int) -> np.ndarray:
    """Piece index of each step of a uniform grid whose steps never straddle two pieces."""
    k = num_steps // num_pieces
    return np.repeat(np.arange(num_pieces), k)
