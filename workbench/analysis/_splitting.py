r"""Splitting error of the Transformer equation: sub-flows, exact flows, local and global errors,
and the vector-field commutator that drives the Lie–Trotter error.

For `u_t = A(u) + F(u)` (attention `A`, feed-forward `F`, with constant controls inside one
layer) the Lie–Trotter step applies `A` first, then `F`: `Φ_τ = φ^F_τ ∘ φ^A_τ`. Expanding both
sub-flows to second order,

$$φ^A_τ(u) = u + τA + \tfrac{τ^2}{2}A'A + O(τ^3),\qquad
φ^F_τ(v) = v + τF(v) + \tfrac{τ^2}{2}F'F(v) + O(τ^3),\quad F(v) = F(u) + τF'(u)A(u) + O(τ^2),$$

so `Φ_τ(u) = u + τ(A+F) + τ²(A'A/2 + F'A + F'F/2) + O(τ³)`, while the exact flow of `A + F`
is `u + τ(A+F) + (τ²/2)(A'A + A'F + F'A + F'F) + O(τ³)`. Their difference is

$$Φ_τ(u) − φ^{A+F}_τ(u) = \tfrac{τ^2}{2}\,[A, F](u) + O(τ^3),\qquad
[A, F](u) := F'(u)A(u) − A'(u)F(u),$$

the commutator of the two vector fields (`vector_field_commutator`, two JVPs). Strang's local
error is `O(τ³)` (double commutators), a symmetric fourth-order composition's `O(τ⁵)`.

To see the *splitting* error alone, the sub-flows must be (nearly) exact: `splitting_step` solves
each sub-flow with `subflow_substeps` steps of `subflow_solver` (e.g. 16 RK4 steps), and
`exact_step` is the full flow by many RK4 steps. With `subflow_solver=None` a sub-flow is one
step of the scheme's own inner method: the scheme as a network would run it.

Projection placement. `PreNorm` equations `u_t = Σ G_k(P_k(u))` are smooth: the expansion above
holds with `A = G_0∘P_0`, `F = G_1∘P_1`. With `PostNorm` every sub-flow is followed by the
projection onto one constraint set `S` (all operators must share it), and the continuous limit is
the projected ODE `u_t = P_{T_u S}(A(u) + F(u))` on `S` (docs/equations.md); `exact_step` solves that
ODE (RK4 on the tangent field, projected back onto `S` after every step).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._checks import int_in_range, is_int, positive_int
from .._equation import Equation, PostNorm
from .._integrate import check_tokens
from .._step import step
from .._types import KeyMask, Tokens
from ..schemes._runge_kutta import RK4, AbstractExplicitRK
from ..schemes._splitting import AbstractSplittingScheme

__all__ = [
    "exact_step",
    "operator_fields",
    "splitting_step",
    "vector_field_commutator",
]

Method = AbstractSplittingScheme | AbstractExplicitRK

# --------------------------------------------------------------------------------------------
# Checks (all raised before any compute)
# --------------------------------------------------------------------------------------------


def _check_equation(equation, name: str = "equation") -> None:
    if not isinstance(equation, Equation):
        raise ValueError(f"{name}={equation!r} is not a workbench.Equation (use model.equation).")
    if not equation.is_piecewise_constant:
        raise ValueError(
            f"{name}: the splitting-error analysis needs piecewise-constant controls (a network's "
            "weights, constant inside each layer); got time-dependent (Interpolated) controls."
        )
    if isinstance(equation.placement, PostNorm):
        projs = [op.projection for op in equation.operators]
        if any(p is None for p in projs):
            raise ValueError(
                f"{name}: a PostNorm equation needs a projection on every operator (the projected "
                "ODE lives on one constraint set S); got operators without one."
            )
        first = jax.tree.leaves(projs[0])
        for k, p in enumerate(projs[1:], 1):
            leaves = jax.tree.leaves(p)
            same = len(leaves) == len(first) and all(
                np.shape(a) == np.shape(b) and np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(first, leaves)
            )
            if not same:
                raise ValueError(
                    f"{name}: PostNorm operators 0 and {k} project onto different sets; the "
                    "projected ODE u' = P_T(A + F) needs one set S for all operators (e.g. "
                    "LayerNormProjection.onto_s1(d) on both)."
                )
        for leaf in first:
            arr = np.asarray(leaf)
            if arr.ndim and not np.all(arr == arr[:1]):
                raise ValueError(
                    f"{name}: the PostNorm projection changes from layer to layer; the projected "
                    "ODE needs one constraint set S for all layers (e.g. LayerNormProjection."
                    "onto_s1(d) stacked over the layers)."
                )


def _check_method(method, name: str = "method") -> None:
    if not isinstance(method, (AbstractSplittingScheme, AbstractExplicitRK)):
        raise ValueError(
            f"{name}={method!r} is neither a splitting scheme nor an explicit Runge–Kutta method; "
            "pass e.g. workbench.schemes.LieTrotter(), Strang(), Yoshida4(), Suzuki4() or the "
            "unsplit RK4()."
        )


def _check_positive_int(value, name: str) -> int:
    return positive_int(name, value)


def _check_layer(equation: Equation, layer) -> int:
    n = equation.num_pieces
    return int_in_range("layer", layer, 0, n, hint=f"the equation has {n} layers")


def _check_subflow_solver(solver) -> None:
    if solver is not None and not isinstance(solver, AbstractExplicitRK):
        raise ValueError(
            f"subflow_solver={solver!r} must be None (one step of the scheme's inner method) or "
            "an explicit Runge–Kutta method such as workbench.schemes.RK4()."
        )


# --------------------------------------------------------------------------------------------
# Fields, commutator, steps
# --------------------------------------------------------------------------------------------


def operator_fields(
    equation: Equation, t=0.0, *, mask: KeyMask | None = None
) -> tuple[Callable[[Tokens], Tokens], ...]:
    r"""The per-operator vector fields `u ↦ G_k(u)` at time `t`, as the placement defines them.

    Pre-norm: `G_k(P_k(u))`; post-norm: the unconstrained drift `G_k(u)` (the projection acts
    after each sub-flow). Their sum is `equation.vector_field(t, ·)`.

    **Arguments:**

    - `equation`: an `Equation`.
    - `t`: the time at which the controls are evaluated.
    - `mask`: optional key padding mask `(n,)`.

    **Returns:** a tuple of callables, one per operator (attention first).
    """
    fields = []
    for op in equation.operators:
        term = op.term.evaluate(t)
        proj = None if op.projection is None else op.projection.evaluate(t)
        fields.append(lambda u, term=term, proj=proj: equation.placement.field(term, proj, u, mask))
    return tuple(fields)


def vector_field_commutator(
    equation: Equation,
    u: Tokens,
    *,
    t=0.0,
    mask: KeyMask | None = None,
    first: int = 0,
    second: int = 1,
) -> Tokens:
    r"""The commutator `[A, F](u) = F'(u)A(u) − A'(u)F(u)` of two operators' vector fields.

    With `A = G_first`, `F = G_second` (defaults: attention, feed-forward) as `operator_fields`
    defines them, both directional derivatives by `jax.jvp`. For `LieTrotter` (`A` first, then
    `F`) with exact sub-flows, the local error is `(τ²/2)[A, F](u) + O(τ³)` on a smooth (pre-norm)
    equation. For `PostNorm` this is the commutator of the unconstrained drifts only.

    **Arguments:**

    - `equation`: an `Equation`; `u`: the state `(n, d)`; `t`: the time of the controls.
    - `mask`: optional key padding mask.
    - `first`, `second`: operator indices (distinct).

    **Returns:** `[A, F](u)`, shape `(n, d)`.
    """
    m = len(equation.operators)
    for name, k in (("first", first), ("second", second)):
        if not (is_int(k) and 0 <= k < m):
            raise ValueError(f"{name}={k!r} must be an operator index in [0, {m}).")
    if first == second:
        raise ValueError(
            f"first={first} and second={second} must differ (a field commutes with itself)."
        )
    check_tokens(u, "u")
    return _commutator(equation, u, t, mask, int(first), int(second))


@eqx.filter_jit
def _commutator(equation, u, t, mask, first, second):
    fields = operator_fields(equation, t, mask=mask)
    a_field, f_field = fields[first], fields[second]
    a, f = a_field(u), f_field(u)
    _, fa = jax.jvp(f_field, (u,), (a,))
    _, af = jax.jvp(a_field, (u,), (f,))
    return fa - af


def _post_projection(equation: Equation, t):
    if not isinstance(equation.placement, PostNorm):
        return None
    proj = equation.operators[0].projection
    return None if proj is None else proj.evaluate(t)


def _onto_constraint(equation: Equation, u, t=0.0):
    post = _post_projection(equation, t)
    return u if post is None else post(u)


class _Plan(eqx.Module):
    """A step as data: a padded table of stages `(k, a, substeps)`, applied left to right.

    `k < M`: the sub-flow of operator `k` over `aτ` by `substeps` steps of `rk` (then its
    projection, for post-norm); `k = M`: identity (padding); `k = M + 1`: `substeps` steps of `rk`
    on the full field over `aτ` (post-norm: on the tangent field, projecting after every step).
    The table is traced, so every method written as a table (`_table_plan`) and the exact flow
    share one compiled program per `rk`.
    """

    ks: jax.Array
    fracs: jax.Array
    substeps: jax.Array
    rk: AbstractExplicitRK


_STAGE_BLOCK = 16


def _plan(stages, num_operators: int, rk: AbstractExplicitRK) -> _Plan:
    length = -(-len(stages) // _STAGE_BLOCK) * _STAGE_BLOCK
    pad = [(num_operators, 0.0, 1)] * (length - len(stages))
    ks, fracs, subs = zip(*(list(stages) + pad))
    return _Plan(
        jnp.asarray(np.asarray(ks, np.int32)),
        jnp.asarray(np.asarray(fracs, np.float64)),
        jnp.asarray(np.asarray(subs, np.int32)),
        rk,
    )


class _SchemeStep(eqx.Module):
    """A splitting scheme's own step map (`workbench.step`), with optional accurate sub-flows."""

    scheme: AbstractSplittingScheme
    solver: AbstractExplicitRK | None
    substeps: int = eqx.field(static=True)


def _method_plan(method, num_operators: int, solver, substeps: int) -> "_Plan | _SchemeStep":
    if isinstance(method, AbstractExplicitRK):
        return _plan([(num_operators + 1, 1.0, 1)], num_operators, method)
    return _SchemeStep(method, solver, substeps)


def _table_plan(method, num_operators: int, solver, substeps: int) -> _Plan:
    """`method` as a stage table, for an equation with constant controls (one layer,
    `Equation.localize`), where a splitting step is its sub-flows alone: the stages `(k, a)` of a
    splitting scheme, each solved by `substeps` steps of `solver` (default: of the scheme's
    inner method), as `workbench.step` solves them; an unsplit method is one step of the full
    field. Lie, Strang, the compositions, the unsplit RK4 and the exact flow then compile once
    together (one `rk`), not once per scheme. (With time-dependent controls a splitting step
    also advances the clock between sub-flows: `splitting_step` keeps the scheme's own map.)"""
    if isinstance(method, AbstractExplicitRK):
        return _plan([(num_operators + 1, 1.0, 1)], num_operators, method)
    rk = method.inner if solver is None else solver
    stages = [(k, a, substeps) for k, a in method.stages(num_operators)]
    return _plan(stages, num_operators, rk)


def _exact_plan(num_operators: int, substeps: int) -> _Plan:
    return _plan([(num_operators + 1, 1.0, substeps)], num_operators, RK4())


def _rk_steps(rk: AbstractExplicitRK, field, u, h, substeps, after=None):
    dt = h / substeps.astype(u.dtype)

    def body(i, v):
        v = rk.step(lambda s, w: field(w), 0.0, v, dt)
        return v if after is None else after(v)

    return jax.lax.fori_loop(0, substeps, body, u)


def _step(equation: Equation, u, tau, plan, t, mask):
    if isinstance(plan, _SchemeStep):
        return step(
            equation,
            plan.scheme,
            t,
            u,
            tau,
            mask=mask,
            subflow_solver=plan.solver,
            subflow_substeps=plan.substeps,
        )
    post = _post_projection(equation, t)
    fields = operator_fields(equation, t, mask=mask)
    post_norm = isinstance(equation.placement, PostNorm)
    # Post-norm: each sub-flow ends with its own operator's projection (`PostNorm.subflow`).
    projections = [
        op.projection.evaluate(t) if post_norm and op.projection is not None else None
        for op in equation.operators
    ]

    def subflow(field, proj):
        def branch(v, h, m):
            v = _rk_steps(plan.rk, field, v, h, m)
            return v if proj is None else proj(v)

        return branch

    def full(v, h, m):
        if post is None:
            return _rk_steps(plan.rk, lambda w: equation.vector_field(t, w, mask), v, h, m)
        field = lambda w: post.tangent(w, equation.vector_field(t, w, mask))
        return _rk_steps(plan.rk, field, v, h, m, after=post)

    branches = [subflow(f, p) for f, p in zip(fields, projections)] + [lambda v, h, m: v, full]
    fracs = plan.fracs.astype(u.dtype)

    def body(i, v):
        return jax.lax.switch(plan.ks[i], branches, v, fracs[i] * tau, plan.substeps[i])

    return jax.lax.fori_loop(0, plan.ks.shape[0], body, u)


def splitting_step(
    equation: Equation,
    u: Tokens,
    tau,
    method: Method,
    *,
    t=0.0,
    mask: KeyMask | None = None,
    subflow_solver: AbstractExplicitRK | None = None,
    subflow_substeps: int = 1,
) -> Tokens:
    r"""One step `u ↦ Φ_τ(u)` of a splitting scheme or an unsplit Runge–Kutta method.

    Splitting scheme: its substeps `(k, a)`, each the sub-flow of operator `k` over `aτ` solved by
    `subflow_substeps` steps of `subflow_solver` (default: one step of `method.inner`), followed by
    the projection for `PostNorm`. Unsplit RK: one step of `method` on the full field (pre-norm),
    or on the tangent field `P_{T_u S}(A + F)` followed by the projection (post-norm: a projection
    method for the projected ODE). Controls are evaluated once, at `t` (use a localized equation).

    **Arguments:**

    - `equation`, `u` `(n, d)`, `tau` (the step, may be traced), `method`.
    - `t`: the time of the controls; `mask`: optional key padding mask.
    - `subflow_solver`: `None` or an explicit RK method for the sub-flows.
    - `subflow_substeps`: steps of `subflow_solver` per sub-flow (≥ 1).

    **Returns:** `Φ_τ(u)`.
    """
    _check_method(method)
    _check_subflow_solver(subflow_solver)
    m = _check_positive_int(subflow_substeps, "subflow_substeps")
    plan = _method_plan(method, len(equation.operators), subflow_solver, m)
    return _step(equation, u, tau, plan, t, mask)


def exact_step(
    equation: Equation,
    u: Tokens,
    tau,
    *,
    t=0.0,
    mask: KeyMask | None = None,
    substeps: int = 64,
) -> Tokens:
    r"""The (nearly) exact flow `φ_τ(u)` of the full equation over one step, by `substeps` RK4 steps.

    Pre-norm (or no projections): the flow of `equation.vector_field`. Post-norm: the flow of the
    projected ODE `u_t = P_{T_u S}(Σ G_k(u))` on the common constraint set `S`, by RK4 steps each
    followed by the projection onto `S` (order 4 is kept); `u` must lie on `S`. The error is about
    `C τ⁵ / substeps⁴`.

    **Returns:** `φ_τ(u)`.
    """
    m = _check_positive_int(substeps, "substeps")
    return _step(equation, u, tau, _exact_plan(len(equation.operators), m), t, mask)
