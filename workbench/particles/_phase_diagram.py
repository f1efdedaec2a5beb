"""The public sweep entry points: `random_starts`, the single-trajectory `clustering_curve` and
`gram_trajectory`, and `phase_diagram` (validate, pick the form, run `_phase_kernel._chunk` over
(β, start) chunks with `chunked_map`, accumulate the moments over starts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._sharding import CellMesh
from .._types import Tokens
from ._chunking import _default_chunk_size, chunked_map
from ._cluster_statistics import _StartMoments
from ._dynamics import SA
from ._forms import AbstractForm, _resolve_form
from ._integrators import AbstractSphereIntegrator, ProjectedEuler
from ._phase_kernel import _chunk, _Kernel
from ._sweep_checks import (
    _check_betas,
    _check_delta,
    _check_dynamics,
    _check_integrator,
    _check_matrices,
    _check_optional_count,
    _check_scalar,
    _check_starts,
    _is_count,
)
from ._time_grid import _time_plan


def random_starts(key, num_starts: int, n: int, d: int, dtype=None) -> Float[Array, "S n d"]:
    """`num_starts` configurations of `n` i.i.d. uniform points on `S^{d−1}`, shape `(S, n, d)`
    (normalized Gaussians; `dtype` defaults to JAX's default float)."""
    for name, value, low in (("num_starts", num_starts, 1), ("n", n, 2), ("d", d, 2)):
        if not _is_count(value, low):
            raise ValueError(f"random_starts: {name}={value!r} must be an integer >= {low}.")
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64 if dtype is None else dtype)
    x = jax.random.normal(key, (num_starts, n, d), dtype=dtype)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _single(owner, beta, x0, dt, save_ts, dynamics, Q, K, V, integrator, delta, form):
    """Checks and setup shared by `clustering_curve` and `gram_trajectory`."""
    _check_dynamics(owner, dynamics)
    _check_integrator(owner, integrator)
    if jnp.ndim(beta) != 0:
        raise ValueError(
            f"{owner}: beta must be a scalar; got shape {jnp.shape(beta)}. For many β use "
            "phase_diagram or jax.vmap."
        )
    if isinstance(x0, jax.core.Tracer):
        if x0.ndim != 2:
            raise ValueError(f"{owner}: x0 must have shape (n, d); got {x0.shape}.")
    else:
        x0 = _check_starts(owner, x0, batched=False)
    d = x0.shape[1]
    dt = _check_scalar(owner, "dt", dt, positive=True)
    delta = _check_delta(owner, delta)
    Q, K, V = _check_matrices(owner, dynamics, d, Q, K, V)
    form = _resolve_form(
        form, matrices_given=any(m is not None for m in (Q, K, V)), integrator=integrator
    )
    plan, slots, inverse, _ = _time_plan(owner, save_ts, dt)
    kernel = _Kernel(dynamics, integrator, form, Q, K, V)
    dtype = x0.dtype
    args = (
        plan,
        jnp.asarray(beta, dtype),
        x0,
        jnp.asarray(dt, dtype),
        jnp.asarray(slots),
        jnp.asarray(inverse),
    )
    return kernel, args, jnp.asarray(delta, dtype)


def clustering_curve(
    beta,
    x0: Tokens,
    *,
    dt,
    save_ts,
    dynamics: type = SA,
    Q=None,
    K=None,
    V=None,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    delta: float = 1e-3,
    form: AbstractForm | None = None,
) -> Float[Array, " T"]:
    r"""The statistic `fraction_clustered(x(t), delta)` at `save_ts` along one trajectory.

    Equals `vmap(fraction_clustered)(simulate(dynamics(beta, Q=Q, K=K, V=V), x0, dt=dt,
    integrator=integrator, save_ts=save_ts))` without storing the states, in the form
    `phase_diagram` would use (`ReducedForm` with identity matrices). `beta` and `x0` may be
    traced: jit it, or `jax.vmap` it over β and starts (what `phase_diagram` does, chunk by
    chunk). Concrete `x0` is checked to lie on the sphere; traced `x0` is not.

    **Arguments:** as for `phase_diagram`, with one `beta` (a scalar) and one start `x0` `(n, d)`.

    **Returns:** shape `(len(save_ts),)`, values in `[0, 1]`.
    """
    kernel, args, delta = _single(
        "clustering_curve", beta, x0, dt, save_ts, dynamics, Q, K, V, integrator, delta, form
    )
    return kernel.curve(*args, delta)


def gram_trajectory(
    beta,
    x0: Tokens,
    *,
    dt,
    save_ts,
    dynamics: type = SA,
    Q=None,
    K=None,
    V=None,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    form: AbstractForm | None = None,
) -> Float[Array, "T n n"]:
    r"""The Gram matrices `x(t) x(t)ᵀ` at `save_ts` along one trajectory, shape `(T, n, n)`.

    The same run as `clustering_curve` (same forms: with identity matrices the particles are
    advanced in `n`-dimensional coordinates, so this costs `O(n³)` per step for any `d ≥ n`),
    returning the rotation-invariant state instead of the statistic. jit- and vmap-able like
    `clustering_curve`. Use it for step-size studies and for comparisons with `gamma_beta`.

    **Arguments:** as for `clustering_curve` (no `delta`).
    """
    kernel, args, _ = _single(
        "gram_trajectory", beta, x0, dt, save_ts, dynamics, Q, K, V, integrator, 1e-3, form
    )
    return kernel.observe(*args, kernel.gram)


@dataclasses.dataclass(frozen=True)
class PhaseDiagram:
    """The result of `phase_diagram` (NumPy arrays on the host).

    - `betas` `(B,)`, `ts` `(T,)`: the grid (`ts` = `save_ts` in the given order).
    - `fraction` `(B, T)`: the statistic averaged over the starts.
    - `sem` `(B, T)`: its standard error over the starts (sample std / sqrt(S); 0 when S = 1).
    - `per_start` `(B, S, T)` or `None`: every start's value (with `per_start=True`).
    - `form`: the form that ran (`ReducedForm()`, `GramForm()` or `ParticleForm()`).
    - `num_steps`, `dt`: the steps taken (to `max(ts)`).
    """

    betas: np.ndarray
    ts: np.ndarray
    fraction: np.ndarray
    sem: np.ndarray
    per_start: np.ndarray | None
    form: AbstractForm
    num_steps: int
    dt: float


def phase_diagram(
    betas: Float[ArrayLike, " B"],
    starts: Float[ArrayLike, "S n d"],
    *,
    dt,
    save_ts,
    dynamics: type = SA,
    Q=None,
    K=None,
    V=None,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    delta: float = 1e-3,
    form: AbstractForm | None = None,
    chunk_size: int | None = None,
    in_flight: int | None = None,
    per_start: bool = False,
    progress: bool | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> PhaseDiagram:
    r"""The phase diagram of Fig. 3: the fraction of pairs `i ≠ j` with `⟨x_i, x_j⟩ ≥ 1 − δ`,
    averaged over random starts, for every β and saved time.

    $$\bar F(\beta, t) = \frac1S \sum_{s=1}^S F_\delta\big(x^{(s)}_\beta(t)\big),\qquad
      F_\delta(x) = \frac{2}{n(n-1)}\#\{i<j : \langle x_i,x_j\rangle \ge 1-\delta\},$$

    with `x_β^{(s)}` the solution from `starts[s]` of `dynamics(β, Q=Q, K=K, V=V)` by
    `integrator` with fixed step `dt` (the paper: SA, `n = 32`, Euler-then-renormalize, `dt = 0.1`,
    `δ = 1e-3`, float64). Every start is used for every β (common random numbers: the diagram is
    smooth in β). The precision is that of `starts`.

    **How.** `jax.vmap` over β and starts of one jitted trajectory (`clustering_curve`), run in
    chunks of about `chunk_size` trajectories, dispatched asynchronously (up to `in_flight` at a
    time) so that the host prepares the next chunk while one runs. Each chunk's starts are cut
    into equal shards over `devices` (`jax.shard_map` over a one-axis mesh; the cells are
    independent, so no device talks to another and every number is the one of a single device;
    see `docs/scale.md`). With `form=None` and `Q = K = V = I` the particles are advanced in an
    orthonormal basis of their span (`ReducedForm`: cost `O(n² min(n, d))` per step, independent
    of `d` beyond `n`); with matrices, as they are (`ParticleForm`).

    **Arguments:**

    - `betas`: `(B,)` finite inverse temperatures.
    - `starts`: `(S, n, d)` starts with unit rows (`random_starts`), `n ≥ 2`, `d ≥ 2`.
    - `dt`: the step `> 0`.
    - `save_ts`: `(T,)` times, multiples of `dt`, `≥ 0`, any order; the run stops at the last.
    - `dynamics`: the class `SA` (default) or `USA`.
    - `Q`, `K`, `V`: optional matrices as for `SA` (`None` = identity; heads allowed).
    - `integrator`: `ProjectedEuler()` (default), `ProjectedRK4()`, ...
    - `delta`: the tolerance `δ ∈ (0, 2]`.
    - `form`: `None` (automatic), `ReducedForm()`, `GramForm()` or `ParticleForm()`.
    - `chunk_size`: trajectories per compiled call (default on CPU: about 4 MiB of
      per-trajectory arrays, 256 trajectories for `n = 32`, `d ≥ n` in the reduced form,
      float64; on an accelerator about 256 MiB, 16 384 trajectories there; times the number of
      devices).
    - `in_flight`: chunks dispatched before waiting for the oldest (default 2).
    - `per_start`: also return every start's values `(B, S, T)`.
    - `progress`: show a progress bar over chunks (`None`: unless `WORKBENCH_PROGRESS=0`).
    - `devices`: the devices to spread the cells over (default `jax.devices()`: every device of
      every process once `jax.distributed.initialize()` has run; every process then makes the
      same call and receives the whole diagram).

    **Returns:** a `PhaseDiagram` (`fraction`, `sem`, `per_start`, `form`, ...).

    **Example:**

    ```python
    starts = wb.particles.random_starts(jax.random.key(0), 1024, 32, 128, jnp.float64)
    pd = wb.particles.phase_diagram(jnp.linspace(0.1, 9, 90), starts, dt=0.1,
                                    save_ts=np.arange(61) * 0.5)
    pd.fraction.shape   # (90, 61)
    ```

    Reference: Geshkovski, Letrouit, Polyanskiy, Rigollet, arXiv 2312.10794, Fig. 3 and 5.
    """
    owner = "phase_diagram"
    _check_dynamics(owner, dynamics)
    _check_integrator(owner, integrator)
    b = _check_betas(owner, betas)
    x = _check_starts(owner, starts, batched=True)
    num_starts, n, d = x.shape
    dtype = x.dtype
    dt = _check_scalar(owner, "dt", dt, positive=True)
    delta = _check_delta(owner, delta)
    Q, K, V = _check_matrices(owner, dynamics, d, Q, K, V)
    form = _resolve_form(
        form, matrices_given=any(m is not None for m in (Q, K, V)), integrator=integrator
    )
    plan, slots, inverse, ts = _time_plan(owner, save_ts, dt)
    num_steps = plan.block * slots.size
    for name, value in (("chunk_size", chunk_size), ("in_flight", in_flight)):
        _check_optional_count(owner, name, value)

    mesh = CellMesh(devices)
    if chunk_size is None:
        trajectory_bytes = n * (n + form.width(n, d)) * jnp.dtype(dtype).itemsize
        # One device's chunk per device (measured: on simulated CPU devices sharing two cores,
        # splitting one device's chunk over them ran 1.2–1.5× slower than one device).
        platform = mesh.devices[0].platform
        chunk_size = mesh.size * _default_chunk_size(trajectory_bytes, platform)
    x = form.prepare(x)

    params, static = eqx.partition(_Kernel(dynamics, integrator, form, Q, K, V), eqx.is_array)
    args = (
        jnp.asarray(dt, dtype),
        jnp.asarray(slots),
        jnp.asarray(inverse),
        jnp.asarray(delta, dtype),
    )
    moments = _StartMoments(b.size, num_starts, ts.size, per_start, n * (n - 1) // 2)

    def run(betas_block, starts_block):
        return _chunk(params, static, plan, mesh, betas_block, starts_block, *args)

    def consume(where, values):
        moments.add(*where, np.asarray(values, dtype=np.float64))

    # (β block) × (start block), padded to full blocks (one compilation).
    chunked_map(
        run,
        (b.astype(dtype), x),
        chunk_size,
        consume,
        in_flight=in_flight,
        progress=progress,
        desc=f"phase diagram ({type(form).__name__}, {mesh.size} device(s))",
        mesh=mesh,
    )
    mean, sem = moments.mean_sem()
    return PhaseDiagram(
        betas=b.astype(np.float64),
        ts=ts,
        fraction=mean,
        sem=sem,
        per_start=moments.every,
        form=form,
        num_steps=num_steps,
        dt=dt,
    )
