// Reference kernels for the pooling ops (MaxPool, AveragePool, LpPool, the global pools) and LRN.
#include <cmath>
#include <limits>

#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

namespace {

// The flat index MaxPool reports for a spatial input offset: row-major, or column-major over the
// spatial axes with storage_order=1.
int64_t storageIndex(int64_t spatialOffset, const std::vector<int64_t>& extent, bool columnMajor) {
  if (!columnMajor) return spatialOffset;
  std::vector<int64_t> coords(extent.size());
  for (size_t i = extent.size(); i-- > 0;) {
    coords[i] = spatialOffset % extent[i];
    spatialOffset /= extent[i];
  }
  int64_t index = 0;
  for (size_t i = extent.size(); i-- > 0;) index = index * extent[i] + coords[i];
  return index;
}

template <typename T>
void maxPool(const ir::WindowGeometry& g, const Tensor& x, Tensor& y, Tensor* indices,
             bool columnMajor) {
  const int64_t planes = x.shape()[0] * x.shape()[1];
  const int64_t inSize = product(g.input);
  const int64_t outSize = product(g.output);
  auto in = x.data<T>();
  auto out = y.mutableData<T>();
  std::vector<int64_t> position(g.spatialRank(), 0);
  std::vector<WindowTap> taps;
  for (int64_t o = 0; o < outSize; ++o, nextIndex(position, g.output)) {
    windowTaps(g, position, g.input, taps);
    for (int64_t plane = 0; plane < planes; ++plane) {
      // Padding never wins: a window entirely in padding yields the type's lowest value.
      T best = std::numeric_limits<T>::lowest();
      if constexpr (kFloatLike<T>) {
        best = ir::convertElement<T>(-std::numeric_limits<double>::infinity());
      }
      int64_t bestOffset = -1;
      for (const WindowTap& tap : taps) {
        const T value = in[static_cast<size_t>(plane * inSize + tap.target)];
        const double v = ir::convertElement<double>(value);
        const double b = ir::convertElement<double>(best);
        // NaN loses to any number, as in ONNX's reference, so a NaN first tap is not sticky.
        if (bestOffset < 0 || v > b || (std::isnan(b) && !std::isnan(v))) {
          best = value;
          bestOffset = tap.target;
        }
      }
      out[static_cast<size_t>(plane * outSize + o)] = best;
      if (indices) {
        indices->mutableData<int64_t>()[static_cast<size_t>(plane * outSize + o)] =
            bestOffset < 0 ? -1 : plane * inSize + storageIndex(bestOffset, g.input, columnMajor);
      }
    }
  }
}

Status runMaxPool(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(ir::WindowGeometry g, ir::resolvePoolGeometry(ctx.node(), x.shape()));
  KILN_ASSIGN_OR_RETURN(int64_t storageOrder, ctx.node().getInt("storage_order", 0));
  Tensor* indices = ctx.outputCount() > 1 && ctx.node().outputs[1] ? &ctx.output(1) : nullptr;
  Tensor& y = ctx.output(0);
  ir::visitDType(x.dtype(),
                 [&](auto tag) { maxPool<decltype(tag)>(g, x, y, indices, storageOrder == 1); });
  return Status::ok();
}

// AveragePool and LpPool: a reduction of each window's values inside the input.
enum class PoolKind { kAverage, kLp };

Status runWindowPool(KernelContext& ctx, PoolKind kind) {
  const Tensor& x = ctx.input(0);
  KILN_ASSIGN_OR_RETURN(ir::WindowGeometry g, ir::resolvePoolGeometry(ctx.node(), x.shape()));
  KILN_ASSIGN_OR_RETURN(int64_t countIncludePad, ctx.node().getInt("count_include_pad", 0));
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.node().getInt("p", 2));
  const int64_t planes = x.shape()[0] * x.shape()[1];
  const int64_t inSize = product(g.input);
  const int64_t outSize = product(g.output);
  const std::vector<double> xs = readAsDouble(x);
  std::vector<double> ys(static_cast<size_t>(planes * outSize));
  std::vector<int64_t> position(g.spatialRank(), 0);
  std::vector<WindowTap> taps;
  for (int64_t o = 0; o < outSize; ++o, nextIndex(position, g.output)) {
    windowTaps(g, position, g.input, taps);
    const double divisor = countIncludePad ? static_cast<double>(paddedWindowSize(g, position))
                                           : static_cast<double>(taps.size());
    for (int64_t plane = 0; plane < planes; ++plane) {
      double sum = 0;
      for (const WindowTap& tap : taps) {
        const double value = xs[static_cast<size_t>(plane * inSize + tap.target)];
        sum +=
            kind == PoolKind::kAverage ? value : std::pow(std::fabs(value), static_cast<double>(p));
      }
      ys[static_cast<size_t>(plane * outSize + o)] =
          kind == PoolKind::kAverage ? sum / divisor : std::pow(sum, 1.0 / static_cast<double>(p));
    }
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

Status runGlobalPool(KernelContext& ctx, bool average) {
  const Tensor& x = ctx.input(0);
  const int64_t planes = x.shape()[0] * x.shape()[1];
  const int64_t planeSize = planes == 0 ? 0 : x.elementCount() / planes;
  const std::vector<double> xs = readAsDouble(x);
  std::vector<double> ys(static_cast<size_t>(planes));
  for (int64_t plane = 0; plane < planes; ++plane) {
    double sum = 0;
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < planeSize; ++i) {
      const double value = xs[static_cast<size_t>(plane * planeSize + i)];
      sum += value;
      best = std::max(best, value);
    }
    ys[static_cast<size_t>(plane)] = average ? sum / static_cast<double>(planeSize) : best;
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

// y = x / (bias + alpha / size * sum of x^2 over the neighbouring channels)^beta.
Status runLrn(KernelContext& ctx) {
  const ir::Node& node = ctx.node();
  KILN_ASSIGN_OR_RETURN(int64_t size, node.getInt("size", 1));
  KILN_ASSIGN_OR_RETURN(float alpha, node.getFloat("alpha", 1e-4f));
  KILN_ASSIGN_OR_RETURN(float beta, node.getFloat("beta", 0.75f));
  KILN_ASSIGN_OR_RETURN(float bias, node.getFloat("bias", 1.0f));
  const Tensor& x = ctx.input(0);
  const int64_t batch = x.shape()[0];
  const int64_t channels = x.shape()[1];
  const int64_t planeSize = batch * channels == 0 ? 0 : x.elementCount() / (batch * channels);
  const int64_t before = (size - 1) / 2;
  const int64_t after = size - 1 - before;
  const std::vector<double> xs = readAsDouble(x);
  std::vector<double> ys(xs.size());
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t first = std::max<int64_t>(0, c - before);
      const int64_t last = std::min<int64_t>(channels - 1, c + after);
      for (int64_t i = 0; i < planeSize; ++i) {
        double squares = 0;
        for (int64_t k = first; k <= last; ++k) {
          const double v = xs[static_cast<size_t>((n * channels + k) * planeSize + i)];
          squares += v * v;
        }
        const size_t index = static_cast<size_t>((n * channels + c) * planeSize + i);
        const double scale = static_cast<double>(bias) +
                             static_cast<double>(alpha) / static_cast<double>(size) * squares;
        ys[index] = xs[index] / std::pow(scale, static_cast<double>(beta));
      }
    }
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

}  // namespace

void registerPoolKernels(KernelRegistry& registry) {
  registry.add("MaxPool", runMaxPool);
  registry.add("AveragePool",
               [](KernelContext& ctx) { return runWindowPool(ctx, PoolKind::kAverage); });
  registry.add("LpPool", [](KernelContext& ctx) { return runWindowPool(ctx, PoolKind::kLp); });
  registry.add("GlobalAveragePool", [](KernelContext& ctx) { return runGlobalPool(ctx, true); });
  registry.add("GlobalMaxPool", [](KernelContext& ctx) { return runGlobalPool(ctx, false); });
  registry.add("LRN", runLrn);
}

}  // namespace kiln::reference
