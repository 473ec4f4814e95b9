// Composes a chain of data movements that never split the last axis into one Gather of whole
// rows. Swin's shifted windows are the case in point: torch.roll on the two spatial axes (two
// Gathers once concat_slices_to_gather has run), then the window partition (Reshape, Transpose,
// Reshape), and after attention the reverse (Reshape, Transpose, Reshape, two Gathers) - three
// copies of the activations each way, where every element of a channel row moves with its row.
// The pass follows the row indices through the chain at build time and leaves one copy:
//
//   %r = Gather(%x, [6 roll indices]) {axis=1}; %s = Gather(%r, [...]) {axis=2}
//   %v = Reshape(%s, [B,8,7,8,7,C]); %t = Transpose(%v) {perm=[0,1,3,2,4,5]}
//   %y = Reshape(%t, [B*64,49,C])
//     =>   %x2 = Reshape(%x, [B*56*56, C]); %g = Gather(%x2, const map) {axis=0}
//          %y = Reshape(%g, [B*64,49,C])
//
// A chain is a run of nodes, each the one reader of the one before's output (which is no graph
// output), each one of: Gather with constant indices along an axis other than the last,
// Transpose that keeps the last axis last, and Reshape, Flatten, Squeeze, Unsqueeze or Identity
// that keep the last dimension (which, row-major, keeps every row whole). Rewritten when it holds
// at least two copies (Gathers, Slices that select and non-identity Transposes); a chain that
// puts every row back where it was becomes a Reshape. Slices count as row moves when their
// starts, ends, axes and steps are constants and they keep the last axis whole.
//
// A Concat along the last axis whose parts all come from one tensor through row moves only it
// reads is one Gather too (graph.compose_row_moves.concats): viewed as rows of the tensor's
// width, it interleaves its parts' rows. Swin's patch merging (x[..., 0::2, 0::2, :] and its
// three siblings, as six Slices, concatenated along the channels) is the case in point.
#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_set>

#include "kiln/passes/node_names.h"
#include "kiln/passes/passes.h"
#include "kiln/passes/slices.h"

namespace kiln::passes {

const knobs::Knob kComposeRowMoves = knobs::declareKnob({
    .name = "graph.compose_row_moves",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "compose a chain of Gathers (constant indices), Transposes and reshapes that keep "
            "the last axis whole (Swin's cyclic shift and window partition) into one Gather of "
            "rows",
});

const knobs::Knob kComposeConcatsOfRows = knobs::declareKnob({
    .name = "graph.compose_row_moves.concats",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "with graph.compose_row_moves, also a Concat along the last axis of parts that are "
            "row moves of one tensor (Swin's patch merging: six Slices and a Concat) into one "
            "Gather of rows",
});

namespace {

// Chains over more rows than this are left alone: the pass's index arithmetic and the Gather's
// index constant (8 bytes a row) grow with them.
constexpr int64_t kMaxRows = int64_t{1} << 22;

// The row indices of a tensor whose last axis is left out: element i of `values` names the row
// of the chain's input that row i holds.
struct Rows {
  std::vector<int64_t> dims;
  std::vector<int64_t> values;
};

int64_t product(const std::vector<int64_t>& dims, size_t first = 0, size_t last = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = first; i < std::min(last, dims.size()); ++i) p *= dims[i];
  return p;
}

bool staticShape(const ir::Value* value) {
  if (!value || !value->hasType || value->shape.rank() == 0) return false;
  const auto& dims = value->shape.dims();
  return std::all_of(dims.begin(), dims.end(), [](int64_t d) { return d >= 0; });
}

// The rows of `value` (static, rank 1 or more) where they are: row i holds row i.
Rows identityRows(const ir::Value& value) {
  Rows rows;
  rows.dims.assign(value.shape.dims().begin(), value.shape.dims().end() - 1);
  rows.values.resize(static_cast<size_t>(product(rows.dims)));
  std::iota(rows.values.begin(), rows.values.end(), int64_t{0});
  return rows;
}

Rows transposeRows(const Rows& in, const std::vector<int64_t>& perm) {
  const size_t rank = in.dims.size();
  Rows out;
  for (int64_t axis : perm) out.dims.push_back(in.dims[static_cast<size_t>(axis)]);
  out.values.resize(in.values.size());
  std::vector<int64_t> inStrides(rank, 1);
  for (size_t i = rank; i-- > 1;) inStrides[i - 1] = inStrides[i] * in.dims[i];
  std::vector<int64_t> index(rank, 0);  // over the output
  for (size_t flat = 0; flat < out.values.size(); ++flat) {
    int64_t source = 0;
    for (size_t axis = 0; axis < rank; ++axis) {
      source += index[axis] * inStrides[static_cast<size_t>(perm[axis])];
    }
    out.values[flat] = in.values[static_cast<size_t>(source)];
    for (size_t axis = rank; axis-- > 0;) {
      if (++index[axis] < out.dims[axis]) break;
      index[axis] = 0;
    }
  }
  return out;
}

Rows gatherRows(const Rows& in, size_t axis, const std::vector<int64_t>& indices,
                const std::vector<int64_t>& indexDims) {
  Rows out;
  out.dims.assign(in.dims.begin(), in.dims.begin() + static_cast<std::ptrdiff_t>(axis));
  out.dims.insert(out.dims.end(), indexDims.begin(), indexDims.end());
  out.dims.insert(out.dims.end(), in.dims.begin() + static_cast<std::ptrdiff_t>(axis) + 1,
                  in.dims.end());
  const int64_t outer = product(in.dims, 0, axis);
  const int64_t inner = product(in.dims, axis + 1);
  const int64_t dim = in.dims[axis];
  out.values.reserve(static_cast<size_t>(outer) * indices.size() * static_cast<size_t>(inner));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t index : indices) {
      const int64_t at = (o * dim + index) * inner;
      out.values.insert(out.values.end(), in.values.begin() + at, in.values.begin() + at + inner);
    }
  }
  return out;
}

// The rows after `node`, which reads them as input 0 (a tensor whose last axis has `columns`
// elements), or nothing when `node` is not a row move. `copies` says whether it copies.
std::optional<Rows> applyRowMove(const ir::Node& node, const Rows& rows, int64_t columns,
                                 bool& copies) {
  if (!node.domain.empty() || node.outputs.size() != 1 || !staticShape(node.outputs[0]) ||
      !staticShape(node.input(0)) || node.input(0)->shape.dims().back() != columns ||
      node.outputs[0]->shape.dims().back() != columns) {
    return std::nullopt;
  }
  const auto& outDims = node.outputs[0]->shape.dims();
  const std::vector<int64_t> outRows(outDims.begin(), outDims.end() - 1);
  const std::string& op = node.opType;
  if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" ||
      op == "Identity") {
    // Row-major, a reshape that keeps the last dimension keeps every row whole.
    if (product(outRows) != static_cast<int64_t>(rows.values.size())) return std::nullopt;
    copies = false;
    return Rows{outRows, rows.values};
  }
  const size_t rank = rows.dims.size() + 1;
  if (op == "Transpose") {
    std::vector<int64_t> perm(rank);
    std::iota(perm.rbegin(), perm.rend(), int64_t{0});  // the default reverses the axes
    if (node.hasAttribute("perm")) {
      auto given = node.getInts("perm");
      if (!given.isOk() || given->size() != rank) return std::nullopt;
      perm = *given;
    }
    if (perm.back() != static_cast<int64_t>(rank) - 1) return std::nullopt;
    perm.pop_back();
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] != static_cast<int64_t>(i)) return std::nullopt;
    }
    copies = !std::is_sorted(perm.begin(), perm.end());
    Rows out = transposeRows(rows, perm);
    if (out.dims != outRows) return std::nullopt;
    return out;
  }
  if (op == "Slice") {
    // Every axis but the last selects rows; the last must be kept whole. Opset 10 on only: the
    // attribute form of older Slices is not taken.
    std::optional<SliceParameters> p =
        node.opsetVersion >= 10 ? sliceParameters(node) : std::nullopt;
    if (!p) return std::nullopt;
    Rows out = rows;
    copies = false;
    std::vector<bool> seen(rank, false);
    for (size_t k = 0; k < p->starts.size(); ++k) {
      auto axis = ir::normalizeAxis(p->axes[k], static_cast<int64_t>(rank));
      const int64_t step = p->steps[k];
      if (!axis.isOk() || seen[static_cast<size_t>(*axis)] || step == 0) return std::nullopt;
      seen[static_cast<size_t>(*axis)] = true;
      const bool last = *axis == static_cast<int64_t>(rank) - 1;
      const int64_t dim = last ? columns : out.dims[static_cast<size_t>(*axis)];
      std::vector<int64_t> indices = selectedPositions(dim, p->starts[k], p->ends[k], step);
      const bool whole = static_cast<int64_t>(indices.size()) == dim &&
                         (dim == 0 || (indices.front() == 0 && step == 1));
      if (last) {
        if (!whole) return std::nullopt;  // the rows themselves are cut
        continue;
      }
      if (whole) continue;
      copies = true;
      const auto count = static_cast<int64_t>(indices.size());
      out = gatherRows(out, static_cast<size_t>(*axis), indices, {count});
    }
    if (out.dims != outRows) return std::nullopt;
    return out;
  }
  if (op == "Gather") {
    auto axis = node.getInt("axis", 0);
    if (!axis.isOk()) return std::nullopt;
    auto normalized = ir::normalizeAxis(*axis, static_cast<int64_t>(rank));
    if (!normalized.isOk() || *normalized == static_cast<int64_t>(rank) - 1) return std::nullopt;
    const ir::Value* indexValue = node.input(1);
    if (!indexValue || !indexValue->constant ||
        (indexValue->dtype != ir::DType::kInt64 && indexValue->dtype != ir::DType::kInt32)) {
      return std::nullopt;
    }
    std::vector<int64_t> indices = indexValue->constant->toInt64Vector();
    const int64_t dim = rows.dims[static_cast<size_t>(*normalized)];
    for (int64_t& index : indices) {
      if (index < 0) index += dim;
      if (index < 0 || index >= dim) return std::nullopt;  // the kernels' error to report
    }
    copies = true;
    Rows out = gatherRows(rows, static_cast<size_t>(*normalized), indices,
                          indexValue->constant->shape().dims());
    if (out.dims != outRows) return std::nullopt;
    return out;
  }
  return std::nullopt;
}

ir::Value* constantInt64(ir::Graph& graph, const std::string& base,
                         const std::vector<int64_t>& values) {
  const auto count = static_cast<int64_t>(values.size());
  return graph.addConstant(base, ir::Tensor::fromVector<int64_t>(ir::Shape{count}, values));
}

// Makes `last` (a node whose output `result` holds rows of `source`'s last axis, `columns` wide)
// the Reshape of one Gather of the rows `rows` names from `source` (read as [rows, columns]),
// or the Reshape of `source` itself where the rows are where they began. The new nodes go before
// `last`, named after it; `last` keeps its output (so its readers) and its name. Says which.
const char* rewriteAsRowGather(ir::Graph& graph, NodeNames& names, ir::Value* source,
                               int64_t columns, const std::vector<int64_t>& rows, ir::Node* last) {
  ir::Value* result = last->outputs[0];
  const int64_t rowsIn = product(source->shape.dims(), 0, source->shape.rank() - 1);
  const auto rowsOut = static_cast<int64_t>(rows.size());
  const bool unmoved = rows == identityRows(*source).values;
  const int opset = graph.opsetImports.count("") ? graph.opsetImports.at("") : 18;
  // A new node before `last` reading `input` and an int64 constant (a Reshape's shape, a
  // Gather's indices), writing one value of the source's type and `shape`.
  auto addMove = [&](const char* op, const std::string& suffix, ir::Value* input,
                     const std::vector<int64_t>& constant, const std::string& constantSuffix,
                     const ir::Shape& shape) {
    ir::Node* node = graph.insertNode(op, last);
    node->name = names.take(last->name + suffix);
    node->opsetVersion = opset;
    ir::Value* out = graph.addUniqueValue(node->name + "_output");
    out->dtype = source->dtype;
    out->shape = shape;
    out->hasType = true;
    out->producer = node;
    node->inputs = {input, constantInt64(graph, node->name + constantSuffix, constant)};
    node->outputs = {out};
    return node;
  };
  ir::Value* gathered = source;
  if (!unmoved) {
    // Reshape to [rows, columns] (unless it is already), then the one Gather of rows.
    ir::Value* flat = source;
    const ir::Shape flatShape({rowsIn, columns});
    if (source->shape != flatShape) {
      flat =
          addMove("Reshape", "_rows_in", source, flatShape.dims(), "_shape", flatShape)->outputs[0];
    }
    ir::Node* gather =
        addMove("Gather", "_rows", flat, rows, "_indices", ir::Shape({rowsOut, columns}));
    gather->attributes = {{"axis", ir::Attribute{int64_t{0}}}};
    gathered = gather->outputs[0];
  }
  last->opType = "Reshape";
  last->domain.clear();
  last->opsetVersion = opset;
  last->attributes.clear();
  last->inputs = {gathered, constantInt64(graph, last->name + "_shape", result->shape.dims())};
  return unmoved ? "a Reshape (the rows end where they began)" : "one Gather of rows";
}

const std::unordered_set<std::string> kRowMoves = {"Gather",  "Slice",   "Transpose", "Reshape",
                                                   "Flatten", "Squeeze", "Unsqueeze", "Identity"};

// Concats along the last axis whose parts are each rows of one source, moved by row moves the
// Concat alone reads (Swin's patch merging: x[..., 0::2, 0::2, :] and its three siblings, six
// Slices in all, concatenated along the channels): viewed as rows of the source's width, the
// Concat interleaves its parts' rows, so the whole is one Gather of rows.
void composeConcatsOfRows(ir::Graph& graph, PassContext& context, NodeNames& names) {
  std::vector<ir::Node*> concats;
  for (const auto& node : graph.nodes()) {
    if (node->opType == "Concat" && node->domain.empty()) concats.push_back(node.get());
  }
  std::unordered_set<const ir::Node*> removed;
  for (ir::Node* concat : concats) {
    if (concat->inputs.size() < 2 || concat->outputs.size() != 1 ||
        !staticShape(concat->outputs[0]) || !staticShape(concat->input(0))) {
      continue;
    }
    const auto rank = static_cast<int64_t>(concat->outputs[0]->shape.rank());
    auto axis = concat->getInt("axis", 0);
    if (!axis.isOk() || rank < 2) continue;
    auto normalized = ir::normalizeAxis(*axis, rank);
    if (!normalized.isOk() || *normalized != rank - 1) continue;
    const ir::Shape& partShape = concat->input(0)->shape;
    const int64_t columns = partShape.dims().back();
    bool ok = true;
    for (const ir::Value* part : concat->inputs) ok = ok && part && part->shape == partShape;
    if (!ok || columns <= 0) continue;
    // Each part back to the first value no row move made: the source, the same for all.
    ir::Value* source = nullptr;
    std::vector<std::vector<ir::Node*>> paths;
    std::unordered_set<const ir::Node*> members;
    for (ir::Value* part : concat->inputs) {
      std::vector<ir::Node*> path;
      ir::Value* at = part;
      while (at->producer && at->producer->domain.empty() &&
             kRowMoves.count(at->producer->opType) && at->producer->outputs.size() == 1 &&
             at->producer->input(0) && !removed.count(at->producer)) {
        path.insert(path.begin(), at->producer);
        at = at->producer->input(0);
      }
      if (source && at != source) ok = false;
      source = at;
      members.insert(path.begin(), path.end());
      paths.push_back(std::move(path));
    }
    if (!ok || !staticShape(source) || source->shape.dims().back() != columns ||
        source->shape.elementCount() / columns > kMaxRows) {
      continue;
    }
    // Every value on the way is read by the Concat's own moves alone.
    for (const ir::Node* node : members) {
      const ir::Value* out = node->outputs[0];
      if (graph.isGraphOutput(out)) ok = false;
      for (const ir::Node* reader : graph.consumers(out)) {
        if (reader != concat && !members.count(reader)) ok = false;
      }
    }
    if (!ok) continue;
    // The rows of each part, then the Concat's as [part rows..., parts].
    std::vector<Rows> parts;
    int copies = 1;  // the Concat's
    std::unordered_set<const ir::Node*> counted;
    for (const std::vector<ir::Node*>& path : paths) {
      Rows rows = identityRows(*source);
      for (const ir::Node* node : path) {
        bool copying = false;
        std::optional<Rows> next = applyRowMove(*node, rows, columns, copying);
        if (!next) {
          ok = false;
          break;
        }
        rows = std::move(*next);
        if (copying && counted.insert(node).second) ++copies;
      }
      if (!ok) break;
      parts.push_back(std::move(rows));
    }
    if (!ok || copies < 2) continue;
    std::vector<int64_t> values;
    values.reserve(parts[0].values.size() * parts.size());
    for (size_t r = 0; r < parts[0].values.size(); ++r) {
      for (const Rows& part : parts) values.push_back(part.values[r]);
    }
    const char* into = rewriteAsRowGather(graph, names, source, columns, values, concat);
    removed.insert(members.begin(), members.end());
    context.note(
        "composed a Concat of {} parts along the last axis and its {} row moves from "
        "'{}' into {}",
        paths.size(), members.size(), source->name, into);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
}

}  // namespace

Status composeRowMoves(ir::Graph& graph, PassContext& context) {
  std::vector<ir::Node*> nodes;
  NodeNames names(graph);
  for (const auto& node : graph.nodes()) nodes.push_back(node.get());
  std::unordered_set<const ir::Node*> inChain, removed;
  for (ir::Node* first : nodes) {
    if (inChain.count(first) || !first->domain.empty() || !kRowMoves.count(first->opType) ||
        !staticShape(first->input(0)) ||
        first->input(0)->shape.elementCount() /
                std::max<int64_t>(1, first->input(0)->shape.dims().back()) >
            kMaxRows) {
      continue;
    }
    ir::Value* source = first->input(0);
    const int64_t columns = source->shape.dims().back();
    Rows rows = identityRows(*source);
    std::vector<ir::Node*> chain;
    int copies = 0;
    for (ir::Node* node = first; node;) {
      bool copying = false;
      std::optional<Rows> next = applyRowMove(*node, rows, columns, copying);
      if (!next) break;
      rows = std::move(*next);
      chain.push_back(node);
      copies += copying ? 1 : 0;
      // The chain goes on into the one reader of this output, if it reads it as its data.
      ir::Value* out = node->outputs[0];
      const std::vector<ir::Node*> readers = graph.consumers(out);
      node = readers.size() == 1 && !graph.isGraphOutput(out) && readers[0]->input(0) == out &&
                     std::count(readers[0]->inputs.begin(), readers[0]->inputs.end(), out) == 1
                 ? readers[0]
                 : nullptr;
    }
    inChain.insert(chain.begin(), chain.end());
    if (copies < 2) continue;

    ir::Node* last = chain.back();
    const std::string resultName = last->outputs[0]->name;
    const char* into = rewriteAsRowGather(graph, names, source, columns, rows.values, last);
    for (ir::Node* node : chain) {
      if (node != last) removed.insert(node);
    }
    context.note("composed {} row moves ({} copies) from '{}' to '{}' into {}", chain.size(),
                 copies, source->name, resultName, into);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  if (context.route.value(kComposeConcatsOfRows) == "on")
    composeConcatsOfRows(graph, context, names);
  return Status::ok();
}

}  // namespace kiln::passes
