// kiln.Attention's fused (flash-style) forward kernel (flash_attention.h). One CTA of four warps
// takes one batch entry's block of 64 query rows, 16 rows a warp, and walks the keys in tiles of
// 64: the tile's K and V are staged in shared memory by the whole CTA, each warp computes its
// 16 x 64 scores with WMMA (16x16x16, float accumulators) into its own float scratch, folds them
// into the rows' running maximum m and sum l (the online softmax, all float), writes the tile's
// probabilities exp(s - m) in the storage type for the second product, and adds P · V (again
// through its scratch) to an output accumulator it keeps in registers, after scaling that by
// exp(m_old - m_new). The output is divided by l at the end.
//
// Within a warp, lane pair (2r, 2r + 1) owns row r: lane 2r + h the columns h, h + 2, h + 4, ...
// of the scores and of the output accumulator, so the rescaling needs no exchange but one shuffle
// between the pair for the row's maximum and sum.
//
// Non-finite values follow the reference (max-subtracted softmax in double): a row whose every
// score is -inf, or that has a NaN score (or +inf), has NaN probabilities there, so its output is
// NaN, or zeros with nanToZero. Here: exp is never taken of -inf - -inf (a -inf score gives p = 0
// outright, and an unchanged maximum gives the factor 1), a NaN score makes l NaN, and a row ends
// bad where l is not positive (0: nothing but -inf seen; NaN).
//
// Shared memory (bytes, d = 32 / 64 / 128): K or K' tile, V tile, P (4 warps x 16 x 64), float
// scratch (4 warps x 16 x max(64, d)); the Q block is staged once through the scratch region
// before the warps take their Q fragments into registers. Rows are padded by 16 bytes against
// bank conflicts, and every WMMA pointer stays 32-byte aligned. 44 KiB at d = 64, 76 KiB at
// d = 128 (configureFlashAttention raises the limit).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/flash_attention.h"

namespace kiln::cuda {
namespace {

namespace wmma = nvcuda::wmma;

using device::fromFloat;
using device::toFloat;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 4;
constexpr int kWarpRows = 16;                   // query rows a warp
constexpr int kBlockRows = kWarps * kWarpRows;  // query rows a CTA
constexpr int kThreads = kWarps * kWarpSize;    // 128
constexpr int kKeys = 64;                       // keys a tile
constexpr int kFrag = 16;                       // WMMA's m = n = k
constexpr int kHalfPad = 8;                     // 16 bytes of padding a row of halves
constexpr int kFloatPad = 4;                    // 16 bytes of padding a row of floats
constexpr int kLaneColumns = kKeys / 2;         // score columns a lane
constexpr int kStorageBytes = 2;                // float16 and bfloat16

// Where each array lives in the dynamic shared memory, in bytes, and its row pitch in elements.
template <int D, bool kTransposeK>
struct Layout {
  // K [keys][d] (transpose_k), read as WMMA's column-major B; K' [d][keys] otherwise, row-major B.
  static constexpr int kLdK = kTransposeK ? D + kHalfPad : kKeys + kHalfPad;
  static constexpr int kKRows = kTransposeK ? kKeys : D;
  static constexpr int kLdV = D + kHalfPad;
  static constexpr int kLdP = kKeys + kHalfPad;
  static constexpr int kLdS = (D > kKeys ? D : kKeys) + kFloatPad;
  static constexpr int kLdQ = D + kHalfPad;

  static constexpr int kKBytes = kKRows * kLdK * kStorageBytes;
  static constexpr int kVBytes = kKeys * kLdV * kStorageBytes;
  static constexpr int kPBytes = kWarps * kWarpRows * kLdP * kStorageBytes;
  static constexpr int kSBytes = kWarps * kWarpRows * kLdS * static_cast<int>(sizeof(float));
  static constexpr int kQBytes = kBlockRows * kLdQ * kStorageBytes;

  static constexpr int kK = 0;
  static constexpr int kV = kK + kKBytes;
  static constexpr int kP = kV + kVBytes;
  static constexpr int kS = kP + kPBytes;  // the Q block, until the first tile
  static constexpr int kBytes = kS + kSBytes;

  static_assert(kQBytes <= kSBytes, "the Q block must fit in the scratch it is staged through");
  static_assert(kV % 128 == 0 && kP % 128 == 0 && kS % 128 == 0, "arrays 128-byte aligned");
  // WMMA: pitches a multiple of 16 bytes; fragment origins (16-row steps) 32-byte aligned.
  static_assert((kWarpRows * kLdK * kStorageBytes) % 32 == 0 &&
                    (kWarpRows * kLdV * kStorageBytes) % 32 == 0 &&
                    (kWarpRows * kLdP * kStorageBytes) % 32 == 0 &&
                    (kWarpRows * kLdQ * kStorageBytes) % 32 == 0 &&
                    (kWarpRows * kLdS * static_cast<int>(sizeof(float))) % 32 == 0,
                "16-row steps keep WMMA pointers 32-byte aligned");
};

// The bits of a float16 or bfloat16.
__device__ __forceinline__ unsigned bitsOf(__half v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned bitsOf(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

// Copies the [kRows, kCols] tile at `global` (rows ldGlobal elements apart; only rows <
// validRows and columns < validCols exist) into `shared` (rows ldShared apart), zeros for the
// rest: V's missing keys must be 0, not stale data, as 0 * NaN would poison the product. With
// `vectorized` (global and ldGlobal 16-byte aligned, validCols a multiple of 8) 16 bytes a load.
// All kThreads threads take part.
template <typename T, int kRows, int kCols>
__device__ __forceinline__ void loadTile(T* shared, int ldShared, const T* global, int64_t ldGlobal,
                                         int validRows, int validCols, bool vectorized) {
  static_assert(kCols % 8 == 0, "tiles are whole 16-byte vectors wide");
  if (vectorized) {
    constexpr int kVectorsPerRow = kCols / 8;
    for (int e = static_cast<int>(threadIdx.x); e < kRows * kVectorsPerRow; e += kThreads) {
      const int r = e / kVectorsPerRow;
      const int c = (e % kVectorsPerRow) * 8;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (r < validRows && c < validCols) {
        value = *reinterpret_cast<const uint4*>(global + r * ldGlobal + c);
      }
      *reinterpret_cast<uint4*>(shared + r * ldShared + c) = value;
    }
    return;
  }
  for (int e = static_cast<int>(threadIdx.x); e < kRows * kCols; e += kThreads) {
    const int r = e / kCols;
    const int c = e % kCols;
    shared[r * ldShared + c] =
        r < validRows && c < validCols ? global[r * ldGlobal + c] : fromFloat<T>(0.0f);
  }
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

__device__ __forceinline__ int64_t offsetOf(const FlashOperand& o, int64_t outer, int64_t head) {
  return outer * o.outerStride + head * o.headStride;
}

template <typename T, int D, bool kTransposeK>
__device__ __forceinline__ void flashAttention(const FlashAttentionArgs& args) {
  using L = Layout<D, kTransposeK>;
  using AFragment = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major>;
  using KFragment =
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T,
                     std::conditional_t<kTransposeK, wmma::col_major, wmma::row_major>>;
  using VFragment = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::row_major>;
  using Accumulator = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

  extern __shared__ __align__(128) unsigned char shared[];
  T* sK = reinterpret_cast<T*>(shared + L::kK);
  T* sV = reinterpret_cast<T*>(shared + L::kV);
  T* sP = reinterpret_cast<T*>(shared + L::kP);
  float* sS = reinterpret_cast<float*>(shared + L::kS);
  T* sQ = reinterpret_cast<T*>(shared + L::kS);

  const int64_t qBlocks = (args.sq + kBlockRows - 1) / kBlockRows;
  const int64_t b = static_cast<int64_t>(blockIdx.x) / qBlocks;
  const int64_t q0 = (static_cast<int64_t>(blockIdx.x) - b * qBlocks) * kBlockRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;

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
  // Block-uniform: every thread takes the same branch of loadTile. 16-byte vectors need every
  // matrix origin and row 16-byte aligned.
  const bool vectorized = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(y) &&
                          ldQ % 8 == 0 && ldV % 8 == 0 && ldY % 8 == 0;
  const bool vectorizedK = vectorized && ldK % 8 == 0;

  // The Q block, through the scratch, into each warp's A fragments (kept for every tile).
  const int queries = static_cast<int>(args.sq - q0 < kBlockRows ? args.sq - q0 : kBlockRows);
  loadTile<T, kBlockRows, D>(sQ, L::kLdQ, q + q0 * ldQ, ldQ, queries, D, vectorized);
  __syncthreads();
  AFragment qFragments[D / kFrag];
#pragma unroll
  for (int kk = 0; kk < D / kFrag; ++kk) {
    wmma::load_matrix_sync(qFragments[kk], sQ + warp * kWarpRows * L::kLdQ + kk * kFrag, L::kLdQ);
  }
  // (The first tile's barriers below come before any warp writes its scratch over sQ.)

  const int row = lane / 2;  // of the warp's 16
  const int column = lane % 2;
  const int64_t warpRow0 = q0 + warp * kWarpRows;
  const bool warpActive = warpRow0 < args.sq;  // warp-uniform
  const int64_t i = warpRow0 + row;            // this lane's query row
  const T* mask = nullptr;
  if (args.mask && i < args.sq) {
    mask = static_cast<const T*>(args.mask) + args.maskBatchOffsets[b] + i * args.maskRowStride;
  }
  float* sSw = sS + warp * kWarpRows * L::kLdS;
  T* sPw = sP + warp * kWarpRows * L::kLdP;
  float* sSRow = sSw + row * L::kLdS;
  T* sPRow = sPw + row * L::kLdP;

  float out[D / 2];  // columns column + 2t of row `row`, unnormalised
#pragma unroll
  for (int t = 0; t < D / 2; ++t) out[t] = 0.0f;
  float runningMax = -INFINITY;
  float runningSum = 0.0f;

  for (int64_t key0 = 0; key0 < args.skv; key0 += kKeys) {
    const int keys = static_cast<int>(args.skv - key0 < kKeys ? args.skv - key0 : kKeys);
    __syncthreads();  // the previous tile's K and V (and, first, the Q block) are read
    if constexpr (kTransposeK) {
      loadTile<T, kKeys, D>(sK, L::kLdK, k + key0 * ldK, ldK, keys, D, vectorizedK);
    } else {
      // K' [d][keys]: a tile's rows start key0 into each row; 16-byte vectors need key0 and the
      // keys in whole vectors.
      loadTile<T, D, kKeys>(sK, L::kLdK, k + key0, ldK, D, keys, vectorizedK && keys % 8 == 0);
    }
    loadTile<T, kKeys, D>(sV, L::kLdV, v + key0 * ldV, ldV, keys, D, vectorized);
    __syncthreads();
    // A warp whose rows are all past sq skips the work but still meets every barrier. Then the
    // scores: the warp's 16 rows against the tile's 64 keys, unscaled, into the scratch.
    if (!warpActive) continue;
#pragma unroll
    for (int n = 0; n < kKeys / kFrag; ++n) {
      Accumulator scores;
      wmma::fill_fragment(scores, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / kFrag; ++kk) {
        KFragment kFragment;
        if constexpr (kTransposeK) {
          // K [keys][d]: B(e, j) = K[j][e], column-major with the keys as columns.
          wmma::load_matrix_sync(kFragment, sK + n * kFrag * L::kLdK + kk * kFrag, L::kLdK);
        } else {
          // K' [d][keys]: B(e, j) = K'[e][j], row-major.
          wmma::load_matrix_sync(kFragment, sK + kk * kFrag * L::kLdK + n * kFrag, L::kLdK);
        }
        wmma::mma_sync(scores, qFragments[kk], kFragment, scores);
      }
      wmma::store_matrix_sync(sSw + n * kFrag, scores, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();

    // The online softmax of this lane's half row. Missing keys (past skv) count as -inf.
    float s[kLaneColumns];
    float tileMax = -INFINITY;
#pragma unroll
    for (int t = 0; t < kLaneColumns; ++t) {
      const int c = column + 2 * t;
      float score = -INFINITY;
      if (c < keys) {
        score = args.scale * sSRow[c];
        if (mask) score += toFloat(mask[(key0 + c) * args.maskColumnStride]);
      }
      s[t] = score;
      tileMax = fmaxf(tileMax, score);  // fmaxf skips NaN, as the reference's std::max
    }
    tileMax = fmaxf(tileMax, __shfl_xor_sync(kFullMask, tileMax, 1));
    const float newMax = fmaxf(runningMax, tileMax);
    // Equal maxima (both -inf included) keep the factor 1: exp(-inf - -inf) would be NaN.
    const float rescale = runningMax == newMax ? 1.0f : __expf(runningMax - newMax);
    float tileSum = 0.0f;
#pragma unroll
    for (int t = 0; t < kLaneColumns; ++t) {
      // A -inf score weighs 0 even under a -inf maximum; NaN (and +inf - +inf) stay NaN.
      const float p = s[t] == -INFINITY ? 0.0f : __expf(s[t] - newMax);
      const T stored = fromFloat<T>(p);
      sPRow[column + 2 * t] = stored;
      tileSum += toFloat(stored);  // the sum of what P · V multiplies
    }
    tileSum += __shfl_xor_sync(kFullMask, tileSum, 1);
    runningSum = runningSum * rescale + tileSum;
    runningMax = newMax;
#pragma unroll
    for (int t = 0; t < D / 2; ++t) out[t] *= rescale;
    __syncwarp();

    // P · V for the tile, through the scratch, added to the accumulator.
    AFragment pFragments[kKeys / kFrag];
#pragma unroll
    for (int kk = 0; kk < kKeys / kFrag; ++kk) {
      wmma::load_matrix_sync(pFragments[kk], sPw + kk * kFrag, L::kLdP);
    }
#pragma unroll
    for (int n = 0; n < D / kFrag; ++n) {
      Accumulator values;
      wmma::fill_fragment(values, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kKeys / kFrag; ++kk) {
        VFragment vFragment;
        wmma::load_matrix_sync(vFragment, sV + kk * kFrag * L::kLdV + n * kFrag, L::kLdV);
        wmma::mma_sync(values, pFragments[kk], vFragment, values);
      }
      wmma::store_matrix_sync(sSw + n * kFrag, values, L::kLdS, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < D / 2; ++t) out[t] += sSRow[column + 2 * t];
    __syncwarp();  // the next tile's scores overwrite the scratch
  }
  if (!warpActive) return;  // no barrier follows

  // Normalise into the scratch, then store the warp's rows 16 bytes at a time.
  const bool bad = !(runningSum > 0.0f);  // 0: every score -inf; NaN: a NaN (or +inf) score
  const float fill = args.nanToZero ? 0.0f : __int_as_float(0x7fc00000);
  const float inverse = 1.0f / runningSum;
#pragma unroll
  for (int t = 0; t < D / 2; ++t) sSRow[column + 2 * t] = bad ? fill : out[t] * inverse;
  __syncwarp();
  constexpr int kVectorsPerRow = D / 8;
  for (int e = lane; e < kWarpRows * kVectorsPerRow; e += kWarpSize) {
    const int r = e / kVectorsPerRow;
    const int c = (e % kVectorsPerRow) * 8;
    if (warpRow0 + r >= args.sq) continue;
    const float* from = sSw + r * L::kLdS + c;
    T* to = y + (warpRow0 + r) * ldY + c;
    if (vectorized) {
      unsigned words[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        words[w] =
            bitsOf(fromFloat<T>(from[2 * w])) | (bitsOf(fromFloat<T>(from[2 * w + 1])) << 16);
      }
      *reinterpret_cast<uint4*>(to) = make_uint4(words[0], words[1], words[2], words[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) to[j] = fromFloat<T>(from[j]);
    }
  }
}

template <typename T, int D, bool kTransposeK>
__global__ void __launch_bounds__(kThreads) flashAttentionKernel(FlashAttentionArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  (void)args;
  __trap();  // bfloat16 WMMA needs sm_80 (the step's prepare refuses older devices)
#else
  flashAttention<T, D, kTransposeK>(args);
#endif
}

// Calls fn with the kernel instance for the arguments' type, head size and K layout, and its
// shared memory bytes.
template <typename Fn>
cudaError_t byInstance(const FlashAttentionArgs& args, Fn&& fn) {
  auto byLayout = [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    auto byHead = [&](auto transposeK) -> cudaError_t {
      constexpr bool kTransposeK = decltype(transposeK)::value;
      switch (args.d) {
        case 32:
          return fn(flashAttentionKernel<T, 32, kTransposeK>, Layout<32, kTransposeK>::kBytes);
        case 64:
          return fn(flashAttentionKernel<T, 64, kTransposeK>, Layout<64, kTransposeK>::kBytes);
        case 128:
          return fn(flashAttentionKernel<T, 128, kTransposeK>, Layout<128, kTransposeK>::kBytes);
        default:
          return cudaErrorInvalidValue;
      }
    };
    return args.transposeK ? byHead(std::true_type{}) : byHead(std::false_type{});
  };
  switch (args.type) {
    case kGemmFloat16:
      return byLayout(device::Tag<__half>{});
    case kGemmBFloat16:
      return byLayout(device::Tag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t configureFlashAttention(const FlashAttentionArgs& args) {
  return byInstance(args, [](auto kernel, int bytes) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  });
}

cudaError_t launchFlashAttention(const FlashAttentionArgs& args, cudaStream_t stream) {
  if (args.batch <= 0 || args.sq <= 0 || args.skv <= 0) return cudaSuccess;
  const int64_t blocks = (args.sq + kBlockRows - 1) / kBlockRows * args.batch;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  return byInstance(args, [&](auto kernel, int bytes) {
    kernel<<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(args);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
