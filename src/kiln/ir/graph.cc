// Graph construction and typed attribute access.
#include "kiln/ir/graph.h"

namespace kiln::ir {

const char* attributeKindName(Attribute::Kind kind) {
  switch (kind) {
    case Attribute::Kind::kInt: return "int";
    case Attribute::Kind::kFloat: return "float";
    case Attribute::Kind::kString: return "string";
    case Attribute::Kind::kTensor: return "tensor";
    case Attribute::Kind::kInts: return "ints";
    case Attribute::Kind::kFloats: return "floats";
    case Attribute::Kind::kStrings: return "strings";
  }
  return "unknown";
}

std::string Node::describe() const {
  return fmt::format("node '{}' ({}, opset {})", name, opType, opsetVersion);
}

namespace {
template <typename T>
Result<T> getTyped(const Node& node, const std::string& attr, Attribute::Kind kind,
                   std::optional<T> defaultValue) {
  auto it = node.attributes.find(attr);
  if (it == node.attributes.end()) {
    if (defaultValue) return *defaultValue;
    return invalidInput("{}: required attribute '{}' is missing", node.describe(), attr);
  }
  if (it->second.kind() != kind) {
    return invalidInput("{}: attribute '{}' must be of type {}, got {}", node.describe(), attr,
                        attributeKindName(kind), attributeKindName(it->second.kind()));
  }
  return std::get<T>(it->second.value);
}
}  // namespace

Result<int64_t> Node::getInt(const std::string& attr, int64_t defaultValue) const {
  return getTyped<int64_t>(*this, attr, Attribute::Kind::kInt, defaultValue);
}
Result<float> Node::getFloat(const std::string& attr, float defaultValue) const {
  return getTyped<float>(*this, attr, Attribute::Kind::kFloat, defaultValue);
}
Result<std::string> Node::getString(const std::string& attr,
                                    const std::string& defaultValue) const {
  return getTyped<std::string>(*this, attr, Attribute::Kind::kString, defaultValue);
}
Result<std::vector<int64_t>> Node::getInts(const std::string& attr,
                                           std::vector<int64_t> defaultValue) const {
  return getTyped<std::vector<int64_t>>(*this, attr, Attribute::Kind::kInts,
                                        std::move(defaultValue));
}
Result<std::vector<float>> Node::getFloats(const std::string& attr,
                                           std::vector<float> defaultValue) const {
  return getTyped<std::vector<float>>(*this, attr, Attribute::Kind::kFloats,
                                      std::move(defaultValue));
}
Result<std::vector<std::string>> Node::getStrings(const std::string& attr) const {
  return getTyped<std::vector<std::string>>(*this, attr, Attribute::Kind::kStrings,
                                            std::vector<std::string>{});
}
Result<Tensor> Node::getTensor(const std::string& attr) const {
  return getTyped<Tensor>(*this, attr, Attribute::Kind::kTensor, std::nullopt);
}
Status Node::requireAttribute(const std::string& attr) const {
  if (hasAttribute(attr)) return Status::ok();
  return invalidInput("{}: required attribute '{}' is missing", describe(), attr);
}

Value* Graph::addValue(std::string valueName) {
  auto value = std::make_unique<Value>();
  value->name = std::move(valueName);
  Value* raw = value.get();
  if (!raw->name.empty()) valuesByName_[raw->name] = raw;
  values_.push_back(std::move(value));
  return raw;
}

Node* Graph::addNode(std::string opType) {
  auto node = std::make_unique<Node>();
  node->opType = std::move(opType);
  nodes_.push_back(std::move(node));
  return nodes_.back().get();
}

Value* Graph::findValue(const std::string& valueName) const {
  auto it = valuesByName_.find(valueName);
  return it == valuesByName_.end() ? nullptr : it->second;
}

int64_t Graph::parameterCount() const {
  int64_t count = 0;
  for (const auto& value : values_) {
    if (value->isInitializer && value->constant) count += value->constant->elementCount();
  }
  return count;
}

}  // namespace kiln::ir
