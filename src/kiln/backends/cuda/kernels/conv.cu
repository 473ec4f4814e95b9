// kiln's own convolution kernels (conv.h): the direct convolution with its fused epilogue, the
// direct transposed convolution, the epilogue alone, and the NhwcConv weight reorder. Simple and
// obviously correct first: one thread per output element, float accumulation (float16 and bfloat16
// elements are loaded into float and rounded once when stored), every index in int64.
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

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

int64_t blocksFor(int64_t count, int threads = kThreads) {
  return std::min<int64_t>((count + threads - 1) / threads, kMaxBlocks);
}

bool validBlock(int threads) { return threads >= 32 && threads <= 1024 && threads % 32 == 0; }

using device::activate;
using device::load;
using device::store;
using device::Tag;
using device::Vec;

template <typename T>
__global__ void directConvKernel(ConvGeometry g, const T* __restrict__ x, const T* __restrict__ w,
                                 const T* __restrict__ bias, const T* __restrict__ residual,
                                 T* __restrict__ y, ConvEpilogue epilogue, int64_t total) {
  const int64_t groupChannels = g.channels / g.group;
  const int64_t groupOutChannels = g.outChannels / g.group;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    int64_t n, m, o[3];
    if (g.channelsLast) {
      m = rest % g.outChannels;
      rest /= g.outChannels;
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
      m = rest % g.outChannels;
      n = rest / g.outChannels;
    }
    const int64_t firstChannel = m / groupOutChannels * groupChannels;
    const T* xImage = x + n * g.xStrides[0] + firstChannel * g.xStrides[1];
    const T* wFilter = w + m * g.wStrides[0];
    float sum = 0.0f;
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      const int64_t id = o[0] * g.stride[0] - g.padBegin[0] + kd * g.dilation[0];
      if (id < 0 || id >= g.in[0]) continue;
      for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
        const int64_t ih = o[1] * g.stride[1] - g.padBegin[1] + kh * g.dilation[1];
        if (ih < 0 || ih >= g.in[1]) continue;
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
          const int64_t iw = o[2] * g.stride[2] - g.padBegin[2] + kw * g.dilation[2];
          if (iw < 0 || iw >= g.in[2]) continue;
          const T* xTap = xImage + id * g.xStrides[2] + ih * g.xStrides[3] + iw * g.xStrides[4];
          const T* wTap = wFilter + kd * g.wStrides[2] + kh * g.wStrides[3] + kw * g.wStrides[4];
          for (int64_t c = 0; c < groupChannels; ++c) {
            sum += load(xTap[c * g.xStrides[1]]) * load(wTap[c * g.wStrides[1]]);
          }
        }
      }
    }
    if (bias) sum += load(bias[m]);
    const int64_t at = n * g.yStrides[0] + m * g.yStrides[1] + o[0] * g.yStrides[2] +
                       o[1] * g.yStrides[3] + o[2] * g.yStrides[4];
    if (residual) sum += load(residual[at]);
    store(y + at, activate(sum, epilogue));
  }
}

// ConvTranspose gathered: each output element sums what the op scatters into it, so every
// element is written once, by one thread, without atomics. Along an axis, output coordinate o
// receives input coordinate i through kernel offset k where o = i * stride - padBegin +
// k * dilation, that is i = (o + padBegin - k * dilation) / stride when that divides exactly.
template <typename T>
__global__ void convTransposeKernel(ConvGeometry g, const T* __restrict__ x,
                                    const T* __restrict__ w, const T* __restrict__ bias,
                                    T* __restrict__ y, int64_t total) {
  const int64_t groupChannels = g.channels / g.group;        // x's channels per group
  const int64_t groupOutChannels = g.outChannels / g.group;  // y's channels per group
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    int64_t o[3];
    o[2] = rest % g.out[2];
    rest /= g.out[2];
    o[1] = rest % g.out[1];
    rest /= g.out[1];
    o[0] = rest % g.out[0];
    rest /= g.out[0];
    const int64_t m = rest % g.outChannels;
    const int64_t n = rest / g.outChannels;
    const int64_t firstChannel = m / groupOutChannels * groupChannels;
    const T* xImage = x + n * g.xStrides[0] + firstChannel * g.xStrides[1];
    const T* wFilter = w + firstChannel * g.wStrides[0] + (m % groupOutChannels) * g.wStrides[1];
    float sum = 0.0f;
    // The numerator falls as k grows: once negative, no later offset reaches the input.
    for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
      const int64_t td = o[0] + g.padBegin[0] - kd * g.dilation[0];
      if (td < 0) break;
      if (td % g.stride[0] != 0 || td / g.stride[0] >= g.in[0]) continue;
      const int64_t id = td / g.stride[0];
      for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
        const int64_t th = o[1] + g.padBegin[1] - kh * g.dilation[1];
        if (th < 0) break;
        if (th % g.stride[1] != 0 || th / g.stride[1] >= g.in[1]) continue;
        const int64_t ih = th / g.stride[1];
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw) {
          const int64_t tw = o[2] + g.padBegin[2] - kw * g.dilation[2];
          if (tw < 0) break;
          if (tw % g.stride[2] != 0 || tw / g.stride[2] >= g.in[2]) continue;
          const int64_t iw = tw / g.stride[2];
          const T* xTap = xImage + id * g.xStrides[2] + ih * g.xStrides[3] + iw * g.xStrides[4];
          const T* wTap = wFilter + kd * g.wStrides[2] + kh * g.wStrides[3] + kw * g.wStrides[4];
          for (int64_t c = 0; c < groupChannels; ++c) {
            sum += load(xTap[c * g.xStrides[1]]) * load(wTap[c * g.wStrides[0]]);
          }
        }
      }
    }
    if (bias) sum += load(bias[m]);
    store(y + n * g.yStrides[0] + m * g.yStrides[1] + o[0] * g.yStrides[2] + o[1] * g.yStrides[3] +
              o[2] * g.yStrides[4],
          sum);
  }
}

// Depthwise NHWC: one thread per output pixel and run of V channels, loaded and stored as one
// 4-, 8- or 16-byte vector (neighbouring threads take neighbouring runs, so every warp reads and
// writes contiguous memory); 32-bit indices (the launcher checks every extent fits).
template <typename T, int V, int P>
__global__ void depthwiseNhwcKernel(ConvGeometry g, const T* __restrict__ x,
                                    const T* __restrict__ w, const T* __restrict__ bias,
                                    const T* __restrict__ residual, T* __restrict__ y,
                                    ConvEpilogue epilogue, int total) {
  // 32-bit copies of the extents (depthwiseNhwcFits checked they fit).
  const int channels = static_cast<int>(g.channels);
  const int inH = static_cast<int>(g.in[1]), inW = static_cast<int>(g.in[2]);
  const int outH = static_cast<int>(g.out[1]), outW = static_cast<int>(g.out[2]);
  const int kernelH = static_cast<int>(g.kernel[1]), kernelW = static_cast<int>(g.kernel[2]);
  const int strideH = static_cast<int>(g.stride[1]), strideW = static_cast<int>(g.stride[2]);
  const int dilationH = static_cast<int>(g.dilation[1]);
  const int dilationW = static_cast<int>(g.dilation[2]);
  const int padH = static_cast<int>(g.padBegin[1]), padW = static_cast<int>(g.padBegin[2]);
  const int runs = channels / V;
  const int tiles = (outW + P - 1) / P;  // groups of P pixels along a row
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int run = i % runs;
    int rest = i / runs;
    const int ow0 = rest % tiles * P;
    rest /= tiles;
    const int oh = rest % outH;
    const int n = rest / outH;
    const int c = run * V;
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
      for (int kw = 0; kw < kernelW; ++kw) {
        const Vec<T, V> wv =
            *reinterpret_cast<const Vec<T, V>*>(w + (kh * kernelW + kw) * channels + c);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int iw = (ow0 + p) * strideW - padW + kw * dilationW;
          if (ow0 + p >= outW || iw < 0 || iw >= inW) continue;
          const Vec<T, V> xv =
              *reinterpret_cast<const Vec<T, V>*>(xImage + (ih * inW + iw) * channels);
#pragma unroll
          for (int v = 0; v < V; ++v) sum[p][v] += load(xv.v[v]) * load(wv.v[v]);
        }
      }
    }
    device::storeDepthwiseOutputs<T, V, P>(sum, ((n * outH + oh) * outW + ow0) * channels + c,
                                           outW - ow0, channels, bias ? bias + c : nullptr,
                                           residual, y, epilogue);
  }
}

template <typename T>
__global__ void convEpilogueKernel(T* __restrict__ y, const T* __restrict__ bias,
                                   const T* __restrict__ residual, int64_t count, int64_t channels,
                                   int64_t inner, ConvEpilogue epilogue) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float value = load(y[i]);
    if (bias) value += load(bias[i / inner % channels]);
    if (residual) value += load(residual[i]);
    store(y + i, activate(value, epilogue));
  }
}

template <typename T>
__global__ void hwioToOhwiKernel(const T* __restrict__ hwio, T* __restrict__ ohwi, int64_t kernelH,
                                 int64_t kernelW, int64_t groupChannels, int64_t outChannels) {
  const int64_t count = kernelH * kernelW * groupChannels * outChannels;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // i walks the output [M, kH, kW, C/group]; (kh, kw, c) together are one index `tap`.
    const int64_t taps = kernelH * kernelW * groupChannels;
    const int64_t m = i / taps;
    const int64_t tap = i % taps;
    ohwi[i] = hwio[tap * outChannels + m];
  }
}

}  // namespace

bool depthwiseNhwcFits(const ConvGeometry& g) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (!g.channelsLast || g.group != g.channels || g.outChannels != g.channels) return false;
  if (g.in[0] != 1 || g.out[0] != 1 || g.kernel[0] != 1) return false;  // 2-D only
  const int64_t extents[] = {g.batch,     g.channels,  g.in[1],       g.in[2],
                             g.out[1],    g.out[2],    g.kernel[1],   g.kernel[2],
                             g.stride[1], g.stride[2], g.dilation[1], g.dilation[2]};
  for (int64_t e : extents) {
    if (e < 0 || e >= kLimit) return false;
  }
  if (g.stride[1] < 1 || g.stride[2] < 1 || g.dilation[1] < 1 || g.dilation[2] < 1) return false;
  if (g.padBegin[1] < 0 || g.padBegin[2] < 0 || g.padBegin[1] >= kLimit ||
      g.padBegin[2] >= kLimit) {
    return false;
  }
  // Every element index of x, y and w in 32 bits (x's image base is computed in 64), with room
  // for the grid-stride step past the last output.
  return g.batch * g.out[1] * g.out[2] * g.channels < kLimit / 2 &&
         g.in[1] * g.in[2] * g.channels < kLimit &&
         g.kernel[1] * g.kernel[2] * g.channels < kLimit &&
         g.out[1] * g.stride[1] + g.kernel[1] * g.dilation[1] < kLimit &&
         g.out[2] * g.stride[2] + g.kernel[2] * g.dilation[2] < kLimit;
}

bool convSupported(ElementType type) {
  return type == ElementType::kFloat32 || type == ElementType::kFloat16 ||
         type == ElementType::kBFloat16;
}

cudaError_t launchDirectConv(const ConvGeometry& geometry, ElementType type, const void* x,
                             const void* w, const void* bias, const void* residual, void* y,
                             ConvEpilogue epilogue, int blockThreads, cudaStream_t stream) {
  const int64_t total =
      geometry.batch * geometry.outChannels * geometry.out[0] * geometry.out[1] * geometry.out[2];
  if (total <= 0) return cudaSuccess;
  if (!validBlock(blockThreads)) return cudaErrorInvalidValue;
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    directConvKernel<T>
        <<<static_cast<unsigned>(blocksFor(total, blockThreads)), blockThreads, 0, stream>>>(
            geometry, static_cast<const T*>(x), static_cast<const T*>(w),
            static_cast<const T*>(bias), static_cast<const T*>(residual), static_cast<T*>(y),
            epilogue, total);
    return cudaGetLastError();
  });
}

cudaError_t launchDepthwiseNhwc(const ConvGeometry& g, ElementType type, const void* x,
                                const void* w, const void* bias, const void* residual, void* y,
                                ConvEpilogue epilogue, DepthwiseTiling tiling, cudaStream_t stream,
                                bool queryOnly) {
  if (!depthwiseNhwcFits(g)) return cudaErrorInvalidValue;
  if (tiling.pixels != 1 && tiling.pixels != 2 && tiling.pixels != 4) return cudaErrorInvalidValue;
  if (tiling.blockThreads != 0 && (tiling.blockThreads < 32 || tiling.blockThreads > 1024)) {
    return cudaErrorInvalidValue;
  }
  if (tiling.vectorBytes != 4 && tiling.vectorBytes != 8 && tiling.vectorBytes != 16) {
    return cudaErrorInvalidValue;
  }
  const int64_t pixels = g.batch * g.out[1] * g.out[2];
  if (pixels == 0 || g.channels == 0) return cudaSuccess;
  return device::byFloatType(type, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    // The widest run (16 bytes at most) that divides the channels and every pointer's alignment.
    auto aligned = [&](const void* p, int bytes) {
      return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
    };
    auto launchTiled = [&](auto width, auto tile) -> cudaError_t {
      constexpr int V = decltype(width)::value;
      constexpr int P = decltype(tile)::value;
      const int64_t tiles = (g.out[2] + P - 1) / P;
      const int total = static_cast<int>(g.batch * g.out[1] * tiles * (g.channels / V));
      const int threads =
          device::depthwiseBlockThreads<depthwiseNhwcKernel<T, V, P>>(tiling.blockThreads);
      if (queryOnly) return cudaSuccess;
      const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, kMaxBlocks);
      depthwiseNhwcKernel<T, V, P><<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)),
                                     static_cast<unsigned>(threads), 0, stream>>>(
          g, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
          static_cast<const T*>(residual), static_cast<T*>(y), epilogue, total);
      return cudaGetLastError();
    };
    auto launch = [&](auto width) -> cudaError_t {
      switch (tiling.pixels) {
        case 2:
          return launchTiled(width, std::integral_constant<int, 2>{});
        case 4:
          return launchTiled(width, std::integral_constant<int, 4>{});
        default:
          return launchTiled(width, std::integral_constant<int, 1>{});
      }
    };
    auto fits = [&](int v) {
      const int bytes = v * static_cast<int>(sizeof(T));
      return bytes <= tiling.vectorBytes && g.channels % v == 0 && aligned(x, bytes) &&
             aligned(w, bytes) && aligned(bias, bytes) && aligned(residual, bytes) &&
             aligned(y, bytes);
    };
    constexpr int kWidest = 16 / static_cast<int>(sizeof(T));
    if (tiling.window && depthwiseWindowFits(g)) {
      int run = 1;
      for (int v = kWidest; v > 1; v /= 2) {
        if (fits(v)) {
          run = v;
          break;
        }
      }
      return launchDepthwiseWindow(g, type, run, depthwiseWindowPixels(g, type, tiling),
                                   tiling.blockThreads, tiling.capRegisters, x, w, bias, residual,
                                   y, epilogue, stream, queryOnly);
    }
    if (fits(kWidest)) return launch(std::integral_constant<int, kWidest>{});
    if constexpr (kWidest >= 4) {
      if (fits(kWidest / 2)) return launch(std::integral_constant<int, kWidest / 2>{});
    }
    if (fits(2)) return launch(std::integral_constant<int, 2>{});
    return launch(std::integral_constant<int, 1>{});
  });
}

cudaError_t launchConvTranspose(const ConvGeometry& geometry, ElementType type, const void* x,
                                const void* w, const void* bias, void* y, int blockThreads,
                                cudaStream_t stream) {
  const int64_t total =
      geometry.batch * geometry.outChannels * geometry.out[0] * geometry.out[1] * geometry.out[2];
  if (total <= 0) return cudaSuccess;
  if (!validBlock(blockThreads)) return cudaErrorInvalidValue;
  if (geometry.group <= 0 || geometry.channels % geometry.group != 0 ||
      geometry.outChannels % geometry.group != 0 || geometry.channelsLast) {
    return cudaErrorInvalidValue;
  }
  for (int axis = 0; axis < 3; ++axis) {
    if (geometry.stride[axis] <= 0 || geometry.dilation[axis] <= 0) return cudaErrorInvalidValue;
  }
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    convTransposeKernel<T>
        <<<static_cast<unsigned>(blocksFor(total, blockThreads)), blockThreads, 0, stream>>>(
            geometry, static_cast<const T*>(x), static_cast<const T*>(w),
            static_cast<const T*>(bias), static_cast<T*>(y), total);
    return cudaGetLastError();
  });
}

cudaError_t launchConvEpilogue(ElementType type, void* y, const void* bias, const void* residual,
                               int64_t count, int64_t channels, int64_t inner,
                               ConvEpilogue epilogue, int blockThreads, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (bias && (channels <= 0 || inner <= 0)) return cudaErrorInvalidValue;
  if (!validBlock(blockThreads)) return cudaErrorInvalidValue;
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    convEpilogueKernel<T>
        <<<static_cast<unsigned>(blocksFor(count, blockThreads)), blockThreads, 0, stream>>>(
            static_cast<T*>(y), static_cast<const T*>(bias), static_cast<const T*>(residual), count,
            channels, inner, epilogue);
    return cudaGetLastError();
  });
}

cudaError_t launchHwioToOhwi(int elementSize, const void* hwio, void* ohwi, int64_t kernelH,
                             int64_t kernelW, int64_t groupChannels, int64_t outChannels,
                             cudaStream_t stream) {
  const int64_t count = kernelH * kernelW * groupChannels * outChannels;
  if (count <= 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(blocksFor(count));
  if (elementSize == 4) {
    hwioToOhwiKernel<uint32_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(hwio), static_cast<uint32_t*>(ohwi), kernelH, kernelW,
        groupChannels, outChannels);
  } else if (elementSize == 2) {
    hwioToOhwiKernel<uint16_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(hwio), static_cast<uint16_t*>(ohwi), kernelH, kernelW,
        groupChannels, outChannels);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
