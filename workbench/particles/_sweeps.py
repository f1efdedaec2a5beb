r"""The batched phase-diagram kernel: the clustering statistic of Fig. 3 over β × starts × time.

For a batch of dynamics over β (`eqx.filter_vmap(SA)(betas)`: an `SA` / `USA` whose β has shape
`(B,)`, the matrices shared) and random starts `(S, n, d)` on the sphere, every pair (β, start)
is integrated with a fixed-step sphere integrator, and at each saved time the statistic

$$F_\delta(x) = \frac{2}{n(n-1)}\,\#\{i < j : \langle x_i, x_j\rangle \ge 1 - \delta\}$$

(`fraction_clustered`) is recorded; `phase_diagram` returns its mean over starts `(B, T)` (and
optionally every start's value). The trajectories are a `jax.vmap` over the β leaf of the
dynamics and the starts of one `lax.scan` over blocks of steps between observations, jitted once
per shape; the host feeds them in chunks (bounded memory, a progress bar), dispatched
asynchronously.

Three ways to advance a configuration (`form=`), all the same algorithm in exact arithmetic:

- `ParticleForm`: the particles `X` `(n, d)` themselves, with any dynamics matrices `Q, K, V` and
  any sphere integrator: `4 n² d` flops per Euler step (`O(n d²)` more with matrices).
- `ReducedForm` (`Q = K = V = I`): the velocity rows are combinations of the current rows, so the
  particles never leave the span of the start's rows; writing `X = R Uᵀ` with `U` `(d, r)`
  orthonormal, `r = min(n, d)`, the particle form runs on the coordinates `R` `(n, r)`:
  `4 n² r` flops per Euler step, `4 n³` for `d ≥ n`, whatever `d` is. Conditioned like the
  particle form.
- `GramForm` (`Q = K = V = I`): every statistic and update depends on `X` only through
  `G = X Xᵀ`, and a projected Runge–Kutta (or geodesic) step can be advanced exactly on `G`
  (the algebra is in `GramForm`): also `4 n³` per Euler step, but it squares the conditioning
  (like normal equations), see `GramForm`.

`form=None` picks `ReducedForm` when `Q = K = V = I` and `ParticleForm` otherwise. For the
paper's sizes (`n = 32`, `d = 128 … 1024`) the reduced and Gram forms need 4–32× fewer flops than
the particle form.

Where the parts live (flat private modules, imported here):

- `_forms`: `AbstractForm` and the three forms, each carrying its behaviour (checks, initial
  state, step, observables, how a chunk is vmapped); `_resolve_form` picks one.
- `_gram_algebra`: the Gram-matrix step algebra (`gram_step`, `_gram_advance`, `_euler_rows`).
- `_reduction`: the orthonormal-basis coordinates of `ReducedForm` (`_reduce`).
- `_cluster_statistics`: the clustered-pair fraction (`_pair_fraction`, `_pair_fraction_of_rows`)
  and the per-start moments of `phase_diagram`.
- `_time_grid`: `save_ts` as a static plan of observation blocks (`_time_plan`).
- `_phase_kernel`: one trajectory (`_Kernel`) and one compiled chunk of (β, start) pairs
  (`_chunk`).
- `_chunking`: `chunked_map`, the chunked asynchronous mapping over a batch.
- `_sweep_checks`: input validation.
- `_phase_diagram`: the public entry points (`phase_diagram`, `clustering_curve`, ...).
"""

from __future__ import annotations

from ._cluster_statistics import (
    _at_least as _at_least,
    _pair_fraction as _pair_fraction,
    _pair_fraction_of_rows as _pair_fraction_of_rows,
)
from ._forms import (
    AbstractForm as AbstractForm,
    GramForm as GramForm,
    ParticleForm as ParticleForm,
    ReducedForm as ReducedForm,
)
from ._gram_algebra import _euler_rows as _euler_rows, gram_step as gram_step
from ._phase_diagram import (
    PhaseDiagram as PhaseDiagram,
    clustering_curve as clustering_curve,
    gram_trajectory as gram_trajectory,
    phase_diagram as phase_diagram,
    random_starts as random_starts,
)
from ._reduction import _reduce as _reduce

__all__ = [
    "AbstractForm",
    "GramForm",
    "ParticleForm",
    "PhaseDiagram",
    "ReducedForm",
    "clustering_curve",
    "gram_step",
    "gram_trajectory",
    "phase_diagram",
    "random_starts",
]
