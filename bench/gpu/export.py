#!/usr/bin/env python3
"""Exports the GPU benchmark workloads from PyTorch: per workload, DIR/<name>/ gets model.onnx
(opset 18, fixed shapes), inputs.npz (the seeded inputs, named after the model's inputs), ref.npz
(PyTorch's fp32 outputs with TF32 off, named after the model's outputs) and export.json (versions,
exporter, the model's ops, and how far ONNX Runtime's CPU result is from ref.npz, which checks the
export itself).

inputs.npz and ref.npz are written before the ONNX export, so PyTorch's peers still run when the
export fails. A workload whose export.json records the same versions is skipped (--force redoes
it).

Usage: export.py --out DIR [--only name,name] [--force] [--no-ort-check] [--opset N]
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import time
import traceback
from pathlib import Path

import workloads as wl

OPSET = 18


def versions(opset: int) -> dict:
    """What decides the exported files: the libraries that build and export the models, the opset
    and the workload definitions."""
    import torch

    result = {"torch": torch.__version__, "opset": opset, "workloads": wl.source_digest()}
    for module in ("torchvision", "transformers", "onnx", "onnxscript"):
        try:
            result[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - a missing library is recorded, not fatal
            result[module] = None
    return result


def set_fp32_exact() -> None:
    """fp32 everywhere: no TF32 in cuBLAS or cuDNN, so ref.npz is a true fp32 result."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def reference_outputs(model, inputs: list) -> tuple[object, str]:
    """The model's fp32 output as a numpy array, computed on the GPU when there is one, and where
    it was computed."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    with torch.inference_mode():
        output = model(*[x.to(device) for x in inputs])
    if not isinstance(output, torch.Tensor):
        output = output[0]
    array = output.float().cpu().numpy()
    model.to("cpu")
    return array, device


def export_onnx(workload: wl.Workload, model, inputs: list, path: Path, exporter: str,
                opset: int) -> None:
    """torch.onnx.export with the workload's input and output names, weights inside the file."""
    import torch

    common = dict(
        input_names=list(workload.input_names),
        output_names=[workload.output_name],
        opset_version=opset,
    )
    with torch.no_grad():
        if exporter == "dynamo":
            torch.onnx.export(model, tuple(inputs), str(path), dynamo=True, external_data=False,
                              **common)
        else:
            torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, **common)


def onnx_summary(path: Path) -> dict:
    """The exported model's input and output names, node count, opsets and op histogram."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    ops = collections.Counter(node.op_type for node in model.graph.node)
    return {
        "inputs": [v.name for v in model.graph.input if v.name not in initializers],
        "outputs": [v.name for v in model.graph.output],
        "nodes": len(model.graph.node),
        "ir_version": model.ir_version,
        "opsets": {imp.domain or "ai.onnx": imp.version for imp in model.opset_import},
        "ops": dict(ops.most_common()),
        "bytes": path.stat().st_size,
    }


def ort_check(path: Path, inputs: dict, references: dict) -> dict:
    """ONNX Runtime's CPU outputs for the exported file against ref.npz: says whether the export
    computes what PyTorch computes, apart from kiln."""
    import onnxruntime

    start = time.perf_counter()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    arrays = session.run(names, inputs)
    return {
        "onnxruntime": onnxruntime.__version__,
        "accuracy": wl.accuracy_of_outputs(dict(zip(names, arrays)), references),
        "seconds": round(time.perf_counter() - start, 2),
    }


def renamed(arrays: list, wanted: list[str], exported: list[str], what: str) -> dict:
    """Arrays keyed by the exported model's names (positionally) when it renamed them; an error
    when the counts differ, since no .npz could then feed it."""
    if len(exported) != len(arrays):
        raise RuntimeError(f"the ONNX model has {what} {exported}, the workload {wanted}")
    return dict(zip(exported, arrays))


def export_workload(workload: wl.Workload, folder: Path, current: dict, ort: bool) -> dict:
    """Builds, runs and exports one workload into `folder`; returns its export.json record."""
    import numpy as np
    import torch

    record = {"workload": workload.name, "versions": current, "date": wl.utc_now()}
    stage = "build"
    try:
        torch.manual_seed(wl.MODEL_SEED)
        model = workload.build()
        stage = "inputs"
        tensors = workload.make_inputs()
        inputs = [tensors[name] for name in workload.input_names]
        arrays = [t.numpy() for t in inputs]
        wl.save_npz(folder / "inputs.npz", dict(zip(workload.input_names, arrays)))
        stage = "reference"
        start = time.perf_counter()
        reference, device = reference_outputs(model, inputs)
        wl.save_npz(folder / "ref.npz", {workload.output_name: reference})
        record["reference"] = {
            "device": device,
            "tf32": False,
            "shape": list(reference.shape),
            "max_abs": wl.json_number(float(np.max(np.abs(reference)))),
            "non_finite": int(reference.size - np.count_nonzero(np.isfinite(reference))),
            "seconds": round(time.perf_counter() - start, 2),
        }
        stage = "export"
        path = folder / "model.onnx"
        start = time.perf_counter()
        record["exporter"] = workload.exporter
        try:
            export_onnx(workload, model, inputs, path, workload.exporter, current["opset"])
        except Exception as error:  # noqa: BLE001 - the dynamo exporter falls back to TorchScript
            if workload.exporter != "dynamo":
                raise
            record["dynamo_error"] = wl.describe_error(error)
            print(f"  dynamo exporter failed ({record['dynamo_error']}); trying TorchScript",
                  flush=True)
            record["exporter"] = "torchscript"
            export_onnx(workload, model, inputs, path, "torchscript", current["opset"])
        record["export_seconds"] = round(time.perf_counter() - start, 1)
        stage = "inspect"
        summary = onnx_summary(path)
        record["onnx"] = summary
        # Key the files by the exported names, which kiln matches against the model.
        if summary["inputs"] != list(workload.input_names):
            wl.save_npz(folder / "inputs.npz",
                        renamed(arrays, list(workload.input_names), summary["inputs"], "inputs"))
        if summary["outputs"] != [workload.output_name]:
            wl.save_npz(folder / "ref.npz",
                        renamed([reference], [workload.output_name], summary["outputs"],
                                "outputs"))
        if ort:
            stage = "onnxruntime"
            try:
                record["ort_check"] = ort_check(path, wl.load_npz(folder / "inputs.npz"),
                                                wl.load_npz(folder / "ref.npz"))
            except Exception as error:  # noqa: BLE001 - the check is informative only
                record["ort_check"] = {"error": wl.describe_error(error)}
        record["status"] = "ok"
    except Exception as error:  # noqa: BLE001 - one workload's failure is its row, not the run's
        record["status"] = "failed"
        record["stage"] = stage
        record["error"] = wl.describe_error(error)
        record["traceback"] = traceback.format_exc()[-4000:]
        if stage in ("build", "inputs", "reference", "export"):
            (folder / "model.onnx").unlink(missing_ok=True)
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return record


def already_exported(folder: Path, current: dict) -> dict | None:
    """The export.json record of an earlier export with the same versions, or None."""
    record = wl.read_json(folder / "export.json")
    if not isinstance(record, dict) or record.get("versions") != current:
        return None
    needed = ("inputs.npz", "ref.npz", "model.onnx") if record.get("status") == "ok" else ()
    if any(not (folder / name).exists() for name in needed):
        return None
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the exported workloads")
    parser.add_argument("--only", default="", help="comma-separated workload names (default all)")
    parser.add_argument("--force", action="store_true", help="export again even when up to date")
    parser.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    parser.add_argument("--no-ort-check", action="store_true",
                        help="skip running the exported file with ONNX Runtime's CPU provider")
    args = parser.parse_args()

    selected = wl.select(args.only)
    set_fp32_exact()
    current = versions(args.opset)
    failed = 0
    for workload in selected:
        folder = Path(args.out) / workload.name
        folder.mkdir(parents=True, exist_ok=True)
        earlier = None if args.force else already_exported(folder, current)
        if earlier is not None:
            print(f"{workload.name}: exported already ({earlier.get('status')}, "
                  f"{earlier.get('date')})", flush=True)
            failed += earlier.get("status") != "ok"
            continue
        print(f"{workload.name}: exporting", flush=True)
        start = time.perf_counter()
        record = export_workload(workload, folder, current, not args.no_ort_check)
        record["seconds"] = round(time.perf_counter() - start, 1)
        wl.write_json(folder / "export.json", record)
        if record["status"] == "ok":
            check = record.get("ort_check")
            if check is None:
                checked = ""
            elif "error" in check:
                checked = f"; ONNX Runtime check failed: {check['error']}"
            else:
                errors = [a.get("rel_l2", a.get("error")) for a in check["accuracy"].values()]
                checked = f"; ONNX Runtime's rel. L2 error {errors}"
            print(f"{workload.name}: {record['exporter']} export, {record['onnx']['nodes']} nodes, "
                  f"{record['seconds']} s{checked}", flush=True)
        else:
            failed += 1
            print(f"{workload.name}: FAILED at {record['stage']}: {record['error']}", flush=True)
    print(f"export: {len(selected) - failed} of {len(selected)} workloads ready", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
