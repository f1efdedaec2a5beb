"""Where a first tour's time goes: `workbench tour` (its studies two at a time, each worker on
its own core) next to what a user without the tour would run, `workbench run <study> --smoke`
for each study one after another (written here, every core for each study, one compilation
cache shared by the runs), both from an empty cache, and each study's CPU seconds and XLA
compile seconds as a tour worker spends them.

A first tour is CPU-bound: its workers keep every core busy, so its wall time cannot be below
its CPU seconds / cores (`floor_s`); `packing` = floor / wall says how close the pool comes
(1: no core ever idle). The per-study part runs each study of the tour at smoke size in this
process, as a tour worker does (one XLA compute thread for two cores, the compiled programs
freed after each study, the same persistent cache settings, an empty cache), and reads JAX's
compile events (`jax.monitoring`): the seconds spent tracing, lowering and compiling, the
number of programs compiled (or read back from the persistent cache: JAX's compile event
covers both), and the rest of the study's CPU (running the programs, Python, figures). The
verdict line compares the tour's wall time with the 60 s goal (the whole tour, 2 cores).

Run: `python benchmarks/tour_cost.py [--smoke | --all] [--smoke-seconds] [--out PATH]`; writes
`benchmarks/results/tour_cost.json` (`--smoke`: two small studies only, which decide nothing
about the goal, `tour_cost_smoke.json`; `--all`: every registered study, not only the tour's).
About 5 minutes on 2 cores (`--all`: about half an hour). `--smoke-seconds` also writes each
study's wall time in the tour into `studies/_run/smoke_seconds.json`, the order in which
`workbench tour` starts its studies (longest first; studies not run here keep their entry).
"""

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

from _common import RESULTS, OtherLoad, cpu_count, environment, table, write_json

GOAL_S = 60.0
"""The tour's wall-time goal on 2 cores (a first tour, from an empty compilation cache); judged
only for the whole tour on a 2-core machine."""

_EVENTS = {
    "/jax/core/compile/backend_compile_duration": "compile_s",
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
}


@dataclasses.dataclass(frozen=True)
class Config:
    names: tuple[str, ...] | None = None
    """The studies (default: `studies.TOUR`)."""
    is_smoke: bool = False
    every_study: bool = False

    @classmethod
    def smoke(cls) -> "Config":
        return cls(names=("metastability", "phase-diagram"), is_smoke=True)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _command(argv: list[str], cache: str) -> tuple[float, float]:
    """Run the `workbench` command `argv` in a fresh process with the compilation cache in
    `cache`: its wall time and the CPU seconds of it and its children."""
    env = {**os.environ, "WORKBENCH_JAX_CACHE": cache}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[2:])} failed ({proc.returncode}):\n{proc.stderr}")
    return wall, cpu


def _tour(names, folder: str) -> dict:
    """`workbench tour` over `names`, from an empty compilation cache: its own wall time
    (`tour.json`), the process's wall time, and the CPU of it and its workers."""
    code = (
        f"import studies\nstudies.TOUR = {tuple(names)!r}\n"
        "from studies._run.cli import entry\nentry()"
    )
    out = pathlib.Path(folder, "tour")
    wall, cpu = _command(["-c", code, "tour", "--out", str(out)], os.path.join(folder, "cache"))
    record = json.loads((out / "tour.json").read_text(encoding="utf-8"))
    studies = {name: s["wall_time_s"] for name, s in record["studies"].items()}
    return {
        "tour_s": record["wall_time_s"],
        "process_wall_s": wall,
        "cpu_s": cpu,
        "study_wall_s": studies,
    }


def _one_by_one(names, folder: str) -> dict:
    """What a user without the tour runs: `workbench run <study> --smoke` for each study, one
    after another, sharing one compilation cache that starts empty."""
    cache, walls, cpu = os.path.join(folder, "cache"), {}, 0.0
    for name in names:
        argv = ["-m", "studies", "run", name, "--smoke", "--out", os.path.join(folder, name)]
        walls[name], used = _command(argv, cache)
        cpu += used
    return {"wall_s": sum(walls.values()), "cpu_s": cpu, "study_wall_s": walls}


def _per_study(names, folder: str) -> list[dict]:
    """Each study at smoke size in this process, as a tour worker runs it."""
    import jax
    from jax import monitoring

    from studies._run.cli import compilation_cache_environment
    from studies._run.workers import (
        collect_garbage_less_often,
        start_cpu_backend,
        threads_per_worker,
    )

    # The command's persistent cache settings, in an empty folder. JAX read its environment
    # variables when it was imported (by `_common`), so they are given as its options here.
    settings = compilation_cache_environment({"WORKBENCH_JAX_CACHE": folder + "/cache"})
    for name, value in settings.items():
        option = name.lower()
        default = getattr(jax.config, option)
        jax.config.update(option, value if default is None else type(default)(value))
    collect_garbage_less_often()
    start_cpu_backend(threads_per_worker(2), 0)  # a worker of a 2-job tour: its share of cores

    from studies._run import cli

    seconds, counts = collections.defaultdict(float), collections.Counter()

    def listen(event, duration, **kwargs):
        if event in _EVENTS:
            seconds[_EVENTS[event]] += duration
            counts[_EVENTS[event]] += 1

    monitoring.register_event_duration_secs_listener(listen)
    rows = []
    for name in names:
        before, n_before = dict(seconds), counts["compile_s"]
        cpu0, t0 = _own_cpu(), time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = cli.main(["run", name, "--smoke", "--out", os.path.join(folder, name)])
        wall, cpu = time.perf_counter() - t0, _own_cpu() - cpu0
        if code != 0:
            raise RuntimeError(f"workbench run {name} --smoke failed (exit code {code})")
        jax.clear_caches()  # as a tour worker does after each study
        row = {
            "study": name,
            "wall_s": wall,
            "cpu_s": cpu,
            "programs": counts["compile_s"] - n_before,
        }
        row.update({k: seconds[k] - before.get(k, 0.0) for k in _EVENTS.values()})
        row["other_cpu_s"] = cpu - row["compile_s"] - row["trace_s"] - row["lower_s"]
        rows.append(row)
        print(
            f"{name:22s} CPU {cpu:5.1f} s: compile {row['compile_s']:5.1f} s "
            f"({row['programs']} programs), trace + lower {row['trace_s'] + row['lower_s']:4.1f} s",
            flush=True,
        )
    return rows


def _write_smoke_seconds(measured: dict) -> None:
    """Merge the studies' wall times in the tour into `studies/_run/smoke_seconds.json` (the
    order `workbench tour` starts them in), longest first, one decimal."""
    import studies

    path = pathlib.Path(studies.__file__).parent / "_run" / "smoke_seconds.json"
    seconds = {**studies.SMOKE_SECONDS, **{k: round(float(v), 1) for k, v in measured.items()}}
    ordered = dict(sorted(seconds.items(), key=lambda kv: -kv[1]))
    path.write_text(json.dumps(ordered, indent=2) + "\n", encoding="utf-8")
    print("wrote", path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--all", action="store_true", help="every registered study")
    parser.add_argument(
        "--smoke-seconds", action="store_true", help="write studies/_run/smoke_seconds.json"
    )
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.smoke and args.all:
        parser.error("--smoke and --all exclude each other")
    cfg = Config.smoke() if args.smoke else Config(every_study=args.all)
    import studies

    names = tuple(cfg.names or (studies.STUDIES if cfg.every_study else studies.TOUR))
    cores = cpu_count()
    with tempfile.TemporaryDirectory() as tmp, OtherLoad() as load:
        pool = _tour(names, os.path.join(tmp, "pool"))
        print(f"workbench tour: {pool['tour_s']:.1f} s, {pool['cpu_s']:.1f} s of CPU", flush=True)
        one = _one_by_one(names, os.path.join(tmp, "one"))
        print(
            f"workbench run, one study after another: {one['wall_s']:.1f} s, "
            f"{one['cpu_s']:.1f} s of CPU",
            flush=True,
        )
        rows = _per_study(names, os.path.join(tmp, "each"))
        cached = sum(len(files) for _, _, files in os.walk(os.path.join(tmp, "each", "cache")))
    floor = pool["cpu_s"] / cores
    total = {
        k: sum(r[k] for r in rows)
        for k in ("cpu_s", "compile_s", "trace_s", "lower_s", "other_cpu_s", "programs")
    }
    largest = max(rows, key=lambda r: r["cpu_s"])
    summary = {
        "cores": cores,
        "tour_s": pool["tour_s"],
        "tour_cpu_s": pool["cpu_s"],
        "floor_s": floor,
        "packing": floor / pool["tour_s"],
        "one_by_one_s": one["wall_s"],
        "tour_speedup": one["wall_s"] / pool["tour_s"],
        "studies_cpu_s": total["cpu_s"],
        "compile_fraction": total["compile_s"] / total["cpu_s"],
        "trace_lower_fraction": (total["trace_s"] + total["lower_s"]) / total["cpu_s"],
        "largest_study": largest["study"],
        "largest_study_fraction": largest["cpu_s"] / total["cpu_s"],
        "goal_s": GOAL_S,
        # The goal is the whole tour's on 2 cores: a subset of its studies (--smoke), or
        # another machine, decides nothing.
        "goal_met": (
            pool["tour_s"] <= GOAL_S if names == tuple(studies.TOUR) and cores == 2 else None
        ),
    }
    result = {
        "benchmark": "tour_cost",
        "config": dataclasses.asdict(cfg),
        "environment": environment(),
        "tour": pool,
        "one_by_one": one,
        "studies": rows,
        "cache_files_written_per_study_part": cached,
        "totals": total,
        "summary": summary,
        "other_load_fraction": load.fraction,
    }
    print(
        table(
            [
                [
                    r["study"],
                    f"{r['cpu_s']:.1f}",
                    f"{r['compile_s']:.1f}",
                    r["programs"],
                    f"{r['trace_s'] + r['lower_s']:.1f}",
                    f"{r['other_cpu_s']:.1f}",
                ]
                for r in rows
            ],
            ["study", "CPU s", "compile s", "programs", "trace+lower s", "other s"],
        )
    )
    print(
        f"tour {pool['tour_s']:.1f} s ({pool['cpu_s']:.1f} s of CPU on {cores} cores: floor "
        f"{floor:.1f} s, packing {summary['packing']:.2f}); `workbench run` one study after another "
        f"{one['wall_s']:.1f} s ({summary['tour_speedup']:.2f}x the tour's time). Studies: "
        f"{total['cpu_s']:.1f} s of CPU, {100 * summary['compile_fraction']:.0f} % XLA compile "
        f"({total['programs']} programs), {100 * summary['trace_lower_fraction']:.0f} % trace + "
        f"lower; {largest['study']} {100 * summary['largest_study_fraction']:.0f} %."
    )
    if summary["goal_met"] is not None:
        verdict = "met" if summary["goal_met"] else "not met"
        print(f"goal: the tour in <= {GOAL_S:.0f} s: {verdict} ({pool['tour_s']:.1f} s)")
    if args.smoke_seconds:
        _write_smoke_seconds(pool["study_wall_s"])
    name = "tour_cost_smoke.json" if cfg.is_smoke else "tour_cost.json"
    out = args.out or os.path.join(RESULTS, name)
    write_json(out, result)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
