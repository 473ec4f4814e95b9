#!/usr/bin/env python3
"""A/B timing of build routes on the exported GPU workloads: what one knob setting changes, on the
same GPU, in one run. For each round, each workload and each route (their order rotated from
round to round, so that no route always runs first), `kiln run model.onnx --backend cuda --route
"BASE ROUTE" --loadInputs inputs.npz --duration S`; the GPU compute median of each run (CUDA
events around each CUDA graph replay, copies excluded) is one sample. Prints, per workload and
route, the median of the rounds' medians, their range, the ratio to the first route, and the
build times `kiln run` reports; writes the same as JSON with --json.

Usage: routes.py --kiln PATH --models DIR --workloads a,b [--rounds 3] [--duration 2]
                 [--base=-cuda.precision=fp16] [--json out.json] -- ROUTE [ROUTE ...]
  --base takes its value after '=': a value starting with '-' given as a separate word is read
  by argparse as another option (a usage error).
  ROUTE: knob tokens ("-cuda.eltwise.codegen=interpreter"); "default" (or "") is the base alone.
  The `--` keeps routes that start with '-' from being read as options.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

TIMING = re.compile(r"^GPU compute time over (\d+) runs \(ms\): min ([\d.]+)\s+median ([\d.]+)")
BUILD = re.compile(r"^build: passes and lowering ([\d.]+) ms, device preparation ([\d.]+) ms "
                   r"\((\d+) generated kernels, NVRTC ([\d.]+) ms(?:; timed layers: (\d+) "
                   r"from the timing cache, (\d+) timed)?\)")


def run_once(kiln: str, model: Path, inputs: Path, route: str, duration: float,
             timeout: float) -> dict:
    command = [kiln, "run", str(model), "--backend", "cuda", "--route", route, "--duration",
               str(duration)]
    if inputs.exists():
        command += ["--loadInputs", str(inputs)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    result: dict = {}
    for line in done.stdout.splitlines():
        if m := TIMING.match(line):
            result["runs"], result["min"], result["median"] = int(m[1]), float(m[2]), float(m[3])
        elif m := BUILD.match(line):
            result["lower_ms"], result["prepare_ms"] = float(m[1]), float(m[2])
            result["generated"], result["nvrtc_ms"] = int(m[3]), float(m[4])
            if m[5] is not None:
                result["timing_cache_hits"], result["timed_layers"] = int(m[5]), int(m[6])
    if done.returncode != 0 or "median" not in result:
        lines = (done.stderr or done.stdout).strip().splitlines()
        result["error"] = f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", required=True)
    parser.add_argument("--models", required=True, help="the folder export.py wrote")
    parser.add_argument("--workloads", required=True, help="comma-separated names")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds a run times")
    parser.add_argument("--base", default="-cuda.precision=fp16", help="tokens every route has")
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--json", default="", help="write the results here too")
    parser.add_argument("routes", nargs="+")
    args = parser.parse_args()

    routes = ["" if r in ("", "default") else r for r in args.routes]
    names = [w for w in args.workloads.split(",") if w]
    samples: dict = {w: {r: [] for r in routes} for w in names}
    builds: dict = {w: {r: [] for r in routes} for w in names}
    errors: dict = {w: {} for w in names}
    for round_index in range(args.rounds):
        for w in names:
            model = Path(args.models) / w / "model.onnx"
            if not model.exists():
                errors[w]["*"] = f"no {model}"
                continue
            shift = round_index % len(routes)
            for route in routes[shift:] + routes[:shift]:
                full = f"{args.base} {route}".strip()
                result = run_once(args.kiln, model, model.parent / "inputs.npz", full,
                                  args.duration, args.timeout)
                if "error" in result:
                    errors[w][route] = result["error"]
                    print(f"{w} [{full}]: {result['error']}", file=sys.stderr, flush=True)
                    continue
                samples[w][route].append(result["median"])
                builds[w][route].append(result)
                print(f"round {round_index + 1} {w} [{full}]: median {result['median']:.4f} ms",
                      file=sys.stderr, flush=True)

    report = []
    print(f"base route: `{args.base}`; {args.rounds} rounds of {args.duration:g} s a run\n")
    print("| workload | route | median ms | range over rounds | vs first | build ms "
          "(lowering / device) | generated (NVRTC ms) |")
    print("|---|---|---|---|---|---|---|")
    for w in names:
        first = None
        for route in routes:
            values = samples[w][route]
            label = route or "default"
            if not values:
                why = errors[w].get(route) or errors[w].get("*", "no samples")
                print(f"| {w} | `{label}` | — | {why} | | | |")
                report.append({"workload": w, "route": route, "error": why})
                continue
            median = statistics.median(values)
            first = first if first is not None else median
            last = builds[w][route][-1]
            print(f"| {w} | `{label}` | {median:.4f} | {min(values):.4f}–{max(values):.4f} | "
                  f"{median / first:.3f} | {last.get('lower_ms', 0):.0f} / "
                  f"{last.get('prepare_ms', 0):.0f} | {last.get('generated', 0)} "
                  f"({last.get('nvrtc_ms', 0):.0f}) |")
            report.append({"workload": w, "route": route, "median_ms": median,
                           "round_medians_ms": values, "build": builds[w][route]})
    if args.json:
        Path(args.json).write_text(json.dumps({"base": args.base, "rounds": args.rounds,
                                               "duration_s": args.duration,
                                               "results": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
