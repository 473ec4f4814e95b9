#!/usr/bin/env python3
"""Runs kiln on the exported workloads, per precision (fp32: the default route; fp16: the default
route plus -cuda.precision=fp16): `kiln run model.onnx --backend cuda --loadInputs inputs.npz
--saveOutputs ... --exportTimes ...`, then compares kiln's outputs with ref.npz and summarises the
per-run GPU times `kiln run` measured (CUDA events around each run or CUDA graph replay, copies
excluded). A run kiln refuses, fails or does not finish in time is an entry that says why (kiln's
error line), never a gap.

With --reference-executor, kiln's reference executor (the semantics its GPU kernels must match)
also runs each model once on the host; its output is compared with ref.npz, and each precision's
output with it. It is slow (about 1 GFLOP/s), so it is off by default and its output is kept
beside the model for later runs.

Usage: kiln_runs.py --kiln PATH --models DIR --out kiln.json [--only names] [--quick]
                    [--precisions fp32,fp16] [--route TOKENS] [--fp16-route TOKENS]
                    [--timeout S] [--deadline EPOCH_SECONDS] [--reference-executor]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import workloads as wl

FP16_ROUTE = "-cuda.precision=fp16"
DEVICE_LINE = re.compile(r"^device: (.*)$")
ROUTE_LINE = re.compile(r"^route: (.*)$")
HOST_LINE = re.compile(r"^note: (\d+) of (\d+) layers have no GPU kernel")
EXECUTION_LINE = re.compile(r"^execution: (.*)$")
TIMING_LINE = re.compile(r"^(GPU compute time|GPU time with host copies|latency) over (\d+) runs")


def text_of(stream) -> str:
    """subprocess output as text (TimeoutExpired carries bytes even in text mode)."""
    if stream is None:
        return ""
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream


def error_line(stderr: str, returncode: int) -> str:
    """kiln's error message: its 'kiln: error:' line, else the first line it printed, else the
    exit status."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line:
            return line
    if lines:
        return lines[0]
    if returncode < 0:
        return f"kiln was killed by signal {-returncode}"
    return f"kiln exited with status {returncode} and printed no error"


def parse_stdout(stdout: str) -> dict:
    """What `kiln run` says about the plan: device, route, host-fallback layers, execution mode."""
    found: dict = {}
    for line in stdout.splitlines():
        line = line.strip()
        if m := DEVICE_LINE.match(line):
            found["device"] = m.group(1)
        elif m := ROUTE_LINE.match(line):
            found["route_printed"] = m.group(1)
        elif m := HOST_LINE.match(line):
            found["host_layers"] = [int(m.group(1)), int(m.group(2))]
        elif m := EXECUTION_LINE.match(line):
            found["execution"] = m.group(1)
        elif m := TIMING_LINE.match(line):
            found["timed"] = m.group(1)
    return found


def kiln_environment(kiln: str, env: dict) -> dict:
    """kiln's version, the commit of the checkout it sits in, and the cuDNN and cuBLASLt files it
    loads (its device line, read from the first run, names the versions)."""
    result: dict = {"kiln": str(Path(kiln).resolve())}
    try:
        result["kiln_version"] = subprocess.run(
            [kiln, "--version"], capture_output=True, text=True, timeout=30, env=env
        ).stdout.strip()
    except Exception as error:  # noqa: BLE001 - informative only
        result["kiln_version"] = wl.describe_error(error)
    here = Path(__file__).resolve().parent
    # A packed kiln (scripts/device-pack.sh) names the commit it was built from in COMMIT beside
    # its bin/; the checkout the script sits in may be another (the device tool's copy of it).
    packed = Path(kiln).resolve().parent.parent / "COMMIT"
    if packed.is_file():
        result["commit"] = packed.read_text().strip()
    try:
        if "commit" in result:
            raise LookupError("the packed kiln named its commit")
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=30)
        if commit.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                    "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=30)
            result["commit"] = commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except Exception:  # noqa: BLE001 - no git on the machine
        pass
    try:
        ldd = subprocess.run(["ldd", kiln], capture_output=True, text=True, timeout=30, env=env)
        libraries = {}
        for line in ldd.stdout.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and re.search(r"libcudnn\.so|libcublasLt\.so|libcudart",
                                             parts[0]):
                path = parts[1].split("(")[0].strip()
                libraries[parts[0].strip()] = os.path.realpath(path) if path else "not found"
        result["libraries"] = libraries
    except Exception:  # noqa: BLE001 - informative only
        pass
    return result


class Runner:
    """Runs the kiln binary with an environment of its own (LD_LIBRARY_PATH for a packed build's
    libraries, which PyTorch's Python must not see)."""

    def __init__(self, kiln: str, library_path: str, timeout: float, deadline: float):
        self.kiln = kiln
        self.env = dict(os.environ)
        if library_path:
            previous = self.env.get("LD_LIBRARY_PATH")
            self.env["LD_LIBRARY_PATH"] = library_path + (":" + previous if previous else "")
        self.timeout = timeout
        self.deadline = deadline

    def time_left(self) -> float:
        """Seconds a run may take: --timeout, less when the run's deadline is nearer."""
        if not self.deadline:
            return self.timeout
        return min(self.timeout, self.deadline - time.time() - 10)

    def run(self, arguments: list[str]) -> dict:
        """Runs kiln with `arguments`: its exit status, output, the facts it printed, wall time,
        or the reason it did not finish."""
        limit = self.time_left()
        command = [self.kiln, *arguments]
        # kiln's printf output is block-buffered into a pipe: line-buffered, a run killed at its
        # time limit still tells what it printed (how many layers fell back to the host).
        stdbuf = shutil.which("stdbuf")
        launched = [stdbuf, "-oL", *command] if stdbuf else command
        result: dict = {"command": command}
        if limit < 20:
            result.update(status="skipped",
                          reason=f"not run: {max(limit, 0):.0f} s left of the run's time budget")
            return result
        start = time.perf_counter()
        try:
            done = subprocess.run(launched, capture_output=True, text=True, timeout=limit,
                                  env=self.env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as expired:
            stdout = text_of(expired.stdout)
            result.update(parse_stdout(stdout))
            result.update(status="failed", error=f"timed out after {limit:.0f} s"
                          + host_note(result), stdout_tail=stdout[-3000:],
                          stderr_tail=text_of(expired.stderr)[-3000:])
            return result
        except OSError as error:
            result.update(status="failed", error=f"could not start kiln: {error}")
            return result
        result["wall_s"] = round(time.perf_counter() - start, 1)
        result.update(parse_stdout(done.stdout))
        if done.returncode != 0:
            result.update(status="failed", error=error_line(done.stderr, done.returncode),
                          returncode=done.returncode, stdout_tail=done.stdout[-3000:],
                          stderr_tail=done.stderr[-3000:])
        else:
            result["status"] = "ok"
        return result


def host_note(run: dict) -> str:
    if "host_layers" in run:
        on_host, total = run["host_layers"]
        return f" ({on_host} of {total} layers run on the host)"
    return ""


def read_times(path: Path) -> list[float]:
    """The per-run latencies of a `kiln run --exportTimes` file."""
    data = wl.read_json(path)
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path} holds no timed runs")
    return [float(item["latencyMs"]) for item in data]


def compare_outputs(path: Path, references: dict) -> dict:
    return wl.accuracy_of_outputs(wl.load_npz(path), references)


def run_precision(runner: Runner, folder: Path, precision: str, route: str, options) -> dict:
    """One `kiln run` of the workload in `folder` at `precision`."""
    outputs = folder / f"kiln_{precision}.npz"
    times = folder / f"kiln_{precision}_times.json"
    for stale in (outputs, times):
        stale.unlink(missing_ok=True)
    arguments = ["run", str(folder / "model.onnx"), "--backend", options.backend,
                 "--loadInputs", str(folder / "inputs.npz"),
                 "--saveOutputs", str(outputs), "--exportTimes", str(times),
                 "--warmUp", str(options.warmup_ms), "--iterations", str(options.iterations),
                 "--duration", "0"]
    if route:
        arguments += ["--route", route]
    result = runner.run(arguments)
    result["route"] = route
    if result["status"] != "ok":
        return result
    try:
        result["time_ms"] = wl.summarize(read_times(times))
        result["accuracy"] = compare_outputs(outputs, wl.load_npz(folder / "ref.npz"))
        executor = folder / "kiln_reference.npz"
        if executor.exists():
            result["accuracy_vs_executor"] = compare_outputs(outputs, wl.load_npz(executor))
    except Exception as error:  # noqa: BLE001 - kiln ran but its files are unusable
        result.update(status="failed", error="reading kiln's results: " + wl.describe_error(error))
    return result


def reference_executor(runner: Runner, folder: Path, options) -> dict:
    """kiln's reference executor's output, run once on the host and kept as
    kiln_reference.npz (reused while it is newer than model.onnx)."""
    saved = folder / "kiln_reference.npz"
    model = folder / "model.onnx"
    if not (saved.exists() and saved.stat().st_mtime >= model.stat().st_mtime):
        saved.unlink(missing_ok=True)
        previous = runner.timeout
        runner.timeout = options.reference_timeout
        try:
            result = runner.run(["run", str(model), "--backend", "reference",
                                 "--loadInputs", str(folder / "inputs.npz"),
                                 "--saveOutputs", str(saved), "--warmUp", "0",
                                 "--iterations", "1", "--duration", "0"])
        finally:
            runner.timeout = previous
        if result["status"] != "ok":
            return result
        result["cached"] = False
    else:
        result = {"status": "ok", "cached": True}
    try:
        result["accuracy"] = compare_outputs(saved, wl.load_npz(folder / "ref.npz"))
    except Exception as error:  # noqa: BLE001
        result.update(status="failed", error="reading its outputs: " + wl.describe_error(error))
    return result


def export_problem(folder: Path) -> str | None:
    """Why kiln cannot run this workload's export, or None when it can."""
    export = wl.read_json(folder / "export.json")
    if export is None:
        return "not exported (export.py has not run for it)"
    if export.get("status") != "ok":
        return f"export failed at {export.get('stage')}: {export.get('error')}"
    for name in ("model.onnx", "inputs.npz", "ref.npz"):
        if not (folder / name).exists():
            return f"export incomplete: no {name}"
    return None


UNFINISHED = "kiln_runs.py did not finish this workload (it crashed or was killed; see run.log)"


def run_workload(workload: wl.Workload, folder: Path, runner: Runner, options, save) -> dict:
    """Runs kiln on one workload at each precision; `save(entry)` stores the entry after each
    run, marked unfinished until the last, so a cut-short run keeps what it measured."""
    export = wl.read_json(folder / "export.json", {})
    entry: dict = {
        "label": workload.label,
        "date": wl.utc_now(),
        "export": {k: export[k] for k in ("status", "stage", "error", "exporter", "dynamo_error",
                                          "date", "onnx", "ort_check", "reference")
                   if k in export},
        "runs": {},
    }
    if "onnx" in entry["export"]:
        entry["export"]["onnx"] = {k: v for k, v in entry["export"]["onnx"].items() if k != "ops"}
    problem = export_problem(folder)
    if problem:
        entry["error"] = problem
        return entry
    save({**entry, "error": UNFINISHED})
    if options.reference_executor:
        entry["reference_executor"] = reference_executor(runner, folder, options)
        print(f"  reference executor: {brief(entry['reference_executor'])}", flush=True)
        save({**entry, "error": UNFINISHED})
    for precision in options.precisions:
        route = options.route
        if precision == "fp16":
            route = f"{route} {options.fp16_route}".strip()
        result = run_precision(runner, folder, precision, route, options)
        entry["runs"][precision] = result
        print(f"  kiln {precision}: {brief(result)}", flush=True)
        save({**entry, "error": UNFINISHED})
    return entry


def brief(run: dict) -> str:
    if run.get("status") != "ok":
        return f"{run.get('status')}: {run.get('error') or run.get('reason')}"
    parts = []
    if "time_ms" in run:
        t = run["time_ms"]
        parts.append(f"median {t['median']:.3f} ms (p10 {t['p10']:.3f}, p90 {t['p90']:.3f})")
    accuracy = run.get("accuracy", {})
    parts += [f"{name}: rel. L2 {a.get('rel_l2', a.get('error'))}" for name, a in accuracy.items()]
    return "; ".join(parts) + host_note(run)


def default_library_path(kiln: str) -> str:
    """The lib/ folder beside a packed kiln's bin/ (scripts/device-pack.sh's layout), if any."""
    lib = Path(kiln).resolve().parent.parent / "lib"
    return str(lib) if lib.is_dir() and any(lib.glob("*.so*")) else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", required=True, help="the kiln binary")
    parser.add_argument("--models", required=True, help="the folder export.py wrote")
    parser.add_argument("--out", required=True, help="kiln.json to write (other workloads kept)")
    parser.add_argument("--only", default="", help="comma-separated workload names (default all)")
    parser.add_argument("--precisions", default="fp32,fp16", help="default fp32,fp16")
    parser.add_argument("--route", default="",
                        help="route tokens for every precision (default: kiln's default route)")
    parser.add_argument("--fp16-route", default=FP16_ROUTE,
                        help=f"tokens added for fp16 (default {FP16_ROUTE})")
    parser.add_argument("--backend", default="cuda",
                        help="kiln run --backend (cuda; cpu only to try this script without a GPU)")
    parser.add_argument("--iterations", type=int, default=100, help="timed runs (default 100)")
    parser.add_argument("--warmup-ms", type=float, default=1000, help="warm-up, ms (default 1000)")
    parser.add_argument("--quick", action="store_true", help="30 timed runs after 300 ms")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds one kiln run may take, build included (default 300)")
    parser.add_argument("--deadline", type=float, default=0,
                        help="Unix time by which every kiln run must have ended")
    parser.add_argument("--library-path", default=None,
                        help="LD_LIBRARY_PATH for kiln alone (default: lib/ beside a packed "
                             "kiln's bin/)")
    parser.add_argument("--reference-executor", action="store_true",
                        help="also run kiln's reference executor once per model (slow)")
    parser.add_argument("--reference-timeout", type=float, default=900,
                        help="seconds the reference executor may take (default 900)")
    options = parser.parse_args()
    if options.quick:
        options.iterations, options.warmup_ms = 30, 300
    options.precisions = [p.strip() for p in options.precisions.split(",") if p.strip()]
    unknown = [p for p in options.precisions if p not in ("fp32", "fp16")]
    if unknown:
        raise SystemExit(f"kiln_runs.py: unknown precision(s) {unknown}; known: fp32, fp16")
    kiln = shutil.which(options.kiln) or options.kiln
    if not os.access(kiln, os.X_OK):
        raise SystemExit(f"kiln_runs.py: {options.kiln} is not an executable")
    library_path = (default_library_path(kiln) if options.library_path is None
                    else options.library_path)
    runner = Runner(kiln, library_path, options.timeout, options.deadline)
    env = kiln_environment(kiln, runner.env)
    env["library_path"] = library_path
    settings = {
        "backend": options.backend,
        "iterations": options.iterations,
        "warmup_ms": options.warmup_ms,
        "route": options.route,
        "fp16_route": options.fp16_route,
        "timing": "kiln run's GPU compute time: CUDA events around each run (CUDA graph replay "
                  "where the plan has one), 10 runs enqueued back to back, copies excluded",
    }
    device_seen = wl.read_json(options.out, {}).get("environment", {}).get("device")
    for workload in wl.select(options.only):
        print(f"{workload.name}: kiln", flush=True)
        def save(entry: dict, name: str = workload.name) -> None:
            nonlocal device_seen
            for run in entry["runs"].values():
                device_seen = run.get("device") or device_seen
            if device_seen:
                env["device"] = device_seen
            wl.update_results(options.out, "kiln", name, entry, env, settings)

        entry = run_workload(workload, Path(options.models) / workload.name, runner, options,
                             save)
        if "error" in entry:
            print(f"  FAILED: {entry['error']}", flush=True)
        save(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
