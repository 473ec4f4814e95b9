// Device helpers kiln's convolution kernels share (conv.cu, conv_depthwise.cu): the activation
// they fuse into their epilogue, in float as the reference computes each, and the vector of V
// elements a thread loads and stores at once.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <optional>

#include "kiln/backends/cuda/kernels/conv.h"
#include "kiln/backends/cuda/kernels/device_types.cuh"

namespace kiln::cuda::device {

// What the runtime says of the kernel instance `Kernel` on the current device, asked once per
// instance, query and device: query(kernel) gives the answer, or std::nullopt on a failed call
// (then `fallback`, not cached, so a later call asks again). Host code with no stream work; the
// steps make their first call at prepare time (launchDepthwiseNhwc's queryOnly), outside graph
// capture.
template <auto Kernel, typename Value, typename Query>
Value askOncePerDevice(Query query, Value fallback) {
  static std::mutex mutex;
  static std::map<int, Value> answers;  // by device ordinal
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return fallback;
  }
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = answers.find(device); it != answers.end()) return it->second;
  const std::optional<Value> answer = query(Kernel);
  if (!answer) {
    (void)cudaGetLastError();
    return fallback;
  }
  return answers[device] = *answer;
}

// The threads a block of the depthwise kernel instance `Kernel` under
// DepthwiseTiling::blockThreads `requested`: itself, or for 0 what
// cudaOccupancyMaxPotentialBlockSize gives (at most 512: the largest block that leaves the most
// threads resident an SM for the instance's registers), 256 where it fails.
template <auto Kernel>
int depthwiseBlockThreads(int requested) {
  if (requested != 0) return requested;
  return askOncePerDevice<Kernel>(
      [](auto kernel) -> std::optional<int> {
        int minGrid = 0, block = 0;
        if (cudaOccupancyMaxPotentialBlockSize(&minGrid, &block, kernel, 0, 512) != cudaSuccess ||
            block < 32) {
          return std::nullopt;
        }
        return block;
      },
      256);
}

// Whether the kernel instance `Kernel` runs on the current device without local memory (no
// spills, no stack); false where the runtime cannot say.
template <auto Kernel>
bool spillsNothing() {
  return askOncePerDevice<Kernel>(
      [](auto kernel) -> std::optional<bool> {
        cudaFuncAttributes attributes{};
        if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) return std::nullopt;
        return attributes.localSizeBytes == 0;
      },
      false);
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

// std::min and std::max as the reference evaluates them (so a NaN argument picks the same side).
__device__ __forceinline__ float referenceMin(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ float referenceMax(float a, float b) { return a < b ? b : a; }

__device__ __forceinline__ float activate(float x, const ConvEpilogue& e) {
  switch (e.activation) {
    case ConvActivation::kNone:
      return x;
    case ConvActivation::kRelu:
      return x < 0.0f ? 0.0f : x;
    case ConvActivation::kLeakyRelu:
      return x < 0.0f ? e.alpha * x : x;
    case ConvActivation::kClip:
      // min first, then max, as Clip: min > max gives max everywhere.
      if (x < e.alpha) x = e.alpha;
      if (x > e.beta) x = e.beta;
      return x;
    case ConvActivation::kSigmoid:
      return 1.0f / (1.0f + expf(-x));
    case ConvActivation::kHardSigmoid: {
      // NaN gives 1, as std::min(1, NaN) does; tested explicitly because ptxas may reorder the
      // min/max pair into a clamp that sends NaN to 0.
      const float v = e.alpha * x + e.beta;
      return isnan(v) ? 1.0f : referenceMax(0.0f, referenceMin(1.0f, v));
    }
    case ConvActivation::kHardSwish:
      return x * referenceMax(0.0f, referenceMin(1.0f, x / 6.0f + 0.5f));
    case ConvActivation::kTanh:
      return tanhf(x);
    case ConvActivation::kGelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case ConvActivation::kGeluTanh:
      // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), which keeps its precision for negative x.
      return x / (1.0f + expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
    case ConvActivation::kSilu:
      return x / (1.0f + expf(-x));
  }
  return x;
}

// The end of both depthwise kernels: a thread's sums of P neighbouring output pixels of a row
// (the first at element `at` of y [N, OH, OW, C], contiguous; `left` of them in the row) for V
// channels, plus the bias (`bias` at the thread's channels; null: none) and the residual (y's
// layout; null: none), through the activation, stored as one vector a pixel.
template <typename T, int V, int P>
__device__ __forceinline__ void storeDepthwiseOutputs(const float (&sum)[P][V], int at, int left,
                                                      int channels, const T* bias,
                                                      const T* __restrict__ residual,
                                                      T* __restrict__ y,
                                                      const ConvEpilogue& epilogue) {
  Vec<T, V> bv{};
  if (bias) bv = *reinterpret_cast<const Vec<T, V>*>(bias);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (p >= left) break;
    const int pixel = at + p * channels;
    Vec<T, V> rv{}, out;
    if (residual) rv = *reinterpret_cast<const Vec<T, V>*>(residual + pixel);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float value = sum[p][v];
      if (bias) value += load(bv.v[v]);
      if (residual) value += load(rv.v[v]);
      store(&out.v[v], activate(value, epilogue));
    }
    *reinterpret_cast<Vec<T, V>*>(y + pixel) = out;
  }
}

}  // namespace kiln::cuda::device
