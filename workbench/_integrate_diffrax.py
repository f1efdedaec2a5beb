"""The diffrax path of `integrate`: the continuous equation with any diffrax solver."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from ._checks import positive_float, positive_int
from ._equation import Equation
from ._formulations import AbstractFormulation, Natural, default_formulation
from ._solution import RESULTS, Solution
from .solvers._projected import ProjectedSolver
from .solvers._rk4 import ClassicalRK4


def _is_imex(solver) -> bool:
    structure = solver.term_structure
    return structure is diffrax.MultiTerm or getattr(structure, "__origin__", None) is (
        diffrax.MultiTerm
    )


def _unwrap(solver):
    while isinstance(solver, diffrax.AbstractWrappedSolver):
        solver = solver.solver
    return solver


def _has_error_estimate(solver) -> bool:
    inner = _unwrap(solver)
    if isinstance(inner, ClassicalRK4) or not isinstance(inner, diffrax.AbstractAdaptiveSolver):
        return False
    return True


def _is_explicit(solver) -> bool:
    """Explicit Runge–Kutta or Euler: a step that `_fixed_steps_forward` can loop over as it is
    (an implicit solver's root finder needs `diffeqsolve`'s tolerances)."""
    return isinstance(_unwrap(solver), (diffrax.AbstractERK, diffrax.Euler))


def _evaluations_per_step(solver):
    """(per step, per restart) vector-field evaluations of an explicit RK solver, or None."""
    inner = _unwrap(solver)
    if isinstance(inner, diffrax.Euler):
        return 1, 0
    tableau = getattr(inner, "tableau", None)
    if isinstance(inner, diffrax.AbstractERK) and isinstance(tableau, diffrax.ButcherTableau):
        s = tableau.num_stages
        # First same as last: the last stage is the next step's first (computed once at the start).
        return (s - 1, 1) if tableau.fsal else (s, 0)
    return None


def check_solver(solver, formulation: AbstractFormulation, stepsize_controller) -> None:
    """Structural checks (trace time): the solver can take this term structure and controller."""
    if isinstance(solver, ProjectedSolver):
        raise ValueError(
            "pass the bare diffrax solver; formulation=Projected() wraps it in ProjectedSolver."
        )
    imex = _is_imex(solver)
    if imex and not formulation.has_stiff_part:
        raise ValueError(
            f"{type(solver).__name__} is an IMEX solver (explicit + implicit terms), but "
            f"formulation={type(formulation).__name__}() has no stiff part to treat implicitly; "
            "use Penalty(epsilon) with a post-norm equation, or an explicit solver such as "
            "diffrax.Tsit5()."
        )
    if isinstance(solver, diffrax.AbstractSRK):
        raise ValueError(
            f"{type(solver).__name__} is a stochastic (SDE) solver; the Transformer equation is "
            "an ODE: use an ODE solver (diffrax.Tsit5(), Dopri5(), Kvaerno5(), ...)."
        )
    adaptive = not isinstance(stepsize_controller, diffrax.ConstantStepSize)
    if adaptive and not _has_error_estimate(solver):
        raise ValueError(
            f"{type(solver).__name__} has no error estimate, so it cannot adapt its step; pass "
            "num_steps= (fixed steps), or an adaptive solver (diffrax.Tsit5(), Dopri5(), "
            "Bosh3(), Kvaerno5(), ...)."
        )


@eqx.filter_jit
def _solve_pieces(
    equation,
    u0,
    solver,
    formulation,
    controller,
    step,
    mask,
    adjoint,
    *,
    max_steps,
    restart,
    pieces,
    length,
):
    """The solve proper, jitted with the equation, solver and options as arguments (not
    closures), so repeated calls with the same structures reuse one compilation."""
    dtype = u0.dtype
    imex = _is_imex(solver)
    runner = formulation.solver(equation, solver)
    u_start = formulation.initial(equation, u0)

    def solve_piece(u, piece):
        local = equation.localize(piece) if restart else equation
        t0 = jnp.asarray(piece, dtype) * jnp.asarray(length, dtype)
        sol = diffrax.diffeqsolve(
            formulation.terms(local, mask, imex=imex),
            runner,
            t0,
            t0 + jnp.asarray(length, dtype),
            step,
            u,
            stepsize_controller=controller,
            saveat=diffrax.SaveAt(t1=True),
            max_steps=max_steps,
            throw=False,
            args=(local, mask),
            **({} if adjoint is None else {"adjoint": adjoint}),
        )
        stats = jnp.stack(
            [
                sol.stats["num_steps"],
                sol.stats["num_accepted_steps"],
                sol.stats["num_rejected_steps"],
            ]
        )
        return sol.ys[-1], (stats, _result(sol.result))

    u1, (stats, codes) = jax.lax.scan(solve_piece, u_start, jnp.arange(pieces))
    return u1, stats, codes


@eqx.filter_jit
def _fixed_steps_forward(
    equation, u0, solver, formulation, num_steps, mask, *, max_steps, restart, pieces, length
):
    """A fixed-step solve with a run-time step count by an explicit solver, forward only.

    Each layer's steps are one `lax.fori_loop` over the solver's own `init` and `step`, at the
    times `ConstantStepSize` gives them (`t0 + (t1 - t0) · i / k`, the first at `t0 + dt0`, the
    last at `t1`), so the arithmetic is `diffeqsolve`'s with `ConstantStepSize`, bit for bit.
    It replaces `diffeqsolve`'s checkpointed while loop, which reverse mode needs and a forward
    solve does not, by a plain loop: a program about half the size to compile, with no call
    back to Python (diffeqsolve checks the sign of a traced time span with one), so JAX's
    persistent cache keeps it. A step that reports a failure (explicit steps do not) freezes
    the layer's state and records its result. Returns `(u1, stats, codes,
    first_bad_piece, invalid)`: `_solve_pieces`'s three, the first layer that ended non-finite
    (-1: none), and whether the step count is not a multiple of the layer count."""
    dtype = u0.dtype
    imex = _is_imex(solver)
    runner = formulation.solver(equation, solver)
    num_steps = jnp.asarray(num_steps)
    invalid = (num_steps % pieces != 0) if restart else jnp.array(False)
    per_piece = num_steps // pieces
    taken = jnp.minimum(per_piece, max_steps)
    span = jnp.asarray(length, dtype)
    dt0 = span / per_piece.astype(dtype)
    fraction = lambda i: i.astype(dtype) / per_piece.astype(dtype)

    def solve_piece(u, piece):
        local = equation.localize(piece) if restart else equation
        terms = formulation.terms(local, mask, imex=imex)
        args = (local, mask)
        t0 = jnp.asarray(piece, dtype) * span
        t1 = t0 + span

        def end_of(i):  # the end of step i (0-based), as ConstantStepSize places it
            t = jnp.where(i == 0, t0 + dt0, t0 + (t1 - t0) * fraction(i + 1))
            return jnp.where(i + 1 == per_piece, t1, t)

        def body(i, carry):
            u, state, code = carry
            ta = jnp.where(i == 0, t0, end_of(i - 1))
            v, _, _, next_state, result = runner.step(terms, ta, end_of(i), u, args, state, False)
            ok = (code == RESULTS.successful) & (result == diffrax.RESULTS.successful)
            code = RESULTS.where(code == RESULTS.successful, _result(result), code)
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
            return keep(v, u), keep(next_state, state), code

        state = runner.init(terms, t0, end_of(jnp.asarray(0)), u, args)
        code = RESULTS.where(per_piece > max_steps, RESULTS.max_steps_reached, RESULTS.successful)
        u, _, code = jax.lax.fori_loop(0, taken, body, (u, state, code))
        code = RESULTS.where(invalid, RESULTS.invalid_num_steps, code)
        stats = jnp.stack([taken, taken, jnp.zeros_like(taken)])
        return u, (stats, code, ~jnp.all(jnp.isfinite(u)))

    u1, (stats, codes, bad) = jax.lax.scan(
        solve_piece, formulation.initial(equation, u0), jnp.arange(pieces)
    )
    first_bad = jnp.where(jnp.any(bad), jnp.argmax(bad), -1)
    return u1, stats, codes, first_bad, invalid


def integrate_diffrax(
    equation: Equation,
    u0,
    solver,
    *,
    num_steps,
    stepsize_controller,
    formulation,
    dt0,
    max_steps: int,
    mask,
    throw: bool,
    u0_name: str,
    adjoint=None,
):
    """See `workbench.integrate` (the diffrax path)."""
    if adjoint is not None and not isinstance(adjoint, diffrax.AbstractAdjoint):
        raise ValueError(
            f"adjoint={adjoint!r} does not apply to a diffrax solver; pass a diffrax adjoint: "
            "diffrax.RecursiveCheckpointAdjoint() (the default, the exact gradient of the "
            "discrete solve) or diffrax.BacksolveAdjoint() (the continuous adjoint). The "
            "checkpointing options of workbench go with splitting schemes."
        )
    if formulation is None:
        formulation = default_formulation(equation)
    if not isinstance(formulation, AbstractFormulation):
        raise ValueError(
            f"formulation={formulation!r} is not a formulation; pass None (automatic), "
            "Natural(), Projected() or Penalty(epsilon)."
        )
    formulation.check(equation)
    if isinstance(adjoint, diffrax.BacksolveAdjoint) and not isinstance(formulation, Natural):
        raise ValueError(
            f"adjoint=diffrax.BacksolveAdjoint() needs formulation=Natural() (a pre-norm "
            f"equation); the {type(formulation).__name__}() formulation maps every step back "
            "onto its constraint set, which the continuous adjoint does not see. Use "
            "diffrax.RecursiveCheckpointAdjoint() (the default) for post-norm equations."
        )
    positive_int("max_steps", max_steps)
    fixed = num_steps is not None
    if fixed and stepsize_controller is not None:
        raise ValueError(
            "pass either num_steps= (fixed steps) or stepsize_controller= (adaptive), not both."
        )
    if not fixed and stepsize_controller is None:
        raise ValueError(
            f"{type(solver).__name__}: pass num_steps= (fixed steps) or an adaptive "
            "stepsize_controller=diffrax.PIDController(rtol=..., atol=...)."
        )
    controller = diffrax.ConstantStepSize() if fixed else stepsize_controller
    if not isinstance(controller, diffrax.AbstractStepSizeController):
        raise ValueError(
            f"stepsize_controller={controller!r} is not a diffrax step-size controller; pass e.g. "
            "diffrax.PIDController(rtol=1e-8, atol=1e-8)."
        )
    if isinstance(controller, diffrax.PIDController):
        for name in ("rtol", "atol"):
            value = getattr(controller, name)
            if not isinstance(value, jax.core.Tracer):
                positive_float(
                    f"stepsize_controller.{name}",
                    value,
                    finite=False,
                    arrays=True,
                    hint="a tolerance",
                )
    check_solver(solver, formulation, controller)

    # Piecewise-constant controls jump at layer boundaries: restart the solver on every layer
    # (a scan over layers); continuous controls are solved in one go.
    restart = equation.is_piecewise_constant
    pieces = equation.num_pieces if restart else 1
    length = equation.piece_length if restart else equation.t1
    dtype = u0.dtype
    traced = isinstance(num_steps, jax.core.Tracer)
    if fixed:
        if not traced:
            positive_int("num_steps", num_steps)
            if num_steps % pieces:
                raise ValueError(
                    f"num_steps={num_steps} must be a multiple of the number of layers ({pieces}) "
                    "so that no step straddles a jump of the piecewise-constant controls."
                )
            if num_steps // pieces > max_steps:
                raise ValueError(
                    f"num_steps={num_steps} gives {num_steps // pieces} steps per layer > "
                    f"max_steps={max_steps}; raise max_steps."
                )
        per_piece = num_steps // pieces
        step = jnp.asarray(length, dtype) / jnp.asarray(per_piece, dtype)
    else:
        step = None if dt0 is None else jnp.asarray(dt0, dtype)

    if fixed and traced and adjoint is None and _is_explicit(solver):
        u1, stats, codes, first_bad, invalid = _fixed_steps_forward(
            equation,
            u0,
            solver,
            formulation,
            num_steps,
            mask,
            max_steps=max_steps,
            restart=restart,
            pieces=pieces,
            length=length,
        )
        if throw:
            u1 = eqx.error_if(
                u1,
                invalid,
                f"integrate: num_steps must be a multiple of the number of layers ({pieces}).",
            )
    else:
        u1, stats, codes = _solve_pieces(
            equation,
            u0,
            solver,
            formulation,
            controller,
            step,
            mask,
            adjoint,
            max_steps=max_steps,
            restart=restart,
            pieces=pieces,
            length=length,
        )
        first_bad = None
    totals = stats.sum(axis=0)
    failed = codes != RESULTS.successful
    first_failed = jnp.where(jnp.any(failed), jnp.argmax(failed), -1)
    nonfinite = ~jnp.all(jnp.isfinite(u1))
    if throw:
        input_bad = ~jnp.all(jnp.isfinite(u0))
        where = "layer" if restart else "solve"
        messages = [f"integrate: the initial state {u0_name} contains NaN or inf."] + [
            f"integrate({type(solver).__name__}): the diffrax solve failed on {where} {i} "
            f"(t in [{i * length:.6g}, {(i + 1) * length:.6g}]): max_steps={max_steps} reached, "
            "a NaN/inf, or a failed implicit solve. Raise max_steps, loosen the tolerances, or "
            "pass throw=False and read Solution.result / Solution.stats."
            for i in range(pieces)
        ]
        branch = jnp.where(input_bad, 0, jnp.maximum(first_failed, 0) + 1)
        u1 = eqx.branched_error_if(
            u1, input_bad | (first_failed >= 0) | nonfinite, branch, messages
        )
    per_step = _evaluations_per_step(solver)
    steps = totals[0]
    if per_step is None:
        evaluations = jnp.asarray(-1, steps.dtype)
    else:
        evaluations = steps * per_step[0] + pieces * per_step[1]
    at_failure = jax.tree.map(lambda v: v[jnp.maximum(first_failed, 0)], codes)
    result = RESULTS.where(
        first_failed >= 0,
        at_failure,
        RESULTS.where(nonfinite, RESULTS.nonfinite_state, RESULTS.successful),
    )
    return Solution(
        u1=u1,
        y=equation.output_map(u1),
        ts=None,
        us=None,
        num_steps=None,
        num_evaluations=None,
        first_nonfinite_step=jnp.where(
            nonfinite, first_failed if first_bad is None else first_bad, -1
        ),
        result=result,
        stats={
            "num_steps": steps,
            "num_accepted_steps": totals[1],
            "num_rejected_steps": totals[2],
            "num_evaluations": evaluations,
            "failed_piece": first_failed,
        },
    )


def _result(diffrax_result) -> RESULTS:
    """A diffrax result as a workbench `RESULTS` item."""
    return RESULTS.where(
        diffrax_result == diffrax.RESULTS.successful,
        RESULTS.successful,
        RESULTS.where(
            diffrax_result == diffrax.RESULTS.max_steps_reached,
            RESULTS.max_steps_reached,
            RESULTS.solver_failed,
        ),
    )
