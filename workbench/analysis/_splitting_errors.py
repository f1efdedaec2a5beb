r"""Local and global splitting errors of the Transformer equation, against the exact flow.

`local_errors` measures one step of a splitting scheme from a state against `exact_step` over a
ladder of step sizes τ (the local error is `O(τ^{p+1})` for a scheme of order p, and for Lie–Trotter
`(τ²/2)[A, F](u) + O(τ³)`: see `_splitting.py`); `splitting_flow` and `global_errors` do the same
over a whole layer. The step maps themselves are in `_splitting.py`.
"""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._equation import Equation
from .._integrate import check_tokens
from .._types import KeyMask, Tokens
from ..schemes._runge_kutta import AbstractExplicitRK
from ._splitting import (
    Method,
    _check_equation,
    _check_layer,
    _check_method,
    _check_positive_int,
    _check_subflow_solver,
    _exact_plan,
    _onto_constraint,
    _step,
    _table_plan,
)

__all__ = [
    "local_errors",
    "splitting_flow",
    "global_errors",
]


# --------------------------------------------------------------------------------------------
# Local and global errors
# --------------------------------------------------------------------------------------------


@eqx.filter_jit
def _local(equation, layer, u, taus, plan, reference_plan, mask):
    local = equation.localize(layer)
    u = _onto_constraint(local, u)

    def one(tau):
        return _step(local, u, tau, plan, 0.0, mask) - _step(
            local, u, tau, reference_plan, 0.0, mask
        )

    return jax.vmap(one)(taus)


def local_errors(
    equation: Equation,
    u: Tokens,
    taus: Sequence[float],
    method: Method,
    *,
    layer: int = 0,
    mask: KeyMask | None = None,
    subflow_solver: AbstractExplicitRK | None = None,
    subflow_substeps: int = 1,
    reference_substeps: int = 64,
) -> np.ndarray:
    r"""The local error vectors `Φ_τ(u) − φ_τ(u)` of one step from `u`, for every τ in `taus`.

    Computed on layer `layer` (controls constant), with `φ_τ = exact_step(…, substeps=
    reference_substeps)`. For `PostNorm` `u` is first projected onto `S` (the projected ODE starts
    on `S`). For `LieTrotter` with exact sub-flows the result tends to
    `(τ²/2) vector_field_commutator(equation.localize(layer), u)`.

    **Arguments:**

    - `equation`, `u` `(n, d)`, `taus` (positive steps), `method` (as in `splitting_step`).
    - `layer`: which layer's controls; `mask`: optional key padding mask.
    - `subflow_solver`, `subflow_substeps`: as in `splitting_step` (e.g. `RK4()`, 16 for exact
      sub-flows).
    - `reference_substeps`: RK4 steps of the exact flow per τ.

    **Returns:** a float array `(len(taus), n, d)`.
    """
    _check_equation(equation)
    _check_method(method)
    _check_subflow_solver(subflow_solver)
    m = _check_positive_int(subflow_substeps, "subflow_substeps")
    ref = _check_positive_int(reference_substeps, "reference_substeps")
    layer = _check_layer(equation, layer)
    check_tokens(u, "u")
    taus = _check_taus(taus, "taus")
    num_ops = len(equation.operators)
    plan = _table_plan(method, num_ops, subflow_solver, m)
    out = _local(
        equation,
        jnp.asarray(layer),
        u,
        jnp.asarray(taus, u.dtype),
        plan,
        _exact_plan(num_ops, ref),
        mask,
    )
    return np.asarray(out)


def _check_taus(taus, name: str) -> np.ndarray:
    arr = np.asarray(taus, dtype=np.float64).ravel()
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name}={list(np.ravel(taus))!r} must be a non-empty list of steps > 0.")
    return arr


@eqx.filter_jit
def _flow(equation, u, steps, plan, mask):
    num_layers, length = equation.num_pieces, equation.piece_length
    tau = length / steps.astype(u.dtype)
    u = _onto_constraint(equation, u)

    def layer_body(layer, v):
        local = equation.localize(layer)
        return jax.lax.fori_loop(0, steps, lambda i, w: _step(local, w, tau, plan, 0.0, mask), v)

    return jax.lax.fori_loop(0, num_layers, layer_body, u)


def splitting_flow(
    equation: Equation,
    u0: Tokens,
    method: Method | None,
    steps_per_layer: int,
    *,
    mask: KeyMask | None = None,
    subflow_solver: AbstractExplicitRK | None = None,
    subflow_substeps: int = 1,
) -> Tokens:
    r"""Solve the equation on `[0, T]` with `steps_per_layer` uniform steps in every layer.

    `method=None` is the (nearly) exact flow: `steps_per_layer` RK4 steps per layer (post-norm:
    on the projected ODE). Otherwise steps of `splitting_step`. For `PostNorm`, `u0` is first
    projected onto `S`. The step count is traced, so each method compiles once for every
    step count.

    **Arguments:**

    - `equation` (piecewise-constant controls), `u0` `(n, d)`.
    - `method`: a splitting scheme, an unsplit RK method, or `None` (exact flow).
    - `steps_per_layer`: uniform steps per layer (≥ 1); the step is `piece_length / steps`.
    - `mask`, `subflow_solver`, `subflow_substeps`: as in `splitting_step`.

    **Returns:** `u(T)` (before the output map).
    """
    _check_equation(equation)
    if method is not None:
        _check_method(method)
    _check_subflow_solver(subflow_solver)
    m = _check_positive_int(subflow_substeps, "subflow_substeps")
    k = _check_positive_int(steps_per_layer, "steps_per_layer")
    check_tokens(u0, "u0")
    num_ops = len(equation.operators)
    if method is None:
        return _flow(equation, u0, jnp.asarray(1), _exact_plan(num_ops, k), mask)
    plan = _table_plan(method, num_ops, subflow_solver, m)
    return _flow(equation, u0, jnp.asarray(k), plan, mask)


def global_errors(
    equation: Equation,
    u0: Tokens,
    steps_per_layer: Sequence[int],
    method: Method,
    *,
    mask: KeyMask | None = None,
    subflow_solver: AbstractExplicitRK | None = None,
    subflow_substeps: int = 1,
    reference_steps_per_layer: int = 1024,
    reference: Tokens | None = None,
) -> np.ndarray:
    r"""Global errors `‖u_τ(T) − u(T)‖` (Frobenius) for every entry of `steps_per_layer`.

    The step is `τ = piece_length / steps`; the reference `u(T)` is `splitting_flow(equation, u0, None,
    reference_steps_per_layer)` unless given.

    **Arguments:**

    - `equation`, `u0`, `method`, `mask`, `subflow_solver`, `subflow_substeps`: as in
      `splitting_flow`.
    - `steps_per_layer`: the ladder of step counts per layer.
    - `reference_steps_per_layer`: RK4 steps per layer of the exact flow (error ≈ C/steps⁴).
    - `reference`: a precomputed `u(T)` to compare with (reused across methods).

    **Returns:** a float array `(len(steps_per_layer),)`.
    """
    _check_equation(equation)
    _check_method(method)
    ks = [_check_positive_int(k, "steps_per_layer") for k in np.ravel(steps_per_layer)]
    if not ks:
        raise ValueError("steps_per_layer is empty; give at least one step count.")
    if reference is None:
        reference = splitting_flow(equation, u0, None, reference_steps_per_layer, mask=mask)
    errs = [
        float(
            np.linalg.norm(
                np.asarray(
                    splitting_flow(
                        equation,
                        u0,
                        method,
                        k,
                        mask=mask,
                        subflow_solver=subflow_solver,
                        subflow_substeps=subflow_substeps,
                    )
                )
                - np.asarray(reference)
            )
        )
        for k in ks
    ]
    return np.asarray(errs)
