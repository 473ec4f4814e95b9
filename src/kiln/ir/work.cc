// FLOPs of matrix products and bytes of traffic, from the ops and shapes of a typed graph.
#include "kiln/ir/work.h"

#include <set>

namespace kiln::ir {

namespace {

double bytesOf(const Value& value) {
  if (!value.hasType) return 0;
  return static_cast<double>(value.shape.elementCount()) *
         static_cast<double>(dtypeSize(value.dtype));
}

bool typed(const Value* value) { return value && value->hasType; }

// Multiply-adds of one product node, or 0 where its shapes are not known.
double multiplyAdds(const Node& node) {
  const std::string& op = node.opType;
  const Value* x = node.input(0);
  const Value* w = node.input(1);
  const Value* y = node.outputs.empty() ? nullptr : node.outputs[0];
  if (!typed(x) || !typed(w) || !typed(y)) return 0;
  if (op == "Conv" || op == "FusedConv") {
    // Each output element sums C/group x kernel products: W is [M, C/group, k...].
    if (w->shape.rank() < 2) return 0;
    double perOutput = 1;
    for (size_t axis = 1; axis < w->shape.rank(); ++axis) perOutput *= w->shape[axis];
    return static_cast<double>(y->shape.elementCount()) * perOutput;
  }
  if (op == "ConvTranspose") {
    // Each input element scatters into M/group x kernel outputs: W is [C, M/group, k...].
    if (w->shape.rank() < 2) return 0;
    double perInput = 1;
    for (size_t axis = 1; axis < w->shape.rank(); ++axis) perInput *= w->shape[axis];
    return static_cast<double>(x->shape.elementCount()) * perInput;
  }
  if (op == "Gemm" || op == "FusedGemm") {
    if (x->shape.rank() != 2) return 0;
    const Result<int64_t> transA = node.getInt("transA", 0);
    if (!transA.isOk()) return 0;
    const int64_t k = *transA != 0 ? x->shape[0] : x->shape[1];
    return static_cast<double>(y->shape.elementCount()) * static_cast<double>(k);
  }
  if (op == "MatMul") {
    if (x->shape.rank() == 0) return 0;
    const int64_t k = x->shape[x->shape.rank() - 1];
    return static_cast<double>(y->shape.elementCount()) * static_cast<double>(k);
  }
  return 0;
}

}  // namespace

GraphWork countWork(const Graph& graph) {
  GraphWork work;
  std::set<const Value*> constantsRead;
  for (const auto& nodePtr : graph.nodes()) {
    const Node& node = *nodePtr;
    for (const Value* input : node.inputs) {
      if (!input) continue;
      if (input->constant) {
        constantsRead.insert(input);
      } else {
        work.unfusedBytes += bytesOf(*input);
      }
    }
    for (const Value* output : node.outputs) {
      if (output && !output->constant) work.unfusedBytes += bytesOf(*output);
    }
    const double macs = multiplyAdds(node);
    if (macs > 0) {
      OpWork& op = work.byOp[node.opType];
      ++op.nodes;
      op.flops += 2 * macs;
      work.flops += 2 * macs;
    }
  }
  for (const Value* constant : constantsRead) work.weightBytes += bytesOf(*constant);
  for (const Value* input : graph.inputs) {
    if (input && !input->constant) work.ioBytes += bytesOf(*input);
  }
  for (const Value* output : graph.outputs) {
    if (output) work.ioBytes += bytesOf(*output);
  }
  work.unfusedBytes += work.weightBytes;
  return work;
}

}  // namespace kiln::ir
