"""Which basis in depth-time should a Transformer's controls live in? The same equation trained
with its controls in each basis (a network's layers, piecewise linear, Legendre polynomials),
`seeds` seeds each, on a task whose held-out set resolves a tenth of a point (MNIST-1D: 10 000
held-out signals), and per basis:

- **accuracy** at the model's own grid, and under **refinement** (1–16× its steps), with a second
  scheme (Strang at 16×) and, for a one-piece basis, at step counts that are not multiples of
  its layer count (`off_grid`): each a **paired** comparison with the own grid on the same
  examples (`wb.analysis.paired_difference`: the difference with its Newcombe 95 % interval);
- the **observed order** in depth of the trained network's output (float64, against a Dopri8
  reference): Lie–Trotter and Strang. A smooth basis should show the scheme's order on the
  whole network;
- **compression** without data or retraining: the controls projected onto `1/f` of the basis
  functions (`wbc.coarsen_depth`: the mean of runs of layers, or the first Legendre
  coefficients) and solved with `1/f` of the steps: accuracy against parameters and
  evaluations, paired with the own grid;
- **adaptive inference** over the whole depth (`wbc.adaptive_accuracy`, each of
  `adaptive_solvers` at each of `tolerances`, the first step `first_step · T`, at most a
  layer): mean counted field evaluations per example
  against the cheapest fixed Lie grid that is as accurate as the 16× grid (paired), and the goal
  of fewer than `evaluation_fraction · num_layers` evaluations;
- **training time**.

One field evaluation is the whole field (attention and feed-forward once); a Lie step is one.
The question: does the smooth basis reach `target_accuracy` on every seed, keep every refinement
within `margin` points (paired interval inside ±margin), solve adaptively under
`evaluation_fraction · num_layers` evaluations within `margin` of its 16× grid, and lose at
most `compression_margin` points at half its basis and half its steps? The verdict is computed
from those numbers and names each miss.

Every training is a `train-digits` run in its own subfolder (`<basis>-seed<k>/`, resumable,
`wbc.load_run` and `--weights` read it).

Figures: `compression` (accuracy against basis functions, per basis), `adaptive` (accuracy
against field evaluations: fixed grids and adaptive solves, per basis).
"""

from __future__ import annotations

import dataclasses
import time

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import workbench.analysis as wba
import workbench.control as wbc
from studies._toolkit import training as T
from studies._toolkit.config import (
    check,
    check_choices,
    check_nonempty,
    check_positive,
    check_seed,
)
from studies._toolkit.fields import (
    Costs,
    Epochs,
    Method,
    Smoothness,
    TrainingFields,
    WeightDecay,
    defaults,
)
from studies.training import train_digits
from workbench.control._data import even_batches
from workbench.registry import ODE_SOLVERS

NAME = "control-bases"
SUMMARY = (
    "Controls in depth-time bases side by side: accuracy, refinement, orders, compression by "
    "projection and adaptive solves, paired on MNIST-1D's 10 000 held-out signals."
)

ADAPTIVE_SOLVERS = tuple(
    name
    for name, solver in ODE_SOLVERS.items()
    if isinstance(solver, diffrax.AbstractAdaptiveSolver)
)
FACTORS = (1, 2, 4, 8, 16)
"""Refinements of the model's own grid."""


@dataclasses.dataclass(frozen=True)
@defaults(
    kinetic=0.05,
    smoothness=0.1,
    acceleration=5.0,
    epochs=60,
    num_layers=8,
    target_accuracy=0.96,
    checkpointing="every-step",
)
class Config(Method, Costs, Smoothness, Epochs, WeightDecay, TrainingFields):
    task: str = "mnist1d"
    """The data (`train-digits --task`): mnist1d, digits or mnist5000."""
    bases: tuple[str, ...] = ("layers", "legendre")
    """The controls' bases compared (`train-digits --basis`): layers, legendre, interpolated,
    hypernetwork."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """One training per basis and seed (the data split and the initialization)."""
    resolutions: tuple[int, ...] = (1, 2, 4)
    """Steps per layer drawn while training a basis with layers (layers, interpolated)."""
    grid_steps: tuple[int, ...] = (2, 3, 4, 8, 16)
    """Total steps over [0, T] drawn while training a one-piece basis (legendre, hypernetwork):
    need not be multiples of the layer count."""
    kernel_size: int = 5
    """Width of the patch embedding's kernel (`train-digits --kernel-size`): each MNIST-1D token
    sees 5 samples."""
    shift: int = 2
    """Random shifts of the training inputs (`train-digits --shift`): MNIST-1D's signals move by
    up to this many samples."""
    coarsen: tuple[int, ...] = (2,)
    """Coarse-basis draws while training (layers, legendre; '' for none)."""
    off_grid: tuple[int, ...] = (3, 5, 7, 12)
    """Total step counts, not multiples of num_layers, at which a one-piece basis is also
    evaluated (paired with its own grid)."""
    compress: tuple[int, ...] = (2, 4)
    """Compression factors: the basis and the steps divided by each."""
    tolerances: tuple[float, ...] = (3e-2, 2e-2, 1.5e-2, 1e-2)
    """rtol = atol of the adaptive solves (PID controller)."""
    adaptive_solvers: tuple[str, ...] = ("heun", "bosh3")
    """diffrax solvers of the adaptive solves, by name."""
    first_step: float = 0.5
    """The adaptive solves' first step tried (`dt0`), as a fraction of the depth T, at most one
    piece of the controls (a layer of a network)."""
    margin: float = 0.3
    """Points within which a paired interval must lie: refinement, second scheme, off-grid
    step counts, adaptive solves against the 16× grid."""
    compression_margin: float = 0.5
    """Points a half-basis, half-steps compression may lose (its paired difference)."""
    evaluation_fraction: float = 0.6
    """The adaptive goal: mean field evaluations per example at most this times num_layers."""
    order_examples: int = 2
    """Held-out examples of the float64 order fits."""

    def __post_init__(self):
        T.check_training_fields(self)
        check_seed(self)  # (`seeds` chooses the trainings; `seed` is checked like every study's)
        check_positive(self, "epochs", "margin", "compression_margin", "evaluation_fraction")
        check_choices(self, "task", train_digits.TASKS)
        check_nonempty(self, "bases")
        check_choices(self, "bases", tuple(T.BASES))
        check(
            self,
            "seeds",
            len(self.seeds) >= 1 and all(isinstance(s, int) and s >= 0 for s in self.seeds),
            "non-negative integers",
        )
        check(
            self,
            "grid_steps",
            len(self.grid_steps) >= 1
            and all(isinstance(k, int) and k >= 1 for k in self.grid_steps),
            "positive integers (total steps over [0, T])",
        )
        check(
            self,
            "off_grid",
            all(isinstance(k, int) and k >= 1 for k in self.off_grid),
            "positive integers",
        )
        check(
            self,
            "compress",
            all(isinstance(f, int) and f >= 2 and self.num_layers % f == 0 for f in self.compress),
            f"integers >= 2 dividing num_layers={self.num_layers}",
        )
        check(
            self,
            "tolerances",
            len(self.tolerances) >= 1
            and all(isinstance(t, (int, float)) and 0 < t < 1 for t in self.tolerances),
            "numbers in (0, 1)",
        )
        check(
            self,
            "first_step",
            isinstance(self.first_step, (int, float)) and 0 < self.first_step <= 1,
            "a fraction of the depth in (0, 1]",
        )
        check_nonempty(self, "adaptive_solvers")
        check_choices(self, "adaptive_solvers", ADAPTIVE_SOLVERS)
        check(
            self,
            "steps_per_layer",
            self.steps_per_layer == 1,
            "1 (every basis is trained with its num_layers steps as its own grid)",
        )
        T.check_resolutions(self)
        T.check_coarsen(self)
        check_positive(self, "order_examples", allow_zero=True)

    def digits_config(self, basis: str, seed: int) -> train_digits.Config:
        """The `train-digits` config of one basis and seed."""
        names = {f.name for f in dataclasses.fields(train_digits.Config)}
        shared = {k: v for k, v in dataclasses.asdict(self).items() if k in names}
        one_piece = basis in T.ONE_PIECE
        return train_digits.Config(
            **{
                **shared,
                "basis": basis,
                "seed": seed,
                "resolutions": self.grid_steps if one_piece else self.resolutions,
                "coarsen": self.coarsen if basis in T.NESTED else (),
            }
        )

    def estimated_peak_bytes(self) -> int:
        return max(self.digits_config(b, self.seeds[0]).estimated_peak_bytes() for b in self.bases)


run_identity = T.fingerprint


def smoke_config() -> Config:
    return Config(
        task="digits",
        seeds=(0,),
        epochs=4,
        d=16,
        num_heads=2,
        num_layers=2,
        hidden=32,
        warmup=10,
        batch_size=32,
        checkpoint_every=50,
        certificate_examples=0,
        target_accuracy=0.5,
        grid_steps=(1, 2, 3),
        off_grid=(3,),
        compress=(2,),
        tolerances=(1e-1,),
        adaptive_solvers=("heun",),
        order_examples=1,
    )


@dataclasses.dataclass
class Results:
    config: Config
    runs: list
    """One dict per (basis, seed): the measurements described in the module docstring."""
    wall_time_s: float


@eqx.filter_jit
def _argmax(model, xs):
    return jnp.argmax(jax.vmap(model)(xs), -1)


def correct(model, data, batch_size: int = 1000) -> np.ndarray:
    """Per-example correctness of `model` on `data` (labels `>= 0`), in the data's order."""
    hits = []
    for indices, length in even_batches(len(data), batch_size):
        guess = np.asarray(_argmax(model, jnp.asarray(data.inputs[indices])))[:length]
        ys = np.asarray(data.targets[indices[:length]])
        hits.append(guess == ys)
    return np.concatenate(hits)


def _paired(own, other) -> dict:
    p = wba.paired_difference(own, other)
    return {
        "accuracy": float(np.mean(other)),
        "difference": p.difference,
        "low": p.low,
        "high": p.high,
        "p_value": p.p_value,
    }


def _num_parameters(model) -> int:
    leaves = jax.tree.leaves(eqx.filter(model.transformer.equation, eqx.is_inexact_array))
    return int(sum(x.size for x in leaves))


def _total_steps(model) -> int:
    tr = model.transformer
    return tr.num_layers * tr.steps_per_layer


def _measure(config: Config, basis: str, seed: int, model, results, trained, test) -> dict:
    import workbench as wb

    lie = wb.schemes.LieTrotter()
    tr = model.transformer
    layers = tr.num_layers
    own_steps = _total_steps(model)
    one_piece = layers == 1
    base = model.rediscretize(lie, tr.steps_per_layer)
    own = correct(base, test)

    def at(steps, scheme=lie):
        return model.rediscretize(scheme, steps // layers)

    solved = {own_steps: own}

    def lie_correct(steps):
        """Per-example correctness with `steps` Lie steps, each grid solved once."""
        if steps not in solved:
            solved[steps] = correct(at(steps), test)
        return solved[steps]

    refinement = [
        {"steps": f * own_steps, **_paired(own, lie_correct(f * own_steps))} for f in FACTORS[1:]
    ]
    second = {
        "scheme": "Strang",
        "steps": FACTORS[-1] * own_steps,
        **_paired(own, correct(at(FACTORS[-1] * own_steps, wb.schemes.Strang()), test)),
    }
    off_grid = (
        [{"steps": k, **_paired(own, lie_correct(k))} for k in config.off_grid] if one_piece else []
    )
    # Orders in depth (float64) on a few held-out inputs, Lie and Strang.
    orders = {}
    if config.order_examples:
        xs = test.inputs[: config.order_examples]
        ladder = [own_steps // layers * f for f in (1, 2, 4, 8, 16)]
        for name, scheme in (("LieTrotter", lie), ("Strang", wb.schemes.Strang())):
            lad = T.refinement_ladder(
                model, xs, ladder, scheme=scheme, reference_steps=64 * max(1, ladder[-1] // 16)
            )
            orders[name] = {
                "observed": lad["observed_order"],
                "ci": lad["order_ci"],
                "expected": scheme.order(),
            }
    # Compression: 1/f of the basis functions and of the steps.
    functions = own_steps  # one function (layer or coefficient) per step at the own grid
    compression = [
        {
            "factor": 1,
            "functions": functions,
            "parameters": _num_parameters(base),
            "evaluations": own_steps,
            "accuracy": float(np.mean(own)),
            "difference": 0.0,
            "low": 0.0,
            "high": 0.0,
            "p_value": 1.0,
        }
    ]
    for f in config.compress:
        coarse = wbc.coarsen_depth(base, f)
        if one_piece:
            coarse = coarse.rediscretize(lie, max(1, own_steps // f))
        compression.append(
            {
                "factor": f,
                "functions": functions // f,
                "parameters": _num_parameters(coarse),
                "evaluations": _total_steps(coarse),
                **_paired(own, correct(coarse, test)),
            }
        )
    # Fixed Lie grids, for the cheapest one as accurate as the 16× grid.
    fine = lie_correct(FACTORS[-1] * own_steps)
    grid_steps = sorted(
        {k for k in (1, 2, 3, 4, 6, 8, 12, 16) if one_piece or k % layers == 0}
        | {f * own_steps for f in FACTORS}
    )
    fixed = []
    for k in grid_steps:
        c = lie_correct(k)
        fixed.append({"steps": k, "evaluations": k, **_paired(fine, c)})
    as_accurate = [g for g in fixed if -config.margin <= g["low"] and g["high"] <= config.margin]
    cheapest_fixed = min(as_accurate, key=lambda g: g["evaluations"]) if as_accurate else None
    adaptive = []
    dt0 = min(config.first_step * tr.equation.t1, tr.equation.piece_length)
    for name in config.adaptive_solvers:
        for tol in config.tolerances:
            start = time.perf_counter()
            run = wbc.adaptive_accuracy(
                model, test, solver=ODE_SOLVERS[name], rtol=tol, atol=tol, dt0=dt0
            )
            seconds = time.perf_counter() - start
            entry = run.to_dict()
            entry["seconds"] = seconds
            hits = getattr(run, "correct", None)
            if hits is not None:
                entry.update({k: v for k, v in _paired(fine, hits).items() if k != "accuracy"})
            adaptive.append(entry)

    def good(entry):
        if "low" in entry:
            return -config.margin <= entry["low"] and entry["high"] <= config.margin
        return abs(entry["accuracy"] - float(np.mean(fine))) * 100 <= config.margin

    ok = [a for a in adaptive if good(a) and not a.get("failed")]
    cheapest_adaptive = min(ok, key=lambda a: a["mean_evaluations"]) if ok else None
    return {
        "basis": basis,
        "seed": seed,
        "layers_worth": config.num_layers,
        "one_piece": one_piece,
        "accuracy": float(np.mean(own)),
        "own_steps": own_steps,
        "refinement": refinement,
        "second_scheme": second,
        "off_grid": off_grid,
        "orders": orders,
        "compression": compression,
        "fixed": fixed,
        "fine_accuracy": float(np.mean(fine)),
        "cheapest_fixed": cheapest_fixed,
        "adaptive": adaptive,
        "cheapest_adaptive": cheapest_adaptive,
        "training_time_s": T.training_seconds(trained, results),
        "certificate_consistent": (results.certificate or {}).get("consistent"),
    }


def compute(config: Config, *, run_dir=None) -> Results:
    start = time.perf_counter()
    runs = []
    with jax.enable_x64(False):
        for basis in config.bases:
            for seed in config.seeds:
                digits = config.digits_config(basis, seed)
                results, trained = train_digits.train(
                    digits, run_dir=T.subfolder(run_dir, f"{basis}-seed{seed}")
                )
                test = train_digits._task(digits).test
                runs.append(_measure(config, basis, seed, trained.model, results, trained, test))
    return Results(config=config, runs=runs, wall_time_s=time.perf_counter() - start)


def _within(entry: dict, points: float) -> bool:
    return -points <= entry["low"] and entry["high"] <= points


def misses(config: Config, run: dict) -> list[str]:
    """What one (basis, seed) run misses of the study's goals, in words (empty: none)."""
    m = config.margin
    out = []
    if run["accuracy"] < config.target_accuracy:
        out.append(f"accuracy {100 * run['accuracy']:.2f} % < {100 * config.target_accuracy:.1f} %")
    for r in [*run["refinement"], run["second_scheme"], *run["off_grid"]]:
        if not _within(r, m):
            name = r.get("scheme", "Lie")
            out.append(
                f"{name} at {r['steps']} steps: {r['difference']:+.2f} [{r['low']:+.2f}, "
                f"{r['high']:+.2f}] not within ±{m:g}"
            )
    half = [c for c in run["compression"] if c["factor"] == 2]
    if half and half[0]["difference"] < -config.compression_margin:
        out.append(
            f"half basis and steps lose {-half[0]['difference']:.2f} points > "
            f"{config.compression_margin:g}"
        )
    if run["one_piece"]:
        goal = config.evaluation_fraction * run["layers_worth"]
        best = run["cheapest_adaptive"]
        if best is None:
            out.append(f"no adaptive solve within ±{m:g} points of the 16× grid")
        elif best["mean_evaluations"] > goal:
            out.append(
                f"cheapest adaptive solve {best['mean_evaluations']:.1f} evaluations > "
                f"{goal:.1f} ({config.evaluation_fraction:g} · {run['layers_worth']})"
            )
        for name, o in run["orders"].items():
            if o["observed"] is None or abs(o["observed"] - o["expected"]) > 0.3:
                seen = "none" if o["observed"] is None else f"{o['observed']:.2f}"
                out.append(f"{name} order {seen}, expected {o['expected']} ± 0.3")
    return out


def verdict(results: Results) -> str:
    c = results.config
    smooth = [b for b in c.bases if b in T.ONE_PIECE]
    parts = []
    for basis in c.bases:
        runs = [r for r in results.runs if r["basis"] == basis]
        accs = ", ".join(f"{100 * r['accuracy']:.2f}" for r in runs)
        missed = sorted({x for r in runs for x in misses(c, r)})
        parts.append(
            f"{basis} ({accs} %): " + ("meets every goal" if not missed else "; ".join(missed))
        )
    if not smooth:
        return "No answer: no smooth basis (legendre, hypernetwork) was trained. " + " | ".join(
            parts
        )
    ok = all(not misses(c, r) for r in results.runs if r["basis"] in smooth)
    return ("Yes. " if ok else "No. ") + " | ".join(parts)


def report(results: Results) -> str:
    from studies._toolkit.report import markdown_table

    c = results.config
    head = ["basis", "seed", "accuracy", *(f"{f}×" for f in FACTORS[1:]), "Strang 16×"]
    head += ["off-grid steps", "Lie / Strang order", "training"]
    rows = []

    def cell(r):
        return f"{r['difference']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}]"

    for r in results.runs:
        orders = " / ".join(
            "n/a" if o["observed"] is None else f"{o['observed']:.2f}" for o in r["orders"].values()
        )
        rows.append(
            (
                r["basis"],
                r["seed"],
                f"{100 * r['accuracy']:.2f} % ({r['own_steps']} steps)",
                *(cell(x) for x in r["refinement"]),
                cell(r["second_scheme"]),
                "; ".join(f"{x['steps']}: {cell(x)}" for x in r["off_grid"]) or "n/a",
                orders or "n/a",
                f"{r['training_time_s']:.0f} s",
            )
        )
    chead = ["basis", "seed", "functions", "parameters", "evaluations", "accuracy", "paired"]
    crows = [
        (
            r["basis"],
            r["seed"],
            x["functions"],
            x["parameters"],
            x["evaluations"],
            f"{100 * x['accuracy']:.2f} %",
            cell(x),
        )
        for r in results.runs
        for x in r["compression"]
    ]
    ahead = ["basis", "seed", "solver", "tol", "accuracy", "evaluations (mean, range)", "seconds"]
    arows = [
        (
            r["basis"],
            r["seed"],
            a["solver"],
            f"{a['rtol']:g}",
            f"{100 * a['accuracy']:.2f} %" + (f" ({cell(a)})" if "low" in a else ""),
            f"{a['mean_evaluations']:.2f} ({a['min_evaluations']}–{a['max_evaluations']})",
            f"{a['seconds']:.1f}",
        )
        for r in results.runs
        for a in r["adaptive"]
    ]
    lines = []
    for r in results.runs:
        f, a = r["cheapest_fixed"], r["cheapest_adaptive"]
        lines.append(
            f"- {r['basis']} seed {r['seed']}: 16× grid {100 * r['fine_accuracy']:.2f} %; "
            "cheapest fixed Lie grid within the margin: "
            + ("none" if f is None else f"{f['evaluations']} evaluations")
            + "; cheapest adaptive solve: "
            + (
                "none"
                if a is None
                else f"{a['mean_evaluations']:.2f} evaluations ({a['solver']}, tol {a['rtol']:g})"
            )
            + f"; goal ≤ {c.evaluation_fraction * r['layers_worth']:.1f}."
        )
    return "\n".join(
        [
            f"{c.task}, d = {c.d}, {c.num_layers} layers' worth of controls per basis, "
            f"{c.epochs} epochs, seeds {list(c.seeds)}. Paired differences in points against the "
            "own grid [95 % interval]:",
            "",
            markdown_table(head, rows),
            "",
            "Compression by projection (no data, no retraining), paired with the own grid:",
            "",
            markdown_table(chead, crows),
            "",
            "Adaptive solves over the whole depth (PID controller; counted field evaluations per "
            "example; paired with the 16× grid where given):",
            "",
            markdown_table(ahead, arows),
            "",
            *lines,
            "",
            f"Wall time {results.wall_time_s:.0f} s.",
        ]
    )


def figures(results: Results) -> dict:
    from studies._toolkit.report import new_figure

    fig, ax = new_figure(figsize=(6.5, 4.2))
    fig2, ax2 = new_figure(figsize=(6.5, 4.2))
    for i, r in enumerate(results.runs):
        label = f"{r['basis']}, seed {r['seed']}"
        comp = r["compression"]
        ax.plot(
            [x["functions"] for x in comp],
            [100 * x["accuracy"] for x in comp],
            "o-",
            color=f"C{i}",
            label=label,
        )
        ax2.plot(
            [g["evaluations"] for g in r["fixed"]],
            [100 * g["accuracy"] for g in r["fixed"]],
            "o-",
            color=f"C{i}",
            label=f"{label}, fixed Lie grids",
        )
        ax2.plot(
            [a["mean_evaluations"] for a in r["adaptive"]],
            [100 * a["accuracy"] for a in r["adaptive"]],
            "^",
            color=f"C{i}",
            label=f"{label}, adaptive",
        )
    ax.set(
        xlabel="basis functions kept (steps alike)",
        ylabel="held-out accuracy (%)",
        title="compression by projection",
    )
    ax2.set_xscale("log", base=2)
    ax2.set(xlabel="field evaluations per example", ylabel="held-out accuracy (%)")
    for a in (ax, ax2):
        a.grid(True, alpha=0.3)
        a.legend(fontsize=7)
    return {"compression": fig, "adaptive": fig2}
