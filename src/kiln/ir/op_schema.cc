// The op registry and the helpers inference functions share.
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

Result<const Tensor*> InferContext::requireConstantInput(size_t i, const char* role) const {
  if (!hasInput(i)) return error("input {} ({}) is required", i, role);
  if (const Tensor* value = inputConstant(i)) return value;
  return invalidInput(
      "{}: input {} ('{}', the {}) must be known at build time because output shapes depend on "
      "it; kiln compiles for static shapes",
      node_.describe(), i, node_.inputs[i]->name, role);
}

const OpRegistry& OpRegistry::instance() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    registerElementwiseSchemas(r);
    registerNeuralSchemas(r);
    registerReductionSchemas(r);
    registerShapeSchemas(r);
    registerIndexingSchemas(r);
    registerFusedSchemas(r);
    registerLayoutSchemas(r);
    registerFusedElementwiseSchemas(r);
    registerAttentionSchemas(r);
    return r;
  }();
  return registry;
}

void OpRegistry::add(OpSchema schema) {
  KILN_CHECK(schema.infer != nullptr);
  auto key = std::make_pair(schema.domain, schema.opType);
  KILN_CHECK(schemas_.count(key) == 0);
  schemas_.emplace(std::move(key), std::move(schema));
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& opType) const {
  auto it = schemas_.find({domain == "ai.onnx" ? "" : domain, opType});
  return it == schemas_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::opTypes() const {
  std::vector<std::string> names;
  for (const auto& [key, schema] : schemas_) {
    names.push_back(key.first.empty() ? key.second : key.first + "." + key.second);
  }
  return names;
}

Result<Shape> broadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.rank() ? 1 : a[i - (rank - a.rank())];
    const int64_t db = i < rank - b.rank() ? 1 : b[i - (rank - b.rank())];
    if (da != db && da != 1 && db != 1) {
      return invalidInput("shapes {} and {} cannot be broadcast together", a.toString(),
                          b.toString());
    }
    dims[i] = da == 1 ? db : da;
  }
  return Shape(std::move(dims));
}

}  // namespace kiln::ir
