// kiln's own matrix-product kernels for the CUDA backend (gemm.cu): a tiled shared-memory GEMM
// (row-major, batched with strides, optional transposes, alpha) with the epilogue fused in, and
// the epilogue alone (bias broadcast add and activation) for products a library computed. Matrices
// are stored in float32, float16 or bfloat16; arithmetic is always float32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::cuda {

// How a product's matrices are stored (the arithmetic is float32 whatever they are).
enum GemmType : int {
  kGemmFloat32 = 0,
  kGemmFloat16,
  kGemmBFloat16,
};

inline int gemmTypeBytes(GemmType type) { return type == kGemmFloat32 ? 4 : 2; }

// The activations kiln.FusedGemm applies (attribute `activation`, src/kiln/ir/ops/fused.cc).
enum GemmActivation : int {
  kGemmActivationNone = 0,
  kGemmActivationRelu,
  kGemmActivationLeakyRelu,  // alpha
  kGemmActivationClip,       // alpha = min, beta = max
  kGemmActivationSigmoid,
  kGemmActivationHardSigmoid,  // alpha, beta
  kGemmActivationHardSwish,
  kGemmActivationTanh,
  kGemmActivationGelu,      // exact: 0.5 x (1 + erf(x / sqrt 2))
  kGemmActivationGeluTanh,  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), cuBLASLt's GELU
  kGemmActivationSilu,      // x * sigmoid(x)
};

// What happens to each product element y(i, j) (alpha already applied) before it is stored:
//   y = activation(y + biasScale * bias[i * biasRowStride + j * biasColumnStride])
// The bias term is skipped when `bias` is null; the bias has the output's type. Strides are 0
// along broadcast axes; i counts the rows of the whole output matrix (a folded batch included).
struct GemmEpilogue {
  int activation = kGemmActivationNone;
  float activationAlpha = 0.0f;
  float activationBeta = 0.0f;
  const void* bias = nullptr;
  float biasScale = 1.0f;
  int64_t biasRowStride = 0;
  int64_t biasColumnStride = 0;
  int blockThreads = 256;  // the epilogue kernel's threads a block (a multiple of 32 up to 1024)
};

// C[b] = epilogue(alpha * op(A[b]) · op(B[b])) for b < batch, every matrix row-major: op(A) is
// [m, k] (A stored [m, k] with row stride lda, or [k, m] when transA), op(B) is [k, n] (B stored
// [k, n], or [n, k] when transB), C [m, n] with row stride ldc. Batch strides are in elements; 0
// shares an operand between batch entries. C must not overlap A or B. A and B are of `inputType`,
// C (and the epilogue's bias) of `outputType`: the same type, or float32 C from reduced A and B.
struct NativeGemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  float alpha = 1.0f;
  GemmType inputType = kGemmFloat32;
  GemmType outputType = kGemmFloat32;
  const void* a = nullptr;
  int64_t lda = 0, strideA = 0;
  const void* b = nullptr;
  int64_t ldb = 0, strideB = 0;
  void* c = nullptr;
  int64_t ldc = 0, strideC = 0;
  int64_t batch = 1;
  GemmEpilogue epilogue;
};

cudaError_t launchNativeGemm(const NativeGemmArgs& args, cudaStream_t stream);

// Applies `epilogue` in place to the row-major [rows, columns] matrix y (contiguous, of `type`).
cudaError_t launchGemmEpilogue(void* y, GemmType type, int64_t rows, int64_t columns,
                               const GemmEpilogue& epilogue, cudaStream_t stream);

}  // namespace kiln::cuda
