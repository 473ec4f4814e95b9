#!/usr/bin/env python3
"""Converts the ONNX test suite's TensorProto files (test_data_set_0/input_0.pb, ...) into one .npz
that `kiln run --loadInputs` and bench/cpu/ort/ort_run.mjs read, with the standard library only
(no protobuf or numpy module): the protobuf wire format of onnx.TensorProto's fields dims (1),
data_type (2), float_data (4), int32_data (5), int64_data (7), name (8), raw_data (9) and
double_data (10), and numpy's .npy format inside a zip.

Usage: pb_to_npz.py OUT.npz NAME=FILE.pb [NAME=FILE.pb ...]
  NAME: the model input's name (a tensor's own name field, when it has one, must agree)
"""

from __future__ import annotations

import struct
import sys
import zipfile

# onnx.TensorProto.DataType -> (numpy descr, struct format of one element)
TYPES = {1: ("<f4", "<f"), 2: ("|u1", "<B"), 3: ("|i1", "<b"), 4: ("<u2", "<H"),
         5: ("<i2", "<h"), 6: ("<i4", "<i"), 7: ("<i8", "<q"), 9: ("|b1", "<?"),
         10: ("<f2", "<e"), 11: ("<f8", "<d"), 12: ("<u4", "<I"), 13: ("<u8", "<Q")}


def varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def signed(value: int) -> int:  # int32/int64 fields: two's complement in 64 bits
    return value - (1 << 64) if value >= 1 << 63 else value


def parse_tensor(data: bytes, where: str) -> dict:
    tensor = {"dims": [], "type": 0, "name": "", "raw": None, "values": []}
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
            if field == 1:
                tensor["dims"].append(signed(value))
            elif field == 2:
                tensor["type"] = value
            elif field in (5, 7):
                tensor["values"].append(signed(value))
        elif wire == 2:
            length, i = varint(data, i)
            chunk, i = data[i:i + length], i + length
            if field == 1 or field in (5, 7):  # packed varints
                j = 0
                while j < len(chunk):
                    value, j = varint(chunk, j)
                    (tensor["dims"] if field == 1 else tensor["values"]).append(signed(value))
            elif field == 4:
                tensor["values"] += list(struct.unpack(f"<{len(chunk) // 4}f", chunk))
            elif field == 10:
                tensor["values"] += list(struct.unpack(f"<{len(chunk) // 8}d", chunk))
            elif field == 8:
                tensor["name"] = chunk.decode()
            elif field == 9:
                tensor["raw"] = chunk
        elif wire == 5:
            if field == 4:
                tensor["values"].append(struct.unpack("<f", data[i:i + 4])[0])
            i += 4
        elif wire == 1:
            if field == 10:
                tensor["values"].append(struct.unpack("<d", data[i:i + 8])[0])
            i += 8
        else:
            raise ValueError(f"{where}: wire type {wire} of field {field} is not a TensorProto's")
    if tensor["type"] not in TYPES:
        raise ValueError(f"{where}: data type {tensor['type']} is not supported here")
    return tensor


def npy(tensor: dict, where: str) -> bytes:
    descr, element = TYPES[tensor["type"]]
    count = 1
    for d in tensor["dims"]:
        count *= d
    if tensor["raw"] is not None:
        body = tensor["raw"]
    elif tensor["type"] == 10:  # float16 travels in int32_data as bit patterns
        body = struct.pack(f"<{len(tensor['values'])}H", *tensor["values"])
    else:
        body = struct.pack(f"<{len(tensor['values'])}{element[1]}", *tensor["values"])
    if len(body) != count * struct.calcsize(element):
        raise ValueError(f"{where}: {len(body)} bytes of data for shape {tensor['dims']}")
    dims = tensor["dims"]
    shape = f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    padding = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (padding % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + body


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    with zipfile.ZipFile(sys.argv[1], "w") as archive:
        for spec in sys.argv[2:]:
            name, _, path = spec.partition("=")
            data = open(path, "rb").read()
            tensor = parse_tensor(data, path)
            if tensor["name"] and tensor["name"] != name:
                print(f"pb_to_npz: {path} names its tensor '{tensor['name']}', given '{name}'",
                      file=sys.stderr)
            archive.writestr(f"{name}.npy", npy(tensor, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
