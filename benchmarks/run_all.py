"""Every benchmark, side by side, in one performance report for this machine.

Each benchmark script runs in its own process (one process per comparison: the scripts compare
the workbench against their peers inside that process, in interleaved rounds), one after the
other, with `--smoke` passed on. The report gathers from each script's JSON the headline
comparisons as **time ratios workbench / peer** (below 1: the workbench is faster), the first
call (trace + compile, or the compile estimate), and the script process's peak resident memory
(`ru_maxrss` of the finished child, from `os.wait4`; a script that starts its own workers, as
`phase_sharded.py` does, reports its own process only). It also measures this machine's matmul peak
(jitted `jnp.dot` of 2048 × 2048 matrices, float32 and float64, best of 5) for the FLOP/s
columns, and writes:

- `benchmarks/results/<machine>.json` (`<machine>`: the CPU model and core count, slugged;
  `_smoke` with `--smoke`): the rows, the per-script status, wall time and peak memory, the
  peaks and the environment;
- `benchmarks/results/<machine>.md`: the same as a Markdown table with the date and the machine;
- with `--readme`: that table into `benchmarks/README.md` between `<!-- perf-table:start -->` and
  `<!-- perf-table:end -->`.

A script that fails is reported (its exit code and the tail of its output) and the others still
run; the exit code is then 1.

Run: `python benchmarks/run_all.py [--smoke] [--only NAME ...] [--readme]` (`--only` writes
`<machine>_partial.json/.md` and cannot go with `--readme`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _common import RESULTS, environment, matmul_peaks, write_json  # noqa: E402

Row = dict


def _row(benchmark, comparison, ratio, *, first_s=None, note=""):
    return {
        "benchmark": benchmark,
        "comparison": comparison,
        "time_ratio": None if ratio is None else float(ratio),
        "first_call_s": first_s,
        "note": note,
    }


def _zero_cost(r) -> list[Row]:
    first = r["first_call_s"]["workbench"]
    return [
        _row(
            "zero_cost",
            "6-layer encoder forward vs plain equinox",
            r["ratios"]["workbench_over_plain_equinox"],
            first_s=first,
        ),
        _row(
            "zero_cost",
            "6-layer encoder forward vs torch",
            r["ratios"]["workbench_over_torch"],
            first_s=first,
        ),
    ]


def _compile_depth(r) -> list[Row]:
    a = r["acceptance"]
    slope = r["slope_ratios"]["workbench_over_plain_unrolled"]["ratio"]
    return [
        _row(
            "compile_depth",
            "build + compile time, depth 48 / depth 6 (workbench)",
            None,
            note=f"{a['ratio']:.2f} (target {a['target']})",
        ),
        _row("compile_depth", "compile time per layer vs an unrolled equinox loop", slope),
    ]


def _minilm(r) -> list[Row]:
    return [
        _row(
            "minilm_forward",
            "MiniLM forward, 32 × 64 tokens, vs torch",
            r["ratio_workbench_over_torch"],
            first_s=r["first_call_s"]["workbench"],
            note=f"max abs diff {r['max_abs_difference']:.1e}",
        ),
    ]


def _train_step(r) -> list[Row]:
    rows = []
    for depth, x in r["results"].items():
        ratios = x["ratios"]  # steps/s ratios: time ratio is the inverse
        first = x["cold"]["workbench"].get("first_step_s")
        rows.append(
            _row(
                "train_step",
                f"training step (depth {depth}) vs equinox + optax",
                1 / ratios["workbench_over_plain_equinox_optax"],
                first_s=first,
            )
        )
        rows.append(
            _row(
                "train_step",
                f"training step (depth {depth}) vs torch",
                1 / ratios["workbench_over_torch"],
                first_s=first,
            )
        )
    return rows


def _simulate(r) -> list[Row]:
    rows = []
    for c in r["cases"]:
        what = "final state" if c["save_every"] is None else f"every {c['save_every']}th state"
        rows.append(
            _row(
                "simulate_overhead",
                f"vmapped simulate ({what}) vs hand lax.scan",
                c["ratio_min"],
                note="ratio of the minima",
            )
        )
    return rows


def _phase_kernel(r, peaks) -> list[Row]:
    rows = []
    first = r["first_call_s"]
    for form in ("reduced", "gram", "particle"):
        for peer in ("numpy_loop", "numpy_batched", "torch"):
            key = f"{peer}_over_jax/{form}"
            if key in r["ratios"]:
                rows.append(
                    _row(
                        "phase_kernel",
                        f"{form} form vs {peer.replace('_', ' ')}",
                        1 / r["ratios"][key],
                        first_s=first.get(f"jax/{form}"),
                    )
                )
        gflops = r["gflops"].get(f"jax/{form}")
        if gflops is not None:
            frac = gflops / peaks["float64"] if peaks.get("float64") else None
            note = f"{gflops:.3g} GFLOP/s" + (
                f" = {frac:.2%} of the f64 matmul peak" if frac else ""
            )
            rows.append(_row("phase_kernel", f"{form} form throughput (float64)", None, note=note))
    return rows


def _particle_forms(r) -> list[Row]:
    return [
        _row(
            "particle_forms",
            f"{name}: GFLOP/s / the reduced form's",
            None,
            first_s=x["first_call_s"],
            note=f"{x['gflops_over_reduced']:.2f} ({x['gflops']:.3g} GFLOP/s, "
            f"{x['fraction_of_peak']:.0%} of the f64 matmul peak)",
        )
        for name, x in r["cases"].items()
        if name != "reduced (identity)"
    ]


def _phase_sweep(r) -> list[Row]:
    return [
        _row(
            "phase_sweep",
            f"Fig. 3 sweep, d = {x['d']} ({x['form']})",
            None,
            first_s=x["first_s"],
            note=f"{x['trajectory_steps_per_s']:.3g} trajectory-steps/s, {x['gflops']:.3g} GFLOP/s "
            f"({x['fraction_of_matmul_peak']['float64']:.2%} of the f64 matmul peak)",
        )
        for x in r["per_d"]
    ]


def _phase_sharded(r) -> list[Row]:
    return [
        _row(
            "phase_sharded",
            f"phase diagram on {k} CPU device(s) vs 1",
            v["ratio_to_one_device"],
            first_s=v["first_call_s"][0],
            note=f"max abs diff {v['max_abs_difference_to_one_device']:g}",
        )
        for k, v in r["per_device_count"].items()
        if k != "1"
    ]


def _ode_solve(r) -> list[Row]:
    names = {
        "diffrax": "diffrax (hand-written field)",
        "plain_jax": "plain JAX midpoint loop",
        "torchdiffeq": "torchdiffeq",
    }
    return [
        _row(
            "ode_solve",
            f"neural-ODE solve (midpoint, 32 steps) of a layer's field vs {label}",
            1 / r["ratios"][f"{k}_over_workbench"],
            first_s=r["first_call_s"]["workbench"],
            note=f"max abs diff {r['max_abs_difference_to_workbench'][k]:.1e}",
        )
        for k, label in names.items()
    ]


# (name, script, JSON file stem, extractor). The JSON of `--smoke` runs ends in `_smoke`.
BENCHMARKS: list[tuple[str, str, str, Callable]] = [
    ("zero_cost", "zero_cost.py", "zero_cost", _zero_cost),
    ("compile_depth", "compile_depth.py", "compile_depth", _compile_depth),
    ("minilm_forward", "minilm_forward.py", "minilm_forward", _minilm),
    ("ode_solve", "ode_solve.py", "ode_solve", _ode_solve),
    ("train_step", "train_step.py", "train_step", _train_step),
    ("simulate_overhead", "simulate_overhead.py", "simulate_overhead", _simulate),
    ("phase_kernel", "phase_kernel.py", "phase_kernel", _phase_kernel),
    ("particle_forms", "particle_forms.py", "particle_forms", _particle_forms),
    ("phase_sharded", "phase_sharded.py", "phase_sharded", _phase_sharded),
    ("phase_sweep", "phase_sweep.py", "phase_sweep_cpu", _phase_sweep),
]


def _run(script: str, smoke: bool) -> dict:
    """Run one script in its own process; its exit code, wall time, peak RSS and output tail."""
    cmd = [sys.executable, script] + (["--smoke"] if smoke else [])
    env = dict(os.environ, WORKBENCH_PROGRESS="0")
    t0 = time.perf_counter()
    with open(os.devnull, "rb") as stdin:
        proc = subprocess.Popen(
            cmd,
            cwd=HERE,
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "command": " ".join(["python", f"benchmarks/{script}"] + cmd[2:]),
        "returncode": proc.returncode,
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # kilobytes on Linux
        "output_tail": output[-4000:],
    }


def machine_name(env: dict) -> str:
    cpu = re.sub(r"[^a-z0-9]+", "-", env.get("processor", "cpu").lower()).strip("-")
    return f"{cpu}-{env.get('cpu_count', 0)}cores"


def markdown(report: dict) -> str:
    env = report["environment"]
    peaks = report["matmul_peak_gflops"]
    head = (
        f"Measured {report['date']} on {env.get('processor', '?')} ({env.get('cpu_count')} "
        f"cores; matmul peak {peaks['float32']:.0f} GFLOP/s float32, {peaks['float64']:.0f} "
        f"float64), `python benchmarks/run_all.py{' --smoke' if report['smoke'] else ''}` "
        f"({report['wall_s'] / 60:.1f} min). Time ratio = workbench / peer: below 1 the "
        "workbench is faster. First call = trace + compile + one run. Peak memory: the script's "
        "process."
    )
    lines = [
        head,
        "",
        "| benchmark | comparison | time ratio | first call (s) | peak memory (MiB) | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    runs = report["runs"]
    for r in report["rows"]:
        ratio = "" if r["time_ratio"] is None else f"{r['time_ratio']:.2f}"
        first = "" if r["first_call_s"] is None else f"{r['first_call_s']:.2f}"
        rss = runs[r["benchmark"]]["peak_rss_mib"]
        lines.append(
            f"| {r['benchmark']} | {r['comparison']} | {ratio} | {first} | {rss:.0f} | {r['note']} |"
        )
    failed = [k for k, v in runs.items() if v["returncode"] != 0]
    if failed:
        lines += ["", f"Failed: {', '.join(failed)} (see the JSON for their output)."]
    return "\n".join(lines) + "\n"


def _into_readme(table: str) -> None:
    path = os.path.join(ROOT, "benchmarks", "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = "<!-- perf-table:start -->", "<!-- perf-table:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} markers")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    from workbench.io import atomic_write_text

    atomic_write_text(path, f"{before}{start}\n{table}{end}{after}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="every script with --smoke")
    parser.add_argument("--only", nargs="+", choices=[b[0] for b in BENCHMARKS], default=None)
    parser.add_argument(
        "--readme", action="store_true", help="write the table into benchmarks/README.md"
    )
    args = parser.parse_args()
    if args.only and args.readme:
        parser.error("--readme takes the full report; drop --only")
    chosen = [b for b in BENCHMARKS if args.only is None or b[0] in args.only]

    t0 = time.perf_counter()
    peaks = matmul_peaks()
    runs, rows = {}, []
    for name, script, stem, extract in chosen:
        print(f"[run_all] {name} ...", flush=True)
        run = _run(script, args.smoke)
        runs[name] = run
        path = os.path.join(RESULTS, f"{stem}_smoke.json" if args.smoke else f"{stem}.json")
        if run["returncode"] == 0:
            with open(path, encoding="utf-8") as f:
                result = json.load(f)
            extracted = extract(result, peaks) if name == "phase_kernel" else extract(result)
            rows += extracted
            run["json"] = os.path.relpath(path, ROOT)
        print(
            f"[run_all] {name}: exit {run['returncode']}, {run['wall_s']:.0f} s, "
            f"peak {run['peak_rss_mib']:.0f} MiB",
            flush=True,
        )
    env = environment()
    report = {
        "benchmark": "run_all",
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "machine": machine_name(env),
        "matmul_peak_gflops": peaks,
        "rows": rows,
        "runs": runs,
        "wall_s": time.perf_counter() - t0,
        "environment": env,
    }
    # A partial run (--only) does not replace the machine's full report.
    stem = report["machine"] + ("_smoke" if args.smoke else "") + ("_partial" if args.only else "")
    write_json(os.path.join(RESULTS, f"{stem}.json"), report)
    table = markdown(report)
    from workbench.io import atomic_write_text

    atomic_write_text(os.path.join(RESULTS, f"{stem}.md"), table)
    if args.readme:
        _into_readme(table)
    print(table)
    return 1 if any(r["returncode"] for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
