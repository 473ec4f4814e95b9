// Reference kernels for kiln's NHWC ops (src/kiln/ir/ops/layout.h): the inputs transposed to
// NCHW (the weights to [M, C/group, kH, kW]), the kernel of the op each stands for, its output
// transposed back. Slow and obviously what the op means.
#include <cstring>

#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/layout.h"
#include "kiln/reference/kernel.h"

namespace kiln::reference {

namespace {

Status runNhwc(const KernelFn& base, bool conv, KernelContext& ctx) {
  std::vector<Tensor> converted(ctx.inputCount());
  std::vector<const Tensor*> inputs(ctx.inputCount(), nullptr);
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    if (!ctx.hasInput(i)) continue;
    const Tensor& input = ctx.input(i);
    if (i == 0 || (conv && i == 3)) {
      converted[i] = ir::permuteTensor(input, ir::kNhwcToNchw);
    } else if (conv && i == 1) {
      converted[i] = ir::permuteTensor(input, ir::kHwioToOihw);
    } else {
      converted[i] = input;
    }
    inputs[i] = &converted[i];
  }
  Tensor& y = ctx.output(0);
  Tensor nchw(y.dtype(), ir::permuteShape(y.shape(), ir::kNhwcToNchw));
  KernelContext inner(ctx.node(), inputs, std::span<Tensor>(&nchw, 1));
  KILN_RETURN_IF_ERROR(base(inner));
  // The output may be a view of an arena: fill it rather than replace it.
  const Tensor nhwc = ir::permuteTensor(nchw, ir::kNchwToNhwc);
  std::memcpy(y.mutableRawData(), nhwc.rawData(), nhwc.byteSize());
  return Status::ok();
}

// kiln.ChannelShuffle: each output element copied from the input element its channel's source
// (ir::channelShuffleSource) names, one element at a time.
Status runChannelShuffle(KernelContext& ctx) {
  const int64_t rank = static_cast<int64_t>(ctx.input(0).rank());
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", 1));
  KILN_ASSIGN_OR_RETURN(int64_t groups, ctx.node().getInt("groups", 0));
  const size_t axis = static_cast<size_t>(rawAxis < 0 ? rawAxis + rank : rawAxis);
  const Shape& first = ctx.input(0).shape();
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= first[d];
  for (size_t d = axis + 1; d < first.rank(); ++d) inner *= first[d];
  // Input and channel within it of each channel of the concatenation.
  std::vector<std::pair<size_t, int64_t>> channelOf;
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    for (int64_t c = 0; c < ctx.input(i).shape()[axis]; ++c) channelOf.emplace_back(i, c);
  }
  const auto channels = static_cast<int64_t>(channelOf.size());
  const size_t size = ir::dtypeSize(ctx.input(0).dtype());
  int64_t j = 0;  // output channel over all outputs
  for (size_t o = 0; o < ctx.outputCount(); ++o) {
    Tensor& y = ctx.output(o);
    const int64_t part = y.shape()[axis];
    std::byte* dst = y.mutableRawData();
    for (int64_t k = 0; k < part; ++k, ++j) {
      const auto [input, c] =
          channelOf[static_cast<size_t>(ir::channelShuffleSource(j, channels, groups))];
      const Tensor& x = ctx.input(input);
      const int64_t width = x.shape()[axis];
      const std::byte* src = x.rawData();
      for (int64_t b = 0; b < outer; ++b) {
        for (int64_t e = 0; e < inner; ++e) {
          std::memcpy(dst + static_cast<size_t>((b * part + k) * inner + e) * size,
                      src + static_cast<size_t>((b * width + c) * inner + e) * size, size);
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace

void registerLayoutKernels(KernelRegistry& registry) {
  registry.add("ChannelShuffle", runChannelShuffle, ir::kKilnDomain);
  for (const char* op : {"NhwcConv", "NhwcMaxPool", "NhwcAveragePool", "NhwcGlobalAveragePool",
                         "NhwcGlobalMaxPool"}) {
    const std::string base = ir::opForNhwc(op);
    const bool conv = base == "FusedConv";
    const KernelFn* kernel = registry.find(conv ? ir::kKilnDomain : "", base);
    KILN_CHECK(kernel != nullptr);  // the base families register first (KernelRegistry::instance)
    registry.add(
        op, [base = *kernel, conv](KernelContext& ctx) { return runNhwc(base, conv, ctx); },
        ir::kKilnDomain);
  }
}

}  // namespace kiln::reference
