// The pass pipeline: the ordered list of graph passes a build runs.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/passes/pass.h"

namespace kiln::passes {

// The passes in pipeline order.
std::span<const PassInfo> pipelinePasses();
const PassInfo* findPass(const std::string& name);

struct PipelineOptions {
  // Called after the named pass (or after every pass for "all"), e.g. to print the IR.
  std::string dumpAfter;
  std::function<void(const std::string& pass, const ir::Graph& graph)> dump;
  std::string backend = "cpu";  // what the graph is built for (PassContext::backend)
};

// Runs every pass in order through the gate; returns what each did.
Result<std::vector<PassRecord>> runPipeline(ir::Graph& graph, const knobs::Route& route,
                                            const PipelineOptions& options = {});

}  // namespace kiln::passes
