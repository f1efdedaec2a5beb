#!/usr/bin/env bash
# Training on one accelerator, in one command: the digits and sorting studies at larger sizes
# than the CPU defaults, and the training-step benchmark. Sized for about 8 minutes on one H200.
#
# The machine is expected to carry jax with CUDA, equinox, diffrax, optax, chex and torch; the
# project is installed without its dependencies. Results: benchmarks/results/gpu_train/<study>/
# (each study's run folder, with results.json) and benchmarks/results/gpu_train.json (a summary).
#
# `bash benchmarks/gpu_train.sh --smoke` runs the same commands at their smoke sizes (minutes, on
# any machine, into $GPU_OUT or benchmarks/results/gpu_train_smoke): a dry run of the script.
#
# Prepared, not yet run on a GPU: no accelerator was lent to the sessions that wrote it.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
[[ "${1:-}" == "--smoke" ]] && SMOKE=1
# The project is pure Python. Its build backend (hatchling) is not on the GPU image and that
# machine has no network, so an editable install may fail there: then run from the checkout
# (`python -m studies` is the `workbench` command).
pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
  || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if (( SMOKE )); then OUT=${GPU_OUT:-benchmarks/results/gpu_train_smoke}; else OUT=${GPU_OUT:-benchmarks/results/gpu_train}; fi
mkdir -p "$OUT"
export WORKBENCH_PROGRESS=0
python -c "import jax, workbench; print('devices:', jax.devices())"
start=$(date +%s)
if (( SMOKE )); then
  python -m studies run train-digits --smoke --out "$OUT/train-digits"
  python -m studies run train-sequence --smoke --out "$OUT/train-sequence"
  python benchmarks/train_step.py --smoke --wait-quiet 0 --out "$OUT/train_step.json"
else
  python -m studies run train-digits --out "$OUT/train-digits" --d 128 --num-heads 8 \
    --num-layers 8 --hidden 512 --batch-size 256 --epochs 60 --certificate-examples 2
  python -m studies run train-sequence --out "$OUT/train-sequence" --d 128 --num-heads 8 \
    --num-layers 4 --hidden 512 --batch-size 256 --certificate-examples 1
  python benchmarks/train_step.py --wait-quiet 0 --depths 4 16 --batch 256 --out "$OUT/train_step.json"
fi
end=$(date +%s)
python - "$OUT" "$((end - start))" "$SMOKE" <<'EOF'
import json, pathlib, sys
from workbench.io import atomic_write_json, environment
out, seconds, smoke = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
summary = {"wall_time_s": seconds, "smoke": smoke, "environment": environment()}
for name in ("train-digits", "train-sequence"):
    r = json.loads((out / name / "results.json").read_text())
    summary[name] = {k: r.get(k) for k in ("test_accuracy", "final_params_sha256", "num_steps",
                                           "steps_per_second", "compile_time_s", "wall_time_s")}
atomic_write_json(out.parent / ("gpu_train_smoke.json" if smoke else "gpu_train.json"), summary)
print(json.dumps(summary, indent=1)[:2000])
EOF
