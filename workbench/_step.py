r"""The step map `Φ(t, u, τ)` of a splitting scheme: one step of the discretized equation.

`integrate` composes it over the step grid, the splitting-error analysis compares it with the
exact flow, and the training methods differentiate it (`jax.vjp`) step by step.
"""

import jax
import jax.numpy as jnp
import numpy as np

from ._checks import positive_int
from ._equation import Equation
from ._types import KeyMask, Tokens
from .schemes._runge_kutta import AbstractExplicitRK
from .schemes._splitting import AbstractComposition, AbstractSplittingScheme, check_stages


def step(
    equation: Equation,
    scheme: AbstractSplittingScheme,
    t,
    u: Tokens,
    tau,
    *,
    mask: KeyMask | None = None,
    piece=None,
    subflow_solver: AbstractExplicitRK | None = None,
    subflow_substeps: int = 1,
) -> Tokens:
    r"""One step `u ↦ Φ(t, u, τ)` of `scheme` on `equation`, from time `t` to `t + τ`.

    The scheme's substeps `(k, a)` are applied left to right: the sub-flow of operator `k`
    (`G_k`, then its projection for `PostNorm`) over `a τ`, solved by one step of `scheme.inner`
    (or `subflow_substeps` steps of `subflow_solver`). Time-dependent controls are handled by
    the augmented autonomous system `t' = 1`: the clock advances only in operator 0's substeps,
    and the other operators see their controls frozen at the current clock. With
    `LieTrotter()`, `τ = 1` and one step per layer this is the network's layer:
    `u + MHA(LN(u))`, then `v + FFN(LN(v))` (pre-norm), or `LN(u + MHA(u))`, … (post-norm).

    A step must not straddle a jump of piecewise-constant controls: their step lies inside
    one layer, `piece` (default `⌊(t + τ/2) / piece_length⌋`), whose controls are used on the
    whole step. `t`, `tau` and `piece` may be traced.

    **Arguments:**

    - `equation`: the `Equation`.
    - `scheme`: a splitting scheme (`LieTrotter()`, `Strang()`, `Yoshida4()`, `Suzuki4()`).
    - `t`: the start of the step; `u`: the state `(n, d)`; `tau`: the step.
    - `mask`: optional key-padding mask `(n,)` (True = token), as in `integrate`.
    - `piece`: the layer the step lies in (piecewise-constant controls only).
    - `subflow_solver`, `subflow_substeps`: solve each sub-flow by `subflow_substeps` steps of
      this explicit Runge–Kutta method instead of one step of `scheme.inner` (nearly exact
      sub-flows, to see the splitting error alone).

    **Returns:** `Φ(t, u, τ)`, shape `(n, d)`.
    """
    if not isinstance(scheme, AbstractSplittingScheme):
        raise ValueError(
            f"scheme={scheme!r} is not a splitting scheme; pass e.g. workbench.schemes."
            "LieTrotter(), Strang(), Yoshida4() or Suzuki4()."
        )
    if subflow_solver is not None and not isinstance(subflow_solver, AbstractExplicitRK):
        raise ValueError(
            f"subflow_solver={subflow_solver!r} must be None (one step of the scheme's inner "
            "method) or an explicit Runge–Kutta method such as workbench.schemes.RK4()."
        )
    m = subflow_substeps
    positive_int("subflow_substeps", m)
    stages = scheme.stages(len(equation.operators))
    check_stages(stages, len(equation.operators), type(scheme).__name__)
    rk = scheme.inner if subflow_solver is None else subflow_solver
    if equation.is_piecewise_constant:
        if piece is None:
            length = equation.piece_length
            piece = jnp.clip(jnp.floor((t + tau / 2) / length), 0, equation.num_pieces - 1).astype(
                int
            )
        equation = equation.localize(piece)
    substeps = int(m)

    def apply(stages, u, clock, steps):
        # The sub-flows of `stages` left to right, the i-th over `steps[i]`.
        for (k, _), h in zip(stages, steps):
            u = equation.subflow(k, rk, clock, u, h, mask, clock_moves=(k == 0), substeps=substeps)
            if k == 0:
                clock = clock + h
        return u, clock

    if isinstance(scheme, AbstractComposition):
        # A composition of Strang steps S_{γ_s τ} ∘ … ∘ S_{γ_1 τ}: one `lax.scan` over the
        # weights of one Strang step's sub-flows, so its operators are compiled once, not once
        # per weight. Row j of the table holds the substeps γ_j a_i τ, the stages' own.
        base, fractions = scheme.substep_table(len(equation.operators))
        dtype = jnp.result_type(t, tau, u.dtype)
        if isinstance(tau, jax.core.Tracer):
            table = jnp.asarray(fractions, dtype) * tau
        else:  # products in float64, as the unrolled substeps `a * tau` of Python floats
            table = jnp.asarray(fractions * np.asarray(tau, np.float64), dtype)

        def strang(carry, steps):
            return apply(base, *carry, steps), None

        # (A step of a wider dtype than u widens u, as in the unrolled sub-flows.)
        u = u.astype(jnp.result_type(u, table))
        (u, _), _ = jax.lax.scan(strang, (u, jnp.asarray(t, dtype)), table)
        return u
    u, _ = apply(stages, u, t, [a * tau for _, a in stages])
    return u
