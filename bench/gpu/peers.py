#!/usr/bin/env python3
"""Times PyTorch's peers of kiln on the exported workloads: eager fp32 (TF32 off), eager fp16
(channels_last for the CNNs), torch.compile(mode="reduce-overhead") fp16 and, once per workload,
torch version and GPU, torch.compile(mode="max-autotune") fp16, whose figure is kept in a cache
file and reused by later runs (it compiles for minutes).

Every peer runs on the inputs of DIR/<name>/inputs.npz and its output is compared with
DIR/<name>/ref.npz. Timing: CUDA events around each run, runs enqueued ten at a time back to back
(as `kiln run` times its plans), after a warm-up; the summary is workloads.summarize's. A peer
that fails is an entry with its error, never a gap.

Usage: peers.py --models DIR --out peers.json [--only names] [--quick]
                [--max-autotune-cache FILE] [--no-max-autotune] [--deadline EPOCH_SECONDS]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import workloads as wl

BATCH = 10  # runs enqueued between synchronisations, each between its own pair of events
MAX_AUTOTUNE_SECONDS = 420  # about what max-autotune needs per workload (318 s for ResNet-50 b1)


# ---- environment ----


def _module_version(name: str):
    try:
        return __import__(name).__version__
    except Exception:  # noqa: BLE001 - a missing library is recorded as None
        return None


def _cudnn_version(v: int | None) -> str | None:
    """cuDNN's integer version as text: 9.x encodes major*10000 + minor*100 + patch, 8.x
    major*1000 + minor*100 + patch."""
    if not v:
        return None
    if v >= 90000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def _loaded_library(prefix: str) -> str | None:
    """The path of a shared library this process has loaded whose file name starts with
    `prefix`."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/" in path and Path(path).name.startswith(prefix):
                    return path
    except OSError:
        pass
    return None


def _cublaslt_version() -> str | None:
    """The version of the cuBLASLt that PyTorch loaded (MAJOR*10000 + MINOR*100 + PATCH)."""
    path = _loaded_library("libcublasLt.so")
    if path is None:
        return None
    try:
        library = ctypes.CDLL(path)
        library.cublasLtGetVersion.restype = ctypes.c_size_t
        v = int(library.cublasLtGetVersion())
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    except Exception:  # noqa: BLE001 - informative only
        return None


def _driver_version() -> str | None:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True)
        return result.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - fall back to NVML
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001 - informative only
        return None


def environment() -> dict:
    """The GPU, driver and library versions PyTorch's figures were measured with."""
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "torchvision": _module_version("torchvision"),
        "transformers": _module_version("transformers"),
        "triton": _module_version("triton"),
        "numpy": _module_version("numpy"),
        "host": platform.node(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        # A product loads cuBLAS and cuBLASLt, so their versions can be read.
        a = torch.randn(64, 64, device="cuda")
        (a @ a).sum().item()
        env.update({
            "gpu": torch.cuda.get_device_name(0),
            "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "driver": _driver_version(),
            "cudnn": _cudnn_version(torch.backends.cudnn.version()),
            "cublaslt": _cublaslt_version(),
        })
    return env


# ---- measuring ----


def time_cuda(call, warmup: int, runs: int) -> list[float]:
    """Per-run GPU times in ms: `warmup` untimed calls, then `runs` calls, each between its own
    pair of CUDA events, enqueued BATCH at a time before one synchronisation."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    times: list[float] = []
    while len(times) < runs:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(min(BATCH, runs - len(times)))]
        for start, end in events:
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        times.extend(start.elapsed_time(end) for start, end in events)
    return times


def to_numpy(output):
    """A model output (a tensor, or a tuple/list whose first item is one) as a float32 numpy
    copy: compiled models with CUDA graphs overwrite their outputs on the next replay."""
    import torch

    if not isinstance(output, torch.Tensor):
        output = output[0]
    return output.detach().float().cpu().numpy()


def compare(output, references: dict) -> dict:
    """The accuracy of the model's single output against ref.npz's first array."""
    name = next(iter(references))
    return wl.accuracy_of_outputs({name: to_numpy(output)}, {name: references[name]})


def failure(error: BaseException) -> dict:
    return {"status": "failed", "error": wl.describe_error(error),
            "traceback": traceback.format_exc()[-4000:]}


def eager(model, args: list, references: dict, settings: dict) -> dict:
    import torch

    with torch.inference_mode():
        accuracy = compare(model(*args), references)
        times = time_cuda(lambda: model(*args), settings["warmup"], settings["runs"])
    return {"status": "ok", "time_ms": wl.summarize(times), "accuracy": accuracy}


def compiled(model, args: list, references: dict, settings: dict, mode: str) -> dict:
    """torch.compile in `mode`; compile_s is the wall time of the first call, which compiles."""
    import torch

    torch._dynamo.reset()
    function = torch.compile(model, mode=mode)

    def call():
        # Each call is a new step for CUDA graph trees: earlier outputs may be overwritten.
        torch.compiler.cudagraph_mark_step_begin()
        return function(*args)

    with torch.no_grad():
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - start
        accuracy = compare(call(), references)
        times = time_cuda(call, settings["warmup"], settings["runs"])
    return {"status": "ok", "time_ms": wl.summarize(times), "accuracy": accuracy,
            "compile_s": round(compile_s, 1)}


# ---- the max-autotune cache ----


def cache_key(workload: str, env: dict) -> dict:
    return {"workload": workload, "torch": env.get("torch"), "gpu": env.get("gpu")}


def cached_entry(cache: dict, key: dict) -> dict | None:
    for entry in cache.get("entries", []):
        if all(entry.get(k) == v for k, v in key.items()):
            return entry
    return None


def store_entry(path: str, key: dict, entry: dict) -> None:
    """Adds or replaces the entry for `key` in the cache file at `path`, written at once so that
    a run cut short keeps minutes of compiling."""
    cache = wl.read_json(path, {"schema": 1, "entries": []})
    entries = [e for e in cache.get("entries", [])
               if not all(e.get(k) == v for k, v in key.items())]
    entries.append({**key, **entry})
    entries.sort(key=lambda e: (str(e.get("gpu")), str(e.get("torch")), str(e.get("workload"))))
    wl.write_json(path, {"schema": 1, "entries": entries})


def max_autotune(name: str, model, args: list, references: dict, settings: dict, env: dict,
                 options) -> dict:
    """max-autotune's figure: from the cache when it holds one for this workload, torch version and
    GPU; otherwise measured now (when allowed and the time budget holds it) and cached."""
    key = cache_key(name, env)
    cache = wl.read_json(options.max_autotune_cache, {}) if options.max_autotune_cache else {}
    entry = cached_entry(cache, key)
    if entry is not None and not (options.retry_max_autotune and entry.get("status") != "ok"):
        return {**entry, "cached": True}
    if options.no_max_autotune or options.quick:
        flag = "--no-max-autotune" if options.no_max_autotune else "--quick"
        return {"status": "skipped",
                "reason": f"not measured ({flag}) and no cached figure for torch {env.get('torch')}"
                          f" on {env.get('gpu')}"}
    if options.deadline:
        left = options.deadline - time.time()
        if left < MAX_AUTOTUNE_SECONDS:
            return {"status": "skipped",
                    "reason": f"not measured: {left:.0f} s left of the run's time budget, "
                              f"max-autotune needs about {MAX_AUTOTUNE_SECONDS} s; "
                              "no cached figure"}
    try:
        entry = compiled(model, args, references, settings, "max-autotune")
    except Exception as error:  # noqa: BLE001 - cached too: it would fail the same way next time
        entry = failure(error)
    entry.update({"date": wl.utc_now(), "settings": dict(settings),
                  "versions": {k: env.get(k) for k in ("driver", "cuda_runtime", "cudnn",
                                                         "cublaslt", "triton", "torchvision",
                                                         "transformers")}})
    if options.max_autotune_cache:
        store_entry(options.max_autotune_cache, key, entry)
    return {**key, **entry, "cached": False}


# ---- one workload ----


def load_workload(folder: Path):
    """inputs (in the model's order) and references of an exported workload, or the reason
    there are none."""
    export = wl.read_json(folder / "export.json", {})
    if not (folder / "inputs.npz").exists() or not (folder / "ref.npz").exists():
        why = export.get("error") or "not exported (run export.py first)"
        raise FileNotFoundError(f"no inputs.npz/ref.npz in {folder}: {why}")
    return list(wl.load_npz(folder / "inputs.npz").values()), wl.load_npz(folder / "ref.npz")


def export_note(folder: Path) -> dict:
    export = wl.read_json(folder / "export.json", {})
    keys = ("status", "stage", "error", "exporter", "dynamo_error", "date", "ort_check")
    return {k: export[k] for k in keys if k in export}


UNFINISHED = "peers.py did not finish this workload (it crashed or was killed; see run.log)"


def run_workload(workload: wl.Workload, folder: Path, settings: dict, env: dict, options,
                 save) -> dict:
    """Measures every peer of one workload; `save(entry)` stores the entry after each peer, with
    an error that says the workload is unfinished until the last one, so a crash or the time
    limit leaves the peers measured so far and a reason for the rest."""
    import torch

    entry = {"label": workload.label, "note": workload.note, "export": export_note(folder),
             "date": wl.utc_now(), "peers": {}, "error": UNFINISHED}
    peers = entry["peers"]
    save(entry)
    del entry["error"]
    try:
        arrays, references = load_workload(folder)
    except Exception as error:  # noqa: BLE001 - the row says why
        entry["error"] = wl.describe_error(error)
        return entry
    model = None
    try:
        torch.manual_seed(wl.MODEL_SEED)
        model = workload.build().cuda()
        args = [torch.from_numpy(a).cuda() for a in arrays]
    except Exception as error:  # noqa: BLE001
        entry["error"] = "building the model: " + wl.describe_error(error)
        return entry

    try:
        peers["eager_fp32"] = eager(model, args, references, settings)
    except Exception as error:  # noqa: BLE001
        peers["eager_fp32"] = failure(error)
    print(f"  eager fp32: {brief(peers['eager_fp32'])}", flush=True)
    save({**entry, "error": UNFINISHED})

    try:
        # fp16 in place (the fp32 model is done with); CNNs in channels_last, as cuDNN likes.
        model = model.half()
        args = [a.half() if a.is_floating_point() else a for a in args]
        if workload.channels_last:
            model = model.to(memory_format=torch.channels_last)
            args = [a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a
                    for a in args]
        layout = "channels_last" if workload.channels_last else "contiguous"
    except Exception as error:  # noqa: BLE001
        for name in ("eager_fp16", "compile_ro_fp16", "max_autotune_fp16"):
            peers[name] = failure(error)
        return entry

    for name, measure in (
        ("eager_fp16", lambda: eager(model, args, references, settings)),
        ("compile_ro_fp16", lambda: compiled(model, args, references, settings,
                                             "reduce-overhead")),
        ("max_autotune_fp16", lambda: max_autotune(workload.name, model, args, references,
                                                   settings, env, options)),
    ):
        try:
            peers[name] = measure()
        except Exception as error:  # noqa: BLE001
            peers[name] = failure(error)
        peers[name].setdefault("layout", layout)
        print(f"  {name.replace('_', ' ')}: {brief(peers[name])}", flush=True)
        save({**entry, "error": UNFINISHED})
    return entry


def release_gpu() -> None:
    """Frees what the last workload left (its models, compiled code, cached blocks)."""
    import torch

    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def brief(peer: dict) -> str:
    """One line for the log."""
    if peer.get("status") == "ok":
        t = peer["time_ms"]
        extra = f", compile {peer['compile_s']} s" if "compile_s" in peer else ""
        extra += ", cached " + peer.get("date", "") if peer.get("cached") else ""
        return f"median {t['median']:.3f} ms (p10 {t['p10']:.3f}, p90 {t['p90']:.3f}){extra}"
    return f"{peer.get('status')}: {peer.get('error') or peer.get('reason')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", required=True, help="the folder export.py wrote")
    parser.add_argument("--out", required=True, help="peers.json to write (other workloads kept)")
    parser.add_argument("--only", default="", help="comma-separated workload names (default all)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed runs first (default 30)")
    parser.add_argument("--runs", type=int, default=100, help="timed runs (default 100)")
    parser.add_argument("--quick", action="store_true",
                        help="10 warm-up and 30 timed runs; max-autotune only from the cache")
    parser.add_argument("--max-autotune-cache", default="",
                        help="JSON file of max-autotune figures per workload, torch and GPU")
    parser.add_argument("--no-max-autotune", action="store_true",
                        help="use cached max-autotune figures only; measure none")
    parser.add_argument("--retry-max-autotune", action="store_true",
                        help="measure max-autotune again where the cache records a failure")
    parser.add_argument("--deadline", type=float, default=0,
                        help="Unix time after which no max-autotune compile may still be running")
    options = parser.parse_args()
    if options.quick:
        options.warmup, options.runs = 10, 30

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("peers.py: PyTorch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False
    env = environment()
    settings = {
        "warmup": options.warmup,
        "runs": options.runs,
        "batch": BATCH,
        "tf32": False,
        "timing": f"CUDA events around each run, {BATCH} runs enqueued back to back, medians of "
                  "per-run times",
    }
    for workload in wl.select(options.only):
        print(f"{workload.name}: PyTorch peers", flush=True)
        def save(entry: dict, name: str = workload.name) -> None:
            wl.update_results(options.out, "peers", name, entry, env, settings)

        entry = run_workload(workload, Path(options.models) / workload.name, settings, env,
                             options, save)
        if "error" in entry:
            print(f"  FAILED: {entry['error']}", flush=True)
        release_gpu()
        save(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
