// A compact way to write small multi-node test graphs in C++: runtime inputs, seeded random
// weights, nodes and outputs, by name. Each node has one output, named after the node.
//
//   GraphSketch g;
//   auto x = g.input("x", {1, 8, 16, 16});
//   auto y = g.node("Conv", {x, g.weight("w", {8, 8, 3, 3}), g.weight("b", {8})},
//                   {{"pads", ints({1, 1, 1, 1})}}, "conv");
//   g.output(g.node("Relu", {y}, {}, "relu"));
//   ir::Graph graph = g.take();
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"
#include "kiln/ir/op_schema.h"

namespace kiln::testing {

inline ir::Attribute ints(std::vector<int64_t> v) { return {std::move(v)}; }

// An int64 vector constant ([n]): axes, shapes, pads given as inputs.
inline ir::Tensor axes(std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return ir::Tensor::fromVector<int64_t>(ir::Shape{n}, values);
}

class GraphSketch {
 public:
  explicit GraphSketch(int opset = 18) {
    graph_.opsetImports[""] = opset;
    graph_.opsetImports[ir::kKilnDomain] = 1;
    opset_ = opset;
  }

  std::string input(const std::string& name, ir::Shape shape,
                    ir::DType dtype = ir::DType::kFloat32) {
    ir::Value* value = graph_.addValue(name);
    value->dtype = dtype;
    value->shape = std::move(shape);
    value->hasType = true;
    graph_.inputs.push_back(value);
    return name;
  }

  // A float32 initializer of uniform values in [center - scale, center + scale], seeded by its
  // name.
  std::string weight(const std::string& name, ir::Shape shape, float scale = 0.5f,
                     float center = 0.0f) {
    std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>{}(name)));
    std::uniform_real_distribution<float> uniform(center - scale, center + scale);
    std::vector<float> values(static_cast<size_t>(shape.elementCount()));
    for (float& v : values) v = uniform(rng);
    return constant(name, ir::Tensor::fromVector<float>(std::move(shape), values));
  }

  std::string constant(const std::string& name, ir::Tensor tensor) {
    ir::Value* value = graph_.addValue(name);
    value->dtype = tensor.dtype();
    value->shape = tensor.shape();
    value->hasType = true;
    value->constant = std::move(tensor);
    value->isInitializer = true;
    return name;
  }

  // Appends a node; returns its output's name ("<node name>_y"). An empty input name stands
  // for an omitted optional input. Unnamed nodes are called "<op>_<index>".
  std::string node(const std::string& opType, const std::vector<std::string>& inputs,
                   std::map<std::string, ir::Attribute> attributes = {}, std::string name = "",
                   const std::string& domain = "") {
    ir::Node* node = graph_.addNode(opType);
    node->name = name.empty() ? opType + "_" + std::to_string(graph_.nodes().size() - 1) : name;
    node->domain = domain;
    node->opsetVersion = domain.empty() ? opset_ : 1;
    node->attributes = std::move(attributes);
    for (const std::string& input : inputs) {
      node->inputs.push_back(input.empty() ? nullptr : graph_.findValue(input));
      KILN_CHECK(input.empty() || node->inputs.back() != nullptr);
    }
    ir::Value* out = graph_.addValue(node->name + "_y");
    out->producer = node;
    node->outputs.push_back(out);
    return out->name;
  }

  // Appends a node with `count` outputs ("<node name>_y0", "_y1", ...); returns their names.
  std::vector<std::string> nodeOutputs(const std::string& opType,
                                       const std::vector<std::string>& inputs,
                                       std::map<std::string, ir::Attribute> attributes,
                                       const std::string& name, int count) {
    const std::string first = node(opType, inputs, std::move(attributes), name);
    ir::Node* added = graph_.findValue(first)->producer;
    graph_.renameValue(added->outputs[0], name + "_y0");
    std::vector<std::string> names = {name + "_y0"};
    for (int i = 1; i < count; ++i) {
      ir::Value* out = graph_.addValue(name + "_y" + std::to_string(i));
      out->producer = added;
      added->outputs.push_back(out);
      names.push_back(out->name);
    }
    return names;
  }

  void output(const std::string& name) {
    ir::Value* value = graph_.findValue(name);
    KILN_CHECK(value != nullptr);
    graph_.outputs.push_back(value);
  }

  ir::Graph take() { return std::move(graph_); }

 private:
  ir::Graph graph_;
  int opset_ = 18;
};

}  // namespace kiln::testing
