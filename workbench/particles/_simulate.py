"""One entry point that runs a particle dynamics on the sphere with a fixed-step integrator."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import positive_float, positive_int
from .._types import Tokens
from ._dynamics import AbstractDynamics
from ._integrators import AbstractSphereIntegrator, ProjectedEuler

_GRID_RTOL = 1e-9


def _is_traced(value) -> bool:
    return isinstance(value, jax.core.Tracer)


def _sphere_tolerance(dtype) -> float:
    # float64: 1e-6, float32: 1e-4, half precision: 1e-2.
    return {8: 1e-6, 4: 1e-4}.get(jnp.dtype(dtype).itemsize, 1e-2)


def _check_points(x0) -> None:
    shape = getattr(x0, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(
            f"simulate: x0 must be one configuration of shape (n, d); got shape {shape}. "
            "Batch starts with jax.vmap(lambda x: simulate(dyn, x, ...))(x0s)."
        )
    n, d = shape
    if n < 2:
        raise ValueError(
            f"simulate: x0 has n = {n} particle(s); an interacting system needs n >= 2."
        )
    if d < 2:
        raise ValueError(
            f"simulate: x0 has d = {d} feature(s); the sphere S^(d-1) needs d >= 2 "
            "(S^0 = {-1, 1} has no tangent space)."
        )
    if not jnp.issubdtype(x0.dtype, jnp.floating):
        raise ValueError(f"simulate: x0 must be a floating array; got dtype {x0.dtype}.")


def _check_on_sphere(x0):
    tol = _sphere_tolerance(x0.dtype)
    message = (
        f"simulate: the rows of x0 must be unit vectors (| ‖x_i‖ − 1 | <= {tol:g} for {x0.dtype}); "
        "normalize the start, e.g. x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)."
    )
    if _is_traced(x0):
        dev = jnp.max(jnp.abs(jnp.linalg.norm(x0, axis=-1) - 1.0))
        return eqx.error_if(x0, ~(dev <= tol), message)
    norms = np.linalg.norm(np.asarray(x0, dtype=np.float64), axis=-1)
    dev = np.abs(norms - 1.0)
    if not np.all(dev <= tol):
        worst = int(np.argmax(np.where(np.isfinite(dev), dev, np.inf)))
        raise ValueError(f"{message} Row {worst} has norm {norms[worst]!r}.")
    return jnp.asarray(x0)


def _check_num_steps(num_steps) -> int:
    return positive_int("num_steps", num_steps, owner="simulate", allow_zero=True)


def _grid_index(t: float, dt: float, what: str) -> int:
    k = round(t / dt)
    if abs(t - k * dt) > _GRID_RTOL * max(abs(t), dt):
        lo, hi = math.floor(t / dt) * dt, math.ceil(t / dt) * dt
        raise ValueError(
            f"simulate: {what} = {t!r} is not a multiple of dt = {dt!r} (within {_GRID_RTOL:g} "
            f"relative); the nearest grid times are {lo!r} and {hi!r}."
        )
    return int(k)


def _time_grid(dt, t1, num_steps, save_ts, dtype):
    """Resolve the step, the number of steps and the saved step indices (trace-time checks).

    Returns `(dt, total, save_index, checks)`: `dt` a Python float (concrete) or an array of the
    state's dtype (traced), `save_index` an int array or `None`, and `checks` the (predicate,
    message) pairs that can only be decided at run time.
    """
    if num_steps is not None:
        num_steps = _check_num_steps(num_steps)
    checks = []  # (bad predicate, message) pairs for traced values, raised with eqx.error_if
    if _is_traced(dt):
        if jnp.ndim(dt) != 0:
            raise ValueError(f"simulate: dt must be a scalar; got shape {jnp.shape(dt)}.")
        if num_steps is None:
            raise ValueError(
                "simulate: dt is traced (e.g. under jax.vmap over step sizes), so the number of "
                "steps cannot be derived from t1 / dt; pass num_steps=N (then t1 = N * dt)."
            )
        if save_ts is not None:
            raise ValueError(
                "simulate: save_ts needs a concrete dt to place the times on the grid; with a "
                "traced dt pass save_ts=None (the final state at t1 = num_steps * dt)."
            )
        dt = jnp.asarray(dt).astype(dtype)
        checks.append((~(dt > 0) | ~jnp.isfinite(dt), "simulate: dt must be finite and > 0."))
        if t1 is not None:
            checks.append(
                (
                    jnp.abs(num_steps * dt - t1) > _GRID_RTOL * jnp.maximum(jnp.abs(t1), dt),
                    "simulate: t1 differs from num_steps * dt.",
                )
            )
        total = num_steps
    else:
        dt = positive_float("dt", dt, owner="simulate", arrays=True)
        if t1 is None and num_steps is None:
            raise ValueError("simulate: pass the final time t1 (or num_steps).")
        if t1 is not None:
            if _is_traced(t1):
                raise ValueError(
                    "simulate: t1 is traced, so the number of steps cannot be derived from it; "
                    "pass a Python float t1, or num_steps=N with t1=None."
                )
            t1 = positive_float("t1", t1, owner="simulate", allow_zero=True, arrays=True)
            k1 = _grid_index(t1, dt, "t1")
            if num_steps is not None and num_steps != k1:
                raise ValueError(
                    f"simulate: t1={t1!r} and num_steps={num_steps} disagree: t1 / dt = {k1}."
                )
            total = k1
        else:
            total = num_steps

    save_index = None
    if save_ts is not None:
        if _is_traced(save_ts):
            raise ValueError("simulate: save_ts must be concrete (a list or numpy array of times).")
        ts = np.asarray(save_ts, dtype=np.float64)
        if ts.ndim != 1:
            raise ValueError(f"simulate: save_ts must be one-dimensional; got shape {ts.shape}.")
        t_end = total * dt
        for t in ts:
            if not (
                math.isfinite(t) and -_GRID_RTOL * dt <= t <= t_end + _GRID_RTOL * max(t_end, dt)
            ):
                raise ValueError(
                    f"simulate: save_ts contains {float(t)!r}, outside [0, t1] = [0, {t_end!r}]."
                )
        save_index = np.array([_grid_index(float(t), dt, "save_ts entry") for t in ts], dtype=int)

    return dt, total, save_index, checks


def simulate(
    dynamics: AbstractDynamics,
    x0: Tokens,
    *,
    t1=None,
    dt,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    save_ts=None,
    num_steps: int | None = None,
) -> Float[Array, "times n d"] | Tokens:
    r"""Integrate `ẋ_i = P⊥_{x_i} F_i(x)` from `x(0) = x0` on the sphere with fixed steps `dt`.

    The steps are one `lax.scan` (compile time does not depend on the number of steps), so
    `simulate` is jit-able and reverse-differentiable; batch with `jax.vmap` over starts `x0`,
    over β or matrices (build the dynamics inside the mapped function, or map a batched
    dynamics with `eqx.filter_vmap`), and over `dt` (then pass `num_steps`).

    **Arguments:**

    - `dynamics`: `SA(beta)`, `USA(beta)`, `Hardmax()`, `FFNAugmented(...)`, ...
    - `x0`: the start, `(n, d)` with unit rows (`| ‖x_i‖ − 1 | ≤ 1e-6` in float64, `1e-4` in
      float32); `n ≥ 2`, `d ≥ 2`. Its dtype is kept throughout.
    - `t1`: the final time, a multiple of `dt` (within 1e-9 relative). Optional with `num_steps`.
    - `dt`: the step, `> 0`. A traced `dt` (under `jax.vmap` over step sizes) cannot fix the
      number of steps: then pass `num_steps` (and `t1 = num_steps * dt` is implied).
    - `integrator`: `ProjectedEuler()` (default, the authors' integrator), `ProjectedRK2()`,
      `ProjectedRK4()`, `GeodesicEuler()`, `DiffraxProjected(solver)`.
    - `save_ts`: times at which to return the state, each a multiple of `dt` in `[0, t1]`, in any
      order (`t = 0` returns `x0`); needs a concrete `dt`. Only the steps up to `max(save_ts)` run.
    - `num_steps`: the number of steps (instead of, or consistent with, `t1`).

    **Returns:** with `save_ts`, the states `(len(save_ts), n, d)`; with `save_ts=None`, only the
    final state `x(t1)` with shape `(n, d)`.

    **Example:**

    ```python
    dyn = wb.particles.SA(beta=1.0)
    xs = wb.particles.simulate(dyn, x0, t1=10.0, dt=0.01,
                               integrator=wb.particles.ProjectedRK4(), save_ts=[0.0, 5.0, 10.0])
    ```
    """
    # ---- validation, all before any compute ----
    if not isinstance(dynamics, AbstractDynamics):
        raise ValueError(
            f"simulate: dynamics={dynamics!r} is not a particle dynamics; pass e.g. "
            "wb.particles.SA(beta), USA(beta), Hardmax() or FFNAugmented(...)."
        )
    if not isinstance(integrator, AbstractSphereIntegrator):
        raise ValueError(
            f"simulate: integrator={integrator!r} is not a sphere integrator; pass e.g. "
            "ProjectedEuler(), ProjectedRK2(), ProjectedRK4(), GeodesicEuler() or "
            "DiffraxProjected(diffrax.Tsit5())."
        )
    _check_points(x0)
    n, d = x0.shape
    dynamics.check_dimension(d)
    dtype = x0.dtype
    dt, total, save_index, checks = _time_grid(dt, t1, num_steps, save_ts, dtype)

    x0 = _check_on_sphere(x0)
    for bad, message in checks:
        x0 = eqx.error_if(x0, bad, message)

    # ---- integration ----
    def step(x):
        return integrator.step(dynamics, x, dt)

    def body(x, _):
        return step(x), None

    if save_index is None:
        x1, _ = jax.lax.scan(body, x0, None, length=total)
        return x1

    unique, inverse = np.unique(save_index, return_inverse=True)
    last = int(unique[-1]) if unique.size else 0
    # Every saved step a multiple of g, and not many more multiples than saves (a regular grid,
    # as every study uses): scan over chunks of g steps, an inner scan per chunk, each chunk's end
    # written in place into its row of the output (row 0 holds x0). Under `jax.vmap` the rows are
    # written straight into the batched output, so there is no stacked copy to transpose and
    # concatenate afterwards (what a scan's `ys` plus `concatenate` would cost).
    g = int(np.gcd.reduce(unique[unique > 0])) if last > 0 else 0
    if g and last // g <= 2 * unique.size:

        def chunk(carry, k):
            x, states = carry
            x, _ = jax.lax.scan(body, x, None, length=g)
            return (x, jax.lax.dynamic_update_index_in_dim(states, x, k, 0)), None

        states = jnp.zeros((last // g + 1, n, d), dtype).at[0].set(x0)
        (_, states), _ = jax.lax.scan(chunk, (x0, states), jnp.arange(1, last // g + 1))
        # states[k] = x(k g dt)
        picked = np.asarray(save_index).reshape(-1) // g
        if np.array_equal(picked, np.arange(states.shape[0])):
            return states  # the whole grid in order (the usual case): no gather, no copy
        return states[jnp.asarray(picked)]

    # Otherwise the saved states live in a buffer with one extra scratch row: every step writes
    # its state to its slot, or to the scratch row when it is not saved (one row write per step,
    # no select over the whole buffer), so memory is len(save_ts) states, not one per step.
    scratch = unique.size
    slot_of_step = np.full(last + 1, scratch, dtype=np.int32)
    slot_of_step[unique] = np.arange(unique.size, dtype=np.int32)
    buffer = jnp.zeros((unique.size + 1, n, d), dtype)
    if unique.size and unique[0] == 0:
        buffer = buffer.at[0].set(x0)

    def body_saving(carry, slot):
        x, buf = carry
        x = step(x)
        buf = jax.lax.dynamic_update_index_in_dim(buf, x, slot, 0)
        return (x, buf), None

    (_, buffer), _ = jax.lax.scan(body_saving, (x0, buffer), jnp.asarray(slot_of_step[1:]))
    return buffer[jnp.asarray(inverse.reshape(-1))]
