"""What a training study reports of a run: the `Results` fields every single-run training study
has, the logged history and training time, the warm solve times of trained models, and the
verdict and figure of a single run."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import numpy as np

import workbench.control as wbc

from .certificate import certificate, unit_of


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


def training_results(
    config: Any, result, task, plan, *, accuracy, steps: int, baseline: float, start: float
) -> dict:
    """The `Results` fields every single-run training study has: the held-out `accuracy`, the
    `baseline`'s accuracy, the final hash, throughput, wall time since `start`, the history and, with
    `config.certificate_examples`, the float64 certificate on that many held-out inputs."""
    import time

    certificate_dict = None
    if config.certificate_examples:
        certificate_dict = certificate(
            result.model, task.test, config.certificate_examples, plan, max_spread=config.max_spread
        )
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
        faithful = (
            f"a consistent discretization of its equation (accuracy within {spread:.2f} "
            f"points from {cert['steps_per_layer']} to "
            f"{cert['accuracy']['second_steps_per_layer']} {unit_of(cert)} and with "
            f"{cert['accuracy']['second_scheme']})"
        )
    else:
        faithful = "not a consistent discretization of its equation: " + "; ".join(cert["reasons"])
    return (
        f"{answer}. Held-out {what} {100 * acc:.2f} % against the target "
        f"{100 * c.target_accuracy:.1f} %, and {faithful}"
    )


def training_figure(results: Any, title: str, accuracy_label: str):
    """Objective (log scale) and held-out accuracy against the step, with the target."""
    from ..report import new_figure

    fig, ax = new_figure(figsize=(6.5, 4.2))
    ax.semilogy(results.history_steps, results.history_objective, label="objective (train batch)")
    ax.set(xlabel="step", ylabel="objective")
    ax.grid(True, which="both", alpha=0.3)
    twin = ax.twinx()
    twin.plot(
        results.history_eval_steps,
        results.history_eval_accuracy,
        "o-",
        color="C1",
        label=accuracy_label,
    )
    twin.axhline(results.config.target_accuracy, color="C1", ls="--", lw=1)
    twin.set_ylabel(accuracy_label)
    ax.set_title(f"{title}, seed {results.config.seed}")
    lines, more = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="center right")
    return fig
