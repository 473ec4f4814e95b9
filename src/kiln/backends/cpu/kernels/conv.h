// What the float32 convolution kernels share across layouts (conv.cc: NCHW Conv and FusedConv;
// conv_nhwc.cc: kiln.NhwcConv): the geometry a step runs with, how its GEMM work splits into
// tasks for the plan's threads, per-chunk scratch, and the bias + epilogue of one output block.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/cpu/kernels/epilogue.h"
#include "kiln/backends/cpu/kernels/sgemm.h"
#include "kiln/backends/cpu/plan.h"

// The hot loops of the direct kernels are compiled for AVX-512, AVX2 and the baseline, and the
// best one the CPU supports is picked when the library loads (GCC's function multiversioning):
// the build itself targets baseline x86-64.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define KILN_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_VECTOR_CLONES
#endif

namespace kiln::cpu {

// A 2-D convolution's extents, whatever the layout its tensors are stored in.
struct ConvShape {
  int64_t batch, channels, height, width;    // input
  int64_t outChannels, outHeight, outWidth;  // output
  int64_t kernelH, kernelW, strideH, strideW, dilationH, dilationW, padTop, padLeft;
  int64_t group;

  int64_t groupChannels() const { return channels / group; }
  int64_t groupOutChannels() const { return outChannels / group; }
  int64_t pixels() const { return outHeight * outWidth; }                // per image
  int64_t patch() const { return groupChannels() * kernelH * kernelW; }  // GEMM depth
  // 1x1, stride 1, unpadded (at either end): the input already is the GEMM's operand, no
  // im2col copy needed.
  bool pointwise() const {
    return kernelH == 1 && kernelW == 1 && strideH == 1 && strideW == 1 && padTop == 0 &&
           padLeft == 0 && outHeight == height && outWidth == width;
  }
  bool depthwise() const { return group == channels && group > 1; }

  // The shape of a Conv/FusedConv (NCHW input, [M, C/group, kH, kW] weights) or of a
  // kiln.NhwcConv (NHWC input, [kH, kW, C/group, M] weights); nullopt for anything but a 4-D
  // float32 convolution with valid attributes.
  static std::optional<ConvShape> fromNode(const ir::Node& node, bool nhwc);
};

enum class ConvAlgo { kIm2col, kDirect, kPointwise, kDepthwise };

// cpu.conv.algo, cpu.conv.im2col_tile and the GEMM options resolved for one node.
struct ConvChoice {
  ConvAlgo algo = ConvAlgo::kIm2col;
  int64_t maxTile = 0;  // output pixels per im2col/pointwise task; 0: the whole image
  // Built once per node: gemmOptionsFor's (source, cpu.gemm.kc, kernel, block_a, block_b, split),
  // with the precision cpu.conv.precision asks for.
  GemmOptions gemmOptions;
  std::string requestedKernel = "auto";  // cpu.gemm.kernel as asked, for the tactic

  const GemmOptions& gemm() const { return gemmOptions; }
};

// How a GEMM-based convolution's work splits: `count` tasks, each `tile` output pixels of one of
// `images` independent GEMM problems (an image and group). With `parallel`, tasks run on the
// pool's threads at once, each GEMM single-threaded on its own scratch; otherwise one at a time,
// each GEMM (and copy) spread over the pool.
struct ConvTasks {
  int64_t tile = 0;
  int64_t tilesPerImage = 0;
  int64_t count = 0;
  bool parallel = false;

  // `maxTile` 0 keeps whole images (parallel only across images); otherwise tiles of at most
  // maxTile pixels, smaller when that is what it takes to give every thread a task (but not
  // below a size a GEMM still runs well on).
  static ConvTasks plan(int64_t pixels, int64_t images, int64_t maxTile, int threads);
};

// Scratch for the chunks of one parallelFor: each call of the chunk function takes a buffer of
// its own. prepare() runs before the parallelFor, on the calling thread.
class ChunkScratch {
 public:
  void prepare(int64_t chunks, int64_t floats);
  float* take() { return buffers_[static_cast<size_t>(next_.fetch_add(1))].data(); }

 private:
  std::vector<std::vector<float>> buffers_;
  std::atomic<int64_t> next_{0};
};

// A pool of one thread, for GEMMs that run inside a parallelFor chunk (parallelFor is not
// reentrant, and the chunks already occupy every thread).
ThreadPool& inlinePool();

// While alive, OpenBLAS runs every call on its caller's thread: the conv's own tasks already
// occupy the plan's threads, and OpenBLAS's threads would only compete with them. A no-op for
// kiln's own GEMM, which takes its threads from the pool it is given.
class SingleThreadedBlas {
 public:
  explicit SingleThreadedBlas(GemmSource source);
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int restore_ = 0;  // OpenBLAS's thread count before; 0 when nothing was changed
};

// Adds the bias (bias[r] along row r with `biasPerRow`, as NCHW channels; else bias[i] along
// each row, as NHWC channels; none if null), then the epilogue (the residual at the same
// offsets, the activation), to `rows` rows of `length` floats, `rowStride` apart. Kernels call it
// on each block of output right after computing it, while the block is in cache.
void finishRows(float* out, const float* residual, int64_t rows, int64_t length, int64_t rowStride,
                const float* bias, bool biasPerRow, const Epilogue& epilogue);

// The tactic a choice names: "direct", "depthwise", or "im2col+<source>" / "pointwise+<source>"
// (source "blas" or "native") with ".tile<N>" when tasks are at most N output pixels, then, for
// the native source, each GEMM option that is not the default (".kc128", ".avx2" or
// ".auto-no-avx512", ".a96k", ".b1024k", ".rows" or ".columns").
std::string convTactic(const ConvChoice& choice);

// One output plane of an NCHW depthwise convolution (conv_depthwise.cc): out = bias + the
// kernel's taps over the input channel's plane x. Bias and taps only; the epilogue is the
// caller's. `scratch` holds depthwiseScratchFloats floats, the padded plane.
struct DepthwisePlane {
  const ConvShape* shape;
  const float* x;  // [H, W]
  const float* w;  // [kH, kW]
  float bias;
  float* out;  // [OH, OW]
  float* scratch;
};

// Whether depthwisePlane computes this convolution: one output channel per input channel
// (group == channels == output channels), 3x3, 5x5 or 7x7, the same stride 1 or 2 along both axes,
// no dilation; any padding.
bool depthwiseKernelFits(const ConvShape& shape);
int64_t depthwiseScratchFloats(const ConvShape& shape);
void depthwisePlane(const DepthwisePlane& plane);

// kiln.NhwcConv's CPU step (conv_nhwc.cc), with the algorithm already chosen.
std::unique_ptr<Step> makeNhwcConvStep(const ConvShape& shape, const ConvChoice& choice,
                                       const Epilogue& epilogue);

}  // namespace kiln::cpu
