// The CPU backend's executable form of a graph: an ordered list of steps (one kernel choice per
// node, with its tactic and layout), every runtime value placed in one arena by the memory
// planner, and the constants it reads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/cpu/thread_pool.h"
#include "kiln/base/status.h"
#include "kiln/ir/graph.h"
#include "kiln/knobs/route.h"

namespace kiln::cpu {

// Where one value lives while a plan runs: an arena range, or a constant of the graph.
struct BufferRef {
  ir::DType dtype = ir::DType::kFloat32;
  ir::Shape shape;
  int64_t offset = -1;                   // bytes into the arena; -1 for constants
  const ir::Tensor* constant = nullptr;  // set for constants

  int64_t bytes() const {
    return shape.elementCount() * static_cast<int64_t>(ir::dtypeSize(dtype));
  }
};

// What a step sees while running: the arena its buffers live in, and the plan's threads.
class ExecutionContext {
 public:
  ExecutionContext(std::byte* arena, ThreadPool& pool) : arena_(arena), pool_(&pool) {}
  ThreadPool& pool() const { return *pool_; }
  std::byte* address(const BufferRef& ref) const {
    return ref.constant ? const_cast<std::byte*>(ref.constant->rawData()) : arena_ + ref.offset;
  }
  template <typename T>
  T* data(const BufferRef& ref) const {
    return reinterpret_cast<T*>(address(ref));
  }
  ir::Tensor view(const BufferRef& ref) const {
    return ir::Tensor::view(ref.dtype, ref.shape, address(ref));
  }

 private:
  std::byte* arena_;
  ThreadPool* pool_;
};

// One node's kernel. The choices it records (tactic, layout, precision) are what
// `kiln inspect` shows per layer and what an engine file keeps.
class Step {
 public:
  virtual ~Step() = default;
  virtual Status run(const ExecutionContext& context) const = 0;

  const ir::Node* node = nullptr;
  std::string tactic;  // "blas.sgemm", "im2col+blas", "reference", ...
  std::string layout = "nchw";
  std::string precision = "fp32";
  std::vector<std::optional<BufferRef>> inputs;   // nullopt for omitted optional inputs
  std::vector<std::optional<BufferRef>> outputs;  // nullopt for omitted optional outputs
};

class Plan {
 public:
  // Runs the plan on `inputs` (in the graph's input order, exact dtypes and shapes) and returns
  // the graph's outputs. With `stepMilliseconds`, records each step's wall time. A plan owns
  // one arena: run it from one thread at a time.
  Result<std::vector<ir::Tensor>> run(const std::vector<ir::Tensor>& inputs,
                                      std::vector<double>* stepMilliseconds = nullptr) const;

  const std::vector<std::unique_ptr<Step>>& steps() const { return steps_; }
  int64_t arenaBytes() const { return arenaBytes_; }
  int threads() const { return threads_; }
  int spinMicros() const { return spinMicros_; }  // cpu.threads.spin_us
  // cpu.threads.affinity: the CPU each pool worker is bound to (empty: none bound).
  const std::vector<int>& workerCpus() const { return pool_->workerCpus(); }
  bool ownChunks() const { return pool_->ownChunks(); }
  const ir::Graph& graph() const { return *graph_; }

 private:
  friend Result<Plan> lowerToCpu(std::shared_ptr<const ir::Graph> graph, const knobs::Route& route);

  std::shared_ptr<const ir::Graph> graph_;  // steps point at its nodes and constants
  std::vector<std::unique_ptr<Step>> steps_;
  std::vector<BufferRef> inputs_;
  std::vector<BufferRef> outputs_;
  int64_t arenaBytes_ = 0;
  int64_t arenaAlignment_ = 64;  // cpu.memory.alignment: of the arena's base as of its offsets
  int threads_ = 1;
  int spinMicros_ = 0;
  mutable ir::Tensor arena_;
  std::unique_ptr<ThreadPool> pool_;  // threads_ threads, the caller's among them
};

// Lowers an inferred (and usually optimised) graph to a CPU plan, choosing each node's kernel
// by the route's cpu.* knobs. Per-node selectors are checked by the caller against the graph
// the user named nodes in (before passes renamed or removed any).
Result<Plan> lowerToCpu(std::shared_ptr<const ir::Graph> graph, const knobs::Route& route);

}  // namespace kiln::cpu
