// Matrix products (MatMul, Gemm) in float32 through a BLAS library (OpenBLAS's sgemm).
//
// MatMul with a 2-D right operand runs as one sgemm over all of the left operand's batch rows
// ([..., M, K] is contiguous as [batch*M, K]); batched right operands run one sgemm per batch
// entry, with numpy broadcasting of the batch dimensions.
#include <cblas.h>

#include <cstring>

#include "kiln/backends/cpu/kernels/epilogue.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"

namespace kiln::cpu {

const knobs::Knob kGemmSource = knobs::declareKnob({
    .name = "cpu.gemm.source",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"blas", "reference"},
    .defaultValue = "blas",
    .help = "tactic source for MatMul and Gemm: OpenBLAS sgemm, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

bool allFloat32(const ir::Node& node) {
  for (const ir::Value* v : node.inputs) {
    if (v && v->dtype != ir::DType::kFloat32) return false;
  }
  for (const ir::Value* v : node.outputs) {
    if (v && v->dtype != ir::DType::kFloat32) return false;
  }
  return true;
}

class MatMulStep : public Step {
 public:
  Status run(const ExecutionContext& context) const override {
    const BufferRef& a = *inputs[0];
    const BufferRef& b = *inputs[1];
    const BufferRef& y = *outputs[0];
    // 1-D operands are promoted as numpy does; the output's shape already says the result.
    const int64_t k = a.shape.rank() == 1 ? a.shape[0] : a.shape[a.shape.rank() - 1];
    const int64_t n = b.shape.rank() == 1 ? 1 : b.shape[b.shape.rank() - 1];
    const float* A = context.data<float>(a);
    const float* B = context.data<float>(b);
    float* Y = context.data<float>(y);
    if (b.shape.rank() <= 2) {
      const int64_t rows = a.shape.elementCount() / std::max<int64_t>(k, 1);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, n, k, 1.0f, A, k, B, n, 0.0f, Y,
                  n);
      return Status::ok();
    }
    // Batched right operand: walk the output's batch dimensions with broadcasting.
    const int64_t m = a.shape.rank() == 1 ? 1 : a.shape[a.shape.rank() - 2];
    const size_t batchRank = y.shape.rank() - 2;
    const ir::Shape batch(
        std::vector<int64_t>(y.shape.dims().begin(), y.shape.dims().begin() + batchRank));
    const auto offsetOf = [&](const ir::Shape& operand, const std::vector<int64_t>& index,
                              int64_t matrix) {
      const size_t rank = operand.rank() >= 2 ? operand.rank() - 2 : 0;
      int64_t offset = 0, stride = matrix;
      for (size_t d = rank; d-- > 0;) {
        const int64_t dim = operand[d];
        offset += (dim == 1 ? 0 : index[batchRank - rank + d]) * stride;
        stride *= dim;
      }
      return offset;
    };
    std::vector<int64_t> index(batchRank, 0);
    for (int64_t entry = 0; entry < batch.elementCount(); ++entry) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
                  A + offsetOf(a.shape, index, m * k), k, B + offsetOf(b.shape, index, k * n), n,
                  0.0f, Y + entry * m * n, n);
      for (size_t d = batchRank; d-- > 0;) {
        if (++index[d] < batch[d]) break;
        index[d] = 0;
      }
    }
    return Status::ok();
  }
};

// Gemm, and kiln's FusedGemm (Gemm + activation, whose A may be batched [..., K]: the batch
// rows are contiguous, so they run as one [rows, K] product).
class GemmStep : public Step {
 public:
  GemmStep(bool transA, bool transB, float alpha, float beta, Epilogue epilogue)
      : transA_(transA), transB_(transB), alpha_(alpha), beta_(beta), epilogue_(epilogue) {}

  Status run(const ExecutionContext& context) const override {
    const BufferRef& a = *inputs[0];
    const BufferRef& y = *outputs[0];
    const int64_t n = y.shape[y.shape.rank() - 1];
    const int64_t m = y.shape.elementCount() / std::max<int64_t>(n, 1);
    const int64_t k = transA_ ? a.shape[0] : a.shape[a.shape.rank() - 1];
    float* Y = context.data<float>(y);
    float beta = 0.0f;
    if (inputs.size() > 2 && inputs[2] && beta_ != 0.0f) {
      // C broadcasts to [M, N]; sgemm then accumulates onto it.
      const BufferRef& c = *inputs[2];
      const float* C = context.data<float>(c);
      const int64_t rows = c.shape.rank() == 2 ? c.shape[0] : 1;
      const int64_t cols = c.shape.rank() >= 1 ? c.shape[c.shape.rank() - 1] : 1;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          Y[i * n + j] = C[(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
        }
      }
      beta = beta_;
    }
    cblas_sgemm(CblasRowMajor, transA_ ? CblasTrans : CblasNoTrans,
                transB_ ? CblasTrans : CblasNoTrans, m, n, k, alpha_, context.data<float>(a),
                transA_ ? m : k, context.data<float>(*inputs[1]), transB_ ? k : n, beta, Y, n);
    epilogue_.apply(Y, m * n, nullptr);
    return Status::ok();
  }

 private:
  bool transA_, transB_;
  float alpha_, beta_;
  Epilogue epilogue_;
};

}  // namespace

std::unique_ptr<Step> makeGemmStep(const ir::Node& node, const knobs::Route& route) {
  const bool fused = node.domain == ir::kKilnDomain && node.opType == "FusedGemm";
  if ((!node.domain.empty() && !fused) || !allFloat32(node)) return nullptr;
  if (route.value(kGemmSource, &node) != "blas") return nullptr;
  std::unique_ptr<Step> step;
  if (node.opType == "MatMul") {
    // A vector left operand against a batched right one changes the output's rank in a way
    // the batch walk does not follow; the reference kernel takes that rare case.
    if (node.inputs[0]->shape.rank() < 2 && node.inputs[1]->shape.rank() > 2) return nullptr;
    step = std::make_unique<MatMulStep>();
  } else if (node.opType == "Gemm" || fused) {
    auto transA = node.getInt("transA", 0), transB = node.getInt("transB", 0);
    auto alpha = node.getFloat("alpha", 1.0f), beta = node.getFloat("beta", 1.0f);
    std::optional<Epilogue> epilogue = Epilogue::fromNode(node);
    if (!transA.isOk() || !transB.isOk() || !alpha.isOk() || !beta.isOk() || !epilogue) {
      return nullptr;
    }
    step = std::make_unique<GemmStep>(*transA != 0, *transB != 0, *alpha, *beta, *epilogue);
  } else {
    return nullptr;
  }
  step->tactic = "blas.sgemm";
  return step;
}

}  // namespace kiln::cpu
