// ONNX import: protobuf -> ir::Graph with static shapes, with errors that name what is wrong.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace onnx {
class TensorProto;
}

namespace kiln::onnx {

// The IR versions and default-domain opsets kiln accepts.
inline constexpr int64_t kMinIrVersion = 3;
inline constexpr int64_t kMaxIrVersion = 10;
// Opset 6 is accepted too: older exporters wrote it, and ops whose semantics changed at 7
// (legacy broadcast attributes) are refused where those attributes appear.
inline constexpr int64_t kMinOpset = 6;
inline constexpr int64_t kMaxOpset = 21;

struct ImportOptions {
  // Fixes dimensions of inputs: name -> full shape (trtexec's --shapes). Required for every
  // dynamic dimension; a given shape must agree with the model's static dimensions.
  std::map<std::string, std::vector<int64_t>> inputShapes;
  // Inputs whose values are known at build time; they become constants, not runtime inputs.
  std::map<std::string, ir::Tensor> constantInputs;
  // Run kiln's shape inference (with constant folding of shape computations). Without it the
  // graph carries only the types the model declares.
  bool inferShapes = true;
};

struct ModelInfo {
  int64_t irVersion = 0;
  std::string producerName;
  std::string producerVersion;
  std::map<std::string, int64_t> opsetImports;  // domain ("" = default) -> version
};

struct Model {
  ModelInfo info;
  ir::Graph graph;
};

// Reads and imports a model file. External data is resolved relative to the model's folder and
// may not leave it.
Result<Model> importModel(const std::filesystem::path& path, const ImportOptions& options = {});

// Imports a serialized ModelProto; `baseDir` is where external data lives.
Result<Model> importModelFromBytes(const std::string& bytes, const std::filesystem::path& baseDir,
                                   const ImportOptions& options = {});

// Imports a ModelProto written in protobuf text format (test fixtures, golden pass tests).
Result<Model> importModelFromText(const std::string& text, const ImportOptions& options = {});

// Converts a TensorProto (with external data resolved under `baseDir`).
Result<ir::Tensor> tensorFromProto(const ::onnx::TensorProto& proto,
                                   const std::filesystem::path& baseDir);

// Reads a serialized TensorProto file (the ONNX test-data format, input_0.pb). Returns the
// tensor and the name stored in it (may be empty).
Result<std::pair<std::string, ir::Tensor>> readTensorProtoFile(const std::filesystem::path& path);

// Parses trtexec's shape syntax: "input:1x3x224x224,mask:1x128".
Result<std::map<std::string, std::vector<int64_t>>> parseShapeSpec(const std::string& spec);

}  // namespace kiln::onnx
