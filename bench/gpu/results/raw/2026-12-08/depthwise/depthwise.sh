#!/usr/bin/env bash
# 2026-12-08: the depthwise kernels' launch on ConvNeXt-T b8 and MobileNetV3-L b1, one A/B of
# bench/gpu/routes.py (2 rounds of 1 s, base -cuda.precision=fp16) against the default (window
# kernel, auto pixels, 4-byte channel runs at fp16, 256-thread blocks):
#   - -cuda.conv.depthwise.vector=8 (next.sh's owed check of the 4-byte default);
#   - window.pixels=4 and =2 (ptxas: the 7x7 fp16 instance at 2 channels and 8 pixels, auto's
#     choice for ConvNeXt's stage 1, takes 64 registers, 1024 threads an SM, so its 150K threads
#     are 1.1 waves on 132 SMs);
#   - block=128 (9 blocks fit an SM at 56 registers, 1152 threads: the stage-2 instance's 150K
#     threads in one wave) and block=occupancy (the CUDA occupancy calculator's block);
#   - window.registers=56 (the window instances capped at 56 registers where that spills
#     nothing: the stage-1 instance too then fits 1152 threads an SM).
# Needs the full pack (scripts/device-pack.sh; carry .device); the CUDA tests of these kernels
# are split.sh's.
set -uo pipefail
start=$(date +%s)
[[ -x /tmp/k/bin/kiln ]] || { rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz || exit 1; }
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"; cat "$OUT/info.txt"
M=/tmp/kiln-gpu-bench/models
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only convnext_tiny_b8,mobilenet_v3_large_b1 --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"; tail -3 /tmp/export.log
for v in natural 56; do
  /tmp/k/bin/kiln run $M/convnext_tiny_b8/model.onnx --backend cuda --route "-cuda.precision=fp16 -cuda.conv.depthwise.window.registers=$v" \
    --loadInputs $M/convnext_tiny_b8/inputs.npz --duration 1 --saveOutputs "/tmp/c_$v.npz" > "$OUT/convnext_registers_$v.txt" 2>&1
  echo "registers=$v: exit $?"; grep "GPU compute time" "$OUT/convnext_registers_$v.txt"
done
python3 -c "
import numpy as np
a=np.load('/tmp/c_natural.npz'); b=np.load('/tmp/c_56.npz')
for k in a.files: print(k, 'registers=56 vs natural:', 'identical bits' if a[k].tobytes()==b[k].tobytes() else 'DIFFER')
"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads convnext_tiny_b8,mobilenet_v3_large_b1 \
  --rounds 2 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_depthwise.json" -- default "-cuda.conv.depthwise.vector=8" "-cuda.conv.depthwise.window.pixels=4" "-cuda.conv.depthwise.window.pixels=2" "-cuda.conv.depthwise.block=128" "-cuda.conv.depthwise.block=occupancy" "-cuda.conv.depthwise.window.registers=56" > "$OUT/routes_depthwise.txt" 2>&1
echo "routes depthwise: exit $? after $(($(date +%s) - start)) s"; tail -12 "$OUT/routes_depthwise.txt"
echo "done after $(($(date +%s) - start)) s"
