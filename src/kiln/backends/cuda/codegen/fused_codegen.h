// CUDA C++ for one kiln.FusedElementwise node, generated while the plan is lowered and compiled
// by NVRTC when it is prepared (codegen/nvrtc.h). Where the interpreter (eltwise.cu's fusedKernel)
// walks any program and any broadcast at run time, a generated kernel has its program as
// straight-line code, its output's dimensions and every operand's strides as constants (so
// coordinates come from divisions by constants), operands that are one element loaded once per
// thread, and each operand read in the widest way its strides allow: packs of `vectorBytes`
// where it walks the innermost axis, one value per pack where it is broadcast along it. Each
// instruction computes as the interpreter's does (both take it from kernels/fused_ops.cuh).
#pragma once

#include <cstdint>
#include <string>

#include "kiln/backends/cuda/kernels/eltwise.h"
#include "kiln/ir/ops/fused_elementwise.h"

namespace kiln::cuda {

// The launch parameters of generated kernels (knobs in eltwise_steps.cc).
struct FusedCodegenOptions {
  int blockThreads = 256;  // threads per block
  int vectorBytes = 16;    // bytes one pack moves (16, 8 or 4); a pack of one element is scalar
  int unroll = 1;          // packs each thread takes per trip of its loop
  bool fastMath =
      false;  // the approximate exp, log, division and tanh (fused_ops.cuh's kiln_fast_*)
};

// One node's kernels: `name`_v (packs of `vector` elements, present when vector > 1) and
// `name`_s (one element a thread, for any alignment), both taking the inputs then the output
// as pointers.
struct GeneratedFusedKernel {
  std::string name;    // kiln_fused_<hash of the definitions>: equal kernels share a name
  std::string source;  // the definitions, to follow codegenPreamble() in one program
  int vector = 1;      // elements a pack of the vector kernel holds
  int64_t packs = 0;   // the vector kernel's work items (0 without one)
  int64_t elements = 0;
  int operands = 0;
  int elementBytes = 4;
  int blockThreads = 256;
  int unroll = 1;
  bool fastMath = false;
  bool narrowIndex = false;  // 32-bit index arithmetic (the geometry's choice)
  // Operands the vector kernel loads as aligned packs (by their pointer, at enqueue).
  bool packedOperand[kMaxBroadcastOperands] = {};
};

// What every generated program starts with: fused_ops.cuh and the pack type.
const std::string& codegenPreamble();

// Kernels for `program` over `geometry` in `type` (float32, float16 or bfloat16).
GeneratedFusedKernel generateFusedKernel(const ir::EltwiseProgram& program, ElementType type,
                                         const BroadcastGeometry& geometry,
                                         const FusedCodegenOptions& options);

}  // namespace kiln::cuda
