// Puts the convolutions and pools that graph.layout selects in NHWC: each 4-D float32 Conv,
// kiln.FusedConv, MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool becomes kiln's NHWC op
// (src/kiln/ir/ops/layout.h; Conv weights re-laid out as [kH, kW, C/group, M] constants), and the
// layout is carried through the nodes that do not care about it (unary elementwise ops, binary
// ones whose other operand is NHWC too or a constant, channel Concats), so a chain of
// convolutions stays NHWC and only the chain's edges transpose.
//
//   %c = Conv "c1" (%x, %w); %r = Relu "r" (%c); %y = Conv "c2" (%r, %w2)
//     =>   %x_nhwc = Transpose (%x) {perm=[0,2,3,1]}
//          %c_nhwc = kiln.NhwcConv "c1" (%x_nhwc, %w_hwio)
//          %r_nhwc = Relu "r" (%c_nhwc)
//          %y_nhwc = kiln.NhwcConv "c2" (%r_nhwc, %w2_hwio)
//          %y = Transpose (%y_nhwc) {perm=[0,3,1,2]}
//
// One walk in node order. A value given an NHWC twin keeps its NCHW self, now a Transpose back
// from the twin, for readers that stay NCHW; those Transposes that end up unread are dropped.
// The exporter's own layout Transposes join in: one from NHWC to NCHW gives its output a twin
// (its input), and one from NCHW to NHWC of a value with a twin is that twin, so pairs cancel.
// Where a layout change moves only axes of extent 1 ([N,C,1,1] <-> [N,1,1,C]), it is a Reshape.
#include <algorithm>
#include <array>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/layout.h"
#include "kiln/passes/node_names.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kLayout = knobs::declareKnob({
    .name = "graph.layout",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"nchw", "nhwc"},
    // NHWC by default: oneDNN's fastest convolutions read and write channels-last (in an NCHW
    // graph every oneDNN convolution reorders in and out), and kiln's NHWC kernels are on par
    // with its NCHW ones. 2026-12-03, bench/cpu/vs_ort.sh: mobilenet_v3_small 2 threads
    // 3.32 -> 1.39 ms, squeezenet1_1 7.97 -> 4.73 (with cpu.conv.source=onednn).
    .defaultValue = "nhwc",
    .help = "layout of 4-D float32 convolutions and pools on the CPU: ONNX's NCHW, or NHWC "
            "(channels last; elementwise ops and channel Concats between them follow, transposes "
            "only at the edges)",
    .backends = {"cpu"},
    .perNode = true,
});

// The same choice on the GPU, where channels-last is the better default: cuDNN's tensor-core
// convolutions work in NHWC (an NCHW convolution there transposes inside the library).
const knobs::Knob kCudaLayout = knobs::declareKnob({
    .name = "cuda.layout",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"nhwc", "nchw"},
    .defaultValue = "nhwc",
    .help = "layout of 4-D float32 convolutions and pools on the GPU: NHWC (channels last, as "
            "cuDNN's tensor-core kernels want; transposes only at a region's edges) or ONNX's "
            "NCHW",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

bool isOp(const ir::Node& node, const char* opType) {
  return node.domain.empty() && node.opType == opType;
}

// Unary ops applied element by element; inputs after the first are scalar parameters.
const std::set<std::string> kUnaryOps = {
    "Relu", "LeakyRelu", "Sigmoid",  "Tanh",  "HardSigmoid", "HardSwish", "Clip",
    "Elu",  "Selu",      "Softplus", "Exp",   "Log",         "Neg",       "Abs",
    "Sqrt", "Erf",       "Gelu",     "Floor", "Ceil",        "Round",     "Reciprocal",
    "Mish", "Identity",  "Sign",     "Sin",   "Cos",         "Softsign",  "ThresholdedRelu"};
// Binary ops with numpy broadcasting (PRelu's slope broadcasts to X, the same rule here).
const std::set<std::string> kBinaryOps = {"Add", "Sub", "Mul", "Div", "Pow", "PRelu"};
// Reductions over explicit axes (an input from opset 18, ReduceSum's from 13; else an attribute).
const std::set<std::string> kReduceOps = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"};

bool isFloat4d(const ir::Value* value) {
  return value && value->hasType && value->dtype == ir::DType::kFloat32 && value->shape.rank() == 4;
}

// The axis an NCHW axis becomes in NHWC.
int64_t nhwcAxis(int64_t nchwAxis) {
  const auto& perm = ir::kNchwToNhwc;
  return std::find(perm.begin(), perm.end(), nchwAxis) - perm.begin();
}

// Transposing `shape` by `perm` moves only axes of extent 1: the bytes stay in order.
bool movesOnlyUnitAxes(const ir::Shape& shape, const std::vector<int64_t>& perm) {
  int64_t last = -1;
  for (int64_t axis : perm) {
    if (shape[static_cast<size_t>(axis)] == 1) continue;
    if (axis < last) return false;
    last = axis;
  }
  return true;
}

std::optional<std::vector<int64_t>> transposePerm(const ir::Node& node) {
  const ir::Value* x = node.input(0);
  if (!x || !x->hasType || x->shape.rank() != 4 || node.outputs.size() != 1 || !node.outputs[0]) {
    return std::nullopt;
  }
  auto perm = node.getInts("perm", {3, 2, 1, 0});
  return perm.isOk() ? std::optional(*perm) : std::nullopt;
}

class LayoutRewrite {
 public:
  LayoutRewrite(ir::Graph& graph, PassContext& context)
      : graph_(graph), context_(context), names_(graph) {}

  Status run() {
    std::vector<ir::Node*> nodes;
    for (const auto& node : graph_.nodes()) nodes.push_back(node.get());
    // Without a node in NHWC the graph stays as the model wrote it, exporter Transposes too.
    if (std::none_of(nodes.begin(), nodes.end(), [&](ir::Node* n) { return wantsNhwc(*n); })) {
      return Status::ok();
    }
    for (ir::Node* node : nodes) {
      if (removed_.count(node)) continue;  // part of a chain converted whole
      if (isOp(*node, "Transpose")) {
        joinTranspose(*node);
      } else if (wantsNhwc(*node)) {
        convertAnchor(*node);
      } else if (auto shuffle = channelShuffle(*node)) {
        convertChannelShuffle(*shuffle);
      } else if (followsLayout(*node)) {
        convertFollower(*node);
      }
    }
    graph_.removeNodes([&](const ir::Node& node) { return removed_.count(&node) > 0; });
    for (auto& [node, name] : renames_) node->name = name;
    dropUnreadLayoutNodes();
    return Status::ok();
  }

 private:
  // A convolution or pool kiln has an NHWC op for, that the route puts in NHWC.
  bool wantsNhwc(const ir::Node& node) const {
    const bool conv =
        isOp(node, "Conv") || (node.domain == ir::kKilnDomain && node.opType == "FusedConv");
    const bool pool = isOp(node, "MaxPool") || isOp(node, "AveragePool") ||
                      isOp(node, "GlobalAveragePool") || isOp(node, "GlobalMaxPool");
    if (!conv && !pool) return false;
    if (!isFloat4d(node.input(0)) || node.outputs.empty() || !isFloat4d(node.outputs[0])) {
      return false;
    }
    // MaxPool's Indices count in NCHW positions; its NHWC op has no such output.
    for (size_t i = 1; i < node.outputs.size(); ++i) {
      if (node.outputs[i]) return false;
    }
    // The weights are re-laid out at build time, so they must be known then.
    if (conv && (!node.input(1) || !node.input(1)->constant || node.input(1)->shape.rank() != 4)) {
      return false;
    }
    const knobs::Knob& knob = context_.backend == "cuda" ? kCudaLayout : kLayout;
    return context_.route.value(knob, &node) == "nhwc";
  }

  // How a node that computes the same thing in either layout follows its inputs into NHWC, once
  // its runtime inputs all have NHWC twins already (so following costs no transpose).
  enum class Follow { kNone, kUnary, kBinary, kConcat, kSplit, kReduce };

  Follow followKind(const ir::Node& node) const {
    if (!node.domain.empty() || node.outputs.empty()) return Follow::kNone;
    const std::string& op = node.opType;
    if (kUnaryOps.count(op)) return Follow::kUnary;
    if (kBinaryOps.count(op) && node.inputs.size() == 2) return Follow::kBinary;
    if (op == "Concat") return Follow::kConcat;
    if (op == "Split") return Follow::kSplit;
    if (kReduceOps.count(op)) return Follow::kReduce;
    return Follow::kNone;
  }

  bool followsLayout(const ir::Node& node) const {
    const Follow kind = followKind(node);
    if (kind == Follow::kNone) return false;
    if (kind == Follow::kReduce) return twin_.count(node.input(0)) && reducePlan(node);
    if (kind != Follow::kSplit && node.outputs.size() != 1) return false;
    for (const ir::Value* output : node.outputs) {
      if (!isFloat4d(output)) return false;
    }
    if (kind == Follow::kConcat || kind == Follow::kSplit) {
      if (!node.getInt("axis", 0).isOk()) return false;
    }
    const bool anyOperand = kind == Follow::kBinary || kind == Follow::kConcat;
    bool twinned = false;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::Value* input = node.inputs[i];
      if (!input) continue;
      if (twin_.count(input)) {
        twinned = true;
        continue;
      }
      if (!input->constant || (i == 0 && !anyOperand)) return false;
      // Unary ops' parameters are scalars; Split's sizes are no tensor of the layout; binary
      // operands broadcast from the right, a Concat's have its rank.
      const bool scalar = input->constant->elementCount() == 1;
      if ((kind == Follow::kUnary && !scalar) || (anyOperand && input->shape.rank() > 4) ||
          (kind == Follow::kConcat && input->shape.rank() != 4)) {
        return false;
      }
    }
    return twinned;
  }

  // A reduction over explicit axes of a 4-D float32 tensor: the axes in NHWC, and whether the
  // output is NHWC too (keepdims) or, without the reduced axes, the very tensor NCHW gives
  // (when the kept axes keep their order: [N, C] from a reduction over H and W).
  struct ReducePlan {
    std::vector<int64_t> axes;
    bool keepDims = true;
  };

  std::optional<ReducePlan> reducePlan(const ir::Node& node) const {
    const ir::Value* output = node.outputs[0];
    if (node.outputs.size() != 1 || !output || !output->hasType ||
        output->dtype != ir::DType::kFloat32 || !isFloat4d(node.input(0))) {
      return std::nullopt;
    }
    std::vector<int64_t> axes;
    if (const ir::Value* axesInput = node.input(1)) {
      if (!axesInput->constant) return std::nullopt;
      axes = axesInput->constant->toInt64Vector();
    } else {
      auto attribute = node.getInts("axes", {});
      if (!attribute.isOk()) return std::nullopt;
      axes = *attribute;
    }
    auto keepDims = node.getInt("keepdims", 1);
    if (axes.empty() || !keepDims.isOk()) return std::nullopt;  // empty: all, or none
    ReducePlan plan{{}, *keepDims != 0};
    std::vector<bool> reduced(4, false);
    for (int64_t axis : axes) {
      if (axis < -4 || axis > 3) return std::nullopt;
      reduced[static_cast<size_t>(axis < 0 ? axis + 4 : axis)] = true;
      plan.axes.push_back(nhwcAxis(axis < 0 ? axis + 4 : axis));
    }
    if (!plan.keepDims) {
      int64_t last = -1;
      for (int64_t axis = 0; axis < 4; ++axis) {
        if (reduced[static_cast<size_t>(axis)]) continue;
        if (nhwcAxis(axis) < last) return std::nullopt;
        last = nhwcAxis(axis);
      }
    }
    return plan;
  }

  void joinTranspose(ir::Node& transpose) {
    auto perm = transposePerm(transpose);
    if (!perm) return;
    ir::Value* x = transpose.inputs[0];
    ir::Value* y = transpose.outputs[0];
    if (*perm == ir::kNhwcToNchw) {
      twin_.emplace(y, x);  // the exporter already holds the NHWC tensor
      return;
    }
    auto it = twin_.find(x);
    if (*perm != ir::kNchwToNhwc || it == twin_.end() || graph_.isGraphOutput(y)) return;
    graph_.replaceAllUses(y, it->second);
    removed_.insert(&transpose);
    context_.note("cancelled Transpose '{}' against the NHWC twin of '{}'", transpose.name,
                  x->name);
  }

  void convertAnchor(ir::Node& node) {
    const bool conv = node.opType == "Conv" || node.opType == "FusedConv";
    std::vector<ir::Value*> inputs = node.inputs;
    inputs[0] = nhwcTwin(inputs[0], node);
    if (conv) {
      inputs[1] = hwioWeights(inputs[1]);
      if (inputs.size() > 3 && inputs[3]) inputs[3] = nhwcTwin(inputs[3], node);
    }
    ir::Node* nhwc = replaceWith(node, ir::nhwcOpFor(node.opType), ir::kKilnDomain, inputs);
    context_.note("{} '{}' runs in NHWC as kiln.{}", node.opType, node.name, nhwc->opType);
  }

  void convertFollower(ir::Node& node) {
    const Follow kind = followKind(node);
    std::vector<ir::Value*> inputs = node.inputs;
    const bool layoutInputs = kind == Follow::kBinary || kind == Follow::kConcat;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i] && (i == 0 || layoutInputs)) inputs[i] = nhwcTwin(inputs[i], node);
    }
    std::optional<ReducePlan> reduce;
    if (kind == Follow::kReduce) {
      reduce = reducePlan(node);
      if (node.input(1)) inputs[1] = nhwcAxes(node.inputs[1], reduce->axes);
    }
    ir::Node* nhwc = replaceWith(node, node.opType, node.domain, inputs,
                                 /*twinOutputs=*/!reduce || reduce->keepDims);
    if (kind == Follow::kConcat || kind == Follow::kSplit) {
      const int64_t axis = *node.getInt("axis", 0);
      nhwc->attributes["axis"] = ir::Attribute{nhwcAxis(axis < 0 ? axis + 4 : axis)};
    }
    if (reduce && !node.input(1)) nhwc->attributes["axes"] = ir::Attribute{reduce->axes};
    context_.note("{} '{}' follows its inputs into NHWC", node.opType, node.name);
  }

  // A channel shuffle as exporters write it, [N, C, H, W] -> Reshape [N, g, C/g, H, W] ->
  // Transpose [0, 2, 1, 3, 4] -> Reshape [N, C, H, W], whose input has an NHWC twin: the same
  // shuffle on the last axis of the twin. Returns the chain's three nodes.
  std::optional<std::array<ir::Node*, 3>> channelShuffle(ir::Node& split) const {
    if (!isOp(split, "Reshape") || !twin_.count(split.input(0)) || !isFloat4d(split.inputs[0])) {
      return std::nullopt;
    }
    const ir::Shape& x = split.inputs[0]->shape;
    ir::Node* transpose = soleReader(split.outputs[0]);
    if (!transpose || !isOp(*transpose, "Transpose")) return std::nullopt;
    ir::Node* merge = soleReader(transpose->outputs[0]);
    if (!merge || !isOp(*merge, "Reshape") || !merge->outputs[0]->hasType ||
        merge->outputs[0]->shape != x) {
      return std::nullopt;
    }
    const ir::Shape& grouped = split.outputs[0]->shape;
    auto perm = transpose->getInts("perm", {});
    if (grouped.rank() != 5 || grouped[0] != x[0] || grouped[1] * grouped[2] != x[1] ||
        grouped[3] != x[2] || grouped[4] != x[3] || !perm.isOk() ||
        *perm != std::vector<int64_t>{0, 2, 1, 3, 4}) {
      return std::nullopt;
    }
    return std::array<ir::Node*, 3>{&split, transpose, merge};
  }

  void convertChannelShuffle(const std::array<ir::Node*, 3>& chain) {
    auto [split, transpose, merge] = chain;
    const ir::Shape& x = split->inputs[0]->shape;
    const ir::Shape& grouped = split->outputs[0]->shape;
    ir::Value* twin = nhwcTwin(split->inputs[0], *split);
    // Inserted before the chain's last node, after every input of the chain.
    ir::Value* groupedTwin =
        reshapeBefore(twin, ir::Shape{x[0], x[2], x[3], grouped[1], grouped[2]}, *merge, *split);
    ir::Node* swap = graph_.insertNode("Transpose", merge);
    swap->name = names_.take(transpose->name + "_nhwc");
    swap->opsetVersion = transpose->opsetVersion;
    swap->attributes["perm"] = ir::Attribute{std::vector<int64_t>{0, 1, 2, 4, 3}};
    swap->inputs = {groupedTwin};
    ir::Value* swapped = newValue(transpose->outputs[0]->name + "_nhwc", groupedTwin->dtype,
                                  ir::Shape{x[0], x[2], x[3], grouped[2], grouped[1]});
    swapped->producer = swap;
    swap->outputs = {swapped};
    renames_.emplace_back(swap, transpose->name);
    ir::Value* shuffled = merge->outputs[0];
    ir::Value* shuffledTwin =
        reshapeBefore(swapped, ir::permuteShape(x, ir::kNchwToNhwc), *merge, *merge);
    addLayoutChange(shuffledTwin, shuffled, ir::kNhwcToNchw, merge, merge->name + "_to_nchw");
    twin_[shuffled] = shuffledTwin;
    removed_.insert({split, transpose, merge});
    context_.note("channel shuffle '{}' -> '{}' -> '{}' follows its input into NHWC", split->name,
                  transpose->name, merge->name);
  }

  // The axes input `axes` (a constant) with its axes in NHWC, one constant per original.
  ir::Value* nhwcAxes(ir::Value* axes, const std::vector<int64_t>& nhwc) {
    if (auto it = axes_.find(axes); it != axes_.end()) return it->second;
    ir::Value* twin = newConstant(
        axes->name + "_nhwc",
        ir::Tensor::fromVector<int64_t>(ir::Shape{static_cast<int64_t>(nhwc.size())}, nhwc));
    axes_[axes] = twin;
    return twin;
  }

  // The NHWC version of Reshape `original`: `value` reshaped to `shape`, placed before
  // `position`, taking `original`'s name once it is gone.
  ir::Value* reshapeBefore(ir::Value* value, const ir::Shape& shape, const ir::Node& position,
                           const ir::Node& original) {
    ir::Node* reshape = graph_.insertNode("Reshape", &position);
    reshape->name = names_.take(original.name + "_nhwc");
    reshape->opsetVersion = original.opsetVersion;
    ir::Value* out = newValue(original.outputs[0]->name + "_nhwc", value->dtype, shape);
    reshape->inputs = {value, shapeConstant(out->name + "_shape", shape)};
    reshape->outputs = {out};
    out->producer = reshape;
    renames_.emplace_back(reshape, original.name);
    return out;
  }

  ir::Node* soleReader(const ir::Value* value) const {
    if (!value || graph_.isGraphOutput(value)) return nullptr;
    const std::vector<ir::Node*> readers = graph_.consumers(value);
    return readers.size() == 1 ? readers[0] : nullptr;
  }

  // A node computing `node`'s outputs in NHWC from `inputs`, placed before it; with
  // `twinOutputs`, each output of `node` becomes a transpose of the new node's (for readers
  // staying NCHW), else the new node writes `node`'s outputs itself. `node` goes; the new node
  // takes its name, so per-node knobs naming it still apply.
  ir::Node* replaceWith(ir::Node& node, const std::string& opType, const std::string& domain,
                        const std::vector<ir::Value*>& inputs, bool twinOutputs = true) {
    ir::Node* nhwc = graph_.insertNode(opType, &node);
    nhwc->name = names_.take(node.name + "_nhwc");
    nhwc->domain = domain;
    nhwc->opsetVersion = node.opsetVersion;
    nhwc->attributes = node.attributes;
    nhwc->inputs = inputs;
    for (ir::Value* y : node.outputs) {
      if (!twinOutputs) {
        y->producer = nhwc;
        nhwc->outputs.push_back(y);
        continue;
      }
      ir::Value* twin =
          newValue(y->name + "_nhwc", y->dtype, ir::permuteShape(y->shape, ir::kNchwToNhwc));
      twin->producer = nhwc;
      nhwc->outputs.push_back(twin);
      addLayoutChange(twin, y, ir::kNhwcToNchw, &node, y->name + "_to_nchw");
      twin_[y] = twin;
    }
    removed_.insert(&node);
    renames_.emplace_back(nhwc, node.name);
    return nhwc;
  }

  // The NHWC twin of `value`, made where missing: a permuted constant, or a transpose placed
  // before `reader`.
  ir::Value* nhwcTwin(ir::Value* value, const ir::Node& reader) {
    if (auto it = twin_.find(value); it != twin_.end()) return it->second;
    if (value->constant) {
      if (value->constant->elementCount() == 1) return value;  // broadcasts alike in both
      // Aligned as broadcasting aligns it (trailing axes), then permuted; the leading axes the
      // alignment added are all 1 after the permutation and are dropped again.
      const size_t rank = value->shape.rank();
      std::vector<int64_t> dims(4 - rank, 1);
      dims.insert(dims.end(), value->shape.dims().begin(), value->shape.dims().end());
      ir::Tensor permuted =
          ir::permuteTensor(value->constant->reshaped(ir::Shape(dims)), ir::kNchwToNhwc);
      std::vector<int64_t> kept(permuted.shape().dims().begin() + (4 - rank),
                                permuted.shape().dims().end());
      ir::Value* twin = newConstant(value->name + "_nhwc", permuted.reshaped(ir::Shape(kept)));
      twin_[value] = twin;
      return twin;
    }
    ir::Value* twin = newValue(value->name + "_nhwc", value->dtype,
                               ir::permuteShape(value->shape, ir::kNchwToNhwc));
    addLayoutChange(value, twin, ir::kNchwToNhwc, &reader, value->name + "_to_nhwc");
    twin_[value] = twin;
    return twin;
  }

  ir::Value* hwioWeights(ir::Value* weights) {
    if (auto it = hwio_.find(weights); it != hwio_.end()) return it->second;
    ir::Value* hwio = newConstant(weights->name + "_hwio",
                                  ir::permuteTensor(*weights->constant, ir::kOihwToHwio));
    hwio_[weights] = hwio;
    return hwio;
  }

  // `to` = `from` transposed by `perm`, placed before `position`: a Reshape when the bytes stay
  // in order.
  void addLayoutChange(ir::Value* from, ir::Value* to, const std::vector<int64_t>& perm,
                       const ir::Node* position, const std::string& name) {
    const bool reshape = movesOnlyUnitAxes(from->shape, perm);
    ir::Node* node = graph_.insertNode(reshape ? "Reshape" : "Transpose", position);
    node->name = names_.take(name);
    node->opsetVersion = graph_.opsetImports.count("") ? graph_.opsetImports.at("") : 18;
    node->inputs = {from};
    if (reshape) {
      node->inputs.push_back(shapeConstant(to->name + "_shape", to->shape));
    } else {
      node->attributes["perm"] = ir::Attribute{perm};
    }
    node->outputs = {to};
    to->producer = node;
    layoutNodes_.push_back(node);
  }

  ir::Value* newValue(const std::string& name, ir::DType dtype, ir::Shape shape) {
    ir::Value* value = graph_.addUniqueValue(name);
    value->dtype = dtype;
    value->shape = std::move(shape);
    value->hasType = true;
    return value;
  }

  ir::Value* shapeConstant(const std::string& name, const ir::Shape& shape) {
    return newConstant(name, ir::Tensor::fromVector<int64_t>(
                                 ir::Shape{static_cast<int64_t>(shape.rank())}, shape.dims()));
  }

  ir::Value* newConstant(const std::string& name, ir::Tensor tensor) {
    ir::Value* value = newValue(name, tensor.dtype(), tensor.shape());
    value->constant = std::move(tensor);
    value->isInitializer = true;
    return value;
  }

  // The layout changes nothing reads any more (every reader followed into NHWC), and exporter
  // Transposes to NCHW whose readers all took the twin instead. Backwards, so chains go at once.
  void dropUnreadLayoutNodes() {
    std::unordered_set<const ir::Node*> dead;
    std::unordered_map<const ir::Value*, int> readers;
    for (const auto& node : graph_.nodes()) {
      for (const ir::Value* input : node->inputs) ++readers[input];
    }
    for (auto it = graph_.nodes().rbegin(); it != graph_.nodes().rend(); ++it) {
      const ir::Node& node = **it;
      const bool layout =
          std::find(layoutNodes_.begin(), layoutNodes_.end(), &node) != layoutNodes_.end() ||
          (isOp(node, "Transpose") && twin_.count(node.outputs[0]));
      if (!layout || readers[node.outputs[0]] > 0 || graph_.isGraphOutput(node.outputs[0])) {
        continue;
      }
      dead.insert(&node);
      for (const ir::Value* input : node.inputs) --readers[input];
    }
    graph_.removeNodes([&](const ir::Node& node) { return dead.count(&node) > 0; });
  }

  ir::Graph& graph_;
  PassContext& context_;
  std::unordered_map<const ir::Value*, ir::Value*> twin_;  // NCHW value -> its NHWC twin
  std::unordered_map<const ir::Value*, ir::Value*> hwio_;  // OIHW weights -> HWIO copy
  std::unordered_map<const ir::Value*, ir::Value*> axes_;  // reduction axes -> NHWC axes
  std::unordered_set<const ir::Node*> removed_;
  std::vector<std::pair<ir::Node*, std::string>> renames_;
  std::vector<const ir::Node*> layoutNodes_;
  NodeNames names_;
};

}  // namespace

Status layoutNhwc(ir::Graph& graph, PassContext& context) {
  return LayoutRewrite(graph, context).run();
}

}  // namespace kiln::passes
