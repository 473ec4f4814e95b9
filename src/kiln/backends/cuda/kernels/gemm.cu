// kiln's own matrix-product kernels (gemm.h): a tiled shared-memory GEMM with the epilogue fused
// into its stores, and the epilogue alone for products cuBLASLt computed. Both load their
// float16 / bfloat16 operands into float, compute in float, and round once on the store.
//
// The GEMM is the textbook one, written to be obviously correct: a block of 256 threads computes
// a 64x64 tile of C, stepping through K 16 at a time with the A and B slivers staged in shared
// memory (zero-filled past the matrix edges), each thread accumulating a 4x4 set of elements
// strided by 16 rows and 16 columns so that its shared-memory reads and its stores coalesce.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/gemm.h"

namespace kiln::cuda {

namespace {

constexpr int kTileM = 64;
constexpr int kTileN = 64;
constexpr int kTileK = 16;
constexpr int kThreads = 256;  // 16 x 16, each 4 x 4 elements
constexpr int kGridLimit = 65535;

// std::min / std::max exactly (the reference kernels use them): the first argument unless the
// second compares smaller / greater, so a NaN second argument gives the first.
__device__ __forceinline__ float stdMin(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float stdMax(float a, float b) { return a < b ? b : a; }

// The activations as the reference applies them (src/kiln/reference/kernels/fused.cc).
__device__ __forceinline__ float activate(float x, int activation, float alpha, float beta) {
  switch (activation) {
    case kGemmActivationRelu:
      return x < 0.0f ? 0.0f : x;
    case kGemmActivationLeakyRelu:
      return x < 0.0f ? alpha * x : x;
    case kGemmActivationClip:
      if (x < alpha) x = alpha;
      if (x > beta) x = beta;
      return x;
    case kGemmActivationSigmoid:
      return 1.0f / (1.0f + expf(-x));
    case kGemmActivationHardSigmoid: {
      // The reference's max(0, min(1, NaN)) is 1 (std::min keeps its first operand when the
      // comparison fails); the compiler may turn this into a clamp that gives 0, so say it.
      const float y = alpha * x + beta;
      return y != y ? 1.0f : stdMax(0.0f, stdMin(1.0f, y));
    }
    case kGemmActivationHardSwish: {
      const float y = x / 6.0f + 0.5f;
      return x * (y != y ? 1.0f : stdMax(0.0f, stdMin(1.0f, y)));
    }
    case kGemmActivationTanh:
      return tanhf(x);
    case kGemmActivationGelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    case kGemmActivationGeluTanh:
      // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), which keeps its precision for negative x.
      return x / (1.0f + expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
    case kGemmActivationSilu:
      return x / (1.0f + expf(-x));
    default:
      return x;
  }
}

// Storage to and from the float32 arithmetic (round to nearest even on the way out).
using device::fromFloat;
using device::toFloat;

// T is the output's type, which the bias has too.
template <typename T>
__device__ __forceinline__ float applyEpilogue(float y, int64_t i, int64_t j,
                                               const GemmEpilogue& e) {
  if (e.bias) {
    const T* bias = static_cast<const T*>(e.bias);
    y += e.biasScale * toFloat(bias[i * e.biasRowStride + j * e.biasColumnStride]);
  }
  return activate(y, e.activation, e.activationAlpha, e.activationBeta);
}

template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads) nativeGemmKernel(NativeGemmArgs args) {
  // As[p][i] = op(A)(i0 + i, p0 + p), Bs[p][j] = op(B)(p0 + p, j0 + j), in float; rows padded by
  // 4 so that the transposing stores of the loads below spread over the banks.
  __shared__ float As[kTileK][kTileM + 4];
  __shared__ float Bs[kTileK][kTileN + 4];
  const int tx = static_cast<int>(threadIdx.x) % 16;
  const int ty = static_cast<int>(threadIdx.x) / 16;
  const int64_t m = args.m, n = args.n, k = args.k;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  for (int64_t entry = blockIdx.z; entry < args.batch; entry += gridDim.z) {
    const TIn* a = static_cast<const TIn*>(args.a) + entry * args.strideA;
    const TIn* b = static_cast<const TIn*>(args.b) + entry * args.strideB;
    TOut* c = static_cast<TOut*>(args.c) + entry * args.strideC;
    for (int64_t i0 = static_cast<int64_t>(blockIdx.y) * kTileM; i0 < m;
         i0 += static_cast<int64_t>(gridDim.y) * kTileM) {
      float acc[4][4];
      for (int r = 0; r < 4; ++r) {
        for (int s = 0; s < 4; ++s) acc[r][s] = 0.0f;
      }
      for (int64_t p0 = 0; p0 < k; p0 += kTileK) {
        // Each loop walks the operand's contiguous axis with consecutive threads.
        for (int l = static_cast<int>(threadIdx.x); l < kTileM * kTileK; l += kThreads) {
          const int ii = args.transA ? l % kTileM : l / kTileK;
          const int pp = args.transA ? l / kTileM : l % kTileK;
          const int64_t gi = i0 + ii, gp = p0 + pp;
          float v = 0.0f;
          if (gi < m && gp < k) {
            v = toFloat(args.transA ? a[gp * args.lda + gi] : a[gi * args.lda + gp]);
          }
          As[pp][ii] = v;
        }
        for (int l = static_cast<int>(threadIdx.x); l < kTileK * kTileN; l += kThreads) {
          const int jj = args.transB ? l / kTileK : l % kTileN;
          const int pp = args.transB ? l % kTileK : l / kTileN;
          const int64_t gj = j0 + jj, gp = p0 + pp;
          float v = 0.0f;
          if (gj < n && gp < k) {
            v = toFloat(args.transB ? b[gj * args.ldb + gp] : b[gp * args.ldb + gj]);
          }
          Bs[pp][jj] = v;
        }
        __syncthreads();
        for (int pp = 0; pp < kTileK; ++pp) {
          float av[4], bv[4];
          for (int r = 0; r < 4; ++r) av[r] = As[pp][ty + 16 * r];
          for (int s = 0; s < 4; ++s) bv[s] = Bs[pp][tx + 16 * s];
          for (int r = 0; r < 4; ++r) {
            for (int s = 0; s < 4; ++s) acc[r][s] += av[r] * bv[s];
          }
        }
        __syncthreads();
      }
      for (int r = 0; r < 4; ++r) {
        const int64_t i = i0 + ty + 16 * r;
        if (i >= m) continue;
        for (int s = 0; s < 4; ++s) {
          const int64_t j = j0 + tx + 16 * s;
          if (j >= n) continue;
          c[i * args.ldc + j] =
              fromFloat<TOut>(applyEpilogue<TOut>(args.alpha * acc[r][s], i, j, args.epilogue));
        }
      }
    }
  }
}

// kVec consecutive elements of one row, moved as one 16-byte access (kVec = 1: one element).
template <typename T, int kVec>
struct alignas(kVec * sizeof(T)) Pack {
  T v[kVec];
};

// Each thread takes kVec elements of a row at a time (columns is a multiple of kVec and y is
// aligned to the pack), so the row index is divided out once per pack.
template <typename T, int kVec>
__global__ void gemmEpilogueKernel(T* y, int64_t rows, int64_t columns, GemmEpilogue e) {
  const int64_t packs = rows * columns / kVec;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  Pack<T, kVec>* pointer = reinterpret_cast<Pack<T, kVec>*>(y);
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < packs;
       index += step) {
    const int64_t first = index * kVec;
    const int64_t i = first / columns;
    const int64_t j = first - i * columns;
    Pack<T, kVec> pack = pointer[index];
#pragma unroll
    for (int l = 0; l < kVec; ++l) {
      pack.v[l] = fromFloat<T>(applyEpilogue<T>(toFloat(pack.v[l]), i, j + l, e));
    }
    pointer[index] = pack;
  }
}

template <typename TIn, typename TOut>
cudaError_t launchNativeTyped(const NativeGemmArgs& args, cudaStream_t stream) {
  const int64_t tilesN = (args.n + kTileN - 1) / kTileN;
  const int64_t tilesM = (args.m + kTileM - 1) / kTileM;
  if (tilesN > 0x7fffffff) return cudaErrorInvalidValue;
  // Rows of tiles and batch entries beyond the grid's limits are walked by the blocks' loops.
  const dim3 grid(static_cast<unsigned>(tilesN),
                  static_cast<unsigned>(tilesM < kGridLimit ? tilesM : kGridLimit),
                  static_cast<unsigned>(args.batch < kGridLimit ? args.batch : kGridLimit));
  nativeGemmKernel<TIn, TOut><<<grid, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template <typename T, int kVec>
cudaError_t launchEpilogueTyped(void* y, int64_t rows, int64_t columns, const GemmEpilogue& e,
                                cudaStream_t stream) {
  const int block = e.blockThreads;
  if (block < 32 || block > 1024 || block % 32 != 0) return cudaErrorInvalidValue;
  const int64_t packs = rows * columns / kVec;
  const int64_t blocks = (packs + block - 1) / block;
  const unsigned grid = static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
  gemmEpilogueKernel<T, kVec><<<grid, block, 0, stream>>>(static_cast<T*>(y), rows, columns, e);
  return cudaGetLastError();
}

// 16-byte packs where the rows and the address allow them, else one element at a time.
template <typename T>
cudaError_t launchEpilogueVectorised(void* y, int64_t rows, int64_t columns, const GemmEpilogue& e,
                                     cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  if (columns % kVec == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0) {
    return launchEpilogueTyped<T, kVec>(y, rows, columns, e, stream);
  }
  return launchEpilogueTyped<T, 1>(y, rows, columns, e, stream);
}

}  // namespace

cudaError_t launchNativeGemm(const NativeGemmArgs& args, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0 || args.batch <= 0) return cudaSuccess;  // nothing to store
  const bool floatOut = args.outputType == kGemmFloat32;
  switch (args.inputType) {
    case kGemmFloat32:
      if (!floatOut) return cudaErrorInvalidValue;
      return launchNativeTyped<float, float>(args, stream);
    case kGemmFloat16:
      if (floatOut) return launchNativeTyped<__half, float>(args, stream);
      if (args.outputType != kGemmFloat16) return cudaErrorInvalidValue;
      return launchNativeTyped<__half, __half>(args, stream);
    case kGemmBFloat16:
      if (floatOut) return launchNativeTyped<__nv_bfloat16, float>(args, stream);
      if (args.outputType != kGemmBFloat16) return cudaErrorInvalidValue;
      return launchNativeTyped<__nv_bfloat16, __nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launchGemmEpilogue(void* y, GemmType type, int64_t rows, int64_t columns,
                               const GemmEpilogue& epilogue, cudaStream_t stream) {
  if (rows <= 0 || columns <= 0) return cudaSuccess;
  switch (type) {
    case kGemmFloat32:
      return launchEpilogueVectorised<float>(y, rows, columns, epilogue, stream);
    case kGemmFloat16:
      return launchEpilogueVectorised<__half>(y, rows, columns, epilogue, stream);
    case kGemmBFloat16:
      return launchEpilogueVectorised<__nv_bfloat16>(y, rows, columns, epilogue, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda
