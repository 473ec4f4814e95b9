#!/usr/bin/env python3
"""A benchmark model's graph without its weights, to inspect kiln's passes on a machine that does
not have the model (the exports are hundreds of MB and are made where torch is).

  skeleton.py strip MODEL.onnx OUT.onnx     (needs the onnx package: on the GPU machine)
      OUT.onnx keeps the graph and every small or non-float initializer; each float32 initializer
      over 1 KiB becomes external data in OUT.onnx.weights, which is not written: only its size
      and the tensors' places in it are (OUT.onnx.layout.json).
  skeleton.py fill OUT.onnx                 (standard library only: anywhere)
      writes OUT.onnx.weights from the layout with seeded values of a small spread (N(0, 0.05)
      in float32), so that kiln can load, build and run the skeleton. Outputs are meaningless;
      shapes, the graph and what kiln's passes make of it are the model's.
"""

from __future__ import annotations

import array
import json
import random
import sys
from pathlib import Path

THRESHOLD = 1024


def strip(source: Path, target: Path) -> None:
    import onnx
    from onnx.external_data_helper import set_external_data

    model = onnx.load(str(source))
    location = target.name + ".weights"
    offset = 0
    tensors = []
    for tensor in model.graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        raw = tensor.raw_data if tensor.HasField("raw_data") else None
        if raw is None:
            raw = onnx.numpy_helper.to_array(tensor).astype("<f4").tobytes()
        if len(raw) <= THRESHOLD:
            continue
        set_external_data(tensor, location=location, offset=offset, length=len(raw))
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensors.append({"name": tensor.name, "offset": offset, "length": len(raw)})
        offset += len(raw)
        offset += (-offset) % 64
    onnx.save(model, str(target))
    layout = {"weights": location, "size": offset, "tensors": tensors}
    Path(str(target) + ".layout.json").write_text(json.dumps(layout, indent=1))
    print(f"{target}: {len(tensors)} external float32 tensors, {offset / 2**20:.1f} MiB")


def fill(target: Path) -> None:
    layout = json.loads(Path(str(target) + ".layout.json").read_text())
    rng = random.Random(0)
    block = array.array("f", (rng.gauss(0.0, 0.05) for _ in range(1 << 18))).tobytes()
    size = layout["size"]
    with open(target.parent / layout["weights"], "wb") as out:
        written = 0
        while written < size:
            chunk = block[: size - written]
            out.write(chunk)
            written += len(chunk)
    print(f"{target.parent / layout['weights']}: {size / 2**20:.1f} MiB")


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "strip":
        strip(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "fill":
        fill(Path(sys.argv[2]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
