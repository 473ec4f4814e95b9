// kiln's pooling kernels (pool.h): windowed max (and its indices) and average pooling, one
// thread per output element, and the global pools (a block per plane for contiguous planes, a
// thread per plane for channels-last). Float accumulation (float16 and bfloat16 elements are
// loaded into float and the result rounded once), int64 indices; windowed max also takes int8 and
// uint8.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/pool.h"

namespace kiln::cuda {
namespace {

// The most threads a pooling block has (cuda.pool.block's largest choice).
constexpr int kMaxPoolThreads = 512;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

int64_t blocksFor(int64_t count, int threads) {
  return std::min<int64_t>((count + threads - 1) / threads, kMaxBlocks);
}

// A power of two from 32 to kMaxPoolThreads (the block-per-plane kernel halves its partial sums).
bool validBlock(int threads) {
  return threads >= 32 && threads <= kMaxPoolThreads && (threads & (threads - 1)) == 0;
}

using device::load;
using device::store;
using device::Tag;

// 8-bit integers (MaxPool only): exact in float, and the maximum is one of the inputs.
__device__ __forceinline__ float load(int8_t value) { return static_cast<float>(value); }
__device__ __forceinline__ float load(uint8_t value) { return static_cast<float>(value); }
// A window wholly in padding has no maximum (-inf): the type's lowest value.
__device__ __forceinline__ void store(int8_t* at, float value) {
  *at = static_cast<int8_t>(fmaxf(value, -128.0f));
}
__device__ __forceinline__ void store(uint8_t* at, float value) {
  *at = static_cast<uint8_t>(fmaxf(value, 0.0f));
}

// Kernel positions k of one axis whose coordinate lands in [-padBegin, in + padEnd): the window's
// extent in the padded input (ceil_mode windows may reach past it).
__device__ __forceinline__ int64_t paddedTaps(int64_t start, int64_t kernel, int64_t dilation,
                                              int64_t padBegin, int64_t in, int64_t padEnd) {
  int64_t inside = 0;
  for (int64_t k = 0; k < kernel; ++k) {
    const int64_t coord = start + k * dilation;
    if (coord >= -padBegin && coord < in + padEnd) ++inside;
  }
  return inside;
}

template <typename T>
__global__ void windowPoolKernel(PoolGeometry g, PoolKind kind, const T* __restrict__ x,
                                 T* __restrict__ y, int64_t* __restrict__ indices, bool columnMajor,
                                 int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    int64_t n, c, o[3];
    if (g.channelsLast) {
      c = rest % g.channels;
      rest /= g.channels;
      o[2] = rest % g.out[2];
      rest /= g.out[2];
      o[1] = rest % g.out[1];
      rest /= g.out[1];
      o[0] = rest % g.out[0];
      n = rest / g.out[0];
    } else {
      o[2] = rest % g.out[2];
      rest /= g.out[2];
      o[1] = rest % g.out[1];
      rest /= g.out[1];
      o[0] = rest % g.out[0];
      rest /= g.out[0];
      c = rest % g.channels;
      n = rest / g.channels;
    }
    int64_t start[3];
    for (int axis = 0; axis < 3; ++axis) start[axis] = o[axis] * g.stride[axis] - g.padBegin[axis];
    const T* plane = x + n * g.xStrides[0] + c * g.xStrides[1];
    float best = -INFINITY;
    bool found = false;
    int64_t bestIndex = -1;  // the spatial offset MaxPool's Indices report
    float sum = 0.0f;
    int64_t taps = 0;
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      const int64_t id = start[0] + kd * g.dilation[0];
      if (id < 0 || id >= g.in[0]) continue;
      for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
        const int64_t ih = start[1] + kh * g.dilation[1];
        if (ih < 0 || ih >= g.in[1]) continue;
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
          const int64_t iw = start[2] + kw * g.dilation[2];
          if (iw < 0 || iw >= g.in[2]) continue;
          const float v = load(plane[id * g.xStrides[2] + ih * g.xStrides[3] + iw * g.xStrides[4]]);
          // As the reference: the first tap, then any larger one; NaN loses to any number.
          if (!found || v > best || (isnan(best) && !isnan(v))) {
            best = v;
            bestIndex = columnMajor ? (iw * g.in[1] + ih) * g.in[0] + id
                                    : (id * g.in[1] + ih) * g.in[2] + iw;
          }
          found = true;
          sum += v;
          ++taps;
        }
      }
    }
    float result = best;
    if (kind != PoolKind::kMax) {
      int64_t divisor = taps;
      if (kind == PoolKind::kAverageIncludePad) {
        divisor = 1;
        for (int axis = 0; axis < 3; ++axis) {
          divisor *= paddedTaps(start[axis], g.kernel[axis], g.dilation[axis], g.padBegin[axis],
                                g.in[axis], g.padEnd[axis]);
        }
      }
      result =
          sum / static_cast<float>(divisor);  // 0 / 0 = NaN for an empty window, as the reference
    }
    const int64_t at = n * g.yStrides[0] + c * g.yStrides[1] + o[0] * g.yStrides[2] +
                       o[1] * g.yStrides[3] + o[2] * g.yStrides[4];
    store(y + at, result);
    if (indices) {
      const int64_t planeSize = g.in[0] * g.in[1] * g.in[2];
      indices[at] = bestIndex < 0 ? -1 : (n * g.channels + c) * planeSize + bestIndex;
    }
  }
}

// An NHWC 2-D pool, a thread per V channels of one output pixel (V * sizeof(T) = 16 bytes):
// windowPoolKernel's arithmetic lane by lane (the same taps in the same order, the same first-tap
// and NaN rules), with one 16-byte load a tap and 32-bit index arithmetic. The generic kernel's
// int64 divisions and its scalar loads made ResNet-50's stem pool (b32, fp16) take 0.25 ms.
template <typename T>
__global__ void nhwcWindowPoolVectorKernel(PoolGeometry g, PoolKind kind, const T* __restrict__ x,
                                           T* __restrict__ y, int vectors, int total) {
  constexpr int V = 16 / sizeof(T);
  const int outH = static_cast<int>(g.out[1]), outW = static_cast<int>(g.out[2]);
  const int inH = static_cast<int>(g.in[1]), inW = static_cast<int>(g.in[2]);
  const int kernelH = static_cast<int>(g.kernel[1]), kernelW = static_cast<int>(g.kernel[2]);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int rest = i;
    const int v = rest % vectors;
    rest /= vectors;
    const int ow = rest % outW;
    rest /= outW;
    const int oh = rest % outH;
    const int n = rest / outH;
    const int startH = oh * static_cast<int>(g.stride[1]) - static_cast<int>(g.padBegin[1]);
    const int startW = ow * static_cast<int>(g.stride[2]) - static_cast<int>(g.padBegin[2]);
    const T* base = x + n * g.xStrides[0] + v * V;
    float best[V], sum[V];
    for (int lane = 0; lane < V; ++lane) {
      best[lane] = -INFINITY;
      sum[lane] = 0.0f;
    }
    bool found = false;
    int taps = 0;
    for (int kh = 0; kh < kernelH; ++kh) {
      const int ih = startH + kh * static_cast<int>(g.dilation[1]);
      if (ih < 0 || ih >= inH) continue;
      for (int kw = 0; kw < kernelW; ++kw) {
        const int iw = startW + kw * static_cast<int>(g.dilation[2]);
        if (iw < 0 || iw >= inW) continue;
        const uint4 raw =
            *reinterpret_cast<const uint4*>(base + ih * g.xStrides[3] + iw * g.xStrides[4]);
        const T* elements = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int lane = 0; lane < V; ++lane) {
          const float value = load(elements[lane]);
          if (!found || value > best[lane] || (isnan(best[lane]) && !isnan(value))) {
            best[lane] = value;
          }
          sum[lane] += value;
        }
        found = true;
        ++taps;
      }
    }
    int64_t divisor = taps;
    if (kind == PoolKind::kAverageIncludePad) {
      divisor =
          paddedTaps(startH, g.kernel[1], g.dilation[1], g.padBegin[1], g.in[1], g.padEnd[1]) *
          paddedTaps(startW, g.kernel[2], g.dilation[2], g.padBegin[2], g.in[2], g.padEnd[2]);
    }
    alignas(16) T out[V];
#pragma unroll
    for (int lane = 0; lane < V; ++lane) {
      store(out + lane,
            kind == PoolKind::kMax ? best[lane] : sum[lane] / static_cast<float>(divisor));
    }
    *reinterpret_cast<uint4*>(y + n * g.yStrides[0] + oh * g.yStrides[3] + ow * g.yStrides[4] +
                              v * V) = *reinterpret_cast<const uint4*>(out);
  }
}

// One block per plane of `size` contiguous elements.
template <typename T>
__global__ void __launch_bounds__(kMaxPoolThreads)
    globalPoolBlockKernel(bool average, const T* __restrict__ x, T* __restrict__ y, int64_t planes,
                          int64_t size) {
  __shared__ float partial[kMaxPoolThreads];
  for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
    const T* in = x + plane * size;
    float accumulated = average ? 0.0f : -INFINITY;
    for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
      const float v = load(in[i]);
      if (average) {
        accumulated += v;
      } else if (v > accumulated) {  // NaN never wins
        accumulated = v;
      }
    }
    partial[threadIdx.x] = accumulated;
    __syncthreads();
    for (int half = static_cast<int>(blockDim.x) / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) {
        const float other = partial[threadIdx.x + half];
        if (average) {
          partial[threadIdx.x] += other;
        } else if (other > partial[threadIdx.x]) {
          partial[threadIdx.x] = other;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      store(y + plane, average ? partial[0] / static_cast<float>(size) : partial[0]);
    }
    __syncthreads();  // partial is reused by the next plane
  }
}

// One thread per (n, c) of a channels-last tensor [N, size, C].
template <typename T>
__global__ void globalPoolChannelsLastKernel(bool average, const T* __restrict__ x,
                                             T* __restrict__ y, int64_t batch, int64_t channels,
                                             int64_t size) {
  const int64_t total = batch * channels;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / channels;
    const int64_t c = i % channels;
    const T* in = x + n * size * channels + c;
    float accumulated = average ? 0.0f : -INFINITY;
    for (int64_t s = 0; s < size; ++s) {
      const float v = load(in[s * channels]);
      if (average) {
        accumulated += v;
      } else if (v > accumulated) {
        accumulated = v;
      }
    }
    store(y + i, average ? accumulated / static_cast<float>(size) : accumulated);
  }
}

}  // namespace

bool poolSupported(ElementType type) {
  return type == ElementType::kFloat32 || type == ElementType::kFloat16 ||
         type == ElementType::kBFloat16;
}

int windowPoolVectorWidth(const PoolGeometry& g, ElementType type, bool indices) {
  int width = 0;
  if (type == ElementType::kFloat32) width = 4;
  if (type == ElementType::kFloat16 || type == ElementType::kBFloat16) width = 8;
  if (width == 0 || indices || !g.channelsLast || g.in[0] != 1 || g.out[0] != 1 ||
      g.kernel[0] != 1 || g.xStrides[1] != 1 || g.yStrides[1] != 1 || g.channels % width != 0) {
    return 0;
  }
  for (int axis : {0, 3, 4}) {
    if (g.xStrides[axis] % width != 0 || g.yStrides[axis] % width != 0) return 0;
  }
  // Thread indices and the per-image offsets of taps stay within int.
  const int64_t limit = int64_t{1} << 30;
  const int64_t threads = g.batch * g.out[1] * g.out[2] * (g.channels / width);
  if (threads >= limit || g.xStrides[0] >= limit || g.yStrides[0] >= limit) return 0;
  for (int axis = 1; axis < 3; ++axis) {
    if (g.in[axis] >= limit ||
        g.out[axis] * g.stride[axis] + g.kernel[axis] * g.dilation[axis] + g.padBegin[axis] >=
            limit) {
      return 0;
    }
  }
  return width;
}

cudaError_t launchWindowPool(const PoolGeometry& geometry, PoolKind kind, ElementType type,
                             const void* x, void* y, int64_t* indices, bool columnMajor,
                             int blockThreads, cudaStream_t stream, int vectorWidth) {
  const int64_t total =
      geometry.batch * geometry.channels * geometry.out[0] * geometry.out[1] * geometry.out[2];
  if (total <= 0) return cudaSuccess;
  if (indices && kind != PoolKind::kMax) return cudaErrorInvalidValue;
  if (!validBlock(blockThreads)) return cudaErrorInvalidValue;
  if (vectorWidth != 0 &&
      vectorWidth != windowPoolVectorWidth(geometry, type, indices != nullptr)) {
    return cudaErrorInvalidValue;
  }
  // Tensors start 256-byte aligned in kiln's arena; a view that does not takes the scalar kernel.
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0) {
    vectorWidth = 0;
  }
  if (vectorWidth != 0) {
    const int vectors = static_cast<int>(geometry.channels / vectorWidth);
    const int threads = static_cast<int>(total / vectorWidth);
    return device::byFloatType(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      nhwcWindowPoolVectorKernel<T>
          <<<static_cast<unsigned>(blocksFor(threads, blockThreads)), blockThreads, 0, stream>>>(
              geometry, kind, static_cast<const T*>(x), static_cast<T*>(y), vectors, threads);
      return cudaGetLastError();
    });
  }
  auto launch = [&](auto tag) {
    using T = typename decltype(tag)::type;
    windowPoolKernel<T>
        <<<static_cast<unsigned>(blocksFor(total, blockThreads)), blockThreads, 0, stream>>>(
            geometry, kind, static_cast<const T*>(x), static_cast<T*>(y), indices, columnMajor,
            total);
    return cudaGetLastError();
  };
  if (type == ElementType::kInt8 || type == ElementType::kUInt8) {
    if (kind != PoolKind::kMax) return cudaErrorInvalidValue;
    return type == ElementType::kInt8 ? launch(Tag<int8_t>{}) : launch(Tag<uint8_t>{});
  }
  return device::byFloatType(type, launch);
}

cudaError_t launchGlobalPool(bool average, ElementType type, const void* x, void* y, int64_t batch,
                             int64_t channels, int64_t size, bool channelsLast, int blockThreads,
                             cudaStream_t stream) {
  const int64_t planes = batch * channels;
  if (planes <= 0) return cudaSuccess;
  if (!validBlock(blockThreads)) return cudaErrorInvalidValue;
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x);
    T* out = static_cast<T*>(y);
    if (channelsLast) {
      globalPoolChannelsLastKernel<T>
          <<<static_cast<unsigned>(blocksFor(planes, blockThreads)), blockThreads, 0, stream>>>(
              average, in, out, batch, channels, size);
    } else {
      const int64_t blocks = std::min<int64_t>(planes, kMaxBlocks);
      globalPoolBlockKernel<T><<<static_cast<unsigned>(blocks), blockThreads, 0, stream>>>(
          average, in, out, planes, size);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
