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
// The operands are matched by where their elements lie, not by one chain: each is followed back
// through Reshape, Squeeze, Unsqueeze, Flatten, Transpose, Split and Gather of a constant index
// as a strided view of an earlier value x, and it is in heads form when x, seen as B * S rows of
// C columns, holds head h of row (b, s) in columns o + [h * D, (h + 1) * D). With o = 0 and
// C = H * D for each of Q, K and V the node reads the three x; when Q, K and V read one x of
// C = 3 * H * D at o = 0, H * D and 2 * H * D (GPT-2's c_attn Split, or torch's
// nn.MultiheadAttention, which reshapes the packed product to [S, B, 3, E], moves the 3 first and
// Gathers each), the node reads that x alone, packed. The output's one reader must be a Transpose
// writing [B, Sq, H, Dv] order (axes of size 1 may sit anywhere); the final Reshape only renames
// the shape (the backends alias it). The mask is untouched: the scores are [B, H, Sq, Skv] in
// both forms. The old chains are left to eliminate_dead_nodes, so any other reader of theirs
// keeps working.
#include <algorithm>
#include <numeric>
#include <optional>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kAttentionHeads = knobs::declareKnob({
    .name = "fusion.attention_heads",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "let kiln.Attention read Q, K and V in the [B, S, H * D] layout the projections write "
            "(packed, where they are the three parts of one fused QKV product) and write its "
            "output so, instead of the Reshape / Transpose / Gather copies around it (per node: "
            "the Attention's name)",
    .perNode = true,
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// --- where an operand's elements lie ---------------------------------------------------------
// Exporters reach Q, K and V from the projections' output by different chains of layout ops
// (a Reshape and a Transpose; torch's nn.MultiheadAttention adds Unsqueeze, Squeeze and a Gather
// of each third of the packed product), so the match is on where the operand's elements lie in
// memory rather than on any one chain: a strided view, followed back through the ops that only
// pick and reorder elements, as torch's Tensor.view / permute / select would.

// Element (i0, i1, ...) of a value is element offset + i0 * strides[0] + i1 * strides[1] + ...
// of `source`'s (row-major) elements.
struct StridedView {
  ir::Value* source = nullptr;
  int64_t offset = 0;
  std::vector<int64_t> dims, strides;
};

StridedView wholeOf(ir::Value* value) {
  return {value, 0, value->shape.dims(), value->shape.strides()};
}

// `view`'s elements, in row-major order, read as `dims` (a Reshape, Squeeze, Unsqueeze or
// Flatten), or nullopt where that is no strided view: as in torch's view(), a run of axes that
// are contiguous in memory may be merged and split, but no new axis may span two runs.
std::optional<StridedView> reshapeView(const StridedView& view, const std::vector<int64_t>& dims) {
  StridedView out{view.source, view.offset, dims, std::vector<int64_t>(dims.size(), 1)};
  const std::vector<int64_t>& oldDims = view.dims;
  for (const int64_t d : oldDims) {
    if (d <= 0) return std::nullopt;  // empty tensors: nothing to gain
  }
  if (oldDims.empty()) {
    return std::all_of(dims.begin(), dims.end(), [](int64_t d) { return d == 1; })
               ? std::optional<StridedView>(out)
               : std::nullopt;
  }
  auto newAxis = static_cast<int64_t>(dims.size()) - 1;
  int64_t runBase = view.strides.back();  // the stride of the run's innermost axis
  int64_t runCount = 1, newCount = 1;     // elements of the run so far, of the new axes over it
  for (auto axis = static_cast<int64_t>(oldDims.size()) - 1; axis >= 0; --axis) {
    const auto a = static_cast<size_t>(axis);
    runCount *= oldDims[a];
    const bool runEnds =
        axis == 0 || (oldDims[a - 1] != 1 && view.strides[a - 1] != runCount * runBase);
    if (!runEnds) continue;
    while (newAxis >= 0 && (newCount < runCount || dims[static_cast<size_t>(newAxis)] == 1)) {
      out.strides[static_cast<size_t>(newAxis)] = newCount * runBase;
      newCount *= dims[static_cast<size_t>(newAxis)];
      --newAxis;
    }
    if (newCount != runCount) return std::nullopt;
    if (axis > 0) {
      runBase = view.strides[a - 1];
      runCount = newCount = 1;
    }
  }
  if (newAxis != -1) return std::nullopt;
  return out;
}

// A constant scalar (or one-element) index, as an int64.
std::optional<int64_t> constantIndex(const ir::Value* indices) {
  if (!indices || !indices->constant || indices->constant->elementCount() != 1 ||
      indices->constant->rank() > 1 ||
      (indices->dtype != ir::DType::kInt64 && indices->dtype != ir::DType::kInt32)) {
    return std::nullopt;
  }
  return indices->constant->toInt64Vector()[0];
}

// Whether `node` picks or reorders its input 0's elements without computing any, as a view.
bool isViewOp(const ir::Node* node) {
  if (!node || !node->domain.empty() || !node->input(0)) return false;
  const std::string& op = node->opType;
  if (op == "Gather") return constantIndex(node->input(1)).has_value();
  return op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten" ||
         op == "Transpose" || op == "Split";
}

// `view` (of `node`'s input 0) carried through `node` to its output `output`; nullopt where the
// step is no strided view.
std::optional<StridedView> stepView(const StridedView& view, const ir::Node& node,
                                    const ir::Value* output) {
  const std::string& op = node.opType;
  const auto rank = static_cast<int64_t>(view.dims.size());
  StridedView out = view;
  if (op == "Transpose") {
    std::vector<int64_t> reversed(view.dims.size());
    std::iota(reversed.rbegin(), reversed.rend(), 0);
    auto perm = node.getInts("perm", reversed);
    if (!perm.isOk() || perm->size() != view.dims.size()) return std::nullopt;
    for (size_t j = 0; j < perm->size(); ++j) {
      const int64_t axis = (*perm)[j];
      if (axis < 0 || axis >= rank) return std::nullopt;
      out.dims[j] = view.dims[static_cast<size_t>(axis)];
      out.strides[j] = view.strides[static_cast<size_t>(axis)];
    }
  } else if (op == "Gather" || op == "Split") {
    auto attribute = node.getInt("axis", 0);
    if (!attribute.isOk()) return std::nullopt;
    auto normalized = ir::normalizeAxis(*attribute, rank);
    if (!normalized.isOk()) return std::nullopt;
    const auto axis = static_cast<size_t>(*normalized);
    int64_t first = 0;  // the first element along `axis` that `output` reads
    if (op == "Gather") {
      first = *constantIndex(node.input(1));
      if (first < 0) first += view.dims[axis];
      if (first < 0 || first >= view.dims[axis]) return std::nullopt;
      out.dims[axis] = 1;
      if (node.inputs[1]->constant->rank() == 0) {  // a scalar index drops the axis
        out.dims.erase(out.dims.begin() + *normalized);
        out.strides.erase(out.strides.begin() + *normalized);
      }
    } else {
      size_t k = 0;
      for (; k < node.outputs.size() && node.outputs[k] != output; ++k) {
        const ir::Value* before = node.outputs[k];
        if (!before || !before->hasType || before->shape.rank() != view.dims.size()) {
          return std::nullopt;
        }
        first += before->shape[axis];
      }
      if (k == node.outputs.size() || output->shape.rank() != view.dims.size()) {
        return std::nullopt;
      }
      out.dims[axis] = output->shape[axis];
    }
    out.offset += first * view.strides[axis];
  } else {
    return reshapeView(view, output->shape.dims());
  }
  if (out.dims != output->shape.dims()) return std::nullopt;
  return out;
}

// The views of `value` over each value it is a view of, the first reached by the most steps
// back (through isViewOp nodes) and the last over `value` itself. A step that is no strided view
// of an earlier source (a Reshape that merges axes a Transpose made non-contiguous) ends the
// sources there.
std::vector<StridedView> viewsOf(ir::Value* value) {
  constexpr size_t kMaxSteps = 16;
  std::vector<ir::Value*> chain = {value};  // value, its producer's input, ...
  while (chain.size() < kMaxSteps && isViewOp(chain.back()->producer) &&
         chain.back()->producer->inputs[0]->hasType) {
    chain.push_back(chain.back()->producer->inputs[0]);
  }
  std::vector<StridedView> views;
  for (size_t first = chain.size(); first-- > 0;) {
    std::optional<StridedView> view = wholeOf(chain[first]);
    for (size_t i = first; i-- > 0 && view;) {
      view = stepView(*view, *chain[i]->producer, chain[i]);
    }
    if (view) views.push_back(*view);
  }
  return views;
}

// Whether `view`, of an operand [B, H, S, D] (or with `depthFirst`, K' [B, H, D, S]), reads
// columns [offset, offset + H * D) of its source seen as B * S rows of C columns (C the source's
// last axis), head h in columns offset + [h * D, (h + 1) * D): what the heads form reads.
bool readsHeads(const StridedView& view, bool depthFirst) {
  if (view.dims.size() != 4 || view.source->shape.rank() == 0) return false;
  const int64_t b = view.dims[0], h = view.dims[1];
  const int64_t s = depthFirst ? view.dims[3] : view.dims[2];
  const int64_t d = depthFirst ? view.dims[2] : view.dims[3];
  const int64_t c = view.source->shape.dims().back();
  if (c <= 0 || view.source->shape.elementCount() != b * s * c || view.offset < 0 ||
      view.offset + h * d > c) {
    return false;
  }
  const std::vector<int64_t> expected =
      depthFirst ? std::vector<int64_t>{s * c, d, 1, c} : std::vector<int64_t>{s * c, d, c, 1};
  for (size_t axis = 0; axis < 4; ++axis) {
    // The stride of an axis of size 1 is never used.
    if (view.dims[axis] != 1 && view.strides[axis] != expected[axis]) return false;
  }
  return true;
}

// An operand's views over the sources it reads in heads form (readsHeads).
std::vector<StridedView> headsViews(ir::Value* operand, bool depthFirst) {
  std::vector<StridedView> views = viewsOf(operand);
  std::erase_if(views, [&](const StridedView& view) { return !readsHeads(view, depthFirst); });
  return views;
}

int64_t columns(const StridedView& view) { return view.source->shape.dims().back(); }

// The first (most steps back) of `views` whose source is C = `width` columns read from column 0:
// a source of the plain heads form.
ir::Value* plainSource(const std::vector<StridedView>& views, int64_t width) {
  for (const StridedView& view : views) {
    if (view.offset == 0 && columns(view) == width) return view.source;
  }
  return nullptr;
}

// One source x of 3 * E = 3 * H * D columns that Q, K and V read from columns 0, E and 2 * E (the
// Q, K and V projections side by side): the packed heads form's input; null if there is none.
ir::Value* packedSource(const std::vector<StridedView>& q, const std::vector<StridedView>& k,
                        const std::vector<StridedView>& v, int64_t width) {
  auto reads = [&](const std::vector<StridedView>& views, const ir::Value* x, int64_t offset) {
    return std::any_of(views.begin(), views.end(), [&](const StridedView& view) {
      return view.source == x && view.offset == offset;
    });
  };
  for (const StridedView& view : q) {
    if (view.offset == 0 && columns(view) == 3 * width && reads(k, view.source, width) &&
        reads(v, view.source, 2 * width)) {
      return view.source;
    }
  }
  return nullptr;
}

// Whether `transpose` of y4 [B, H, Sq, Dv] writes y4's elements in [B, Sq, H, Dv] order (its perm
// is [0, 2, 1, 3] once the axes of size 1, which hold no order, are left out).
bool writesHeadsLast(const ir::Node& transpose, const ir::Shape& y4) {
  auto perm = transpose.getInts("perm", {3, 2, 1, 0});
  if (!perm.isOk() || perm->size() != 4) return false;
  std::vector<int64_t> order, expected;
  for (const int64_t axis : *perm) {
    if (axis < 0 || axis >= 4) return false;
    if (y4[static_cast<size_t>(axis)] != 1) order.push_back(axis);
  }
  for (const int64_t axis : {0, 2, 1, 3}) {
    if (y4[static_cast<size_t>(axis)] != 1) expected.push_back(axis);
  }
  return order == expected;
}

struct HeadsMatch {
  ir::Value* q = nullptr;  // sources, [B, S, H * D] after rows3d
  ir::Value* k = nullptr;
  ir::Value* v = nullptr;
  ir::Value* packed = nullptr;  // Q, K and V side by side in one source [B, S, 3 * H * D]
  ir::Node* outputTranspose = nullptr;
  int64_t batch = 0, heads = 0;
};

std::optional<HeadsMatch> matchHeads(const ir::Graph& graph, const ir::Node& attention) {
  if (attention.domain != ir::kKilnDomain || attention.opType != "Attention" ||
      attention.hasAttribute("num_heads") || attention.outputs.size() != 1) {
    return std::nullopt;
  }
  auto transposeK = attention.getInt("transpose_k", 0);
  if (!transposeK.isOk()) return std::nullopt;
  ir::Value* q4 = attention.input(0);
  ir::Value* k4 = attention.input(1);
  ir::Value* v4 = attention.input(2);
  const ir::Value* y4 = attention.outputs[0];
  if (!q4 || !k4 || !v4 || q4->shape.rank() != 4 || k4->shape.rank() != 4 ||
      v4->shape.rank() != 4 || y4->shape.rank() != 4 || graph.isGraphOutput(y4)) {
    return std::nullopt;
  }
  const std::vector<ir::Node*> readers = graph.consumers(y4);
  if (readers.size() != 1 || !isOp(readers[0], "Transpose") ||
      !writesHeadsLast(*readers[0], y4->shape)) {
    return std::nullopt;
  }
  const std::vector<StridedView> q = headsViews(q4, false);
  const std::vector<StridedView> k = headsViews(k4, *transposeK == 0);
  const std::vector<StridedView> v = headsViews(v4, false);
  HeadsMatch match;
  match.outputTranspose = readers[0];
  match.batch = q4->shape[0];
  match.heads = q4->shape[1];
  if (match.batch <= 0 || match.heads <= 0) return std::nullopt;
  const int64_t d = q4->shape[3], dv = v4->shape[3];
  if (dv == d) match.packed = packedSource(q, k, v, match.heads * d);
  if (match.packed) return match;
  match.q = plainSource(q, match.heads * d);
  match.k = plainSource(k, match.heads * d);
  match.v = plainSource(v, match.heads * dv);
  if (!match.q || !match.k || !match.v) return std::nullopt;
  return match;
}

ir::Value* newConstantShape(ir::Graph& graph, const std::string& base, const ir::Shape& shape) {
  return graph.addConstant(base, ir::Tensor::fromVector<int64_t>(
                                     ir::Shape{static_cast<int64_t>(shape.rank())}, shape.dims()));
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
    if (!match || context.route.value(kAttentionHeads, attention) != "on") {
      continue;
    }
    const std::string& name = attention->name;
    const ir::Value* y4 = attention->outputs[0];
    const int64_t dv = y4->shape[3];
    if (match->packed) {
      attention->inputs[0] = reshapeTo(graph, match->packed, rows3d(match->packed, match->batch),
                                       *attention, name + "_qkv");
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
