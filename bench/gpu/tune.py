#!/usr/bin/env python3
"""`kiln tune --backend cuda` on the exported GPU workloads, then the routes it found timed against
kiln's default routes in one interleaved A/B run. Per workload: `kiln tune model.onnx --backend
cuda --search SEARCH --tune-file TUNE --loadInputs inputs.npz --loadRefOutputs ref.npz
--accuracy-metric cos --accuracy-threshold 1e-3 --cache CACHE --report REPORT`, its wall time
(the build cost of a search) and decision; then, for ROUNDS rounds with the routes' order rotated,
`kiln run --backend cuda` of kiln's default route (fp32), the default at fp16, and the winner.

Usage: tune.py --kiln PATH --models DIR --workloads a,b [--tune-file examples/cuda.tune]
               [--search mixed] [--rounds 2] [--duration 1] [--out DIR] [--tune-args "..."]
               [--resume DIR] [--gpus N] [--no-ab]
  --out     where tune-<workload>.md (the tuner's reports), tune-<workload>.db (the result
            stores), timing-<workload>.json (the timing caches), tune.json and the tables go
  --resume  a folder holding an earlier call's tune-<workload>.db with its .d folder (the run's
            inputs and references) and timing-<workload>.json (an
            earlier --out, carried back to the device): each workload's search continues from its
            store (`kiln tune --continue`), so a campaign longer than one device call goes on
            where the last call's time limit stopped it, without re-running finished trials (the
            store keeps the study's paths: give the same --out and --models in every call, and
            in --tune-args only how it runs, such as --tuning-timeout)
  --gpus    tune up to N workloads at once, each on its own GPU (CUDA_VISIBLE_DEVICES); the A/B
            timings after them run one at a time on GPU 0
  --no-ab   tune only: skip the A/B timings (a call that only advances the searches)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routes import run_once  # noqa: E402


def tune(args, workload: str, out: Path, gpu: int | None = None) -> dict:
    folder = Path(args.models) / workload
    model = folder / "model.onnx"
    if not model.exists():
        return {"error": f"no {model}"}
    cache = out / f"tune-{workload}.db"
    timing = out / f"timing-{workload}.json"
    resumed = False
    in_place = bool(args.resume) and Path(args.resume).resolve() == out.resolve()
    if in_place and cache.exists() and Path(str(cache) + ".d").is_dir():
        resumed = True  # --resume is --out: continue the store where it lies
    for stale in (cache, Path(str(cache) + ".d")):
        if not resumed:
            subprocess.run(["rm", "-rf", str(stale)], check=False)
    if args.resume and not in_place:
        earlier = Path(args.resume) / f"tune-{workload}.db"
        earlier_work = Path(str(earlier) + ".d")  # the run's inputs and references
        if earlier.exists() and earlier_work.is_dir():
            shutil.copyfile(earlier, cache)
            shutil.copytree(earlier_work, Path(str(cache) + ".d"))
            resumed = True
        earlier_timing = Path(args.resume) / f"timing-{workload}.json"
        if earlier_timing.exists() and earlier_timing.resolve() != timing.resolve():
            shutil.copyfile(earlier_timing, timing)
    if resumed:
        # The store holds the study (inputs, route expression, threshold, report and timing cache
        # paths): only how it runs may be given again, so keep --out and --models the same paths
        # from call to call.
        command = [args.kiln, "tune", str(model), "--continue", "--cache", str(cache)]
    else:
        command = [args.kiln, "tune", str(model), "--backend", args.backend, "--search", args.search,
                   "--tune-file", args.tune_file, "--accuracy-metric", "cos",
                   "--accuracy-threshold", str(args.threshold), "--cache", str(cache),
                   "--report", str(out / f"tune-{workload}.md")]
        if args.backend == "cuda":
            command += ["--timingCacheFile", str(timing)]
        if (folder / "inputs.npz").exists():
            command += ["--loadInputs", str(folder / "inputs.npz")]
            if (folder / "ref.npz").exists():
                command += ["--loadRefOutputs", str(folder / "ref.npz")]
    command += args.tune_args.split()
    environment = dict(os.environ)
    if gpu is not None:
        environment["CUDA_VISIBLE_DEVICES"] = str(gpu)
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                              env=environment)
        stdout, stderr, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        # The store keeps every finished trial: --resume continues from it.
        decode = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        stdout, stderr, code = decode(expired.stdout), decode(expired.stderr), "timeout"
    seconds = time.monotonic() - start
    (out / f"tune-{workload}.log").write_text(stdout + stderr)
    result = {"command": " ".join(command), "seconds": seconds, "exit": code,
              "resumed": resumed, "gpu": gpu}
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
    if code != 0:
        lines = (stderr or stdout).strip().splitlines()
        result["error"] = f"exit {code}: {lines[-1] if lines else 'no output'}"
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
    parser.add_argument("--resume", default="", help="an earlier --out to continue from")
    parser.add_argument("--gpus", type=int, default=1, help="workloads tuned at once, a GPU each")
    parser.add_argument("--no-ab", action="store_true", help="skip the A/B timings")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: try the script's tuning half on a machine without a GPU "
                             "(with --no-ab and a CPU route expression)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    names = [w for w in args.workloads.split(",") if w]
    results = {}
    gpus = max(1, args.gpus)

    def tune_on_free_gpu(index_and_name):
        index, w = index_and_name
        r = tune(args, w, out, index % gpus if gpus > 1 else None)
        winner = r.get("decision", {}).get("winner")
        print(f"{w}: tuned in {r['seconds']:.0f} s{' (continued)' if r.get('resumed') else ''}, "
              f"{r.get('trials', 0)} trials {r.get('statuses')}, winner {winner!r} "
              f"{r.get('error', '')}", file=sys.stderr, flush=True)
        return w, r

    # Workload i runs on GPU i mod N, and at most N at once: one tuning a GPU at any time.
    with ThreadPoolExecutor(max_workers=gpus) as pool:
        lanes = [[(i, w) for i, w in enumerate(names) if i % gpus == lane] for lane in range(gpus)]
        for finished in pool.map(lambda lane: [tune_on_free_gpu(x) for x in lane], lanes):
            for w, r in finished:
                results[w] = r
    results = {w: results[w] for w in names}
    if args.no_ab:
        (out / "tune.json").write_text(json.dumps(results, indent=1))
        return 0

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
