// The native SGEMM's AVX-512 micro-kernels: a 14x32 float32 tile of C in 28 zmm accumulators
// (each k step: two loads of B, 14 broadcasts of A, 28 FMAs), and the same tile for bfloat16
// pairs with vdpbf16ps (two k per instruction). Compiled for AVX-512 per function, so the binary
// still runs on any x86-64; sgemm.cc calls them only where the CPU has the instructions.
#include "kiln/backends/cpu/kernels/sgemm_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include <algorithm>
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

// Transposes 16 rows of 16 floats in registers: on return, r[j] holds element j of every input
// row (row i in lane i). Interleaves 32-bit, then 64-bit elements within each 128-bit lane, which
// leaves register 4q + c holding rows 4q..4q+3 of columns c, c+4, c+8 and c+12 (one per 128-bit
// lane); two rounds of 128-bit shuffles then gather each column's four row groups. The masked
// forms with every lane set are the plain instructions; GCC 12 warns that the plain intrinsics'
// undefined pass-through operand "may be used uninitialized".
KILN_AVX512 inline void transpose16x16(__m512 (&r)[16]) {
  constexpr __mmask16 kAll = 0xFFFF;
  constexpr __mmask8 kAll8 = 0xFF;
  const __m512 zero = _mm512_setzero_ps();
  const __m512d zeroD = _mm512_setzero_pd();
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_mask_unpacklo_ps(zero, kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_mask_unpackhi_ps(zero, kAll, r[i], r[i + 1]);
  }
  __m512 u[16];
#pragma GCC unroll 4
  for (int q = 0; q < 16; q += 4) {
    const __m512d t0 = _mm512_castps_pd(t[q]), t1 = _mm512_castps_pd(t[q + 1]);
    const __m512d t2 = _mm512_castps_pd(t[q + 2]), t3 = _mm512_castps_pd(t[q + 3]);
    u[q] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(zeroD, kAll8, t0, t2));
    u[q + 1] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(zeroD, kAll8, t0, t2));
    u[q + 2] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(zeroD, kAll8, t1, t3));
    u[q + 3] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(zeroD, kAll8, t1, t3));
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512 x0 = _mm512_mask_shuffle_f32x4(zero, kAll, u[c], u[4 + c], 0x44);
    const __m512 x1 = _mm512_mask_shuffle_f32x4(zero, kAll, u[c], u[4 + c], 0xEE);
    const __m512 y0 = _mm512_mask_shuffle_f32x4(zero, kAll, u[8 + c], u[12 + c], 0x44);
    const __m512 y1 = _mm512_mask_shuffle_f32x4(zero, kAll, u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_mask_shuffle_f32x4(zero, kAll, x0, y0, 0x88);
    r[c + 4] = _mm512_mask_shuffle_f32x4(zero, kAll, x0, y0, 0xDD);
    r[c + 8] = _mm512_mask_shuffle_f32x4(zero, kAll, x1, y1, 0x88);
    r[c + 12] = _mm512_mask_shuffle_f32x4(zero, kAll, x1, y1, 0xDD);
  }
}

// PackFn for kFp32 slivers of contiguous depth: blocks of 16 lanes by 16 depth loaded row by
// row, transposed in registers and stored as 16 depth rows of the sliver (masked to its lanes).
// Lanes past `valid` load as zero, which is the padding the sliver needs.
KILN_AVX512 void packContiguousDepth(const float* src, int64_t laneStride, int valid, int lanes,
                                     int64_t k, float* dst) {
  for (int g = 0; g < lanes; g += 16) {
    const int rows = std::clamp(valid - g, 0, 16);
    const int width = std::min(lanes - g, 16);
    const __mmask16 store = static_cast<__mmask16>((1u << width) - 1);
    for (int64_t d = 0; d < k; d += 16) {
      const int64_t depth = std::min<int64_t>(16, k - d);
      const __mmask16 load = static_cast<__mmask16>((1u << depth) - 1);
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        r[i] = i < rows ? _mm512_maskz_loadu_ps(load, src + (g + i) * laneStride + d)
                        : _mm512_setzero_ps();
      }
      transpose16x16(r);
      float* out = dst + d * lanes + g;
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if (j < depth) _mm512_mask_storeu_ps(out + j * lanes, store, r[j]);
      }
    }
  }
}

template <int... R>
MicroKernel fp32Family(std::integer_sequence<int, R...>) {
  MicroKernel kernel{.mr = kMr, .nr = 16 * kNv};
  ((kernel.tiles[R + 1] = &tileFp32<kMr, R + 1, kNv>), ...);
  kernel.packContiguousDepth = &packContiguousDepth;
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
