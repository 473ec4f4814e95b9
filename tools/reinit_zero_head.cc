// Gives a model whose classifier head is zero-initialised (torchvision's VisionTransformer zeroes
// its head, so the shared vit_tiny.onnx answers 0 to every input) random head weights, so that
// comparing two runtimes' outputs, or a tuned route's against the reference, checks something.
// For each graph output, the node that produces it: each of its float weight matrices (initializers
// of rank 2 or more) whose values are all zero is refilled with seeded normal values of standard
// deviation 1/sqrt(fan-in) (the last dimension). A zero bias is left alone (BERT's LayerNorm
// biases start at zero and do not make the output constant); a zero weight matrix does. The graph,
// its shapes and its work are the same; only those values change. Writes OUT (a plain copy if
// nothing was zero) and names each tensor it refilled on stdout.
//
// usage: kiln_reinit_zero_head IN.onnx OUT.onnx
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "onnx.pb.h"

namespace {

// The tensor's float values, or false if it holds none this tool can read (another type, or
// external data).
bool floatValues(const onnx::TensorProto& tensor, std::vector<float>& values) {
  if (tensor.data_type() != onnx::TensorProto::FLOAT ||
      tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    return false;
  }
  if (tensor.has_raw_data()) {
    const std::string& raw = tensor.raw_data();
    if (raw.size() % sizeof(float) != 0) return false;
    values.resize(raw.size() / sizeof(float));
    std::memcpy(values.data(), raw.data(), raw.size());
    return true;
  }
  values.assign(tensor.float_data().begin(), tensor.float_data().end());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kiln_reinit_zero_head IN.onnx OUT.onnx\n");
    return 2;
  }
  onnx::ModelProto model;
  {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in || !model.ParseFromIstream(&in)) {
      std::fprintf(stderr, "kiln_reinit_zero_head: cannot read the ONNX model %s\n", argv[1]);
      return 1;
    }
  }
  onnx::GraphProto& graph = *model.mutable_graph();
  std::set<std::string> headInputs;
  for (const auto& output : graph.output()) {
    for (const auto& node : graph.node()) {
      for (const auto& produced : node.output()) {
        if (produced != output.name()) continue;
        for (const auto& input : node.input()) headInputs.insert(input);
      }
    }
  }
  std::mt19937 rng(20261207);
  int refilled = 0;
  for (auto& tensor : *graph.mutable_initializer()) {
    if (!headInputs.count(tensor.name())) continue;
    std::vector<float> values;
    if (tensor.dims_size() < 2 || !floatValues(tensor, values) || values.empty()) continue;
    bool zero = true;
    for (float v : values) zero = zero && v == 0.0f;
    if (!zero) continue;
    const int64_t fanIn = tensor.dims(tensor.dims_size() - 1);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(fanIn)));
    for (float& v : values) v = normal(rng);
    tensor.clear_float_data();
    tensor.set_raw_data(values.data(), values.size() * sizeof(float));
    std::printf("refilled %s (%zu values, all zero, now normal with std 1/sqrt(%lld))\n",
                tensor.name().c_str(), values.size(), static_cast<long long>(fanIn));
    ++refilled;
  }
  std::ofstream out(argv[2], std::ios::binary | std::ios::trunc);
  if (!out || !model.SerializeToOstream(&out) || !out.flush()) {
    std::fprintf(stderr, "kiln_reinit_zero_head: cannot write %s\n", argv[2]);
    return 1;
  }
  if (refilled == 0) std::printf("nothing refilled: no head initializer is all zero\n");
  return 0;
}
