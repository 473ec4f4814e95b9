#!/usr/bin/env bash
# 2026-12-08: split keys for the flash kernel (cuda.attention.flash.split, off by default until
# this has run; auto: 2 tiles a CTA where the unsplit grid is smaller than the GPU's SM count),
# and what the 2026-12-07 next.sh still owed. Needs the full pack (scripts/device-pack.sh; carry
# .device). In order, each step logged as it ends so that a cut-off run still returns the
# earlier ones:
#   1. the CUDA tests of the attention, depthwise, data-move and precision kernels, and every knob
#      test with its GPU half;
#   2. GPT-2 b1 s512: outputs with split auto, off and 1 against each other and the fp32
#      reference, then an A/B of off (the default), auto, 1, 2 and 4;
#   3. next.sh's Swin-T A/B: -graph.compose_row_moves.concats=off against the default.
# The depthwise A/Bs are in ../depthwise/depthwise.sh (a call of their own).
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"; cat "$OUT/info.txt"
timeout 150 /tmp/k/bin/kiln_cuda_tests --gtest_filter='CudaAttention.*:CudaNhwcConv.*:CudaFusedConv.*:CudaDataMove.*:CudaPrecision.*' > "$OUT/tests_cuda.txt" 2>&1
echo "cuda tests: exit $? after $(($(date +%s) - start)) s"
grep -E '^\[  (PASSED|FAILED)  \]|^\[  FAILED|Failure' "$OUT/tests_cuda.txt" | head -20
timeout 90 /tmp/k/bin/kiln_knob_tests > "$OUT/tests_knobs.txt" 2>&1
echo "knob tests: exit $? after $(($(date +%s) - start)) s"
grep -E '^\[  (PASSED|FAILED)  \]|^\[  FAILED|Failure' "$OUT/tests_knobs.txt" | head -20
M=/tmp/kiln-gpu-bench/models
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only gpt2_b1_s512,swin_t_b8 --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"; tail -3 /tmp/export.log
G=$M/gpt2_b1_s512
for s in auto off 1; do
  /tmp/k/bin/kiln run $G/model.onnx --backend cuda --route "-cuda.precision=fp16 -cuda.attention.flash.split=$s" \
    --loadInputs $G/inputs.npz --duration 1 --dumpProfile --saveOutputs /tmp/g_$s.npz > "$OUT/gpt2_split_$s.txt" 2>&1
  echo "split=$s: exit $?"; grep -E "GPU compute time" "$OUT/gpt2_split_$s.txt"; grep -m1 "keys split\|kiln.attention.flash" "$OUT/gpt2_split_$s.txt"
done
python3 -c "
import numpy as np
r=np.load('$G/ref.npz'); o=np.load('/tmp/g_off.npz')
for s in ['auto','1']:
  a=np.load('/tmp/g_%s.npz' % s)
  for k in a.files:
    x=a[k].astype(np.float64).ravel(); y=o[k].astype(np.float64).ravel()
    print(s, k, 'vs off: max abs %g' % np.abs(x-y).max())
    if k in r.files:
      z=r[k].astype(np.float64).ravel()
      for n,v in (('split='+s,x),('off',y)): print(n, k, 'vs fp32 ref cos dist %.3g' % (1-v.dot(z)/np.linalg.norm(v)/np.linalg.norm(z)))
"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads gpt2_b1_s512 \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_split.json" -- default \
  "-cuda.attention.flash.split=auto" "-cuda.attention.flash.split=1" "-cuda.attention.flash.split=2" "-cuda.attention.flash.split=4" > "$OUT/routes_split.txt" 2>&1
echo "routes split: exit $? after $(($(date +%s) - start)) s"; tail -7 "$OUT/routes_split.txt"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads swin_t_b8 \
  --rounds 2 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_merge.json" -- default "-graph.compose_row_moves.concats=off" > "$OUT/routes_merge.txt" 2>&1
echo "routes merge: exit $? after $(($(date +%s) - start)) s"; tail -4 "$OUT/routes_merge.txt"
echo "done after $(($(date +%s) - start)) s"
