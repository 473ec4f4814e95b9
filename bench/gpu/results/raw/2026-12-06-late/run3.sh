#!/usr/bin/env bash
# Session 2026-12-06 (late) GPU call: the GPU lock by UUID against nvidia-smi, the --gpus tests on
# 16 cores, then issue 11's one-GPU half (a mixed study of two benchmark workloads, --gpus 0).
set -uo pipefail
start=$(date +%s)
rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz || exit 1
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
build=$(cat /tmp/k/BUILD_DIR)
mkdir -p "$build/models" "$build/tests" && ln -sf /tmp/k/bin/kiln "$build/kiln" &&
  ln -sf /tmp/k/bin/kiln_faulty "$build/tests/kiln_faulty" && cp /tmp/k/models/sample_cnn.onnx "$build/models/"
cp /tmp/k/COMMIT "$OUT/commit.txt"
ldd /tmp/k/bin/kiln | grep -E 'not found|libpq' > "$OUT/ldd.txt"; cat "$OUT/ldd.txt"
nvidia-smi -L | tee "$OUT/gpus.txt"
ls /usr/lib/postgresql 2>&1 | head -2
# Two kiln tune --backend cuda on one GPU: the second is refused, naming the GPU's UUID.
mkdir -p /tmp/lock && cd /tmp/lock
/tmp/k/bin/kiln tune /tmp/k/models/sample_cnn.onnx --backend cuda --tune '-cuda.graphs=* -cuda.precision=[fp32|fp16]' \
  --cache a.db --accuracy-threshold 1e-3 > "$OUT/lock-first.txt" 2>&1 &
first=$!
sleep 3
/tmp/k/bin/kiln tune /tmp/k/models/sample_cnn.onnx --backend cuda --tune '-cuda.graphs=*' --cache b.db > "$OUT/lock-second.txt" 2>&1
echo "second tune: exit $? $(cat "$OUT/lock-second.txt" | tail -1)"
wait $first; echo "first tune: exit $? $(grep -E '^winner' "$OUT/lock-first.txt")"
ls -la /tmp/kiln-gpu-*.lock
cd - > /dev/null
(cd /tmp && timeout 150 /tmp/k/bin/kiln_tune_tests --gtest_filter='*SeveralGpus*:*StatusAndBest*:*TunesOnTheGpu*' > "$OUT/tune_tests.txt" 2>&1)
echo "tune tests: exit $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tune_tests.txt" | tr '\n' ' ')"
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only resnet50_b1,bert_base_b8_s128 \
  --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > "$OUT/export.log" 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"
for w in resnet50_b1 bert_base_b8_s128; do
  m=/tmp/kiln-gpu-bench/models/$w
  ls $m > /dev/null 2>&1 || { echo "$w: no export"; continue; }
  left=$((440 - ($(date +%s) - start)))
  ((left < 60)) && { echo "$w: no time left"; continue; }
  t0=$(date +%s.%N)
  (cd /tmp && rm -rf s-$w && mkdir s-$w && cd s-$w && timeout $left /tmp/k/bin/kiln tune $m/model.onnx --backend cuda \
    --tune '-cuda.precision=[fp32|tf32|fp16] -cuda.graphs=* -cuda.layout=*' --search mixed --cache t.db \
    --accuracy-threshold 1e-3 --loadInputs $m/inputs.npz --loadRefOutputs $m/ref.npz --gpus 0 > "$OUT/tune-$w.txt" 2>&1)
  rc=$?
  echo "$w: exit $rc wall $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s $(grep -E '^winner|trials in' "$OUT/tune-$w.txt" | tr '\n' ' ')"
  cp /tmp/s-$w/t.db "$OUT/tune-$w.db" 2>/dev/null
done
echo "total $(($(date +%s) - start)) s"
