#!/usr/bin/env bash
# CPU latency of the shared torch-exported models: kiln's default route (passes + CPU backend)
# against the reference executor, each for --duration seconds after a warm-up, printed as a
# Markdown table with the machine and the command. Usage: bench/cpu/models.sh [MODELS_DIR]
# [SECONDS] [THREADS]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
models="${1:-$root/../shared/models}"
seconds="${2:-3}"
threads="${3:-0}"
"$root/scripts/build.sh" kiln_cli >/dev/null
kiln="$root/build/kiln"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%F)"
echo "command: bench/cpu/models.sh $models $seconds $threads"
echo
echo "| model | reference median ms (p10–p90) | kiln default median ms (p10–p90) | speedup |"
echo "|---|---|---|---|"
summary() {  # prints "median p10 p90" of an --exportTimes file
  python3 - "$1" <<'PY'
import json, statistics, sys
xs = sorted(t["latencyMs"] for t in json.load(open(sys.argv[1])))
q = lambda p: xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]
print(f"{statistics.median(xs):.3f} {q(0.1):.3f} {q(0.9):.3f}")
PY
}
for model in "$models"/*.onnx; do
  name="$(basename "$model" .onnx)"
  tmp="$(mktemp -d)"
  "$kiln" run "$model" --backend reference --duration "$seconds" --exportTimes "$tmp/ref.json" >/dev/null
  "$kiln" run "$model" --route "-cpu.threads=$threads" --duration "$seconds" \
      --exportTimes "$tmp/kiln.json" >/dev/null
  read -r rm r10 r90 <<<"$(summary "$tmp/ref.json")"
  read -r km k10 k90 <<<"$(summary "$tmp/kiln.json")"
  speedup="$(python3 -c "print(f'{$rm / $km:.2f}x')")"
  echo "| $name | $rm ($r10–$r90) | $km ($k10–$k90) | $speedup |"
  rm -rf "$tmp"
done
