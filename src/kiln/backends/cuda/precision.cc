// Precision assignment for the CUDA backend (see precision.h).
#include "kiln/backends/cuda/precision.h"

#include <fmt/format.h>

#include <map>
#include <set>
#include <unordered_map>

#include "kiln/ir/op_schema.h"

namespace kiln::cuda {

const knobs::Knob kPrecision = knobs::declareKnob({
    .name = "cuda.precision",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fp32", "tf32", "fp16", "bf16"},
    .defaultValue = "fp32",
    .help = "compute precision: float32; float32 with TF32 tensor cores in GEMMs and "
            "convolutions; or float16 / bfloat16 storage and tensor-core math (fp32 "
            "accumulation) in the ops that have such kernels, with casts where precisions meet",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kNormInFp32 = knobs::declareKnob({
    .name = "cuda.precision.norm_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, keep normalisations and softmax (LayerNormalization and "
            "kiln.AddLayerNormalization, BatchNormalization, InstanceNormalization, "
            "GroupNormalization, Softmax, "
            "LogSoftmax) in float32 storage, with casts around them, instead of reading and "
            "writing the reduced type (their arithmetic is float32 either way)",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kReduceInFp32 = knobs::declareKnob({
    .name = "cuda.precision.reduce_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, keep reductions and pools (ReduceMean, ReduceSum, ReduceMax, "
            "ReduceMin, the average, max and global pools) in float32 storage, with casts around "
            "them, instead of reading and writing the reduced type",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kEltwiseInFp32 = knobs::declareKnob({
    .name = "cuda.precision.eltwise_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, keep elementwise ops and fused elementwise chains (activations, "
            "arithmetic, Where) in float32 storage, with casts around them, instead of rounding "
            "every intermediate they write to the reduced type",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kProductsInFp32 = knobs::declareKnob({
    .name = "cuda.precision.products_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, keep the convolutions and matrix products (Conv, ConvTranspose, "
            "Gemm, MatMul and their fused forms) in float32, with casts around them, while the "
            "ops between them run reduced: the products' rounding goes, their tensor-core speed "
            "too",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kAttentionInFp32 = knobs::declareKnob({
    .name = "cuda.precision.attention_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, keep fused attention (kiln.Attention) in float32, with casts "
            "around it: its products then take TF32-free float32 math and the unfused kernels "
            "(the flash kernel is reduced-only), for sequences long enough that the reduced "
            "type's scores lose the accuracy a route needs",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kInputsInFp32 = knobs::declareKnob({
    .name = "cuda.precision.inputs_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, run the nodes that read the graph's inputs (a network's first "
            "convolution, say) in float32, instead of casting the inputs to the reduced type "
            "first",
    .backends = {"cuda"},
    .changesNumerics = true,
});

const knobs::Knob kOutputsInFp32 = knobs::declareKnob({
    .name = "cuda.precision.outputs_fp32",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "under fp16 or bf16, run the nodes that write the graph's outputs (the classifier's "
            "last product, say) in float32, instead of computing them reduced and casting the "
            "result back",
    .backends = {"cuda"},
    .changesNumerics = true,
});

namespace {

constexpr int64_t kOnnxFloat = 1;
constexpr int64_t kOnnxFloat16 = 10;
constexpr int64_t kOnnxBFloat16 = 16;

// Ops whose CUDA kernels take float16 and bfloat16, each with the float inputs that stay float32
// (parameters that are not data: Resize's roi and scales).
const std::map<std::string, std::set<size_t>>& reducedOps() {
  static const std::map<std::string, std::set<size_t>> ops = {
      // Products: cuBLASLt and cuDNN with fp32 accumulation.
      {"Conv", {}},
      {"ConvTranspose", {}},
      {"Gemm", {}},
      {"MatMul", {}},
      {"kiln.FusedConv", {}},
      {"kiln.NhwcConv", {}},
      {"kiln.FusedGemm", {}},
      {"kiln.Attention", {}},
      // Elementwise (computed in float32 registers, stored in the reduced type).
      {"Relu", {}},
      {"LeakyRelu", {}},
      {"Sigmoid", {}},
      {"Tanh", {}},
      {"HardSigmoid", {}},
      {"HardSwish", {}},
      {"Gelu", {}},
      {"Erf", {}},
      {"Exp", {}},
      {"Sqrt", {}},
      {"Reciprocal", {}},
      {"Neg", {}},
      {"Abs", {}},
      {"Elu", {}},
      {"Softplus", {}},
      {"Clip", {}},
      {"PRelu", {}},
      {"Add", {}},
      {"Sub", {}},
      {"Mul", {}},
      {"Div", {}},
      {"Max", {}},
      {"Min", {}},
      {"Where", {}},
      {"kiln.FusedElementwise", {}},
      // Data movement (moves bytes; the type only sets their width).
      {"Transpose", {}},
      {"Concat", {}},
      {"Split", {}},
      {"Slice", {}},
      {"Gather", {}},
      {"Expand", {}},
      {"Pad", {}},
      {"Reshape", {}},
      {"Flatten", {}},
      {"Squeeze", {}},
      {"Unsqueeze", {}},
      {"Identity", {}},
      {"Resize", {1, 2}},
      {"DepthToSpace", {}},
      {"SpaceToDepth", {}},
      {"Tile", {}},
      // Pooling.
      {"MaxPool", {}},
      {"AveragePool", {}},
      {"GlobalAveragePool", {}},
      {"GlobalMaxPool", {}},
      {"kiln.NhwcMaxPool", {}},
      {"kiln.NhwcAveragePool", {}},
      {"kiln.NhwcGlobalAveragePool", {}},
      {"kiln.NhwcGlobalMaxPool", {}},
      // Reductions over float data.
      {"ReduceMean", {}},
      {"ReduceSum", {}},
      {"ReduceMax", {}},
      {"ReduceMin", {}},
  };
  return ops;
}

// Reductions and pools: reduced only when cuda.precision.reduce_fp32 is off.
bool isReductionOrPool(const std::string& op) {
  static const std::set<std::string> ops = {"ReduceMean",
                                            "ReduceSum",
                                            "ReduceMax",
                                            "ReduceMin",
                                            "MaxPool",
                                            "AveragePool",
                                            "GlobalAveragePool",
                                            "GlobalMaxPool",
                                            "kiln.NhwcMaxPool",
                                            "kiln.NhwcAveragePool",
                                            "kiln.NhwcGlobalAveragePool",
                                            "kiln.NhwcGlobalMaxPool"};
  return ops.count(op) > 0;
}

// Elementwise ops: reduced only when cuda.precision.eltwise_fp32 is off.
bool isElementwise(const std::string& op) {
  static const std::set<std::string> ops = {
      "Relu",       "LeakyRelu", "Sigmoid", "Tanh",  "HardSigmoid",
      "HardSwish",  "Gelu",      "Erf",     "Exp",   "Sqrt",
      "Reciprocal", "Neg",       "Abs",     "Elu",   "Softplus",
      "Clip",       "PRelu",     "Add",     "Sub",   "Mul",
      "Div",        "Max",       "Min",     "Where", "kiln.FusedElementwise"};
  return ops.count(op) > 0;
}

// Whether `node` reads one of the graph's inputs.
bool readsGraphInput(const ir::Node& node, const ir::Graph& graph) {
  for (const ir::Value* input : node.inputs) {
    for (const ir::Value* graphInput : graph.inputs) {
      if (input && input == graphInput) return true;
    }
  }
  return false;
}

// Whether `node` writes one of the graph's outputs.
bool writesGraphOutput(const ir::Node& node, const ir::Graph& graph) {
  for (const ir::Value* output : node.outputs) {
    for (const ir::Value* graphOutput : graph.outputs) {
      if (output && output == graphOutput) return true;
    }
  }
  return false;
}

// Normalisations and softmax: reduced only when cuda.precision.norm_fp32 is off.
const std::set<std::string>& normOps() {
  static const std::set<std::string> ops = {"LayerNormalization",
                                            "BatchNormalization",
                                            "InstanceNormalization",
                                            "GroupNormalization",
                                            "Softmax",
                                            "LogSoftmax"};
  return ops;
}

std::string qualifiedOp(const ir::Node& node) {
  return node.domain.empty() ? node.opType : node.domain + "." + node.opType;
}

bool hasFloat32Data(const ir::Node& node) {
  for (const ir::Value* output : node.outputs) {
    if (output && output->dtype == ir::DType::kFloat32) return true;
  }
  return false;
}

bool allOutputsConstant(const ir::Node& node) {
  for (const ir::Value* output : node.outputs) {
    if (output && !output->constant) return false;
  }
  return true;
}

// The float32 inputs of `node` that stay float32 when it runs reduced.
const std::set<size_t>& keptInputs(const ir::Node& node) {
  static const std::set<size_t> none;
  const auto& ops = reducedOps();
  auto it = ops.find(qualifiedOp(node));
  return it == ops.end() ? none : it->second;
}

const char* shortName(ir::DType dtype) {
  return dtype == ir::DType::kBFloat16 ? "bf16" : dtype == ir::DType::kFloat16 ? "fp16" : "fp32";
}

}  // namespace

std::optional<ir::DType> reducedTypeFor(const ir::Node& node, const knobs::Route& route) {
  const std::string precision = route.value(kPrecision, &node);
  if (precision != "fp16" && precision != "bf16") return std::nullopt;
  const std::string op = qualifiedOp(node);
  const bool norm =
      (node.domain.empty() && normOps().count(node.opType)) || op == "kiln.AddLayerNormalization";
  if (norm) {
    if (route.value(kNormInFp32, &node) == "on") return std::nullopt;
  } else if (!reducedOps().count(op)) {
    return std::nullopt;
  }
  if (isReductionOrPool(op) && route.value(kReduceInFp32, &node) == "on") return std::nullopt;
  if (isElementwise(op) && route.value(kEltwiseInFp32, &node) == "on") return std::nullopt;
  if (op == "kiln.Attention" && route.value(kAttentionInFp32, &node) == "on") return std::nullopt;
  static const std::set<std::string> kProducts = {
      "Conv",           "ConvTranspose", "Gemm",          "MatMul",
      "kiln.FusedConv", "kiln.NhwcConv", "kiln.FusedGemm"};
  if (kProducts.count(op) && route.value(kProductsInFp32, &node) == "on") return std::nullopt;
  if (!hasFloat32Data(node) || allOutputsConstant(node)) return std::nullopt;
  // Every float input and output must be float32 (a node already mixing types stays as it is).
  for (const ir::Value* value : node.inputs) {
    if (value && ir::isFloating(value->dtype) && value->dtype != ir::DType::kFloat32) {
      return std::nullopt;
    }
  }
  return precision == "fp16" ? ir::DType::kFloat16 : ir::DType::kBFloat16;
}

bool allowsTf32(const ir::Node& node, const knobs::Route& route) {
  return route.value(kPrecision, &node) == "tf32";
}

Result<std::vector<std::string>> assignPrecision(ir::Graph& graph, const knobs::Route& route) {
  std::vector<std::string> changes;
  // Which nodes run reduced, decided on the graph as it is (before any rewrite).
  std::vector<std::pair<ir::Node*, ir::DType>> reduced;
  const bool outputsInFp32 = route.value(kOutputsInFp32) == "on";
  const bool inputsInFp32 = route.value(kInputsInFp32) == "on";
  for (const auto& node : graph.nodes()) {
    if (outputsInFp32 && writesGraphOutput(*node, graph)) continue;
    if (inputsInFp32 && readsGraphInput(*node, graph)) continue;
    if (auto type = reducedTypeFor(*node, route)) reduced.emplace_back(node.get(), *type);
  }
  if (reduced.empty()) return changes;

  // twins[{value, type}]: `value` in `type`, made once and shared by every reader.
  std::map<std::pair<const ir::Value*, ir::DType>, ir::Value*> twins;
  auto twinOf = [&](ir::Value* value, ir::DType type, const ir::Node* reader) -> ir::Value* {
    auto key = std::make_pair(static_cast<const ir::Value*>(value), type);
    if (auto it = twins.find(key); it != twins.end()) return it->second;
    ir::Value* twin = graph.addUniqueValue(value->name + "_" + shortName(type));
    twin->dtype = type;
    twin->shape = value->shape;
    twin->hasType = true;
    if (value->constant) {
      twin->constant = value->constant->castTo(type);
      twin->isInitializer = value->isInitializer;
      changes.push_back(fmt::format("converted constant {} to {}", value->name, shortName(type)));
    } else {
      // Placed just before the first reader; readers come in node order, so it precedes all.
      ir::Node* cast = graph.insertNode("Cast", reader);
      cast->name = twin->name + "_cast";
      cast->opsetVersion = 19;
      cast->attributes["to"] = ir::Attribute{type == ir::DType::kFloat16    ? kOnnxFloat16
                                             : type == ir::DType::kBFloat16 ? kOnnxBFloat16
                                                                            : kOnnxFloat};
      cast->inputs = {value};
      cast->outputs = {twin};
      twin->producer = cast;
      changes.push_back(fmt::format("cast {} to {}", value->name, shortName(type)));
    }
    twins.emplace(key, twin);
    return twin;
  };

  for (auto [node, type] : reduced) {
    const std::set<size_t>& kept = keptInputs(*node);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      ir::Value* input = node->inputs[i];
      if (!input || input->dtype != ir::DType::kFloat32 || kept.count(i)) continue;
      node->inputs[i] = twinOf(input, type, node);
    }
    // Outputs: the node writes a reduced twin; the float32 value, for the readers that stay in
    // float32 and for the graph's outputs, becomes a Cast back from it.
    const ir::Node* next = nullptr;
    for (size_t n = 0; n + 1 < graph.nodes().size(); ++n) {
      if (graph.nodes()[n].get() == node) {
        next = graph.nodes()[n + 1].get();
        break;
      }
    }
    for (ir::Value*& output : node->outputs) {
      if (!output || output->dtype != ir::DType::kFloat32) continue;
      ir::Value* original = output;
      ir::Value* twin = graph.addUniqueValue(original->name + "_" + shortName(type));
      twin->dtype = type;
      twin->shape = original->shape;
      twin->hasType = true;
      twin->producer = node;
      output = twin;
      ir::Node* back = graph.insertNode("Cast", next);
      back->name = original->name + "_to_fp32";
      back->opsetVersion = 19;
      back->attributes["to"] = ir::Attribute{kOnnxFloat};
      back->inputs = {twin};
      back->outputs = {original};
      original->producer = back;
      twins.emplace(std::make_pair(static_cast<const ir::Value*>(original), type), twin);
    }
    changes.push_back(fmt::format("{} '{}': {}", node->opType, node->name, shortName(type)));
  }

  // Drop the casts back to float32 that nothing reads (the chain's interior).
  size_t dropped = 0;
  for (;;) {
    std::set<const ir::Node*> dead;
    for (const auto& node : graph.nodes()) {
      if (node->opType != "Cast" || !node->domain.empty()) continue;
      const ir::Value* out = node->outputs[0];
      if (!graph.isGraphOutput(out) && graph.consumers(out).empty()) dead.insert(node.get());
    }
    if (dead.empty()) break;
    dropped += graph.removeNodes([&](const ir::Node& node) { return dead.count(&node) > 0; });
  }
  graph.removeUnusedValues();
  if (dropped) changes.push_back(fmt::format("dropped {} casts nothing reads", dropped));
  KILN_RETURN_IF_ERROR(graph.verify());
  return changes;
}

}  // namespace kiln::cuda
