"""Every study's `Config.estimated_peak_bytes()` against an independent measurement, and the
config's refusal of bad seeds.

The measurement is XLA's own memory analysis of the program that dominates a study
(`jax.jit(f).lower(*args).compile().memory_analysis()`: argument + output + temporary bytes),
lowered with the very shapes the study uses, plus the exact byte count (`nbytes`, or
`jax.eval_shape` where the array would be too large to make) of the arrays the study holds
beside it. The estimate must lie within a stated factor of it, at smoke size and at a few times
larger sizes. Invariants: doubling `num_starts` doubles the estimate once the starts dominate;
10¹² starts are estimated as absurd (with no allocation); every smoke config's estimate is a
positive `int` far below 24 GiB.
"""

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import studies
import workbench as wb
import workbench.analysis as wa
import workbench.control as wbc
from studies import ConfigError
from studies._run.cli import main as cli
from studies._toolkit import memory as _memory
from studies._toolkit.config import SEED_MAX, steps_in
from workbench.particles._starts import uniform_sphere

GIB = 1 << 30


def _xla_bytes(lowered) -> int:
    """Argument + output + temporary bytes of a lowered program, by XLA's memory analysis."""
    m = lowered.compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes


def _within(estimate: int, measured: int, factor: float) -> bool:
    return measured / factor <= estimate <= measured * factor


# ------------------------------------------------------------------------------------------------
# every study


@pytest.mark.parametrize("name", list(studies.STUDIES))
def test_every_smoke_estimate_is_a_positive_int_well_below_24_gib(name):
    config = studies.get_study(name).smoke_config()
    estimate = config.estimated_peak_bytes()
    assert type(estimate) is int
    # At least a few KiB of arrays, at most 1 GiB (smoke runs take seconds on a CPU).
    assert 4 << 10 <= estimate <= GIB, f"{name}: {estimate} bytes"
    full = type(config)().estimated_peak_bytes()
    assert type(full) is int and estimate <= full < 24 * GIB, f"{name}: full size {full} bytes"


STARTS_STUDIES = (
    "phase-diagram",
    "repulsion",
    "cluster-histograms",
    "metastability",
    "high-dimension",
    "step-convergence",
)


@pytest.mark.parametrize("name", STARTS_STUDIES)
def test_doubling_the_starts_doubles_the_estimate_once_they_dominate(name):
    smoke = studies.get_study(name).smoke_config()
    many = dataclasses.replace(smoke, num_starts=smoke.num_starts * 2**16)
    double = dataclasses.replace(many, num_starts=2 * many.num_starts)
    ratio = double.estimated_peak_bytes() / many.estimated_peak_bytes()
    assert 1.9 <= ratio <= 2.0, ratio
    # And never less at the smaller size (every term grows with the starts).
    assert (
        smoke.estimated_peak_bytes()
        <= dataclasses.replace(smoke, num_starts=2 * smoke.num_starts).estimated_peak_bytes()
    )


@pytest.mark.parametrize(
    ("name", "field", "low", "high"),
    [
        ("train-digits", "batch_size", 1.7, 2.0),  # 512 -> 1024 images: activations dominate
        ("train-sequence", "batch_size", 1.7, 2.0),
        ("adjoint-accuracy", "cost_batch", 1.7, 2.0),
        # The dense Jacobian of N = n·d unknowns: quadratic in d (in n, the N tangents through
        # attention's n × n scores add an n³ term).
        ("stability", "d", 3.6, 4.0),
        ("penalty-form", "d", 3.6, 4.0),
    ],
)
def test_doubling_a_size_field_scales_the_estimate_like_its_dominating_arrays(
    name, field, low, high
):
    smoke = studies.get_study(name).smoke_config()
    big = {"batch_size": 512, "cost_batch": 512, "d": 64}[field]
    extra = {"num_train": 4096} if name == "train-sequence" else {}
    one = dataclasses.replace(smoke, **{field: big}, **extra)
    two = dataclasses.replace(smoke, **{field: 2 * big}, **extra)
    ratio = two.estimated_peak_bytes() / one.estimated_peak_bytes()
    assert low <= ratio <= high, ratio


@pytest.mark.parametrize("name", ["phase-diagram", "repulsion"])
def test_absurd_starts_are_estimated_as_absurd(name):
    # The two crashes this guards: phase-diagram aborted in XLA, repulsion tried 58 TiB.
    config = dataclasses.replace(studies.get_study(name).smoke_config(), num_starts=10**12)
    estimate = config.estimated_peak_bytes()  # arithmetic only: no allocation
    n, d = max(getattr(config, "ns", (getattr(config, "n", 0),))), 2
    assert estimate >= 10**12 * n * d * 8 > 50 * (1 << 40)


# ------------------------------------------------------------------------------------------------
# phase-diagram: the compiled chunk and the starts


def _phase_measurement(config, monkeypatch) -> tuple[int, int]:
    """(bytes of the largest compiled chunk, bytes of the largest starts with the form's
    prepared copies) of the study's diagrams: `compute` runs with every chunk recorded and
    answered by zeros of its output's shape (`jax.eval_shape`), then each distinct chunk is
    lowered and compiled as the library would."""
    import studies.particles.phase_diagram as study
    import workbench.particles._phase_diagram as pd
    import workbench.particles._phase_kernel as kernel

    recorded = {}

    def record(*args, **kwargs):
        out = jax.eval_shape(kernel._chunk, *args, **kwargs)
        shapes = tuple(getattr(a, "shape", None) for a in args[4:6])
        recorded.setdefault(shapes, (args, kwargs))
        return jnp.zeros(out.shape, out.dtype)

    monkeypatch.setattr(pd, "_chunk", record)
    study.compute(config)
    chunk = max(_xla_bytes(kernel._chunk.lower(*a, **k)) for a, k in recorded.values())
    item = 8 if config.x64 else 4

    def held(num, d, form):
        with jax.enable_x64(config.x64):
            make = functools.partial(
                wb.particles.random_starts,
                num_starts=num,
                n=config.n,
                d=d,
                dtype=jnp.float64 if config.x64 else jnp.float32,
            )
            starts = jax.eval_shape(make, jax.random.key(0))
            prepared = jax.eval_shape(form.prepare, starts)
        return item * (starts.size + 2 * prepared.size)  # device, and the host's padded copy

    sizes = [held(config.num_starts, d, wb.particles.ReducedForm()) for d in config.ds]
    if config.variants:
        sizes.append(held(config.variant_starts, config.variant_d, wb.particles.ParticleForm()))
    return chunk, max(sizes)


@pytest.mark.parametrize("scale", [1, 4])
def test_phase_diagram_estimate_matches_xla_and_the_starts(monkeypatch, scale):
    """Within a factor 2 of two compiled chunks in flight (the largest) plus the largest
    starts: the smoke config (d = 8, 32 and a Fig. 5 variant at d = 32) and 4× its starts."""
    smoke = studies.get_study("phase-diagram").smoke_config()
    config = dataclasses.replace(
        smoke, num_starts=smoke.num_starts * scale, variant_starts=smoke.variant_starts * scale
    )
    chunk, held = _phase_measurement(config, monkeypatch)
    estimate = config.estimated_peak_bytes()
    assert _within(estimate, 2 * chunk + held, 2.0), (estimate, chunk, held)


def test_phase_diagram_estimate_at_many_starts_is_the_starts_held(monkeypatch):
    """At 10⁵ starts (2.5 GB in float64, sized by `jax.eval_shape`, not made) the chunk is the
    library's capped one, measured at 32 starts; the starts with their prepared copies then
    dominate, and the estimate is within 10 % of them plus two chunks."""
    smoke = studies.get_study("phase-diagram").smoke_config()
    measured = dataclasses.replace(smoke, ds=(32,), variants=(), num_starts=32)
    chunk, _ = _phase_measurement(measured, monkeypatch)
    big = dataclasses.replace(measured, num_starts=10**5)
    with jax.enable_x64(True):
        starts = jax.eval_shape(
            functools.partial(
                wb.particles.random_starts,
                num_starts=big.num_starts,
                n=big.n,
                d=32,
                dtype=jnp.float64,
            ),
            jax.random.key(0),
        )
        prepared = jax.eval_shape(wb.particles.ReducedForm().prepare, starts)
    held = starts.size * 8 + 2 * prepared.size * 8
    assert held > 2 * 10**9
    assert _within(big.estimated_peak_bytes(), held + 2 * chunk, 1.1)


# ------------------------------------------------------------------------------------------------
# repulsion: the compiled flow chunk per case


@pytest.mark.parametrize("scale", [1, 8])
def test_repulsion_estimate_matches_xla_of_its_flow_chunk(scale):
    """Within a factor 2 of the largest case's compiled chunk (RK4 on every start at once) plus
    its starts and final Gram matrices, plus the energy histories every case keeps (the worst
    case, `max_time / chunk_time + 1` checks)."""
    import studies.particles.repulsion as study

    smoke = study.smoke_config()
    config = dataclasses.replace(smoke, num_starts=smoke.num_starts * scale)
    s = config.num_starts
    chunk = jax.jit(
        functools.partial(
            study._chunk, dt=config.dt, num_steps=steps_in(config.chunk_time, config.dt)
        )
    )
    cases = []
    with jax.enable_x64(True):
        for n in config.ns:
            for d in config.dims:
                xs = jnp.asarray(uniform_sphere(np.random.default_rng(0), s, n, d))
                program = _xla_bytes(chunk.lower(jnp.asarray(1.0, jnp.float64), xs))
                cases.append(program + xs.nbytes + np.zeros((s, n, n)).nbytes)
    checks = int(config.max_time // config.chunk_time) + 1
    num_cases = len(config.ns) * len(config.dims) * len(config.betas)
    histories = num_cases * np.zeros((checks, s)).nbytes
    estimate = config.estimated_peak_bytes()
    assert _within(estimate, max(cases) + histories, 2.0), (estimate, max(cases), histories)


# ------------------------------------------------------------------------------------------------
# train-sequence: the compiled training step and evaluation


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [64, 256])
def test_training_estimate_matches_xla_of_its_train_step(batch_size):
    """Within a factor 2 of the larger of the compiled training step (parameters, AdamW state,
    the stored activations of the exact gradient) and the compiled held-out evaluation with the
    parameters, plus the task's arrays: smoke size and 4× the batch. The step is the study's
    (`T.train_step`: multi-resolution by default)."""
    import studies._toolkit.training as T
    import studies.training.train_sequence as study

    config = dataclasses.replace(study.smoke_config(), batch_size=batch_size)
    tokens, classes = 2 * config.length, config.vocab + 1
    with jax.enable_x64(False):
        scheme, k = T.discretization(config, None)
        model = study._model(config, jax.random.key(0), classes, scheme, k)
        # The study's own step: multi-resolution by default (a switch over 1, 2, 4 steps per
        # layer, whose largest branch the estimate counts).
        train_step = T.train_step(config, 100)
        assert isinstance(train_step.discretization, wbc.MultiResolution)
        params, static = eqx.partition(model, eqx.is_inexact_array)
        state = train_step.update_rule.init(params)
        key = jax.random.key(0)

        def step(params, state, xs, ys):
            s = wbc.TrainState(eqx.combine(params, static), state, jnp.asarray(0), key)
            new, info = train_step(s, (xs, ys))
            return eqx.filter(new.model, eqx.is_inexact_array), new.opt_state, info["objective"]

        xs = jnp.zeros((batch_size, tokens), jnp.int32)
        train = _xla_bytes(jax.jit(step).lower(params, state, xs, xs))
        test = jnp.zeros((min(512, config.num_test), tokens), jnp.int32)
        forward = jax.jit(lambda p, xs: jax.vmap(eqx.combine(p, static))(xs))
        evaluate = _xla_bytes(forward.lower(params, test))
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    data = 2 * (config.num_train + config.num_test) * tokens * 4  # int32 inputs and targets
    measured = max(train, evaluate + param_bytes) + data
    estimate = config.estimated_peak_bytes()
    assert _within(estimate, measured, 2.0), (estimate, train, evaluate, data)


# ------------------------------------------------------------------------------------------------
# stability: the dense Jacobian, its eigenvectors and the modal observation


@pytest.mark.parametrize("n", [4, 8])
def test_stability_estimate_matches_xla_of_its_jacobian_and_modal_steps(n):
    """Within a factor 2 of the model's linearization at one layer: the compiled `jacfwd` of the
    full field, the eigendecomposition's exact arrays (the Jacobian, complex eigenvectors and
    their inverse), and the compiled modal observation (one RK4 step on the decaying
    eigenvectors, whose number is measured, for 32 step sizes one after another): smoke size
    (N = 32 unknowns) and twice the tokens (N = 64)."""
    from workbench.analysis._spectra import _flat
    from workbench.analysis._stability import _modal_amplification

    config = dataclasses.replace(studies.get_study("stability").smoke_config(), n=n)
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        sd = wb.architectures.random_encoder_state_dict(
            rng, d=config.d, num_layers=config.layers, dim_feedforward=config.dff
        )
        model = wb.architectures.encoder_from_torch(
            sd, num_heads=config.heads, norm_first=True, activation="gelu"
        )
        u = jnp.asarray(rng.normal(size=(config.n, config.d)))
        field = wa.term_fields(model.equation, 0.5)["full"]
        g, x = _flat(field, u)
        size = x.size
        jacobian = _xla_bytes(jax.jit(jax.jacfwd(g)).lower(x))
        jac = wa.jacobian_matrix(field, u)
        full = np.linalg.eigvals(jac)
        k = int(np.sum(full.real < -1e-8 * float(np.abs(full).max())))
        eig = jac.nbytes + 2 * np.zeros((size, size), complex).nbytes
        rk = wb.registry.UNSPLIT_METHODS["unsplit-rk4"]
        trials = _xla_bytes(
            _modal_amplification.lower(
                jnp.asarray(jac, complex),
                jnp.zeros((size, k), complex),
                jnp.zeros((k, size), complex),
                jnp.zeros(32),
                rk=rk,
            )
        )
    assert 0 < k < size
    measured = jacobian + eig + trials
    estimate = config.estimated_peak_bytes()
    assert _within(estimate, measured, 2.0), (estimate, jacobian, eig, trials, k)


# ------------------------------------------------------------------------------------------------
# seeds


SEEDED = [name for name in studies.STUDIES if hasattr(studies.get_study(name).Config, "seed")]


def test_every_study_but_the_pretrained_one_has_a_seed():
    assert set(studies.STUDIES) - set(SEEDED) == {"real-model-dynamics"}


@pytest.mark.parametrize("name", SEEDED)
@pytest.mark.parametrize("bad", [-1, 1.5, True, SEED_MAX + 1])
def test_a_bad_seed_is_refused_by_the_config(name, bad):
    smoke = studies.get_study(name).smoke_config()
    with pytest.raises(ConfigError) as info:
        dataclasses.replace(smoke, seed=bad)
    message = str(info.value)
    assert "\n" not in message
    assert f"seed={bad!r} is not allowed" in message
    # Negative or boolean: the usual range message; fractional or too large: the seed's range.
    assert ("[0, inf)" if bad in (-1, True) else f"[0, {SEED_MAX}]") in message
    for good in (0, SEED_MAX):
        assert dataclasses.replace(smoke, seed=good).seed == good


@pytest.mark.parametrize("name", ["repulsion", "train-digits"])
def test_the_command_line_refuses_a_negative_seed_before_making_the_folder(name, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["run", name, "--smoke", "--seed", "-1", "--out", str(out)]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert "seed=-1" in err and "Traceback" not in err


def test_memory_helpers_count_exact_bytes():
    assert _memory.array_bytes(3, 4, 5) == 480
    assert _memory.array_bytes(10**12, 32, 8, itemsize=4) == 4 * 256 * 10**12
    assert [_memory.scheme_evaluations(s) for s in ("lie", "strang", "yoshida4", "suzuki4")] == [
        2,
        6,
        36,
        60,
    ]
    # The encoder's parameters, counted from a real model's leaves.
    d, hidden, layers = 16, 40, 3
    sd = wb.architectures.random_encoder_state_dict(
        np.random.default_rng(0), d=d, num_layers=layers, dim_feedforward=hidden
    )
    assert sum(v.size for v in sd.values()) == _memory.encoder_parameters(d, hidden, layers)
    assert math.isclose(
        _memory.particle_trajectory_bytes(32, 8, integrator="euler"), 8 * (3 * 256 + 2 * 1024)
    )
