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
// at least two copies (Gathers and non-identity Transposes); a chain that puts every row back
// where it was becomes a Reshape.
#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kComposeRowMoves = knobs::declareKnob({
    .name = "graph.compose_row_moves",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "compose a chain of Gathers (constant indices), Transposes and reshapes that keep "
            "the last axis whole (Swin's cyclic shift and window partition) into one Gather of "
            "rows",
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

// A node name no node of the graph has, derived from `base`.
std::string uniqueNodeName(const std::unordered_set<std::string>& taken, const std::string& base) {
  std::string name = base;
  for (int i = 1; taken.count(name); ++i) name = base + "_" + std::to_string(i);
  return name;
}

}  // namespace

Status composeRowMoves(ir::Graph& graph, PassContext& context) {
  std::vector<ir::Node*> nodes;
  std::unordered_set<std::string> names;
  for (const auto& node : graph.nodes()) {
    nodes.push_back(node.get());
    names.insert(node->name);
  }
  std::unordered_set<const ir::Node*> inChain, removed;
  static const std::unordered_set<std::string> kRowMoves = {
      "Gather", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};
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
    Rows rows;
    rows.dims.assign(source->shape.dims().begin(), source->shape.dims().end() - 1);
    rows.values.resize(static_cast<size_t>(product(rows.dims)));
    std::iota(rows.values.begin(), rows.values.end(), int64_t{0});
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
    ir::Value* result = last->outputs[0];
    const int64_t rowsIn = product(source->shape.dims(), 0, source->shape.rank() - 1);
    const auto rowsOut = static_cast<int64_t>(rows.values.size());
    std::vector<int64_t> identity(static_cast<size_t>(rowsIn));
    std::iota(identity.begin(), identity.end(), int64_t{0});
    const bool unmoved = rows.values == identity;
    const int opset = graph.opsetImports.count("") ? graph.opsetImports.at("") : 18;
    // A new node before `last` reading `input` and an int64 constant (a Reshape's shape, a
    // Gather's indices), writing one value of the source's type and `shape`.
    auto addMove = [&](const char* op, const std::string& suffix, ir::Value* input,
                       const std::vector<int64_t>& constant, const std::string& constantSuffix,
                       const ir::Shape& shape) {
      ir::Node* node = graph.insertNode(op, last);
      node->name = uniqueNodeName(names, last->name + suffix);
      names.insert(node->name);
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
        flat = addMove("Reshape", "_rows_in", source, flatShape.dims(), "_shape", flatShape)
                   ->outputs[0];
      }
      ir::Node* gather =
          addMove("Gather", "_rows", flat, rows.values, "_indices", ir::Shape({rowsOut, columns}));
      gather->attributes = {{"axis", ir::Attribute{int64_t{0}}}};
      gathered = gather->outputs[0];
    }
    // The last node of the chain becomes the Reshape to the chain's output shape, in place: it
    // keeps its output (and so its readers) and its name.
    last->opType = "Reshape";
    last->domain.clear();
    last->opsetVersion = opset;
    last->attributes.clear();
    last->inputs = {gathered, constantInt64(graph, last->name + "_shape", result->shape.dims())};
    for (ir::Node* node : chain) {
      if (node != last) removed.insert(node);
    }
    context.note("composed {} row moves ({} copies) from '{}' to '{}' into {}", chain.size(),
                 copies, source->name, result->name,
                 unmoved ? "a Reshape (the rows end where they began)" : "one Gather of rows");
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
