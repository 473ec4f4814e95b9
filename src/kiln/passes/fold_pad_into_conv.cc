// Folds a zero constant-mode Pad of the spatial axes into the pads of the Conv or AveragePool
// that reads it (which pad with zeros themselves: AveragePool counting the padding, as
// count_include_pad=1 does), so the padded copy is never written.
//
//   %p = Pad(%x, [0,0,1,1,0,0,1,1]); %y = Conv "c" (%p, %w) {pads=[0,0,0,0]}
//     =>   %y = Conv "c" (%x, %w) {pads=[1,1,1,1]}
#include <algorithm>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFoldPadIntoConv = knobs::declareKnob({
    .name = "graph.fold_pad_into_conv",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fold a zero Pad of the spatial axes into the pads of the Conv or AveragePool "
            "(count_include_pad) after it",
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// The Pad's [begin_0..begin_{r-1}, end_0..end_{r-1}] over all `rank` axes, when it pads with
// zeros (constant mode, no value or a zero value) by amounts known at build time; else null.
std::optional<std::vector<int64_t>> zeroPadAmounts(const ir::Node& pad, size_t rank) {
  auto mode = pad.getString("mode", "constant");
  if (!mode.isOk() || *mode != "constant") return std::nullopt;
  std::vector<int64_t> pads;
  std::vector<int64_t> axes;
  if (pad.opsetVersion < 11) {
    auto value = pad.getFloat("value", 0.0f);
    auto amounts = pad.getInts(pad.hasAttribute("paddings") ? "paddings" : "pads", {});
    if (!value.isOk() || *value != 0.0f || !amounts.isOk()) return std::nullopt;
    pads = *amounts;
  } else {
    const ir::Value* amounts = pad.input(1);
    const ir::Value* value = pad.input(2);
    const ir::Value* axesValue = pad.input(3);
    if (!amounts || !amounts->constant) return std::nullopt;
    if (value && (!value->constant || value->constant->elementCount() != 1 ||
                  value->constant->elementAsDouble(0) != 0.0)) {
      return std::nullopt;
    }
    if (axesValue && !axesValue->constant) return std::nullopt;
    pads = amounts->constant->toInt64Vector();
    if (axesValue) axes = axesValue->constant->toInt64Vector();
  }
  const auto irank = static_cast<int64_t>(rank);
  if (axes.empty()) {
    for (int64_t i = 0; i < irank; ++i) axes.push_back(i);
  }
  if (pads.size() != 2 * axes.size()) return std::nullopt;
  std::vector<int64_t> full(2 * rank, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t axis = axes[i] < 0 ? axes[i] + irank : axes[i];
    if (axis < 0 || axis >= irank) return std::nullopt;
    full[static_cast<size_t>(axis)] += pads[i];
    full[static_cast<size_t>(axis) + rank] += pads[i + axes.size()];
  }
  return full;
}

// The consumer's own pads, [begin..., end...] over the `spatial` axes, when it can take more:
// explicit pads (auto_pad NOTSET), and for AveragePool a divisor that counts the padding both
// before and after the fold.
std::optional<std::vector<int64_t>> consumerPads(const ir::Node& consumer, size_t spatial) {
  auto autoPad = consumer.getString("auto_pad", "NOTSET");
  auto pads = consumer.getInts("pads", {});
  if (!autoPad.isOk() || *autoPad != "NOTSET" || !pads.isOk()) return std::nullopt;
  if (pads->empty()) pads->assign(2 * spatial, 0);
  if (pads->size() != 2 * spatial) return std::nullopt;
  if (consumer.opType == "AveragePool") {
    // Windows divide by the elements they cover inside the padded extent with
    // count_include_pad=1, and the Pad's zeros are inside it either way. Without it, a pool with
    // no pads of its own also divides by the whole window (every window lies inside its input),
    // so it may count the folded pads. ceil_mode windows may hang past the padding, where the
    // two divisors differ.
    auto includePad = consumer.getInt("count_include_pad", 0);
    auto ceilMode = consumer.getInt("ceil_mode", 0);
    if (!includePad.isOk() || !ceilMode.isOk() || *ceilMode != 0) return std::nullopt;
    if (*includePad == 0 &&
        std::any_of(pads->begin(), pads->end(), [](int64_t v) { return v != 0; })) {
      return std::nullopt;
    }
  }
  return *pads;
}

}  // namespace

Status foldPadIntoConv(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  for (const auto& nodePtr : graph.nodes()) {
    ir::Node& pad = *nodePtr;
    if (!isOp(&pad, "Pad") || !pad.input(0) || pad.outputs.empty() || !pad.outputs[0]) continue;
    ir::Value* x = pad.inputs[0];
    ir::Value* padded = pad.outputs[0];
    if (!x->hasType || x->shape.rank() < 3) continue;
    const size_t rank = x->shape.rank();
    auto amounts = zeroPadAmounts(pad, rank);
    if (!amounts) continue;
    // Only the spatial axes: Conv and the pools pad nothing else. Negative pads crop, which
    // their pads cannot.
    if ((*amounts)[0] != 0 || (*amounts)[1] != 0 || (*amounts)[rank] != 0 ||
        (*amounts)[rank + 1] != 0 ||
        std::any_of(amounts->begin(), amounts->end(), [](int64_t v) { return v < 0; })) {
      continue;
    }
    const size_t spatial = rank - 2;
    size_t folded = 0;
    const std::vector<ir::Node*> readers = graph.consumers(padded);
    for (ir::Node* reader : readers) {
      if ((!isOp(reader, "Conv") && !isOp(reader, "AveragePool")) || reader->input(0) != padded ||
          std::count(reader->inputs.begin(), reader->inputs.end(), padded) != 1) {
        continue;
      }
      auto pads = consumerPads(*reader, spatial);
      if (!pads) continue;
      for (size_t i = 0; i < spatial; ++i) {
        (*pads)[i] += (*amounts)[2 + i];
        (*pads)[spatial + i] += (*amounts)[rank + 2 + i];
      }
      reader->attributes["pads"] = ir::Attribute{*pads};
      if (reader->opType == "AveragePool") reader->attributes["count_include_pad"] = {int64_t{1}};
      reader->inputs[0] = x;
      ++folded;
      context.note("folded Pad '{}' into {} '{}'", pad.name, reader->opType, reader->name);
    }
    // The Pad stays for readers that could not take it.
    if (folded == readers.size() && !graph.isGraphOutput(padded)) removed.insert(&pad);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
