#!/usr/bin/env bash
# Training on one accelerator, in one command: the digits and sorting studies at larger sizes
# than the CPU defaults, and the training-step benchmark. Sized for about 8 minutes on one H200.
#
# The machine is expected to carry jax with CUDA, equinox, diffrax, optax, chex and torch; the
# project is installed without its dependencies. Results: benchmarks/results/gpu_train/<study>/
# (each study's run folder, with results.json) and benchmarks/results/gpu_train.json (a summary).
#
# Prepared, not yet run: no accelerator was lent to the session that wrote it.
set -euo pipefail
cd "$(dirname "$0")/.."
pip install -q --no-deps -e .
pip install -q scikit-learn tqdm 2>/dev/null || true
OUT=benchmarks/results/gpu_train
mkdir -p "$OUT"
export WORKBENCH_PROGRESS=0
python -c "import jax; print('devices:', jax.devices())"
start=$(date +%s)
workbench run train-digits --out "$OUT/train-digits" --d 128 --num-heads 8 --num-layers 8 \
  --hidden 512 --batch-size 256 --epochs 60 --certificate-examples 2
workbench run train-sequence --out "$OUT/train-sequence" --d 128 --num-heads 8 --num-layers 4 \
  --hidden 512 --batch-size 256 --certificate-examples 1
python benchmarks/train_step.py --depths 4 16 --batch 256 --out "$OUT/train_step.json"
end=$(date +%s)
python - "$OUT" "$((end - start))" <<'EOF'
import json, pathlib, sys
from workbench.io import atomic_write_json, environment
out, seconds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
summary = {"wall_time_s": seconds, "environment": environment()}
for name in ("train-digits", "train-sequence"):
    r = json.loads((out / name / "results.json").read_text())
    summary[name] = {k: r.get(k) for k in ("test_accuracy", "final_params_sha256", "num_steps",
                                           "steps_per_second", "compile_time_s", "wall_time_s")}
atomic_write_json(out.parent / "gpu_train.json", summary)
print(json.dumps(summary, indent=1)[:2000])
EOF
