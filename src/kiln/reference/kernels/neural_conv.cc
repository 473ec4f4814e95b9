// Reference kernels for Conv and ConvTranspose: direct loop nests, accumulated in double.
#include "kiln/reference/kernels/neural.h"

namespace kiln::reference {

namespace {

Status runConv(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  KILN_ASSIGN_OR_RETURN(ir::WindowGeometry g,
                        ir::resolveConvGeometry(ctx.node(), x.shape(), w.shape()));
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.node().getInt("group", 1));
  const int64_t batch = x.shape()[0];
  const int64_t channels = x.shape()[1];
  const int64_t outChannels = w.shape()[0];
  const int64_t groupChannels = channels / group;
  const int64_t groupOutChannels = outChannels / group;
  const int64_t inSize = product(g.input);
  const int64_t outSize = product(g.output);
  const int64_t kernelSize = product(g.kernel);

  const std::vector<double> xs = readAsDouble(x);
  const std::vector<double> ws = readAsDouble(w);
  const std::vector<double> bias = ctx.hasInput(2)
                                       ? readAsDouble(ctx.input(2))
                                       : std::vector<double>(static_cast<size_t>(outChannels));
  std::vector<double> ys(static_cast<size_t>(batch * outChannels * outSize));
  std::vector<int64_t> position(g.spatialRank(), 0);
  std::vector<WindowTap> taps;
  for (int64_t o = 0; o < outSize; ++o, nextIndex(position, g.output)) {
    windowTaps(g, position, g.input, taps);
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t m = 0; m < outChannels; ++m) {
        const int64_t firstChannel = m / groupOutChannels * groupChannels;
        double sum = bias[static_cast<size_t>(m)];
        for (int64_t c = 0; c < groupChannels; ++c) {
          const double* xRow = &xs[static_cast<size_t>((n * channels + firstChannel + c) * inSize)];
          const double* wRow = &ws[static_cast<size_t>((m * groupChannels + c) * kernelSize)];
          for (const WindowTap& tap : taps) sum += xRow[tap.target] * wRow[tap.kernel];
        }
        ys[static_cast<size_t>((n * outChannels + m) * outSize + o)] = sum;
      }
    }
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

// Each input element scatters its products with the kernel into the output.
Status runConvTranspose(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  KILN_ASSIGN_OR_RETURN(ir::WindowGeometry g,
                        ir::resolveConvTransposeGeometry(ctx.node(), x.shape(), w.shape()));
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.node().getInt("group", 1));
  const int64_t batch = x.shape()[0];
  const int64_t channels = x.shape()[1];
  const int64_t groupChannels = channels / group;
  const int64_t groupOutChannels = w.shape()[1];
  const int64_t outChannels = groupOutChannels * group;
  const int64_t inSize = product(g.input);
  const int64_t outSize = product(g.output);
  const int64_t kernelSize = product(g.kernel);

  const std::vector<double> xs = readAsDouble(x);
  const std::vector<double> ws = readAsDouble(w);
  std::vector<double> ys(static_cast<size_t>(batch * outChannels * outSize));
  std::vector<int64_t> position(g.spatialRank(), 0);
  std::vector<WindowTap> taps;
  for (int64_t i = 0; i < inSize; ++i, nextIndex(position, g.input)) {
    windowTaps(g, position, g.output, taps);
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t c = 0; c < channels; ++c) {
        const double value = xs[static_cast<size_t>((n * channels + c) * inSize + i)];
        const int64_t firstOutChannel = c / groupChannels * groupOutChannels;
        for (int64_t m = 0; m < groupOutChannels; ++m) {
          double* yRow =
              &ys[static_cast<size_t>((n * outChannels + firstOutChannel + m) * outSize)];
          const double* wRow = &ws[static_cast<size_t>((c * groupOutChannels + m) * kernelSize)];
          for (const WindowTap& tap : taps) yRow[tap.target] += value * wRow[tap.kernel];
        }
      }
    }
  }
  if (ctx.hasInput(2)) {
    const std::vector<double> bias = readAsDouble(ctx.input(2));
    for (int64_t n = 0; n < batch; ++n) {
      for (int64_t m = 0; m < outChannels; ++m) {
        for (int64_t o = 0; o < outSize; ++o) {
          ys[static_cast<size_t>((n * outChannels + m) * outSize + o)] +=
              bias[static_cast<size_t>(m)];
        }
      }
    }
  }
  writeFromDouble(ctx.output(0), ys);
  return Status::ok();
}

}  // namespace

void registerConvKernels(KernelRegistry& registry) {
  registry.add("Conv", runConv);
  registry.add("ConvTranspose", runConvTranspose);
}

}  // namespace kiln::reference
