// Moves kiln.Attention's head split into the node (its heads form, src/kiln/ir/ops/attention.h),
// so that the Reshape / Transpose pairs exporters write around attention go away, and with them
// a copy of Q, K, V and the output per layer:
//
//   %q4 = Transpose(Reshape(%xq, [B, Sq, H, D])) {perm=[0,2,1,3]}        (likewise K and V;
//   %k4 = Transpose(Reshape(%xk, [B, Skv, H, D])) {perm=[0,2,3,1]}        K may also be read
//   %y4 = kiln.Attention(%q4, %k4, %v4, %mask?)                            with transpose_k=1)
//   %t  = Transpose(%y4) {perm=[0,2,1,3]}
//     =>   %y = kiln.Attention(%xq, %xk, %xv, %mask?) {num_heads=H, transpose_k=1}
//          %t = Reshape(%y, [B, Sq, H, Dv])
//
// The final Reshape only renames the shape (the backends alias it). When Q, K and V are the
// three equal outputs of one Split of %x [B, S, 3 * H * D] along its last axis, in that order
// (GPT-2's c_attn), the node reads %x alone, packed, and the Split goes too. The mask is
// untouched: the scores are [B, H, Sq, Skv] in both forms. The old Reshapes, Transposes and Split
// are left to eliminate_dead_nodes, so any other reader of theirs keeps working.
#include <optional>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kAttentionHeads = knobs::declareKnob({
    .name = "fusion.attention_heads",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "let kiln.Attention read Q, K and V in the [B, S, H * D] layout the projections write "
            "(packed, from one Split of a fused QKV product, where there is one) and write its "
            "output so, instead of Reshape + Transpose copies around it (per node: the "
            "Attention's name)",
    .perNode = true,
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

bool hasPerm(const ir::Node& transpose, const std::vector<int64_t>& perm) {
  auto actual = transpose.getInts("perm", {});
  return actual.isOk() && *actual == perm;
}

// The [B, S, H * D] source of an operand [B, H, S, D] (or, for K' with `depthFirst`,
// [B, H, D, S]) that is Transpose(Reshape(x)) with x of B * S rows of H * D columns; null if it is
// not. The source may have any shape with those elements and last axis (a Reshape to
// [B, S, H * D] is added then, see sourceAs3d).
ir::Value* headsSource(const ir::Value* operand, bool depthFirst) {
  const ir::Node* transpose = operand->producer;
  if (!isOp(transpose, "Transpose") || !transpose->input(0) ||
      !hasPerm(*transpose,
               depthFirst ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3})) {
    return nullptr;
  }
  const ir::Value* split = transpose->inputs[0];  // [B, S, H, D]
  const ir::Node* reshape = split->producer;
  if (!isOp(reshape, "Reshape") || !reshape->input(0) || split->shape.rank() != 4) return nullptr;
  ir::Value* source = reshape->inputs[0];
  const ir::Shape& s = split->shape;
  if (source->shape.rank() < 2 || source->shape.dims().back() != s[2] * s[3] ||
      source->shape.elementCount() != s.elementCount()) {
    return nullptr;
  }
  return source;
}

struct HeadsMatch {
  ir::Value* q = nullptr;  // sources, [B, S, H * D] after sourceAs3d
  ir::Value* k = nullptr;
  ir::Value* v = nullptr;
  ir::Value* packed = nullptr;  // the Split's input, when Q, K and V are its three outputs
  ir::Node* outputTranspose = nullptr;
  int64_t batch = 0, heads = 0;
};

// The Split of `packed` [B, S, 3E] along its last axis into three [B, S, E] outputs that are q,
// k and v in that order; null if there is none.
ir::Value* packedSource(const ir::Value* q, const ir::Value* k, const ir::Value* v) {
  const ir::Node* split = q->producer;
  if (!isOp(split, "Split") || !split->input(0) || split->outputs.size() != 3 ||
      split->outputs[0] != q || split->outputs[1] != k || split->outputs[2] != v) {
    return nullptr;
  }
  ir::Value* x = split->inputs[0];
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  auto axis = split->getInt("axis", 0);
  if (rank != 3 || !axis.isOk() || (*axis != -1 && *axis != rank - 1)) return nullptr;
  const ir::Shape& e = q->shape;
  if (e.rank() != 3 || k->shape != e || v->shape != e || x->shape[0] != e[0] ||
      x->shape[1] != e[1] || x->shape[2] != 3 * e[2]) {
    return nullptr;
  }
  return x;
}

std::optional<HeadsMatch> matchHeads(const ir::Graph& graph, const ir::Node& attention) {
  if (attention.domain != ir::kKilnDomain || attention.opType != "Attention" ||
      attention.hasAttribute("num_heads") || attention.outputs.size() != 1) {
    return std::nullopt;
  }
  auto transposeK = attention.getInt("transpose_k", 0);
  if (!transposeK.isOk()) return std::nullopt;
  const ir::Value* q4 = attention.input(0);
  const ir::Value* k4 = attention.input(1);
  const ir::Value* v4 = attention.input(2);
  const ir::Value* y4 = attention.outputs[0];
  if (!q4 || !k4 || !v4 || q4->shape.rank() != 4 || graph.isGraphOutput(y4)) return std::nullopt;
  HeadsMatch match;
  match.q = headsSource(q4, false);
  match.k = headsSource(k4, *transposeK == 0);
  match.v = headsSource(v4, false);
  if (!match.q || !match.k || !match.v) return std::nullopt;
  const std::vector<ir::Node*> readers = graph.consumers(y4);
  if (readers.size() != 1 || !isOp(readers[0], "Transpose") ||
      !hasPerm(*readers[0], {0, 2, 1, 3})) {
    return std::nullopt;
  }
  match.outputTranspose = readers[0];
  match.batch = q4->shape[0];
  match.heads = q4->shape[1];
  match.packed = packedSource(match.q, match.k, match.v);
  return match;
}

ir::Value* newConstantShape(ir::Graph& graph, const std::string& base, const ir::Shape& shape) {
  ir::Value* value = graph.addUniqueValue(base);
  ir::Tensor tensor =
      ir::Tensor::fromVector<int64_t>(ir::Shape{static_cast<int64_t>(shape.rank())}, shape.dims());
  value->dtype = tensor.dtype();
  value->shape = tensor.shape();
  value->hasType = true;
  value->constant = std::move(tensor);
  value->isInitializer = true;
  return value;
}

// `value` reshaped to `shape`, by a Reshape placed before `position` (`value` itself when it
// has that shape already).
ir::Value* reshapeTo(ir::Graph& graph, ir::Value* value, const ir::Shape& shape,
                     const ir::Node& position, const std::string& name) {
  if (value->shape == shape) return value;
  ir::Node* reshape = graph.insertNode("Reshape", &position);
  reshape->name = name;
  reshape->opsetVersion = graph.opsetImports.count("") ? graph.opsetImports.at("") : 18;
  ir::Value* out = graph.addUniqueValue(name + "_output");
  out->dtype = value->dtype;
  out->shape = shape;
  out->hasType = true;
  out->producer = reshape;
  reshape->inputs = {value, newConstantShape(graph, name + "_shape", shape)};
  reshape->outputs = {out};
  return out;
}

// [B, S, columns] of an operand source of B * S rows.
ir::Shape rows3d(const ir::Value* source, int64_t batch) {
  const int64_t columns = source->shape.dims().back();
  return ir::Shape({batch, source->shape.elementCount() / (batch * columns), columns});
}

}  // namespace

Status attentionHeads(ir::Graph& graph, PassContext& context) {
  // Collect first: the rewrite inserts nodes.
  std::vector<ir::Node*> candidates;
  for (const auto& node : graph.nodes()) candidates.push_back(node.get());
  int rewritten = 0;
  for (ir::Node* attention : candidates) {
    std::optional<HeadsMatch> match = matchHeads(graph, *attention);
    if (!match || match->batch <= 0 || context.route.value(kAttentionHeads, attention) != "on") {
      continue;
    }
    const std::string& name = attention->name;
    const ir::Value* y4 = attention->outputs[0];
    const int64_t dv = y4->shape[3];
    if (match->packed) {
      attention->inputs[0] = match->packed;
      attention->inputs[1] = nullptr;
      attention->inputs[2] = nullptr;
    } else {
      attention->inputs[0] =
          reshapeTo(graph, match->q, rows3d(match->q, match->batch), *attention, name + "_q");
      attention->inputs[1] =
          reshapeTo(graph, match->k, rows3d(match->k, match->batch), *attention, name + "_k");
      attention->inputs[2] =
          reshapeTo(graph, match->v, rows3d(match->v, match->batch), *attention, name + "_v");
    }
    attention->attributes["num_heads"] = ir::Attribute{match->heads};
    attention->attributes["transpose_k"] = ir::Attribute{int64_t{1}};
    // The output [B, Sq, H * Dv]; the Transpose becomes a Reshape of it to [B, Sq, H, Dv].
    ir::Value* y = graph.addUniqueValue(y4->name + "_heads");
    y->dtype = y4->dtype;
    y->shape = ir::Shape({match->batch, y4->shape[2], match->heads * dv});
    y->hasType = true;
    y->producer = attention;
    attention->outputs = {y};
    ir::Node* transpose = match->outputTranspose;
    transpose->opType = "Reshape";
    transpose->attributes.clear();
    transpose->inputs = {
        y, newConstantShape(graph, transpose->name + "_shape", transpose->outputs[0]->shape)};
    ++rewritten;
    context.note("attention '{}' reads its {} heads in place{}", name, match->heads,
                 match->packed ? " from one packed QKV tensor" : "");
  }
  if (rewritten > 0) {
    // The old [B, H, S, D] output: nothing reads or writes it now.
    graph.removeUnusedValues();
  }
  return Status::ok();
}

}  // namespace kiln::passes
