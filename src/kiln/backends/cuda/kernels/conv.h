// kiln's own convolution kernels on the GPU (conv.cu): a direct convolution of any layout the
// element strides describe (NCHW and NHWC, 1-D to 3-D, groups, strides, dilations, asymmetric
// pads) with its bias + residual + activation epilogue fused, the direct transposed convolution
// (ConvTranspose, NCHW, every attribute), the same epilogue alone (after a cuDNN convolution
// that could not fuse it), and the weight reorder kiln.NhwcConv needs for cuDNN.
//
// Every tensor of one launch has the same element type: float32, float16 or bfloat16 (the reduced
// types are loaded into float, accumulated in float and rounded once on the way out).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType

namespace kiln::cuda {

// The activations of kiln.FusedConv / kiln.NhwcConv (src/kiln/ir/ops/fused.cc), computed as the
// reference kernel computes them (NaN stays NaN where the reference keeps it).
enum class ConvActivation : int {
  kNone,
  kRelu,
  kLeakyRelu,  // alpha: the negative slope
  kClip,       // alpha: min, beta: max
  kSigmoid,
  kHardSigmoid,  // alpha * x + beta, clamped to [0, 1]
  kHardSwish,
  kTanh,
  kGelu,      // the erf form
  kGeluTanh,  // the tanh approximation
  kSilu,      // x * sigmoid(x)
};

struct ConvEpilogue {
  ConvActivation activation = ConvActivation::kNone;
  float alpha = 0;
  float beta = 0;
};

// A convolution's extents, with the spatial axes right-aligned into (depth, height, width): a
// 2-D convolution has depth 1, a 1-D one depth and height 1 (kernel 1, stride 1, no padding
// there). Strides are in elements, per logical axis.
struct ConvGeometry {
  int64_t batch = 0;
  int64_t channels = 0;     // input channels C
  int64_t outChannels = 0;  // M
  int64_t group = 1;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};
  int64_t padBegin[3] = {0, 0, 0};  // the end pads only shape `out`
  int64_t xStrides[5] = {};         // x over (n, c, d, h, w)
  int64_t wStrides[5] = {};         // w over (m, c within the group, kd, kh, kw)
  int64_t yStrides[5] = {};         // y and the residual over (n, m, d, h, w)
  // Threads walk the output with the channel fastest (NHWC) rather than the width (NCHW), so
  // that neighbouring threads write neighbouring elements.
  bool channelsLast = false;
};

// Whether the kernels below take elements of `type` (float32, float16, bfloat16).
bool convSupported(ElementType type);

// y = act(conv(x, w) + bias + residual), one thread per output element (`blockThreads`, a
// multiple of 32 up to 1024, a block), float accumulation. bias ([M]) and residual (y's shape and
// strides) may be null; every tensor is of `type`.
cudaError_t launchDirectConv(const ConvGeometry& geometry, ElementType type, const void* x,
                             const void* w, const void* bias, const void* residual, void* y,
                             ConvEpilogue epilogue, int blockThreads, cudaStream_t stream);

// Whether launchDepthwiseNhwc takes `g`: a depthwise convolution (group == C == M) in NHWC,
// 2-D (depth 1), with contiguous tensors as kiln.NhwcConv has them (x [N, H, W, C], w [kH, kW,
// 1, C], y and the residual [N, OH, OW, C], bias [C]), positive strides and dilations, and every
// index the kernel forms within 32 bits.
bool depthwiseNhwcFits(const ConvGeometry& g);

// Whether the window kernel takes `g` (depthwiseNhwcFits, and a kernel 3, 5 or 7 wide with
// stride 1 or 2 and dilation 1 along the row).
bool depthwiseWindowFits(const ConvGeometry& g);

// How launchDepthwiseNhwc divides its work. With `window` set, convolutions depthwiseWindowFits
// takes run the window kernel (conv_depthwise.cu): a thread computes `windowPixels` (2, 4 or 8;
// 0: depthwiseWindowPixels' choice) neighbouring output pixels of a row, loading each input pixel
// of their window once into registers. The others, and all with `window` off, run the direct
// kernel: a thread computes `pixels` (1, 2 or 4) outputs of a row, loading every tap of each
// (each weight vector once for all of them). Both take `blockThreads` threads a block (0: the
// CUDA occupancy calculator's choice for the kernel instance launched, the largest block of at
// most 512 threads that leaves the most threads resident an SM) and move channels in runs of up
// to `vectorBytes`.
struct DepthwiseTiling {
  int pixels = 1;
  int blockThreads = 256;
  int vectorBytes = 8;  // the widest channel run a thread moves at once: 16, 8 or 4 bytes
  bool window = true;
  int windowPixels = 0;
  // The window kernel's float16 / bfloat16 instances compiled for at most 56 registers a thread
  // (9 blocks of 128 threads an SM) and launched in 128-thread blocks, where ptxas spilled
  // nothing at that bound; the plain instance (blockThreads) elsewhere. The same bits.
  bool capRegisters = false;
};

// The output pixels a thread of the window kernel computes for `g` under `tiling`: windowPixels
// when set, else the most of 8 and 4 that keep a thread's accumulators (pixels times the channel
// run) within 32 floats and leave at least 2^17 threads, else 2.
int depthwiseWindowPixels(const ConvGeometry& g, ElementType type, const DepthwiseTiling& tiling);

// y = act(depthwise(x, w) + bias + residual) by the window or the direct kernel as `tiling` says
// (vector loads of up to 16 bytes where the channel count and the pointers allow), float
// accumulation over the taps in (kh, kw) order in both, so both give the same bits. bias and
// residual may be null.
// With `queryOnly`, it launches nothing: it makes the instance's runtime queries that the
// tiling asks for (the occupancy calculator's block, the capped instance's local memory), whose
// answers are kept for later launches, so that none is made while a CUDA graph is captured.
cudaError_t launchDepthwiseNhwc(const ConvGeometry& g, ElementType type, const void* x,
                                const void* w, const void* bias, const void* residual, void* y,
                                ConvEpilogue epilogue, DepthwiseTiling tiling, cudaStream_t stream,
                                bool queryOnly = false);

// The window kernel alone (launchDepthwiseNhwc calls it): `runElements` channels (1, 2, 4 or 8,
// dividing the channels and every pointer's alignment) and `pixels` outputs (2, 4 or 8) a thread;
// blockThreads and capRegisters as DepthwiseTiling's (0: the occupancy calculator's).
cudaError_t launchDepthwiseWindow(const ConvGeometry& g, ElementType type, int runElements,
                                  int pixels, int blockThreads, bool capRegisters, const void* x,
                                  const void* w, const void* bias, const void* residual, void* y,
                                  ConvEpilogue epilogue, cudaStream_t stream,
                                  bool queryOnly = false);

// ConvTranspose (NCHW), one thread per output element gathering what the op scatters into it:
// y[n, m, o] = bias[m] + the sum of x[n, c, i] * w[c, m's index in its group, k] over the input
// channels c of m's group and the (i, k) with o = i * stride - padBegin + k * dilation on every
// axis. `geometry` holds channels = C (x's), outChannels = M (y's), in and out the spatial
// extents of x and y, padBegin as the op's geometry resolved it (negative where output_shape
// asks for more than the pads give), and wStrides over (c, m within the group, kd, kh, kw).
// bias ([M]) may be null; float accumulation; `blockThreads` threads a block, as launchDirectConv.
cudaError_t launchConvTranspose(const ConvGeometry& geometry, ElementType type, const void* x,
                                const void* w, const void* bias, void* y, int blockThreads,
                                cudaStream_t stream);

// In place on a convolution's output of `count` elements of `type`: y = act(y + bias[c] +
// residual), where element i's channel is (i / inner) % channels (inner: the spatial size for
// NCHW, 1 for NHWC). bias and residual may be null.
cudaError_t launchConvEpilogue(ElementType type, void* y, const void* bias, const void* residual,
                               int64_t count, int64_t channels, int64_t inner,
                               ConvEpilogue epilogue, int blockThreads, cudaStream_t stream);

// kiln.NhwcConv's weights [kH, kW, C/group, M] to [M, kH, kW, C/group], the filter layout
// cuDNN's NHWC convolutions read; elements of `elementSize` (2 or 4) bytes are moved as they are.
cudaError_t launchHwioToOhwi(int elementSize, const void* hwio, void* ohwi, int64_t kernelH,
                             int64_t kernelW, int64_t groupChannels, int64_t outChannels,
                             cudaStream_t stream);

}  // namespace kiln::cuda
