#!/usr/bin/env python3
"""A squeeze-and-excitation block as EfficientNet's exporter writes it (depthwise 3x3 + SiLU,
ReduceMean, 1x1 C->S + SiLU, 1x1 S->C + Sigmoid, Mul, then a 1x1 projection), random weights:
reproduces the fp16 NCHW fault of cuDNN's fused 1x1 engines without the model.
Usage: se_block.py C S  -> /tmp/se_C_S.onnx and /tmp/se_in_C.npz (input x [8, C, 14, 14]);
then `kiln run /tmp/se_C_S.onnx --backend cuda --route "-cuda.precision=fp16 -cuda.layout=nchw"
--loadInputs /tmp/se_in_C.npz --saveOutputs out.npz` and compare with the fp32 route's outputs.
Needs the onnx package (the device machine has it)."""
import numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
def init(name, a): return nh.from_array(a.astype(np.float32), name)
import sys
C, S = int(sys.argv[1]), int(sys.argv[2])
nodes = [
  h.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=C),
  h.make_node("Sigmoid", ["c0"], ["s0"]), h.make_node("Mul", ["c0", "s0"], ["a0"]),
  h.make_node("ReduceMean", ["a0", "axes"], ["m"], keepdims=1),
  h.make_node("Conv", ["m", "w1", "b1"], ["c1"]),
  h.make_node("Sigmoid", ["c1"], ["s1"]), h.make_node("Mul", ["c1", "s1"], ["a1"]),
  h.make_node("Conv", ["a1", "w2", "b2"], ["c2"]),
  h.make_node("Sigmoid", ["c2"], ["g"]), h.make_node("Mul", ["a0", "g"], ["y0"]),
  h.make_node("Conv", ["y0", "w3"], ["y"]),
]
inits = [init("w0", rng.normal(0, 0.3, (C, 1, 3, 3))), nh.from_array(np.array([2, 3], np.int64), "axes"),
         init("w1", rng.normal(0, 0.1, (S, C, 1, 1))), init("b1", rng.normal(0, 0.1, S)),
         init("w2", rng.normal(0, 0.3, (C, S, 1, 1))), init("b2", rng.normal(0, 0.1, C)),
         init("w3", rng.normal(0, 0.05, (80, C, 1, 1)))]
g = h.make_graph(nodes, "se", [h.make_tensor_value_info("x", T.FLOAT, [8, C, 14, 14])],
                 [h.make_tensor_value_info("y", T.FLOAT, [8, 80, 14, 14])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)]); m.ir_version = 8; onnx.save(m, f"/tmp/se_{C}_{S}.onnx")
np.savez(f"/tmp/se_in_{C}.npz", x=rng.normal(0, 1, (8, C, 14, 14)).astype(np.float32))
