#!/usr/bin/env bash
# The ONNX backend test suite's pytorch-converted models as a smoke set: for each, kiln's default
# route and ONNX Runtime 1.30's CPU execution provider (bench/cpu/ort/ort_run.mjs, all graph
# optimisations) at one thread on the same inputs (the suite's test_data_set_0, converted by
# pb_to_npz.py; seeded ones where a model has none), their medians, and whether the outputs
# agree (cosine distance <= 1e-5, or every element within 1e-5 + 1e-4 x the largest |y|, for
# outputs too small or too constant for a cosine). A model kiln or ORT cannot run is a row that
# says so; the run goes on. Prints a Markdown table and a summary; writes the rows as JSON.
# The set is for coverage and agreement, not speed: most of these models run in microseconds, where
# ORT's time through Node.js is mostly its binding's per-call cost (about 15 us), so kiln / ORT
# ratios there say nothing about either runtime; bench/cpu/vs_ort.sh compares speed.
#
# Usage: bench/cpu/smoke.sh [--data DIR] [--seconds S] [--out FILE.json]
#   --data     the suite's folder (default /usr/share/libonnx-testdata/data/pytorch-converted)
#   --seconds  timed seconds per model and runtime (default 0.3)
#   --out      the JSON file (default out/smoke.json)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
data="/usr/share/libonnx-testdata/data/pytorch-converted"
seconds=0.3
out="$root/out/smoke.json"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "smoke.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
ls "$data"/*/model.onnx >/dev/null 2>&1 || { echo "smoke.sh: no */model.onnx under $data" >&2; exit 2; }
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get install -y nodejs npm >/dev/null
fi
ort_dir="$root/bench/cpu/ort"
if [[ ! -d "$ort_dir/node_modules/onnxruntime-node" ]]; then
  (cd "$ort_dir" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null) || exit 1
fi
"$root/scripts/build.sh" kiln_cli >/dev/null || exit 1
kiln="$root/build/kiln"
mkdir -p "$(dirname "$out")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

rows="$work/rows.jsonl"
for model in "$data"/*/model.onnx; do
  name="$(basename "$(dirname "$model")")"
  kiln_status=ok ort_status=ok
  # The suite's inputs, input_i.pb for the model's i-th input, when there are some.
  rm -f "$work/in.npz"
  mapfile -t names < <("$kiln" inspect "$model" 2>/dev/null |
    sed -n '/^inputs:/,/^outputs:/{s/^  \(.*\) : .*/\1/p}')
  specs=()
  for i in "${!names[@]}"; do
    pb="$(dirname "$model")/test_data_set_0/input_$i.pb"
    [[ -f "$pb" ]] && specs+=("${names[$i]}=$pb")
  done
  inputs=(--saveInputs "$work/in.npz")
  if ((${#specs[@]} == ${#names[@]} && ${#names[@]} > 0)) &&
    python3 "$root/bench/cpu/pb_to_npz.py" "$work/in.npz" "${specs[@]}" 2>>"$work/convert.log"; then
    inputs=(--loadInputs "$work/in.npz")
  fi
  "$kiln" run "$model" --route "-cpu.threads=1" --duration "$seconds" "${inputs[@]}" \
    --saveOutputs "$work/out.npz" --exportTimes "$work/kiln.json" \
    >"$work/kiln.log" 2>&1 || kiln_status="$(grep -m1 'error' "$work/kiln.log" | cut -c1-160)"
  if [[ "$kiln_status" == ok ]]; then
    node "$ort_dir/ort_run.mjs" "$model" "$work/in.npz" 1 "$seconds" "$work/out.npz" \
      >"$work/ort.json" 2>"$work/ort.log" || ort_status="$(grep -v '^\s*$' "$work/ort.log" | tail -1 | cut -c1-200)"
  else
    ort_status="not run"
  fi
  python3 - "$name" "$kiln_status" "$ort_status" "$work/kiln.json" "$work/ort.json" "${inputs[0]}" >>"$rows" <<'PY'
import json, statistics, sys
name, kiln_status, ort_status, kiln_file, ort_file, inputs = sys.argv[1:]
row = {"model": name, "kiln": None, "ort": None, "agree": None, "kilnError": None, "ortError": None,
       "inputs": "the suite's" if inputs == "--loadInputs" else "seeded"}
if kiln_status != "ok":
    row["kilnError"] = kiln_status
else:
    row["kiln"] = statistics.median(t["latencyMs"] for t in json.load(open(kiln_file)))
if ort_status != "ok":
    row["ortError"] = ort_status
elif kiln_status == "ok":
    ort = json.load(open(ort_file))
    row["ort"] = ort["medianMs"]
    def agrees(o):
        if "error" in o:
            return False
        close = o["maxAbs"] <= 1e-5 + 1e-4 * o["maxRef"]
        return o["cosineDistance"] <= 1e-5 or close
    row["outputs"] = ort["outputs"]
    row["agree"] = bool(ort["outputs"]) and all(agrees(o) for o in ort["outputs"])
print(json.dumps(row))
PY
done

python3 - "$rows" "$out" "$data" "$seconds" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
out, data, seconds = sys.argv[2], sys.argv[3], sys.argv[4]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {cpu}; command: bench/cpu/smoke.sh --data {data} --seconds {seconds}\n")
print("| model | inputs | kiln median ms | ORT median ms | kiln / ORT | outputs agree |")
print("|---|---|---|---|---|---|")
for r in rows:
    k, o = r["kiln"], r["ort"]
    if r["kilnError"]:
        print(f"| {r['model']} | {r['inputs']} | kiln failed: {r['kilnError']} | — | — | — |")
        continue
    if r["ortError"]:
        print(f"| {r['model']} | {r['inputs']} | {k:.4f} | ORT failed: {r['ortError'].strip()} | — | — |")
        continue
    print(f"| {r['model']} | {r['inputs']} | {k:.4f} | {o:.4f} | {k / o:.2f} | "
          f"{'yes' if r['agree'] else '**no**'} |")
ran = [r for r in rows if r["agree"] is not None]
print(f"\n{len(rows)} models: kiln ran {sum(1 for r in rows if not r['kilnError'])}, "
      f"both ran {len(ran)}, outputs agree on {sum(1 for r in ran if r['agree'])} "
      f"(times under 0.1 ms are mostly per-call overhead: see the script's header)")
json.dump({"data": data, "seconds": float(seconds), "rows": rows}, open(out, "w"), indent=1)
print(f"JSON: {out}")
PY
