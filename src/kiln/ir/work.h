// What a graph asks of a machine, counted from its ops and shapes: the FLOPs of its matrix
// products and the bytes it must move. The GPU benchmark's roofline fractions divide these by a
// measured peak matmul rate and copy bandwidth.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kiln/ir/graph.h"

namespace kiln::ir {

struct OpWork {
  int64_t nodes = 0;
  double flops = 0;  // 2 per multiply-add
};

struct GraphWork {
  // Matrix products only (Conv, ConvTranspose, Gemm, MatMul, with their kiln.FusedConv and
  // kiln.FusedGemm forms): 2 FLOPs a multiply-add. Elementwise ops, normalisations and reductions
  // are memory traffic, counted in the bytes, not here.
  double flops = 0;
  std::map<std::string, OpWork> byOp;  // the products' op types
  // The traffic no schedule avoids: every constant a node reads (each once), the graph's inputs
  // and outputs.
  double weightBytes = 0;
  double ioBytes = 0;
  double minimumBytes() const { return weightBytes + ioBytes; }
  // Every node's non-constant inputs read and outputs written once, as an unfused schedule
  // moves them, plus the constants: an upper reference for the traffic.
  double unfusedBytes = 0;
};

// Counts a shape-inferred graph. Values without a type count no bytes; products whose shapes
// are unknown count no FLOPs.
GraphWork countWork(const Graph& graph);

}  // namespace kiln::ir
