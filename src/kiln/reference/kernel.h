// The reference executor's kernels: plain loops, obviously correct, independent of every knob.
// Each op family registers its kernels from one file in src/kiln/reference/kernels/.
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::reference {

using ir::DType;
using ir::Shape;
using ir::Tensor;

// What a kernel sees: the node (attributes), its inputs, and outputs already allocated with the
// types shape inference gave them.
class KernelContext {
 public:
  KernelContext(const ir::Node& node, std::span<const Tensor* const> inputs,
                std::span<Tensor> outputs)
      : node_(node), inputs_(inputs), outputs_(outputs) {}

  const ir::Node& node() const { return node_; }
  int opset() const { return node_.opsetVersion; }
  size_t inputCount() const { return inputs_.size(); }
  bool hasInput(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  const Tensor& input(size_t i) const { return *inputs_[i]; }
  const Tensor* optionalInput(size_t i) const { return hasInput(i) ? inputs_[i] : nullptr; }
  size_t outputCount() const { return outputs_.size(); }
  Tensor& output(size_t i) { return outputs_[i]; }

  template <typename... Args>
  Status error(fmt::format_string<Args...> format, Args&&... args) const {
    return invalidInput("{}: {}", node_.describe(),
                        fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  Status unsupportedHere(fmt::format_string<Args...> format, Args&&... args) const {
    return unsupported("{}: {}", node_.describe(),
                       fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  const ir::Node& node_;
  std::span<const Tensor* const> inputs_;
  std::span<Tensor> outputs_;
};

using KernelFn = std::function<Status(KernelContext&)>;

class KernelRegistry {
 public:
  static const KernelRegistry& instance();
  // `domain` is "" for ONNX ops, ir::kKilnDomain for kiln's own.
  void add(const std::string& opType, KernelFn kernel, const std::string& domain = "");
  const KernelFn* find(const std::string& domain, const std::string& opType) const;

 private:
  std::map<std::pair<std::string, std::string>, KernelFn> kernels_;
};

// Registration, one function per op family (src/kiln/reference/kernels/<family>.cc), matching
// the schema families of src/kiln/ir/ops/.
void registerElementwiseKernels(KernelRegistry& registry);
void registerNeuralKernels(KernelRegistry& registry);
void registerReductionKernels(KernelRegistry& registry);
void registerShapeKernels(KernelRegistry& registry);
void registerIndexingKernels(KernelRegistry& registry);
void registerFusedKernels(KernelRegistry& registry);             // kiln's own ops
void registerLayoutKernels(KernelRegistry& registry);            // kiln's NHWC ops (layout pass)
void registerFusedElementwiseKernels(KernelRegistry& registry);  // kiln.FusedElementwise
void registerAttentionKernels(KernelRegistry& registry);         // kiln.Attention

}  // namespace kiln::reference
