#!/usr/bin/env bash
# One device call of a tuning campaign over the GPU workloads that may take several calls: unpack
# kiln (scripts/device-pack.sh [--kiln-only], carried as .device/), export the workloads that are
# not exported yet, then advance each workload's `kiln tune --search mixed` with
# bench/gpu/tune.py --no-ab, continuing from .device/tune-state/ when an earlier call left one
# there, for about SECONDS in all. The device tool brings back at most 8 files, so everything comes
# back as one archive, $OUT/tune.tar.xz (stores, logs, reports, tune.py's JSON). A store's data
# folder (its copies of inputs.npz and ref.npz) goes in only when under 8 MB: GPT-2's logits alone
# are 100 MB. `kiln tune --continue` needs that folder, so only stores that came back with it can be
# continued: unpack the archive to .device/tune-state/ before the next call (carry [".device"]).
# When every workload's run says it finished, run tune.py without --no-ab for the A/B table.
#
# Usage: bench/gpu/tune-campaign.sh WORKLOADS SECONDS [TUNE_FILE]
#   WORKLOADS  comma-separated names from workloads.py
#   SECONDS    the call's budget for tuning (leave time for the export and the copy back)
#   TUNE_FILE  the route expression (default examples/cuda.tune)
# The stores keep their model, report and timing-cache paths: the models go to /tmp/kiln-gpu-bench
# and the stores to $OUT/tune in every call, and the export must give the same model file (it
# is seeded) or `kiln tune --continue` refuses the changed model.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
workloads="${1:?workloads}"
seconds="${2:?seconds}"
tune_file="${3:-$root/examples/cuda.tune}"
: "${OUT:?OUT must name the folder that comes back}"
start=$(date +%s)
if [[ ! -x /tmp/k/bin/kiln ]]; then
  mkdir -p /tmp/k && tar -C /tmp/k -xJf "$root/.device/kiln-device.tar.xz" || exit 1
fi
export LD_LIBRARY_PATH=/tmp/k/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib
"$here/run.sh" --kiln /tmp/k/bin/kiln --stages export --only "$workloads" \
  --work /tmp/kiln-gpu-bench --out /tmp/kiln-gpu-export > "$OUT/export.log" 2>&1
resume=()
[[ -d "$root/.device/tune-state/tune" ]] && resume=(--resume "$root/.device/tune-state/tune")
count=$(tr ',' '\n' <<< "$workloads" | grep -c .)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 1)
((gpus < 1)) && gpus=1
left=$((seconds - ($(date +%s) - start)))
# Each GPU tunes ceil(count / gpus) workloads one after another.
per_gpu=$(((count + gpus - 1) / gpus))
each=$((left / per_gpu - 10))
((each < 30)) && each=30
echo "tuning $count workloads on $gpus GPU(s), about $each s each"
python3 "$here/tune.py" --kiln /tmp/k/bin/kiln --models /tmp/kiln-gpu-bench/models \
  --workloads "$workloads" --tune-file "$tune_file" --out "$OUT/tune" --no-ab --gpus "$gpus" \
  --timeout $((each + 60)) --tune-args "--tuning-timeout $each" "${resume[@]}"
grep -h -E 'finished|incomplete' "$OUT"/tune/tune-*.log 2>/dev/null | tail -20
(cd "$OUT" && find tune -type f ! -name '*.lock' \( ! -path '*/data/*' -o -size -8M \) -print0 |
  tar --null -T - -cf - | xz -T0 -6 > tune.tar.xz) && rm -rf "$OUT/tune"
ls -la "$OUT/tune.tar.xz"
echo "call took $(($(date +%s) - start)) s"
