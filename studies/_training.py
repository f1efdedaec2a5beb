"""What the training studies share: names → option objects (at the edge, with the valid list in
the error), the model-size checks, the plan input and the float64 certificate."""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench as wb
import workbench.analysis as wba
import workbench.control as wbc

from ._config import ConfigError, check, check_choices, check_divides, check_positive, check_range

OPTIMIZERS = ("adamw", "adam", "sgd")


def check_model_fields(config: Any) -> None:
    """Checks of the model and discretization fields every training study has (`d`,
    `num_heads`, `num_layers`, `hidden`, `batch_size`, `steps_per_layer`, `learning_rate`,
    `clip`, `checkpoint_every`, `warmup`, `scheme`, `activation`)."""
    check_positive(config, "d", "num_heads", "num_layers", "hidden", "batch_size",
                   "steps_per_layer", "learning_rate", "clip", "checkpoint_every")  # fmt: skip
    check_divides(config, "num_heads", into="d")
    check_choices(config, "scheme", wb.registry.SPLITTING_SCHEMES)
    check_choices(config, "activation", wb.registry.ACTIVATIONS)
    check(
        config, "warmup", isinstance(config.warmup, int) and config.warmup >= 0, "an integer >= 0"
    )


def multi_resolution(config: Any) -> wbc.MultiResolution:
    """The config's `wbc.MultiResolution`: `resolutions` and `coarsen`, each coarse draw weighted
    `coarse_weight` against one step count (uniform draws at weight 1)."""
    ks = tuple(config.resolutions)
    fs = tuple(getattr(config, "coarsen", ()))
    w = float(getattr(config, "coarse_weight", 1.0))
    if not fs or w == 1.0:
        return wbc.MultiResolution(ks, coarsen=fs)
    weights = (1.0,) * len(ks) + (w,) * len(fs)
    return wbc.MultiResolution(ks, tuple(x / sum(weights) for x in weights), coarsen=fs)


DEPTH = {
    "multi-resolution": multi_resolution,
    "fixed": lambda config: wbc.OwnDiscretization(),
}
"""How a training study discretizes depth while training, by the config's `depth`."""


def check_depth_fields(config: Any) -> None:
    """`depth` is a name of `DEPTH`; `resolutions` and `coarsen` what `wbc.MultiResolution`
    accepts, each factor of `coarsen` dividing `num_layers`."""
    check_choices(config, "depth", DEPTH)
    check_resolutions(config)
    check_coarsen(config)


def check_coarsen(config: Any) -> None:
    """`coarsen` (when the config has it): distinct integers >= 2 dividing `num_layers`;
    `coarse_weight` a positive finite number."""
    if hasattr(config, "coarse_weight"):
        w = config.coarse_weight
        check(config, "coarse_weight", isinstance(w, (int, float)) and math.isfinite(w) and w > 0,
              "a positive number (1: every draw equally likely)")  # fmt: skip
    fs = getattr(config, "coarsen", ())
    try:
        wbc.MultiResolution((1,), coarsen=fs)
        ok = True
    except ValueError:
        ok = False
    check(config, "coarsen", ok, "distinct integers >= 2 (depth factors, e.g. 2), or '' for none")
    bad = [f for f in fs if config.num_layers % f]
    check(config, "coarsen", not bad,
          f"factors dividing num_layers={config.num_layers} (not {', '.join(map(str, bad))})")  # fmt: skip


def check_resolutions(config: Any) -> None:
    """`resolutions` is what `wbc.MultiResolution` accepts."""
    try:
        wbc.MultiResolution(config.resolutions)
        ok = True
    except ValueError:
        ok = False
    check(config, "resolutions", ok, "distinct positive integers, e.g. 1,2,4")


def check_training_fields(config: Any) -> None:
    """`check_model_fields` and the optimizer, gradient method, costs, depth training and plan
    of a training study."""
    check_model_fields(config)
    if hasattr(config, "depth"):
        check_depth_fields(config)
    check_positive(config, "weight_decay", "kinetic", "control_norm", "smoothness",
                   allow_zero=True)  # fmt: skip
    check_choices(config, "optimizer", OPTIMIZERS)
    check_choices(config, "gradient", GRADIENTS)
    check_choices(config, "checkpointing", CHECKPOINTING)
    check_range(config, "target_accuracy", 0.0, 1.0)
    check_range(config, "max_spread", 0.0, 1.0)
    if config.plan is not None:
        check(
            config,
            "plan",
            pathlib.Path(config.plan).is_file(),
            "a plan.json written by `workbench run plan`",
        )
        read_plan(config)


def read_plan(config: Any) -> wba.DiscretizationPlan:
    """The plan file of `config.plan`, read; `ConfigError` naming the file (one line) when it is
    not JSON or not a plan."""
    try:
        return wba.DiscretizationPlan.load(config.plan)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())  # one line, whatever the parser said
    # Outside the `except`: the ConfigError alone, not chained to the parser's error.
    check(config, "plan", False, f"the file is not a readable plan: {reason}")
    raise AssertionError("unreachable: check() raised")


LAYOUT_FIELDS = ("shard_params", "checkpoint_every")
"""Config fields of how a run is executed and saved, not what it computes: a run resumes with
other values (any device layout and count, another checkpoint interval)."""

ANALYSIS_FIELDS = {
    "studies.train_digits": ("certificate_examples", "target_accuracy", "max_spread"),
    "studies.train_sequence": ("certificate_examples", "target_accuracy", "max_spread"),
    "studies.depth_refinement": ("ladder", "examples", "max_change"),
    "studies.regularization_cost": ("plan_scheme", "tolerance", "ladder", "examples", "max_drop"),
    "studies.msa_vs_gradient": ("window", "max_excess"),
    "studies.continuous_depth": (
        "certificate_examples",
        "target_accuracy",
        "max_spread",
        "tolerances",
        "adaptive_solvers",
        "adaptive_margin",
        "timing_repeats",
    ),
    "studies.trained_model_analysis": (
        "certificate_examples",
        "target_accuracy",
        "max_spread",
        "num_exponents",
        "fine_factor",
        "lyapunov_tolerance",
        "tolerance",
        "plan_methods",
    ),
    "studies.scheme_architectures": (
        "certificate_examples",
        "target_accuracy",
        "max_spread",
        "timing_repeats",
    ),
}
"""Per training study (its module), the config fields read only after training — the
certificate, the error ladder of the trained model, the verdict's thresholds, the averaging
window — so changing them neither changes a trained trajectory nor blocks a resume. Fields that
choose *which* trainings run (`kinetic_weights`, `include_basic`, ...) stay in the identity."""


def fingerprint(config: Any) -> dict:
    """The run's identity, JSON-able: the study (its module) and every config field that decides
    the trained trajectories. Left out: `LAYOUT_FIELDS` and the study's `ANALYSIS_FIELDS`. The
    plan enters by its contents (`{"method", "steps_per_layer", "sha256"}` of the plan read
    back), not its path: a plan regenerated at the same path is another run; a plan moved
    elsewhere is the same. `wbc.train` adds the model, optimizer, data and seed it sees to this
    (its own fingerprint), and a study's trainings add their variant."""
    import hashlib
    import json

    module = type(config).__module__
    skip = set(LAYOUT_FIELDS) | set(ANALYSIS_FIELDS.get(module, ()))
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in skip}
    # Added after runs were written: absent while they have no effect (no coarse draws, or
    # coarse draws weighted like the others), so earlier run folders keep their identity.
    if not fields.get("coarsen") or fields.get("coarse_weight") == 1.0:
        fields.pop("coarse_weight", None)
    if fields.get("coarsen") == ():
        del fields["coarsen"]
    if fields.get("plan") is not None:
        plan = read_plan(config)
        text = json.dumps(plan.to_dict(), sort_keys=True)
        fields["plan"] = {
            "method": plan.method,
            "steps_per_layer": plan.steps_per_layer,
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }
    return json.loads(json.dumps({"study": module, **fields}))


def optimizer(config: Any, steps: int):
    """The optax optimizer of the config (a gradient method that brings its own, MSA, applies
    its own instead: `AbstractGradientMethod.optimizer`)."""
    import optax

    if config.optimizer == "adamw":
        return wbc.default_optimizer(
            config.learning_rate, steps=steps, warmup=config.warmup,
            weight_decay=config.weight_decay, clip=config.clip,
        )  # fmt: skip
    warmup = min(config.warmup, steps - 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, warmup, max(steps, warmup + 1), config.learning_rate * 0.01
    )
    base = optax.adam if config.optimizer == "adam" else optax.sgd
    return optax.chain(
        optax.clip_by_global_norm(config.clip),
        optax.inject_hyperparams(base)(learning_rate=schedule),
    )


CHECKPOINTING = {
    "none": lambda: None,
    "every-step": lambda: wb.CheckpointEvery(1),
    "binomial": lambda: wb.BinomialCheckpointing(),
}
"""What dto's backward pass stores, by the config's name."""

GRADIENTS = {
    "dto": lambda config: wbc.DiscretizeThenOptimize(CHECKPOINTING[config.checkpointing]()),
    "otd": lambda config: wbc.OptimizeThenDiscretize(),
    "msa": lambda config: wbc.SuccessiveApproximations(
        rho=getattr(config, "msa_rho", 1.0),
        inner_steps=getattr(config, "msa_inner_steps", 5),
        inner_learning_rate=getattr(config, "msa_inner_learning_rate", 1e-3),
        outer_learning_rate=config.learning_rate,
    ),
}
"""The gradient methods by the config's name: the exact gradient of the discrete model, the
continuous adjoint, Pontryagin's successive approximations."""


def gradient_method(config: Any):
    return GRADIENTS[config.gradient](config)


def train_step(config: Any, steps: int, **kwargs) -> wbc.TrainStep:
    """The config's `TrainStep`: its optimizer, objective, gradient method and depth training
    (`depth`, fixed for a study without the field) (`kwargs`: e.g. an augmentation)."""
    depth = DEPTH[getattr(config, "depth", "fixed")](config)
    return wbc.TrainStep(
        optimizer(config, steps), objective=objective(config), method=gradient_method(config),
        discretization=depth, **kwargs,
    )  # fmt: skip


def objective(config: Any) -> wbc.Objective:
    controls = []
    if config.control_norm:
        controls.append(wbc.ControlNorm(config.control_norm))
    if config.smoothness:
        controls.append(wbc.ControlSmoothness(config.smoothness))
    kinetic = wbc.KineticEnergy(config.kinetic) if config.kinetic else None
    return wbc.Objective(wbc.CrossEntropy(), kinetic, tuple(controls))


def load_plan(config: Any) -> wba.DiscretizationPlan | None:
    """The plan of `config.plan`, checked against the model: same width, depth, heads,
    feed-forward width and activation, a pre-norm equation, and a splitting scheme (what the
    trainer runs). A plan that records no activation predates the field: `workbench run plan`
    always planned GELU models, so it counts as `"gelu"`."""
    if config.plan is None:
        return None
    plan = read_plan(config)
    want = {"d": config.d, "num_layers": config.num_layers, "num_heads": config.num_heads,
            "dim_feedforward": config.hidden, "equation": "pre-norm",
            "activation": config.activation}  # fmt: skip
    have = {"activation": "gelu", **plan.model}
    wrong = [f"{k}: plan {have.get(k)!r}, model {v!r}" for k, v in want.items()
             if have.get(k) != v]  # fmt: skip
    if wrong:
        raise ConfigError(
            f"plan={config.plan!r} was written for another model ({'; '.join(wrong)}); make a "
            "plan for this model: workbench run plan --d ... --num-layers ... --equation pre-norm."
        )
    schemes = wb.registry.SPLITTING_SCHEMES
    if plan.method not in schemes:
        raise ConfigError(
            f"plan={config.plan!r} chose {plan.method!r}; training runs splitting schemes "
            f"({', '.join(schemes)}): make the plan with --methods {','.join(schemes)}."
        )
    return plan


def discretization(config: Any, plan) -> tuple[Any, int]:
    """(scheme object, steps per layer): the plan's when given, else the config's."""
    if plan is not None:
        return wb.registry.SPLITTING_SCHEMES[plan.method], plan.steps_per_layer
    return wb.registry.SPLITTING_SCHEMES[config.scheme], config.steps_per_layer


def activation(config: Any):
    return wb.registry.ACTIVATIONS[config.activation]


def digits_model(
    config: Any, key, scheme, steps_per_layer: int, *, kernel_size: int, stride: int
) -> wbc.ControlledModel:
    """The ViT-style digits model of the config's size: a patch embedding of 8×8 images
    (`kernel_size`, `stride`, zero padding `kernel_size // 2` when `stride == 1`, else none),
    a pre-norm equation with fresh controls (`wbc.random_transformer`), a linear head on the
    class token."""
    k1, k2 = jax.random.split(key)
    padding = kernel_size // 2 if stride == 1 else 0
    return wbc.ControlledModel(
        wbc.PatchEmbedding((8, 8), config.d, kernel_size=kernel_size, stride=stride,
                           padding=padding, key=k1),
        wbc.random_transformer(
            k2, d=config.d, num_heads=config.num_heads, num_layers=config.num_layers,
            hidden=config.hidden, activation=activation(config), scheme=scheme,
            steps_per_layer=steps_per_layer,
        ),
        wbc.ClassifierHead(config.d, 10),
    )  # fmt: skip


def subfolder(run_dir, name: str):
    """`run_dir / name` (None without a run folder): one durable training run of a study."""
    return None if run_dir is None else pathlib.Path(run_dir) / name


def solve_seconds(model, xs, repeats: int) -> float:
    """Median warm wall time of the jitted held-out solve of `model` (`vmap` over `xs`), over
    `repeats` runs after one compiling run."""
    return solve_seconds_side_by_side([model], xs, repeats)[0]


@eqx.filter_jit
def _batch_solve(model, xs):
    """`model` on every input of `xs`: the program a user deploys, the weights its arguments
    (not constants folded in), so models of one structure share one compilation."""
    return jax.vmap(model)(xs)


def solve_seconds_side_by_side(models, xs, repeats: int, *, outputs: bool = False):
    """Median warm wall times of the jitted held-out solves of `models` (`vmap` over `xs`),
    timed in interleaved rounds (one run of each model per round, `repeats` rounds after one
    compiling run each), so that a change of the machine's load between models shows in every
    model's times alike and their ratios compare like with like. The solve takes the weights as
    arguments (`_batch_solve`): models of one structure (another recipe or seed, a model read
    back from its folder) share one compiled program. With `outputs`, also the models' outputs
    on `xs` (NumPy, from the first runs): `(times, outputs)`."""
    import time

    first = [_batch_solve(m, xs) for m in models]
    jax.block_until_ready(first)
    times = [[] for _ in models]
    for _ in range(repeats):
        for m, t in zip(models, times):
            t0 = time.perf_counter()
            jax.block_until_ready(_batch_solve(m, xs))
            t.append(time.perf_counter() - t0)
    medians = [float(np.median(t)) for t in times]
    return (medians, [np.asarray(y) for y in first]) if outputs else medians


def training_seconds(trained: wbc.TrainResult, results: Any) -> float:
    """A run's training time: its cumulative training seconds (continued across resumes, so a
    finished run read back keeps its time) plus the first step's compilation when this call
    compiled one; the study's `results.wall_time_s` when nothing was logged."""
    if not trained.history:
        return results.wall_time_s
    compile_s = trained.compile_time_s
    return trained.history[-1]["elapsed_s"] + (compile_s if np.isfinite(compile_s) else 0.0)


def curve(result: wbc.TrainResult) -> dict:
    """The logged objective against the step and against the training seconds (`elapsed_s`:
    the run's cumulative training time, compilation excluded, continued across resumes, so
    never decreasing)."""
    rows = result.history
    return {
        "steps": np.asarray([r["step"] for r in rows], int),
        "seconds": np.asarray([r["elapsed_s"] for r in rows], float),
        "objective": np.asarray([r["objective"] for r in rows]),
    }


def to_float64(tree):
    """The tree with its floating arrays cast to float64 (call inside `jax.enable_x64(True)`)."""
    return jax.tree.map(lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, tree)


def certificate(
    model: wbc.ControlledModel, held_out, examples: int, plan, *, max_spread: float = 0.005
) -> dict:
    """`wbc.certify` of the trained model: its held-out accuracy under refinement (in its own
    dtype, on all of `held_out`) and, in float64 on the first `examples` held-out inputs
    embedded, its error ladder, order, stability and plan check."""
    accuracy = wbc.refinement_accuracy(model, held_out)
    with jax.enable_x64(True):
        m64 = to_float64(model)
        states = jax.vmap(m64.embedding)(jnp.asarray(np.asarray(held_out.inputs[:examples])))
        return wbc.certify(m64.transformer, states, plan=plan, accuracy=accuracy,
                           max_accuracy_spread=max_spread).to_dict()  # fmt: skip


def training_results(
    config: Any, result, task, plan, *, accuracy, steps: int, baseline: float, start: float
) -> dict:
    """The `Results` fields every single-run training study has: the held-out `accuracy`, the
    `baseline`'s accuracy, the final hash, throughput, wall time since `start`, the history and, with
    `config.certificate_examples`, the float64 certificate on that many held-out inputs."""
    import time

    certificate_dict = None
    if config.certificate_examples:
        certificate_dict = certificate(result.model, task.test, config.certificate_examples, plan,
                                       max_spread=config.max_spread)  # fmt: skip
    return {
        "config": config,
        "test_accuracy": float(accuracy),
        "final_params_sha256": result.params_sha256,
        "baseline_accuracy": baseline,
        "num_steps": steps,
        "resumed_from": result.resumed_from,
        "steps_per_second": result.steps_per_second,
        "compile_time_s": result.compile_time_s,
        "wall_time_s": time.perf_counter() - start,
        "num_devices": result.num_devices,
        **history(result.history),
        "certificate": certificate_dict,
    }


def certificate_artifacts(results: Any) -> dict:
    """`certificate.json`: the trained network against its equation (when computed)."""
    return {} if results.certificate is None else {"certificate.json": results.certificate}


def history(rows: list[dict]) -> dict:
    """The metrics rows as arrays: `history_steps`, `history_objective` (every logged step),
    `history_eval_steps`, `history_eval_accuracy` (the steps with a held-out evaluation)."""
    evals = [r for r in rows if r["eval_accuracy"] is not None]
    return {
        "history_steps": np.asarray([r["step"] for r in rows], int),
        "history_objective": np.asarray([r["objective"] for r in rows]),
        "history_eval_steps": np.asarray([r["step"] for r in evals], int),
        "history_eval_accuracy": np.asarray([r["eval_accuracy"] for r in evals]),
    }


def order_verdict(cert: dict) -> str:
    """The words "as expected", "reduced" or "raised": the certificate's observed order against the
    scheme's, within its `order_tolerance` (certificates written before `order_raised` existed
    say only whether the order was reduced)."""
    if cert.get("order_reduced"):
        return "reduced"
    return "raised" if cert.get("order_raised") else "as expected"


def certificate_lines(cert: dict | None) -> list[str]:
    """The certificate as a markdown table (no lines without one)."""
    from ._report import markdown_table

    if cert is None:
        return []
    order = "none fitted" if cert["observed_order"] is None else f"{cert['observed_order']:.2f}"
    plan = "no plan" if cert["plan_holds"] is None else str(cert["plan_holds"])
    acc = cert.get("accuracy")
    rows = [("consistent discretization", consistency_text(cert))]
    if acc is not None:
        rows.append(("held-out accuracy at own / refined steps per layer", " / ".join(
            [f"{100 * acc['accuracy']:.2f} % ({acc['steps_per_layer']})"]
            + [f"{100 * a:.2f} % ({k})" for k, a in zip(acc["refined_steps_per_layer"],
                                                     acc["refined_accuracies"])])))  # fmt: skip
        rows.append((f"{acc['second_scheme']} at {acc['second_steps_per_layer']} steps per layer",
                     f"{100 * acc['second_accuracy']:.2f} %"))  # fmt: skip
        rows.append(("accuracy spread (threshold)", f"{100 * acc['spread']:.2f} points "
                     f"({100 * cert['max_accuracy_spread']:.2f})"))  # fmt: skip
    rows += [
        ("discretization", f"{cert['scheme']}, {cert['steps_per_layer']} step(s)/layer"),
        ("max-abs error vs Dopri8 reference", f"{cert['error']:.3g}"),
        ("observed order (expected)", f"{order} ({cert['expected_order']} ± "
         f"{cert.get('order_tolerance', 0.3):g}: {order_verdict(cert)})"),
        ("largest stable step (trained step)",
         f"{cert['largest_stable_step']:.3g} ({cert['step']:.3g})"),
        ("plan holds", plan),
    ]  # fmt: skip
    return [
        "",
        "**Certificate** (float64, the trained weights against their equation):",
        "",
        markdown_table(["quantity", "value"], rows),
    ]


def consistency_text(cert: dict | None) -> str:
    """`consistent` in words: "yes", "no (reasons)", or "not decided"."""
    if cert is None or cert.get("consistent") is None:
        return "not decided (no certificate with held-out accuracies)"
    if cert["consistent"]:
        return "yes"
    return "no: " + "; ".join(cert["reasons"])


def training_verdict(results: Any, what: str) -> str:
    """The verdict of a single-run training study: "Yes" needs the accuracy target *and* a
    certificate saying the trained network is a consistent discretization of its equation."""
    c, acc, cert = results.config, results.test_accuracy, results.certificate
    accurate = acc >= c.target_accuracy
    consistent = cert is not None and cert.get("consistent") is True
    answer = "Yes" if accurate and consistent else "No"
    if cert is None or cert.get("consistent") is None:
        faithful = "no certificate decided whether it is a discretization of its equation"
    elif consistent:
        spread = 100 * cert["accuracy"]["spread"]
        faithful = (f"a consistent discretization of its equation (accuracy within {spread:.2f} "
                    f"points from {cert['steps_per_layer']} to "
                    f"{cert['accuracy']['second_steps_per_layer']} steps per layer and with "
                    f"{cert['accuracy']['second_scheme']})")  # fmt: skip
    else:
        faithful = "not a consistent discretization of its equation: " + "; ".join(cert["reasons"])
    return (
        f"{answer}. Held-out {what} {100 * acc:.2f} % against the target "
        f"{100 * c.target_accuracy:.1f} %, and {faithful}"
    )


def training_figure(results: Any, title: str, accuracy_label: str):
    """Objective (log scale) and held-out accuracy against the step, with the target."""
    from ._report import new_figure

    fig, ax = new_figure(figsize=(6.5, 4.2))
    ax.semilogy(results.history_steps, results.history_objective, label="objective (train batch)")
    ax.set(xlabel="step", ylabel="objective")
    ax.grid(True, which="both", alpha=0.3)
    twin = ax.twinx()
    twin.plot(results.history_eval_steps, results.history_eval_accuracy, "o-", color="C1",
              label=accuracy_label)  # fmt: skip
    twin.axhline(results.config.target_accuracy, color="C1", ls="--", lw=1)
    twin.set_ylabel(accuracy_label)
    ax.set_title(f"{title}, seed {results.config.seed}")
    lines, more = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="center right")
    return fig


CONTROLS = ("interpolated", "piecewise")


def with_controls(model, kind: str):
    """`model` with `Interpolated` controls (`kind="interpolated"`) or as built."""
    return wbc.interpolate_controls(model) if kind == "interpolated" else model


def refinement_ladder(model: wbc.ControlledModel, inputs, ladder, *, scheme=None,
                      reference_steps: int = 64) -> dict:  # fmt: skip
    """How far the trained model's solve is from its equation's exact flow (float64).

    For every input (embedded), the max-abs error of the state at `T` with `scheme` (default: the
    model's) at each `ladder` entry of steps per layer, against a Dopri8 reference with
    `reference_steps` per layer; the worst input per entry, and `fit_order` on them.
    **Returns:** `{"steps_per_layer", "errors", "observed_order", "order_ci"}` (order `None` when
    no window fits)."""
    with jax.enable_x64(True):
        m64 = to_float64(model)
        tr = m64.transformer
        scheme = tr.scheme if scheme is None else scheme
        states = jax.vmap(m64.embedding)(jnp.asarray(np.asarray(inputs), jnp.float64))
        steps = sorted(int(s) for s in ladder)
        errors = np.zeros(len(steps))
        for u0 in states:
            ref = wba.reference_solution(tr.equation, u0, steps_per_layer=reference_steps)
            lad = wba.error_ladder(tr.equation, u0, scheme, steps, ref, min_points=1, repeats=1)
            errors = np.maximum(errors, lad.errors)
        h = tr.equation.piece_length / np.asarray(steps, float)
        fit = wba.fit_order(h, errors, expected=scheme.order(), throw=False)
        fit = fit if fit.success else None
    return {
        "steps_per_layer": steps,
        "errors": errors,
        "observed_order": None if fit is None else float(fit.order),
        "order_ci": None if fit is None else (float(fit.ci_low), float(fit.ci_high)),
    }
