// The matrix product the CUDA backend's GEMM-shaped steps share (Gemm, MatMul, kiln.FusedGemm
// and kiln.Attention's two products): a strided batch of row-major products, with an optional
// epilogue, computed by cuBLASLt or by kiln's native kernel (gemm.h), as the cuda.gemm.* knobs
// choose. Lowering fixes the geometry and the choices; prepare() makes cuBLASLt's descriptors and
// picks its algorithm (timing candidates when asked); enqueue() is one library call or kernel
// (plus the epilogue kernel where the library's epilogue cannot do the whole epilogue).
//
// Matrices are float32, float16 or bfloat16 (cuda.precision); products and sums are always float32
// (cuBLASLt's CUBLAS_COMPUTE_32F, or TF32 tensor cores for float32 where cuda.precision=tf32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/backends/cuda/kernels/gemm.h"
#include "kiln/backends/cuda/plan.h"

namespace kiln::cuda {

enum class ProductSource { kCublasLt, kNative };
enum class AlgorithmChoice { kHeuristic, kTimed };

// The knob values (cuda.gemm.*, and cuda.precision's tf32) in force at `node`.
struct ProductOptions {
  ProductSource source = ProductSource::kCublasLt;
  AlgorithmChoice algorithm = AlgorithmChoice::kHeuristic;
  bool fuseEpilogue = true;  // bias/Relu in cuBLASLt's epilogue, or in the native kernel's stores
  bool tf32 = false;         // float32 products may use TF32 tensor cores (cuda.precision=tf32)
  uint64_t maxWorkspace = uint64_t{32} << 20;  // bytes a cuBLASLt algorithm may use
  int candidates = 8;                          // algorithms timed (kTimed)
  int timingRuns = 3;                          // timed runs of each (kTimed)
  bool splitK = true;                          // split-K reduction schemes allowed
  bool geluAsTanh = false;  // an erf GELU may run as cuBLASLt's tanh-approximation epilogue
  int algoRank = 0;         // kHeuristic: the heuristics' algorithm taken (0: their first)
  double nativeBelow = 0;   // products of fewer multiply-adds run kiln's kernel
  int epilogueBlock = 256;  // threads a block of kiln's epilogue kernel
};
ProductOptions productOptionsFor(const ir::Node& node, const knobs::Route& route);

// The storage type of `dtype` (float32, float16, bfloat16), or nothing for other types.
std::optional<GemmType> gemmTypeOf(ir::DType dtype);

// Row-major C[b] = epilogue(alpha * op(A[b]) · op(B[b])) for b < batch: op(A) [m, k] (A stored
// [m, k], or [k, m] when transA), op(B) [k, n] (B stored [k, n], or [n, k] when transB), C [m, n]
// dense. Batch strides are in elements (0 shares an operand); C's matrices must not overlap.
// A and B are stored as `inputType`, C and the bias as `outputType`: the same type, or float32 C
// from float16 / bfloat16 A and B (attention's scores). A matrix's rows may be padded: its pitch
// (elements from one stored row to the next, at least the row's length) is lda / ldb / ldc, 0
// meaning dense. A product with an epilogue has a dense C.
struct ProductShape {
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  float alpha = 1.0f;
  int64_t batch = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  GemmType inputType = kGemmFloat32;
  GemmType outputType = kGemmFloat32;
  int64_t lda = 0, ldb = 0, ldc = 0;

  // The pitches in force (the dense ones where 0).
  int64_t pitchA() const { return lda ? lda : (transA ? m : k); }
  int64_t pitchB() const { return ldb ? ldb : (transB ? k : n); }
  int64_t pitchC() const { return ldc ? ldc : n; }
};

// Whether cuBLASLt can take the shape: sizes and pitches within int32, k > 0 (an empty sum is
// kiln's kernel's: it stores the epilogue of zeros).
bool cublasLtCanTake(const ProductShape& shape);

class MatrixProduct {
 public:
  // `epilogue.bias` is ignored (the pointer comes with prepare and enqueue): `hasBias` says
  // whether there is one. A batched product (shape.batch > 1) takes no epilogue.
  MatrixProduct(const ProductShape& shape, const ProductOptions& options,
                const GemmEpilogue& epilogue, bool hasBias);
  ~MatrixProduct();
  MatrixProduct(const MatrixProduct&) = delete;
  MatrixProduct& operator=(const MatrixProduct&) = delete;

  // Device-side preparation. `a`, `b`, `c` are the buffers timing may use (`c` is written); a
  // null one is replaced by scratch of the right size while timing (and is assumed 256-byte
  // aligned, as workspace ranges are). `bias` is the device bias (null without one). When
  // cuBLASLt has no algorithm for the fused epilogue, the bias and activation move to the
  // epilogue kernel; when it has none at all, kiln's kernel computes the product (tactic() says
  // which).
  Status prepare(PrepareContext& context, const void* a, const void* b, void* c, const void* bias);
  // cuBLASLt's workspace for the chosen algorithm (valid after prepare).
  int64_t workspaceBytes() const { return workspaceBytes_; }
  // Enqueues the product on context.stream, with `workspace` of at least workspaceBytes().
  Status enqueue(const Context& context, std::byte* workspace, int64_t workspaceBytes,
                 const void* a, const void* b, void* c, const void* bias) const;

  // "cublaslt", "cublaslt.timed" or "native", with "+epilogue" when kiln's epilogue kernel runs
  // after the product. Set at lowering; prepare() may change it (see there).
  std::string tactic() const;
  // How the product runs: after prepare, cuBLASLt's algorithm too (or why kiln's kernel took
  // over). For debugging and reports.
  const std::string& detail() const { return detail_; }
  const ProductShape& shape() const { return shape_; }

 private:
  struct Lt;  // cuBLASLt's descriptors and algorithm

  // Where the bias goes: kiln's epilogue kernel, cuBLASLt's BIAS epilogue (a vector along the
  // columns, scale 1), cuBLASLt's C matrix (beta = scale, a full [m, n] matrix), or the native
  // kernel's stores.
  enum class BiasPlace { kEpilogueKernel, kLtVector, kLtMatrix, kNativeStores };

  void planFusion(bool useLt);
  // The cuBLASLt preferences in force ("workspace within 32 MiB, split-K allowed"), for detail().
  std::string preferenceText() const;
  bool epilogueKernelRuns() const;
  // The parts of the epilogue left to the epilogue kernel (after the fused parts are taken).
  GemmEpilogue remainingEpilogue(const void* bias) const;
  Status prepareLt(PrepareContext& context, const void* a, const void* b, void* c,
                   const void* bias);
  Status runLt(const Context& context, std::byte* workspace, int64_t workspaceBytes, const void* a,
               const void* b, void* c, const void* bias) const;
  Status runNative(cudaStream_t stream, const void* a, const void* b, void* c,
                   const void* bias) const;

  ProductShape shape_;
  ProductOptions options_;
  GemmEpilogue epilogue_;
  bool hasBias_ = false;
  bool useLt_ = false;
  BiasPlace biasPlace_ = BiasPlace::kEpilogueKernel;
  bool fuseActivation_ = false;  // in cuBLASLt's epilogue (Relu) or the native kernel's stores
  int64_t workspaceBytes_ = 0;
  std::string detail_;
  Lt* lt_ = nullptr;
};

}  // namespace kiln::cuda
