// kiln.Attention's fused (flash-style, FlashAttention-2 order) forward kernel (flash_attention.h).
// One CTA of four warps takes one batch entry's block of 64 query rows, 16 rows a warp, and walks
// the keys in tiles of 64. The whole CTA stages each tile's K (or K') and V in shared memory with
// cp.async, double-buffered so that tile t + 1 loads while tile t is computed. Each warp keeps its
// Q rows (as mma A fragments), its 16 x 64 scores and its 16 x D output accumulator in registers:
// S = Q · K^T with mma.sync m16n8k16 (float accumulators), scale and mask, the online softmax
// (running maximum m and sum l per row), the probabilities rounded to the storage type and
// re-packed from S's accumulator registers into the A fragments of O += P · V, O first rescaled by
// exp(m_old - m_new). O / l is staged through shared memory to 16-byte stores at the end.
//
// Fragments (m16n8k16, per the PTX ISA; g = lane / 4, c = lane % 4):
//   A 16x16 (row): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..).
//   B 16x8 (col):  b0 = (k 2c..2c+1, n g), b1 = (k 2c+8..2c+9, n g).
//   C 16x8 (f32):  c0, c1 = (g, 2c), (g, 2c+1); c2, c3 = (g+8, 2c), (g+8, 2c+1).
// ldmatrix .x4 takes the row addresses of matrix i from lanes 8i..8i+7 and gives register i:
// (row g, columns 2c, 2c+1) of matrix i, or with .trans (rows 2c, 2c+1, column g) of it, the lower
// index in the lower half. So, with the 8x8 matrices named by (rows, columns) of the stored tile:
//   Q [rows][d]: matrices (rows 0-7 | 8-15) x (d 16kk+0-7 | +8-15) in the order a0..a3, i.e. lane
//     l points at row l % 16, column 16kk + (l / 16) * 8; no .trans.
//   K [keys][d] (transposeK): B(e, j) = K[j][e], so b0 of key tile n is the plain matrix (keys
//     8n..8n+7) x (d 16kk..16kk+7); one .x4 gives (b0, b1) of key tiles 2p and 2p+1: lane l at key
//     16p + (l / 16) * 8 + l % 8, column 16kk + ((l / 8) % 2) * 8; no .trans.
//   K' [d][keys]: B(e, j) = K'[e][j], b0 of key tile n is the transposed matrix (d 16kk..16kk+7) x
//     (keys 8n..8n+7): lane l at row 16kk + l % 16, column 16p + (l / 16) * 8; .trans.
//   V [keys][d]: B(j, e) = V[j][e], the same as K' with keys for d: lane l at key 16kk + l % 16,
//     column 16p + (l / 16) * 8, .trans, giving (b0, b1) of output tiles 2p and 2p + 1.
//   P: S's accumulators of key tiles 2kk and 2kk + 1 are, per thread, (g | g+8, 16kk + 2c..) and
//     (g | g+8, 16kk + 8 + 2c..): exactly a0..a3 of P · V's k step kk once packed in pairs.
//
// Non-finite values follow the reference (max-subtracted softmax in double): a row whose every
// score is -inf, or that has a NaN score (or +inf), has NaN probabilities there, so its output is
// NaN, or zeros with nanToZero. Here: exp is never taken of -inf - -inf (a row whose maximum is
// still -inf subtracts 0 instead, so a -inf score gives exp(-inf) = 0 and the factor for the old
// state is exp(-inf) = 0, which leaves l = 0 (or NaN) as it was), a NaN score makes l NaN
// (NaN - m is NaN), and a row ends bad where l is not positive (0: nothing but -inf seen; NaN).
// l sums the probabilities as rounded to the storage type, which is what P · V multiplies; each
// thread sums its own columns (the rescaling is per row, so linear) and the quad adds the four
// partial sums at the end.
//
// Shared memory: the Q block [64][d] (also the output staging at the end, each warp in its own 16
// rows), two K buffers ([64][d], or K' [d][64]) and two V buffers [64][d], every row padded by 16
// bytes: a pitch of an odd number of 16-byte units puts ldmatrix's 8 rows of 16 bytes in 8
// different 4-bank groups, so neither ldmatrix nor the 16-byte cp.async stores conflict. Bytes
// (transposeK / K'): d = 32: 25600 / 24576; d = 64: 46080 / 46080; d = 128: 87040 / 89088
// (configureFlashAttention raises the limit above 48 KiB for d = 128).
//
// Tile sizes: 64 query rows a CTA by default (16 a warp is the mma's m; FlashAttentionArgs::warps
// gives 32 or 128 instead: cuda.attention.flash.warps) and 64 keys a tile for every head
// size: the scores take 32 registers a thread, P's A fragments reuse them, and 64 keys give 4 k
// steps of P · V against one ldmatrix .x4 per 16 output columns. Smaller key tiles would not save
// work on the short sequences (Swin's 49 keys need 64 either way as 2 x 32), and larger ones add
// registers d = 128 cannot spare.
//
// Registers (ptxas for sm_90, 4 warps, no spills): d = 32: 118-126, d = 64: 164-167, d = 128:
// 253-255, so 4, 3 and 2 CTAs an SM (minBlocks). The split-keys instances (kSplit) are compiled
// apart, so these stay as they were; of them, d = 128 with K' has a 16-byte (float16) and 48-byte
// (bfloat16) stack frame at 4 warps, 12 and 44 bytes of spill stores (ptxas, CUDA 13.0,
// 2026-12-08). The mask's values of a full tile
// are loaded ahead of Q · K^T, a word for two adjacent keys where the mask's columns are contiguous
// and its rows 4-byte aligned (GPT-2's causal [1, 1, S, S], BERT's [B, 1, 1, S]); other masks and
// the last, partial tile read them element by element.
//
// Operands not 16-byte aligned (the entry's origin, or a row stride not a multiple of 8) are
// staged element by element with plain loads instead (slower, same result).
//
// Split keys (FlashAttentionArgs::work): a short batch launches fewer CTAs than the GPU has SMs,
// all in one wave, and the longest query block (under GPT-2's causal mask the last, 8 tiles at
// 512 keys) sets the kernel's time. With a work list, a long block's tiles are shared among
// several CTAs: each runs the loop above over its part and, instead of normalising, leaves O, m
// and the quad-summed l of its rows in float in the workspace; flashCombineKernel then rescales
// every part to the largest m and divides the summed O by the summed l. Softmax is invariant to
// the shift, so this is the same function; the probabilities are rounded to the storage type
// against each part's own maximum, and the sums run in another order, so the bits differ from
// an unsplit walk (a block left whole, slot -1, gives the unsplit bits).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/flash_attention.h"

namespace kiln::cuda {
namespace {

using device::fromFloat;
using device::toFloat;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpRows = 16;  // query rows a warp: the mma's m
// A CTA is W warps (FlashAttentionArgs::warps: 2, 4 or 8): W * 16 query rows, W * 32 threads.
template <int W>
constexpr int kBlockRowsOf = W* kWarpRows;
template <int W>
constexpr int kThreadsOf = W* kWarpSize;
constexpr int kKeys = 64;  // keys a tile
static_assert(kKeys == kFlashKeyTile, "FlashAttentionArgs::keyTiles counts tiles of kKeys");
constexpr int kScoreTiles = kKeys / 8;  // n8 tiles of a warp's scores
constexpr int kKeySteps = kKeys / 16;   // k16 steps of P · V
constexpr int kPad = 8;                 // 16 bytes of padding a row
constexpr int kStorageBytes = 2;        // float16 and bfloat16
constexpr int kVector = 8;              // elements in 16 bytes

// Where each array lives in the dynamic shared memory, in bytes, and its row pitch in elements.
template <int D, bool kTransposeK, int W>
struct Layout {
  static constexpr int kLdQ = D + kPad;
  static constexpr int kLdK = kTransposeK ? D + kPad : kKeys + kPad;  // K [keys][d], K' [d][keys]
  static constexpr int kKRows = kTransposeK ? kKeys : D;
  static constexpr int kLdV = D + kPad;

  static constexpr int kKElements = kKRows * kLdK;  // one buffer
  static constexpr int kVElements = kKeys * kLdV;

  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kBlockRowsOf<W> * kLdQ * kStorageBytes;
  static constexpr int kV = kK + 2 * kKElements * kStorageBytes;
  static constexpr int kBytes = kV + 2 * kVElements * kStorageBytes;

  static_assert(kK % 128 == 0 && kV % 128 == 0 && (kKElements * kStorageBytes) % 128 == 0 &&
                    (kVElements * kStorageBytes) % 128 == 0,
                "arrays and buffers 128-byte aligned");
  // An odd number of 16-byte units a row: ldmatrix's 8 rows hit 8 different 4-bank groups.
  static_assert((kLdQ * kStorageBytes) % 32 == 16 && (kLdK * kStorageBytes) % 32 == 16 &&
                    (kLdV * kStorageBytes) % 32 == 16,
                "row pitches are an odd number of 16-byte units");
};

// --- PTX wrappers (sm_80+) ---------------------------------------------------------------------

__device__ __forceinline__ unsigned sharedAddress(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Starts copying `bytes` (0 to 16) from global to shared and zero-fills the rest of the 16 (.cg:
// through L2 only). Both addresses 16-byte aligned. Complete after waitCopies and, for the other
// threads, a barrier.
__device__ __forceinline__ void copy16Async(void* shared, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(shared)),
               "l"(global), "r"(bytes));
}

__device__ __forceinline__ void commitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits for every copy this thread started.
__device__ __forceinline__ void waitCopies() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8x8 matrices of 16-bit elements, row addresses from lanes 8i..8i+7 for matrix i. Volatile:
// shared memory changes under the same address from one tile to the next.
template <bool kTrans>
__device__ __forceinline__ void loadMatrices(unsigned (&r)[4], const void* shared) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(shared)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(sharedAddress(shared)));
  }
}

// c += a · b on tensor cores: A 16x16, B 16x8 of T, C 16x8 float (fragments as in the header).
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "float16 or bfloat16");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// --- pairs of float16 / bfloat16 as one 32-bit word (the lower index in the lower half) ---------

template <typename To, typename From>
__device__ __forceinline__ To bitCast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

template <typename T>
struct Pair;

template <>
struct Pair<__half> {
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    return bitCast<unsigned>(__floats2half2_rn(lo, hi));
  }
  static __device__ __forceinline__ float2 unpack(unsigned bits) {
    return __half22float2(bitCast<__half2>(bits));
  }
};

template <>
struct Pair<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    return bitCast<unsigned>(__floats2bfloat162_rn(lo, hi));
  }
  static __device__ __forceinline__ float2 unpack(unsigned bits) {
    return __bfloat1622float2(bitCast<__nv_bfloat162>(bits));
  }
};

// Rounds lo and hi to T, packed, and adds the rounded values to sum.
template <typename T>
__device__ __forceinline__ unsigned packAndSum(float lo, float hi, float& sum) {
  const unsigned bits = Pair<T>::pack(lo, hi);
  const float2 rounded = Pair<T>::unpack(bits);
  sum += rounded.x + rounded.y;
  return bits;
}

// --- staging ------------------------------------------------------------------------------------

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ int64_t offsetOf(const FlashOperand& o, int64_t outer, int64_t head) {
  return outer * o.outerStride + head * o.headStride;
}

// Copies the [kRows, kCols] tile at `global` (rows ldGlobal elements apart; only rows < validRows
// and columns < validCols exist) into `shared` (rows ldShared apart), zeros for the rest: V's
// missing keys must be 0, not stale data, as 0 * NaN would poison the product. With `vectorized`
// (global and ldGlobal 16-byte aligned) by cp.async, 16 bytes a copy (a partial vector reads only
// its valid elements); else element by element, synchronously. All kThreads threads take part
// (block-uniform `vectorized`).
template <typename T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void stageTile(T* shared, int ldShared, const T* global,
                                          int64_t ldGlobal, int validRows, int validCols,
                                          bool vectorized) {
  static_assert(kCols % kVector == 0, "tiles are whole 16-byte vectors wide");
  const int tid = static_cast<int>(threadIdx.x);
  if (vectorized) {
    constexpr int kVectorsPerRow = kCols / kVector;
    constexpr int kVectors = kRows * kVectorsPerRow;
    static_assert(kVectors % kThreads == 0, "every thread copies as many vectors");
#pragma unroll
    for (int i = 0; i < kVectors / kThreads; ++i) {
      const int e = i * kThreads + tid;
      const int r = e / kVectorsPerRow;
      const int c = (e % kVectorsPerRow) * kVector;
      const int remaining = validCols - c;
      const int elements = r >= validRows || remaining <= 0 ? 0
                           : remaining < kVector            ? remaining
                                                            : kVector;
      // With nothing to read, any valid address will do: the tile's origin.
      const T* from = elements > 0 ? global + r * ldGlobal + c : global;
      copy16Async(shared + r * ldShared + c, from, elements * kStorageBytes);
    }
    return;
  }
  for (int e = tid; e < kRows * kCols; e += kThreads) {
    const int r = e / kCols;
    const int c = e % kCols;
    shared[r * ldShared + c] =
        r < validRows && c < validCols ? global[r * ldGlobal + c] : fromFloat<T>(0.0f);
  }
}

// CTAs an SM the registers must allow: 4 for d = 32 (at most 128 registers a thread; Swin's
// thousands of short entries want the occupancy), 3 for d = 64 (168: at 128 the mask words loaded
// ahead of Q · K^T spill), 2 for d = 128 (255: O and the Q fragments alone take 96).
// With W warps a CTA instead of 4, the same registers a thread allow 4 / W times as many CTAs.
constexpr int minBlocks(int d, int warps) {
  const int perFourWarps = d == 32 ? 4 : d == 64 ? 3 : 2;
  return perFourWarps * 4 / warps > 0 ? perFourWarps * 4 / warps : 1;
}

// kSplit: the instance for split keys (args.work set), apart so that the unsplit instances keep
// their registers (the work item and the partial stores cost d = 128 a spill).
template <typename T, int D, bool kTransposeK, int W, bool kSplit>
__device__ __forceinline__ void flashAttention(const FlashAttentionArgs& args) {
  using L = Layout<D, kTransposeK, W>;
  constexpr int kBlockRows = kBlockRowsOf<W>;
  constexpr int kThreads = kThreadsOf<W>;
  constexpr int kDepthSteps = D / 16;  // k16 steps of Q · K^T
  constexpr int kOutTiles = D / 8;     // n8 tiles of the output

  extern __shared__ __align__(128) unsigned char shared[];
  T* sQ = reinterpret_cast<T*>(shared + L::kQ);
  T* sK = reinterpret_cast<T*>(shared + L::kK);
  T* sV = reinterpret_cast<T*>(shared + L::kV);

  int64_t b = 0, qBlock = 0;
  int64_t firstKey = 0, endKey = args.skv;
  int slot = -1;  // where a part of a split range leaves its partial rows; -1: rows of Y
  if constexpr (kSplit) {
    // Split keys: the host's work item i (longest walks first) for every batch entry b, at
    // i * batch + b, so that the longest walks of all entries start first.
    const int64_t i = static_cast<int64_t>(blockIdx.x) / args.batch;
    b = static_cast<int64_t>(blockIdx.x) - i * args.batch;
    const int4 item = reinterpret_cast<const int4*>(args.work)[i];
    qBlock = item.x;
    firstKey = item.y * int64_t{kKeys};
    endKey = min(args.skv, item.z * int64_t{kKeys});
    slot = item.w;
  } else {
    const int64_t qBlocks = (args.sq + kBlockRows - 1) / kBlockRows;
    b = static_cast<int64_t>(blockIdx.x) / qBlocks;
    qBlock = static_cast<int64_t>(blockIdx.x) - b * qBlocks;
    // The key tiles the block walks: with keyTiles, the last query blocks first (under a causal
    // mask they walk the most tiles, so they start first).
    if (args.keyTiles) {
      qBlock = qBlocks - 1 - qBlock;
      firstKey = args.keyTiles[2 * qBlock] * int64_t{kKeys};
      endKey = min(args.skv, args.keyTiles[2 * qBlock + 1] * int64_t{kKeys});
    }
  }
  const int64_t q0 = qBlock * kBlockRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group = lane / 4;     // rows group and group + 8 of the warp's 16
  const int quadLane = lane % 4;  // columns 2 * quadLane and + 1 of every n8 tile

  const int64_t outer = b / args.heads;
  const int64_t head = b - outer * args.heads;
  const T* q = static_cast<const T*>(args.q) + offsetOf(args.qLayout, outer, head);
  const T* k = static_cast<const T*>(args.k) + offsetOf(args.kLayout, outer, head);
  const T* v = static_cast<const T*>(args.v) + offsetOf(args.vLayout, outer, head);
  T* y = static_cast<T*>(args.y) + offsetOf(args.yLayout, outer, head);
  const int64_t ldQ = args.qLayout.rowStride;
  const int64_t ldK = args.kLayout.rowStride;
  const int64_t ldV = args.vLayout.rowStride;
  const int64_t ldY = args.yLayout.rowStride;
  // Block-uniform. 16-byte vectors need the entry's origin and every row 16-byte aligned (tile
  // origins then are: key0 is a multiple of 64).
  const bool vectorQ = aligned16(q) && ldQ % kVector == 0;
  const bool vectorK = aligned16(k) && ldK % kVector == 0;
  const bool vectorV = aligned16(v) && ldV % kVector == 0;
  const bool vectorY = aligned16(y) && ldY % kVector == 0;

  const int64_t skv = args.skv;
  // Stages the key tile from key0 on, K (or K') and V, into buffer 0 or 1.
  auto stageKeys = [&](int64_t key0, int buffer) {
    const int keys = static_cast<int>(skv - key0 < kKeys ? skv - key0 : kKeys);
    T* toK = sK + buffer * L::kKElements;
    T* toV = sV + buffer * L::kVElements;
    if constexpr (kTransposeK) {
      stageTile<T, kKeys, D, kThreads>(toK, L::kLdK, k + key0 * ldK, ldK, keys, D, vectorK);
    } else {
      // K' [d][keys]: the tile's rows start key0 into each row.
      stageTile<T, D, kKeys, kThreads>(toK, L::kLdK, k + key0, ldK, D, keys, vectorK);
    }
    stageTile<T, kKeys, D, kThreads>(toV, L::kLdV, v + key0 * ldV, ldV, keys, D, vectorV);
  };

  // The Q block (rows past sq zero) and the first key tile, then each warp's Q fragments, kept in
  // registers for every tile.
  const int queries = static_cast<int>(args.sq - q0 < kBlockRows ? args.sq - q0 : kBlockRows);
  stageTile<T, kBlockRows, D, kThreads>(sQ, L::kLdQ, q + q0 * ldQ, ldQ, queries, D, vectorQ);
  if (firstKey < endKey) stageKeys(firstKey, 0);
  commitCopies();
  waitCopies();
  __syncthreads();

  const int64_t warpRow0 = q0 + warp * kWarpRows;
  const bool warpActive = warpRow0 < args.sq;  // warp-uniform
  unsigned qFragments[kDepthSteps][4];
  if (warpActive) {
    const T* from = sQ + (warp * kWarpRows + lane % 16) * L::kLdQ + (lane / 16) * 8;
#pragma unroll
    for (int kk = 0; kk < kDepthSteps; ++kk) loadMatrices<false>(qFragments[kk], from + kk * 16);
  }

  // Each lane's offsets of its ldmatrix row addresses in a K and a V buffer (see the header).
  const int kLane = kTransposeK ? ((lane / 16) * 8 + lane % 8) * L::kLdK + ((lane / 8) % 2) * 8
                                : (lane % 16) * L::kLdK + (lane / 16) * 8;
  const int vLane = (lane % 16) * L::kLdV + (lane / 16) * 8;

  // The mask rows of this thread's two query rows (rows past sq read row sq - 1: their results
  // are never stored). Pairs of adjacent keys load as one word where the columns are contiguous
  // and every row starts 4-byte aligned (GPT-2's [1, 1, S, S], BERT's [B, 1, 1, S]).
  const bool hasMask = args.mask.values != nullptr;
  const T* maskRows[2] = {nullptr, nullptr};
  bool pairedMask = false;
  if (hasMask) {
    const int64_t offset = args.mask.batchOffsets[b];
    const T* base = static_cast<const T*>(args.mask.values) + offset;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = warpRow0 + group + 8 * r;
      maskRows[r] = base + (i < args.sq ? i : args.sq - 1) * args.mask.rowStride;
    }
    pairedMask = args.mask.columnStride == 1 && args.mask.rowStride % 2 == 0 && offset % 2 == 0 &&
                 (reinterpret_cast<uintptr_t>(args.mask.values) & 3u) == 0;
  }

  // Per thread: rows group (index 0) and group + 8 (index 1) of the warp's 16.
  float rowMax[2] = {-INFINITY, -INFINITY};
  float rowSum[2] = {0.0f, 0.0f};  // this thread's columns only, until the end
  float out[kOutTiles][4];         // unnormalised O, C fragments
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) {
#pragma unroll
    for (int x = 0; x < 4; ++x) out[n][x] = 0.0f;
  }

  int buffer = 0;  // the tile's, tiles alternating
  for (int64_t key0 = firstKey; key0 < endKey; key0 += kKeys, buffer ^= 1) {
    if (key0 > firstKey) {
      waitCopies();
      __syncthreads();  // this tile is staged; every warp is done with the previous one's buffer
    }
    if (key0 + kKeys < endKey) {
      stageKeys(key0 + kKeys, buffer ^ 1);
      commitCopies();
    }
    // A warp whose rows are all past sq skips the work but still stages and meets every barrier.
    if (!warpActive) continue;

    const int keys = static_cast<int>(skv - key0 < kKeys ? skv - key0 : kKeys);
    const bool fullTile = keys == kKeys;
    const T* tileK = sK + buffer * L::kKElements + kLane;
    const T* tileV = sV + buffer * L::kVElements + vLane;

    // The mask words of a full tile, loaded ahead of the product to hide their latency.
    const bool pairedTile = pairedMask && fullTile;
    unsigned maskWords[2][kScoreTiles];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n) {
        maskWords[r][n] = pairedTile ? __ldg(reinterpret_cast<const unsigned*>(
                                           maskRows[r] + key0 + n * 8 + 2 * quadLane))
                                     : 0u;
      }
    }

    // S = Q · K^T, the warp's 16 rows against the tile's 64 keys.
    float s[kScoreTiles][4];
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
      for (int x = 0; x < 4; ++x) s[n][x] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kDepthSteps; ++kk) {
#pragma unroll
      for (int p = 0; p < kScoreTiles / 2; ++p) {
        unsigned bk[4];
        if constexpr (kTransposeK) {
          loadMatrices<false>(bk, tileK + p * 16 * L::kLdK + kk * 16);
        } else {
          loadMatrices<true>(bk, tileK + kk * 16 * L::kLdK + p * 16);
        }
        mma16816<T>(s[2 * p], qFragments[kk], bk[0], bk[1]);
        mma16816<T>(s[2 * p + 1], qFragments[kk], bk[2], bk[3]);
      }
    }

    // Scale and mask (the reference's scale * dot + mask); missing keys (past skv) are -inf.
    float tileMax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 pair = Pair<T>::unpack(maskWords[r][n]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int column = n * 8 + 2 * quadLane + h;
          float bias = 0.0f;
          if (pairedTile) {
            bias = h == 0 ? pair.x : pair.y;
          } else if (hasMask && column < keys) {
            bias = toFloat(maskRows[r][(key0 + column) * args.mask.columnStride]);
          }
          float score = fmaf(args.scale, s[n][2 * r + h], bias);
          if (!fullTile && column >= keys) score = -INFINITY;
          s[n][2 * r + h] = score;
          tileMax[r] = fmaxf(tileMax[r], score);  // fmaxf skips NaN, as the reference's std::max
        }
      }
    }

    // The online softmax: new maxima over the quad (the 4 lanes of a row), the old state's factor,
    // the probabilities packed as P · V's A fragments.
    float shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tileMax[r] = fmaxf(tileMax[r], __shfl_xor_sync(kFullMask, tileMax[r], 1));
      tileMax[r] = fmaxf(tileMax[r], __shfl_xor_sync(kFullMask, tileMax[r], 2));
      const float newMax = fmaxf(rowMax[r], tileMax[r]);
      // Still -inf: subtract 0, never -inf - -inf (see the header).
      shift[r] = newMax == -INFINITY ? 0.0f : newMax;
      const float factor = __expf(rowMax[r] - shift[r]);
      rowMax[r] = newMax;
      rowSum[r] *= factor;
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        out[n][2 * r] *= factor;
        out[n][2 * r + 1] *= factor;
      }
    }
    unsigned pFragments[kKeySteps][4];
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // key tiles 2kk and 2kk + 1
        const float* c = s[2 * kk + half];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          pFragments[kk][2 * half + r] = packAndSum<T>(__expf(c[2 * r] - shift[r]),
                                                       __expf(c[2 * r + 1] - shift[r]), rowSum[r]);
        }
      }
    }

    // O += P · V.
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
#pragma unroll
      for (int p = 0; p < kOutTiles / 2; ++p) {
        unsigned bv[4];
        loadMatrices<true>(bv, tileV + kk * 16 * L::kLdV + p * 16);
        mma16816<T>(out[2 * p], pFragments[kk], bv[0], bv[1]);
        mma16816<T>(out[2 * p + 1], pFragments[kk], bv[2], bv[3]);
      }
    }
  }
  if (!warpActive) return;  // no barrier follows

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rowSum[r] += __shfl_xor_sync(kFullMask, rowSum[r], 1);
    rowSum[r] += __shfl_xor_sync(kFullMask, rowSum[r], 2);
  }
  if (kSplit && slot >= 0) {
    // A part of a split range: the unnormalised rows, their maxima and sums (quad-uniform), for
    // the combine kernel. Rows past sq too (never read).
    const int64_t base = (b * args.slots + slot) * kBlockRows + warp * kWarpRows;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t row = base + group + 8 * r;
      float* to = args.partial + row * D + 2 * quadLane;
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        *reinterpret_cast<float2*>(to + n * 8) = make_float2(out[n][2 * r], out[n][2 * r + 1]);
      }
      if (quadLane == 0) {
        *reinterpret_cast<float2*>(args.partialStats + row * 2) = make_float2(rowMax[r], rowSum[r]);
      }
    }
    return;
  }

  // Normalise into the warp's own rows of the Q block (only this warp read them, into its
  // fragments), then store the rows below sq 16 bytes at a time.
  const float fill = args.nanToZero ? 0.0f : __int_as_float(0x7fc00000);
  float inverse[2];
  bool bad[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    bad[r] = !(rowSum[r] > 0.0f);  // 0: every score -inf; NaN: a NaN (or +inf) score
    inverse[r] = 1.0f / rowSum[r];
  }
  T* staged = sQ + warp * kWarpRows * L::kLdQ;
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kOutTiles; ++n) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lo = bad[r] ? fill : out[n][2 * r] * inverse[r];
      const float hi = bad[r] ? fill : out[n][2 * r + 1] * inverse[r];
      *reinterpret_cast<unsigned*>(staged + (group + 8 * r) * L::kLdQ + n * 8 + 2 * quadLane) =
          Pair<T>::pack(lo, hi);
    }
  }
  __syncwarp();
  constexpr int kVectorsPerRow = D / kVector;
  static_assert((kWarpRows * kVectorsPerRow) % kWarpSize == 0, "every lane stores as many");
#pragma unroll
  for (int i = 0; i < kWarpRows * kVectorsPerRow / kWarpSize; ++i) {
    const int e = i * kWarpSize + lane;
    const int r = e / kVectorsPerRow;
    const int c = (e % kVectorsPerRow) * kVector;
    if (warpRow0 + r >= args.sq) continue;
    const T* from = staged + r * L::kLdQ + c;
    T* to = y + (warpRow0 + r) * ldY + c;
    if (vectorY) {
      *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
    } else {
#pragma unroll
      for (int j = 0; j < kVector; ++j) to[j] = from[j];
    }
  }
}

template <typename T, int D, bool kTransposeK, int W, bool kSplit>
__global__ void __launch_bounds__(kThreadsOf<W>, minBlocks(D, W))
    flashAttentionKernel(FlashAttentionArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)args;
  __trap();  // mma.sync m16n8k16 (bfloat16), ldmatrix and cp.async need sm_80 (the step's prepare
             // refuses older devices)
#else
  flashAttention<T, D, kTransposeK, W, kSplit>(args);
#endif
}

// Split keys' second kernel: CTA b * combines + i merges the slots of query block combine[i] of
// batch entry b into its rows of Y, a thread 8 columns of a row at a time. With M the largest of
// the slots' maxima m_j (0 while it is -inf, as in the flash kernel), each slot's factor is
// exp(m_j - M); the row is sum_j factor_j O_j / sum_j factor_j l_j, and NaN (zeros with nanToZero)
// where that sum is not positive: 0 when no slot saw a finite score, NaN when one saw a NaN.
template <typename T, int D, int kBlockRows>
__global__ void __launch_bounds__(128) flashCombineKernel(FlashAttentionArgs args) {
  constexpr int kVectorsPerRow = D / kVector;
  const int64_t b = static_cast<int64_t>(blockIdx.x) / args.combines;
  const int32_t* item = args.combine + 3 * (static_cast<int64_t>(blockIdx.x) - b * args.combines);
  const int64_t q0 = int64_t{item[0]} * kBlockRows;
  const int64_t slot0 = b * args.slots + item[1];
  const int count = item[2];
  const int64_t outer = b / args.heads;
  const int64_t head = b - outer * args.heads;
  T* y = static_cast<T*>(args.y) + offsetOf(args.yLayout, outer, head);
  const int64_t ldY = args.yLayout.rowStride;
  const bool vectorY = aligned16(y) && ldY % kVector == 0;
  const float fill = args.nanToZero ? 0.0f : __int_as_float(0x7fc00000);
  for (int e = static_cast<int>(threadIdx.x); e < kBlockRows * kVectorsPerRow;
       e += static_cast<int>(blockDim.x)) {
    const int r = e / kVectorsPerRow;
    const int c = (e % kVectorsPerRow) * kVector;
    if (q0 + r >= args.sq) continue;
    float shift = -INFINITY;
    for (int j = 0; j < count; ++j) {
      shift = fmaxf(shift, args.partialStats[((slot0 + j) * kBlockRows + r) * 2]);
    }
    if (shift == -INFINITY) shift = 0.0f;
    float sum = 0.0f;
    float acc[kVector];
#pragma unroll
    for (int x = 0; x < kVector; ++x) acc[x] = 0.0f;
    for (int j = 0; j < count; ++j) {
      const int64_t row = (slot0 + j) * kBlockRows + r;
      const float2 stats = *reinterpret_cast<const float2*>(args.partialStats + row * 2);
      const float factor = __expf(stats.x - shift);
      sum += factor * stats.y;
      const float4* from = reinterpret_cast<const float4*>(args.partial + row * D + c);
      const float4 lo = from[0], hi = from[1];
      acc[0] += factor * lo.x;
      acc[1] += factor * lo.y;
      acc[2] += factor * lo.z;
      acc[3] += factor * lo.w;
      acc[4] += factor * hi.x;
      acc[5] += factor * hi.y;
      acc[6] += factor * hi.z;
      acc[7] += factor * hi.w;
    }
    const bool bad = !(sum > 0.0f);
    const float inverse = 1.0f / sum;
    unsigned packed[kVector / 2];
#pragma unroll
    for (int x = 0; x < kVector / 2; ++x) {
      packed[x] =
          Pair<T>::pack(bad ? fill : acc[2 * x] * inverse, bad ? fill : acc[2 * x + 1] * inverse);
    }
    T* to = y + (q0 + r) * ldY + c;
    if (vectorY) {
      *reinterpret_cast<uint4*>(to) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    } else {
      const T* values = reinterpret_cast<const T*>(packed);
#pragma unroll
      for (int x = 0; x < kVector; ++x) to[x] = values[x];
    }
  }
}

constexpr int kCombineThreads = 128;

// Calls fn(device::Tag<T>{}) for the storage type T of `type` (float16 or bfloat16).
template <typename Fn>
cudaError_t byStorageType(GemmType type, Fn&& fn) {
  switch (type) {
    case kGemmFloat16:
      return fn(device::Tag<__half>{});
    case kGemmBFloat16:
      return fn(device::Tag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Calls fn with the kernel instance for the arguments' type, head size and K layout, and its
// shared memory bytes.
template <typename Fn>
cudaError_t byInstance(const FlashAttentionArgs& args, Fn&& fn) {
  auto bySplit = [&](auto tag, auto transposeK, auto warps, auto head) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr bool kTransposeK = decltype(transposeK)::value;
    constexpr int W = decltype(warps)::value;
    constexpr int D = decltype(head)::value;
    constexpr int kBytes = Layout<D, kTransposeK, W>::kBytes;
    return args.work ? fn(flashAttentionKernel<T, D, kTransposeK, W, true>, kBytes)
                     : fn(flashAttentionKernel<T, D, kTransposeK, W, false>, kBytes);
  };
  auto byWarps = [&](auto tag, auto transposeK, auto warps) -> cudaError_t {
    switch (args.d) {
      case 32:
        return bySplit(tag, transposeK, warps, std::integral_constant<int, 32>{});
      case 64:
        return bySplit(tag, transposeK, warps, std::integral_constant<int, 64>{});
      case 128:
        return bySplit(tag, transposeK, warps, std::integral_constant<int, 128>{});
      default:
        return cudaErrorInvalidValue;
    }
  };
  auto byHead = [&](auto tag, auto transposeK) -> cudaError_t {
    switch (args.warps) {
      case 2:
        return byWarps(tag, transposeK, std::integral_constant<int, 2>{});
      case 4:
        return byWarps(tag, transposeK, std::integral_constant<int, 4>{});
      case 8:
        return byWarps(tag, transposeK, std::integral_constant<int, 8>{});
      default:
        return cudaErrorInvalidValue;
    }
  };
  return byStorageType(args.type, [&](auto tag) -> cudaError_t {
    return args.transposeK ? byHead(tag, std::true_type{}) : byHead(tag, std::false_type{});
  });
}

// The combine kernel for the arguments' CTA rows, of type T and head size D.
template <typename T, int D>
cudaError_t launchFlashCombineOf(const FlashAttentionArgs& args, unsigned blocks,
                                 cudaStream_t stream) {
  switch (args.warps) {
    case 2:
      flashCombineKernel<T, D, kBlockRowsOf<2>><<<blocks, kCombineThreads, 0, stream>>>(args);
      break;
    case 4:
      flashCombineKernel<T, D, kBlockRowsOf<4>><<<blocks, kCombineThreads, 0, stream>>>(args);
      break;
    case 8:
      flashCombineKernel<T, D, kBlockRowsOf<8>><<<blocks, kCombineThreads, 0, stream>>>(args);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// The combine kernel for the arguments' type, head size and CTA rows.
cudaError_t launchFlashCombine(const FlashAttentionArgs& args, cudaStream_t stream) {
  const int64_t grid = int64_t{args.combines} * args.batch;
  if (grid > INT_MAX) return cudaErrorInvalidConfiguration;
  const auto blocks = static_cast<unsigned>(grid);
  auto byHead = [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    switch (args.d) {
      case 32:
        return launchFlashCombineOf<T, 32>(args, blocks, stream);
      case 64:
        return launchFlashCombineOf<T, 64>(args, blocks, stream);
      case 128:
        return launchFlashCombineOf<T, 128>(args, blocks, stream);
      default:
        return cudaErrorInvalidValue;
    }
  };
  return byStorageType(args.type, byHead);
}

}  // namespace

cudaError_t configureFlashAttention(const FlashAttentionArgs& args) {
  return byInstance(args, [](auto kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
}

cudaError_t launchFlashAttention(const FlashAttentionArgs& args, cudaStream_t stream) {
  if (args.batch <= 0 || args.sq <= 0 || args.skv <= 0) return cudaSuccess;
  const int64_t rows = int64_t{args.warps} * kWarpRows;
  const int64_t blocks = (args.sq + rows - 1) / rows * args.batch;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  if (args.work) {
    const int64_t grid = int64_t{args.works} * args.batch;
    if (grid > INT_MAX || args.works <= 0) return cudaErrorInvalidConfiguration;
    const cudaError_t status = byInstance(args, [&](auto kernel, int bytes) {
      kernel<<<static_cast<unsigned>(grid), args.warps * kWarpSize, bytes, stream>>>(args);
      return cudaGetLastError();
    });
    if (status != cudaSuccess || args.combines <= 0) return status;
    return launchFlashCombine(args, stream);
  }
  return byInstance(args, [&](auto kernel, int bytes) {
    kernel<<<static_cast<unsigned>(blocks), args.warps * kWarpSize, bytes, stream>>>(args);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
