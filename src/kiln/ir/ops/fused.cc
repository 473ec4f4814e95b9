// Shape inference for kiln's own ops (domain "kiln"), the ones fusion passes create.
//
// FusedConv(X, W, B?, residual?) is Conv (same attributes) followed by `+ residual` and the
// activation; FusedGemm(A, B, C?) is Gemm (same attributes) followed by the activation, with A
// also allowed to be batched ([..., K], transA=0) as MatMul's A is. Both reuse the ONNX op's
// inference so the shapes and the errors are Conv's and Gemm's own.
#include <algorithm>
#include <array>
#include <string_view>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

// The activations the fused ops apply (attribute `activation`; absent means none). Their
// parameters travel as `activation_alpha` / `activation_beta` (LeakyRelu's alpha, HardSigmoid's
// alpha and beta, Clip's min and max). Silu is x * Sigmoid(x), which exporters write as that
// Sigmoid and Mul (torch's SiLU, EfficientNet's swish). GeluTanh is Gelu with approximate="tanh"
// (GPT-2's), 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
constexpr std::array<std::string_view, 10> kActivations = {
    "Relu",      "LeakyRelu", "Clip", "Sigmoid",  "HardSigmoid",
    "HardSwish", "Tanh",      "Gelu", "GeluTanh", "Silu"};

Status checkActivation(const InferContext& ctx) {
  const Node& node = ctx.node();
  if (!node.hasAttribute("activation")) return Status::ok();
  KILN_ASSIGN_OR_RETURN(std::string activation, node.getString("activation", ""));
  if (std::find(kActivations.begin(), kActivations.end(), activation) == kActivations.end()) {
    return ctx.error("activation '{}' is not one of {}", activation, fmt::join(kActivations, ", "));
  }
  // Read for their kind: a non-float parameter is an error here, not in the kernel.
  KILN_RETURN_IF_ERROR(node.getFloat("activation_alpha", 0.0f).status());
  KILN_RETURN_IF_ERROR(node.getFloat("activation_beta", 0.0f).status());
  return Status::ok();
}

Status checkFloatInput(const InferContext& ctx, size_t input, const char* role) {
  const DType dtype = ctx.inputType(input);
  if (dtype == DType::kFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64) {
    return Status::ok();
  }
  return ctx.error("input {} ({}) has dtype {}; {} accepts float16, float32, float64", input, role,
                   dtypeName(dtype), ctx.node().opType);
}

// The schema an ONNX op registered earlier (neural before fused, see OpRegistry::instance).
InferFn onnxInference(const OpRegistry& registry, const char* opType) {
  const OpSchema* schema = registry.find("", opType);
  KILN_CHECK(schema != nullptr);
  return schema->infer;
}

Status inferFusedConv(const InferFn& conv, InferContext& ctx) {
  KILN_RETURN_IF_ERROR(conv(ctx));  // reads inputs 0..2 only
  KILN_RETURN_IF_ERROR(checkActivation(ctx));
  if (ctx.hasInput(3)) {
    const InferContext::OutputType& y = ctx.outputs()[0];
    if (ctx.inputType(3) != y.dtype || ctx.inputShape(3) != y.shape) {
      return ctx.error("residual {}{} must have the convolution's type {}{}",
                       dtypeName(ctx.inputType(3)), ctx.inputShape(3).toString(),
                       dtypeName(y.dtype), y.shape.toString());
    }
  }
  return Status::ok();
}

// A batched A ([..., M, K] with transA=0) multiplies as the [prod(...) * M, K] matrix it is in
// memory, so C may only vary along N.
Status inferBatchedGemm(InferContext& ctx) {
  const Node& node = ctx.node();
  KILN_RETURN_IF_ERROR(checkFloatInput(ctx, 0, "A"));
  const Shape& a = ctx.inputShape(0);
  const Shape& b = ctx.inputShape(1);
  KILN_ASSIGN_OR_RETURN(int64_t transA, node.getInt("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t transB, node.getInt("transB", 0));
  if (transA != 0) return ctx.error("A {} has rank above 2, which needs transA=0", a.toString());
  if (b.rank() != 2) return ctx.error("B {} must be a matrix (rank 2)", b.toString());
  for (size_t i = 1; i < ctx.inputCount(); ++i) {
    if (ctx.hasInput(i) && ctx.inputType(i) != ctx.inputType(0)) {
      return ctx.error("input {} has dtype {}, but A has {}; they must match", i,
                       dtypeName(ctx.inputType(i)), dtypeName(ctx.inputType(0)));
    }
  }
  const int64_t k = a[a.rank() - 1];
  const int64_t kB = transB ? b[1] : b[0];
  const int64_t n = transB ? b[0] : b[1];
  if (k != kB) {
    return ctx.error("inner dimensions differ: A {} gives K={}, B {} (transB={}) gives K={}",
                     a.toString(), k, b.toString(), transB, kB);
  }
  if (ctx.hasInput(2)) {
    const Shape& c = ctx.inputShape(2);
    if (c.rank() > 1 || (c.rank() == 1 && c[0] != 1 && c[0] != n)) {
      return ctx.error("C {} must broadcast to [{}] when A {} is batched", c.toString(), n,
                       a.toString());
    }
  }
  std::vector<int64_t> dims = a.dims();
  dims.back() = n;
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

Status inferFusedGemm(const InferFn& gemm, InferContext& ctx) {
  if (ctx.inputRank(0) > 2) {
    KILN_RETURN_IF_ERROR(inferBatchedGemm(ctx));
  } else {
    KILN_RETURN_IF_ERROR(checkFloatInput(ctx, 0, "A"));
    KILN_RETURN_IF_ERROR(gemm(ctx));
  }
  return checkActivation(ctx);
}

// kiln.AddLayerNormalization (X, Scale, B?, Skip) -> (Y, Sum?): LayerNormalization (its axis
// and epsilon) of Sum = X + Skip, both of one shape and dtype; the Sum output, where something
// else reads the residual stream, holds X + Skip as an Add would (rounded to the dtype).
Status inferAddLayerNorm(const InferFn& layerNorm, InferContext& ctx) {
  if (!ctx.hasInput(3)) return ctx.error("input 3 (Skip) is required");
  if (ctx.inputType(3) != ctx.inputType(0) || ctx.inputShape(3) != ctx.inputShape(0)) {
    return ctx.error("Skip {} {} must have X's dtype and shape, {} {}", dtypeName(ctx.inputType(3)),
                     ctx.inputShape(3).toString(), dtypeName(ctx.inputType(0)),
                     ctx.inputShape(0).toString());
  }
  KILN_RETURN_IF_ERROR(layerNorm(ctx));  // reads inputs 0..2; output 1 is not its Mean here
  if (ctx.outputCount() > 1) ctx.setOutput(1, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

}  // namespace

void registerFusedSchemas(OpRegistry& registry) {
  registry.add({.opType = "FusedConv",
                .domain = kKilnDomain,
                .minInputs = 2,
                .maxInputs = 4,
                .infer = [conv = onnxInference(registry, "Conv")](InferContext& ctx) {
                  return inferFusedConv(conv, ctx);
                }});
  registry.add({.opType = "FusedGemm",
                .domain = kKilnDomain,
                .minInputs = 2,
                .maxInputs = 3,
                .infer = [gemm = onnxInference(registry, "Gemm")](InferContext& ctx) {
                  return inferFusedGemm(gemm, ctx);
                }});
  registry.add({.opType = "AddLayerNormalization",
                .domain = kKilnDomain,
                .minInputs = 2,  // B may be omitted; inferAddLayerNorm requires Skip
                .maxInputs = 4,
                .minOutputs = 1,
                .maxOutputs = 2,
                .infer = [norm = onnxInference(registry, "LayerNormalization")](InferContext& ctx) {
                  return inferAddLayerNorm(norm, ctx);
                }});
}

}  // namespace kiln::ir
