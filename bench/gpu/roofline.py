#!/usr/bin/env python3
"""Fractions of the GPU's roofline: for each workload and each timed cell of a results.json that
run.sh (or report.py) wrote, the time a machine at its measured peaks would need, max(FLOPs /
peak matmul rate, bytes / copy bandwidth), over the cell's median. FLOPs are the matrix products'
(`kiln inspect`'s product_flops: Conv, ConvTranspose, Gemm, MatMul, 2 a multiply-add); bytes are
the traffic no schedule avoids (minimum_bytes: weights, inputs and outputs; the reduced-precision
cells count weights at 2 bytes an element). A cell at 1.0 runs at the roofline.

  roofline.py peaks --out peaks.json
      on the GPU machine, with torch: the median rate of large fp32 (TF32 off), TF32, fp16 and
      bf16 matrix products and the device-to-device copy bandwidth (bytes read + written).
  roofline.py report --kiln KILN --models DIR --peaks peaks.json --results results.json
                     [--json out.json]
      anywhere kiln runs: the table, Markdown, with the counts per workload.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path


def measure_peaks(out: Path) -> int:
    import torch  # only the GPU machine has it

    def timed(fn, repeats=20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            fn()
        samples = []
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000)
        return statistics.median(samples)

    peaks = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    n = 8192
    for name, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        seconds = timed(lambda: torch.mm(a, b))
        peaks[f"matmul_{name}_flops"] = 2 * n ** 3 / seconds
        del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src))
    peaks["copy_bytes_per_s"] = 2 * size / seconds  # each byte read once and written once
    peaks["method"] = (f"torch.mm of {n}x{n} matrices and a 1 GiB device copy, CUDA events, "
                       "median of 20 after 3 warm-ups")
    out.write_text(json.dumps(peaks, indent=1))
    print(json.dumps(peaks, indent=1))
    return 0


FIELD = re.compile(r"^\s*(product_flops|weight_bytes|io_bytes|minimum_bytes|unfused_bytes): (\S+)")


def count(kiln: str, model: Path) -> dict:
    done = subprocess.run([kiln, "inspect", str(model)], capture_output=True, text=True)
    fields = {}
    for line in done.stdout.splitlines():
        if m := FIELD.match(line):
            fields[m[1]] = float(m[2])
    if "product_flops" not in fields:
        lines = (done.stderr or done.stdout).strip().splitlines()
        fields["error"] = lines[-1] if lines else f"kiln inspect exited {done.returncode}"
    return fields


def precision_of(cell: str) -> str:
    for name in ("fp16", "bf16", "tf32"):
        if name in cell:
            return name
    return "fp32"


def report(args) -> int:
    peaks = json.loads(Path(args.peaks).read_text())
    results = json.loads(Path(args.results).read_text())
    bandwidth = peaks["copy_bytes_per_s"]
    rows, table = [], []
    for row in results.get("rows", []):
        workload = row["workload"]
        counts = count(args.kiln, Path(args.models) / workload / "model.onnx")
        entry = {"workload": workload, "counts": counts, "cells": {}}
        for cell, value in row.get("cells", {}).items():
            median = value.get("median") if isinstance(value, dict) else None
            if not median or "error" in counts:
                continue
            precision = precision_of(cell)
            flops_rate = peaks[f"matmul_{precision}_flops"]
            # Reduced cells hold their weights in 2 bytes; inputs and outputs stay float32.
            weights = counts["weight_bytes"] / (2 if precision in ("fp16", "bf16") else 1)
            compute_s = counts["product_flops"] / flops_rate
            memory_s = (weights + counts["io_bytes"]) / bandwidth
            bound = max(compute_s, memory_s)
            entry["cells"][cell] = {
                "median_ms": median, "roofline_ms": bound * 1e3,
                "fraction": bound / (median / 1e3),
                "bound": "compute" if compute_s >= memory_s else "memory",
                "achieved_flops": counts["product_flops"] / (median / 1e3)}
        rows.append(entry)
    cells = sorted({c for r in rows for c in r["cells"]})
    print(f"peaks on {peaks.get('device')}: fp32 {peaks['matmul_fp32_flops'] / 1e12:.1f}, "
          f"fp16 {peaks['matmul_fp16_flops'] / 1e12:.1f} TFLOP/s; copy "
          f"{bandwidth / 1e12:.2f} TB/s\n")
    print("| workload | GFLOP | min. MB | " + " | ".join(cells) + " |")
    print("|---|---|---|" + "---|" * len(cells))
    for r in rows:
        c = r["counts"]
        if "error" in c:
            print(f"| {r['workload']} | — | — | " + " | ".join("—" for _ in cells) +
                  f" |  <!-- {c['error']} -->")
            continue
        cell_text = []
        for cell in cells:
            v = r["cells"].get(cell)
            cell_text.append(f"{v['fraction']:.2f} ({v['bound'][0]})" if v else "—")
        print(f"| {r['workload']} | {c['product_flops'] / 1e9:.2f} | "
              f"{c['minimum_bytes'] / 1e6:.1f} | " + " | ".join(cell_text) + " |")
    print("\nEach cell: the fraction of the roofline, (c) compute-bound or (m) memory-bound.")
    if args.json:
        Path(args.json).write_text(json.dumps({"peaks": peaks, "rows": rows}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("peaks")
    p.add_argument("--out", default="peaks.json")
    r = sub.add_parser("report")
    r.add_argument("--kiln", required=True)
    r.add_argument("--models", required=True)
    r.add_argument("--peaks", required=True)
    r.add_argument("--results", required=True)
    r.add_argument("--json", default="")
    args = parser.parse_args()
    if args.command == "peaks":
        return measure_peaks(Path(args.out))
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
