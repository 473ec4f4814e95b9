// Dissolves a Concat along the channels into the convolutions that read it, so the concatenated
// tensor is never written (SqueezeNet's fire modules, Inception-style branches):
//
//   %x = Concat(%a, %b) {axis=1}; %y = Conv(%x, %w, %bias)
//     =>   %ya = Conv(%a, %w[:, :Ca], %bias); %yb = Conv(%b, %w[:, Ca:]); %y = Add(%yb, %ya)
//
// A convolution with one group is linear in its input channels, so it is the sum of one
// convolution per part over that part's slice of the weight. fuse_conv_activation then takes the
// Add (and an activation after it) into one part, the other its residual, so each part is one layer
// and the copy the Concat made is gone. A per-channel pool between the Concat and the
// convolutions (MaxPool, AveragePool and their global forms) moves before the Concat first:
//
//   %x = Concat(%a, %b) {axis=1}; %p = MaxPool(%x)   =>   %p = Concat(MaxPool(%a), MaxPool(%b))
//
// and the smaller Concat then dissolves the same way. The Concat goes only when every reader is
// such a convolution (and it is not a graph output); its parts number 2 to kMaxParts with at least
// kMinPartChannels channels each, so every part keeps enough channels to run at speed. The sums
// run in another order than the single convolution's: results differ in the last bits.
//
// Cost: each part after the first reads and writes the convolution's output once more, where the
// Concat read and wrote the concatenated tensor once. With the default `cheaper` the Concat goes
// only when that extra traffic (the readers' output elements times parts - 1) is at most the
// Concat's own elements: a fire module's squeeze convolution (16 channels out of 128) splits,
// SqueezeNet's classifier (1000 channels out of 512) keeps its Concat, where splitting cost
// 0.60 ms against 0.48 + 0.03 ms at 2 threads. `always` skips the check; `off` keeps every Concat.
//
// Why: on the CPU a Concat is a pass over memory that computes nothing, and with two threads it
// reads what the other core's convolution left in that core's cache (SqueezeNet 1.1 at 2 threads:
// its Concats took three times as long as at 1). CPU only: on the GPU the copy is cheap next to
// another launch per part.
#include <algorithm>
#include <unordered_set>

#include "kiln/passes/conv_weights.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kDissolveChannelConcat = knobs::declareKnob({
    .name = "fusion.concat_into_conv",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"off", "cheaper", "always"},
    .defaultValue = "cheaper",
    .help = "dissolve a channel Concat that only convolutions read (directly or through a "
            "per-channel pool, which moves before it) into one convolution per part summed "
            "through residual Adds, so the concatenated tensor is never written; 2 to 4 parts "
            "of at least 16 channels; cheaper: only when the sums move fewer elements than the "
            "Concat copied (per node: the Concat's name; sums in another order)",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

constexpr size_t kMaxParts = 4;
constexpr int64_t kMinPartChannels = 16;

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// A Concat along axis 1 of an [N, C, spatial...] tensor, of 2..kMaxParts typed, non-constant
// parts of at least kMinPartChannels channels each.
bool isChannelConcat(const ir::Node& node) {
  if (!isOp(&node, "Concat") || node.outputs.size() != 1 || !node.outputs[0]) return false;
  const ir::Value* out = node.outputs[0];
  if (!out->hasType || out->shape.rank() < 3 || !isFoldableFloat(out->dtype)) return false;
  auto axis = node.getInt("axis", 0);
  if (!axis.isOk()) return false;
  auto normalized = ir::normalizeAxis(*axis, static_cast<int64_t>(out->shape.rank()));
  if (!normalized.isOk() || *normalized != 1) return false;
  if (node.inputs.size() < 2 || node.inputs.size() > kMaxParts) return false;
  for (const ir::Value* part : node.inputs) {
    if (!part || !part->hasType || part->constant || part->shape.rank() != out->shape.rank() ||
        part->shape[1] < kMinPartChannels) {
      return false;
    }
  }
  return true;
}

// A Conv with one group whose input 0 (only) is `x` and whose weight is a constant
// [M, C, k...] over x's C channels.
bool splittableConv(const ir::Node& node, const ir::Value* x) {
  if (!isOp(&node, "Conv") || node.inputs.size() < 2 || node.inputs[0] != x) return false;
  for (size_t i = 1; i < node.inputs.size(); ++i) {
    if (node.inputs[i] == x) return false;
  }
  if (node.outputs.size() != 1 || !node.outputs[0]) return false;
  auto group = node.getInt("group", 1);
  const ir::Value* w = node.inputs[1];
  return group.isOk() && *group == 1 && w && w->constant && w->dtype == x->dtype &&
         w->shape.rank() == x->shape.rank() && w->shape[1] == x->shape[1];
}

bool allReadersSplittable(const ir::Graph& graph, const ir::Value* x) {
  if (graph.isGraphOutput(x)) return false;
  const std::vector<ir::Node*> readers = graph.consumers(x);
  if (readers.empty()) return false;
  return std::all_of(readers.begin(), readers.end(),
                     [&](const ir::Node* reader) { return splittableConv(*reader, x); });
}

// Whether the route dissolves `concat`, whose (possibly pooled) result `x` the splittable
// convolutions read: `cheaper` weighs the sums' extra traffic against the Concat's copy.
bool dissolves(const PassContext& context, const ir::Graph& graph, const ir::Node& concat,
               const ir::Value* x) {
  const std::string& mode = context.route.value(kDissolveChannelConcat, &concat);
  if (mode == "off") return false;
  if (mode == "always") return true;
  const auto extraParts = static_cast<int64_t>(concat.inputs.size() - 1);
  int64_t extra = 0;
  for (const ir::Node* conv : graph.consumers(x)) {
    if (!conv->outputs[0]->hasType) return false;  // unknown cost: keep the Concat
    extra += conv->outputs[0]->shape.elementCount() * extraParts;
  }
  return extra <= x->shape.elementCount();
}

// A pool that treats every channel alone, with one output (MaxPool without Indices).
bool isChannelPool(const ir::Node* node) {
  if (!node || !node->domain.empty() || node->outputs.size() != 1 || !node->outputs[0]) {
    return false;
  }
  static const char* const kOps[] = {"MaxPool", "AveragePool", "GlobalMaxPool",
                                     "GlobalAveragePool"};
  return std::any_of(std::begin(kOps), std::end(kOps),
                     [&](const char* op) { return node->opType == op; });
}

// The `part`-th slice [offset, offset + channels) of the weight's input channels.
ir::Value* weightSlice(ir::Graph& graph, const ir::Node& conv, int64_t offset, int64_t channels) {
  const ir::Value* w = conv.inputs[1];
  const ir::Shape& shape = w->shape;
  const int64_t outChannels = shape[0], inChannels = shape[1];
  const int64_t taps = shape.elementCount() / (outChannels * inChannels);
  const std::vector<double> all = tensorValues(*w->constant);
  std::vector<double> part;
  part.reserve(static_cast<size_t>(outChannels * channels * taps));
  for (int64_t m = 0; m < outChannels; ++m) {
    const auto first = static_cast<size_t>((m * inChannels + offset) * taps);
    part.insert(part.end(), all.begin() + static_cast<std::ptrdiff_t>(first),
                all.begin() + static_cast<std::ptrdiff_t>(first + channels * taps));
  }
  ir::Shape partShape = shape;
  partShape[1] = channels;
  return addFoldedConstant(graph, w->name + "_part", w->dtype, partShape, part);
}

// `conv` over the Concat's parts: one Conv per part (the bias on the first), summed by Adds in
// order, the last Add writing the Conv's output.
void splitConv(ir::Graph& graph, ir::Node& conv, const ir::Node& concat) {
  ir::Value* y = conv.outputs[0];
  ir::Value* sum = nullptr;
  int64_t offset = 0;
  for (size_t p = 0; p < concat.inputs.size(); ++p) {
    ir::Value* part = concat.inputs[p];
    const int64_t channels = part->shape[1];
    ir::Node* piece = graph.insertNode("Conv", &conv);
    piece->name = fmt::format("{}_part{}", conv.name, p);
    piece->opsetVersion = conv.opsetVersion;
    piece->attributes = conv.attributes;
    piece->inputs = {part, weightSlice(graph, conv, offset, channels)};
    if (p == 0 && conv.input(2)) piece->inputs.push_back(conv.inputs[2]);
    ir::Value* out = graph.addUniqueValue(piece->name);
    out->dtype = y->dtype;
    out->shape = y->shape;
    out->hasType = y->hasType;
    out->producer = piece;
    piece->outputs = {out};
    offset += channels;
    if (!sum) {
      sum = out;
      continue;
    }
    const bool last = p + 1 == concat.inputs.size();
    ir::Node* add = graph.insertNode("Add", &conv);
    add->name = fmt::format("{}_sum{}", conv.name, p);
    add->opsetVersion = conv.opsetVersion;
    // fuse_conv_activation then takes each Add into the first of its operands' Convs in node
    // order (with the Relu after the last Add), the other operand its residual.
    add->inputs = {out, sum};
    ir::Value* total = last ? y : graph.addUniqueValue(add->name);
    if (!last) {
      total->dtype = y->dtype;
      total->shape = y->shape;
      total->hasType = y->hasType;
    }
    total->producer = add;
    add->outputs = {total};
    sum = total;
  }
}

}  // namespace

Status dissolveChannelConcat(ir::Graph& graph, PassContext& context) {
  if (context.backend != "cpu") return Status::ok();
  std::unordered_set<const ir::Node*> removed;

  // 1. Pools of a Concat move before it, where what reads the pool's output would then take the
  //    Concat apart: Concat(pool(a), pool(b)) in the pool's place, the pool's output its output.
  std::vector<ir::Node*> concats;
  for (const auto& node : graph.nodes()) {
    if (isChannelConcat(*node)) concats.push_back(node.get());
  }
  for (ir::Node* concat : concats) {
    ir::Value* x = concat->outputs[0];
    if (graph.isGraphOutput(x)) continue;
    const std::vector<ir::Node*> readers = graph.consumers(x);
    if (readers.size() != 1 || !isChannelPool(readers[0]) || readers[0]->inputs.size() != 1) {
      continue;
    }
    ir::Node* pool = readers[0];
    ir::Value* pooled = pool->outputs[0];
    if (!pooled->hasType || !allReadersSplittable(graph, pooled)) continue;
    if (!dissolves(context, graph, *concat, pooled)) continue;
    ir::Node* merged = graph.insertNode("Concat", pool);
    merged->name = concat->name;
    merged->opsetVersion = concat->opsetVersion;
    merged->attributes = concat->attributes;
    for (size_t p = 0; p < concat->inputs.size(); ++p) {
      ir::Value* part = concat->inputs[p];
      ir::Node* piece = graph.insertNode(pool->opType, merged);
      piece->name = fmt::format("{}_part{}", pool->name, p);
      piece->opsetVersion = pool->opsetVersion;
      piece->attributes = pool->attributes;
      piece->inputs = {part};
      ir::Value* out = graph.addUniqueValue(piece->name);
      out->dtype = pooled->dtype;
      out->shape = pooled->shape;
      out->shape[1] = part->shape[1];
      out->hasType = true;
      out->producer = piece;
      piece->outputs = {out};
      merged->inputs.push_back(out);
    }
    merged->outputs = {pooled};
    pooled->producer = merged;
    removed.insert(concat);
    removed.insert(pool);
    context.note("moved {} '{}' before Concat '{}', a {} per part", pool->opType, pool->name,
                 concat->name, pool->opType);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  removed.clear();

  // 2. Concats that only splittable Convs read dissolve into them.
  concats.clear();
  for (const auto& node : graph.nodes()) {
    if (isChannelConcat(*node)) concats.push_back(node.get());
  }
  for (ir::Node* concat : concats) {
    ir::Value* x = concat->outputs[0];
    if (!allReadersSplittable(graph, x) || !dissolves(context, graph, *concat, x)) {
      continue;
    }
    for (ir::Node* conv : graph.consumers(x)) {
      splitConv(graph, *conv, *concat);
      removed.insert(conv);
      context.note("split Conv '{}' over the {} parts of Concat '{}'", conv->name,
                   concat->inputs.size(), concat->name);
    }
    removed.insert(concat);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  if (!removed.empty()) graph.removeUnusedValues();
  return Status::ok();
}

}  // namespace kiln::passes
