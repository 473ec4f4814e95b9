#!/usr/bin/env bash
# Per-layer profiles of kiln's fp16 default route on exported benchmark workloads, and weightless
# skeletons of them (skeleton.py) to bring back for inspecting the passes elsewhere.
# Usage: bench/gpu/profile.sh KILN MODELS OUT workload...
#   MODELS: the folder export.py wrote (run.sh --stages export puts it in WORK/models)
set -uo pipefail
kiln="$1" models="$2" out="$3"
shift 3
here="$(cd "$(dirname "$0")" && pwd)"
for w in "$@"; do
  model="$models/$w/model.onnx"
  [[ -f "$model" ]] || { echo "$w: no $model"; continue; }
  timeout 120 "$kiln" run "$model" --backend cuda --route "-cuda.precision=fp16 ${ROUTE:-}" \
    --loadInputs "$models/$w/inputs.npz" --dumpProfile --duration 1 >"$out/prof_$w.txt" 2>&1
  echo "$w: rc=$? $(grep -m1 'GPU compute time' "$out/prof_$w.txt")"
  if [[ -n "${SKELETON:-}" ]]; then
    python3 "$here/skeleton.py" strip "$model" "$out/$w.onnx" >/dev/null 2>&1 || echo "$w: strip failed"
    rm -f "$out/$w.onnx.weights"
  fi
done
