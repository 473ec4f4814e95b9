// The native SGEMM's AVX-512 micro-kernels: a 14x32 float32 tile of C in 28 zmm accumulators
// (each k step: two loads of B, 14 broadcasts of A, 28 FMAs), and the same tile for bfloat16
// pairs with vdpbf16ps (two k per instruction). Compiled for AVX-512 per function, so the binary
// still runs on any x86-64; sgemm.cc calls them only where the CPU has the instructions.
#include "kiln/backends/cpu/kernels/sgemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <utility>

#define KILN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define KILN_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))

namespace kiln::cpu::sgemm_detail {
namespace {

constexpr int kMr = 14;  // rows of the tile
constexpr int kNv = 2;   // zmm vectors across the tile: 32 columns

// Column masks of the tile's vectors for `cols` valid columns.
template <int NV>
KILN_AVX512 inline void columnMasks(int cols, __mmask16 (&mask)[NV]) {
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    const int rem = cols - 16 * v;
    mask[v] = rem >= 16 ? __mmask16(0xFFFF) : rem <= 0 ? __mmask16(0) : __mmask16((1u << rem) - 1);
  }
}

template <int R, int NV>
KILN_AVX512 inline void initTile(const TileArgs& t, const __mmask16 (&mask)[NV],
                                 __m512 (&acc)[R][NV]) {
  if (t.loadC) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_maskz_loadu_ps(mask[v], t.c + r * t.ldc + 16 * v);
    }
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
}

template <int R, int NV>
KILN_AVX512 inline void storeTile(const TileArgs& t, const __mmask16 (&mask)[NV],
                                  __m512 (&acc)[R][NV]) {
  const bool scale = !t.loadC && t.alpha != 1.0f;
  const bool blend = !t.loadC && t.beta != 0.0f;
  const __m512 alpha = _mm512_set1_ps(t.alpha), beta = _mm512_set1_ps(t.beta);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* c = t.c + r * t.ldc + 16 * v;
      __m512 out = scale ? _mm512_mul_ps(acc[r][v], alpha) : acc[r][v];
      if (blend) out = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask[v], c), beta, out);
      _mm512_mask_storeu_ps(c, mask[v], out);
    }
  }
}

template <int MR, int R, int NV>
KILN_AVX512 void tileFp32(const TileArgs& t) {
  __mmask16 mask[NV];
  columnMasks<NV>(t.cols, mask);
  __m512 acc[R][NV];
  initTile<R, NV>(t, mask, acc);
  const float* a = static_cast<const float*>(t.a);
  const float* b = static_cast<const float*>(t.b);
  for (int64_t k = 0; k < t.depth; ++k, a += MR, b += t.ldb) {
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  storeTile<R, NV>(t, mask, acc);
}

template <int MR, int R, int NV>
KILN_AVX512_BF16 void tileBf16(const TileArgs& t) {
  __mmask16 mask[NV];
  columnMasks<NV>(t.cols, mask);
  __m512 acc[R][NV];
  initTile<R, NV>(t, mask, acc);
  const int* a = static_cast<const int*>(t.a);
  const __m512i* b = static_cast<const __m512i*>(t.b);
  for (int64_t p = 0; p < t.depth; ++p, a += MR, b += NV) {
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(a[r]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  storeTile<R, NV>(t, mask, acc);
}

template <int... R>
MicroKernel fp32Family(std::integer_sequence<int, R...>) {
  MicroKernel kernel{.mr = kMr, .nr = 16 * kNv};
  ((kernel.tiles[R + 1] = &tileFp32<kMr, R + 1, kNv>), ...);
  return kernel;
}

template <int... R>
MicroKernel bf16Family(std::integer_sequence<int, R...>) {
  MicroKernel kernel{.mr = kMr, .nr = 16 * kNv};
  ((kernel.tiles[R + 1] = &tileBf16<kMr, R + 1, kNv>), ...);
  return kernel;
}

}  // namespace

MicroKernel avx512Kernel() { return fp32Family(std::make_integer_sequence<int, kMr>()); }
MicroKernel avx512Bf16Kernel() { return bf16Family(std::make_integer_sequence<int, kMr>()); }

}  // namespace kiln::cpu::sgemm_detail

#endif  // x86
