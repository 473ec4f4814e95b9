// Node-by-node execution with the reference kernels.
#include "kiln/reference/executor.h"

#include <unordered_map>

#include "kiln/reference/kernel.h"

namespace kiln::reference {

const KernelRegistry& KernelRegistry::instance() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    registerElementwiseKernels(r);
    registerNeuralKernels(r);
    registerReductionKernels(r);
    registerShapeKernels(r);
    registerIndexingKernels(r);
    registerFusedKernels(r);
    registerLayoutKernels(r);
    registerFusedElementwiseKernels(r);
    registerAttentionKernels(r);
    return r;
  }();
  return registry;
}

void KernelRegistry::add(const std::string& opType, KernelFn kernel, const std::string& domain) {
  auto key = std::make_pair(domain, opType);
  KILN_CHECK(kernels_.count(key) == 0);
  kernels_.emplace(std::move(key), std::move(kernel));
}

const KernelFn* KernelRegistry::find(const std::string& domain, const std::string& opType) const {
  auto it = kernels_.find({domain == "ai.onnx" ? "" : domain, opType});
  return it == kernels_.end() ? nullptr : &it->second;
}

Result<std::vector<ir::Tensor>> evaluateNode(const ir::Node& node,
                                             std::span<const ir::Tensor* const> inputs) {
  const KernelFn* kernel = KernelRegistry::instance().find(node.domain, node.opType);
  if (!kernel) {
    return unsupported("{}: the reference executor has no kernel for '{}'", node.describe(),
                       node.opType);
  }
  std::vector<ir::Tensor> outputs;
  outputs.reserve(node.outputs.size());
  for (const ir::Value* output : node.outputs) {
    if (output) {
      KILN_ASSIGN_OR_RETURN(ir::Tensor tensor, ir::Tensor::allocate(output->dtype, output->shape));
      outputs.push_back(std::move(tensor));
    } else {
      outputs.emplace_back();
    }
  }
  KernelContext context(node, inputs, outputs);
  KILN_RETURN_IF_ERROR((*kernel)(context));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const ir::Value* output = node.outputs[i];
    if (output && (outputs[i].dtype() != output->dtype || outputs[i].shape() != output->shape)) {
      return internalError("{}: kernel produced output {} as {} {}, inference said {} {}",
                           node.describe(), i, ir::dtypeName(outputs[i].dtype()),
                           outputs[i].shape().toString(), ir::dtypeName(output->dtype),
                           output->shape.toString());
    }
  }
  return outputs;
}

ir::ConstantEvaluator constantEvaluator() {
  return [](const ir::Node& node) -> Result<std::vector<ir::Tensor>> {
    std::vector<const ir::Tensor*> inputs;
    for (const ir::Value* input : node.inputs) {
      inputs.push_back(input ? &*input->constant : nullptr);
    }
    return evaluateNode(node, inputs);
  };
}

Result<ReferenceExecutor> ReferenceExecutor::create(const ir::Graph& graph) {
  for (const auto& node : graph.nodes()) {
    if (!KernelRegistry::instance().find(node->domain, node->opType)) {
      return unsupported("{}: the reference executor has no kernel for '{}'", node->describe(),
                         node->opType);
    }
  }
  return ReferenceExecutor(graph);
}

Result<std::vector<ir::Tensor>> ReferenceExecutor::run(
    const std::vector<ir::Tensor>& inputs) const {
  const ir::Graph& graph = *graph_;
  if (inputs.size() != graph.inputs.size()) {
    return invalidInput("the model has {} inputs, {} were given", graph.inputs.size(),
                        inputs.size());
  }
  std::unordered_map<const ir::Value*, ir::Tensor> live;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Value* value = graph.inputs[i];
    if (inputs[i].dtype() != value->dtype || inputs[i].shape() != value->shape) {
      return invalidInput("input '{}' must be {} {}, got {} {}", value->name,
                          ir::dtypeName(value->dtype), value->shape.toString(),
                          ir::dtypeName(inputs[i].dtype()), inputs[i].shape().toString());
    }
    live[value] = inputs[i];
  }
  // Last use of each value, so intermediates are released as soon as nothing reads them.
  std::unordered_map<const ir::Value*, size_t> lastUse;
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    for (const ir::Value* input : graph.nodes()[n]->inputs) {
      if (input) lastUse[input] = n;
    }
  }
  for (const ir::Value* output : graph.outputs) lastUse[output] = graph.nodes().size();

  auto lookup = [&](const ir::Value* value) -> const ir::Tensor* {
    if (value->constant) return &*value->constant;
    auto it = live.find(value);
    return it == live.end() ? nullptr : &it->second;
  };

  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = *graph.nodes()[n];
    std::vector<const ir::Tensor*> nodeInputs;
    for (const ir::Value* input : node.inputs) {
      if (!input) {
        nodeInputs.push_back(nullptr);
        continue;
      }
      const ir::Tensor* tensor = lookup(input);
      if (!tensor) {
        return internalError("{}: input '{}' has not been computed", node.describe(), input->name);
      }
      nodeInputs.push_back(tensor);
    }
    bool allConstant = true;
    for (const ir::Value* output : node.outputs) allConstant &= !output || output->constant;
    if (!allConstant) {
      KILN_ASSIGN_OR_RETURN(std::vector<ir::Tensor> results, evaluateNode(node, nodeInputs));
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        if (node.outputs[i]) live[node.outputs[i]] = std::move(results[i]);
      }
    }
    for (const ir::Value* input : node.inputs) {
      if (input && lastUse[input] == n) live.erase(input);
    }
  }

  std::vector<ir::Tensor> outputs;
  for (const ir::Value* output : graph.outputs) {
    const ir::Tensor* tensor = lookup(output);
    if (!tensor) return internalError("graph output '{}' was not computed", output->name);
    outputs.push_back(*tensor);
  }
  return outputs;
}

}  // namespace kiln::reference
