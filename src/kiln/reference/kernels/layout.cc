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

}  // namespace

void registerLayoutKernels(KernelRegistry& registry) {
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
