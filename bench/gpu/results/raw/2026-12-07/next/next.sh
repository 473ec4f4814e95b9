#!/usr/bin/env bash
# Written at the end of the third 2026-12-07 session, for the next device call (the session's
# device time was spent): what that session changed after its last call. It needs the full pack
# (scripts/device-pack.sh, one archive with every test binary since 7cf957c; carry .device).
#   1. the CUDA tests of the depthwise, flash, data-move and precision kernels, and every knob
#      test with its GPU half (the new knobs' GPU halves have never run);
#   2. whether graph.compose_row_moves.concats fires on Swin-T's patch merging (Slice and Concat
#      counts), Swin-T's outputs with it on and off, against each other and the fp32 reference;
#   3. an in-run A/B: Swin-T with -graph.compose_row_moves.concats=off, and the depthwise channel
#      run's new default (auto: 4 bytes at fp16) against 8 on the three depthwise workloads.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"; cat "$OUT/info.txt"
(timeout 240 /tmp/k/bin/kiln_cuda_tests --gtest_filter='CudaNhwcConv.*:CudaFusedConv.*:CudaAttention.Flash*:CudaDataMove.*:CudaPrecision.*' 2>&1
 timeout 150 /tmp/k/bin/kiln_knob_tests 2>&1) > "$OUT/tests.txt"
grep -E '^\[  (PASSED|FAILED)  \]|FAILED|Failure' "$OUT/tests.txt" | head -20
echo "tests after $(($(date +%s) - start)) s"
W=swin_t_b8,convnext_tiny_b8,efficientnet_b0_b8,mobilenet_v3_large_b1
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only $W --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"; tail -3 /tmp/export.log
M=/tmp/kiln-gpu-bench/models
for r in on off; do
  /tmp/k/bin/kiln run $M/swin_t_b8/model.onnx --backend cuda --route "-cuda.precision=fp16 -graph.compose_row_moves.concats=$r" \
    --loadInputs $M/swin_t_b8/inputs.npz --duration 1 --dump-ir-after compose_row_moves --saveOutputs /tmp/o_$r.npz > /tmp/ir.txt 2>&1
  echo "concats=$r: Slice $(grep -c ' = Slice ' /tmp/ir.txt) Concat $(grep -c ' = Concat ' /tmp/ir.txt) Gather $(grep -c ' = Gather ' /tmp/ir.txt)"; grep -E "GPU compute time" /tmp/ir.txt
done
python3 -c "
import numpy as np
a=np.load('/tmp/o_on.npz'); b=np.load('/tmp/o_off.npz'); r=np.load('$M/swin_t_b8/ref.npz')
for k in a.files:
  x=a[k].astype(np.float64).ravel(); y=b[k].astype(np.float64).ravel()
  print(k, 'on vs off:', 'identical bits' if a[k].tobytes()==b[k].tobytes() else 'DIFFER max abs %g' % np.abs(x-y).max())
  if k in r.files:
    z=r[k].astype(np.float64).ravel(); print(k, 'on vs fp32 ref cos dist', 1-x.dot(z)/np.linalg.norm(x)/np.linalg.norm(z))
"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads swin_t_b8 \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_merge.json" -- default "-graph.compose_row_moves.concats=off" > "$OUT/routes_merge.txt" 2>&1
echo "routes merge: exit $? after $(($(date +%s) - start)) s"; tail -4 "$OUT/routes_merge.txt"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads convnext_tiny_b8,efficientnet_b0_b8,mobilenet_v3_large_b1 \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_vector.json" -- default "-cuda.conv.depthwise.vector=8" > "$OUT/routes_vector.txt" 2>&1
echo "routes vector: exit $? after $(($(date +%s) - start)) s"; tail -8 "$OUT/routes_vector.txt"
echo "done after $(($(date +%s) - start)) s"
