// The fallback step: the reference kernel, reading and writing arena views.
#include <cstring>

#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/reference/kernel.h"

namespace kiln::cpu {

namespace {

class ReferenceStep : public Step {
 public:
  explicit ReferenceStep(const reference::KernelFn* kernel) : kernel_(kernel) {}

  Status run(const ExecutionContext& context) const override {
    std::vector<ir::Tensor> inputViews;
    inputViews.reserve(inputs.size());
    std::vector<const ir::Tensor*> inputPointers;
    for (const auto& ref : inputs) inputViews.push_back(ref ? context.view(*ref) : ir::Tensor());
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputPointers.push_back(inputs[i] ? &inputViews[i] : nullptr);
    }
    // Reference kernels may accumulate into their outputs, which they expect zeroed (as the
    // reference executor allocates them); arena memory holds whatever was there before.
    std::vector<ir::Tensor> outputViews;
    for (const auto& ref : outputs) {
      outputViews.push_back(ref ? context.view(*ref) : ir::Tensor());
      if (ref) std::memset(context.address(*ref), 0, static_cast<size_t>(ref->bytes()));
    }
    reference::KernelContext kernelContext(*node, inputPointers, outputViews);
    return (*kernel_)(kernelContext);
  }

 private:
  const reference::KernelFn* kernel_;
};

}  // namespace

std::unique_ptr<Step> makeReferenceStep(const ir::Node& node) {
  const reference::KernelFn* kernel =
      reference::KernelRegistry::instance().find(node.domain, node.opType);
  if (!kernel) return nullptr;
  auto step = std::make_unique<ReferenceStep>(kernel);
  step->tactic = "reference";
  return step;
}

}  // namespace kiln::cpu
