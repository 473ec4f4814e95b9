// Fuses ShuffleNet's channel shuffle, with the Concat before it and the Split after it where
// there are, into one kiln.ChannelShuffle (src/kiln/ir/ops/layout.h):
//
//   %x = Concat(%a, %b) {axis}                        (optional)
//   %r = Reshape(%x, [.., g, C / g, ..])              (axis split in two)
//   %t = Transpose(%r) {perm swaps those two axes}
//   %y = Reshape(%t, %x's shape)
//   %p, %q = Split(%y) {axis}                         (optional; equal parts)
//     =>   %p, %q = kiln.ChannelShuffle(%a, %b) {axis, groups=g}
//
// Runs after layout_nhwc, which carries the chain into NHWC (axis 3 of [N,H,W,C] as a 5-D
// Reshape and Transpose), so one step copies each element once instead of the Concat, Transpose
// and Split copying it three times. The Concat and Split join only where the chain alone reads
// or writes them. CPU only: the CUDA backend has no kernel for the op.
#include <unordered_set>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFuseChannelShuffle = knobs::declareKnob({
    .name = "fusion.channel_shuffle",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "replace a channel shuffle (Reshape, Transpose of the two halves of the split axis, "
            "Reshape back), with the Concat before it and the equal Split after it where the "
            "chain alone reads them, by one kiln.ChannelShuffle copy (per node: the "
            "Transpose's name)",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// The only node reading `value`, if it is read once, by one node, and is not a graph output.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value) {
  if (graph.isGraphOutput(value)) return nullptr;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  if (readers.size() != 1) return nullptr;
  int uses = 0;
  for (const ir::Value* input : readers[0]->inputs) uses += input == value ? 1 : 0;
  return uses == 1 ? readers[0] : nullptr;
}

struct Shuffle {
  ir::Node* concat = nullptr;  // optional
  ir::Node* split1 = nullptr;  // the Reshape to [.., g, C / g, ..]
  ir::Node* transpose = nullptr;
  ir::Node* merge = nullptr;  // the Reshape back
  ir::Node* split = nullptr;  // optional
  int64_t axis = 0, groups = 0;
};

// The shuffle whose Transpose is `transpose`, if it is one.
std::optional<Shuffle> matchShuffle(const ir::Graph& graph, ir::Node* transpose) {
  if (!isOp(transpose, "Transpose") || !transpose->input(0) || transpose->outputs.size() != 1) {
    return std::nullopt;
  }
  Shuffle s;
  s.transpose = transpose;
  s.split1 = transpose->inputs[0]->producer;
  if (!isOp(s.split1, "Reshape") || !s.split1->input(0) ||
      soleReader(graph, transpose->inputs[0]) != transpose) {
    return std::nullopt;
  }
  s.merge = soleReader(graph, transpose->outputs[0]);
  if (!isOp(s.merge, "Reshape") || s.merge->inputs[0] != transpose->outputs[0]) {
    return std::nullopt;
  }
  const ir::Value* x = s.split1->inputs[0];
  const ir::Value* r = s.split1->outputs[0];
  const ir::Value* y = s.merge->outputs[0];
  const ir::Shape& xs = x->shape;
  const ir::Shape& rs = r->shape;
  if (y->shape != xs || y->dtype != x->dtype || rs.rank() != xs.rank() + 1) return std::nullopt;
  // The axis split in two: the dims before and after it unchanged.
  size_t a = 0;
  while (a < xs.rank() && xs[a] == rs[a]) ++a;
  if (a >= xs.rank() || rs[a] * rs[a + 1] != xs[a] || rs[a] < 2 || rs[a + 1] < 2) {
    return std::nullopt;
  }
  for (size_t d = a + 1; d < xs.rank(); ++d) {
    if (xs[d] != rs[d + 1]) return std::nullopt;
  }
  // The Transpose swaps exactly those two axes.
  auto perm = transpose->getInts("perm", {});
  if (!perm.isOk() || perm->size() != rs.rank()) return std::nullopt;
  for (size_t d = 0; d < perm->size(); ++d) {
    const auto expected = static_cast<int64_t>(d == a ? a + 1 : d == a + 1 ? a : d);
    if ((*perm)[d] != expected) return std::nullopt;
  }
  s.axis = static_cast<int64_t>(a);
  s.groups = rs[a];
  // The Concat before, along the axis, read by the chain alone.
  ir::Node* concat = x->producer;
  if (isOp(concat, "Concat") && concat->outputs.size() == 1 && soleReader(graph, x) == s.split1) {
    auto axis = concat->getInt("axis", 0);
    const auto rank = static_cast<int64_t>(xs.rank());
    bool inputs = !concat->inputs.empty();
    for (const ir::Value* input : concat->inputs) inputs = inputs && input && !input->constant;
    if (inputs && axis.isOk() && (*axis == s.axis || *axis + rank == s.axis)) s.concat = concat;
  }
  // The Split after, along the axis, into equal parts, the chain its only input.
  ir::Node* split = soleReader(graph, y);
  if (isOp(split, "Split") && split->inputs[0] == y) {
    auto axis = split->getInt("axis", 0);
    const auto rank = static_cast<int64_t>(xs.rank());
    bool equal = axis.isOk() && (*axis == s.axis || *axis + rank == s.axis);
    for (const ir::Value* out : split->outputs) {
      equal = equal && out && out->shape[a] * static_cast<int64_t>(split->outputs.size()) == xs[a];
    }
    if (equal) s.split = split;
  }
  return s;
}

}  // namespace

Status fuseChannelShuffle(ir::Graph& graph, PassContext& context) {
  if (context.backend != "cpu") return Status::ok();
  std::unordered_set<const ir::Node*> removed;
  std::vector<ir::Node*> candidates;
  for (const auto& node : graph.nodes()) candidates.push_back(node.get());
  for (ir::Node* node : candidates) {
    if (removed.count(node) || !isOp(node, "Transpose")) continue;
    std::optional<Shuffle> s = matchShuffle(graph, node);
    if (!s || !context.route.isOn(kFuseChannelShuffle, node)) continue;
    if ((s->concat && removed.count(s->concat)) || (s->split && removed.count(s->split))) continue;
    // In the first node's place: its inputs exist there, and the outputs' readers come later.
    ir::Node* first = s->concat ? s->concat : s->split1;
    ir::Node* shuffle = graph.insertNode("ChannelShuffle", first);
    shuffle->name = node->name;
    shuffle->domain = ir::kKilnDomain;
    shuffle->opsetVersion = 1;
    shuffle->attributes["axis"] = ir::Attribute{s->axis};
    shuffle->attributes["groups"] = ir::Attribute{s->groups};
    shuffle->inputs = s->concat ? s->concat->inputs : std::vector<ir::Value*>{s->split1->inputs[0]};
    shuffle->outputs = s->split ? s->split->outputs : s->merge->outputs;
    for (ir::Value* out : shuffle->outputs) out->producer = shuffle;
    for (ir::Node* old : {s->concat, s->split1, s->transpose, s->merge, s->split}) {
      if (old) removed.insert(old);
    }
    context.note("channel shuffle '{}' ({} groups{}{}) is one kiln.ChannelShuffle", node->name,
                 s->groups, s->concat ? ", with Concat '" + s->concat->name + "'" : "",
                 s->split ? ", with Split '" + s->split->name + "'" : "");
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  if (!removed.empty()) graph.removeUnusedValues();
  return Status::ok();
}

}  // namespace kiln::passes
