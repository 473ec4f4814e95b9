// Recognizes the decomposed layer normalization exporters write and replaces it by one
// LayerNormalization node.
//
//   %m = ReduceMean(%x) {axes=[-1]}; %d = Sub(%x, %m); %p = Pow(%d, 2); %v = ReduceMean(%p);
//   %e = Add(%v, 1e-5); %s = Sqrt(%e); %n = Div(%d, %s); %g = Mul(%n, %w); %y = Add(%g, %b)
//     =>   %y = LayerNormalization(%x, %w, %b) {axis=-1, epsilon=1e-5}
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kRecognizeLayerNorm = knobs::declareKnob({
    .name = "graph.recognize_layernorm",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "replace the decomposed ReduceMean/Sub/Pow/Sqrt/Div layer norm by LayerNormalization",
});

namespace {

// The single node that reads `value`, if exactly one node reads it (once or more) and it is not
// a graph output: only then may the node producing `value` disappear into a fused node.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value) {
  if (!value || graph.isGraphOutput(value)) return nullptr;
  std::vector<ir::Node*> readers = graph.consumers(value);
  return readers.size() == 1 ? readers[0] : nullptr;
}

// The operand of a two-input node that is not `known`, or null when neither or both are.
ir::Value* otherOperand(const ir::Node& node, const ir::Value* known) {
  if (node.inputs.size() != 2) return nullptr;
  if (node.inputs[0] == known && node.inputs[1] != known) return node.inputs[1];
  if (node.inputs[1] == known && node.inputs[0] != known) return node.inputs[0];
  return nullptr;
}

// The value of a one-element float constant, if `value` is one.
std::optional<double> scalarConstant(const ir::Value* value) {
  if (!value || !value->constant || value->constant->elementCount() != 1 ||
      !ir::isFloating(value->constant->dtype())) {
    return std::nullopt;
  }
  return value->constant->elementAsDouble(0);
}

// Pow's exponent may be of any numeric type (exporters write float or int64 2).
bool isConstantTwo(const ir::Value* value) {
  return value && value->constant && value->constant->elementCount() == 1 &&
         value->constant->elementAsDouble(0) == 2.0;
}

bool isDefaultDomain(const ir::Node& node, const char* opType) {
  return node.domain.empty() && node.opType == opType;
}

// The first axis of a ReduceMean that averages over the trailing axes of its input and keeps
// them (what LayerNormalization's `axis` means), or nullopt for any other reduction.
std::optional<int64_t> trailingReduceAxis(const ir::Node& node) {
  if (!isDefaultDomain(node, "ReduceMean") || !node.input(0) || !node.input(0)->hasType) {
    return std::nullopt;
  }
  const int64_t rank = static_cast<int64_t>(node.inputs[0]->shape.rank());
  auto keepdims = node.getInt("keepdims", 1);
  if (!keepdims.isOk() || *keepdims != 1 || rank == 0) return std::nullopt;
  std::vector<int64_t> axes;
  if (node.opsetVersion >= 18) {
    if (node.hasInput(1)) {
      if (!node.inputs[1]->constant) return std::nullopt;
      axes = node.inputs[1]->constant->toInt64Vector();
    }
    auto noop = node.getInt("noop_with_empty_axes", 0);
    if (!noop.isOk() || (axes.empty() && *noop != 0)) return std::nullopt;
  } else {
    auto attribute = node.getInts("axes");
    if (!attribute.isOk()) return std::nullopt;
    axes = *attribute;
  }
  if (axes.empty()) return 0;  // every axis
  for (int64_t& axis : axes) {
    auto normalized = ir::normalizeAxis(axis, rank);
    if (!normalized.isOk()) return std::nullopt;
    axis = *normalized;
  }
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] != rank - static_cast<int64_t>(axes.size() - i)) return std::nullopt;
  }
  return axes.front();
}

// Whether a constant multiplied into (or added to) the normalized value varies only along the
// normalized axes [axis, rank) of `x`, so it is a LayerNormalization Scale or B; a larger rank
// or a dimension along a non-normalized axis would change the output's shape or meaning.
bool isPerFeatureConstant(const ir::Value* value, const ir::Value* x, int64_t axis) {
  if (!value || !value->constant || value->dtype != x->dtype) return false;
  const auto& dims = value->constant->shape().dims();
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  if (static_cast<int64_t>(dims.size()) > rank) return false;
  const int64_t offset = rank - static_cast<int64_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t xAxis = offset + static_cast<int64_t>(i);
    if (dims[i] == 1) continue;
    if (xAxis < axis || dims[i] != x->shape[xAxis]) return false;
  }
  return true;
}

// `value` (per-feature, see above) laid out with exactly the normalized shape, so Scale and B
// hold one element per feature as LayerNormalization's definition has them.
ir::Tensor toNormalizedShape(const ir::Tensor& value, const ir::Shape& normalized) {
  const ir::Tensor source = value.castTo(ir::DType::kFloat64);
  const auto sourceData = source.data<double>();
  const auto& sourceDims = source.shape().dims();
  const size_t rank = normalized.rank();
  std::vector<int64_t> strides(rank, 0);  // 0 along broadcast axes
  {
    int64_t stride = 1;
    for (size_t i = 0; i < sourceDims.size() && i < rank; ++i) {
      const size_t s = sourceDims.size() - 1 - i;
      const size_t n = rank - 1 - i;
      if (sourceDims[s] != 1) strides[n] = stride;
      stride *= sourceDims[s];
    }
  }
  ir::Tensor result(ir::DType::kFloat64, normalized);
  auto out = result.mutableData<double>();
  const std::vector<int64_t> outStrides = normalized.strides();
  for (int64_t i = 0; i < result.elementCount(); ++i) {
    int64_t offset = 0;
    for (size_t axis = 0; axis < rank; ++axis) {
      offset += (i / outStrides[axis]) % normalized[axis] * strides[axis];
    }
    out[static_cast<size_t>(i)] = sourceData[static_cast<size_t>(offset)];
  }
  return result.castTo(value.dtype());
}

struct LayerNormMatch {
  ir::Value* x = nullptr;
  int64_t axis = 0;
  float epsilon = 0;
  ir::Value* scale = nullptr;  // null: none in the pattern (a ones constant is made)
  ir::Value* bias = nullptr;
  ir::Node* last = nullptr;  // whose output the LayerNormalization takes over
  std::vector<ir::Node*> nodes;
};

// Follows the pattern down from its first ReduceMean.
std::optional<LayerNormMatch> matchLayerNorm(const ir::Graph& graph, ir::Node& mean) {
  LayerNormMatch match;
  auto axis = trailingReduceAxis(mean);
  if (!axis) return std::nullopt;
  match.x = mean.inputs[0];
  match.axis = *axis;
  if (!ir::isFloating(match.x->dtype)) return std::nullopt;
  match.nodes.push_back(&mean);

  // Sub(x, mean): the centred input, read by the square and the division.
  ir::Node* sub = soleReader(graph, mean.outputs[0]);
  if (!sub || !isDefaultDomain(*sub, "Sub") || sub->inputs[0] != match.x ||
      sub->inputs[1] != mean.outputs[0]) {
    return std::nullopt;
  }
  match.nodes.push_back(sub);
  ir::Value* centred = sub->outputs[0];
  if (graph.isGraphOutput(centred)) return std::nullopt;
  std::vector<ir::Node*> centredReaders = graph.consumers(centred);
  if (centredReaders.size() != 2) return std::nullopt;

  // Pow(d, 2) or Mul(d, d), whichever reader it is; the other one divides.
  ir::Node* square = nullptr;
  ir::Node* divide = nullptr;
  for (ir::Node* reader : centredReaders) {
    const bool isSquare = (isDefaultDomain(*reader, "Pow") && reader->inputs[0] == centred &&
                           isConstantTwo(reader->input(1))) ||
                          (isDefaultDomain(*reader, "Mul") && reader->inputs[0] == centred &&
                           reader->inputs[1] == centred);
    (isSquare && !square ? square : divide) = reader;
  }
  if (!square || !divide) return std::nullopt;
  match.nodes.push_back(square);

  ir::Node* variance = soleReader(graph, square->outputs[0]);
  if (!variance || trailingReduceAxis(*variance) != match.axis ||
      variance->inputs[0] != square->outputs[0]) {
    return std::nullopt;
  }
  match.nodes.push_back(variance);

  ir::Node* addEps = soleReader(graph, variance->outputs[0]);
  if (!addEps || !isDefaultDomain(*addEps, "Add")) return std::nullopt;
  auto epsilon = scalarConstant(otherOperand(*addEps, variance->outputs[0]));
  if (!epsilon || *epsilon < 0) return std::nullopt;
  match.epsilon = static_cast<float>(*epsilon);
  match.nodes.push_back(addEps);

  ir::Node* sqrt = soleReader(graph, addEps->outputs[0]);
  if (!sqrt || !isDefaultDomain(*sqrt, "Sqrt")) return std::nullopt;
  match.nodes.push_back(sqrt);

  // Div(d, sqrt), or Mul(d, Reciprocal(sqrt)) in either operand order.
  ir::Node* sqrtReader = soleReader(graph, sqrt->outputs[0]);
  if (!sqrtReader) return std::nullopt;
  if (isDefaultDomain(*sqrtReader, "Div")) {
    if (sqrtReader != divide || divide->inputs[0] != centred ||
        divide->inputs[1] != sqrt->outputs[0]) {
      return std::nullopt;
    }
  } else if (isDefaultDomain(*sqrtReader, "Reciprocal")) {
    match.nodes.push_back(sqrtReader);
    if (soleReader(graph, sqrtReader->outputs[0]) != divide || !isDefaultDomain(*divide, "Mul") ||
        otherOperand(*divide, centred) != sqrtReader->outputs[0]) {
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  match.nodes.push_back(divide);
  match.last = divide;

  // Optional Mul(gamma), then optional Add(beta), each with a per-feature constant.
  ir::Node* next = soleReader(graph, match.last->outputs[0]);
  if (next && isDefaultDomain(*next, "Mul")) {
    ir::Value* gamma = otherOperand(*next, match.last->outputs[0]);
    if (isPerFeatureConstant(gamma, match.x, match.axis)) {
      match.scale = gamma;
      match.nodes.push_back(next);
      match.last = next;
      next = soleReader(graph, next->outputs[0]);
    }
  }
  if (next && isDefaultDomain(*next, "Add")) {
    ir::Value* beta = otherOperand(*next, match.last->outputs[0]);
    if (isPerFeatureConstant(beta, match.x, match.axis)) {
      match.bias = beta;
      match.nodes.push_back(next);
      match.last = next;
    }
  }
  // A constant of higher rank than x (an epsilon of shape [1,1,1,1] on a rank-3 input) would
  // have broadcast the result to another shape than LayerNormalization's.
  const ir::Value* result = match.last->outputs[0];
  if (result->dtype != match.x->dtype || result->shape != match.x->shape) return std::nullopt;
  return match;
}

// A constant input of the new node with exactly the normalized shape: `value` itself if it
// already has it, else a new initializer holding its elements broadcast (ones if null).
ir::Value* normalizedConstant(ir::Graph& graph, ir::Value* value, const ir::Value* x, int64_t axis,
                              const std::string& base) {
  std::vector<int64_t> dims(x->shape.dims().begin() + axis, x->shape.dims().end());
  const ir::Shape normalized(dims);
  if (value && value->constant->shape() == normalized) return value;
  ir::Tensor tensor = value ? toNormalizedShape(*value->constant, normalized)
                            : ir::Tensor::fromVector<double>(
                                  normalized, std::vector<double>(normalized.elementCount(), 1.0))
                                  .castTo(x->dtype);
  return graph.addConstant(value ? value->name + "_" + base : base, std::move(tensor));
}

}  // namespace

Status recognizeLayerNorm(ir::Graph& graph, PassContext& context) {
  const auto opset = graph.opsetImports.find("");
  const int modelOpset = opset == graph.opsetImports.end() ? 0 : opset->second;
  std::unordered_set<const ir::Node*> removed;
  // Collect first: the loop below inserts nodes, which would invalidate iteration.
  std::vector<ir::Node*> candidates;
  for (const auto& node : graph.nodes()) candidates.push_back(node.get());
  for (ir::Node* mean : candidates) {
    if (removed.count(mean)) continue;
    std::optional<LayerNormMatch> match = matchLayerNorm(graph, *mean);
    if (!match) continue;
    const std::string name = match->last->name;
    ir::Value* scale = normalizedConstant(graph, match->scale, match->x, match->axis, "ln_scale");
    ir::Value* bias = match->bias
                          ? normalizedConstant(graph, match->bias, match->x, match->axis, "ln_bias")
                          : nullptr;
    ir::Node* norm = graph.insertNode("LayerNormalization", match->last);
    norm->name = name;
    norm->opsetVersion = std::max(17, modelOpset);
    norm->inputs = {match->x, scale};
    if (bias) norm->inputs.push_back(bias);
    norm->attributes["axis"] = ir::Attribute{match->axis};
    norm->attributes["epsilon"] = ir::Attribute{match->epsilon};
    ir::Value* output = match->last->outputs[0];
    norm->outputs = {output};
    output->producer = norm;
    for (ir::Node* node : match->nodes) removed.insert(node);
    context.note("recognized LayerNormalization '{}' ({} nodes, axis {}, epsilon {})", name,
                 match->nodes.size(), match->axis, match->epsilon);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
