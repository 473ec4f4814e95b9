// Whole-graph shape inference, with build-time evaluation of small constant subgraphs (the
// Shape -> Gather -> Concat -> Reshape chains that exporters write).
#pragma once

#include <functional>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

// Evaluates one node whose inputs are all constant. The reference executor provides it; the IR
// layer only knows its signature.
using ConstantEvaluator = std::function<Result<std::vector<Tensor>>(const Node&)>;

// Outputs larger than this are not folded during inference: folding exists to resolve shapes,
// not to precompute weights (that is a pass's job).
inline constexpr int64_t kMaxInferenceFoldElements = 1 << 16;

// Types every value of `graph` in node order. Errors name the node. With an evaluator, nodes
// whose inputs are all constant get constant outputs, so shapes computed from them resolve.
Status inferShapes(Graph& graph, const ConstantEvaluator& evaluator);

}  // namespace kiln::ir
