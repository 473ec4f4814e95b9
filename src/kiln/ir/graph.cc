// Graph construction and typed attribute access.
#include "kiln/ir/graph.h"

#include <algorithm>
#include <set>
#include <unordered_set>

namespace kiln::ir {

const char* attributeKindName(Attribute::Kind kind) {
  switch (kind) {
    case Attribute::Kind::kInt:
      return "int";
    case Attribute::Kind::kFloat:
      return "float";
    case Attribute::Kind::kString:
      return "string";
    case Attribute::Kind::kTensor:
      return "tensor";
    case Attribute::Kind::kInts:
      return "ints";
    case Attribute::Kind::kFloats:
      return "floats";
    case Attribute::Kind::kStrings:
      return "strings";
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

Node* Graph::insertNode(std::string opType, const Node* position) {
  auto node = std::make_unique<Node>();
  node->opType = std::move(opType);
  Node* raw = node.get();
  auto it = std::find_if(nodes_.begin(), nodes_.end(),
                         [&](const std::unique_ptr<Node>& n) { return n.get() == position; });
  nodes_.insert(it, std::move(node));
  return raw;
}

Value* Graph::addUniqueValue(const std::string& base) {
  std::string name = base;
  for (int suffix = 1; valuesByName_.count(name); ++suffix) {
    name = base + "_" + std::to_string(suffix);
  }
  return addValue(name);
}

Value* Graph::addConstant(const std::string& base, Tensor tensor) {
  Value* value = addUniqueValue(base);
  value->dtype = tensor.dtype();
  value->shape = tensor.shape();
  value->hasType = true;
  value->constant = std::move(tensor);
  value->isInitializer = true;
  return value;
}

void Graph::renameValue(Value* value, const std::string& newName) {
  KILN_CHECK(!valuesByName_.count(newName) || valuesByName_[newName] == value);
  valuesByName_.erase(value->name);
  value->name = newName;
  valuesByName_[newName] = value;
}

void Graph::replaceAllUses(Value* from, Value* to) {
  for (auto& node : nodes_) {
    std::replace(node->inputs.begin(), node->inputs.end(), from, to);
  }
  std::replace(outputs.begin(), outputs.end(), from, to);
}

size_t Graph::removeNodes(const std::function<bool(const Node&)>& remove) {
  const size_t before = nodes_.size();
  std::erase_if(nodes_, [&](const std::unique_ptr<Node>& node) {
    if (!remove(*node)) return false;
    for (Value* output : node->outputs) {
      if (output && output->producer == node.get()) output->producer = nullptr;
    }
    return true;
  });
  return before - nodes_.size();
}

size_t Graph::removeUnusedValues() {
  std::unordered_set<const Value*> used(inputs.begin(), inputs.end());
  used.insert(outputs.begin(), outputs.end());
  for (const auto& node : nodes_) {
    used.insert(node->inputs.begin(), node->inputs.end());
    used.insert(node->outputs.begin(), node->outputs.end());
  }
  const size_t before = values_.size();
  std::erase_if(values_, [&](const std::unique_ptr<Value>& value) {
    if (used.count(value.get())) return false;
    auto it = valuesByName_.find(value->name);
    if (it != valuesByName_.end() && it->second == value.get()) valuesByName_.erase(it);
    return true;
  });
  return before - values_.size();
}

std::vector<Node*> Graph::consumers(const Value* value) const {
  std::vector<Node*> readers;
  for (const auto& node : nodes_) {
    if (std::find(node->inputs.begin(), node->inputs.end(), value) != node->inputs.end()) {
      readers.push_back(node.get());
    }
  }
  return readers;
}

bool Graph::isGraphOutput(const Value* value) const {
  return std::find(outputs.begin(), outputs.end(), value) != outputs.end();
}

Status Graph::verify() const {
  std::unordered_set<const Value*> owned;
  std::set<std::string> names;
  for (const auto& value : values_) {
    owned.insert(value.get());
    if (!value->name.empty() && !names.insert(value->name).second) {
      return internalError("graph invariant: value name '{}' is used twice", value->name);
    }
  }
  std::unordered_set<const Value*> defined(inputs.begin(), inputs.end());
  for (const auto& value : values_) {
    if (value->constant) defined.insert(value.get());
  }
  for (const auto& node : nodes_) {
    for (const Value* input : node->inputs) {
      if (!input) continue;
      if (!owned.count(input)) {
        return internalError("graph invariant: {} reads a value the graph does not own",
                             node->describe());
      }
      if (!defined.count(input)) {
        return internalError("graph invariant: {} reads '{}' before it is defined",
                             node->describe(), input->name);
      }
    }
    for (const Value* output : node->outputs) {
      if (!output) continue;
      if (output->producer != node.get()) {
        return internalError("graph invariant: output '{}' of {} names another producer",
                             output->name, node->describe());
      }
      defined.insert(output);
    }
  }
  for (const Value* output : outputs) {
    if (!defined.count(output)) {
      return internalError("graph invariant: graph output '{}' is not defined", output->name);
    }
  }
  return Status::ok();
}

}  // namespace kiln::ir
