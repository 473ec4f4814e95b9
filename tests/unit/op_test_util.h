// Builds a one-node graph, runs kiln's shape inference and the reference executor on it: the
// harness for op tests that the ONNX conformance data does not cover.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/reference/executor.h"

namespace kiln::testing {

struct OpInput {
  ir::Tensor tensor;
  bool constant = false;  // known at build time (an initializer) rather than a runtime input
};

// A graph of the one node `opType` (of `domain`, "" for ONNX) over `inputs`: runtime inputs
// become the graph's inputs in order (an `OpInput{}` stands for an omitted optional input), and
// the node's outputs its outputs. Types are left for shape inference.
inline ir::Graph makeSingleOpGraph(const std::string& opType, const std::vector<OpInput>& inputs,
                                   const std::map<std::string, ir::Attribute>& attributes = {},
                                   int opset = 18, int outputCount = 1,
                                   const std::string& domain = "") {
  ir::Graph graph;
  graph.opsetImports[domain] = opset;
  ir::Node* node = graph.addNode(opType);
  node->name = "node";
  node->domain = domain;
  node->opsetVersion = opset;
  node->attributes = attributes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].tensor.empty() && !inputs[i].constant) {
      node->inputs.push_back(nullptr);
      continue;
    }
    ir::Value* value = graph.addValue("in" + std::to_string(i));
    value->dtype = inputs[i].tensor.dtype();
    value->shape = inputs[i].tensor.shape();
    value->hasType = true;
    if (inputs[i].constant) {
      value->constant = inputs[i].tensor;
      value->isInitializer = true;
    } else {
      graph.inputs.push_back(value);
    }
    node->inputs.push_back(value);
  }
  for (int i = 0; i < outputCount; ++i) {
    ir::Value* value = graph.addValue("out" + std::to_string(i));
    value->producer = node;
    node->outputs.push_back(value);
    graph.outputs.push_back(value);
  }
  return graph;
}

// Runs `opType` on `inputs` through shape inference and the reference executor and returns its
// outputs.
inline Result<std::vector<ir::Tensor>> runSingleOp(
    const std::string& opType, const std::vector<OpInput>& inputs,
    const std::map<std::string, ir::Attribute>& attributes = {}, int opset = 18,
    int outputCount = 1, const std::string& domain = "") {
  ir::Graph graph = makeSingleOpGraph(opType, inputs, attributes, opset, outputCount, domain);
  std::vector<ir::Tensor> runtime;
  for (const OpInput& input : inputs) {
    if (!input.constant && !input.tensor.empty()) runtime.push_back(input.tensor);
  }
  // No folding: the op itself must run through the executor, as it would on runtime data.
  KILN_RETURN_IF_ERROR(ir::inferShapes(graph, nullptr));
  KILN_ASSIGN_OR_RETURN(auto executor, reference::ReferenceExecutor::create(graph));
  return executor.run(runtime);
}

// A float32 tensor of values uniform in [low, high), the same for the same seed.
inline ir::Tensor uniformTensor(ir::Shape shape, unsigned seed, float low, float high) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(static_cast<size_t>(shape.elementCount()));
  for (float& v : values) v = uniform(rng);
  return ir::Tensor::fromVector<float>(std::move(shape), values);
}

inline ir::Attribute intAttr(int64_t v) { return {v}; }
inline ir::Attribute floatAttr(float v) { return {v}; }
inline ir::Attribute stringAttr(std::string v) { return {std::move(v)}; }
inline ir::Attribute intsAttr(std::vector<int64_t> v) { return {std::move(v)}; }
inline ir::Attribute floatsAttr(std::vector<float> v) { return {std::move(v)}; }

}  // namespace kiln::testing
