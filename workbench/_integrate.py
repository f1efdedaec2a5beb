"""One entry point that solves the Transformer equation: a splitting scheme on a fixed grid, or
any diffrax solver on the continuous equation (fixed or adaptive steps)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._checkpointing import check_checkpointing
from ._checks import positive_int
from ._controls import Constant
from ._equation import Equation
from ._solution import RESULTS, Solution
from ._step import step as scheme_step
from ._types import KeyMask, Tokens
from .schemes._splitting import AbstractSplittingScheme, check_stages
from .terms._mask import check_mask


def _check_num_steps(equation: Equation, num_steps) -> int:
    num_steps = positive_int("num_steps", num_steps, hint="the step is T/num_steps")
    pieces = equation.num_pieces
    if equation.is_piecewise_constant and num_steps % pieces != 0:
        raise ValueError(
            f"num_steps={num_steps} must be a multiple of the number of layers ({pieces}) so that no "
            f"step straddles a jump of the piecewise-constant controls; e.g. {pieces * max(1, round(num_steps / pieces))}. "
            "Use Interpolated controls for an arbitrary grid."
        )
    return num_steps


def check_tokens(u, name: str = "u", d: int | None = None, *, owner: str = "this model") -> None:
    """Trace-time shape check of one sequence `(n, d)`, naming the fix."""
    shape = getattr(u, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(
            f"{name} must be one sequence of shape (n, d); got shape {shape}. "
            "Batch with jax.vmap(model)(batch)."
        )
    if d is not None and shape[1] != d:
        raise ValueError(
            f"{name} has {shape[1]} features; {owner} expects d = {d} (got shape {tuple(shape)})."
        )
    if not jnp.issubdtype(u.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating array; got dtype {u.dtype}.")


def check_dtype(controls, u, name: str = "u0") -> None:
    """Trace-time check that the state's floating dtype is that of the floating arrays of
    `controls` (an `Equation`, a model): no silent promotion.

    The dtypes are compared as JAX uses them: with x64 off a NumPy float64 input is float32.
    """
    want = {
        jax.dtypes.canonicalize_dtype(x.dtype)
        for x in jax.tree.leaves(eqx.filter(controls, eqx.is_inexact_array))
    }
    got = jax.dtypes.canonicalize_dtype(u.dtype)
    if not want or want == {got}:
        return
    names = " and ".join(sorted(str(w) for w in want))
    if len(want) > 1:
        raise ValueError(
            f"the controls (the model's weights) mix the dtypes {names}; give them one dtype "
            "(the loaders take dtype=, e.g. dtype=jnp.float32)."
        )
    (w,) = want
    raise ValueError(
        f"{name} has dtype {got} but the controls (the model's weights) are {w}; the library "
        f"does not promote silently. Cast the input, {name}.astype(jnp.{w}), or load the weights "
        f"with dtype=jnp.{got}."
    )


def integrate(
    equation: Equation,
    u0: Tokens,
    method,
    *,
    num_steps=None,
    stepsize_controller=None,
    formulation=None,
    dt0=None,
    max_steps: int = 4096,
    mask: KeyMask | None = None,
    save_steps: bool = False,
    throw: bool = True,
    u0_name: str = "u0",
    adjoint=None,
    running_cost=None,
) -> Solution:
    r"""Solve `equation` from `u(0) = u0` on `[0, T]` with a splitting scheme or a diffrax solver.

    **Splitting schemes** (`LieTrotter()`, `Strang()`, `Yoshida4()`, ...): `num_steps` uniform
    steps of size `τ = T / num_steps`; each applies the scheme's substeps `(k, a)`: the sub-flow
    of operator `k` over `a τ`, solved by one step of `scheme.inner`. Time-dependent controls are
    handled by the augmented autonomous system: the clock advances only in operator 0's
    substeps. For smooth θ(t) every composition keeps its order. `Interpolated` controls are only
    piecewise linear, with kinks at the layer midpoints (measured on the pre-norm encoder): with
    the kinks on step boundaries (`num_steps` a multiple of twice the layer count) Lie, Strang
    and Suzuki4 keep their orders 1, 2 and 4, but Yoshida4, whose negative middle weight sends
    its clock outside the step (to `t + 1.35τ` and `t − 0.35τ`) across the kinks, converges at
    order 2 (4 with piecewise-constant controls); with kinks inside steps both fourth-order
    compositions converge at order 2. The steps are a `lax.scan`, so compile time does not grow
    with depth. With `LieTrotter()` (explicit Euler sub-flows) and one step per layer this is
    exactly the network: `LN(u + MHA(u))`, … for post-norm, `u + MHA(LN(u))`, … for pre-norm.
    On a post-norm equation every "sub-flow, then project" composition converges at order 1
    only, whatever the scheme's order; the projected ODE keeps a solver's order (a diffrax
    solver with `formulation=Projected()`, below).

    **diffrax solvers** (`diffrax.Tsit5()`, `Dopri8()`, `Heun()`, `Kvaerno5()`, `KenCarp4()`,
    `workbench.solvers.ClassicalRK4()`, ...): the continuous equation chosen by `formulation`
    (`Natural()` for pre-norm, the default; `Projected()` — the projected ODE, the default for
    post-norm — or `Penalty(ε)`), with fixed steps (`num_steps`) or adaptive ones
    (`stepsize_controller=diffrax.PIDController(...)`). Piecewise-constant controls jump at layer
    boundaries: fixed steps restart the solver on every layer (a scan over layers); an adaptive
    solve is one over `[0, T]` with the layer starts declared as jumps
    (`diffrax.ClipStepSizeController(jump_ts=...)`, at the first float of each layer as the
    controls read time), so no step crosses one and the step size carries across. Continuous
    controls (`Interpolated`, `Legendre`) are one solve either way. `stats["num_evaluations"]`
    counts the field evaluations, rejected steps and first-same-as-last restarts included.

    **Arguments:**

    - `equation`: the `Equation`.
    - `u0`: initial tokens `(n, d)`, `d` the equation's width, and the dtype of the controls:
      a float32 `u0` with float64 weights (or the reverse, with x64 on) is a `ValueError`, not a
      silent promotion; cast with `u0.astype(...)`. (With x64 off, JAX's default, float64 arrays
      do not exist: NumPy float64 inputs become float32.)
    - `method`: a splitting scheme or a diffrax solver.
    - `num_steps`: number of uniform steps over `[0, T]`; a multiple of the layer count for
      piecewise-constant controls. May be a traced integer (inside `jax.jit`), so a ladder of
      step counts compiles once; `save_steps` then is not available, and a traced count that is
      not a multiple raises at run time (`throw=True`) or gives `RESULTS.invalid_num_steps`.
      A traced count is a loop of run-time length, forward only (reverse mode cannot
      differentiate it): with an explicit diffrax solver and no `adjoint` it is a plain loop
      over the solver's steps, `diffeqsolve`'s arithmetic with `ConstantStepSize` in a smaller
      program; pass `adjoint=diffrax.RecursiveCheckpointAdjoint()` to differentiate it.
    - `stepsize_controller`: diffrax only: an adaptive controller (instead of `num_steps`).
    - `formulation`: diffrax only: `None` (automatic), `Natural()`, `Projected()`,
      `Penalty(epsilon)`.
    - `dt0`: diffrax only: the initial step of an adaptive solve (`None`: diffrax's choice,
      which for these terms is a fixed 0.01: diffrax 0.7 estimates a first step only for a
      bare `ODETerm`, and `diffeqsolve` wraps its terms; a layer, `equation.piece_length`, is
      the natural first try).
    - `max_steps`: diffrax only: the most steps of one `diffeqsolve`: per layer for fixed steps
      on piecewise-constant controls, over `[0, T]` otherwise (adaptive solves included).
    - `mask`: optional key-padding mask `(n,)`: True (or integer 1) = attend to the token,
      False (or 0) = padding — Hugging Face's `attention_mask` convention, the opposite of torch's
      `src_key_padding_mask` (pass `~mask`). Floating masks, other shapes, integers other than
      0/1 and masks with no real token are rejected (see `workbench.terms._mask.check_mask`; value
      checks run via `eqx.error_if` under `jit`).
    - `save_steps`: splitting only: also return the state after every step.
    - `throw`: raise if the initial state holds NaN/inf or the solve failed (NaN/inf, max steps),
      naming the step (splitting) or layer (diffrax); with `False` the failure is returned in
      `Solution.first_nonfinite_step` and `Solution.stats` (for sweeps under `vmap`). The checks
      are calls back to Python, and JAX's persistent compilation cache keeps no program with
      one: with `False`, a splitting scheme and no traced mask the program holds none.
    - `u0_name`: how error messages call the initial state.
    - `adjoint`: how reverse-mode differentiation stores the solve. Splitting schemes:
      `None`/`NoCheckpointing()` (store everything), `CheckpointEvery(k)` (the state every `k`
      steps, recomputing the blocks) or `BinomialCheckpointing(c)` (`c` checkpoints on the
      binomial schedule); all give the exact gradient of the discrete solve. diffrax solvers:
      a diffrax adjoint, `diffrax.RecursiveCheckpointAdjoint()` (default) or
      `diffrax.BacksolveAdjoint()` (the continuous adjoint, `formulation=Natural()` only).
    - `running_cost`: splitting only: a function `(t, u, tau, u_next) -> scalar`, the
      contribution of the step from `(t, u)` to `(t + tau, u_next)` to a running cost `∫ L dt`,
      summed in the same scan (`Solution.running_cost`); e.g.
      `workbench.control.KineticEnergy(1.0).step_cost`.

    **Returns:** a `Solution`.
    """
    import diffrax

    check_tokens(u0, "u0", equation.width, owner="this equation")
    check_dtype(equation, u0, "u0")
    u0 = jnp.asarray(u0)  # a NumPy float64 input is float32 to JAX when x64 is off
    mask = check_mask(mask, u0.shape[0], name="mask", causal=_is_causal(equation))
    if isinstance(method, diffrax.AbstractSolver):
        from ._integrate_diffrax import integrate_diffrax

        if save_steps:
            raise ValueError(
                "save_steps=True is only available with splitting schemes; with a diffrax solver "
                "integrate layer by layer or call diffrax.diffeqsolve with a SaveAt."
            )
        if running_cost is not None:
            raise ValueError(
                "running_cost= is only available with splitting schemes (it is summed in the "
                "scan of their steps); with a diffrax solver add the cost to the state."
            )
        return integrate_diffrax(
            equation,
            u0,
            method,
            num_steps=num_steps,
            stepsize_controller=stepsize_controller,
            formulation=formulation,
            dt0=dt0,
            max_steps=max_steps,
            mask=mask,
            throw=throw,
            u0_name=u0_name,
            adjoint=adjoint,
        )
    if not isinstance(method, AbstractSplittingScheme):
        raise ValueError(
            f"method={method!r} is neither a splitting scheme nor a diffrax solver; pass e.g. "
            "workbench.schemes.LieTrotter(), Strang(), Yoshida4(), Suzuki4(), or diffrax.Tsit5()."
        )
    for name, value in (
        ("stepsize_controller", stepsize_controller),
        ("formulation", formulation),
        ("dt0", dt0),
    ):
        if value is not None:
            raise ValueError(
                f"{name}= applies to diffrax solvers only; splitting schemes take num_steps=."
            )
    checkpointing = check_checkpointing(adjoint)
    if running_cost is not None and not callable(running_cost):
        raise ValueError(
            f"running_cost={running_cost!r} must be a function (t, u, tau, u_next) -> scalar."
        )
    scheme = method
    stages = scheme.stages(len(equation.operators))
    check_stages(stages, len(equation.operators), type(scheme).__name__)
    per_step = len(stages) * scheme.inner.tableau.num_stages

    def advance(u, t0, tau, piece):
        return scheme_step(equation, scheme, t0, u, tau, mask=mask, piece=piece)

    if isinstance(num_steps, jax.core.Tracer):
        if adjoint is not None:
            raise ValueError(
                "adjoint= needs a static num_steps (a Python int): a solve with a traced step "
                "count is a loop of run-time length, which reverse mode cannot differentiate."
            )
        return _integrate_traced(
            equation, u0, advance, num_steps, per_step, save_steps, throw, u0_name, running_cost
        )
    num_steps = _check_num_steps(equation, num_steps)
    tau = equation.t1 / num_steps
    dtype = u0.dtype
    pieces = np.minimum(
        (np.arange(num_steps) * equation.num_pieces) // num_steps, equation.num_pieces - 1
    )
    t0s = jnp.asarray(np.arange(num_steps) * tau, dtype)

    def step(carry, x):
        u, bad, cost = carry
        t0, piece, i = x
        v = advance(u, t0, tau, piece)
        if running_cost is not None:
            cost = cost + running_cost(t0, u, tau, v)
        bad = jnp.where((bad < 0) & ~jnp.all(jnp.isfinite(v)), i, bad)
        return (v, bad, cost), (v if save_steps else None)

    xs = (t0s, jnp.asarray(pieces), jnp.arange(num_steps))
    init = (u0, jnp.array(-1), jnp.zeros((), dtype))
    (u1, bad, cost), us = checkpointing.scan(step, init, xs, num_steps)
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
    evals = num_steps * per_step
    return Solution(
        u1=u1,
        y=equation.output_map(u1),
        ts=jnp.asarray((np.arange(num_steps) + 1) * tau, dtype) if save_steps else None,
        us=us,
        num_steps=num_steps,
        num_evaluations=evals,
        first_nonfinite_step=bad,
        result=RESULTS.where(bad >= 0, RESULTS.nonfinite_state, RESULTS.successful),
        stats={"num_steps": jnp.asarray(num_steps), "num_evaluations": jnp.asarray(evals)},
        running_cost=None if running_cost is None else cost,
    )


def _is_causal(equation: Equation) -> bool:
    """Whether some term of `equation` is causal attention (a key mask must then keep token 0)."""
    for op in equation.operators:
        term = op.term.value if isinstance(op.term, Constant) else op.term.values
        if getattr(term, "causal", False):
            return True
    return False


def _integrate_traced(
    equation, u0, advance, num_steps, per_step, save_steps, throw, u0_name, running_cost
):
    """Splitting with a run-time step count: a `fori_loop` with a dynamic trip count."""
    if save_steps:
        raise ValueError(
            "save_steps=True needs a static num_steps (a Python int); a traced num_steps gives a "
            "run-time number of states."
        )
    dtype = u0.dtype
    pieces = equation.num_pieces
    num_steps = jnp.asarray(num_steps)
    tau = jnp.asarray(equation.t1, dtype) / num_steps.astype(dtype)

    def body(i, carry):
        u, bad, cost = carry
        piece = jnp.minimum((i * pieces) // num_steps, pieces - 1)
        t0 = i.astype(dtype) * tau
        v = advance(u, t0, tau, piece)
        if running_cost is not None:
            cost = cost + running_cost(t0, u, tau, v)
        bad = jnp.where((bad < 0) & ~jnp.all(jnp.isfinite(v)), i, bad)
        return v, bad, cost

    invalid = (num_steps % pieces != 0) if equation.is_piecewise_constant else jnp.array(False)
    if throw:  # without it, the program calls no Python (JAX's persistent cache keeps it)
        num_steps = eqx.error_if(
            num_steps,
            invalid,
            f"integrate: num_steps must be a multiple of the number of layers ({pieces}).",
        )
    init = (u0, jnp.array(-1, num_steps.dtype), jnp.zeros((), dtype))
    u1, bad, cost = jax.lax.fori_loop(0, num_steps, body, init)
    if throw:
        input_bad = ~jnp.all(jnp.isfinite(u0))
        messages = [
            f"integrate: the initial state {u0_name} contains NaN or inf.",
            "integrate: the state became NaN/inf (pass throw=False and read "
            "Solution.first_nonfinite_step for the step). Check the inputs, or reduce the step.",
        ]
        branch = jnp.where(input_bad, 0, 1)
        u1 = eqx.branched_error_if(u1, input_bad | (bad >= 0), branch, messages)
    return Solution(
        u1=u1,
        y=equation.output_map(u1),
        ts=None,
        us=None,
        num_steps=None,
        num_evaluations=None,
        first_nonfinite_step=bad,
        result=RESULTS.where(
            invalid,
            RESULTS.invalid_num_steps,
            RESULTS.where(bad >= 0, RESULTS.nonfinite_state, RESULTS.successful),
        ),
        stats={"num_steps": num_steps, "num_evaluations": num_steps * per_step},
        running_cost=None if running_cost is None else cost,
    )
