// kiln's depthwise NHWC convolution with the window in registers (conv.h,
// launchDepthwiseWindow): a thread computes P neighbouring output pixels of a row for a run of V
// channels. For each kernel row it loads the weights of the row's K taps once, then walks the
// (P - 1) * S + K input pixels the P outputs read, loading each once and adding it into every
// output that reads it, so a row costs (P - 1) * S + 2K vector loads instead of the 2PK of the
// direct kernel (conv.cu), which reads every tap of every output from memory. Each output's sum
// takes its taps in the same (kh, kw) order as the direct kernel, skipping the same padded ones,
// so the two give the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/kernels/conv.h"
#include "kiln/backends/cuda/kernels/conv_device.cuh"
#include "kiln/backends/cuda/kernels/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

using device::activate;
using device::load;
using device::store;
using device::Vec;

// T the element, V the channels a thread takes, P its output pixels along the row, K the kernel's
// width and S the stride along the row (dilation 1 along it; any height, stride and dilation
// down the columns).
template <typename T, int V, int P, int K, int S>
__device__ __forceinline__ void depthwiseWindow(const ConvGeometry& g, const T* __restrict__ x,
                                                const T* __restrict__ w, const T* __restrict__ bias,
                                                const T* __restrict__ residual, T* __restrict__ y,
                                                const ConvEpilogue& epilogue, int total) {
  constexpr int kSpan = (P - 1) * S + K;  // input pixels the P outputs of a row read
  const int channels = static_cast<int>(g.channels);
  const int inH = static_cast<int>(g.in[1]), inW = static_cast<int>(g.in[2]);
  const int outH = static_cast<int>(g.out[1]), outW = static_cast<int>(g.out[2]);
  const int kernelH = static_cast<int>(g.kernel[1]);
  const int strideH = static_cast<int>(g.stride[1]);
  const int dilationH = static_cast<int>(g.dilation[1]);
  const int padH = static_cast<int>(g.padBegin[1]), padW = static_cast<int>(g.padBegin[2]);
  const int runs = channels / V;
  const int tiles = (outW + P - 1) / P;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int run = i % runs;
    int rest = i / runs;
    const int ow0 = rest % tiles * P;
    rest /= tiles;
    const int oh = rest % outH;
    const int n = rest / outH;
    const int c = run * V;
    const int iw0 = ow0 * S - padW;  // the first input pixel the tile reads
    float sum[P][V];
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int v = 0; v < V; ++v) sum[p][v] = 0.0f;
    }
    const T* xImage = x + static_cast<int64_t>(n) * inH * inW * channels + c;
    for (int kh = 0; kh < kernelH; ++kh) {
      const int ih = oh * strideH - padH + kh * dilationH;
      if (ih < 0 || ih >= inH) continue;
      float wr[K][V];
#pragma unroll
      for (int kw = 0; kw < K; ++kw) {
        const Vec<T, V> wv = *reinterpret_cast<const Vec<T, V>*>(w + (kh * K + kw) * channels + c);
#pragma unroll
        for (int v = 0; v < V; ++v) wr[kw][v] = load(wv.v[v]);
      }
      const T* xRow = xImage + ih * inW * channels;
#pragma unroll
      for (int j = 0; j < kSpan; ++j) {
        // Input pixel iw0 + j is tap kw of output p where j = p * S + kw; for each p the taps
        // arrive in kw order. A pixel in the padding adds nothing, as the direct kernel skips it.
        const int iw = iw0 + j;
        if (iw < 0 || iw >= inW) continue;
        const Vec<T, V> xv = *reinterpret_cast<const Vec<T, V>*>(xRow + iw * channels);
        float xf[V];
#pragma unroll
        for (int v = 0; v < V; ++v) xf[v] = load(xv.v[v]);
#pragma unroll
        for (int kw = 0; kw < K; ++kw) {
          if ((j - kw) % S != 0) continue;
          const int p = (j - kw) / S;
          if (p < 0 || p >= P) continue;
#pragma unroll
          for (int v = 0; v < V; ++v) sum[p][v] += xf[v] * wr[kw][v];
        }
      }
    }
    device::storeDepthwiseOutputs<T, V, P>(sum, ((n * outH + oh) * outW + ow0) * channels + c,
                                           outW - ow0, channels, bias ? bias + c : nullptr,
                                           residual, y, epilogue);
  }
}

template <typename T, int V, int P, int K, int S>
__global__ void depthwiseWindowKernel(ConvGeometry g, const T* __restrict__ x,
                                      const T* __restrict__ w, const T* __restrict__ bias,
                                      const T* __restrict__ residual, T* __restrict__ y,
                                      ConvEpilogue epilogue, int total) {
  depthwiseWindow<T, V, P, K, S>(g, x, w, bias, residual, y, epilogue, total);
}

// The same, compiled for 9 resident blocks of 128 threads an SM: at most 56 registers a thread
// (65536 / 1152), where the plain instance may take more (64 for float16, 2 channels, 8 pixels, 7
// taps, stride 1, which leaves 1024 threads an SM). Used only where ptxas needed no local memory
// for it (launchDepthwiseWindow checks), so the arithmetic and its order are the plain one's.
constexpr int kCappedThreads = 128;
constexpr int kCappedBlocks = 9;
constexpr int kCappedRegisters = 56;
static_assert(65536 / (kCappedThreads * kCappedBlocks) >= kCappedRegisters, "56 registers fit");

template <typename T, int V, int P, int K, int S>
__global__ void __launch_bounds__(kCappedThreads, kCappedBlocks)
    depthwiseWindowCappedKernel(ConvGeometry g, const T* __restrict__ x, const T* __restrict__ w,
                                const T* __restrict__ bias, const T* __restrict__ residual,
                                T* __restrict__ y, ConvEpilogue epilogue, int total) {
  depthwiseWindow<T, V, P, K, S>(g, x, w, bias, residual, y, epilogue, total);
}

template <int N>
using Int = std::integral_constant<int, N>;

// Calls fn(Int<v>{}) for the run width `elements` of T (16 bytes at most).
template <typename T, typename Fn>
cudaError_t byRunWidth(int elements, Fn&& fn) {
  switch (elements) {
    case 1:
      return fn(Int<1>{});
    case 2:
      return fn(Int<2>{});
    case 4:
      return fn(Int<4>{});
    case 8:
      if constexpr (sizeof(T) <= 2) return fn(Int<8>{});
      break;
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace

bool depthwiseWindowFits(const ConvGeometry& g) {
  if (!depthwiseNhwcFits(g)) return false;
  const int64_t k = g.kernel[2];
  return (k == 3 || k == 5 || k == 7) && (g.stride[2] == 1 || g.stride[2] == 2) &&
         g.dilation[2] == 1;
}

int depthwiseWindowPixels(const ConvGeometry& g, ElementType type, const DepthwiseTiling& tiling) {
  if (tiling.windowPixels != 0) return tiling.windowPixels;
  // The most pixels a thread (fewer loads a pixel) that keep P * V accumulators within 32 and
  // leave at least 2^17 threads, about half of what an H200's 132 SMs hold at once; 2 when even
  // that leaves fewer.
  const int element = static_cast<int>(elementBytes(type));
  const int run = std::max(1, std::min(tiling.vectorBytes, 16) / element);
  int64_t runs = g.channels;
  for (int v = run; v > 1; v /= 2) {
    if (g.channels % v == 0) {
      runs = g.channels / v;
      break;
    }
  }
  for (int pixels : {8, 4}) {
    const int64_t threads = g.batch * g.out[1] * ((g.out[2] + pixels - 1) / pixels) * runs;
    if (pixels * run <= 32 && threads >= (int64_t{1} << 17)) return pixels;
  }
  return 2;
}

cudaError_t launchDepthwiseWindow(const ConvGeometry& g, ElementType type, int runElements,
                                  int pixels, int blockThreads, bool capRegisters, const void* x,
                                  const void* w, const void* bias, const void* residual, void* y,
                                  ConvEpilogue epilogue, cudaStream_t stream, bool queryOnly) {
  if (!depthwiseWindowFits(g) || g.channels % runElements != 0) return cudaErrorInvalidValue;
  if (blockThreads != 0 && (blockThreads < 32 || blockThreads > 1024)) {
    return cudaErrorInvalidValue;
  }
  if (g.batch * g.out[1] * g.out[2] == 0 || g.channels == 0) return cudaSuccess;
  return device::byFloatType(type, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return byRunWidth<T>(runElements, [&](auto width) -> cudaError_t {
      constexpr int V = decltype(width)::value;
      auto launch = [&](auto tile, auto taps, auto step) -> cudaError_t {
        constexpr int P = decltype(tile)::value;
        constexpr int K = decltype(taps)::value;
        constexpr int S = decltype(step)::value;
        const int64_t tiles = (g.out[2] + P - 1) / P;
        const int total = static_cast<int>(g.batch * g.out[1] * tiles * (g.channels / V));
        auto run = [&](auto kernel, int threads) -> cudaError_t {
          if (queryOnly) return cudaSuccess;
          const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, kMaxBlocks);
          kernel<<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)),
                   static_cast<unsigned>(threads), 0, stream>>>(
              g, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
              static_cast<const T*>(residual), static_cast<T*>(y), epilogue, total);
          return cudaGetLastError();
        };
        // The capped instances exist for float16 and bfloat16 only (the reduced-precision
        // routes that speed is measured on), which keeps this file's build time in bounds.
        if constexpr (sizeof(T) == 2) {
          if (capRegisters && device::spillsNothing<depthwiseWindowCappedKernel<T, V, P, K, S>>()) {
            return run(depthwiseWindowCappedKernel<T, V, P, K, S>, kCappedThreads);
          }
        }
        return run(
            depthwiseWindowKernel<T, V, P, K, S>,
            device::depthwiseBlockThreads<depthwiseWindowKernel<T, V, P, K, S>>(blockThreads));
      };
      auto byStride = [&](auto tile, auto taps) -> cudaError_t {
        return g.stride[2] == 2 ? launch(tile, taps, Int<2>{}) : launch(tile, taps, Int<1>{});
      };
      auto byTaps = [&](auto tile) -> cudaError_t {
        switch (g.kernel[2]) {
          case 3:
            return byStride(tile, Int<3>{});
          case 5:
            return byStride(tile, Int<5>{});
          default:
            return byStride(tile, Int<7>{});
        }
      };
      switch (pixels) {
        case 2:
          return byTaps(Int<2>{});
        case 4:
          return byTaps(Int<4>{});
        case 8:
          return byTaps(Int<8>{});
        default:
          return cudaErrorInvalidValue;
      }
    });
  });
}

}  // namespace kiln::cuda
