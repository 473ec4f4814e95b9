#!/usr/bin/env python3
"""Turns peers.json (peers.py) and kiln.json (kiln_runs.py) into one Markdown report and one JSON
document: latency per workload for kiln fp32/fp16 and PyTorch's peers, kiln fp16's ratio to eager
fp16 and to torch.compile, the accuracy of every cell against the fp32 reference, and a header
with the GPU, driver and library versions. A cell that has no figure says why.

Several files of each kind may be given (runs of different workloads, say): later files win for a
workload both hold. Needs no torch or numpy.

Usage: report.py peers.json kiln.json [more.json ...] --md results.md --json results.json
                 [--workloads a,b,c] [--why-missing TEXT]
"""

from __future__ import annotations

import argparse
import math
import re
import sys

import workloads as wl

# (key, header, source kind, entry path) of the latency columns, in order.
COLUMNS = (
    ("kiln_fp32", "kiln fp32", "kiln", "fp32"),
    ("kiln_fp16", "kiln fp16", "kiln", "fp16"),
    ("eager_fp32", "eager fp32", "peers", "eager_fp32"),
    ("eager_fp16", "eager fp16", "peers", "eager_fp16"),
    ("compile_ro_fp16", "compile r-o fp16", "peers", "compile_ro_fp16"),
    ("max_autotune_fp16", "max-autotune fp16", "peers", "max_autotune_fp16"),
)
RATIOS = (
    ("kiln_fp16_vs_eager_fp16", "kiln fp16 vs eager fp16", "eager_fp16", "kiln_fp16"),
    ("kiln_fp16_vs_compile_ro_fp16", "kiln fp16 vs compile r-o", "compile_ro_fp16", "kiln_fp16"),
)
SHORT = 72  # characters of a reason shown in a cell; the whole text goes to the notes


class Notes:
    """Numbered notes under the tables; the same text gets the same number."""

    def __init__(self):
        self.texts: list[str] = []

    def ref(self, text: str) -> int:
        if text not in self.texts:
            self.texts.append(text)
        return self.texts.index(text) + 1


def load(paths: list[str]) -> tuple[dict, dict]:
    """The merged 'peers' and 'kiln' documents of `paths`."""
    merged = {kind: {"workloads": {}, "environment": {}, "settings": {}, "dates": []}
              for kind in ("peers", "kiln")}
    for path in paths:
        data = wl.read_json(path)
        if data is None:  # that stage has not run (yet): its cells say why they are empty
            continue
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind not in merged:
            raise SystemExit(f"report.py: {path} is neither a peers.json nor a kiln.json")
        target = merged[kind]
        target["workloads"].update(data.get("workloads", {}))
        target["dates"] += [row["date"] for row in data.get("workloads", {}).values()
                            if isinstance(row, dict) and row.get("date")]
        target["environment"] = data.get("environment", {}) or target["environment"]
        target["settings"] = data.get("settings", {}) or target["settings"]
        if data.get("date"):
            target["dates"].append(data["date"])
    return merged["peers"], merged["kiln"]


def fmt_ms(x: float) -> str:
    if x < 10:
        return f"{x:.3f}"
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def fmt_err(x) -> str:
    if isinstance(x, str):
        return x
    return "0" if x == 0 else f"{x:.1e}"


def shorten(text: str, notes: Notes) -> str:
    """`text` for a cell: whole when short, else cut with a note holding all of it."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    if len(text) <= SHORT:
        return text
    return f"{text[:SHORT - 1]}… [{notes.ref(text)}]"


def entry_for(kind: str, path: str, workload: str, peers: dict, kiln: dict) -> dict | None:
    """A column's entry for a workload, or None when its file has none."""
    document = peers if kind == "peers" else kiln
    row = document["workloads"].get(workload)
    if row is None:
        return None
    if kind == "peers":
        return row.get("peers", {}).get(path) or ({"status": "failed", "error": row["error"]}
                                                 if "error" in row else None)
    return row.get("runs", {}).get(path) or ({"status": "failed", "error": row["error"]}
                                            if "error" in row else None)


def latency_cell(key: str, entry: dict | None, why_missing: str, notes: Notes) -> dict:
    """The JSON cell and its Markdown text for one latency column."""
    if entry is None:
        return {"status": "missing", "reason": why_missing,
                "text": f"— [{notes.ref(why_missing)}]"}
    status = entry.get("status")
    if status != "ok" or "time_ms" not in entry:
        reason = entry.get("error") or entry.get("reason") or f"no figure (status {status})"
        if entry.get("cached"):
            reason = f"cached {str(entry.get('date', '?'))[:10]}: {reason}"
        mark = "✗" if status == "failed" else "–"
        return {"status": status or "failed", "reason": reason,
                "text": f"{mark} {shorten(reason, notes)}"}
    t = entry["time_ms"]
    cell = {"status": "ok", "median": t["median"], "p10": t["p10"], "p90": t["p90"],
            "runs": t["runs"]}
    extras = []
    if key.startswith("kiln"):
        if "host_layers" in entry:
            on_host, total = entry["host_layers"]
            cell["host_layers"] = entry["host_layers"]
            extras.append(f"{on_host}/{total} layers on host")
        execution = entry.get("execution")
        if execution and execution != "CUDA graph replay":
            cell["execution"] = execution
            extras.append(f"no CUDA graph [{notes.ref(f'{key}: {execution}')}]")
    if "compile_s" in entry:
        cell["compile_s"] = entry["compile_s"]
        extras.append(f"compile {entry['compile_s']:.0f} s")
    if key == "max_autotune_fp16":
        cell["cached"] = bool(entry.get("cached"))
        cell["date"] = entry.get("date")
        extras.append(f"cached {str(entry.get('date', '?'))[:10]}" if entry.get("cached")
                      else "measured in this run")
    text = f"{fmt_ms(t['median'])} ({fmt_ms(t['p10'])}–{fmt_ms(t['p90'])})"
    cell["text"] = text + "".join(f" · {e}" for e in extras)
    return cell


def worst(accuracy_by_output: dict | None) -> dict | None:
    """The output with the largest relative error (an error or a NaN counts as the largest)."""
    if not accuracy_by_output:
        return None

    def badness(a: dict) -> float:
        if "error" in a:
            return math.inf
        value = a.get("rel_l2")
        if isinstance(value, str):
            return math.inf
        return value if value is not None else math.inf

    return max(accuracy_by_output.values(), key=badness)


def accuracy_text(accuracy: dict | None, notes: Notes) -> str:
    if accuracy is None:
        return "—"
    if "error" in accuracy:
        return f"✗ {shorten(accuracy['error'], notes)}"
    text = f"{fmt_err(accuracy['max_abs'])} / {fmt_err(accuracy['cos_dist'])}"
    if accuracy.get("non_finite"):
        text += f" · {accuracy['non_finite']} non-finite"
    return text


def ratio(numerator: dict, denominator: dict) -> tuple[float | None, str]:
    if numerator.get("status") != "ok" or denominator.get("status") != "ok":
        return None, "—"
    value = numerator["median"] / denominator["median"]
    return value, f"{value:.2f}×"


def version_text(v: str | int | None) -> str | None:
    """cuDNN/cuBLASLt integer versions from kiln's device line as text."""
    if v is None:
        return None
    v = int(v)
    if v >= 90000:
        return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    return f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def header(peers: dict, kiln: dict) -> list[tuple[str, str]]:
    """(field, value) lines: date, GPU, driver, the libraries of both sides, timing method."""
    pe, ke = peers["environment"], kiln["environment"]
    lines = []
    dates = sorted(peers["dates"] + kiln["dates"])
    lines.append(("date", f"{dates[0]} to {dates[-1]}" if len(set(dates)) > 1
                  else (dates[0] if dates else wl.utc_now())))
    if pe.get("gpu"):
        lines.append(("GPU", f"{pe['gpu']} (compute capability {pe.get('capability')}, "
                             f"{pe.get('sms')} SMs, {pe.get('memory_gib')} GiB)"))
    elif ke.get("device"):
        lines.append(("GPU", ke["device"].split(",")[0]))
    if pe.get("driver"):
        lines.append(("driver", str(pe["driver"])))
    if pe:
        lines.append(("PyTorch", ", ".join(
            f"{name} {pe[key]}" for name, key in (
                ("torch", "torch"), ("CUDA", "cuda_runtime"), ("cuDNN", "cudnn"),
                ("cuBLASLt", "cublaslt"), ("triton", "triton"), ("torchvision", "torchvision"),
                ("transformers", "transformers"), ("Python", "python"))
            if pe.get(key))))
    if ke:
        parts = [f"version {ke.get('kiln_version', '?')}"]
        if ke.get("commit"):
            parts.append(f"commit {ke['commit']}")
        device = ke.get("device", "")
        if m := re.search(r"runtime (\d+\.\d+)", device):
            parts.append(f"CUDA {m.group(1)}")
        if m := re.search(r"cuDNN (\d+)", device):
            parts.append(f"cuDNN {version_text(m.group(1))}")
        if m := re.search(r"cuBLASLt (\d+)", device):
            parts.append(f"cuBLASLt {version_text(m.group(1))}")
        lines.append(("kiln", ", ".join(parts)))
        if device:
            lines.append(("kiln's device line", device))
    ps, ks = peers["settings"], kiln["settings"]
    method = []
    if ps:
        method.append(f"PyTorch: {ps.get('warmup')} warm-up and {ps.get('runs')} timed runs, "
                      f"TF32 {'on' if ps.get('tf32') else 'off'}")
    if ks:
        route = ks.get("route") or "default route"
        method.append(f"kiln: {ks.get('warmup_ms'):.0f} ms warm-up and {ks.get('iterations')} "
                      f"timed runs, {route}, fp16 adds `{ks.get('fp16_route')}`")
    method.append("both: CUDA events around each run, 10 runs enqueued back to back, host copies "
                  "excluded; median (p10–p90) ms")
    lines.append(("timing", "; ".join(method)))
    return lines


def build(peers: dict, kiln: dict, names: list[str], why_missing: str) -> dict:
    """The report as data: header, rows (latency cells, ratios, accuracy) and notes."""
    notes = Notes()
    rows = []
    has_executor = False
    for name in names:
        try:
            label = wl.by_name(name).label
        except SystemExit:
            label = name
        cells = {key: latency_cell(key, entry_for(kind, path, name, peers, kiln), why_missing,
                                   notes)
                 for key, _, kind, path in COLUMNS}
        ratios = {}
        for key, _, num, den in RATIOS:
            value, text = ratio(cells[num], cells[den])
            ratios[key] = {"value": value, "text": text}
        accuracy = {}
        kiln_row = kiln["workloads"].get(name, {})
        peers_row = peers["workloads"].get(name, {})
        export = kiln_row.get("export") or peers_row.get("export") or {}
        reference = export.get("reference", {})
        accuracy["ref_max_abs"] = {"value": reference.get("max_abs"),
                                   "text": fmt_err(reference["max_abs"])
                                   if "max_abs" in reference else "—"}
        ort = export.get("ort_check", {})
        ort_worst = worst(ort.get("accuracy"))
        accuracy["onnxruntime"] = {"value": ort_worst,
                                   "text": accuracy_text(ort_worst, notes) if ort_worst else
                                   (f"✗ {shorten(ort['error'], notes)}" if "error" in ort
                                    else "—")}
        for key, _, kind, path in COLUMNS:
            entry = entry_for(kind, path, name, peers, kiln) or {}
            value = worst(entry.get("accuracy")) if entry.get("status") == "ok" else None
            accuracy[key] = {"value": value, "text": accuracy_text(value, notes)}
        executor = kiln_row.get("reference_executor")
        if executor:
            has_executor = True
            value = worst(executor.get("accuracy")) if executor.get("status") == "ok" else None
            accuracy["executor_vs_ref"] = {
                "value": value,
                "text": accuracy_text(value, notes) if value else
                f"✗ {shorten(executor.get('error') or executor.get('reason', '?'), notes)}"}
            for precision in ("fp32", "fp16"):
                run = kiln_row.get("runs", {}).get(precision, {})
                value = worst(run.get("accuracy_vs_executor"))
                accuracy[f"kiln_{precision}_vs_executor"] = {"value": value,
                                                             "text": accuracy_text(value, notes)}
        workload_notes = []
        try:
            if wl.by_name(name).note:
                workload_notes.append(wl.by_name(name).note)
        except SystemExit:
            pass
        if export.get("dynamo_error"):
            workload_notes.append("dynamo exporter failed, TorchScript used: "
                                  + export["dynamo_error"])
        rows.append({
            "workload": name,
            "label": label,
            "exporter": export.get("exporter"),
            "onnx_nodes": (export.get("onnx") or {}).get("nodes"),
            "notes": workload_notes,
            "cells": cells,
            "ratios": ratios,
            "accuracy": accuracy,
        })
    return {
        "generated": wl.utc_now(),
        "header": header(peers, kiln),
        "environment": {"peers": peers["environment"], "kiln": kiln["environment"]},
        "settings": {"peers": peers["settings"], "kiln": kiln["settings"]},
        "rows": rows,
        "has_executor": has_executor,
        "notes": notes.texts,
    }


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def markdown(report: dict) -> str:
    out = ["# kiln against PyTorch on the GPU", ""]
    out += table(["", ""], [[k, v] for k, v in report["header"]])
    out += ["", "## Latency, median ms (p10–p90)", "",
            "Ratios are the peer's median over kiln fp16's: above 1 means kiln is faster.", ""]
    headers = ["workload"] + [h for _, h, _, _ in COLUMNS] + [h for _, h, _, _ in RATIOS]
    rows = [[r["label"]] + [r["cells"][k]["text"] for k, _, _, _ in COLUMNS]
            + [r["ratios"][k]["text"] for k, _, _, _ in RATIOS] for r in report["rows"]]
    out += table(headers, rows)
    out += ["", "## Accuracy against PyTorch fp32 (TF32 off): max abs error / cosine distance", "",
            "ONNX Runtime (CPU) runs the exported file: it checks the export apart from kiln. "
            "Where a model has several outputs, the one with the largest relative error is shown.",
            ""]
    headers = (["workload", "ref max \\|y\\|", "ONNX Runtime"]
               + [h for _, h, _, _ in COLUMNS])
    keys = ["ref_max_abs", "onnxruntime"] + [k for k, _, _, _ in COLUMNS]
    rows = [[r["label"]] + [r["accuracy"][k]["text"] for k in keys] for r in report["rows"]]
    out += table(headers, rows)
    if report["has_executor"]:
        out += ["", "## Against kiln's reference executor: max abs error / cosine distance", ""]
        keys = ["executor_vs_ref", "kiln_fp32_vs_executor", "kiln_fp16_vs_executor"]
        rows = [[r["label"]] + [r["accuracy"].get(k, {"text": "—"})["text"] for k in keys]
                for r in report["rows"]]
        out += table(["workload", "executor vs PyTorch fp32", "kiln fp32 vs executor",
                      "kiln fp16 vs executor"], rows)
    out += ["", "## Workloads", ""]
    rows = [[r["label"], r["exporter"] or "—", str(r["onnx_nodes"] or "—"),
             "; ".join(r["notes"]) or ""] for r in report["rows"]]
    out += table(["workload", "exporter", "ONNX nodes", "note"], rows)
    if report["notes"]:
        out += ["", "## Notes", ""]
        out += [f"{i}. {text}" for i, text in enumerate(report["notes"], 1)]
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="peers.json and kiln.json files")
    parser.add_argument("--md", help="Markdown report to write (default: print it)")
    parser.add_argument("--json", help="JSON report to write")
    parser.add_argument("--workloads", default="",
                        help="rows, in this order (default: every workload with results)")
    parser.add_argument("--why-missing", default="not measured in this run",
                        help="what a cell with no result says")
    parser.add_argument("--command", default="", help="the command that made the results")
    args = parser.parse_args()
    peers, kiln = load(args.results)
    if args.workloads:
        names = [w.name for w in wl.select(args.workloads)]
    else:
        present = set(peers["workloads"]) | set(kiln["workloads"])
        names = [n for n in wl.NAMES if n in present] + sorted(present - set(wl.NAMES))
    report = build(peers, kiln, names, args.why_missing)
    if args.command:
        report["header"].append(("command", f"`{args.command}`"))
    text = markdown(report)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.json:
        wl.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
