#!/usr/bin/env python3
"""Usage: bisect_conv_source.py KILN MODEL.onnx INPUTS.npz
Finds which convolution of EfficientNet-B0 turns NaN under fp16 NCHW with cuDNN: prefix bisection
over the Conv nodes (topological order), putting cuda.conv.source=native on a prefix."""
import subprocess, sys, numpy as np, onnx, os
kiln, model, inputs = sys.argv[1:4]
m = onnx.load(model, load_external_data=False)
convs = [n for n in m.graph.node if n.op_type == "Conv"]
print(len(convs), "convs; first:", [(n.name, [a.name + "=" + str(onnx.helper.get_attribute_value(a)) for a in n.attribute if a.name == "group"]) for n in convs[:3]])
base = "-cuda.precision=fp16 -cuda.layout=nchw"
def nans(extra):
    if os.path.exists("/tmp/b.npz"): os.remove("/tmp/b.npz")
    r = subprocess.run([kiln, "run", model, "--backend", "cuda", "--route", base + " " + extra, "--loadInputs", inputs,
                        "--saveOutputs", "/tmp/b.npz", "--duration", "0"], capture_output=True, text=True, timeout=90)
    if r.returncode: print(r.stderr[-500:]); return None
    a = np.load("/tmp/b.npz"); return int(sum(np.isnan(a[k]).sum() for k in a.files))
def prefix(k): return " ".join(f"-cuda.conv.source@{n.name}=native" for n in convs[:k])
lo, hi = 0, len(convs)  # nans(prefix(lo)) > 0, nans(prefix(hi)) == 0
print("all native:", nans(prefix(hi)), "none:", nans(""))
while hi - lo > 1:
    mid = (lo + hi) // 2
    n = nans(prefix(mid)); print("prefix", mid, "nans", n, flush=True)
    if n: lo = mid
    else: hi = mid
c = convs[hi - 1]
print("culprit (first whose native fixes):", hi - 1, c.name, c.input, c.output, onnx.helper.printable_node(c))
print("only it native:", nans(f"-cuda.conv.source@{c.name}=native"))
shapes = {}
try:
    mi = onnx.shape_inference.infer_shapes(m)
    for v in list(mi.graph.value_info) + list(mi.graph.input) + list(mi.graph.initializer):
        if hasattr(v, "type"): shapes[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
        else: shapes[v.name] = list(v.dims)
except Exception as e: print(e)
print("shapes:", {x: shapes.get(x) for x in list(c.input) + list(c.output)})
