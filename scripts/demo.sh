#!/usr/bin/env bash
# kiln's main job on the sample model, on the CPU: build kiln, describe the model, run it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" kiln_cli sample_model
kiln="$root/build/kiln"
model="$root/build/models/sample_cnn.onnx"
out="$root/build/demo"
mkdir -p "$out"
"$kiln" inspect "$model"
echo
"$kiln" run "$model" --seed 0 --saveOutputs "$out/outputs.npz"
