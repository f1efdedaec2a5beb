"""The diffrax path of `integrate`: the continuous equation with any diffrax solver."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from ._checks import positive_float, positive_int
from ._controls import PiecewiseConstant
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


class _WrappingController(diffrax.AbstractAdaptiveStepSizeController):
    """An adaptive controller around another, `controller`, whose tolerances, norm and
    direction it passes through."""

    controller: eqx.AbstractVar[diffrax.AbstractAdaptiveStepSizeController]

    @property
    def rtol(self):
        return self.controller.rtol

    @property
    def atol(self):
        return self.controller.atol

    @property
    def norm(self):  # pyright: ignore[reportIncompatibleMethodOverride]
        return self.controller.norm

    def wrap(self, direction):
        return eqx.tree_at(lambda c: c.controller, self, self.controller.wrap(direction))


class _CountedController(_WrappingController):
    """An adaptive controller that also counts the field evaluations of every step tried.

    diffrax reports steps, not evaluations, and a step's cost depends on more than the step:
    an explicit RK solver of `s` stages evaluates the field `s` times per step tried, accepted
    or rejected; a first-same-as-last (FSAL) one `s − 1`, plus its first stage on the first
    step and on the first step after a declared jump (`made_jump`), again on every retry of
    such a step (a rejected step leaves the solver state, with its flag, as it was). So the
    count is kept here, in the one state that survives rejected steps: `fresh` is that flag
    (diffrax's `first_step | made_jump`), `count` the evaluations so far. Choosing the first
    step (`dt0=None`) evaluates nothing: diffrax's guess needs a bare `ODETerm`, and
    `diffeqsolve` hands its controller wrapped terms, so it starts from a fixed 0.01. Under
    `vmap` the count is each example's own: diffrax evaluates a first stage for the whole
    batch when one example needs it, which costs time but changes no example's numbers."""

    controller: diffrax.AbstractAdaptiveStepSizeController
    stages: int = eqx.field(static=True)
    fsal: bool = eqx.field(static=True)

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        t1, inner = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return t1, (inner, jnp.array(True), jnp.array(0))

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, state):
        inner, fresh, count = state
        keep, next_t0, next_t1, made_jump, inner, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, inner
        )
        if self.fsal:
            count = count + (self.stages - 1) + fresh.astype(count.dtype)
            fresh = jnp.where(keep, made_jump, fresh)
        else:
            count = count + self.stages
        return keep, next_t0, next_t1, made_jump, (inner, fresh, count), result


class _StepAcrossJumps(_WrappingController):
    """An adaptive controller whose proposal survives a step shortened to reach a jump.

    `ClipStepSizeController` shortens a step that would cross a jump so that it ends just
    below it, and the controller inside scales its next step from that short step, by at most
    `factormax` (10 for diffrax's PID): a step cut to a hundredth of its proposal leaves the
    first step of the next layer a tenth of it, whatever the error estimates said. Placed
    inside the clip, this wrapper lets an accepted step that ended before the end it proposed
    keep at least the proposed length for the next step (OrdinaryDiffEq.jl restores its step
    after a `tstop` alike); a rejected step shrinks as usual."""

    controller: diffrax.AbstractAdaptiveStepSizeController

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        t1, inner = self.controller.init(terms, t0, t1, y0, dt0, args, func, error_order)
        return t1, (inner, t1, t1 - t0)

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, state):
        inner, proposed_end, proposed = state
        keep, next_t0, next_t1, made_jump, inner, result = self.controller.adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, inner
        )
        # Shortened: the step ended before the end this controller gave it (compared as
        # times, not as lengths, which round).
        shortened = keep & (t1 < proposed_end)
        step = jnp.where(shortened, jnp.maximum(next_t1 - next_t0, proposed), next_t1 - next_t0)
        next_t1 = jnp.where(shortened, next_t0 + step, next_t1)
        return keep, next_t0, next_t1, made_jump, (inner, next_t1, step), result


def _index_control(equation: Equation) -> PiecewiseConstant | None:
    """A `PiecewiseConstant` control of `equation` (all share the layers), or None."""
    for control in equation._controls():
        if isinstance(control, PiecewiseConstant):
            return control
    return None


def layer_starts(control: PiecewiseConstant, dtype) -> jax.Array:
    r"""The first float (in `dtype`) of each layer `l = 1, …, L − 1` as `control` reads time:
    the smallest `t` with `control.piece_index(t) == l`.

    These are the jumps declared to diffrax's `ClipStepSizeController`, which ends the step
    before a jump on the float just below it and starts the next on the float just above it,
    the jump itself never evaluated. Every stage time of a step lies in the step, and
    `piece_index` is monotone in `t`, so with the jump on the first float of layer `l` the
    stages before it read layer `l − 1` and those after it layer `l`. The rounded boundary
    `fl(l h)` need not be that float: `⌊fl(t / h)⌋` can reach `l` a float before or after it
    when `h` is not a power of two, and a step ending a float below `fl(l h)` would then meet
    layer `l`'s weights in its last stage. The first float is found among the nine floats
    around `fl(l h)`, in the same arithmetic as `piece_index` (the program that evaluates the
    controls)."""
    num = control.num_pieces
    boundary = jnp.arange(1, num, dtype=dtype) * jnp.asarray(control.piece_length, dtype)
    below, above = [boundary], [boundary]
    for _ in range(4):
        below.append(jnp.nextafter(below[-1], jnp.asarray(-jnp.inf, dtype)))
        above.append(jnp.nextafter(above[-1], jnp.asarray(jnp.inf, dtype)))
    candidates = jnp.stack(below[:0:-1] + above, axis=1)  # (L − 1, 9), increasing
    layer = jnp.arange(1, num)[:, None]
    reached = control.piece_index(candidates) >= layer
    first = jnp.take_along_axis(candidates, jnp.argmax(reached, axis=1)[:, None], axis=1)[:, 0]
    return jnp.where(jnp.any(reached, axis=1), first, boundary)


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
    jumps,
    pieces,
    length,
    save_step_times=False,
):
    """The solve proper, jitted with the equation, solver and options as arguments (not
    closures), so repeated calls with the same structures reuse one compilation.

    `restart`: one `diffeqsolve` per layer (a scan over `pieces` layers, each with its own
    controls); otherwise one over `[0, T]` (`pieces == 1`), and with `jumps` the layer starts
    are declared to the step-size controller (`ClipStepSizeController(jump_ts=...)`). An
    adaptive controller of an explicit RK solver is wrapped in `_CountedController`, which
    counts the evaluations. Returns `(u1, stats, codes, reached, step_times)`: per piece the
    steps (all, accepted, rejected) and evaluations (`-1`: not counted here), the result code
    and the time the solve reached (`t1` on success), and the accepted steps' end times of a
    one-piece solve padded with `inf` to `max_steps` (when `save_step_times`, else None)."""
    dtype = u0.dtype
    imex = _is_imex(solver)
    runner = formulation.solver(equation, solver)
    u_start = formulation.initial(equation, u0)
    adaptive = isinstance(controller, diffrax.AbstractAdaptiveStepSizeController)
    if adaptive and jumps:
        starts = layer_starts(_index_control(equation), dtype)
        controller = diffrax.ClipStepSizeController(_StepAcrossJumps(controller), jump_ts=starts)
    per_step = _evaluations_per_step(solver)
    counted = adaptive and per_step is not None
    if counted:
        stages, restart_cost = per_step
        controller = _CountedController(controller, stages + restart_cost, restart_cost == 1)
    subs = diffrax.SubSaveAt(t1=True)
    if save_step_times:
        subs = (subs, diffrax.SubSaveAt(steps=True, fn=lambda t, y, args: t))
    saveat = diffrax.SaveAt(subs=subs, controller_state=counted)

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
            saveat=saveat,
            max_steps=max_steps,
            throw=False,
            args=(local, mask),
            **({} if adjoint is None else {"adjoint": adjoint}),
        )
        ts, ys = (sol.ts[0], sol.ys[0]) if save_step_times else (sol.ts, sol.ys)
        num_steps = sol.stats["num_steps"]
        evaluations = sol.controller_state[2] if counted else jnp.full_like(num_steps, -1)
        stats = jnp.stack(
            [
                num_steps,
                sol.stats["num_accepted_steps"],
                sol.stats["num_rejected_steps"],
                evaluations.astype(num_steps.dtype),
            ]
        )
        times = sol.ts[1] if save_step_times else None
        return ys[-1], (stats, _result(sol.result), ts[-1], times)

    u1, (stats, codes, reached, times) = jax.lax.scan(solve_piece, u_start, jnp.arange(pieces))
    return u1, stats, codes, reached, None if times is None else times[0]


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
    save_step_times: bool = False,
):
    """See `workbench.integrate` (the diffrax path). `save_step_times` (an adaptive solve
    over `[0, T]` only): `Solution.ts` holds the accepted steps' end times, padded with `inf` to
    `max_steps` entries (diffrax's `SaveAt(steps=True)`)."""
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

    # Piecewise-constant controls jump at layer boundaries. Fixed steps restart the solver on
    # every layer (a scan over layers): a step never straddles a jump, and one step per layer
    # is the layer's own step. An adaptive solve is one `diffeqsolve` over [0, T] with the
    # layer starts declared as jumps: the controller steps up to each and restarts the FSAL
    # stage after it, and carries its step size across (a restart per layer would try `dt0`
    # again on every layer). Continuous controls are solved in one go either way.
    piecewise = equation.is_piecewise_constant and equation.num_pieces > 1
    declared = piecewise and not fixed and _index_control(equation) is not None
    restart = piecewise and not declared
    pieces = equation.num_pieces if restart else 1
    length = equation.piece_length if restart else equation.t1
    dtype = u0.dtype
    traced = isinstance(num_steps, jax.core.Tracer)
    if save_step_times and (fixed or restart):
        raise ValueError(
            "save_step_times=True needs an adaptive solve over [0, T] (the step times of a "
            "fixed-step solve are its uniform grid)."
        )
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

    times = None
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
        failed_at = None
        if throw:
            u1 = eqx.error_if(
                u1,
                invalid,
                f"integrate: num_steps must be a multiple of the number of layers ({pieces}).",
            )
    else:
        u1, stats, codes, reached, times = _solve_pieces(
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
            jumps=declared,
            pieces=pieces,
            length=length,
            save_step_times=save_step_times,
        )
        first_bad = None
        # A solve over [0, T] names the layer (piece) of the time it reached.
        failed_at = None if restart else _piece_at(equation, reached[0], declared)
    totals = stats.sum(axis=0)
    failed = codes != RESULTS.successful
    if failed_at is None:
        first_failed = jnp.where(jnp.any(failed), jnp.argmax(failed), -1)
    else:
        first_failed = jnp.where(failed[0], failed_at, -1)
    nonfinite = ~jnp.all(jnp.isfinite(u1))
    if throw:
        input_bad = ~jnp.all(jnp.isfinite(u0))
        solve = "the diffrax solve" + ("" if restart else f" over t in [0, {equation.t1:.6g}]")
        unit = "layer" if equation.is_piecewise_constant else "piece"
        h = equation.piece_length
        messages = [f"integrate: the initial state {u0_name} contains NaN or inf."] + [
            f"integrate({type(solver).__name__}): {solve} failed on {unit} {i} (t in "
            f"[{i * h:.6g}, {(i + 1) * h:.6g}]): max_steps={max_steps} reached, a NaN/inf, or "
            "a failed implicit solve. Raise max_steps, loosen the tolerances, or pass "
            "throw=False and read Solution.result / Solution.stats."
            for i in range(equation.num_pieces)
        ]
        branch = jnp.where(input_bad, 0, jnp.maximum(first_failed, 0) + 1)
        u1 = eqx.branched_error_if(
            u1, input_bad | (first_failed >= 0) | nonfinite, branch, messages
        )
    per_step = _evaluations_per_step(solver)
    steps = totals[0]
    if fixed and per_step is not None:
        evaluations = steps * per_step[0] + pieces * per_step[1]
    else:  # counted during the solve (-1: not an explicit RK solver)
        evaluations = totals[3] if per_step is not None else jnp.asarray(-1, steps.dtype)
    at_failure = jax.tree.map(lambda v: v[jnp.argmax(failed)], codes)
    result = RESULTS.where(
        first_failed >= 0,
        at_failure,
        RESULTS.where(nonfinite, RESULTS.nonfinite_state, RESULTS.successful),
    )
    return Solution(
        u1=u1,
        y=equation.output_map(u1),
        ts=times,
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


def _piece_at(equation: Equation, t, declared: bool):
    """The piece (layer) of `equation` at time `t`: as its piecewise-constant controls read
    time when their jumps were declared, else `⌊t / h⌋` clipped."""
    if declared:
        return _index_control(equation).piece_index(t)
    h = jnp.asarray(equation.piece_length, t.dtype)
    return jnp.clip(jnp.floor(t / h), 0, equation.num_pieces - 1).astype(int)


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
