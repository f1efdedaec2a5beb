"""One entry point that solves the Transformer equation with a splitting scheme on a fixed grid."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._equation import Equation
from ._types import KeyMask, Tokens
from .schemes._splitting import AbstractSplittingScheme, check_stages


class Solution(eqx.Module):
    """The result of `integrate`.

    **Fields:**

    - `u1`: the state at `T` (before the output map).
    - `y`: the output, `output_map(u1)` (the model's final hidden state).
    - `ts`, `us`: step end times and states, when `save_steps=True` (else `None`).
    - `num_steps`, `num_evaluations`: steps taken and term evaluations (vector-field calls).
    - `first_nonfinite_step`: index of the first step whose result held NaN/inf, or −1.
    """

    u1: Tokens
    y: Tokens
    ts: Float[Array, " steps"] | None
    us: Float[Array, "steps n d"] | None
    num_steps: int = eqx.field(static=True)
    num_evaluations: int = eqx.field(static=True)
    first_nonfinite_step: Int[Array, ""]


def _check_num_steps(equation: Equation, num_steps) -> int:
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 1:
        raise ValueError(
            f"num_steps={num_steps!r} must be a positive integer (the step is T/num_steps)."
        )
    num_steps = int(num_steps)
    pieces = equation.num_pieces
    if equation.is_piecewise_constant and num_steps % pieces != 0:
        raise ValueError(
            f"num_steps={num_steps} must be a multiple of the number of layers ({pieces}) so that no "
            f"step straddles a jump of the piecewise-constant controls; e.g. {pieces * max(1, round(num_steps / pieces))}. "
            "Use Interpolated controls for an arbitrary grid."
        )
    return num_steps


def check_tokens(u, name: str = "u", d: int | None = None) -> None:
    """Trace-time shape check of one sequence `(n, d)`, naming the fix."""
    shape = getattr(u, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(
            f"{name} must be one sequence of shape (n, d); got shape {shape}. "
            "Batch with jax.vmap(model)(batch)."
        )
    if d is not None and shape[1] != d:
        raise ValueError(f"{name} has {shape[1]} features; this model expects d = {d}.")
    if not jnp.issubdtype(u.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating array; got dtype {u.dtype}.")


def integrate(
    equation: Equation,
    u0: Tokens,
    scheme: AbstractSplittingScheme,
    *,
    num_steps: int,
    mask: KeyMask | None = None,
    save_steps: bool = False,
    throw: bool = True,
    u0_name: str = "u0",
) -> Solution:
    r"""Solve `equation` from `u(0) = u0` on `[0, T]` with `num_steps` uniform steps of `scheme`.

    Each step of size `τ = T / num_steps` applies the scheme's substeps `(k, a)`: the sub-flow of
    operator `k` over `a τ`, solved by one step of `scheme.inner`. Time-dependent controls are
    handled by the augmented autonomous system: the clock advances only in operator 0's substeps,
    so the composition keeps its order for interpolated controls too. The steps are a `lax.scan`,
    so compile time does not grow with depth.

    **Arguments:**

    - `equation`: the `Equation`.
    - `u0`: initial tokens `(n, d)`.
    - `scheme`: a splitting scheme (`LieTrotter()`, `Strang()`, `Yoshida4()`, ...).
    - `num_steps`: number of steps over `[0, T]`; a multiple of the layer count for
      piecewise-constant controls.
    - `mask`: optional key padding mask `(n,)` (True = real token).
    - `save_steps`: also return the state after every step.
    - `throw`: raise if the initial state holds NaN/inf or a step produced them, naming the step
      and time; with `False` the index is returned in `Solution.first_nonfinite_step` (for
      sweeps under `vmap`).
    - `u0_name`: how error messages call the initial state.

    **Returns:** a `Solution`.

    With `LieTrotter()` (explicit Euler sub-flows) and one step per layer this is exactly the
    network: `LN(u + MHA(u))`, … for post-norm, `u + MHA(LN(u))`, … for pre-norm.
    """
    if not isinstance(scheme, AbstractSplittingScheme):
        raise ValueError(
            f"scheme={scheme!r} is not a splitting scheme; pass e.g. workbench.schemes.LieTrotter(), "
            "Strang(), Yoshida4() or Suzuki4()."
        )
    check_tokens(u0, "u0")
    num_steps = _check_num_steps(equation, num_steps)
    stages = scheme.stages(len(equation.operators))
    check_stages(stages, len(equation.operators), type(scheme).__name__)
    tau = equation.t1 / num_steps
    dtype = u0.dtype
    pieces = np.minimum(
        (np.arange(num_steps) * equation.num_pieces) // num_steps, equation.num_pieces - 1
    )
    t0s = jnp.asarray(np.arange(num_steps) * tau, dtype)
    rk = scheme.inner

    def step(carry, x):
        u, bad = carry
        t0, piece, i = x
        local = equation.localize(piece)
        clock = t0
        for k, a in stages:
            h = a * tau
            u = local.subflow(k, rk, clock, u, h, mask, clock_moves=(k == 0))
            if k == 0:
                clock = clock + h
        bad = jnp.where((bad < 0) & ~jnp.all(jnp.isfinite(u)), i, bad)
        return (u, bad), (u if save_steps else None)

    xs = (t0s, jnp.asarray(pieces), jnp.arange(num_steps))
    (u1, bad), us = jax.lax.scan(step, (u0, jnp.array(-1)), xs)
    if throw:
        # One check (one callback) for the input and every step, so the error says where the
        # solution stopped being finite: branch 0 is the input, branch i + 1 is step i.
        input_bad = ~jnp.all(jnp.isfinite(u0))
        messages = [f"integrate: the initial state {u0_name} contains NaN or inf."] + [
            f"integrate: the state became NaN/inf at step {i} (t = {i * tau:.6g} .. {(i + 1) * tau:.6g}, "
            f"layer {pieces[i]}). Check the inputs for NaN, or reduce the step."
            for i in range(num_steps)
        ]
        branch = jnp.where(input_bad, 0, jnp.maximum(bad, 0) + 1)
        u1 = eqx.branched_error_if(u1, input_bad | (bad >= 0), branch, messages)
    evals = num_steps * len(stages) * rk.tableau.num_stages
    return Solution(
        u1=u1,
        y=equation.output_map(u1),
        ts=jnp.asarray((np.arange(num_steps) + 1) * tau, dtype) if save_steps else None,
        us=us,
        num_steps=num_steps,
        num_evaluations=evals,
        first_nonfinite_step=bad,
    )
