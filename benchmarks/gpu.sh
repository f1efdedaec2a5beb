#!/usr/bin/env bash
# The accelerator report in one command, sized for about 8 minutes on one H200:
#   1. the full Fig. 3 sweep for all six d of the paper (phase_sweep.py: 90 β × 1024 starts ×
#      300 steps per d, float64), with the kernel's GFLOP/s as a fraction of the device's
#      float32 and float64 matmul peaks (measured in the same process);
#   2. the training-step benchmark at larger sizes (train_step.py: depths 4 and 16, batch 256);
#   3. the forward-pass benchmark (zero_cost.py: the recovered encoder vs plain equinox, and torch
#      on whatever device torch uses there).
# Each part has its own time limit, so one slow part cannot take the others' time; a part that
# fails or times out is recorded in the summary and the others still run.
#
# The machine is expected to carry jax with CUDA, equinox, diffrax, optax, chex, orbax and torch;
# the project is installed without its dependencies. Results: benchmarks/results/gpu/*.json and
# the summary benchmarks/results/gpu.json (date, device, per-part exit code and wall time).
#
# `bash benchmarks/gpu.sh --smoke` runs the same parts at their smoke sizes (seconds, on any
# machine, into $GPU_OUT or benchmarks/results/gpu_smoke): a dry run of the script itself.
#
# Prepared, not yet run on a GPU: no accelerator was lent to the sessions that wrote it.
set -uo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
[[ "${1:-}" == "--smoke" ]] && SMOKE=1
# The project is pure Python. Its build backend (hatchling) is not on the GPU image and that
# machine has no network, so an editable install may fail there: then run from the checkout.
pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
  || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if (( SMOKE )); then OUT=${GPU_OUT:-benchmarks/results/gpu_smoke}; else OUT=${GPU_OUT:-benchmarks/results/gpu}; fi
mkdir -p "$OUT"
export WORKBENCH_PROGRESS=0
python -c "import jax, workbench; print('devices:', jax.devices())" || exit 1
status=()
part() {  # part NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@"
  local rc=$?
  status+=("$name:$rc:$(( $(date +%s) - t0 ))")
  echo "[gpu.sh] $name: exit $rc after $(( $(date +%s) - t0 )) s"
}
if (( SMOKE )); then
  part phase_sweep 600 python benchmarks/phase_sweep.py --smoke --out "$OUT/phase_sweep.json"
  part train_step 600 python benchmarks/train_step.py --smoke --wait-quiet 0 --out "$OUT/train_step.json"
  part zero_cost 600 python benchmarks/zero_cost.py --smoke --wait-quiet 0 --out "$OUT/zero_cost.json"
else
  part phase_sweep 270 python benchmarks/phase_sweep.py --repeat-under 30 --out "$OUT/phase_sweep.json"
  part train_step 150 python benchmarks/train_step.py --wait-quiet 0 --depths 4 16 --batch 256 --out "$OUT/train_step.json"
  part zero_cost 60 python benchmarks/zero_cost.py --wait-quiet 0 --out "$OUT/zero_cost.json"
fi
python - "$OUT" "$SMOKE" "${status[@]}" <<'PY'
import datetime, json, pathlib, sys
from workbench.io import atomic_write_json, environment
out, smoke = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
parts = {}
for item in sys.argv[3:]:
    name, rc, seconds = item.split(":")
    path = out / f"{name}.json"
    parts[name] = {"exit_code": int(rc), "wall_s": int(seconds),
                   "json": str(path) if path.exists() else None}
summary = {"date": datetime.date.today().isoformat(), "smoke": smoke, "parts": parts, "environment": environment()}
sweep = out / "phase_sweep.json"
if sweep.exists():
    r = json.loads(sweep.read_text())
    summary["matmul_peak_gflops"] = r["matmul_peak_gflops"]
    summary["phase_sweep"] = [
        {k: x[k] for k in ("d", "first_s", "second_s", "gflops", "fraction_of_matmul_peak")}
        for x in r["per_d"]
    ]
atomic_write_json(out.parent / ("gpu_smoke.json" if smoke else "gpu.json"), summary)
print(json.dumps(summary, indent=1)[:3000])
PY
