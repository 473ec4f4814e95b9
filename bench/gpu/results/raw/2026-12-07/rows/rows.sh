#!/usr/bin/env bash
# Session 2026-12-07 (second): graph.compose_row_moves and cuda.gather.vector on the GPU: their
# tests, whether the pass fires on Swin-T, the outputs with and without it, then an in-run A/B on
# the workloads with Gathers, and the owed cuda.pool.vector A/B.
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz && tar -C /tmp/k/bin -xJf .device/extra.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
{ cat /tmp/k/COMMIT; nvidia-smi -L; } > "$OUT/info.txt"; cat "$OUT/info.txt"
(timeout 200 /tmp/k/bin/kiln_cuda_tests --gtest_filter='CudaDataMove.*:CudaPool.*' 2>&1; timeout 120 /tmp/k/bin/kiln_knob_tests 2>&1) > "$OUT/tests.txt"
grep -E '^\[  (PASSED|FAILED)  \]|FAILED|Failure' "$OUT/tests.txt" | head -20
echo "tests after $(($(date +%s) - start)) s"
W=swin_t_b8,gpt2_b1_s512,resnet50_b32,deeplabv3_resnet50_b1
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only $W --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"; tail -3 /tmp/export.log
M=/tmp/kiln-gpu-bench/models; ls $M
SM=$M/swin_t_b8/model.onnx; LI="--loadInputs $M/swin_t_b8/inputs.npz"
echo "swin: $SM $LI"
for r in "" "-graph.compose_row_moves=off"; do
  /tmp/k/bin/kiln run $SM --backend cuda --route "-cuda.precision=fp16 $r" $LI --duration 1 --dump-ir-after compose_row_moves --saveOutputs /tmp/o$([ -z "$r" ] && echo on || echo off).npz > /tmp/ir.txt 2>&1
  echo "route [$r]: Gather $(grep -c ' = Gather ' /tmp/ir.txt) Transpose $(grep -c ' = Transpose ' /tmp/ir.txt)"; grep -E "GPU compute time" /tmp/ir.txt
done
python3 -c "
import numpy as np
a=np.load('/tmp/oon.npz'); b=np.load('/tmp/ooff.npz'); r=np.load('$M/swin_t_b8/ref.npz')
print('ref arrays', r.files, 'ours', a.files)
for k in a.files:
  if k in r.files:
    for name,o in (('on',a),('off',b)):
      x=o[k].astype(np.float64).ravel(); y=r[k].astype(np.float64).ravel()
      print(k, name, 'vs fp32 ref cos dist', 1-x.dot(y)/np.linalg.norm(x)/np.linalg.norm(y))
  x=a[k].astype(np.float64).ravel(); y=b[k].astype(np.float64).ravel()
  print(k, 'identical' if np.array_equal(a[k],b[k]) else 'differ', 'cos dist', 1-x.dot(y)/np.linalg.norm(x)/np.linalg.norm(y), 'max abs', np.abs(x-y).max())
"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads swin_t_b8,gpt2_b1_s512 \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_rows.json" -- default "-graph.compose_row_moves=off" "-cuda.gather.vector=on" "-graph.compose_row_moves=off -cuda.gather.vector=on" > "$OUT/routes_rows.txt" 2>&1
echo "routes rows: exit $? after $(($(date +%s) - start)) s"; tail -14 "$OUT/routes_rows.txt"
python3 bench/gpu/routes.py --kiln /tmp/k/bin/kiln --models $M --workloads resnet50_b32,deeplabv3_resnet50_b1 \
  --rounds 3 --duration 1 --base=-cuda.precision=fp16 --json "$OUT/routes_pool.json" -- default "-cuda.pool.vector=off" > "$OUT/routes_pool.txt" 2>&1
echo "routes pool: exit $? after $(($(date +%s) - start)) s"; tail -8 "$OUT/routes_pool.txt"
bench/gpu/profile.sh /tmp/k/bin/kiln $M "$OUT" swin_t_b8 > /dev/null 2>&1
grep -E "Gather|Transpose" "$OUT/prof_swin_t_b8.txt" | head -30
# GPT-2's attention mask as the flash kernel gets it: is it a constant (of what type), for skipping
# the key tiles a causal mask hides.
/tmp/k/bin/kiln run $M/gpt2_b1_s512/model.onnx --backend cuda --route -cuda.precision=fp16 --loadInputs $M/gpt2_b1_s512/inputs.npz \
  --duration 0.2 --dump-ir-after eliminate_dead_nodes > "$OUT/gpt2_ir.txt" 2>&1
grep -m2 "Attention" "$OUT/gpt2_ir.txt"
python3 - "$M/gpt2_b1_s512/model.onnx" <<'PY' 2>&1 | tail -12
import sys, onnx, numpy as np
from onnx import numpy_helper
m = onnx.load(sys.argv[1], load_external_data=False)
ops = {}
for n in m.graph.node: ops[n.op_type] = ops.get(n.op_type, 0) + 1
print("ops", sorted(ops.items(), key=lambda x: -x[1])[:25])
for n in m.graph.node:
    if n.op_type in ("Trilu", "Where", "ScaledDotProductAttention", "Attention") : print(n.op_type, list(n.input)[:4]); break
PY
echo "done after $(($(date +%s) - start)) s"
