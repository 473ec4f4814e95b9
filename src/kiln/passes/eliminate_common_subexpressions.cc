// Common-subexpression elimination: a node computing what an earlier node already computes (the
// same op, domain, opset and attributes on the same inputs) is dropped and its readers read the
// earlier node's outputs; small initializers with equal contents become one first, so nodes that
// read equal constants compare equal.
//
//   %a = Transpose "t1" (%x) {perm=[0,2,1]}; %b = Transpose "t2" (%x) {perm=[0,2,1]}
//   %y = Add (%a, %b)
//     =>   %a = Transpose "t1" (%x) {perm=[0,2,1]}; %y = Add (%a, %a)
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kEliminateCommonSubexpressions = knobs::declareKnob({
    .name = "graph.eliminate_common_subexpressions",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "compute a node that repeats an earlier one (same op, attributes and inputs) once; "
            "merge equal small initializers",
});

namespace {

// Initializers up to this size are compared by contents: enough for the scalars, shapes and
// per-channel vectors that make nodes equal, while weights (which exporters rarely duplicate) are
// not hashed at every build.
constexpr size_t kMaxMergedConstantBytes = 64 << 10;

// Ops whose outputs differ from run to run: two of them are two draws, never one.
bool isNondeterministic(const ir::Node& node) {
  static const std::unordered_set<std::string> kRandom = {
      "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
      "Multinomial",  "Bernoulli",        "Dropout"};
  return kRandom.count(node.opType) > 0;
}

// Ops whose result does not depend on the order of their two inputs, exactly (IEEE addition and
// multiplication commute; the broadcast shape is symmetric).
bool isCommutative(const ir::Node& node) {
  return node.opType == "Add" || node.opType == "Mul" || node.opType == "Equal" ||
         node.opType == "And" || node.opType == "Or" || node.opType == "Xor";
}

void appendBytes(std::string& key, const void* data, size_t size) {
  key.append(static_cast<const char*>(data), size);
}

template <typename T>
void appendScalar(std::string& key, T value) {
  appendBytes(key, &value, sizeof value);
}

void appendTensor(std::string& key, const ir::Tensor& tensor) {
  appendScalar(key, static_cast<uint8_t>(tensor.dtype()));
  appendScalar(key, tensor.rank());
  for (int64_t dim : tensor.shape().dims()) appendScalar(key, dim);
  appendBytes(key, tensor.rawData(), tensor.byteSize());
}

// The attribute's exact value as bytes: floats by their bits, so the key distinguishes every
// value the attribute can hold (and -0 from 0).
void appendAttribute(std::string& key, const ir::Attribute& attribute) {
  appendScalar(key, static_cast<uint8_t>(attribute.kind()));
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, ir::Tensor>) {
          appendTensor(key, v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          appendScalar(key, v.size());
          key += v;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          appendScalar(key, v.size());
          for (const std::string& s : v) {
            appendScalar(key, s.size());
            key += s;
          }
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                             std::is_same_v<T, std::vector<float>>) {
          appendScalar(key, v.size());
          appendBytes(key, v.data(), v.size() * sizeof(typename T::value_type));
        } else {
          appendScalar(key, v);
        }
      },
      attribute.value);
}

// Everything that decides what the node computes, as one string: two nodes with equal keys
// compute equal outputs.
std::string nodeKey(const ir::Node& node) {
  std::string key = node.domain + '\0' + node.opType + '\0';
  appendScalar(key, node.opsetVersion);
  std::vector<const ir::Value*> inputs(node.inputs.begin(), node.inputs.end());
  if (isCommutative(node) && inputs.size() == 2 && std::less<>{}(inputs[1], inputs[0])) {
    std::swap(inputs[0], inputs[1]);
  }
  appendScalar(key, inputs.size());
  for (const ir::Value* input : inputs) appendScalar(key, input);
  // The outputs present: a node that skips an optional output computes less than one that does
  // not, so only nodes with the same ones are merged.
  for (const ir::Value* output : node.outputs) key += output ? '1' : '0';
  key += '\0';
  for (const auto& [name, attribute] : node.attributes) {
    appendScalar(key, name.size());
    key += name;
    appendAttribute(key, attribute);
  }
  return key;
}

// Points readers of `from` at `to`, a node output that is not a graph output. A graph output
// keeps its name: `to` takes it over.
void redirect(ir::Graph& graph, ir::Value* from, ir::Value* to) {
  if (graph.isGraphOutput(from)) {
    const std::string name = from->name;
    graph.renameValue(from, name + ".removed");
    graph.renameValue(to, name);
  }
  graph.replaceAllUses(from, to);
}

// Merges initializers with equal dtype, shape and bytes into the first of them.
void mergeEqualConstants(ir::Graph& graph, PassContext& context) {
  std::unordered_map<std::string, ir::Value*> firstWithContents;
  std::vector<ir::Value*> values;
  for (const auto& value : graph.values()) values.push_back(value.get());
  for (ir::Value* value : values) {
    if (!value->isInitializer || !value->constant || value->producer ||
        value->constant->byteSize() > kMaxMergedConstantBytes || graph.isGraphOutput(value)) {
      continue;
    }
    std::string key;
    appendTensor(key, *value->constant);
    auto [it, inserted] = firstWithContents.emplace(std::move(key), value);
    if (inserted) continue;
    // Readers are all there is to rewrite (a constant that is not a graph output has no name to
    // keep); an unread duplicate is left for removeUnusedValues.
    if (graph.consumers(value).empty()) continue;
    graph.replaceAllUses(value, it->second);
    context.note("merged constant '{}' into equal '{}'", value->name, it->second->name);
  }
}

}  // namespace

Status eliminateCommonSubexpressions(ir::Graph& graph, PassContext& context) {
  mergeEqualConstants(graph, context);
  // In node order: merging a node points its readers at the kept node's outputs, so a reader
  // later in the order can then match too, and whole repeated chains collapse in one sweep.
  std::unordered_map<std::string, ir::Node*> firstWithKey;
  std::unordered_set<const ir::Node*> removed;
  for (const auto& nodePtr : graph.nodes()) {
    ir::Node& node = *nodePtr;
    if (isNondeterministic(node) || node.outputs.empty()) continue;
    auto [it, inserted] = firstWithKey.emplace(nodeKey(node), &node);
    if (inserted) continue;
    ir::Node& kept = *it->second;
    // Two graph outputs cannot become one value (each keeps its name): leave the node when an
    // output of it and the kept node's matching output both are.
    bool mergeable = true;
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i] && graph.isGraphOutput(node.outputs[i]) &&
          graph.isGraphOutput(kept.outputs[i])) {
        mergeable = false;
      }
    }
    if (!mergeable) continue;
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i]) redirect(graph, node.outputs[i], kept.outputs[i]);
    }
    removed.insert(&node);
    context.note("merged {} '{}' into '{}'", node.opType, node.name, kept.name);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
