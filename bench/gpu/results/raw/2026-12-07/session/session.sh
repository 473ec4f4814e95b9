#!/usr/bin/env bash
# Session 2026-12-07 (third), last call: the depthwise and flash CUDA tests again (the two
# depthwise kernels now share their epilogue, conv_device.cuh), the knob tests with their GPU
# halves where the pack has room for them, then this session's defaults against the route that gives the
# defaults it started with, on the five workloads they touch, and two more depthwise settings.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz && tar -C /tmp/k/bin -xJf .device/extra.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"; cat "$OUT/info.txt"
(timeout 240 /tmp/k/bin/kiln_cuda_tests --gtest_filter='CudaNhwcConv.*:CudaFusedConv.*:CudaAttention.Flash*' 2>&1
 [ -x /tmp/k/bin/kiln_knob_tests ] && timeout 150 /tmp/k/bin/kiln_knob_tests 2>&1) > "$OUT/tests.txt"
grep -E '^\[  (PASSED|FAILED)  \]|FAILED|Failure' "$OUT/tests.txt" | head -20
echo "tests after $(($(date +%s) - start)) s"
W=swin_t_b8,gpt2_b1_s512,convnext_tiny_b8,efficientnet_b0_b8,mobilenet_v3_large_b1
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only $W --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"; tail -3 /tmp/export.log
M=/tmp/kiln-gpu-bench/models
OLD="-graph.compose_row_moves=off -cuda.gather.vector=off -cuda.conv.depthwise.window=loads -cuda.conv.depthwise.vector=16 -cuda.attention.flash.skip_masked=off"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads $W \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_session.json" -- "$OLD" default > "$OUT/routes_session.txt" 2>&1
echo "routes session: exit $? after $(($(date +%s) - start)) s"; tail -12 "$OUT/routes_session.txt"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads convnext_tiny_b8,efficientnet_b0_b8,mobilenet_v3_large_b1 \
  --rounds 2 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_dw2.json" -- default "-cuda.conv.depthwise.vector=4" "-cuda.conv.depthwise.window.pixels=4" > "$OUT/routes_dw2.txt" 2>&1
echo "routes dw2: exit $? after $(($(date +%s) - start)) s"; tail -11 "$OUT/routes_dw2.txt"
echo "done after $(($(date +%s) - start)) s"
