// Reference kernels for kiln's own ops (domain "kiln"), the ones fusion passes create.
//
// Each runs the ONNX op it extends with that op's own reference kernel (Conv, Gemm), then applies
// the residual and the activation in double, so a fused op computes what its unfused chain
// computes.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kiln/ir/op_schema.h"
#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

namespace {

// The activation the node's `activation` attributes name, applied in place.
Status applyActivation(const KernelContext& ctx, std::vector<double>& values) {
  const ir::Node& node = ctx.node();
  if (!node.hasAttribute("activation")) return Status::ok();
  KILN_ASSIGN_OR_RETURN(std::string activation, node.getString("activation", ""));
  std::function<double(double)> f;
  if (activation == "Relu") {
    f = [](double x) { return x < 0 ? 0.0 : x; };
  } else if (activation == "LeakyRelu") {
    KILN_ASSIGN_OR_RETURN(const double alpha, node.getFloat("activation_alpha", 0.01f));
    f = [alpha](double x) { return x < 0 ? alpha * x : x; };
  } else if (activation == "Clip") {
    const float inf = std::numeric_limits<float>::infinity();
    KILN_ASSIGN_OR_RETURN(const double low, node.getFloat("activation_alpha", -inf));
    KILN_ASSIGN_OR_RETURN(const double high, node.getFloat("activation_beta", inf));
    // As Clip: min first, then max, so min > max gives max everywhere; NaN stays NaN.
    f = [low, high](double x) {
      if (x < low) x = low;
      if (x > high) x = high;
      return x;
    };
  } else if (activation == "Sigmoid") {
    f = [](double x) { return 1 / (1 + std::exp(-x)); };
  } else if (activation == "HardSigmoid") {
    KILN_ASSIGN_OR_RETURN(const double alpha, node.getFloat("activation_alpha", 0.2f));
    KILN_ASSIGN_OR_RETURN(const double beta, node.getFloat("activation_beta", 0.5f));
    f = [alpha, beta](double x) { return std::max(0.0, std::min(1.0, alpha * x + beta)); };
  } else if (activation == "HardSwish") {
    f = [](double x) { return x * std::max(0.0, std::min(1.0, x / 6 + 0.5)); };
  } else if (activation == "Tanh") {
    f = [](double x) { return std::tanh(x); };
  } else if (activation == "Gelu") {
    f = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  } else if (activation == "GeluTanh") {
    f = [](double x) {
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    };
  } else if (activation == "Silu") {
    f = [](double x) { return x / (1 + std::exp(-x)); };
  } else {
    return ctx.unsupportedHere("activation '{}'", activation);
  }
  std::transform(values.begin(), values.end(), values.begin(), f);
  return Status::ok();
}

// The kernel of an ONNX op registered earlier (neural before fused, see
// KernelRegistry::instance).
KernelFn onnxKernel(const KernelRegistry& registry, const char* opType) {
  const KernelFn* kernel = registry.find("", opType);
  KILN_CHECK(kernel != nullptr);
  return *kernel;
}

// Conv on (X, W, B) into the output, then + residual, then the activation.
Status runFusedConv(const KernelFn& conv, KernelContext& ctx) {
  std::vector<const Tensor*> convInputs;
  for (size_t i = 0; i < std::min<size_t>(3, ctx.inputCount()); ++i) {
    convInputs.push_back(ctx.optionalInput(i));
  }
  KernelContext convContext(ctx.node(), convInputs, std::span<Tensor>(&ctx.output(0), 1));
  KILN_RETURN_IF_ERROR(conv(convContext));
  std::vector<double> values = readAsDouble(ctx.output(0));
  if (const Tensor* residual = ctx.optionalInput(3)) {
    const std::vector<double> addend = readAsDouble(*residual);
    for (size_t i = 0; i < values.size(); ++i) values[i] += addend[i];
  }
  KILN_RETURN_IF_ERROR(applyActivation(ctx, values));
  writeFromDouble(ctx.output(0), values);
  return Status::ok();
}

// Gemm on A seen as the [M, K] matrix it is in memory (a batched A's leading axes fold into M),
// then the activation.
Status runFusedGemm(const KernelFn& gemm, KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  Tensor& y = ctx.output(0);
  const int64_t k = a.shape()[a.rank() - 1];
  const int64_t n = y.shape()[y.rank() - 1];
  const Tensor matrixA = a.rank() > 2 ? a.reshaped(Shape{a.elementCount() / k, k}) : a;
  Tensor matrixY = y.rank() > 2 ? y.reshaped(Shape{y.elementCount() / n, n}) : y;
  const std::vector<const Tensor*> gemmInputs = {&matrixA, &ctx.input(1), ctx.optionalInput(2)};
  KernelContext gemmContext(ctx.node(), gemmInputs, std::span<Tensor>(&matrixY, 1));
  KILN_RETURN_IF_ERROR(gemm(gemmContext));
  std::vector<double> values = readAsDouble(y);
  KILN_RETURN_IF_ERROR(applyActivation(ctx, values));
  writeFromDouble(y, values);
  return Status::ok();
}

}  // namespace

void registerFusedKernels(KernelRegistry& registry) {
  registry.add(
      "FusedConv",
      [conv = onnxKernel(registry, "Conv")](KernelContext& ctx) { return runFusedConv(conv, ctx); },
      ir::kKilnDomain);
  registry.add(
      "FusedGemm",
      [gemm = onnxKernel(registry, "Gemm")](KernelContext& ctx) { return runFusedGemm(gemm, ctx); },
      ir::kKilnDomain);
}

}  // namespace kiln::reference
