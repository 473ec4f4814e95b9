#!/usr/bin/env python3
"""Per-kernel GPU time of one inference from two Nsight Compute runs of `kiln run` (the CSV that
`ncu --csv --metrics gpu__time_duration.sum --log-file F` writes): one run of N timed iterations
and one of N + 1. The second run's extra kernels are one inference, and its last that many
launches are the last inference's (build-time work such as cuDNN's engine checks or cuBLASLt's
heuristics, and the warm-up, come first and are the same in both). Prints the inference's kernels
grouped by kernel (the name without its template arguments and parameters), with launches, total
and mean microseconds and share, then the longest single launches; --json writes the same.

Usage: ncu_table.py RUN_N.csv RUN_N_PLUS_1.csv [--top 15] [--json out.json]
       ncu_table.py --self-test
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import OrderedDict

METRIC = "gpu__time_duration.sum"
# Nanoseconds per unit of the metric's reported unit.
UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
         "second": 1e9, "s": 1e9}


def launches(text: str) -> list[tuple[str, float]]:
    """(kernel name, nanoseconds) of each launch, in launch order."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no CSV header (a line starting with \"ID\") in the ncu log")
    rows = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    out: list[tuple[str, float]] = []
    for row in rows:
        if row.get("Metric Name") != METRIC:
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in UNITS:
            raise ValueError(f"launch {row.get('ID')}: unknown unit {unit!r}")
        value = float(row["Metric Value"].replace(",", ""))
        out.append((row["Kernel Name"], value * UNITS[unit]))
    return out


def short_name(name: str) -> str:
    """The kernel's name without template arguments or parameters: 'void ns::k<T, 4>(args)' ->
    'ns::k'."""
    depth, kept = 0, []
    for ch in name.replace("(anonymous namespace)::", ""):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            kept.append(ch)
    text = "".join(kept).strip()
    return text.split(" ")[-1] if " " in text else text


def one_inference(first: list, second: list) -> list:
    extra = len(second) - len(first)
    if extra <= 0:
        raise ValueError(f"the second run has {len(second)} launches, the first {len(first)}: "
                         "the second must have one more inference's worth")
    return second[-extra:]


def table(inference: list, top: int) -> dict:
    total = sum(ns for _, ns in inference)
    groups: "OrderedDict[str, list[float]]" = OrderedDict()
    for name, ns in inference:
        groups.setdefault(short_name(name), []).append(ns)
    rows = sorted(({"kernel": k, "launches": len(v), "total_us": sum(v) / 1e3,
                    "mean_us": sum(v) / len(v) / 1e3, "share": sum(v) / total if total else 0.0}
                   for k, v in groups.items()), key=lambda r: -r["total_us"])
    longest = sorted(({"index": i, "kernel": short_name(n), "us": ns / 1e3}
                      for i, (n, ns) in enumerate(inference)), key=lambda r: -r["us"])[:top]
    return {"launches": len(inference), "total_us": total / 1e3, "kernels": rows,
            "longest": longest}


def markdown(t: dict) -> str:
    out = [f"{t['launches']} launches, {t['total_us']:.1f} us of kernel time in one inference", "",
           "| kernel | launches | total us | mean us | share |", "|---|---|---|---|---|"]
    for r in t["kernels"]:
        out.append(f"| `{r['kernel']}` | {r['launches']} | {r['total_us']:.1f} | "
                   f"{r['mean_us']:.2f} | {100 * r['share']:.1f}% |")
    out += ["", "| launch # | kernel | us |", "|---|---|---|"]
    out += [f"| {r['index']} | `{r['kernel']}` | {r['us']:.2f} |" for r in t["longest"]]
    return "\n".join(out)


def self_test() -> int:
    header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
              '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
              '"Metric Value"')

    def log(kernels):
        rows = [f'"{i}","1","kiln","h","{k}","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0",'
                f'"Command line profiler metrics","{METRIC}","{unit}","{v}"'
                for i, (k, unit, v) in enumerate(kernels)]
        return "\n".join(["==PROF== Connected to process 1", header] + rows)

    build = [("void cudnn::engine<float>(int)", "nsecond", "900")]
    inference = [("void kiln::cuda::(anonymous namespace)::flashAttentionKernel<__half, 64, true, 4>"
                  "(kiln::cuda::FlashAttentionArgs)", "usecond", "20.5"),
                 ("void kiln::cuda::(anonymous namespace)::flashCombineKernel<__half, 64, 64>"
                  "(kiln::cuda::FlashAttentionArgs)", "nsecond", "1,500"),
                 ("void kiln::cuda::(anonymous namespace)::flashAttentionKernel<__half, 64, true, 4>"
                  "(kiln::cuda::FlashAttentionArgs)", "usecond", "19.5")]
    first = launches(log(build + inference))
    second = launches(log(build + inference + inference))
    t = table(one_inference(first, second), top=2)
    assert t["launches"] == 3, t
    assert abs(t["total_us"] - 41.5) < 1e-9, t
    flash = t["kernels"][0]
    assert flash["kernel"] == "kiln::cuda::flashAttentionKernel", flash
    assert flash["launches"] == 2 and abs(flash["total_us"] - 40.0) < 1e-9, flash
    assert t["kernels"][1]["kernel"] == "kiln::cuda::flashCombineKernel", t["kernels"]
    assert [r["index"] for r in t["longest"]] == [0, 2], t["longest"]
    try:
        one_inference(second, first)
    except ValueError:
        pass
    else:
        raise AssertionError("a second run with fewer launches must be refused")
    print("ncu_table self-test: ok")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="the N-iteration and the N+1-iteration CSV logs")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if len(args.runs) != 2:
        parser.error("give the two runs' CSV logs")
    try:
        logs = [launches(open(path, encoding="utf-8", errors="replace").read())
                for path in args.runs]
        t = table(one_inference(*logs), args.top)
    except (OSError, ValueError) as error:
        print(f"ncu_table.py: {error}", file=sys.stderr)
        return 1
    print(markdown(t))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(t, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
