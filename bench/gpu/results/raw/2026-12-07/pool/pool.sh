#!/usr/bin/env bash
# Session 2026-12-07: the vectorised NHWC pool kernel on the GPU: its tests, then A/B against the
# scalar kernel on the workloads with a stem MaxPool, then ResNet-50 b32's profile.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz && tar -C /tmp/k/bin -xJf .device/extra.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"
(/tmp/k/bin/kiln_cuda_tests --gtest_filter='CudaPool.*' 2>&1; /tmp/k/bin/kiln_knob_tests --gtest_filter='*pool*' 2>&1) > "$OUT/tests.txt"
grep -E '^\[  (PASSED|FAILED)  \]|FAILED|Failure' "$OUT/tests.txt" | head -20
W=resnet50_b32,resnet50_b1,deeplabv3_resnet50_b1
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only $W --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models /tmp/kiln-gpu-bench/models --workloads $W \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes.json" -- default "-cuda.pool.vector=off" > "$OUT/routes.txt" 2>&1
echo "routes: exit $? after $(($(date +%s) - start)) s"; cat "$OUT/routes.txt" | tail -12
bench/gpu/profile.sh /tmp/k/bin/kiln /tmp/kiln-gpu-bench/models "$OUT" resnet50_b32
grep -E "MaxPool" "$OUT/prof_resnet50_b32.txt"
echo "done after $(($(date +%s) - start)) s"
