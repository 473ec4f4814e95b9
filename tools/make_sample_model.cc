// Writes kiln's sample model: a small CNN classifier with seeded random weights, in the shape
// that torch's exporter writes (Conv, BatchNormalization, Relu, MaxPool, a residual Add,
// GlobalAveragePool, Flatten, Gemm, Softmax), so the quick start needs no download.
//
// usage: make_sample_model OUTPUT.onnx
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "onnx.pb.h"

namespace {

std::mt19937 rng(20261202);

void addInitializer(onnx::GraphProto& graph, const std::string& name, std::vector<int64_t> dims,
                    float scale, float offset = 0.0f) {
  onnx::TensorProto* tensor = graph.add_initializer();
  tensor->set_name(name);
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  int64_t count = 1;
  for (int64_t d : dims) {
    tensor->add_dims(d);
    count *= d;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = offset + scale * normal(rng);
  tensor->set_raw_data(values.data(), values.size() * sizeof(float));
}

onnx::NodeProto* addNode(onnx::GraphProto& graph, const std::string& op, const std::string& name,
                         std::vector<std::string> inputs, std::vector<std::string> outputs) {
  onnx::NodeProto* node = graph.add_node();
  node->set_op_type(op);
  node->set_name(name);
  for (const auto& i : inputs) node->add_input(i);
  for (const auto& o : outputs) node->add_output(o);
  return node;
}

void setInts(onnx::NodeProto* node, const std::string& name, std::vector<int64_t> values) {
  auto* attr = node->add_attribute();
  attr->set_name(name);
  attr->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) attr->add_ints(v);
}

void setInt(onnx::NodeProto* node, const std::string& name, int64_t value) {
  auto* attr = node->add_attribute();
  attr->set_name(name);
  attr->set_type(onnx::AttributeProto::INT);
  attr->set_i(value);
}

void addConv(onnx::GraphProto& graph, const std::string& name, const std::string& input,
             const std::string& output, int64_t in, int64_t out, int64_t kernel) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(in * kernel * kernel));
  addInitializer(graph, name + ".weight", {out, in, kernel, kernel}, scale);
  addInitializer(graph, name + ".bias", {out}, 0.05f);
  auto* conv = addNode(graph, "Conv", name, {input, name + ".weight", name + ".bias"}, {output});
  setInts(conv, "kernel_shape", {kernel, kernel});
  const int64_t pad = kernel / 2;
  setInts(conv, "pads", {pad, pad, pad, pad});
  setInts(conv, "strides", {1, 1});
}

void addValueInfo(onnx::ValueInfoProto* info, const std::string& name, std::vector<int64_t> dims) {
  info->set_name(name);
  auto* type = info->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) type->mutable_shape()->add_dim()->set_dim_value(d);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT.onnx\n", argv[0]);
    return 2;
  }
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.set_producer_name("kiln make_sample_model");
  model.set_producer_version("1");
  model.add_opset_import()->set_version(18);
  onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name("kiln_sample_cnn");
  addValueInfo(graph.add_input(), "image", {1, 3, 32, 32});
  addValueInfo(graph.add_output(), "probs", {1, 10});

  addConv(graph, "stem.conv", "image", "stem.conv.out", 3, 16, 3);
  addInitializer(graph, "stem.bn.scale", {16}, 0.1f, 1.0f);
  addInitializer(graph, "stem.bn.bias", {16}, 0.1f);
  addInitializer(graph, "stem.bn.mean", {16}, 0.1f);
  addInitializer(graph, "stem.bn.var", {16}, 0.05f, 1.0f);
  addNode(graph, "BatchNormalization", "stem.bn",
          {"stem.conv.out", "stem.bn.scale", "stem.bn.bias", "stem.bn.mean", "stem.bn.var"},
          {"stem.bn.out"});
  addNode(graph, "Relu", "stem.relu", {"stem.bn.out"}, {"stem.relu.out"});
  auto* pool = addNode(graph, "MaxPool", "stem.pool", {"stem.relu.out"}, {"stem.pool.out"});
  setInts(pool, "kernel_shape", {2, 2});
  setInts(pool, "strides", {2, 2});

  addConv(graph, "block.conv1", "stem.pool.out", "block.conv1.out", 16, 16, 3);
  addNode(graph, "Relu", "block.relu1", {"block.conv1.out"}, {"block.relu1.out"});
  addConv(graph, "block.conv2", "block.relu1.out", "block.conv2.out", 16, 16, 3);
  addNode(graph, "Add", "block.add", {"block.conv2.out", "stem.pool.out"}, {"block.add.out"});
  addNode(graph, "Relu", "block.relu2", {"block.add.out"}, {"block.relu2.out"});

  addConv(graph, "head.conv", "block.relu2.out", "head.conv.out", 16, 32, 1);
  addNode(graph, "Relu", "head.relu", {"head.conv.out"}, {"head.relu.out"});
  addNode(graph, "GlobalAveragePool", "head.gap", {"head.relu.out"}, {"head.gap.out"});
  auto* flatten = addNode(graph, "Flatten", "head.flatten", {"head.gap.out"}, {"head.flat"});
  setInt(flatten, "axis", 1);
  addInitializer(graph, "head.fc.weight", {10, 32}, 0.2f);
  addInitializer(graph, "head.fc.bias", {10}, 0.05f);
  auto* gemm = addNode(graph, "Gemm", "head.fc", {"head.flat", "head.fc.weight", "head.fc.bias"},
                       {"logits"});
  setInt(gemm, "transB", 1);
  auto* softmax = addNode(graph, "Softmax", "head.softmax", {"logits"}, {"probs"});
  setInt(softmax, "axis", -1);

  std::ofstream out(argv[1], std::ios::binary);
  if (!out || !model.SerializeToOstream(&out)) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
