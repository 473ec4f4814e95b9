#!/usr/bin/env bash
# kiln's CPU backend against ONNX Runtime 1.30's CPU execution provider (all graph optimisations
# on), both at 1 and 2 threads, on the same inputs, one model after the other in one run: kiln's
# default route (or the route given), ONNX Runtime through the onnxruntime-node package (its
# install scripts disabled; the package ships the native library). Checks that the outputs agree
# (cosine distance at most 1e-5 on every output) and prints a Markdown table with medians and
# p10–p90, writing the same as JSON. With --tune, kiln's tuned engine too: `kiln tune --search
# mixed` over the expression at each thread count (cosine distance <= 1e-5 against the reference
# executor), its winner run beside the default route on the same inputs. A model whose classifier
# head is all zero (vit_tiny) runs as a copy with seeded random head weights (tools/reinit_zero_head.cc),
# so that its outputs depend on its input and the checks check something.
#
# The runtimes take turns: each model and thread count is timed in --rounds rounds, each round
# running kiln, the tuned engine and ONNX Runtime one after the other for seconds/rounds each, and
# every latency of every round goes into one median, so that a slow spell of a shared machine
# falls on all of them rather than on whichever ran then. The JSON keeps each round's medians.
#
# Usage: bench/cpu/vs_ort.sh [--models DIR] [--seconds S] [--rounds R] [--route TOKENS]
#                            [--out FILE.json] [--tune EXPR] [--tuning-timeout S]
#   --models   folder of .onnx files (default ../shared/models)
#   --seconds  timed seconds per model, runtime and thread count, over all rounds (default 3)
#   --rounds   turns each runtime takes per model and thread count (default 3)
#   --route    kiln's route (default: the default route)
#   --out      the JSON file (default out/vs_ort.json)
#   --tune     a route expression to tune per model and thread count (e.g. '-cpu.conv.algo=*')
#   --tuning-timeout  seconds each tuning may take (default 300)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
models="$root/../shared/models"
seconds=3
rounds=3
route=""
tune=""
tuning_timeout=300
out="$root/out/vs_ort.json"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --route) route="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tune) tune="$2"; shift 2 ;;
    --tuning-timeout) tuning_timeout="$2"; shift 2 ;;
    -h|--help) sed -n 2,25p "$0"; exit 0 ;;
    *) echo "vs_ort.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
ls "$models"/*.onnx >/dev/null 2>&1 || { echo "vs_ort.sh: no .onnx files in $models" >&2; exit 2; }

# The peer: Node.js and npm from Debian, onnxruntime-node as bench/cpu/ort/package-lock.json pins it.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get install -y nodejs npm >/dev/null
fi
ort_dir="$root/bench/cpu/ort"
if [[ ! -d "$ort_dir/node_modules/onnxruntime-node" ]]; then
  (cd "$ort_dir" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
fi
"$root/scripts/build.sh" kiln_cli kiln_reinit_zero_head >/dev/null
kiln="$root/build/kiln"
mkdir -p "$(dirname "$out")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A model whose classifier head is all zero (the shared vit_tiny: torchvision zeroes it) answers
# the same to every input, so neither the agreement check nor the tuner's accuracy threshold
# would see a wrong result. Each model is run as a copy whose zero head weights are refilled with
# seeded random values (the same graph and work; other models are copied unchanged).
mkdir -p "$work/models"
refilled="$work/refilled.txt"
: > "$refilled"
for model in "$models"/*.onnx; do
  name="$(basename "$model" .onnx)"
  note="$("$root/build/kiln_reinit_zero_head" "$model" "$work/models/$name.onnx")" ||
    { echo "vs_ort.sh: cannot copy $model" >&2; exit 1; }
  if [[ "$note" == refilled* ]]; then echo "$name: $note" | tr '\n' ' ' >> "$refilled"; echo >> "$refilled"; fi
done
source_models="$models"
models="$work/models"

summary() {  # "median p10 p90 round-medians" over kiln --exportTimes files or ort_run.mjs results
  python3 - "$@" <<'PY'
import json, statistics, sys
rounds = []
for path in sys.argv[1:]:
    data = json.load(open(path))
    rounds.append(data["latenciesMs"] if isinstance(data, dict) else [t["latencyMs"] for t in data])
xs = sorted(x for r in rounds for x in r)
q = lambda p: xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]
each = ",".join(f"{statistics.median(r):.3f}" for r in rounds)
print(f"{statistics.median(xs):.3f} {q(0.1):.3f} {q(0.9):.3f} {each}")
PY
}

rows="$work/rows.jsonl"
for model in "$models"/*.onnx; do
  name="$(basename "$model" .onnx)"
  for threads in 1 2; do
    slice="$(python3 -c "print($seconds / $rounds)")"
    # kiln writes the inputs (seeded) and its outputs for the peer to take and check.
    "$kiln" run "$model" --route "$route -cpu.threads=$threads" --duration 0 --iterations 1 \
      --saveInputs "$work/$name.in.npz" --saveOutputs "$work/$name.out.npz" \
      >"$work/$name.kiln.$threads.log" 2>&1 ||
      { echo "vs_ort.sh: kiln failed on $name:" >&2; tail -3 "$work/$name.kiln.$threads.log" >&2; exit 1; }
    engine="$work/$name.$threads.kiln"
    if [[ -n "$tune" ]]; then
      "$kiln" tune "$model" --tune "$tune -cpu.threads=$threads" --search mixed \
        --loadInputs "$work/$name.in.npz" --tuning-timeout "$tuning_timeout" \
        --saveEngine "$engine" --quiet >"$work/$name.tune.$threads.log" 2>&1 ||
        { echo "vs_ort.sh: kiln tune failed on $name:" >&2; tail -3 "$work/$name.tune.$threads.log" >&2; exit 1; }
    fi
    kfiles=() tfiles=() ofiles=()
    for ((r = 1; r <= rounds; ++r)); do
      "$kiln" run "$model" --route "$route -cpu.threads=$threads" --duration "$slice" \
        --loadInputs "$work/$name.in.npz" --exportTimes "$work/$name.kiln.$threads.$r.json" \
        >>"$work/$name.kiln.$threads.log" 2>&1 ||
        { echo "vs_ort.sh: kiln failed on $name:" >&2; tail -3 "$work/$name.kiln.$threads.log" >&2; exit 1; }
      kfiles+=("$work/$name.kiln.$threads.$r.json")
      if [[ -n "$tune" ]]; then
        "$kiln" run "$engine" --duration "$slice" --loadInputs "$work/$name.in.npz" \
          --saveOutputs "$work/$name.tuned.npz" --exportTimes "$work/$name.tuned.$threads.$r.json" \
          >>"$work/$name.tuned.$threads.log" 2>&1 ||
          { echo "vs_ort.sh: the tuned engine failed on $name" >&2; exit 1; }
        tfiles+=("$work/$name.tuned.$threads.$r.json")
      fi
      more=()
      [[ -n "$tune" ]] && more=("$work/$name.tuned.npz")
      node "$ort_dir/ort_run.mjs" "$model" "$work/$name.in.npz" "$threads" "$slice" \
        "$work/$name.out.npz" "${more[@]}" >"$work/$name.ort.$threads.$r.json"
      ofiles+=("$work/$name.ort.$threads.$r.json")
    done
    read -r kmed kp10 kp90 krounds < <(summary "${kfiles[@]}")
    read -r omed op10 op90 orounds < <(summary "${ofiles[@]}")
    tuned="-"
    if [[ -n "$tune" ]]; then
      read -r tmed tp10 tp90 trounds < <(summary "${tfiles[@]}")
      tuned="$tmed,$tp10,$tp90,$trounds"
    fi
    python3 - "$name" "$threads" "$kmed" "$kp10" "$kp90" "$krounds" "${ofiles[-1]}" \
      "$omed,$op10,$op90,$orounds" "$tuned" "$work/$name.$threads.manifest.json" >>"$rows" <<'PY'
import json, os, sys
name, threads, kmed, kp10, kp90, krounds, ort_file, pooled, tuned, manifest_file = sys.argv[1:]
ort = json.load(open(ort_file))  # the last round's: its output comparisons
omed, op10, op90, orounds = pooled.split(",", 3)
# The default route's outputs and the tuned engine's, each against ORT's; no output compared (none
# named alike) counts as a disagreement, not as agreement.
compared = ort["outputs"] + [o for more in ort["moreOutputs"] for o in more["outputs"]]
worst = max((o.get("cosineDistance", float("inf")) for o in compared), default=float("inf"))
manifest = json.load(open(manifest_file)) if tuned != "-" and os.path.exists(manifest_file) else None
def timing(median, p10, p90, rounds):
    return {"medianMs": float(median), "p10Ms": float(p10), "p90Ms": float(p90),
            "roundMediansMs": [float(x) for x in rounds.split(",")]}
print(json.dumps({
    "model": name, "threads": int(threads),
    "kiln": timing(kmed, kp10, kp90, krounds),
    "kilnTuned": None if tuned == "-" else timing(*tuned.split(",", 3)),
    "ort": timing(omed, op10, op90, orounds),
    "outputs": ort["outputs"], "tunedOutputs": ort["moreOutputs"][0]["outputs"] if ort["moreOutputs"] else None,
    "worstCosineDistance": worst, "agree": worst <= 1e-5,
    # Every output constant: the agreement checks only that both computed that constant.
    "constantOutputs": bool(compared) and all(o.get("constant", False) for o in compared),
    # What the tuner chose, and whether its decision was cut short by --tuning-timeout.
    "tunedRoute": manifest["route"] if manifest else None,
    "tunedDecision": manifest["decision"] if manifest else None,
}))
PY
  done
done

python3 - "$rows" "$out" "$source_models" "$seconds" "$route" "$tune" "$rounds" "$refilled" <<'PY'
import json, platform, subprocess, sys
rows_file, out, models, seconds, route, tune, rounds, refilled_file = sys.argv[1:]
rows = [json.loads(line) for line in open(rows_file)]
refilled = [line.strip() for line in open(refilled_file) if line.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
command = f"bench/cpu/vs_ort.sh --models {models} --seconds {seconds} --rounds {rounds}" + (f" --route '{route}'" if route else "") + (f" --tune '{tune}'" if tune else "")
json.dump({"machine": f"{cpu}, {cores} cores", "command": command, "route": route or "(default)",
           "peer": "onnxruntime-node 1.30.0, CPU execution provider, graph optimisation level all",
           "zeroHeadsRefilled": refilled, "rows": rows}, open(out, "w"), indent=1)
print(f"machine: {cpu}, {cores} cores")
print(f"command: {command}")
for line in refilled:
    print(f"zero head refilled with seeded random weights (kiln_reinit_zero_head): {line}")
print()
tuned = any(r["kilnTuned"] for r in rows)
fmt = lambda r: f"{r['medianMs']:.3f} ({r['p10Ms']:.3f}–{r['p90Ms']:.3f})" if r else "–"
print("| model | threads | kiln default median ms (p10–p90) |"
      + (" kiln tuned |" if tuned else "")
      + " ONNX Runtime median ms (p10–p90) | default / ORT |" + (" tuned / ORT |" if tuned else "")
      + " outputs agree (worst cosine distance) |")
print("|---|---|---|" + ("---|" if tuned else "") + "---|---|" + ("---|" if tuned else "") + "---|")
for r in rows:
    ratio = r["kiln"]["medianMs"] / r["ort"]["medianMs"]
    line = f"| {r['model']} | {r['threads']} | {fmt(r['kiln'])} |"
    if tuned:
        line += f" {fmt(r['kilnTuned'])} |"
    line += f" {fmt(r['ort'])} | {ratio:.2f} |"
    if tuned:
        t = r["kilnTuned"]
        line += f" {t['medianMs'] / r['ort']['medianMs']:.2f} |" if t else " – |"
    agree = "yes" if r["agree"] else "**no**"
    if r.get("constantOutputs"):
        agree += ", but every output is constant, so this checks little"
    print(line + f" {agree} ({r['worstCosineDistance']:.1e}) |")
from math import exp, log
for key, label in (("kiln", "default"), ("kilnTuned", "tuned")):
    best = {}
    for r in rows:
        if not r[key]:
            continue
        b = best.setdefault(r["model"], {"kiln": float("inf"), "ort": float("inf")})
        b["kiln"] = min(b["kiln"], r[key]["medianMs"])
        b["ort"] = min(b["ort"], r["ort"]["medianMs"])
    if best:
        geo = exp(sum(log(b["kiln"] / b["ort"]) for b in best.values()) / len(best))
        print()
        print(f"kiln {label} / ORT, each at its best thread count, geometric mean over "
              f"{len(best)} models: {geo:.2f}")
if tuned:
    print()
    for r in rows:
        if r.get("tunedRoute") is not None:
            d = r["tunedDecision"] or {}
            print(f"- {r['model']} at {r['threads']} thread(s): `{r['tunedRoute'] or '(default)'}`"
                  + (" (provisional)" if d.get("provisional") else ""))
print(f"JSON: {out}")
PY
if grep -q '"agree": false' "$rows"; then
  echo "vs_ort.sh: kiln and ONNX Runtime disagree on some output (see the table)" >&2
  exit 1
fi
