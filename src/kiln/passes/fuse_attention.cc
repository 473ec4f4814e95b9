// Fuses scaled dot-product attention, as exporters spell it out, into one kiln.Attention node
// (src/kiln/ir/ops/attention.h), whose kernel never writes the [Sq, Skv] probabilities to memory.
//
//   %s = MatMul "qk" (Mul(%q, c1), Mul(%kt, c2)); %t = Div(%s, c3); %u = Add(%t, %mask);
//   %p = Softmax(%u) {axis=-1}; %w = Where(IsNaN(%p), 0, %p); %y = MatMul(%p or %w, %v)
//     =>   %y = kiln.Attention "qk" (%q, %kt, %v, %mask) {scale=c1*c2/c3, nan_to_zero=1}
//
// Each scale is a scalar constant multiplying (Mul) or dividing (Div) Q, K' or the scores, in
// any number and order before the mask; the mask Add and the Where(IsNaN) are optional. When K'
// is a Reshape/Transpose chain that only swaps the last two axes of some K [..., Skv, D], the
// node reads K with transpose_k=1 and the chain goes away. Every intermediate value must be read
// by the chain alone; Q, K' and V must have the same batch dimensions (no broadcasting).
#include <numeric>
#include <unordered_set>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFuseAttention = knobs::declareKnob({
    .name = "fusion.attention",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fuse MatMul(Q, K^T) -> scale -> mask Add -> Softmax -> MatMul(., V) into one "
            "Attention node (per node: the first MatMul's name)",
    .perNode = true,
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// The single node that reads `value`, if exactly one node reads it and it is not a graph
// output: only then may the node producing `value` disappear into the fused node.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value) {
  if (!value || graph.isGraphOutput(value)) return nullptr;
  std::vector<ir::Node*> readers = graph.consumers(value);
  return readers.size() == 1 ? readers[0] : nullptr;
}

// The value of a one-element floating-point constant.
std::optional<double> scalarConstant(const ir::Value* value) {
  if (!value || !value->constant || value->constant->elementCount() != 1 ||
      !ir::isFloating(value->constant->dtype())) {
    return std::nullopt;
  }
  return value->constant->elementAsDouble(0);
}

// A node that multiplies `operand` by a scalar constant without changing its shape or dtype
// (Mul by c, either order, or Div by c), and that factor; nullopt for anything else.
std::optional<double> scaleFactor(const ir::Node& node, const ir::Value* operand) {
  const ir::Value* out = node.outputs.empty() ? nullptr : node.outputs[0];
  if (!out || out->shape != operand->shape || out->dtype != operand->dtype ||
      node.inputs.size() != 2) {
    return std::nullopt;
  }
  if (isOp(&node, "Mul")) {
    if (node.inputs[0] == operand && node.inputs[1] != operand)
      return scalarConstant(node.inputs[1]);
    if (node.inputs[1] == operand && node.inputs[0] != operand)
      return scalarConstant(node.inputs[0]);
    return std::nullopt;
  }
  if (isOp(&node, "Div") && node.inputs[0] == operand && node.inputs[1] != operand) {
    std::optional<double> divisor = scalarConstant(node.inputs[1]);
    if (divisor && *divisor != 0) return 1 / *divisor;
  }
  return std::nullopt;
}

// Follows scale nodes up from `value` while each one's output is read by nothing but the node
// below it (so it can be absorbed): returns the unscaled value, multiplies `scale` by the
// factors and appends the scale nodes to `absorbed`.
ir::Value* stripScales(const ir::Graph& graph, ir::Value* value, double& scale,
                       std::vector<ir::Node*>& absorbed) {
  while (value->producer) {
    ir::Node* node = value->producer;
    if (node->inputs.size() != 2) break;
    // The scaled operand is the non-constant one.
    ir::Value* operand =
        node->inputs[0] && !node->inputs[0]->constant ? node->inputs[0] : node->inputs[1];
    if (!operand || operand->constant) break;
    std::optional<double> factor = scaleFactor(*node, operand);
    if (!factor || soleReader(graph, value) == nullptr) break;
    scale *= *factor;
    absorbed.push_back(node);
    value = operand;
  }
  return value;
}

// The flat element of `data` (a tensor of shape `shape`, row-major) each element of its
// transpose by `perm` holds.
std::vector<int64_t> transposeIndices(const std::vector<int64_t>& data, const ir::Shape& shape,
                                      const std::vector<int64_t>& perm) {
  const size_t rank = shape.rank();
  const std::vector<int64_t> strides = shape.strides();
  std::vector<int64_t> outDims(rank);
  for (size_t i = 0; i < rank; ++i) outDims[i] = shape[static_cast<size_t>(perm[i])];
  std::vector<int64_t> result;
  result.reserve(data.size());
  std::vector<int64_t> index(rank, 0);
  for (size_t n = 0; n < data.size(); ++n) {
    int64_t offset = 0;
    for (size_t i = 0; i < rank; ++i) offset += index[i] * strides[static_cast<size_t>(perm[i])];
    result.push_back(data[static_cast<size_t>(offset)]);
    for (size_t i = rank; i-- > 0;) {
      if (++index[i] < outDims[i]) break;
      index[i] = 0;
    }
  }
  return result;
}

// Whether the Reshape/Transpose nodes `chain` (in execution order, starting from `source`)
// compute exactly `source` with its last two axes swapped. Decided by running the chain on the
// element indices of `source`, so any mix of reshapes and transposes that amounts to the swap is
// recognised, and nothing else.
bool chainSwapsLastAxes(const ir::Value* source, const std::vector<ir::Node*>& chain) {
  constexpr int64_t kMaxElements = int64_t{1} << 22;  // build-time work, linear in the size
  const ir::Shape& shape = source->shape;
  const size_t rank = shape.rank();
  const int64_t count = shape.elementCount();
  if (rank < 2 || count > kMaxElements) return false;
  std::vector<int64_t> indices(static_cast<size_t>(count));
  std::iota(indices.begin(), indices.end(), 0);
  ir::Shape current = shape;
  for (const ir::Node* node : chain) {
    if (node->opType == "Transpose") {
      std::vector<int64_t> reversed(current.rank());
      std::iota(reversed.rbegin(), reversed.rend(), 0);
      auto perm = node->getInts("perm", reversed);
      if (!perm.isOk() || perm->size() != current.rank()) return false;
      indices = transposeIndices(indices, current, *perm);
    }
    current = node->outputs[0]->shape;  // a Reshape only renames the shape
  }
  std::vector<int64_t> swap(rank);
  std::iota(swap.begin(), swap.end(), 0);
  std::swap(swap[rank - 1], swap[rank - 2]);
  std::vector<int64_t> expected(static_cast<size_t>(count));
  std::iota(expected.begin(), expected.end(), 0);
  return indices == transposeIndices(expected, shape, swap);
}

// A K [..., Skv, D] whose last-two-axes swap `kt` [..., D, Skv] is, through Reshape and
// Transpose nodes alone; the furthest such value up the chain, or null.
ir::Value* untransposedKey(const ir::Value* kt) {
  constexpr int kMaxChain = 6;
  const size_t rank = kt->shape.rank();
  std::vector<int64_t> wanted = kt->shape.dims();
  std::swap(wanted[rank - 1], wanted[rank - 2]);
  std::vector<ir::Node*> chain;  // from the current source down to kt
  ir::Value* found = nullptr;
  const ir::Value* value = kt;
  for (int step = 0; step < kMaxChain; ++step) {
    ir::Node* node = value->producer;
    if (!(isOp(node, "Reshape") || isOp(node, "Transpose")) || !node->input(0)) break;
    chain.insert(chain.begin(), node);
    value = node->inputs[0];
    if (value->shape.dims() == wanted && chainSwapsLastAxes(value, chain)) {
      found = const_cast<ir::Value*>(value);
    }
  }
  return found;
}

// Whether Softmax normalizes over the last axis (before opset 13 its axis flattens the axes
// after it, which is the same computation when it is the last one).
bool softmaxOverLastAxis(const ir::Node& softmax) {
  const ir::Value* x = softmax.input(0);
  if (!x || x->shape.rank() == 0) return false;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  auto axis = softmax.getInt("axis", softmax.opsetVersion >= 13 ? -1 : 1);
  if (!axis.isOk()) return false;
  auto normalized = ir::normalizeAxis(*axis, rank);
  return normalized.isOk() && *normalized == rank - 1;
}

// Whether `a` and `b` have the same rank (at least 2) and the same batch dimensions.
bool sameBatch(const ir::Shape& a, const ir::Shape& b) {
  if (a.rank() < 2 || a.rank() != b.rank()) return false;
  for (size_t i = 0; i + 2 < a.rank(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

struct AttentionMatch {
  ir::Node* scores = nullptr;  // the first product, Q · K'
  ir::Node* output = nullptr;  // the second product, whose output the fused node takes over
  ir::Value* q = nullptr;
  ir::Value* k = nullptr;
  ir::Value* v = nullptr;
  ir::Value* mask = nullptr;
  ir::Value* kt = nullptr;  // K' as the product read it (unscaled), when K is its untransposed form
  bool transposeK = false;
  bool nanToZero = false;
  double scale = 1.0;
  std::vector<ir::Node*> absorbed;  // every node the fused node replaces
};

// The first product: MatMul(Q, K'), or (a 2-D product that fold_transpose_into_gemm already
// turned into one) Gemm(Q, K) without C, whose transB and alpha carry over.
bool matchScoresProduct(ir::Node& node, AttentionMatch& match) {
  if (!node.input(0) || !node.input(1)) return false;
  if (isOp(&node, "MatMul")) {
    match.q = node.inputs[0];
    match.k = node.inputs[1];
    return sameBatch(match.q->shape, match.k->shape);
  }
  if (!isOp(&node, "Gemm") || node.hasInput(2)) return false;
  auto transA = node.getInt("transA", 0);
  auto transB = node.getInt("transB", 0);
  auto alpha = node.getFloat("alpha", 1.0f);
  if (!transA.isOk() || *transA != 0 || !transB.isOk() || !alpha.isOk()) return false;
  match.q = node.inputs[0];
  match.k = node.inputs[1];
  match.transposeK = *transB != 0;
  match.scale *= *alpha;
  return true;
}

// The second product: MatMul(P, V), or a Gemm(P, V) that is one (no C, no transposes, alpha 1).
bool matchOutputProduct(ir::Node& node, const ir::Value* probabilities, AttentionMatch& match) {
  if (!node.input(0) || !node.input(1) || node.inputs[0] != probabilities ||
      node.inputs[1] == probabilities) {
    return false;
  }
  if (isOp(&node, "Gemm")) {
    auto transA = node.getInt("transA", 0);
    auto transB = node.getInt("transB", 0);
    auto alpha = node.getFloat("alpha", 1.0f);
    if (node.hasInput(2) || !transA.isOk() || *transA != 0 || !transB.isOk() || *transB != 0 ||
        !alpha.isOk() || *alpha != 1.0f) {
      return false;
    }
  } else if (!isOp(&node, "MatMul")) {
    return false;
  }
  match.v = node.inputs[1];
  return sameBatch(probabilities->shape, match.v->shape);
}

// Below the softmax: an optional Where(IsNaN(p), 0, p), then the product with V.
bool matchBelowSoftmax(const ir::Graph& graph, ir::Node& softmax, AttentionMatch& match) {
  ir::Value* p = softmax.outputs[0];
  if (graph.isGraphOutput(p)) return false;
  std::vector<ir::Node*> readers = graph.consumers(p);
  ir::Value* probabilities = p;
  if (readers.size() == 2) {
    ir::Node* isNan = isOp(readers[0], "IsNaN") ? readers[0] : readers[1];
    ir::Node* where = isNan == readers[0] ? readers[1] : readers[0];
    if (!isOp(isNan, "IsNaN") || !isOp(where, "Where") || where->inputs.size() != 3 ||
        where->inputs[0] != isNan->outputs[0] || where->inputs[2] != p ||
        scalarConstant(where->inputs[1]) != 0.0 || where->outputs[0]->shape != p->shape ||
        soleReader(graph, isNan->outputs[0]) != where) {
      return false;
    }
    match.nanToZero = true;
    match.absorbed.push_back(isNan);
    match.absorbed.push_back(where);
    probabilities = where->outputs[0];
  } else if (readers.size() != 1) {
    return false;
  }
  ir::Node* product = soleReader(graph, probabilities);
  if (!product || !matchOutputProduct(*product, probabilities, match)) return false;
  match.output = product;
  match.absorbed.push_back(product);
  return true;
}

// Above the softmax: an optional mask Add over scale nodes over the first product.
bool matchAboveSoftmax(const ir::Graph& graph, ir::Node& softmax, AttentionMatch& match) {
  ir::Value* logits = softmax.inputs[0];
  if (!soleReader(graph, logits)) return false;
  ir::Value* scaled = logits;
  ir::Node* add = logits->producer;
  if (isOp(add, "Add") && add->inputs.size() == 2 && add->outputs[0]->shape == logits->shape) {
    // The scores are the operand a product (through scales) computes; the mask is the other.
    for (int side = 0; side < 2; ++side) {
      ir::Value* operand = add->inputs[static_cast<size_t>(side)];
      ir::Value* mask = add->inputs[static_cast<size_t>(1 - side)];
      double scale = 1.0;
      std::vector<ir::Node*> scales;
      const ir::Value* raw = stripScales(graph, operand, scale, scales);
      if (operand == mask || !raw->producer || mask->dtype != logits->dtype ||
          operand->shape != logits->shape || !soleReader(graph, operand)) {
        continue;
      }
      if (isOp(raw->producer, "MatMul") || isOp(raw->producer, "Gemm")) {
        match.mask = mask;
        match.absorbed.push_back(add);
        scaled = operand;
        break;
      }
    }
  }
  ir::Value* raw = stripScales(graph, scaled, match.scale, match.absorbed);
  ir::Node* product = raw->producer;
  if (!product || !soleReader(graph, raw) || !matchScoresProduct(*product, match)) return false;
  match.scores = product;
  match.absorbed.push_back(product);
  return true;
}

std::optional<AttentionMatch> matchAttention(const ir::Graph& graph, ir::Node& softmax) {
  if (!isOp(&softmax, "Softmax") || !softmax.input(0) || !softmaxOverLastAxis(softmax) ||
      !ir::isFloating(softmax.inputs[0]->dtype)) {
    return std::nullopt;
  }
  AttentionMatch match;
  match.absorbed.push_back(&softmax);
  if (!matchAboveSoftmax(graph, softmax, match) || !matchBelowSoftmax(graph, softmax, match)) {
    return std::nullopt;
  }
  // Scales on Q and K' multiply the product, so they fold into `scale` too.
  match.q = stripScales(graph, match.q, match.scale, match.absorbed);
  match.k = stripScales(graph, match.k, match.scale, match.absorbed);
  if (!match.transposeK) {
    if (ir::Value* k = untransposedKey(match.k)) {
      match.kt = match.k;
      match.k = k;
      match.transposeK = true;
    }
  }
  return match;
}

// Marks removed the Reshape/Transpose nodes above `value` that nothing reads any more, now
// that the nodes in `removed` are gone (K's former transpose chain, whose reader was absorbed).
void removeDeadChain(const ir::Graph& graph, ir::Value* value,
                     std::unordered_set<const ir::Node*>& removed) {
  while (value->producer &&
         (isOp(value->producer, "Reshape") || isOp(value->producer, "Transpose")) &&
         !graph.isGraphOutput(value)) {
    for (const ir::Node* reader : graph.consumers(value)) {
      if (!removed.count(reader)) return;
    }
    removed.insert(value->producer);
    value = value->producer->inputs[0];
  }
}

}  // namespace

Status fuseAttention(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  // Collect first: the loop below inserts nodes, which would invalidate iteration.
  std::vector<ir::Node*> candidates;
  for (const auto& node : graph.nodes()) candidates.push_back(node.get());
  for (ir::Node* softmax : candidates) {
    if (removed.count(softmax)) continue;
    std::optional<AttentionMatch> match = matchAttention(graph, *softmax);
    if (!match || context.route.value(kFuseAttention, match->scores) != "on") continue;
    if (std::any_of(match->absorbed.begin(), match->absorbed.end(),
                    [&](const ir::Node* node) { return removed.count(node) > 0; })) {
      continue;
    }
    ir::Node* attention = graph.insertNode("Attention", match->output);
    attention->name = match->scores->name;
    attention->domain = ir::kKilnDomain;
    attention->opsetVersion = 1;
    attention->inputs = {match->q, match->k, match->v};
    if (match->mask) attention->inputs.push_back(match->mask);
    attention->attributes["scale"] = ir::Attribute{static_cast<float>(match->scale)};
    if (match->transposeK) attention->attributes["transpose_k"] = ir::Attribute{int64_t{1}};
    if (match->nanToZero) attention->attributes["nan_to_zero"] = ir::Attribute{int64_t{1}};
    ir::Value* output = match->output->outputs[0];
    attention->outputs = {output};
    output->producer = attention;
    const size_t before = removed.size();
    for (ir::Node* node : match->absorbed) removed.insert(node);
    if (match->kt) removeDeadChain(graph, match->kt, removed);
    context.note("fused attention '{}' ({} nodes, scale {}{}{}{})", attention->name,
                 removed.size() - before, match->scale, match->mask ? ", mask" : "",
                 match->transposeK ? ", K transposed" : "", match->nanToZero ? ", NaN to 0" : "");
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
