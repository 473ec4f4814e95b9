// One entry point for every float32 matrix product the CPU backend runs (MatMul, Gemm, the GEMM
// inside a convolution), so the tactic source is chosen in one place: OpenBLAS's sgemm, or
// kiln's own packed kernel ("native": panels of A and B packed for register-blocked micro-kernels,
// AVX-512, AVX2 or portable C++, picked at run time for the CPU it runs on).
//
//   GemmOptions options = gemmOptionsFor(node, route);   // source, precision, kc, schedule
//   sgemm(options, {.m = m, .n = n, .k = k, .a = A, .lda = k, .b = B, .ldb = n, .c = C, .ldc = n},
//         context.pool());
//
// Constant right operands (weights) can be packed once at build time (PackedGemmB) and multiplied
// without repacking on every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/cpu/kernels/epilogue.h"
#include "kiln/backends/cpu/thread_pool.h"
#include "kiln/ir/graph.h"
#include "kiln/knobs/route.h"

namespace kiln::cpu {

enum class GemmSource { kBlas, kNative };

// kBf16 rounds every element of A and B to bfloat16 (round to nearest even; bfloat16 subnormals
// flush to zero, as AVX512_BF16 hardware reads them) and accumulates the products in float32.
// Products of two bfloat16 values are exact in float32, so the only roundings are the operands'
// and the running sum's. The sum runs over k in pairs, the odd element of each pair first
// ((acc + a[2i+1]*b[2i+1]) + a[2i]*b[2i]): the order vdpbf16ps uses, which the emulation on
// other CPUs follows so that every CPU computes the same bits. Only the native source has a
// bfloat16 path: a bf16 product runs natively whatever the source says.
enum class GemmPrecision { kFp32, kBf16 };

// The native source's micro-kernel family. kAuto is the best this CPU supports (AVX-512 with
// BF16 > AVX-512 > AVX2 > portable); tests force the others to check each against the same
// reference. kAvx512Bf16 differs from kAvx512 only in bf16 products (vdpbf16ps instead of the
// exact emulation on float32 FMAs).
enum class GemmKernel { kAuto, kPortable, kAvx2, kAvx512, kAvx512Bf16 };

// How the native source divides one product among threads: kAuto minimises a task's cost over
// every grid of row and column bands; kRows cuts only along m, kColumns only along n. Every split
// sums each element of C in the same order, so the results are the same bits.
enum class GemmSplit { kAuto, kRows, kColumns };

// The native source's default depth of a packed panel (cpu.gemm.kc's default).
inline constexpr int64_t kDefaultGemmKc = 256;
// The native source's default cache blocking: KiB of packed A per block of mc rows (most of L2)
// and of packed B per block of nc columns (shared-cache sized); cpu.gemm.block_a/block_b.
inline constexpr int64_t kDefaultGemmBlockAKiB = 384;
inline constexpr int64_t kDefaultGemmBlockBKiB = 4096;

struct GemmOptions {
  GemmSource source = GemmSource::kBlas;
  GemmPrecision precision = GemmPrecision::kFp32;
  int64_t kc = kDefaultGemmKc;  // native: k elements per packed panel (even, >= 2)
  GemmKernel kernel = GemmKernel::kAuto;
  int64_t blockAKiB = kDefaultGemmBlockAKiB;  // native: packed A per block (sets mc)
  int64_t blockBKiB = kDefaultGemmBlockBKiB;  // native: packed B per block (sets nc)
  GemmSplit split = GemmSplit::kAuto;

  // Whether the product runs on the native kernels (the native source, or any bf16 product).
  bool native() const { return source == GemmSource::kNative || precision == GemmPrecision::kBf16; }
};

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, where op transposes when
// asked; lda/ldb/ldc are the row strides of A, B and C as stored. beta == 0 ignores C's old
// contents (NaNs included), as BLAS does.
struct GemmArgs {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
  // Applied to C after the product (no residual): the native source runs it on each block of C
  // as soon as the block is final, while it is in cache; the BLAS source after the product.
  const Epilogue* epilogue = nullptr;
};

// float32 products with the default options of `source` (fp32, default kc, best kernel).
void sgemm(GemmSource source, const GemmArgs& args, ThreadPool& pool);
void sgemm(const GemmOptions& options, const GemmArgs& args, ThreadPool& pool);
// Several independent products (a batched MatMul's entries) spread over the pool together, so
// that small entries still keep every thread busy. The BLAS source runs them one after another.
void sgemmBatch(const GemmOptions& options, const std::vector<GemmArgs>& batch, ThreadPool& pool);

// op(B)[k, n] packed once for the native kernels (with the options' precision, kc and kernel,
// kAuto resolved when packing), to multiply many times without repacking: a constant weight.
// The products it serves run with the options' blocking and split.
class PackedGemmB {
 public:
  PackedGemmB(const GemmOptions& options, bool transB, int64_t k, int64_t n, const float* b,
              int64_t ldb);
  ~PackedGemmB();
  PackedGemmB(PackedGemmB&&) noexcept;
  PackedGemmB& operator=(PackedGemmB&&) noexcept;

  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  GemmPrecision precision() const { return precision_; }
  int64_t kc() const { return kc_; }
  GemmKernel kernel() const { return kernel_; }
  const GemmOptions& options() const { return options_; }  // kernel resolved
  int64_t bytes() const;
  const std::byte* data() const { return data_.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  int64_t k_ = 0, n_ = 0, kc_ = 0;
  GemmPrecision precision_ = GemmPrecision::kFp32;
  GemmKernel kernel_ = GemmKernel::kAuto;
  GemmOptions options_;
  int64_t words_ = 0;  // 4-byte words in data_
  std::unique_ptr<std::byte, Free> data_;
};

// C = alpha * op(A) * B + beta * C with B prepacked; args.b, ldb and transB are ignored, args.k
// and args.n must match the packed B's.
void sgemm(const GemmArgs& args, const PackedGemmB& b, ThreadPool& pool);

// The native kernels this CPU can run (kPortable always), best last; for tests and benchmarks.
std::vector<GemmKernel> supportedGemmKernels();
GemmKernel resolveGemmKernel(GemmKernel kernel);  // kAuto -> the best supported
std::string gemmKernelName(GemmKernel kernel);    // "avx512", "avx2", ...
bool gemmKernelSupported(GemmKernel kernel);      // kAuto always

// The knobs that pick how a GEMM runs, declared in gemm.cc.
extern const knobs::Knob kGemmSource;     // blas | native | reference
extern const knobs::Knob kGemmPrecision;  // fp32 | bf16
extern const knobs::Knob kGemmKc;         // the native panel depth
extern const knobs::Knob kGemmPrepack;    // pack constant B at build time
extern const knobs::Knob kGemmKernel;     // auto | avx512 | avx2 | portable
extern const knobs::Knob kGemmBlockA;     // KiB of packed A per block
extern const knobs::Knob kGemmBlockB;     // KiB of packed B per block
extern const knobs::Knob kGemmSplit;      // auto | rows | columns
extern const knobs::Knob kGemmEpilogue;   // after | tiles (FusedGemm's activation)

// The source the route picks for the GEMM inside `node` (a Conv's, say): cpu.gemm.source at
// that node, with "reference" read as BLAS (the op's own knob decides whether it runs the
// reference kernel).
GemmSource gemmSourceFor(const ir::Node& node, const knobs::Route& route);
// Everything the route says about the GEMM inside `node`: source (as gemmSourceFor), precision,
// kc, kernel (a kernel this CPU lacks reads as kAuto), blocking and split. A step that uses it
// records options' precision in its `precision` ("bf16").
GemmOptions gemmOptionsFor(const ir::Node& node, const knobs::Route& route);

}  // namespace kiln::cpu
