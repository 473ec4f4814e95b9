#!/usr/bin/env python3
"""Usage: torch_kernels.py WORKLOAD [WORKLOAD...] [--runs N] [--top K]

Where torch.compile(mode="reduce-overhead") at fp16 spends its GPU time on a benchmark workload:
the kernels of N replays under torch.profiler, summed by kernel name, per replay. Read beside
`kiln run --dumpProfile` (bench/gpu/profile.sh) to see which of kiln's layers lose to which of
Inductor's kernels. The model, weights and inputs are the suite's own (workloads.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import workloads as wl  # noqa: E402


def profile(name: str, runs: int, top: int) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    workload = wl.by_name(name)
    torch.manual_seed(wl.MODEL_SEED)
    model = workload.build().cuda().half()
    args = [t.cuda() for t in workload.make_inputs().values()]
    args = [a.half() if a.is_floating_point() else a for a in args]
    if workload.channels_last:
        model = model.to(memory_format=torch.channels_last)
        args = [a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args]
    torch._dynamo.reset()
    function = torch.compile(model, mode="reduce-overhead")

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return function(*args)

    with torch.no_grad():
        for _ in range(30):
            call()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                call()
            torch.cuda.synchronize()
    kernels = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        total, count = kernels.get(event.name, (0.0, 0))
        kernels[event.name] = (total + event.device_time, count + 1)
    whole = sum(t for t, _ in kernels.values()) / runs / 1000.0
    print(f"== {name}: {whole:.4f} ms of kernels per replay, {len(kernels)} distinct kernels")
    print(f"{'ms/replay':>10} {'calls':>6}  kernel")
    for kernel, (total, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{total / runs / 1000.0:10.4f} {count // runs:6d}  {kernel[:150]}")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--top", type=int, default=40)
    options = parser.parse_args()
    for name in options.workloads:
        try:
            profile(name, options.runs, options.top)
        except Exception as error:  # noqa: BLE001 - one workload's failure leaves the others
            print(f"== {name}: failed: {wl.describe_error(error)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
