// The reference executor: runs an inferred ir::Graph node by node with the reference kernels.
// It is the accuracy oracle for every backend and tuning trial.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/shape_inference.h"

namespace kiln::reference {

// Runs one node on the given inputs (null for omitted optional ones), allocating outputs with
// the node's inferred output types.
Result<std::vector<ir::Tensor>> evaluateNode(const ir::Node& node,
                                             std::span<const ir::Tensor* const> inputs);

// A ConstantEvaluator for ir::inferShapes that folds with the reference kernels.
ir::ConstantEvaluator constantEvaluator();

class ReferenceExecutor {
 public:
  // Checks that every node of `graph` (already shape-inferred) has a reference kernel.
  static Result<ReferenceExecutor> create(const ir::Graph& graph);

  // Runs the graph. `inputs` are in the order of graph.inputs, with exactly their dtypes and
  // shapes. Returns the graph outputs in order.
  Result<std::vector<ir::Tensor>> run(const std::vector<ir::Tensor>& inputs) const;

 private:
  explicit ReferenceExecutor(const ir::Graph& graph) : graph_(&graph) {}
  const ir::Graph* graph_;
};

}  // namespace kiln::reference
