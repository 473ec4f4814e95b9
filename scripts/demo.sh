#!/usr/bin/env bash
# kiln's main job on the sample model, on the CPU: build kiln, then tune the model (a mixed
# search over the knobs in examples/cpu.tune), keeping the winning engine with its manifest and
# report, and run that engine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" kiln_cli sample_model
kiln="$root/build/kiln"
model="$root/build/models/sample_cnn.onnx"
out="$root/build/demo"
# A tuning cache belongs to one run; the demo starts a fresh one each time.
rm -rf "$out"
mkdir -p "$out"
"$kiln" inspect "$model"
echo
"$kiln" tune "$model" --tune-file "$root/examples/cpu.tune" --search mixed \
  --cache "$out/tune.db" --saveEngine "$out/best.kiln"
echo
"$kiln" run "$out/best.kiln" --seed 0 --saveOutputs "$out/outputs.npz"
echo
echo "demo: the winning engine, its manifest and report are in $out (best.kiln, best.manifest.json, best.report.md)"
