// The native SGEMM's portable micro-kernel: a 4x8 float32 tile in plain C++ that the compiler
// vectorises for the baseline instruction set (SSE2 on x86-64). It is what runs on a CPU without
// AVX2, and the float32 path of the bfloat16 emulation there.
#include <utility>

#include "kiln/backends/cpu/kernels/sgemm_kernels.h"

namespace kiln::cpu::sgemm_detail {
namespace {

constexpr int kMr = 4;
constexpr int kNr = 8;

template <int MR, int R, int NR>
void tileFp32(const TileArgs& t) {
  float acc[R][NR];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NR; ++j) {
      acc[r][j] = t.loadC && j < t.cols ? t.c[r * t.ldc + j] : 0.0f;
    }
  }
  const float* a = static_cast<const float*>(t.a);
  const float* b = static_cast<const float*>(t.b);
  for (int64_t k = 0; k < t.depth; ++k, a += MR, b += t.ldb) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float av = a[r];
#pragma GCC unroll 16
      for (int j = 0; j < NR; ++j) acc[r][j] += av * b[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    float* c = t.c + r * t.ldc;
    for (int j = 0; j < t.cols; ++j) {
      if (t.loadC) {
        c[j] = acc[r][j];
      } else {
        const float out = t.alpha == 1.0f ? acc[r][j] : t.alpha * acc[r][j];
        c[j] = t.beta == 0.0f ? out : out + t.beta * c[j];
      }
    }
  }
}

template <int... R>
MicroKernel fp32Family(std::integer_sequence<int, R...>) {
  MicroKernel kernel{.mr = kMr, .nr = kNr};
  ((kernel.tiles[R + 1] = &tileFp32<kMr, R + 1, kNr>), ...);
  return kernel;
}

}  // namespace

MicroKernel portableKernel() { return fp32Family(std::make_integer_sequence<int, kMr>()); }

}  // namespace kiln::cpu::sgemm_detail
