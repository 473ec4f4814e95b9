// The native SGEMM's AVX2 micro-kernel: a 6x16 float32 tile of C in 12 ymm accumulators (each k
// step: two loads of B, six broadcasts of A, 12 FMAs). Compiled for AVX2 + FMA per function, so
// the binary still runs on any x86-64; sgemm.cc calls it only where the CPU has AVX2 and FMA.
#include "kiln/backends/cpu/kernels/sgemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <utility>

#define KILN_AVX2 __attribute__((target("avx2,fma")))

namespace kiln::cpu::sgemm_detail {
namespace {

constexpr int kMr = 6;
constexpr int kNv = 2;  // ymm vectors across the tile: 16 columns

KILN_AVX2 inline __m256 loadEdge(const float* c, bool full, __m256i mask) {
  return full ? _mm256_loadu_ps(c) : _mm256_maskload_ps(c, mask);
}

template <int MR, int R, int NV>
KILN_AVX2 void tileFp32(const TileArgs& t) {
  // Lane masks for the right edge; a full tile uses plain loads and stores.
  const bool full = t.cols == 8 * NV;
  __m256i mask[NV];
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    mask[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(t.cols - 8 * v), lanes);
  }
  __m256 acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = t.loadC ? loadEdge(t.c + r * t.ldc + 8 * v, full, mask[v]) : _mm256_setzero_ps();
    }
  }
  const float* a = static_cast<const float*>(t.a);
  const float* b = static_cast<const float*>(t.b);
  for (int64_t k = 0; k < t.depth; ++k, a += MR, b += t.ldb) {
    __m256 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const bool scale = !t.loadC && t.alpha != 1.0f;
  const bool blend = !t.loadC && t.beta != 0.0f;
  const __m256 alpha = _mm256_set1_ps(t.alpha), beta = _mm256_set1_ps(t.beta);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* c = t.c + r * t.ldc + 8 * v;
      __m256 out = scale ? _mm256_mul_ps(acc[r][v], alpha) : acc[r][v];
      if (blend) out = _mm256_fmadd_ps(loadEdge(c, full, mask[v]), beta, out);
      if (full) {
        _mm256_storeu_ps(c, out);
      } else {
        _mm256_maskstore_ps(c, mask[v], out);
      }
    }
  }
}

template <int... R>
MicroKernel fp32Family(std::integer_sequence<int, R...>) {
  MicroKernel kernel{.mr = kMr, .nr = 8 * kNv};
  ((kernel.tiles[R + 1] = &tileFp32<kMr, R + 1, kNv>), ...);
  return kernel;
}

}  // namespace

MicroKernel avx2Kernel() { return fp32Family(std::make_integer_sequence<int, kMr>()); }

}  // namespace kiln::cpu::sgemm_detail

#endif  // x86
