#!/usr/bin/env bash
# The first device call of a session: the pack's tests, the roofline peaks, and the EfficientNet-B0
# NCHW fp16 check (its NaN, 2026-12-05), all into $OUT. Needs the full pack
# (scripts/device-pack.sh, carried as .device/) and about 5 minutes.
# Usage: bench/gpu/checks.sh
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
: "${OUT:?OUT must name the folder that comes back}"
start=$(date +%s)
if [[ ! -x /tmp/k/bin/kiln_cuda_tests ]]; then
  mkdir -p /tmp/k && tar -C /tmp/k -xJf "$root/.device/kiln-device.tar.xz" || exit 1
fi
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
build=$(cat /tmp/k/BUILD_DIR)
mkdir -p "$build/models" "$build/tests" && ln -sf /tmp/k/bin/kiln "$build/kiln" &&
  ln -sf /tmp/k/bin/kiln_faulty "$build/tests/kiln_faulty" && cp /tmp/k/models/sample_cnn.onnx "$build/models/"
cp /tmp/k/COMMIT "$OUT/commit.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
ldd /tmp/k/bin/kiln | grep 'not found' > "$OUT/ldd-missing.txt"
for suite in kiln_cuda_tests kiln_knob_tests kiln_tune_tests; do
  timeout 240 /tmp/k/bin/$suite > "$OUT/$suite.txt" 2>&1
  echo "$suite: exit $? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUT/$suite.txt" | tr '\n' ' ')"
done
grep -h '^\[  FAILED  \]' "$OUT"/kiln_*_tests.txt | sort -u | head -20
python3 "$here/roofline.py" peaks --out "$OUT/peaks.json" > /dev/null 2>&1 && echo "peaks: $(tr -d '\n' < "$OUT/peaks.json" | head -c 400)"
"$here/run.sh" --kiln /tmp/k/bin/kiln --stages export --only efficientnet_b0_b8 \
  --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > "$OUT/export.log" 2>&1
model=/tmp/kiln-gpu-bench/models/efficientnet_b0_b8
for route in "-cuda.precision=fp16 -cuda.layout=nchw" "-cuda.precision=fp16"; do
  rm -f /tmp/checks-out.npz
  timeout 120 /tmp/k/bin/kiln run "$model/model.onnx" --backend cuda --route "$route" \
    --loadInputs "$model/inputs.npz" --saveOutputs /tmp/checks-out.npz --duration 0 > /tmp/checks-run.txt 2>&1
  echo "efficientnet_b0_b8 [$route]: $(python3 -c "
import numpy as np
a = np.load('/tmp/checks-out.npz'); r = np.load('$model/ref.npz')
y, ref = a[a.files[0]].astype('f8').ravel(), r[r.files[0]].astype('f8').ravel()
cos = 1 - y.dot(ref) / (np.linalg.norm(y) * np.linalg.norm(ref))
print(f'NaN {int(np.isnan(y).sum())}, cosine distance {cos:.3g}')" 2>&1 | tail -1)"
done | tee "$OUT/efficientnet-nchw.txt"
echo "checks took $(($(date +%s) - start)) s"
