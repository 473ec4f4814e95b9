// The host fallback: a node the CUDA backend has no kernel for runs with the reference kernel on
// the host, between two synchronous copies. Correct, slow, and visible (tactic host.reference).
#include <vector>

#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/reference/executor.h"
#include "kiln/reference/kernel.h"

namespace kiln::cuda {
namespace {

class HostStep final : public Step {
 public:
  Status enqueue(const Context& context) const override {
    std::vector<ir::Tensor> host;
    host.reserve(inputs.size());
    std::vector<const ir::Tensor*> pointers;
    for (const auto& input : inputs) {
      if (!input) {
        pointers.push_back(nullptr);
        continue;
      }
      if (input->constant) {
        pointers.push_back(input->constant);
        continue;
      }
      host.emplace_back(input->dtype, input->shape);
      if (input->bytes() > 0) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(host.back().mutableRawData(), context.address(*input),
                                        input->bytes(), cudaMemcpyDeviceToHost, context.stream));
      }
      pointers.push_back(&host.back());
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(context.stream));
    KILN_ASSIGN_OR_RETURN(std::vector<ir::Tensor> results,
                          reference::evaluateNode(*node, pointers));
    for (size_t i = 0; i < outputs.size() && i < results.size(); ++i) {
      if (!outputs[i] || results[i].byteSize() == 0) continue;
      KILN_CUDA_CHECK(cudaMemcpyAsync(context.address(*outputs[i]), results[i].rawData(),
                                      results[i].byteSize(), cudaMemcpyHostToDevice,
                                      context.stream));
    }
    // `results` is freed on return: the copies must have read it by then.
    KILN_CUDA_CHECK(cudaStreamSynchronize(context.stream));
    return Status::ok();
  }
  bool capturable() const override { return false; }
};

}  // namespace

std::unique_ptr<Step> makeHostStep(const ir::Node& node) {
  if (!reference::KernelRegistry::instance().find(node.domain, node.opType)) return nullptr;
  auto step = std::make_unique<HostStep>();
  step->tactic = "host.reference";
  return step;
}

}  // namespace kiln::cuda
