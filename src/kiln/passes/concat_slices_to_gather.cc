// Rewrites a Concat whose inputs are all Slices of one tensor along the Concat's axis (torch.roll
// as exported: the tail of x, then its head) into one Gather with constant indices, and removes
// it when the pieces put the tensor back together in order.
//
//   %a = Slice(%x, [5], [7], [1]); %b = Slice(%x, [0], [5], [1])
//   %r = Concat "cat" (%a, %b) {axis=1}
//     =>   %r = Gather "cat" (%x, const [5,6,0,1,2,3,4]) {axis=1}
//
// A Slice is absorbed only when the Concat is its one reader: a Slice that something else also
// reads would have to stay, and the Gather would then copy its elements a second time.
#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_set>

#include "kiln/passes/passes.h"
#include "kiln/passes/slices.h"

namespace kiln::passes {

const knobs::Knob kConcatSlicesToGather = knobs::declareKnob({
    .name = "graph.concat_slices_to_gather",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "rewrite a Concat of Slices of one tensor along one axis (torch.roll) as one Gather",
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

std::vector<int64_t> iota(int64_t count) {
  std::vector<int64_t> values(static_cast<size_t>(count));
  std::iota(values.begin(), values.end(), int64_t{0});
  return values;
}

// The tensor `value` is a Slice of, or null.
ir::Value* sliceSource(const ir::Value* value) {
  return value && isOp(value->producer, "Slice") ? value->producer->input(0) : nullptr;
}

// Only `reader` reads `value`, and `value` is no graph output.
bool readOnlyBy(const ir::Graph& graph, const ir::Value* value, const ir::Node* reader) {
  if (graph.isGraphOutput(value)) return false;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  return std::all_of(readers.begin(), readers.end(),
                     [&](const ir::Node* node) { return node == reader; });
}

// The positions along `axis` of `data` that `slice` takes, when it takes every element along
// every other axis it lists.
std::optional<std::vector<int64_t>> slicePositions(const ir::Node& slice, const ir::Value& data,
                                                   int64_t axis) {
  auto parameters = sliceParameters(slice);
  if (!parameters) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(data.shape.rank());
  std::vector<int64_t> positions = iota(data.shape[axis]);  // an axis not listed is taken whole
  std::unordered_set<int64_t> seen;
  for (size_t i = 0; i < parameters->axes.size(); ++i) {
    auto listed = ir::normalizeAxis(parameters->axes[i], rank);
    if (!listed.isOk() || !seen.insert(*listed).second) return std::nullopt;
    const int64_t dim = data.shape[*listed];
    if (parameters->steps[i] == 0) return std::nullopt;
    std::vector<int64_t> selected =
        selectedPositions(dim, parameters->starts[i], parameters->ends[i], parameters->steps[i]);
    if (*listed == axis) {
      positions = std::move(selected);
    } else if (selected != iota(dim)) {
      return std::nullopt;  // it also cuts another axis: no Gather along one axis does that
    }
  }
  return positions;
}

// What replaces a matched Concat: a Gather of `data` at `indices` along `axis`, and the Slices
// it absorbs.
struct Rewrite {
  ir::Value* data = nullptr;
  int64_t axis = 0;
  std::vector<int64_t> indices;
  std::vector<ir::Node*> slices;
};

std::optional<Rewrite> matchConcat(const ir::Graph& graph, ir::Node& concat) {
  if (!isOp(&concat, "Concat") || concat.inputs.size() < 2 || concat.outputs.size() != 1 ||
      !concat.outputs[0] || !concat.outputs[0]->hasType) {
    return std::nullopt;
  }
  Rewrite rewrite;
  // The tensor every input is, or is a Slice of: what the first input slices, else the first
  // input itself (which may be a Slice's output too).
  for (ir::Value* candidate : {sliceSource(concat.inputs[0]), concat.inputs[0]}) {
    if (candidate && std::all_of(concat.inputs.begin(), concat.inputs.end(), [&](ir::Value* in) {
          return in == candidate || (in && sliceSource(in) == candidate);
        })) {
      rewrite.data = candidate;
      break;
    }
  }
  if (!rewrite.data) return std::nullopt;
  const ir::Value& data = *rewrite.data;
  if (!data.hasType || data.shape.rank() == 0) return std::nullopt;
  auto axis = concat.getInt("axis", 0);
  if (!axis.isOk()) return std::nullopt;
  auto normalized = ir::normalizeAxis(*axis, static_cast<int64_t>(data.shape.rank()));
  if (!normalized.isOk() || data.shape[*normalized] <= 0) return std::nullopt;
  rewrite.axis = *normalized;
  for (ir::Value* input : concat.inputs) {
    if (input == rewrite.data) {
      const std::vector<int64_t> whole = iota(data.shape[rewrite.axis]);
      rewrite.indices.insert(rewrite.indices.end(), whole.begin(), whole.end());
      continue;
    }
    ir::Node* slice = input->producer;
    if (!readOnlyBy(graph, input, &concat)) return std::nullopt;
    auto positions = slicePositions(*slice, data, rewrite.axis);
    if (!positions) return std::nullopt;
    rewrite.indices.insert(rewrite.indices.end(), positions->begin(), positions->end());
    if (std::find(rewrite.slices.begin(), rewrite.slices.end(), slice) == rewrite.slices.end()) {
      rewrite.slices.push_back(slice);
    }
  }
  // A Concat of copies of `data` alone is no roll, and already one copy.
  if (rewrite.slices.empty()) return std::nullopt;
  // Shape inference gave the Concat the same length; anything else is a mismatch to leave alone.
  const ir::Shape& shape = concat.outputs[0]->shape;
  if (rewrite.indices.empty() || shape.rank() != data.shape.rank() ||
      shape[rewrite.axis] != static_cast<int64_t>(rewrite.indices.size())) {
    return std::nullopt;
  }
  return rewrite;
}

// Points the readers of the Concat's output at `data`, as eliminate_identity does. A graph output
// keeps its name: `data` takes it over, unless `data` is itself visible (a graph input, a constant
// or another output), which would change the model's interface.
bool bypass(ir::Graph& graph, ir::Value* output, ir::Value* data) {
  if (graph.isGraphOutput(output)) {
    if (!data->producer || graph.isGraphOutput(data)) return false;
    const std::string name = output->name;
    graph.renameValue(output, name + ".removed");
    graph.renameValue(data, name);
  }
  graph.replaceAllUses(output, data);
  return true;
}

}  // namespace

Status concatSlicesToGather(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  std::vector<ir::Node*> nodes;
  for (const auto& node : graph.nodes()) nodes.push_back(node.get());
  // Matched and rewritten in node order, so a Concat that slices an earlier, bypassed Concat's
  // output already reads the tensor that replaced it.
  for (ir::Node* concat : nodes) {
    auto rewrite = matchConcat(graph, *concat);
    if (!rewrite) continue;
    const std::string dataName = rewrite->data->name;
    const bool identity =
        rewrite->indices == iota(static_cast<int64_t>(rewrite->indices.size())) &&
        static_cast<int64_t>(rewrite->indices.size()) == rewrite->data->shape[rewrite->axis];
    if (identity && bypass(graph, concat->outputs[0], rewrite->data)) {
      removed.insert(concat);
      context.note("removed Concat '{}': its {} inputs put '{}' back together in order",
                   concat->name, concat->inputs.size(), dataName);
    } else {
      const int64_t count = static_cast<int64_t>(rewrite->indices.size());
      ir::Value* indices =
          graph.addConstant(concat->name + "_indices",
                            ir::Tensor::fromVector<int64_t>(ir::Shape{count}, rewrite->indices));
      context.note("rewrote Concat '{}' of {} slices of '{}' as Gather", concat->name,
                   concat->inputs.size(), dataName);
      // In place: the node keeps its name (per-node knobs naming it still apply), its output and
      // its position, which follows the producer of `data`.
      concat->opType = "Gather";
      concat->inputs = {rewrite->data, indices};
      concat->attributes = {{"axis", ir::Attribute{rewrite->axis}}};
    }
    removed.insert(rewrite->slices.begin(), rewrite->slices.end());
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
