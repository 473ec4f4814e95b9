// kiln.Attention (src/kiln/ir/ops/attention.h) on the GPU, unfused: the scores
// scale * Q · K' of every batch entry as one strided-batch MatrixProduct into the workspace, the
// masked row softmax in place (attention.cu), then P · V as a second batched product into the
// output. Both products follow the node's cuda.gemm.source and cuda.gemm.algo; they have no
// epilogue. float32, every attribute (scale, transpose_k, nan_to_zero) and mask shape the
// reference takes. Tactic "kiln.attention.unfused".
#include <algorithm>
#include <vector>

#include "kiln/backends/cuda/kernels/attention.h"
#include "kiln/backends/cuda/kernels/gemm_steps.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/attention.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kAlignment = 256;

int64_t alignUp(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// scores[b] = scale * Q[b] · K'[b]: Q [Sq, D]; K' [D, Skv] as stored, or K [Skv, D] transposed.
ProductShape scoresShape(const ir::AttentionGeometry& g) {
  return {.m = g.sq,
          .n = g.skv,
          .k = g.d,
          .transB = g.transposeK,
          .alpha = g.scale,
          .batch = g.batch,
          .strideA = g.sq * g.d,
          .strideB = g.skv * g.d,
          .strideC = g.sq * g.skv};
}

// Y[b] = P[b] · V[b]: P [Sq, Skv], V [Skv, Dv].
ProductShape valuesShape(const ir::AttentionGeometry& g) {
  return {.m = g.sq,
          .n = g.dv,
          .k = g.skv,
          .batch = g.batch,
          .strideA = g.sq * g.skv,
          .strideB = g.skv * g.dv,
          .strideC = g.sq * g.dv};
}

class AttentionStep final : public Step {
 public:
  AttentionStep(ir::AttentionGeometry geometry, const ProductOptions& options)
      : g_(std::move(geometry)),
        scores_(scoresShape(g_), options, GemmEpilogue{}, false),
        values_(valuesShape(g_), options, GemmEpilogue{}, false),
        scoresBytes_(alignUp(g_.batch * g_.sq * g_.skv * static_cast<int64_t>(sizeof(float)))) {
    tactic = "kiln.attention.unfused";
  }

  Status prepare(PrepareContext& prepare) override {
    const Context& c = prepare.context;
    if (g_.hasMask && g_.batch > 0) {
      const int64_t bytes = g_.batch * static_cast<int64_t>(sizeof(int64_t));
      KILN_ASSIGN_OR_RETURN(std::byte * offsets,
                            prepare.allocate(bytes, "kiln.Attention's mask offsets"));
      KILN_CUDA_CHECK(cudaMemcpy(offsets, g_.maskBatchOffsets.data(), static_cast<size_t>(bytes),
                                 cudaMemcpyHostToDevice));
      maskOffsets_ = reinterpret_cast<const int64_t*>(offsets);
    }
    // The scores live in the workspace, which does not exist yet: timing uses scratch for them.
    KILN_RETURN_IF_ERROR(scores_.prepare(prepare, c.data<float>(*inputs[0]),
                                         c.data<float>(*inputs[1]), nullptr, nullptr));
    KILN_RETURN_IF_ERROR(values_.prepare(prepare, nullptr, c.data<float>(*inputs[2]),
                                         c.data<float>(*outputs[0]), nullptr));
    return Status::ok();
  }

  int64_t workspaceBytes() const override {
    return scoresBytes_ + std::max(scores_.workspaceBytes(), values_.workspaceBytes());
  }

  Status enqueue(const Context& context) const override {
    if (context.workspaceBytes < workspaceBytes()) {
      return internalError("kiln.Attention needs {} bytes of workspace, has {}", workspaceBytes(),
                           context.workspaceBytes);
    }
    float* scores = reinterpret_cast<float*>(context.workspace);
    std::byte* ltWorkspace = context.workspace ? context.workspace + scoresBytes_ : nullptr;
    const int64_t ltBytes = context.workspaceBytes - scoresBytes_;
    KILN_RETURN_IF_ERROR(scores_.enqueue(context, ltWorkspace, ltBytes,
                                         context.data<float>(*inputs[0]),
                                         context.data<float>(*inputs[1]), scores, nullptr));
    AttentionSoftmaxArgs softmax;
    softmax.scores = scores;
    softmax.batch = g_.batch;
    softmax.sq = g_.sq;
    softmax.skv = g_.skv;
    if (g_.hasMask) {
      softmax.mask = context.data<float>(*inputs[3]);
      softmax.maskBatchOffsets = maskOffsets_;
      softmax.maskRowStride = g_.maskRowStride;
      softmax.maskColumnStride = g_.maskColumnStride;
    }
    softmax.nanToZero = g_.nanToZero;
    KILN_RETURN_IF_ERROR(
        cudaStatus(launchAttentionSoftmax(softmax, context.stream), "the attention softmax"));
    return values_.enqueue(context, ltWorkspace, ltBytes, scores, context.data<float>(*inputs[2]),
                           context.data<float>(*outputs[0]), nullptr);
  }

 private:
  const ir::AttentionGeometry g_;
  MatrixProduct scores_;
  MatrixProduct values_;
  const int64_t scoresBytes_;
  const int64_t* maskOffsets_ = nullptr;  // device copy of g_.maskBatchOffsets
};

bool allFloat32(const ir::Node& node) {
  for (const ir::Value* v : node.inputs) {
    if (v && v->dtype != ir::DType::kFloat32) return false;
  }
  return node.outputs.size() == 1 && node.outputs[0] &&
         node.outputs[0]->dtype == ir::DType::kFloat32;
}

std::unique_ptr<Step> makeAttentionStep(const ir::Node& node, const knobs::Route& route) {
  if (node.domain != ir::kKilnDomain || node.opType != "Attention" || !allFloat32(node)) {
    return nullptr;
  }
  auto geometry = ir::attentionGeometry(node);
  if (!geometry.isOk()) return nullptr;
  return std::make_unique<AttentionStep>(std::move(*geometry), productOptionsFor(node, route));
}

const int kRegistered = registerStepFactory(kRankAttention, "attention", makeAttentionStep);

}  // namespace
}  // namespace kiln::cuda
