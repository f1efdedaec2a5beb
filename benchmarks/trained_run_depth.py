"""A trained MNIST-1D run folder in depth-time: how its held-out accuracy moves with the grid,
the basis and an adaptive solver, every comparison paired on the same 10 000 held-out signals.

For the run in `RUN` (`wbc.load_run`: a `train-digits --task mnist1d` folder, any basis), with
`own` its own grid and `fine` 16 × its own steps (Lie–Trotter):

- `off_grid_vs_own`: Lie at step counts that are not multiples of its layers, against `own`;
- `fixed_vs_fine`: Lie at a few coarse step counts against `fine`, with wall time per example
  (compiled, the second call) — the fixed grids an adaptive solve has to beat;
- `compression_vs_own`: `wbc.coarsen_depth(model, f)` solved with `1/f` of the steps (no data,
  no retraining), against `own`;
- `adaptive_vs_fine`: `wbc.adaptive_accuracy` with each solver and tolerance (`rtol = atol`),
  first step `first_step · T`, against `fine`: counted field evaluations per example and wall
  time per example (the second call, compiled);
- `orders` (unless `--orders 0`): `fit_order` of Lie and Strang on the output state of that many
  held-out inputs in float64, at 4–64 steps, against Dopri8 with 256 steps.

Every difference is `wb.analysis.paired_difference` (points, Newcombe 95 % interval, exact
McNemar p). Run: `python benchmarks/trained_run_depth.py RUN [--out PATH] [--orders 2]`.
"""

import argparse
import json
import time

import diffrax
import numpy as np

import workbench as wb
import workbench.analysis as wba
import workbench.control as wbc
from studies._toolkit import training as T
from studies.training.control_bases import correct

SOLVERS = {"heun": diffrax.Heun(), "bosh3": diffrax.Bosh3()}


def _pair(a, b) -> dict:
    p = wba.paired_difference(a, b)
    return {
        "accuracy": float(np.mean(b)),
        "difference": p.difference,
        "low": p.low,
        "high": p.high,
        "p_value": p.p_value,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--out", default=None)
    parser.add_argument("--off-grid", type=int, nargs="*", default=[3, 5, 7, 12])
    parser.add_argument("--fixed", type=int, nargs="*", default=[2, 3, 4, 8])
    parser.add_argument("--compress", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--heun", type=float, nargs="*", default=[0.03, 0.02, 0.015, 0.01])
    parser.add_argument("--bosh3", type=float, nargs="*", default=[0.02, 0.01])
    parser.add_argument("--first-step", type=float, default=0.5)
    parser.add_argument("--orders", type=int, default=2)
    args = parser.parse_args(argv)

    model = wbc.load_run(args.run)
    test = wbc.mnist1d(0).test
    lie = wb.schemes.LieTrotter()
    tr = model.transformer
    own_steps = tr.num_layers * tr.steps_per_layer
    solved = {}

    def at(steps):
        """(correctness, seconds per example) of Lie with `steps` in all, each grid once."""
        if steps not in solved:
            m = model.rediscretize(lie, steps // tr.num_layers)
            correct(m, test)  # compiles
            start = time.perf_counter()
            solved[steps] = (correct(m, test), (time.perf_counter() - start) / len(test))
        return solved[steps]

    own, fine = at(own_steps)[0], at(16 * own_steps)[0]
    out = {
        "run": args.run,
        "own_steps": own_steps,
        "own_accuracy": float(own.mean()),
        "fine_accuracy": float(fine.mean()),
        "off_grid_vs_own": [{"steps": k, **_pair(own, at(k)[0])} for k in args.off_grid],
        "fixed_vs_fine": [
            {"steps": k, "seconds_per_example": at(k)[1], **_pair(fine, at(k)[0])}
            for k in args.fixed
        ],
        "compression_vs_own": [],
        "adaptive_vs_fine": [],
    }
    for f in args.compress:
        coarse = wbc.coarsen_depth(model, f).rediscretize(lie, max(1, tr.steps_per_layer // f))
        out["compression_vs_own"].append({"factor": f, **_pair(own, correct(coarse, test))})
    dt0 = min(args.first_step * tr.equation.t1, tr.equation.piece_length)
    for name, tolerances in (("heun", args.heun), ("bosh3", args.bosh3)):
        for tol in tolerances:
            kwargs = dict(solver=SOLVERS[name], rtol=tol, atol=tol, dt0=dt0)
            wbc.adaptive_accuracy(model, test, **kwargs)  # compiles and warms
            r = wbc.adaptive_accuracy(model, test, **kwargs)
            out["adaptive_vs_fine"].append(
                {
                    "solver": name,
                    "tol": tol,
                    "dt0": r.dt0,
                    "mean_evaluations": r.mean_evaluations,
                    "min": int(r.evaluations.min()),
                    "max": int(r.evaluations.max()),
                    "seconds_per_example": r.seconds_per_example,
                    "failed": r.failed,
                    **_pair(fine, r.correct),
                }
            )
            print(out["adaptive_vs_fine"][-1], flush=True)
    if args.orders:
        xs = test.inputs[: args.orders]
        out["orders"] = {}
        for name, scheme in (("LieTrotter", lie), ("Strang", wb.schemes.Strang())):
            lad = T.refinement_ladder(
                model, xs, [4, 8, 16, 32, 64], scheme=scheme, reference_steps=256
            )
            out["orders"][name] = {
                "steps": lad["steps_per_layer"],
                "errors": [float(e) for e in lad["errors"]],
                "observed": lad["observed_order"],
                "ci": lad["order_ci"],
            }
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
