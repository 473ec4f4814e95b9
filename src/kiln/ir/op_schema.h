// Op schemas: for each supported ONNX op, its arity and its shape-inference function.
//
// Shape inference is kiln's own (Debian's ONNX library lags the opsets exporters write). Each op
// family registers its schemas from one file in src/kiln/ir/ops/.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

// What an inference function sees of one node: its input types, the constant values known at
// build time, and where to write output types.
class InferContext {
 public:
  explicit InferContext(const Node& node) : node_(node), outputs_(node.outputs.size()) {}

  const Node& node() const { return node_; }
  int opset() const { return node_.opsetVersion; }
  size_t inputCount() const { return node_.inputs.size(); }
  bool hasInput(size_t i) const { return node_.hasInput(i); }
  DType inputType(size_t i) const { return node_.inputs[i]->dtype; }
  const Shape& inputShape(size_t i) const { return node_.inputs[i]->shape; }
  int64_t inputRank(size_t i) const { return static_cast<int64_t>(inputShape(i).rank()); }
  // The input's value if known at build time, else null.
  const Tensor* inputConstant(size_t i) const {
    return hasInput(i) && node_.inputs[i]->constant ? &*node_.inputs[i]->constant : nullptr;
  }
  // The input's value, or an error saying that kiln needs it at build time because output
  // shapes depend on it (kiln compiles for static shapes).
  Result<const Tensor*> requireConstantInput(size_t i, const char* role) const;

  size_t outputCount() const { return outputs_.size(); }
  // An output whose value inference already knows (Shape of a static shape, Constant): it is
  // typed from the value and becomes a build-time constant, whatever the inputs.
  void setOutputConstant(size_t i, Tensor value) {
    setOutput(i, value.dtype(), value.shape());
    outputs_[i].constant = std::move(value);
  }
  void setOutput(size_t i, DType dtype, Shape shape) {
    outputs_[i].dtype = dtype;
    outputs_[i].shape = std::move(shape);
    outputs_[i].set = true;
  }

  // An invalid-input error prefixed with the node's description.
  template <typename... Args>
  Status error(fmt::format_string<Args...> format, Args&&... args) const {
    return invalidInput("{}: {}", node_.describe(),
                        fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  Status unsupportedHere(fmt::format_string<Args...> format, Args&&... args) const {
    return unsupported("{}: {}", node_.describe(),
                       fmt::format(format, std::forward<Args>(args)...));
  }

  struct OutputType {
    DType dtype = DType::kFloat32;
    Shape shape;
    bool set = false;
    std::optional<Tensor> constant;
  };
  const std::vector<OutputType>& outputs() const { return outputs_; }

 private:
  const Node& node_;
  std::vector<OutputType> outputs_;
};

using InferFn = std::function<Status(InferContext&)>;

// The domain of kiln's own ops: what fusion passes create (FusedConv, ...). They never come from
// a model file; the importer refuses unknown domains.
inline constexpr const char* kKilnDomain = "kiln";

struct OpSchema {
  std::string opType;
  std::string domain;  // "" for the default ONNX domain, kKilnDomain for kiln's own ops
  int minInputs = 1;
  int maxInputs = 1;
  int minOutputs = 1;
  int maxOutputs = 1;
  InferFn infer;
  // Input positions whose values determine output shapes (Reshape's shape, TopK's K, ...). Such
  // inputs must be known at build time; a tool that feeds test data may bind them as constants.
  std::vector<int> shapeInputs;
  // Whether build-time folding may evaluate this op when all its inputs are constant.
  bool foldable = true;
};

class OpRegistry {
 public:
  // The registry of every op kiln supports, built once.
  static const OpRegistry& instance();

  void add(OpSchema schema);
  const OpSchema* find(const std::string& domain, const std::string& opType) const;
  std::vector<std::string> opTypes() const;

 private:
  std::map<std::pair<std::string, std::string>, OpSchema> schemas_;  // (domain, opType)
};

// Registration, one function per op family (src/kiln/ir/ops/<family>.cc).
void registerElementwiseSchemas(OpRegistry& registry);
void registerNeuralSchemas(OpRegistry& registry);
void registerReductionSchemas(OpRegistry& registry);
void registerShapeSchemas(OpRegistry& registry);
void registerIndexingSchemas(OpRegistry& registry);
void registerFusedSchemas(OpRegistry& registry);   // kiln's own ops, made by fusion passes
void registerLayoutSchemas(OpRegistry& registry);  // kiln's NHWC ops, made by the layout pass
void registerFusedElementwiseSchemas(OpRegistry& registry);  // kiln.FusedElementwise
void registerAttentionSchemas(OpRegistry& registry);         // kiln.Attention (ops/attention.h)

// numpy-style multidirectional broadcasting of two shapes, or an error naming both.
Result<Shape> broadcastShapes(const Shape& a, const Shape& b);

}  // namespace kiln::ir
