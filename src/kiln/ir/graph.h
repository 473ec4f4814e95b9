// The graph kiln compiles: typed values with static shapes, nodes with attributes, in
// topological order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/tensor.h"

namespace kiln::ir {

struct Attribute {
  enum class Kind { kInt, kFloat, kString, kTensor, kInts, kFloats, kStrings };
  using Storage = std::variant<int64_t, float, std::string, Tensor, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>>;
  Storage value;

  Kind kind() const { return static_cast<Kind>(value.index()); }
};

const char* attributeKindName(Attribute::Kind kind);

class Node;

// An edge of the graph. A value has a static type once shape inference has run; it may also
// hold a constant (an initializer, a Constant node's output, or a folded shape computation).
struct Value {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  bool hasType = false;
  Node* producer = nullptr;        // null for graph inputs and initializers
  std::optional<Tensor> constant;  // known at build time
  bool isInitializer = false;      // came from the model's initializer list
};

class Node {
 public:
  std::string name;    // unique within the graph (the importer names unnamed nodes)
  std::string opType;  // "Conv"
  std::string domain;  // "" for the default ONNX domain
  int opsetVersion = 0;
  std::vector<Value*> inputs;   // null for an omitted optional input
  std::vector<Value*> outputs;  // null for an omitted optional output
  std::map<std::string, Attribute> attributes;

  // "node 'conv3' (Conv, opset 18)": the prefix of every error about this node.
  std::string describe() const;

  Value* input(size_t i) const { return i < inputs.size() ? inputs[i] : nullptr; }
  bool hasInput(size_t i) const { return input(i) != nullptr; }
  bool hasAttribute(const std::string& attr) const { return attributes.count(attr) > 0; }

  // Typed attribute access. A missing attribute gives the default; one of the wrong kind is an
  // error naming the node, the attribute and both kinds.
  Result<int64_t> getInt(const std::string& attr, int64_t defaultValue) const;
  Result<float> getFloat(const std::string& attr, float defaultValue) const;
  Result<std::string> getString(const std::string& attr, const std::string& defaultValue) const;
  Result<std::vector<int64_t>> getInts(const std::string& attr,
                                       std::vector<int64_t> defaultValue = {}) const;
  Result<std::vector<float>> getFloats(const std::string& attr,
                                       std::vector<float> defaultValue = {}) const;
  Result<std::vector<std::string>> getStrings(const std::string& attr) const;
  Result<Tensor> getTensor(const std::string& attr) const;  // required
  // A required attribute of any kind is present, or an error naming it.
  Status requireAttribute(const std::string& attr) const;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  std::string name;
  std::map<std::string, int> opsetImports;  // domain -> version
  std::vector<Value*> inputs;               // runtime inputs, in order (initializers excluded)
  std::vector<Value*> outputs;

  Value* addValue(std::string valueName);
  Node* addNode(std::string opType);  // appended at the end of the node order
  Value* findValue(const std::string& valueName) const;
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  const std::vector<std::unique_ptr<Value>>& values() const { return values_; }

  // Number of parameters: elements of all initializers.
  int64_t parameterCount() const;

  // --- Mutation, for passes. Node order stays topological when passes insert new nodes just
  // before the first node that reads their outputs.

  // A new node placed just before `position` in the node order (at the end if null).
  Node* insertNode(std::string opType, const Node* position);
  // A new value with a name no other value has, derived from `base`.
  Value* addUniqueValue(const std::string& base);
  // A new constant (an initializer) holding `tensor`, its type and shape from it, with a name
  // derived from `base` as addUniqueValue's.
  Value* addConstant(const std::string& base, Tensor tensor);
  // Renames a value; the name must not be taken.
  void renameValue(Value* value, const std::string& newName);
  // Points every reader of `from` (node inputs, graph outputs) at `to`.
  void replaceAllUses(Value* from, Value* to);
  // Removes the nodes for which `remove` is true; returns how many. Their outputs are left
  // without a producer: callers reroute or drop those values first.
  size_t removeNodes(const std::function<bool(const Node&)>& remove);
  // Drops values that no node reads or writes and that are not graph inputs or outputs.
  size_t removeUnusedValues();
  // The nodes that read `value`, in node order.
  std::vector<Node*> consumers(const Value* value) const;
  bool isGraphOutput(const Value* value) const;
  // Structural invariants: topological order, producers consistent, every input defined and
  // owned by this graph, unique value names. A failure is a pass bug; the message says which.
  Status verify() const;

 private:
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::string, Value*> valuesByName_;
};

}  // namespace kiln::ir
