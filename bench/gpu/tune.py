#!/usr/bin/env python3
"""`kiln tune --backend cuda` on the exported GPU workloads, then the routes it found timed against
kiln's default routes in one interleaved A/B run. Per workload: `kiln tune model.onnx --backend
cuda --search SEARCH --tune-file TUNE --loadInputs inputs.npz --loadRefOutputs ref.npz
--accuracy-metric cos --accuracy-threshold 1e-3 --cache CACHE --report REPORT`, its wall time
(the build cost of a search) and decision; then, for ROUNDS rounds with the routes' order rotated,
`kiln run --backend cuda` of kiln's default route (fp32), the default at fp16, and the winner.

Usage: tune.py --kiln PATH --models DIR --workloads a,b [--tune-file examples/cuda.tune]
               [--search mixed] [--rounds 2] [--duration 1] [--out DIR] [--tune-args "..."]
  --out  where tune-<workload>.md (the tuner's reports), tune.json and the tables go
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routes import run_once  # noqa: E402


def tune(args, workload: str, out: Path) -> dict:
    folder = Path(args.models) / workload
    model = folder / "model.onnx"
    if not model.exists():
        return {"error": f"no {model}"}
    cache = out / f"tune-{workload}.db"
    for stale in (cache, Path(str(cache) + ".d")):
        subprocess.run(["rm", "-rf", str(stale)], check=False)
    command = [args.kiln, "tune", str(model), "--backend", "cuda", "--search", args.search,
               "--tune-file", args.tune_file, "--accuracy-metric", "cos",
               "--accuracy-threshold", str(args.threshold), "--cache", str(cache),
               "--report", str(out / f"tune-{workload}.md")]
    if (folder / "inputs.npz").exists():
        command += ["--loadInputs", str(folder / "inputs.npz")]
        if (folder / "ref.npz").exists():
            command += ["--loadRefOutputs", str(folder / "ref.npz")]
    command += args.tune_args.split()
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    seconds = time.monotonic() - start
    (out / f"tune-{workload}.log").write_text(done.stdout + done.stderr)
    result = {"command": " ".join(command), "seconds": seconds, "exit": done.returncode}
    exported = subprocess.run([args.kiln, "cache", "export", "--jsonl", str(cache)],
                              capture_output=True, text=True)
    trials = []
    for line in exported.stdout.splitlines():
        record = json.loads(line)
        if "header" in record:
            header = record["header"]
            if "decision" in header:
                result["decision"] = json.loads(header["decision"])
        elif "route" in record and "status" in record:
            trials.append(record)
    result["trials"] = len(trials)
    result["statuses"] = {}
    for trial in trials:
        status = trial.get("status", "?")
        result["statuses"][status] = result["statuses"].get(status, 0) + 1
    result["build_s"] = sum(float(t.get("build_ms", 0) or 0) for t in trials) / 1000
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        result["error"] = f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--models", required=True, help="the folder export.py wrote")
    parser.add_argument("--workloads", required=True, help="comma-separated names")
    parser.add_argument("--tune-file", default=str(Path(__file__).resolve().parents[2] /
                                                   "examples" / "cuda.tune"))
    parser.add_argument("--search", default="mixed", choices=["fast", "mixed", "full"])
    parser.add_argument("--threshold", type=float, default=1e-3, help="cos distance")
    parser.add_argument("--tune-args", default="", help="more kiln tune flags")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds a tuning run may take")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=1.0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    names = [w for w in args.workloads.split(",") if w]
    results = {}
    for w in names:
        results[w] = tune(args, w, out)
        r = results[w]
        winner = r.get("decision", {}).get("winner")
        print(f"{w}: tuned in {r['seconds']:.0f} s, {r.get('trials', 0)} trials "
              f"{r.get('statuses')}, winner {winner!r} {r.get('error', '')}",
              file=sys.stderr, flush=True)

    # The winners against the defaults, interleaved: one run of each route per round.
    fp16 = "-cuda.precision=fp16"
    for w in names:
        decision = results[w].get("decision") or {}
        routes = {"default (fp32)": "", "default fp16": fp16}
        if decision.get("winner") is not None:
            routes["tuned"] = decision["winner"]
        samples = {label: [] for label in routes}
        model = Path(args.models) / w / "model.onnx"
        labels = list(routes)
        for round_index in range(args.rounds):
            shift = round_index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                got = run_once(args.kiln, model, model.parent / "inputs.npz", routes[label],
                               args.duration, 300)
                if "median" in got:
                    samples[label].append(got["median"])
                else:
                    print(f"{w} [{routes[label]}]: {got.get('error')}", file=sys.stderr)
        results[w]["ab"] = {label: {"route": routes[label], "round_medians_ms": samples[label]}
                            for label in labels}

    print("| workload | tuning s (trials) | winner | default fp32 ms | default fp16 ms | tuned ms "
          "| tuned / fp32 default | tuned / fp16 default |")
    print("|---|---|---|---|---|---|---|---|")
    for w in names:
        r = results[w]
        ab = r.get("ab", {})
        med = {k: statistics.median(v["round_medians_ms"]) if v["round_medians_ms"] else None
               for k, v in ab.items()}
        cell = lambda v: f"{v:.4f}" if v else "—"  # noqa: E731
        tuned = med.get("tuned")
        ratio = lambda base: f"{base / tuned:.3f}x" if base and tuned else "—"  # noqa: E731
        winner = (r.get("decision") or {}).get("winner")
        print(f"| {w} | {r['seconds']:.0f} ({r.get('trials', 0)}) | "
              f"`{winner if winner is not None else '—'}` | {cell(med.get('default (fp32)'))} | "
              f"{cell(med.get('default fp16'))} | {cell(tuned)} | "
              f"{ratio(med.get('default (fp32)'))} | {ratio(med.get('default fp16'))} |")
    (out / "tune.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
