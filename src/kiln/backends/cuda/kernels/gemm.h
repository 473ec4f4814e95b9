// kiln's own matrix-product kernels for the CUDA backend (gemm.cu): a tiled shared-memory float
// SGEMM (row-major, batched with strides, optional transposes, alpha) with the epilogue fused in,
// and the epilogue alone (bias broadcast add and activation) for products a library computed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::cuda {

// The activations kiln.FusedGemm applies (attribute `activation`, src/kiln/ir/ops/fused.cc).
enum GemmActivation : int {
  kGemmActivationNone = 0,
  kGemmActivationRelu,
  kGemmActivationLeakyRelu,    // alpha
  kGemmActivationClip,         // alpha = min, beta = max
  kGemmActivationSigmoid,
  kGemmActivationHardSigmoid,  // alpha, beta
  kGemmActivationHardSwish,
  kGemmActivationTanh,
  kGemmActivationGelu,  // exact: 0.5 x (1 + erf(x / sqrt 2))
};

// What happens to each product element y(i, j) (alpha already applied) before it is stored:
//   y = activation(y + biasScale * bias[i * biasRowStride + j * biasColumnStride])
// The bias term is skipped when `bias` is null. Strides are 0 along broadcast axes; i counts the
// rows of the whole output matrix (a folded batch included).
struct GemmEpilogue {
  int activation = kGemmActivationNone;
  float activationAlpha = 0.0f;
  float activationBeta = 0.0f;
  const float* bias = nullptr;
  float biasScale = 1.0f;
  int64_t biasRowStride = 0;
  int64_t biasColumnStride = 0;
};

// C[b] = epilogue(alpha * op(A[b]) · op(B[b])) for b < batch, every matrix row-major: op(A) is
// [m, k] (A stored [m, k] with row stride lda, or [k, m] when transA), op(B) is [k, n] (B stored
// [k, n], or [n, k] when transB), C [m, n] with row stride ldc. Batch strides are in elements; 0
// shares an operand between batch entries. C must not overlap A or B.
struct NativeGemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0, strideA = 0;
  const float* b = nullptr;
  int64_t ldb = 0, strideB = 0;
  float* c = nullptr;
  int64_t ldc = 0, strideC = 0;
  int64_t batch = 1;
  GemmEpilogue epilogue;
};

cudaError_t launchNativeGemm(const NativeGemmArgs& args, cudaStream_t stream);

// Applies `epilogue` in place to the row-major [rows, columns] matrix y (contiguous).
cudaError_t launchGemmEpilogue(float* y, int64_t rows, int64_t columns,
                               const GemmEpilogue& epilogue, cudaStream_t stream);

}  // namespace kiln::cuda
