// Reference kernels for the normalizations: BatchNormalization (inference), LayerNormalization,
// InstanceNormalization, LpNormalization, MeanVarianceNormalization. Statistics in double.
#include <array>
#include <cmath>
#include <set>

#include "kiln/ir/op_schema.h"
#include "kiln/reference/kernels/broadcast.h"
#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

namespace {

int64_t innerSize(const Shape& shape, size_t fromAxis) {
  int64_t size = 1;
  for (size_t i = fromAxis; i < shape.rank(); ++i) size *= shape[i];
  return size;
}

struct Statistics {
  double mean;
  double invStdDev;
};

// Mean and 1/sqrt(variance + epsilon) of xs[begin, end), in two passes (the deviations from the
// mean, not E[x²] − E[x]², which cancels badly).
Statistics normalizationStatistics(const std::vector<double>& xs, size_t begin, size_t end,
                                   float epsilon) {
  const double count = static_cast<double>(end - begin);
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += xs[i];
  const double mean = sum / count;
  double squares = 0;
  for (size_t i = begin; i < end; ++i) squares += (xs[i] - mean) * (xs[i] - mean);
  return {mean, 1.0 / std::sqrt(squares / count + static_cast<double>(epsilon))};
}

bool hasOutput(const KernelContext& ctx, size_t i) {
  return i < ctx.outputCount() && ctx.node().outputs[i] != nullptr;
}

// y = (x - mean) / sqrt(var + epsilon) * scale + B, with one set of statistics per channel, or
// per element of a sample for the pre-opset-9 spatial=0 form.
Status runBatchNormalization(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(float epsilon, ctx.node().getFloat("epsilon", 1e-5f));
  KILN_ASSIGN_OR_RETURN(int64_t spatial, ctx.node().getInt("spatial", 1));
  const Tensor& x = ctx.input(0);
  const std::vector<double> xs = readAsDouble(x);
  const std::vector<double> scale = readAsDouble(ctx.input(1));
  const std::vector<double> bias = readAsDouble(ctx.input(2));
  const std::vector<double> mean = readAsDouble(ctx.input(3));
  const std::vector<double> var = readAsDouble(ctx.input(4));
  const bool perElement = ctx.opset() < 9 && spatial == 0;
  const int64_t channels = x.shape()[1];
  const int64_t inner = innerSize(x.shape(), 2);
  std::vector<double> ys(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t flat = static_cast<int64_t>(i);
    const size_t p =
        static_cast<size_t>(perElement ? flat % (channels * inner) : flat / inner % channels);
    ys[i] =
        (xs[i] - mean[p]) / std::sqrt(var[p] + static_cast<double>(epsilon)) * scale[p] + bias[p];
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

// `tensor`'s values repeated out to `shape` under broadcasting.
std::vector<double> broadcastValues(const Tensor& tensor, const Shape& shape) {
  const std::vector<double> values = readAsDouble(tensor);
  std::vector<double> result(static_cast<size_t>(shape.elementCount()));
  forEachBroadcastIndex<1>(shape, {tensor.shape()},
                           [&](int64_t out, const std::array<int64_t, 1>& in) {
                             result[static_cast<size_t>(out)] = values[static_cast<size_t>(in[0])];
                           });
  return result;
}

// LayerNormalization of `xs` (x's values; x gives the shape), for LayerNormalization and
// kiln.AddLayerNormalization. With `statistics`, the Mean and InvStdDev outputs 1 and 2.
Status layerNormalize(KernelContext& ctx, const Tensor& x, const std::vector<double>& xs,
                      bool statistics) {
  KILN_ASSIGN_OR_RETURN(float epsilon, ctx.node().getFloat("epsilon", 1e-5f));
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, ir::normalizeAxis(rawAxis, static_cast<int64_t>(x.rank())));
  const std::vector<double> scale = broadcastValues(ctx.input(1), x.shape());
  const std::vector<double> bias =
      ctx.hasInput(2) ? broadcastValues(ctx.input(2), x.shape()) : std::vector<double>(xs.size());
  const int64_t inner = innerSize(x.shape(), static_cast<size_t>(axis));
  const int64_t rows = inner == 0 ? 0 : x.elementCount() / inner;
  std::vector<double> ys(xs.size());
  std::vector<double> means(static_cast<size_t>(rows));
  std::vector<double> invStdDevs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const size_t begin = static_cast<size_t>(r * inner);
    const size_t end = begin + static_cast<size_t>(inner);
    const auto [mean, invStdDev] = normalizationStatistics(xs, begin, end, epsilon);
    for (size_t i = begin; i < end; ++i) ys[i] = (xs[i] - mean) * invStdDev * scale[i] + bias[i];
    means[static_cast<size_t>(r)] = mean;
    invStdDevs[static_cast<size_t>(r)] = invStdDev;
  }
  writeFromDouble(ctx.output(0), ys);
  if (statistics && hasOutput(ctx, 1)) writeFromDouble(ctx.output(1), means);
  if (statistics && hasOutput(ctx, 2)) writeFromDouble(ctx.output(2), invStdDevs);
  return Status::ok();
}

Status runLayerNormalization(KernelContext& ctx) {
  return layerNormalize(ctx, ctx.input(0), readAsDouble(ctx.input(0)), true);
}

// kiln.AddLayerNormalization: Sum = X + Skip rounded to their dtype, as an Add would leave it
// (and the Sum output, if any, is that), then LayerNormalization of Sum.
Status runAddLayerNormalization(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<double> sums = readAsDouble(x);
  const std::vector<double> skip = readAsDouble(ctx.input(3));
  for (size_t i = 0; i < sums.size(); ++i) sums[i] += skip[i];
  Tensor rounded(x.dtype(), x.shape());
  writeFromDouble(rounded, sums);
  if (hasOutput(ctx, 1)) writeFromDouble(ctx.output(1), sums);
  return layerNormalize(ctx, rounded, readAsDouble(rounded), false);
}

Status runInstanceNormalization(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(float epsilon, ctx.node().getFloat("epsilon", 1e-5f));
  const Tensor& x = ctx.input(0);
  const std::vector<double> xs = readAsDouble(x);
  const std::vector<double> scale = readAsDouble(ctx.input(1));
  const std::vector<double> bias = readAsDouble(ctx.input(2));
  const int64_t channels = x.shape()[1];
  const int64_t inner = innerSize(x.shape(), 2);
  const int64_t planes = x.shape()[0] * channels;
  std::vector<double> ys(xs.size());
  for (int64_t plane = 0; plane < planes; ++plane) {
    const size_t begin = static_cast<size_t>(plane * inner);
    const size_t end = begin + static_cast<size_t>(inner);
    const auto [mean, invStdDev] = normalizationStatistics(xs, begin, end, epsilon);
    const size_t c = static_cast<size_t>(plane % channels);
    for (size_t i = begin; i < end; ++i) ys[i] = (xs[i] - mean) * invStdDev * scale[c] + bias[c];
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

Status runLpNormalization(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.node().getInt("p", 2));
  const Tensor& x = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, ir::normalizeAxis(rawAxis, static_cast<int64_t>(x.rank())));
  const int64_t length = x.shape()[static_cast<size_t>(axis)];
  const int64_t inner = innerSize(x.shape(), static_cast<size_t>(axis) + 1);
  const int64_t outer = length * inner == 0 ? 0 : x.elementCount() / (length * inner);
  const std::vector<double> xs = readAsDouble(x);
  std::vector<double> ys(xs.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) { return static_cast<size_t>((o * length + k) * inner + i); };
      double norm = 0;
      for (int64_t k = 0; k < length; ++k) {
        norm += p == 1 ? std::fabs(xs[at(k)]) : xs[at(k)] * xs[at(k)];
      }
      if (p == 2) norm = std::sqrt(norm);
      for (int64_t k = 0; k < length; ++k) ys[at(k)] = xs[at(k)] / norm;
    }
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

// (x - mean) / (stddev + 1e-9) over `axes`, as ONNX's function body defines it.
Status runMeanVarianceNormalization(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.node().getInts("axes", {0, 2, 3}));
  const Tensor& x = ctx.input(0);
  const int64_t rank = static_cast<int64_t>(x.rank());
  std::set<int64_t> reduced;
  for (int64_t axis : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t normalized, ir::normalizeAxis(axis, rank));
    reduced.insert(normalized);
  }
  // Each element's statistics slot: its index in the shape with the reduced axes set to 1.
  std::vector<int64_t> statDims = x.shape().dims();
  for (int64_t axis : reduced) statDims[static_cast<size_t>(axis)] = 1;
  const Shape statShape(statDims);
  const int64_t slots = statShape.elementCount();
  const int64_t count = slots == 0 ? 0 : x.elementCount() / slots;
  std::vector<size_t> slotOf(static_cast<size_t>(x.elementCount()));
  forEachBroadcastIndex<1>(x.shape(), {statShape},
                           [&](int64_t out, const std::array<int64_t, 1>& in) {
                             slotOf[static_cast<size_t>(out)] = static_cast<size_t>(in[0]);
                           });
  const std::vector<double> xs = readAsDouble(x);
  std::vector<double> mean(static_cast<size_t>(slots));
  std::vector<double> var(static_cast<size_t>(slots));
  for (size_t i = 0; i < xs.size(); ++i) mean[slotOf[i]] += xs[i] / static_cast<double>(count);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double d = xs[i] - mean[slotOf[i]];
    var[slotOf[i]] += d * d / static_cast<double>(count);
  }
  std::vector<double> ys(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    ys[i] = (xs[i] - mean[slotOf[i]]) / (std::sqrt(var[slotOf[i]]) + 1e-9);
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

}  // namespace

void registerNormalizationKernels(KernelRegistry& registry) {
  registry.add("BatchNormalization", runBatchNormalization);
  registry.add("LayerNormalization", runLayerNormalization);
  registry.add("AddLayerNormalization", runAddLayerNormalization, ir::kKilnDomain);
  registry.add("InstanceNormalization", runInstanceNormalization);
  registry.add("LpNormalization", runLpNormalization);
  registry.add("MeanVarianceNormalization", runMeanVarianceNormalization);
}

}  // namespace kiln::reference
