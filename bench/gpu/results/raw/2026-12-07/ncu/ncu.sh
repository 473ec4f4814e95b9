#!/usr/bin/env bash
# Fourth 2026-12-07 session: where the replay's GPU time goes, kernel by kernel, for the four
# workloads torch.compile still wins (Swin-T, ConvNeXt-T, MobileNetV3-L, GPT-2), read with Nsight
# Compute (clocks left alone) rather than from --dumpProfile's step-by-step times, plus one
# detailed section set of the hottest depthwise and flash kernels, and torch.compile's kernels
# for the same four (torch_kernels.py). Needs the pack (carry .device) and the models that
# next.sh exported to /tmp/kiln-gpu-bench (it exports them itself where they are missing).
# bench/gpu/ncu_table.py turns each workload's two logs into one inference's kernel table
# ($OUT/ncu_<workload>.md). Not yet run (no device in the 2026-12-07 and 12-08 sessions).
set -uo pipefail
start=$(date +%s)
[[ -x /tmp/k/bin/kiln ]] || { rm -rf /tmp/k && mkdir -p /tmp/k && tar -C /tmp/k -xJf .device/kiln-device.tar.xz || exit 1; }
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
W=swin_t_b8,convnext_tiny_b8,mobilenet_v3_large_b1,gpt2_b1_s512
M=/tmp/kiln-gpu-bench/models
(unset LD_LIBRARY_PATH; bench/gpu/run.sh --kiln /tmp/k/bin/kiln --stages export --only $W --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > /tmp/export2.log 2>&1)
echo "export: exit $? after $(($(date +%s) - start)) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; "$NCU" --version | tail -1
for w in ${W//,/ }; do
  # One timed run and then two: the second list's extra kernels are one inference, and its last
  # that many are the last replay's kernels.
  for it in 1 2; do
    timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file "$OUT/ncu_${w}_$it.csv" /tmp/k/bin/kiln run $M/$w/model.onnx --backend cuda \
      --route "-cuda.precision=fp16" --loadInputs $M/$w/inputs.npz --warmUp 0 --iterations $it \
      --duration 0 > /tmp/ncu_run.txt 2>&1 || { echo "$w it=$it failed"; tail -5 /tmp/ncu_run.txt; }
  done
  echo "$w: $(grep -c gpu__time_duration "$OUT/ncu_${w}_1.csv") / $(grep -c gpu__time_duration "$OUT/ncu_${w}_2.csv") kernels after $(($(date +%s) - start)) s"
  python3 bench/gpu/ncu_table.py "$OUT/ncu_${w}_1.csv" "$OUT/ncu_${w}_2.csv" --top 20 > "$OUT/ncu_${w}.md" 2>&1; head -14 "$OUT/ncu_${w}.md"
done
# Detailed sections of one launch of each hot kernel of kiln's.
timeout 120 "$NCU" --clock-control none --set detailed -k regex:depthwiseWindow --launch-count 2 \
  /tmp/k/bin/kiln run $M/convnext_tiny_b8/model.onnx --backend cuda --route "-cuda.precision=fp16" \
  --loadInputs $M/convnext_tiny_b8/inputs.npz --warmUp 0 --iterations 1 --duration 0 > "$OUT/ncu_depthwise_detail.txt" 2>&1
timeout 120 "$NCU" --clock-control none --set detailed -k regex:flash --launch-count 1 \
  /tmp/k/bin/kiln run $M/gpt2_b1_s512/model.onnx --backend cuda --route "-cuda.precision=fp16" \
  --loadInputs $M/gpt2_b1_s512/inputs.npz --warmUp 0 --iterations 1 --duration 0 > "$OUT/ncu_flash_detail.txt" 2>&1
echo "details after $(($(date +%s) - start)) s"
(unset LD_LIBRARY_PATH; timeout 200 python3 bench/gpu/repro/torch_kernels.py ${W//,/ } --runs 20 --top 60 > "$OUT/torch_kernels.txt" 2>&1)
echo "torch kernels: exit $? after $(($(date +%s) - start)) s"; grep '^==' "$OUT/torch_kernels.txt"
