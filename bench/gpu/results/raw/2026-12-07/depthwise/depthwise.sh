#!/usr/bin/env bash
# Session 2026-12-07 (third): the depthwise window kernel (cuda.conv.depthwise.window=registers)
# and the flash kernel's skipping of masked key tiles (cuda.attention.flash.skip_masked) on the
# GPU: their CUDA tests (against the reference, and bit for bit against the direct kernel / every
# tile walked), the knob tests, whole-model outputs with and without each, in-run A/Bs on the
# three workloads with depthwise convolutions and on GPT-2, and ConvNeXt-T's profile.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz && tar -C /tmp/k/bin -xJf .device/extra.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"; cat "$OUT/info.txt"
(timeout 240 /tmp/k/bin/kiln_cuda_tests --gtest_filter='CudaNhwcConv.*:CudaFusedConv.*:CudaAttention.Flash*' 2>&1; [ -x /tmp/k/bin/kiln_knob_tests ] && timeout 120 /tmp/k/bin/kiln_knob_tests 2>&1) > "$OUT/tests.txt"
grep -E '^\[  (PASSED|FAILED)  \]|FAILED|Failure' "$OUT/tests.txt" | head -20
echo "tests after $(($(date +%s) - start)) s"
W=convnext_tiny_b8,efficientnet_b0_b8,mobilenet_v3_large_b1
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only $W,gpt2_b1_s512 --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"; tail -3 /tmp/export.log
M=/tmp/kiln-gpu-bench/models; ls $M
for w in convnext_tiny_b8 efficientnet_b0_b8; do
  for r in registers loads; do
    timeout 120 /tmp/k/bin/kiln run $M/$w/model.onnx --backend cuda --route "-cuda.precision=fp16 -cuda.conv.depthwise.window=$r" \
      --loadInputs $M/$w/inputs.npz --duration 1 --saveOutputs /tmp/o_${w}_$r.npz > /tmp/run.txt 2>&1
    echo "$w window=$r: rc=$? $(grep -m1 'GPU compute time' /tmp/run.txt)"
  done
  python3 -c "
import numpy as np
a=np.load('/tmp/o_${w}_registers.npz'); b=np.load('/tmp/o_${w}_loads.npz'); r=np.load('$M/$w/ref.npz')
for k in a.files:
  x=a[k].astype(np.float64).ravel(); y=b[k].astype(np.float64).ravel()
  print('$w', k, 'window vs direct:', 'identical bits' if a[k].tobytes()==b[k].tobytes() else 'DIFFER max abs %g' % np.abs(x-y).max())
  if k in r.files:
    z=r[k].astype(np.float64).ravel(); print('$w', k, 'window vs fp32 ref cos dist', 1-x.dot(z)/np.linalg.norm(x)/np.linalg.norm(z))
"
done
w=gpt2_b1_s512
for r in on off; do
  timeout 120 /tmp/k/bin/kiln run $M/$w/model.onnx --backend cuda --route "-cuda.precision=fp16 -cuda.attention.flash.skip_masked=$r" \
    --loadInputs $M/$w/inputs.npz --duration 1 --saveOutputs /tmp/o_${w}_$r.npz > /tmp/run.txt 2>&1
  echo "$w skip_masked=$r: rc=$? $(grep -m1 'GPU compute time' /tmp/run.txt)"
done
python3 -c "
import numpy as np
a=np.load('/tmp/o_${w}_on.npz'); b=np.load('/tmp/o_${w}_off.npz'); r=np.load('$M/$w/ref.npz')
for k in a.files:
  x=a[k].astype(np.float64).ravel(); y=b[k].astype(np.float64).ravel()
  print('$w', k, 'skip vs all tiles:', 'identical bits' if a[k].tobytes()==b[k].tobytes() else 'DIFFER max abs %g' % np.abs(x-y).max())
  if k in r.files:
    z=r[k].astype(np.float64).ravel(); print('$w', k, 'skip vs fp32 ref cos dist', 1-x.dot(z)/np.linalg.norm(x)/np.linalg.norm(z))
"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads gpt2_b1_s512 \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_gpt2.json" -- default "-cuda.attention.flash.skip_masked=off" \
  "-cuda.attention.flash.warps=2" "-cuda.attention.flash.warps=2 -cuda.attention.flash.skip_masked=off" > "$OUT/routes_gpt2.txt" 2>&1
echo "routes gpt2: exit $? after $(($(date +%s) - start)) s"; tail -7 "$OUT/routes_gpt2.txt"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads $W \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_dw.json" -- default "-cuda.conv.depthwise.window=loads" \
  "-cuda.conv.depthwise.window.pixels=8" "-cuda.conv.depthwise.window.pixels=2" "-cuda.conv.depthwise.vector=8" > "$OUT/routes_dw.txt" 2>&1
echo "routes dw: exit $? after $(($(date +%s) - start)) s"; tail -19 "$OUT/routes_dw.txt"
bench/gpu/profile.sh /tmp/k/bin/kiln $M "$OUT" convnext_tiny_b8 gpt2_b1_s512
grep -E "depthwise" "$OUT/prof_convnext_tiny_b8.txt" | head -6; grep -E "flash" "$OUT/prof_gpt2_b1_s512.txt" | head -3
echo "done after $(($(date +%s) - start)) s"
