"""Peak-memory estimates of the studies: the arithmetic behind `Config.estimated_peak_bytes`.

Every study's `Config` has `estimated_peak_bytes() -> int`, pure arithmetic on its fields (no
JAX computation, no allocation), so the harness can refuse a run that cannot fit before it makes
a folder or starts to compute. An estimate counts the arrays a study holds at its peak:

- its inputs and results on the host (starts, saved trajectories, per-start statistics);
- the dominating compiled program: its arguments, outputs and the temporaries XLA keeps (the
  state of every trajectory of a vmapped chunk, its integrator stages, attention matrices, the
  activations a gradient stores for its backward pass);
- model parameters with their copies (gradients, optimizer moments, updates).

It leaves out the fixed cost of the process (Python, the JAX runtime, compiled code: a few hundred
MiB whatever the config). The aim is a figure within a factor of a few of the truth that scales
like the real peak with every size field, so that an absurd size (10^12 starts) is estimated as
absurd; the helpers below model the library's own choices (e.g. the phase diagram's chunk size)
and are checked against XLA's memory analysis of the compiled programs in
`tests/studies/test_memory_estimates.py`.
"""

from __future__ import annotations

import math

__all__ = [
    "F32",
    "F64",
    "GIB",
    "INTEGRATOR_STAGES",
    "array_bytes",
    "attention_layer_floats",
    "digits_training_bytes",
    "discretization",
    "encoder_parameters",
    "encoder_solve_bytes",
    "growth_trial_bytes",
    "itemsize",
    "particle_trajectory_bytes",
    "phase_diagram_bytes",
    "scheme_evaluations",
    "training_bytes",
]

F32 = 4
"""Bytes of a float32 entry."""
F64 = 8
"""Bytes of a float64 (or int64) entry."""
GIB = 1 << 30

INTEGRATOR_STAGES = {"euler": 1, "geodesic-euler": 1, "rk2": 2, "rk4": 4}
"""Field evaluations per step of the sphere integrators of `wb.registry.SPHERE_INTEGRATORS`."""

CPU_CHUNK_BUDGET = 4 << 20
"""Bytes of per-trajectory arrays in one compiled chunk of `wb.particles.phase_diagram` on a CPU
(`workbench.particles._chunking._default_chunk_size`)."""
CPU_CHUNK_CAP = 1024
"""Most trajectories per chunk on a CPU (same source)."""
CHUNK_OVERHEAD = 1 << 20
"""Temporaries of a compiled phase-diagram chunk beyond its trajectories' (XLA's memory
analysis at a few dozen trajectories)."""


def itemsize(x64: bool) -> int:
    """Bytes per float entry: 8 in float64, 4 in float32."""
    return F64 if x64 else F32


def array_bytes(*shape: int, itemsize: int = F64) -> int:
    """Bytes of a dense array of `shape` with `itemsize` bytes per entry (`prod(shape) ·
    itemsize`; Python integers, so absurd shapes give absurd, exact figures)."""
    return int(itemsize) * math.prod(int(s) for s in shape)


def particle_trajectory_bytes(
    n: int, d: int, *, integrator: str = "rk4", itemsize: int = F64, pair_products: int = 0
) -> int:
    """Bytes one particle trajectory (`n` points in `R^d`) occupies while a vmapped compiled call
    advances it: the state, the integrator's stages and the velocity field (`(stages + 2)·n·d`
    entries), the attention matrix and its exponentials (`2·n²`), and `pair_products`
    diagnostics built on `wb.particles.pair_inner_products` (the histogram, the fraction
    clustered), each of which gathers both points of every pair `i < j` (`n²·d` entries)."""
    stages = INTEGRATOR_STAGES.get(integrator, 4)
    entries = (stages + 2) * n * d + 2 * n * n + pair_products * n * n * d
    return int(itemsize) * entries


def phase_diagram_bytes(
    num_betas: int,
    num_starts: int,
    n: int,
    d: int,
    num_times: int,
    *,
    itemsize: int = F64,
    matrices: bool = False,
    per_start: bool = False,
    in_flight: int = 2,
) -> int:
    """Peak bytes of one `wb.particles.phase_diagram` call with its starts (made by
    `random_starts`), on a CPU:

    - the starts `(S, n, d)`: twice while `random_starts` normalizes them, then once, with the
      form's prepared copy `(S, n, w)` on the device and its padded copy on the host (`w =
      min(n, d)` in the reduced form of identity matrices, `d` in the particle form of
      `matrices`);
    - `in_flight` compiled chunks of `min(B·S, chunk)` trajectories, `chunk` the library's CPU
      default (about 4 MiB of `n·(n + w)` state per call, at most 1024), each trajectory
      `1.2·n·(n + w)` entries of temporaries in the reduced form and `4·n·(n + w)` in the
      particle form, plus its `T` statistics, and 1 MiB per chunk (XLA's memory analysis of the
      compiled chunk: 1.0–2.5 and 3.0–4.3 per trajectory, the more for the smaller chunks);
    - the moments over the starts `(B, T)`, and with `per_start` every start's values
      `(B, S, T)` in float64.
    """
    w = d if matrices else min(n, d)
    starts = array_bytes(num_starts, n, d, itemsize=itemsize)
    prepared = array_bytes(num_starts, n, w, itemsize=itemsize)
    held = max(2 * starts, starts + 2 * prepared)
    state = n * (n + w) * itemsize
    chunk = min(num_betas * num_starts, CPU_CHUNK_CAP, max(8, CPU_CHUNK_BUDGET // state))
    per_trajectory = (4 * state if matrices else 6 * state // 5) + 2 * num_times * itemsize
    chunks = in_flight * (chunk * per_trajectory + CHUNK_OVERHEAD)
    moments = array_bytes(4, num_betas, num_times)
    every = array_bytes(num_betas, num_starts, num_times) if per_start else 0
    return held + chunks + moments + every


def scheme_evaluations(scheme: str) -> int:
    """Operator evaluations per step of a splitting scheme of `wb.registry.SPLITTING_SCHEMES` on
    the two operators (attention, feed-forward): sub-flows × stages of the inner Runge–Kutta
    method (Lie–Trotter 2, Strang 6, Yoshida4 36, Suzuki4 60)."""
    import workbench as wb

    s = wb.registry.SPLITTING_SCHEMES[scheme]
    return len(s.stages(2)) * s.inner.tableau.num_stages


def encoder_parameters(d: int, hidden: int, num_layers: int, *, vocab: int = 0) -> int:
    """Parameters of a Transformer encoder: per layer the query, key, value and output maps
    (`4·d² + 4·d`), the feed-forward block (`2·d·hidden + hidden + d`) and two LayerNorms
    (`4·d`); plus `vocab` embedding rows of width `d`."""
    per_layer = 4 * d * d + 2 * d * hidden + hidden + 9 * d
    return num_layers * per_layer + vocab * d


def attention_layer_floats(n: int, d: int, hidden: int, heads: int) -> int:
    """Entries one evaluation of attention and feed-forward on `n` tokens produces: the
    LayerNorms, queries, keys, values and outputs (`6·n·d`), the scores and their softmax
    (`2·heads·n²`), the hidden layer before and after its activation (`2·n·hidden`)."""
    return 6 * n * d + 2 * heads * n * n + 2 * n * hidden


def training_bytes(
    *,
    params: int,
    batch: int,
    tokens: int,
    d: int,
    hidden: int,
    heads: int,
    steps: int,
    evaluations: int,
    eval_batch: int,
    itemsize: int = F32,
    state_copies: int = 6,
) -> int:
    """Peak bytes of a gradient-trained Transformer equation (`wbc.train`, `wbc.evaluate`):

    - `params` parameters with `state_copies` copies in all: the parameters, their gradient,
      the optimizer's two moments (Adam), the update and the new parameters;
    - the larger of the compiled training step's activations and a held-out evaluation's. The
      exact gradient keeps, per example, about two thirds of `attention_layer_floats` per
      operator evaluation — `steps` steps × `evaluations` per step, plus two for the embedding,
      the final LayerNorm, the head and the loss (XLA's memory analysis of the compiled step:
      0.8–1.3 of this; checkpointing stores less, so this is the upper figure). A forward
      evaluation of `eval_batch` examples keeps a quarter of a layer per evaluation of one
      step, at most six (the inner Runge–Kutta stages).
    """
    layer = attention_layer_floats(tokens, d, hidden, heads)
    stored = batch * (steps * evaluations + 2) * layer * 2 // 3
    evaluation = eval_batch * min(max(evaluations, 2), 6) * layer // 4
    return itemsize * (state_copies * params + max(stored, evaluation))


def discretization(config) -> tuple[str, int]:
    """The training scheme's name and steps per layer: those of `config.plan` (a `plan.json`,
    read as JSON; no other check) when it names a splitting scheme, else the config's own
    `scheme` and `steps_per_layer` (the largest of `resolutions` with multi-resolution
    training, when larger: its finest solve sets the peak)."""
    plan = getattr(config, "plan", None)
    if plan is not None:
        import json
        import pathlib

        try:
            data = json.loads(pathlib.Path(plan).read_text(encoding="utf-8"))
            method, steps = data["method"], int(data["steps_per_layer"])
            if method in ("lie", "strang", "yoshida4", "suzuki4") and steps >= 1:
                return method, steps
        except (OSError, ValueError, KeyError, TypeError):
            pass
    spl = config.steps_per_layer
    if getattr(config, "depth", "fixed") == "multi-resolution":  # the finest drawn solve
        spl = max(spl, *config.resolutions)
    return config.scheme, spl


DIGITS_TRAIN, DIGITS_TEST = 1347, 450
"""Images in the 8×8 digits task's training and held-out splits (`wbc.digits`)."""


def digits_training_bytes(
    config,
    *,
    tokens: int,
    patch_inputs: int,
    layers: int | None = None,
    steps_per_layer: int | None = None,
    state_copies: int = 6,
    examples: tuple[int, int] = (DIGITS_TRAIN, DIGITS_TEST),
    example_size: int = 64,
) -> int:
    """`training_bytes` of a digits model of the config's size (`d`, `num_heads`, `hidden`,
    `batch_size`, the scheme): `tokens` tokens (with the class token), a patch embedding of
    `patch_inputs` pixels per token, `layers` pieces of the controls (default `num_layers`) at
    `steps_per_layer` steps each (default the config's or its plan's), a 10-class head; the
    held-out split evaluated in batches of at most 512 (`wbc.evaluate`'s); plus the data set in
    float32: `examples` (train, held-out) of `example_size` values each (8×8 digits by
    default)."""
    scheme, spl = discretization(config)
    layers = config.num_layers if layers is None else layers
    spl = spl if steps_per_layer is None else steps_per_layer
    d = config.d
    params = (
        encoder_parameters(d, config.hidden, layers)
        + d * (patch_inputs + 1)
        + (tokens + 1) * d  # embedding, positions, class token
        + 11 * d
        + 10
        + 2 * d  # head, final LayerNorm
    )
    data = array_bytes(sum(examples), example_size, itemsize=F32)
    return data + training_bytes(
        params=params,
        batch=config.batch_size,
        tokens=tokens,
        d=d,
        hidden=config.hidden,
        heads=config.num_heads,
        steps=layers * spl,
        evaluations=scheme_evaluations(scheme),
        eval_batch=min(examples[1], 512),
        state_copies=state_copies,
    )


def encoder_solve_bytes(
    *,
    n: int,
    d: int,
    hidden: int,
    heads: int,
    layers: int,
    stages: int = 13,
    batch: int = 1,
    itemsize: int = F64,
    param_copies: int = 3,
) -> int:
    """Peak bytes of solving a Transformer equation (`layers` layers of width `d`, feed-forward
    `hidden`) on `batch` inputs of `n` tokens with an explicit method of `stages` stages (Dopri8:
    13) that keeps only its current step: the parameters with `param_copies` copies in all (the
    NumPy state dict, the model, a reference's), and per input the stage states (`n·d` each) and
    one operator evaluation's activations (`attention_layer_floats`)."""
    params = param_copies * encoder_parameters(d, hidden, layers)
    per_input = stages * n * d + attention_layer_floats(n, d, hidden, heads)
    return int(itemsize) * (params + batch * per_input)


def growth_trial_bytes(size: int, columns: int, *, num_scan: int = 32, stages: int = 4) -> int:
    """Bytes of `wba.observed_max_stable_step` on a `size × size` linear field from a frame of
    `columns` columns (float64): the field and the projector, and the `num_scan` step sizes
    tried at once (vmapped), each integrating the whole frame with its Runge–Kutta stages
    (`(stages + 2)·size·columns` entries; XLA's memory analysis: 195·size² for a square frame
    with RK4)."""
    return array_bytes(3 * size * size + num_scan * (stages + 2) * size * columns)
