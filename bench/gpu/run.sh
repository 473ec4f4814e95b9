#!/usr/bin/env bash
# The GPU benchmark suite in one command on the device machine: per workload, export it from
# PyTorch (skipped when already exported), time kiln and PyTorch's peers side by side, and rewrite
# the report, so that a run cut short by the time limit still reports every finished workload.
#
# Usage: bench/gpu/run.sh --kiln PATH [--out DIR] [--work DIR] [--only a,b] [--quick]
#          [--budget SECONDS] [--min-left SECONDS] [--no-max-autotune] [--reference-executor]
#          [--route TOKENS] [--fp16-route TOKENS] [--stages export,peers,kiln]
#          [--cache FILE] [--kiln-timeout SECONDS]
#   --out       results folder (default $OUT, else WORK/results): results.md, results.json,
#               peers.json, kiln.json, max_autotune.json, run.log
#   --work      exported models, reused by later runs on the same machine
#               (default /tmp/kiln-gpu-bench)
#   --only      comma-separated workloads (default all ten; see workloads.py)
#   --quick     30 timed runs instead of 100, shorter warm-ups, max-autotune from the cache only
#   --budget    seconds the whole run may take (default 540, inside the device tool's 600); a
#               workload starts only while --min-left seconds (default 150, 90 with --quick)
#               remain, and the rest are rows that say they were not run
#   --no-max-autotune  never compile max-autotune; cached figures are still shown
#   --cache     max-autotune figures (default bench/gpu/max_autotune.json; copied to --out)
#   --reference-executor  also compare with kiln's reference executor (slow: minutes a model)
# Environment: PYTHON (default python3, the one with torch).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command_line="bench/gpu/run.sh $*"

kiln=""
out="${OUT:-}"
work="/tmp/kiln-gpu-bench"
only=""
quick=0
budget=540
min_left=""
max_autotune=1
reference_executor=0
route=""
fp16_route=""
stages="export,peers,kiln"
cache="$here/max_autotune.json"
kiln_timeout=300

usage() { sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "run.sh: $*" >&2; exit 2; }
while (($#)); do
  option="$1"
  case "$option" in
    --*=*) value="${option#*=}"; option="${option%%=*}"; shift ;;
    --quick | --no-max-autotune | --reference-executor | -h | --help) value=""; shift ;;
    *) (($# >= 2)) || die "$option needs a value"; value="$2"; shift 2 ;;
  esac
  case "$option" in
    --kiln) kiln="$value" ;;
    --out) out="$value" ;;
    --work) work="$value" ;;
    --only) only="$value" ;;
    --quick) quick=1 ;;
    --budget) budget="$value" ;;
    --min-left) min_left="$value" ;;
    --no-max-autotune) max_autotune=0 ;;
    --reference-executor) reference_executor=1 ;;
    --route) route="$value" ;;
    --fp16-route) fp16_route="$value" ;;
    --stages) stages="$value" ;;
    --cache) cache="$value" ;;
    --kiln-timeout) kiln_timeout="$value" ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $option (--help lists them)" ;;
  esac
done
[[ -n "$min_left" ]] || min_left=$((quick ? 90 : 150))
[[ -n "$out" ]] || out="$work/results"
has_stage() { [[ ",$stages," == *",$1,"* ]]; }
if has_stage kiln; then
  [[ -n "$kiln" ]] || die "--kiln PATH is required (or leave kiln out of --stages)"
  [[ -x "$kiln" ]] || die "$kiln is not an executable"
  kiln="$(cd "$(dirname "$kiln")" && pwd)/$(basename "$kiln")"
fi

py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
deadline=$((start + budget))
mkdir -p "$out" "$work/models" || die "cannot create $out or $work"
rm -f "$out/peers.json" "$out/kiln.json" "$out/results.md" "$out/results.json" "$out/run.log"
exec > >(tee -a "$out/run.log") 2>&1
tee_pid=$!

list_names='import sys, workloads; print(" ".join(w.name for w in workloads.select(sys.argv[1])))'
names="$("$py" -c "$list_names" "$only")" || die "bad --only"
selected="$(tr ' ' ',' <<<"$names")"
echo "command: $command_line"
echo "started: $(date -u +%FT%TZ); budget ${budget} s; workloads: $names"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
  --format=csv 2>/dev/null || echo "nvidia-smi: not available"

peer_flags=(--max-autotune-cache "$cache" --deadline "$deadline")
kiln_flags=(--deadline "$deadline" --timeout "$kiln_timeout")
((quick)) && peer_flags+=(--quick) && kiln_flags+=(--quick)
((max_autotune)) || peer_flags+=(--no-max-autotune)
((reference_executor)) && kiln_flags+=(--reference-executor)
[[ -n "$route" ]] && kiln_flags+=("--route=$route")
[[ -n "$fp16_route" ]] && kiln_flags+=("--fp16-route=$fp16_route")

report() {  # rewrites results.md/results.json; $1 says what a cell with no result means
  "$py" "$here/report.py" "$out/peers.json" "$out/kiln.json" --md "$out/results.md" \
    --json "$out/results.json" --workloads "$selected" --why-missing "$1" \
    --command "$command_line" || echo "report.py failed (exit $?)"
  [[ -f "$cache" ]] && cp "$cache" "$out/max_autotune.json"
}

skipped=()
crashes=()
crashed() {  # a script that exited abnormally: said in the log and in the empty cells' note
  echo "$1 exited with status $2 on $name"
  crashes+=("$1 exited with status $2 on $name")
}
for name in $names; do
  left=$((deadline - $(date +%s)))
  if ((left < min_left)); then
    skipped+=("$name")
    continue
  fi
  echo
  echo "=== $name: ${left} s left of the budget"
  if has_stage export; then
    "$py" "$here/export.py" --out "$work/models" --only "$name" || crashed export.py $?
  fi
  # kiln before the peers: a max-autotune compile that outlasts the call then costs only itself.
  if has_stage kiln; then
    "$py" "$here/kiln_runs.py" --kiln "$kiln" --models "$work/models" --out "$out/kiln.json" \
      --only "$name" "${kiln_flags[@]}" || crashed kiln_runs.py $?
    report "not run yet"
  fi
  if has_stage peers; then
    "$py" "$here/peers.py" --models "$work/models" --out "$out/peers.json" --only "$name" \
      "${peer_flags[@]}" || crashed peers.py $?
  fi
  report "not run yet"
done

if ((${#skipped[@]})); then
  rest="$(IFS=,; echo "${skipped[*]}")"
  why="not run: the time budget (--budget ${budget} s) ran out first; run again with --only $rest"
  echo
  echo "not run (time budget): $rest"
elif [[ "$stages" != "export,peers,kiln" ]]; then
  why="not measured in this run (--stages $stages)"
else
  why="not measured in this run"
fi
if ((${#crashes[@]})); then
  joined="$(IFS=';'; echo "${crashes[*]}")"
  why="$why; ${joined//;/; } (see run.log)"
fi
report "$why"
echo
echo "finished: $(date -u +%FT%TZ), $(($(date +%s) - start)) s; results in $out"
echo
cat "$out/results.md"
exec >&- 2>&-
wait "$tee_pid" 2>/dev/null  # run.log and the output complete before the command returns
