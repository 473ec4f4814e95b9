// The native SGEMM's micro-kernels: each multiplies one packed sliver of A (mr rows, `depth`
// deep) by one packed sliver of B (`depth` deep, nr columns) into a tile of C held in registers.
// One family per instruction set (sgemm_portable.cc, sgemm_avx2.cc, sgemm_avx512.cc), chosen at
// run time; the blocking, packing and threading around them live in sgemm.cc.
#pragma once

#include <cstdint>

namespace kiln::cpu::sgemm_detail {

// How panels are packed for a micro-kernel family.
//   kFp32:         float32, sliver = [depth][lanes] (lanes: mr rows of A or nr columns of B).
//   kBf16Emulated: float32 holding bfloat16-rounded values, k padded to even and swapped within
//                  each pair, so that a plain float32 kernel sums each pair odd element first.
//   kBf16Pairs:    uint32 per (k pair, lane), bfloat16 of k = 2p in the low half and of 2p + 1
//                  in the high half: vdpbf16ps's operand layout.
enum class Packing { kFp32, kBf16Emulated, kBf16Pairs };

struct TileArgs {
  int64_t depth;  // rows of the packed slivers: k (float32) or k pairs (kBf16Pairs)
  const void* a;  // packed A sliver, [depth][mr], 64-byte aligned
  const void* b;  // B sliver: [depth][nr] words, rows ldb words apart
  int64_t ldb;    // nr when packed; float32 kernels also read full slivers of B in place
  float* c;       // the tile's top-left element
  int64_t ldc;
  int cols;     // valid columns, 1..nr (padded columns of B are zero and never stored)
  bool loadC;   // start from C's values and store the sum (alpha == 1 continuing a product)
  float alpha;  // otherwise: C = alpha * sum + beta * C (beta == 0 never reads C)
  float beta;
};
using TileFn = void (*)(const TileArgs&);

// Packs one kFp32 sliver from an operand whose depth is contiguous (A's rows, or B's columns when
// B is transposed): lane l's k values start at src + l * laneStride. Writes [k][lanes] to dst,
// lanes valid..lanes-1 zero. The same bytes as sgemm.cc's scalar packing, faster.
using PackFn = void (*)(const float* src, int64_t laneStride, int valid, int lanes, int64_t k,
                        float* dst);

inline constexpr int kMaxMr = 16;

struct MicroKernel {
  int mr = 0, nr = 0;
  TileFn tiles[kMaxMr + 1] = {};         // tiles[r] runs a tile of r valid rows, 1 <= r <= mr
  PackFn packContiguousDepth = nullptr;  // a faster kFp32 packer for such slivers, if any
};

MicroKernel portableKernel();    // float32, any x86-64 (and any other CPU)
MicroKernel avx2Kernel();        // float32, AVX2 + FMA
MicroKernel avx512Kernel();      // float32, AVX-512F
MicroKernel avx512Bf16Kernel();  // kBf16Pairs, AVX512_BF16

}  // namespace kiln::cpu::sgemm_detail
