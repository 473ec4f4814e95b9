// Folds multiplications, divisions, additions and subtractions by per-output-channel constants
// after a Conv, ConvTranspose or Gemm into its constant weight and bias, and those by per-column
// constants after a MatMul by a constant matrix into that matrix and the bias Add after it (a
// MatMul without one takes the multiplications and divisions alone): the product then writes the
// final values itself.
//
//   %c = Conv "c" (%x, %w, %b); %s = Mul(%c, %scale[1,M,1,1]); %y = Add(%s, %shift[M,1,1])
//     =>   %y = Conv "c" (%x, %w_affine, %c_bias_affine)
#include <algorithm>
#include <unordered_set>

#include "kiln/passes/conv_weights.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFoldAffineIntoConv = knobs::declareKnob({
    .name = "graph.fold_affine_into_conv",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fold Mul/Div/Add/Sub by per-channel constants after Conv, ConvTranspose or Gemm "
            "(Mul/Div after MatMul by a constant) into the weight and bias",
});

namespace {

bool isProduct(const ir::Node& node) {
  return node.domain.empty() && (node.opType == "Conv" || node.opType == "ConvTranspose" ||
                                 node.opType == "Gemm" || node.opType == "MatMul");
}

// The one node reading `value` (once), when `value` is not also a graph output.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value) {
  if (!value || graph.isGraphOutput(value)) return nullptr;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  if (readers.size() != 1) return nullptr;
  const auto& inputs = readers[0]->inputs;
  return std::count(inputs.begin(), inputs.end(), value) == 1 ? readers[0] : nullptr;
}

// The constant's value per channel along `axis` of `y`, when it broadcasts against `y` without
// changing its shape and varies along that axis alone; else null.
std::optional<std::vector<double>> perChannel(const ir::Value& constant, const ir::Value& y,
                                              size_t axis) {
  if (!constant.constant || constant.dtype != y.dtype || constant.shape.rank() > y.shape.rank()) {
    return std::nullopt;
  }
  const int64_t channels = y.shape[axis];
  const size_t offset = y.shape.rank() - constant.shape.rank();
  bool varies = false;
  for (size_t i = 0; i < constant.shape.rank(); ++i) {
    const int64_t extent = constant.shape[i];
    if (offset + i == axis && extent == channels) {
      varies = true;
    } else if (extent != 1) {
      return std::nullopt;
    }
  }
  std::vector<double> values(static_cast<size_t>(channels));
  for (int64_t m = 0; m < channels; ++m) {
    values[static_cast<size_t>(m)] = constant.constant->elementAsDouble(varies ? m : 0);
  }
  return values;
}

// One step of the chain after the product: y * scale + shift per channel.
struct ChannelAffine {
  ir::Node* node = nullptr;
  std::vector<double> scale;  // empty: 1
  std::vector<double> shift;  // empty: 0
};

// The affine step `reader` applies to the product's output `y`, if it is one this fold takes.
std::optional<ChannelAffine> affineStep(ir::Node& reader, const ir::Value& y, size_t axis,
                                        bool biasAllowed) {
  const std::string& op = reader.opType;
  if (!reader.domain.empty() || reader.inputs.size() != 2 || reader.outputs.size() != 1 ||
      !reader.outputs[0] || (op != "Mul" && op != "Div" && op != "Add" && op != "Sub")) {
    return std::nullopt;
  }
  // x - c and x / c fold; c - x and c / x do not.
  const bool yFirst = reader.inputs[0] == &y;
  if (!yFirst && (op == "Sub" || op == "Div")) return std::nullopt;
  const ir::Value* other = yFirst ? reader.inputs[1] : reader.inputs[0];
  if (!other) return std::nullopt;
  auto values = perChannel(*other, y, axis);
  if (!values) return std::nullopt;
  ChannelAffine step{.node = &reader};
  if (op == "Mul") {
    step.scale = std::move(*values);
  } else if (op == "Div") {
    for (double& v : *values) {
      if (v == 0.0) return std::nullopt;  // x / 0 is inf or nan, which no weight gives
      v = 1.0 / v;
    }
    step.scale = std::move(*values);
  } else {
    if (!biasAllowed) return std::nullopt;
    if (op == "Sub") {
      for (double& v : *values) v = -v;
    }
    step.shift = std::move(*values);
  }
  return step;
}

}  // namespace

Status foldAffineIntoConv(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  for (const auto& nodePtr : graph.nodes()) {
    ir::Node& product = *nodePtr;
    if (!isProduct(product) || product.outputs.size() != 1 || !product.outputs[0] ||
        !product.input(0) || !product.input(1)) {
      continue;
    }
    const ir::Value* w = product.inputs[1];
    ir::Value* y = product.outputs[0];
    if (!w->constant || !isFoldableFloat(w->dtype) || !y->hasType || y->shape.rank() < 2) continue;
    const bool matmul = product.opType == "MatMul";
    // The channel axis: Conv's and ConvTranspose's [N, M, ...] and Gemm's [M, N] have it at 1;
    // MatMul's [..., N] last.
    if (matmul && w->shape.rank() != 2) continue;
    const size_t axis = matmul ? y->shape.rank() - 1 : 1;
    const int64_t channels = y->shape[axis];
    auto channelOf = weightOutputChannels(product, channels);
    auto bias = biasPerChannel(product, channels);
    if (!channelOf || !bias) continue;

    // A MatMul's bias is the per-column constant Add right after it (which fuse_gemm_activation
    // later takes into a FusedGemm): the chain's shifts fold into that Add's constant.
    ir::Node* biasAdd = nullptr;
    ir::Value* biased = y;  // the value the chain of steps starts from
    if (matmul) {
      ir::Node* reader = soleReader(graph, y);
      auto step = reader ? affineStep(*reader, *y, axis, true) : std::nullopt;
      if (step && reader->opType == "Add") {
        biasAdd = reader;
        bias = std::move(step->shift);
        biased = reader->outputs[0];
      }
    }
    // Every step of the chain, each the sole reader of the one before.
    std::vector<ChannelAffine> steps;
    for (ir::Value* last = biased;;) {
      ir::Node* reader = soleReader(graph, last);
      if (!reader) break;
      auto step = affineStep(*reader, *last, axis, !matmul || biasAdd);
      if (!step) break;
      last = reader->outputs[0];
      steps.push_back(std::move(*step));
    }
    if (steps.empty()) continue;

    std::vector<double> weights = tensorValues(*w->constant);
    bool shifted = false;
    std::string chain;
    for (const ChannelAffine& step : steps) {
      for (size_t i = 0; i < weights.size() && !step.scale.empty(); ++i) {
        weights[i] *= step.scale[static_cast<size_t>((*channelOf)[i])];
      }
      for (size_t m = 0; m < bias->size(); ++m) {
        if (!step.scale.empty()) (*bias)[m] *= step.scale[m];
        if (!step.shift.empty()) (*bias)[m] += step.shift[m];
      }
      shifted |= !step.shift.empty();
      chain +=
          fmt::format("{}{} '{}'", chain.empty() ? "" : " + ", step.node->opType, step.node->name);
      removed.insert(step.node);
    }
    // New initializers: the old ones may be shared with other nodes.
    product.inputs[1] = addFoldedConstant(graph, w->name + "_affine", w->dtype, w->shape, weights);
    // A product without a bias keeps none when only scales folded (its bias stays zero).
    if (!matmul && (product.input(2) || shifted)) {
      product.inputs.resize(3);
      product.inputs[2] = addFoldedConstant(graph, product.name + "_bias_affine", w->dtype,
                                            ir::Shape{channels}, *bias);
      if (product.opType == "Gemm") product.attributes["beta"] = ir::Attribute{1.0f};
    }
    // The product (or a MatMul's bias Add, with the new bias in place of its constant) now
    // writes the chain's last output, keeping its name for readers and graph outputs.
    ir::Node* writer = &product;
    if (biasAdd) {
      writer = biasAdd;
      const size_t constantSlot = biasAdd->inputs[0] == y ? 1 : 0;
      biasAdd->inputs[constantSlot] = addFoldedConstant(graph, biasAdd->name + "_bias_affine",
                                                        w->dtype, ir::Shape{channels}, *bias);
    }
    ir::Value* out = steps.back().node->outputs[0];
    writer->outputs[0]->producer = nullptr;
    writer->outputs[0] = out;
    out->producer = writer;
    steps.back().node->outputs[0] = nullptr;
    context.note("folded {} into {} '{}'", chain, product.opType, product.name);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
