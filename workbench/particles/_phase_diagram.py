"""The public sweep entry points: `random_starts`, the single-trajectory `clustering_curve` and
`gram_trajectory`, and `phase_diagram` (validate, pick the form, run `_phase_kernel._chunk` over
(β, start) chunks with `chunked_map`, accumulate the moments over starts).

Each takes the dynamics as one object: an `SA` / `USA` instance, or for `phase_diagram` a batch
of them over β (`eqx.filter_vmap(SA)(betas)`). The old form — β (or an array of β) first, the
class and the matrices as keywords `dynamics=`, `Q=`, `K=`, `V=` — still works for one release
(`_old_form`: converted once into the object, with a `DeprecationWarning`).
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._checks import int_in_range, positive_float
from .._random import normal
from .._sharding import CellMesh
from .._types import Tokens
from ._chunking import _default_chunk_size, chunked_map
from ._cluster_statistics import _StartMoments
from ._dynamics import SA, AbstractDynamics
from ._forms import AbstractForm, _is_identity, _resolve_form, _with_beta
from ._integrators import AbstractSphereIntegrator, ProjectedEuler
from ._phase_kernel import _chunk, _Kernel
from ._sweep_checks import (
    _DYNAMICS,
    _check_betas,
    _check_delta,
    _check_dimension,
    _check_integrator,
    _check_optional_count,
    _check_starts,
    _rebuilt,
    _single_dynamics,
    _sweep_dynamics,
)
from ._time_grid import _time_plan

_OLD_KEYWORDS = ("dynamics", "Q", "K", "V")


def random_starts(key, num_starts: int, n: int, d: int, dtype=None) -> Float[Array, "S n d"]:
    """`num_starts` configurations of `n` i.i.d. uniform points on `S^{d−1}`, shape `(S, n, d)`
    (normalized Gaussians; `dtype` defaults to JAX's default float)."""
    for name, value, low in (("num_starts", num_starts, 1), ("n", n, 2), ("d", d, 2)):
        int_in_range(name, value, low, owner="random_starts")
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64 if dtype is None else dtype)
    x = normal(key, (num_starts, n, d), dtype)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _old_form(owner: str, first, old: dict, *, batched: bool):
    """The dynamics object from the first argument of an entry point.

    A dynamics object (or anything that is neither a number nor an array: the type check names
    it) is returned as it is; with a dynamics object the old keywords must be absent. The old
    form — `first` the β array (`batched`) or one β, `old` the keywords `dynamics` (the class,
    default `SA`) and `Q`, `K`, `V` — is converted once: `eqx.tree_at` puts the β array in the β
    leaf of `dynamics(0.0, Q=Q, K=K, V=V)` (a batch sharing the matrices), or `dynamics(β, ...)`.
    """
    unknown = sorted(set(old) - set(_OLD_KEYWORDS))
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    is_number = isinstance(first, numbers.Number) and not isinstance(first, bool)
    if not (is_number or isinstance(first, (np.ndarray, jax.Array, list, tuple))):
        if old and isinstance(first, AbstractDynamics):
            names = ", ".join(f"{name}=" for name in old)
            raise ValueError(
                f"{owner}: {names} belong to the old form (β first); with a dynamics object the "
                "class and the matrices come from it, e.g. SA(beta, Q=Q, K=K, V=V)."
            )
        return first
    warnings.warn(
        f"{owner}(β, ..., dynamics=SA, Q=..., K=..., V=...) is the old form; pass the dynamics "
        f"object: {owner}(eqx.filter_vmap(lambda b: SA(b, Q=Q, K=K, V=V))(betas), ...) "
        "or SA(beta, ...) for one β.",
        DeprecationWarning,
        stacklevel=3,
    )
    cls = old.get("dynamics", SA)
    if cls not in _DYNAMICS:
        raise ValueError(
            f"{owner}: dynamics={cls!r}; pass the class SA or USA (old form), or better a "
            "dynamics object as the first argument."
        )
    matrices = {name: old.get(name) for name in ("Q", "K", "V")}
    matrices = {name: None if m is None else jnp.asarray(m) for name, m in matrices.items()}
    if batched:
        betas = _check_betas(owner, first)
        return _with_beta(_rebuilt(owner, cls, 0.0, matrices, False, None), betas)
    if jnp.ndim(first) != 0:
        raise ValueError(
            f"{owner}: beta must be a scalar; got shape {jnp.shape(first)}. For many β use "
            "phase_diagram or jax.vmap."
        )
    return _rebuilt(owner, cls, first, matrices, False, None)


def _single(owner, dynamics, x0, dt, save_ts, integrator, delta, form):
    """Checks and setup shared by `clustering_curve` and `gram_trajectory`."""
    _check_integrator(owner, integrator)
    if isinstance(x0, jax.core.Tracer):
        if x0.ndim != 2:
            raise ValueError(f"{owner}: x0 must have shape (n, d); got {x0.shape}.")
    else:
        x0 = _check_starts(owner, x0, batched=False)
    dtype = x0.dtype
    dynamics = _single_dynamics(owner, dynamics, x0.shape[1])
    dt = positive_float("dt", dt, owner=owner, arrays=True)
    delta = _check_delta(owner, delta)
    form = _resolve_form(form, matrices_given=not _is_identity(dynamics), integrator=integrator)
    plan, slots, inverse, _ = _time_plan(owner, save_ts, dt)
    kernel = _Kernel(integrator, form)
    args = (
        plan,
        _with_beta(dynamics, jnp.asarray(dynamics.beta, dtype)),
        x0,
        jnp.asarray(dt, dtype),
        jnp.asarray(slots),
        jnp.asarray(inverse),
    )
    return kernel, args, jnp.asarray(delta, dtype)


def clustering_curve(
    dynamics: SA,
    /,
    x0: Tokens,
    *,
    dt,
    save_ts,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    delta: float = 1e-3,
    form: AbstractForm | None = None,
    **old,
) -> Float[Array, " T"]:
    r"""The statistic `fraction_clustered(x(t), delta)` at `save_ts` along one trajectory.

    Equals `vmap(fraction_clustered)(simulate(dynamics, x0, dt=dt, integrator=integrator,
    save_ts=save_ts))` without storing the states, in the form `phase_diagram` would use
    (`ReducedForm` with identity matrices). `dynamics` (its β, its matrices) and `x0` may be
    traced: jit it, or `jax.vmap` it over β and starts, e.g.
    `jax.vmap(lambda b, x: clustering_curve(SA(b), x, dt=dt, save_ts=ts))(betas, starts)`
    (what `phase_diagram` does, chunk by chunk). Concrete `x0` is checked to lie on the sphere;
    traced `x0` is not.

    **Arguments:** as for `phase_diagram`, with one dynamics (`SA(beta, ...)` or `USA(...)`, β a
    scalar) and one start `x0` `(n, d)`. Old form (one release): `clustering_curve(beta, x0,
    dynamics=SA, Q=None, K=None, V=None, ...)`.

    **Returns:** shape `(len(save_ts),)`, values in `[0, 1]`.
    """
    dynamics = _old_form("clustering_curve", dynamics, old, batched=False)
    kernel, args, delta = _single(
        "clustering_curve", dynamics, x0, dt, save_ts, integrator, delta, form
    )
    return kernel.curve(*args, delta)


def gram_trajectory(
    dynamics: SA,
    /,
    x0: Tokens,
    *,
    dt,
    save_ts,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    form: AbstractForm | None = None,
    **old,
) -> Float[Array, "T n n"]:
    r"""The Gram matrices `x(t) x(t)ᵀ` at `save_ts` along one trajectory, shape `(T, n, n)`.

    The same run as `clustering_curve` (same forms: with identity matrices the particles are
    advanced in `n`-dimensional coordinates, so this costs `O(n³)` per step for any `d ≥ n`),
    returning the rotation-invariant state instead of the statistic. jit- and vmap-able like
    `clustering_curve`. Use it for step-size studies and for comparisons with `gamma_beta`.

    **Arguments:** as for `clustering_curve` (no `delta`; the same old form).
    """
    dynamics = _old_form("gram_trajectory", dynamics, old, batched=False)
    kernel, args, _ = _single("gram_trajectory", dynamics, x0, dt, save_ts, integrator, 1e-3, form)
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
    dynamics: SA,
    /,
    starts: Float[ArrayLike, "S n d"],
    *,
    dt,
    save_ts,
    integrator: AbstractSphereIntegrator = ProjectedEuler(),
    delta: float = 1e-3,
    form: AbstractForm | None = None,
    chunk_size: int | None = None,
    in_flight: int | None = None,
    per_start: bool = False,
    progress: bool | None = None,
    devices: Sequence[jax.Device] | None = None,
    **old,
) -> PhaseDiagram:
    r"""The phase diagram of Fig. 3: the fraction of pairs `i ≠ j` with `⟨x_i, x_j⟩ ≥ 1 − δ`,
    averaged over random starts, for every β and saved time.

    $$\bar F(\beta, t) = \frac1S \sum_{s=1}^S F_\delta\big(x^{(s)}_\beta(t)\big),\qquad
      F_\delta(x) = \frac{2}{n(n-1)}\#\{i<j : \langle x_i,x_j\rangle \ge 1-\delta\},$$

    with `x_β^{(s)}` the solution from `starts[s]` of the dynamics at β (`SA(β, Q=Q, K=K, V=V)`,
    a member of the batch `dynamics`) by `integrator` with fixed step `dt` (the paper: SA,
    `n = 32`, Euler-then-renormalize, `dt = 0.1`, `δ = 1e-3`, float64). Every start is used for
    every β (common random numbers: the diagram is smooth in β). The precision is that of
    `starts`.

    **How.** `jax.vmap` over the batch's β leaf (the matrices shared, not copied per β) and the
    starts of one jitted trajectory (`clustering_curve`), run in chunks of about `chunk_size`
    trajectories, dispatched asynchronously (up to `in_flight` at a time) so that the host
    prepares the next chunk while one runs. Each chunk's starts are cut
    into equal shards over `devices` (`jax.shard_map` over a one-axis mesh; the cells are
    independent, so no device talks to another and every number is the one of a single device;
    see `docs/scale.md`). With `form=None` and `Q = K = V = I` (all `None`, not `repulsive`) the
    particles are advanced in an orthonormal basis of their span (`ReducedForm`: cost
    `O(n² min(n, d))` per step, independent of `d` beyond `n`); with matrices (an explicit
    `jnp.eye` included) or `repulsive=True`, as they are (`ParticleForm`).

    **Arguments:**

    - `dynamics`: the dynamics, `SA` or `USA` (positional): a batch over β, i.e. an instance whose
      `beta` has shape `(B,)` (finite), built with `eqx.filter_vmap(SA)(betas)` or
      `eqx.filter_vmap(lambda b: SA(b, Q=Q, K=K, V=V))(betas)`; or one instance (B = 1). The
      matrices (`None` = identity; heads allowed) are shared by the whole sweep: given with the
      batch axis (as `filter_vmap` broadcasts them, `(B, d_k, d)`) they must be equal for every
      β; given without it (`eqx.tree_at(lambda s: s.beta, SA(0.0, Q=Q), betas)`) they are not
      copied. (A 3-D matrix whose leading axis has length B is read as batched.)
    - `starts`: `(S, n, d)` starts with unit rows (`random_starts`), `n ≥ 2`, `d ≥ 2`.
    - `dt`: the step `> 0`.
    - `save_ts`: `(T,)` times, multiples of `dt`, `≥ 0`, any order; the run stops at the last.
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

    Old form (one release, with a `DeprecationWarning`): `phase_diagram(betas, starts, ...,
    dynamics=SA, Q=None, K=None, V=None)` with `betas` a `(B,)` array and the class `SA` or `USA`.

    **Returns:** a `PhaseDiagram` (`fraction`, `sem`, `per_start`, `form`, ...).

    **Example:**

    ```python
    starts = wb.particles.random_starts(jax.random.key(0), 1024, 32, 128, jnp.float64)
    sa = eqx.filter_vmap(wb.particles.SA)(jnp.linspace(0.1, 9, 90))
    pd = wb.particles.phase_diagram(sa, starts, dt=0.1, save_ts=np.arange(61) * 0.5)
    pd.fraction.shape   # (90, 61)
    ```

    Reference: Geshkovski, Letrouit, Polyanskiy, Rigollet, arXiv 2312.10794, Fig. 3 and 5.
    """
    owner = "phase_diagram"
    dynamics = _old_form(owner, dynamics, old, batched=True)
    member, b = _sweep_dynamics(owner, dynamics)
    _check_integrator(owner, integrator)
    x = _check_starts(owner, starts, batched=True)
    num_starts, n, d = x.shape
    dtype = x.dtype
    _check_dimension(owner, member, d)
    dt = positive_float("dt", dt, owner=owner, arrays=True)
    delta = _check_delta(owner, delta)
    form = _resolve_form(form, matrices_given=not _is_identity(member), integrator=integrator)
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

    # The member with a placeholder β: each chunk swaps its block of β in (`_chunk`).
    template = _with_beta(member, jnp.zeros((), dtype))
    params, static = eqx.partition((_Kernel(integrator, form), template), eqx.is_array)
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
