// 2-D convolution in float32 on NCHW tensors (Conv, kiln.FusedConv), and the choice of kernel
// for every convolution (kiln.NhwcConv's kernels are in conv_nhwc.cc):
//
//   - im2col: per image and group, tiles of output pixels; each tile's input patches are copied
//     into a [C/group * kH * kW, tile] column block that one GEMM multiplies by the weights;
//   - pointwise: a 1x1 stride-1 unpadded convolution is already that GEMM on the input, with no
//     copy;
//   - direct: a loop nest over output planes, for depthwise convolutions (whose per-group
//     matrices are too thin for a GEMM) that the depthwise kernel does not take;
//   - depthwise: 3x3, 5x5 and 7x7 depthwise convolutions of stride 1 or 2, each plane copied
//     with its padding into scratch, then one vectorised loop over all its output pixels with the
//     taps in registers (conv_depthwise.cc).
//
// The bias and the fused epilogue (residual, activation) run on each block right after the GEMM
// or loop that produced it, while it is still in cache.
#include "kiln/backends/cpu/kernels/conv.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/neural.h"

// RelWithDebInfo builds at -O2, where GCC 12 vectorises only loops whose trip count it knows to
// be a multiple of the vector width; the copy and accumulate loops here have runtime extents.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

namespace kiln::cpu {

const knobs::Knob kConvPrecision = knobs::declareKnob({
    .name = "cpu.conv.precision",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fp32", "bf16"},
    .defaultValue = "fp32",
    .help = "precision of the GEMM inside im2col and pointwise convolutions: float32, or bfloat16 "
            "operands with float32 accumulation (the native GEMM; AVX512_BF16 where the CPU has "
            "it)",
    .backends = {"cpu"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kConvAlgo = knobs::declareKnob({
    .name = "cpu.conv.algo",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "im2col", "direct", "pointwise", "depthwise", "reference"},
    .defaultValue = "auto",
    .help = "2-D convolution algorithm. auto: depthwise where it applies and the output plane "
            "has at least as many pixels as the kernel has rows, direct for other depthwise "
            "convs, pointwise for 1x1 stride-1 unpadded, else im2col. im2col: copies patches "
            "into columns for a GEMM (1x1 included). direct: a generic loop nest over output "
            "planes. pointwise: a GEMM on the input itself (other convs take auto's choice). "
            "depthwise: NCHW 3x3/5x5/7x7 depthwise convs of stride 1 or 2, padded per plane and "
            "run as one vectorised loop with the taps in registers (other convs take auto's "
            "choice). reference: the reference kernel.",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kIm2colTile = knobs::declareKnob({
    .name = "cpu.conv.im2col_tile",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"0", "256", "1024", "4096"},
    .defaultValue = "1024",
    .help = "output pixels per im2col/pointwise GEMM task (0: the whole image): smaller tiles "
            "keep the column buffer in cache and give the threads more independent tasks",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Output columns [first, last) of a kernel column whose input column ox * stride + offset lies
// inside [0, extent); the same for rows.
struct OutputRange {
  int64_t first, last;
};

OutputRange insideRange(int64_t offset, int64_t stride, int64_t extent, int64_t outExtent) {
  const int64_t first = offset >= 0 ? 0 : ceilDiv(-offset, stride);
  const int64_t last = extent - offset <= 0 ? 0 : ceilDiv(extent - offset, stride);
  const int64_t clampedFirst = std::min(first, outExtent);
  return {clampedFirst, std::clamp(last, clampedFirst, outExtent)};
}

// One output plane (n, m) of a direct convolution.
struct DirectPlane {
  const ConvShape* shape;
  const OutputRange* rowRanges;  // per kernel row: the output rows it lands inside for
  const OutputRange* colRanges;  // per kernel column: the output columns
  const float* x;                // the group's input channels of image n: [C/group, H, W]
  const float* w;                // output channel m's weights: [C/group, kH, kW]
  float bias;
  float* out;  // [OH, OW]
};

// Accumulated row by row: each output row gathers its kernel rows' taps while it stays in L1,
// and a stride-1 tap is one contiguous multiply-add over the row.
KILN_VECTOR_CLONES
void accumulatePlane(const DirectPlane& p) {
  const ConvShape& s = *p.shape;
  float* __restrict out = p.out;
  std::fill(out, out + s.pixels(), p.bias);
  for (int64_t c = 0; c < s.groupChannels(); ++c) {
    const float* in = p.x + c * s.height * s.width;
    const float* kernel = p.w + c * s.kernelH * s.kernelW;
    for (int64_t ky = 0; ky < s.kernelH; ++ky) {
      const OutputRange rows = p.rowRanges[ky];
      for (int64_t oy = rows.first; oy < rows.last; ++oy) {
        const float* __restrict inRow =
            in + (oy * s.strideH - s.padTop + ky * s.dilationH) * s.width;
        float* __restrict outRow = out + oy * s.outWidth;
        for (int64_t kx = 0; kx < s.kernelW; ++kx) {
          const float weight = kernel[ky * s.kernelW + kx];
          const OutputRange cols = p.colRanges[kx];
          const int64_t offsetX = kx * s.dilationW - s.padLeft;
          if (s.strideW == 1) {
            for (int64_t ox = cols.first; ox < cols.last; ++ox) {
              outRow[ox] += weight * inRow[ox + offsetX];
            }
          } else {
            for (int64_t ox = cols.first; ox < cols.last; ++ox) {
              outRow[ox] += weight * inRow[ox * s.strideW + offsetX];
            }
          }
        }
      }
    }
  }
}

// The smallest tile worth a GEMM of its own: below it, packing and call overhead outweigh what
// one more thread brings.
constexpr int64_t kMinTile = 64;

class ConvStep : public Step {
 public:
  ConvStep(ConvShape shape, ConvChoice choice, Epilogue epilogue)
      : shape_(shape), choice_(choice), epilogue_(epilogue) {
    for (int64_t ky = 0; ky < shape.kernelH; ++ky) {
      rowRanges_.push_back(insideRange(ky * shape.dilationH - shape.padTop, shape.strideH,
                                       shape.height, shape.outHeight));
    }
    for (int64_t kx = 0; kx < shape.kernelW; ++kx) {
      colRanges_.push_back(insideRange(kx * shape.dilationW - shape.padLeft, shape.strideW,
                                       shape.width, shape.outWidth));
    }
  }

  // Inputs: X, W, B? and, for FusedConv, the residual (same shape as the output).
  Status run(const ExecutionContext& context) const override {
    Operands o;
    o.x = context.data<float>(*inputs[0]);
    o.w = context.data<float>(*inputs[1]);
    o.bias = inputs.size() > 2 && inputs[2] ? context.data<float>(*inputs[2]) : nullptr;
    o.residual = inputs.size() > 3 && inputs[3] ? context.data<float>(*inputs[3]) : nullptr;
    o.y = context.data<float>(*outputs[0]);
    if (choice_.algo == ConvAlgo::kDirect) {
      runDirect(o, context.pool());
    } else if (choice_.algo == ConvAlgo::kDepthwise) {
      runDepthwise(o, context.pool());
    } else {
      runGemm(o, context.pool());
    }
    return Status::ok();
  }

 private:
  struct Operands {
    const float *x, *w, *bias, *residual;
    float* y;
  };

  void runGemm(const Operands& o, ThreadPool& pool) const {
    const ConvShape& s = shape_;
    const ConvTasks tasks =
        ConvTasks::plan(s.pixels(), s.batch * s.group, choice_.maxTile, pool.size());
    const int64_t columnFloats = choice_.algo == ConvAlgo::kIm2col ? s.patch() * tasks.tile : 0;
    if (tasks.parallel) {
      scratch_.prepare(pool.chunkCount(tasks.count, 1), columnFloats);
      SingleThreadedBlas serial(choice_.gemm().source);
      pool.parallelFor(tasks.count, 1, [&](int64_t begin, int64_t end) {
        float* columns = scratch_.take();
        for (int64_t task = begin; task < end; ++task) runTask(o, tasks, task, columns, nullptr);
      });
      return;
    }
    scratch_.prepare(1, columnFloats);
    float* columns = scratch_.take();
    for (int64_t task = 0; task < tasks.count; ++task) runTask(o, tasks, task, columns, &pool);
  }

  // One tile of one image and group: copy (im2col), GEMM, bias and epilogue. With `pool`, each
  // of those spreads over its threads; without, all run on the calling thread.
  void runTask(const Operands& o, const ConvTasks& tasks, int64_t task, float* columns,
               ThreadPool* pool) const {
    const ConvShape& s = shape_;
    const int64_t image = task / tasks.tilesPerImage;
    const int64_t n = image / s.group, g = image % s.group;
    const int64_t first = (task % tasks.tilesPerImage) * tasks.tile;
    const int64_t length = std::min(tasks.tile, s.pixels() - first);
    const int64_t cg = s.groupChannels(), mg = s.groupOutChannels(), pixels = s.pixels();
    const float* xg = o.x + (n * s.channels + g * cg) * s.height * s.width;
    const float* b = xg + first;  // pointwise: the input's [C/group, pixels] block
    int64_t ldb = pixels;
    if (choice_.algo == ConvAlgo::kIm2col) {
      const auto fill = [&](int64_t begin, int64_t end) {
        fillColumns(xg, first, length, begin, end, columns);
      };
      if (pool) {
        pool->parallelFor(s.patch(), std::max<int64_t>(1, 4096 / length), fill);
      } else {
        fill(0, s.patch());
      }
      b = columns;
      ldb = length;
    }
    const int64_t yOffset = (n * s.outChannels + g * mg) * pixels + first;
    float* c = o.y + yOffset;
    sgemm(choice_.gemm(),
          GemmArgs{.m = mg,
                   .n = length,
                   .k = s.patch(),
                   .a = o.w + g * mg * s.patch(),
                   .lda = s.patch(),
                   .b = b,
                   .ldb = ldb,
                   .c = c,
                   .ldc = pixels},
          pool ? *pool : inlinePool());
    const auto finish = [&](int64_t begin, int64_t end) {
      finishRows(c + begin * pixels, o.residual ? o.residual + yOffset + begin * pixels : nullptr,
                 end - begin, length, pixels, o.bias ? o.bias + g * mg + begin : nullptr, true,
                 epilogue_);
    };
    if (pool) {
      pool->parallelFor(mg, std::max<int64_t>(1, 4096 / length), finish);
    } else {
      finish(0, mg);
    }
  }

  // Column rows [rowBegin, rowEnd) of output pixels [first, first + length): row (c, ky, kx)
  // holds, per output pixel, the input value that kernel tap meets (zero in the padding).
  void fillColumns(const float* x, int64_t first, int64_t length, int64_t rowBegin, int64_t rowEnd,
                   float* columns) const {
    const ConvShape& s = shape_;
    const int64_t taps = s.kernelH * s.kernelW;
    for (int64_t row = rowBegin; row < rowEnd; ++row) {
      const int64_t c = row / taps, ky = row % taps / s.kernelW, kx = row % s.kernelW;
      const float* plane = x + c * s.height * s.width;
      const int64_t offsetX = kx * s.dilationW - s.padLeft;
      const OutputRange inside = colRanges_[static_cast<size_t>(kx)];
      float* out = columns + row * length;
      for (int64_t p = first, end = first + length; p < end;) {
        const int64_t oy = p / s.outWidth, ox0 = p % s.outWidth;
        const int64_t ox1 = std::min(s.outWidth, ox0 + (end - p));
        const int64_t iy = oy * s.strideH - s.padTop + ky * s.dilationH;
        if (iy < 0 || iy >= s.height) {
          std::fill(out, out + (ox1 - ox0), 0.0f);
        } else {
          const float* in = plane + iy * s.width;
          const int64_t a = std::clamp(inside.first, ox0, ox1);
          const int64_t b = std::clamp(inside.last, a, ox1);
          std::fill(out, out + (a - ox0), 0.0f);
          if (s.strideW == 1) {
            std::memcpy(out + (a - ox0), in + a + offsetX, sizeof(float) * (b - a));
          } else {
            for (int64_t ox = a; ox < b; ++ox) out[ox - ox0] = in[ox * s.strideW + offsetX];
          }
          std::fill(out + (b - ox0), out + (ox1 - ox0), 0.0f);
        }
        out += ox1 - ox0;
        p += ox1 - ox0;
      }
    }
  }

  void runDirect(const Operands& o, ThreadPool& pool) const {
    const ConvShape& s = shape_;
    const int64_t planeWork = std::max<int64_t>(1, s.pixels() * s.patch());
    pool.parallelFor(s.batch * s.outChannels, std::max<int64_t>(1, 16384 / planeWork),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t plane = begin; plane < end; ++plane) directPlane(o, plane);
                     });
  }

  // Planes split over the threads as runDirect's; each plane's result is the same whichever
  // thread computes it.
  void runDepthwise(const Operands& o, ThreadPool& pool) const {
    const ConvShape& s = shape_;
    const int64_t planeWork = std::max<int64_t>(1, s.pixels() * s.kernelH * s.kernelW);
    const int64_t planes = s.batch * s.outChannels, grain = std::max<int64_t>(1, 16384 / planeWork);
    scratch_.prepare(pool.chunkCount(planes, grain), depthwiseScratchFloats(s));
    pool.parallelFor(planes, grain, [&](int64_t begin, int64_t end) {
      float* padded = scratch_.take();
      for (int64_t plane = begin; plane < end; ++plane) depthwise(o, plane, padded);
    });
  }

  // Output plane (n, c) reads input plane (n, c) alone: `plane` indexes both.
  void depthwise(const Operands& o, int64_t plane, float* padded) const {
    const ConvShape& s = shape_;
    const int64_t c = plane % s.outChannels;
    float* out = o.y + plane * s.pixels();
    depthwisePlane({.shape = &s,
                    .x = o.x + plane * s.height * s.width,
                    .w = o.w + c * s.kernelH * s.kernelW,
                    .bias = o.bias ? o.bias[c] : 0.0f,
                    .out = out,
                    .scratch = padded});
    finishRows(out, o.residual ? o.residual + plane * s.pixels() : nullptr, 1, s.pixels(),
               s.pixels(), nullptr, true, epilogue_);
  }

  void directPlane(const Operands& o, int64_t plane) const {
    const ConvShape& s = shape_;
    const int64_t cg = s.groupChannels(), mg = s.groupOutChannels();
    const int64_t n = plane / s.outChannels, m = plane % s.outChannels, g = m / mg;
    const DirectPlane p{.shape = &s,
                        .rowRanges = rowRanges_.data(),
                        .colRanges = colRanges_.data(),
                        .x = o.x + (n * s.channels + g * cg) * s.height * s.width,
                        .w = o.w + m * cg * s.kernelH * s.kernelW,
                        .bias = o.bias ? o.bias[m] : 0.0f,
                        .out = o.y + plane * s.pixels()};
    accumulatePlane(p);
    finishRows(p.out, o.residual ? o.residual + plane * s.pixels() : nullptr, 1, s.pixels(),
               s.pixels(), nullptr, true, epilogue_);
  }

  ConvShape shape_;
  ConvChoice choice_;
  Epilogue epilogue_;
  std::vector<OutputRange> rowRanges_, colRanges_;  // per kernel row / column
  // im2col columns, depthwise padded planes; a plan runs on one thread at a time
  mutable ChunkScratch scratch_;
};

ConvAlgo chooseAlgo(const std::string& algo, const ConvShape& s) {
  if (algo == "im2col") return ConvAlgo::kIm2col;
  if (algo == "direct") return ConvAlgo::kDirect;
  if (algo == "pointwise" && s.pointwise()) return ConvAlgo::kPointwise;
  if (algo == "depthwise" && depthwiseKernelFits(s)) return ConvAlgo::kDepthwise;
  // auto, and pointwise or depthwise where it does not apply: a depthwise convolution's
  // per-group GEMMs would be a single row each, and a pointwise one needs no copy.
  // The depthwise kernel pays a copy per plane that direct does not: on planes of fewer output
  // pixels than kernel rows (1x1; 2x2 under a 5x5 or 7x7 kernel) direct was measured faster
  // (under a 7x7 kernel: 4x on 1x1, 1.6x on 2x2, alike on 3x3).
  if (s.depthwise() && depthwiseKernelFits(s) && s.pixels() >= s.kernelH) {
    return ConvAlgo::kDepthwise;
  }
  if (s.depthwise()) return ConvAlgo::kDirect;
  if (s.pointwise()) return ConvAlgo::kPointwise;
  return ConvAlgo::kIm2col;
}

}  // namespace

std::optional<ConvShape> ConvShape::fromNode(const ir::Node& node, bool nhwc) {
  const ir::Value* x = node.input(0);
  const ir::Value* w = node.input(1);
  const ir::Value* y = node.outputs.empty() ? nullptr : node.outputs[0];
  if (!x || !w || !y || x->shape.rank() != 4 || w->shape.rank() != 4) return std::nullopt;
  for (const ir::Value* value : node.inputs) {
    if (value && value->dtype != ir::DType::kFloat32) return std::nullopt;
  }
  if (y->dtype != ir::DType::kFloat32) return std::nullopt;
  const ir::Shape& xs = x->shape;
  const ir::Shape& ws = w->shape;
  // Geometry is resolved on the NCHW / [M, C/group, kH, kW] equivalents, as Conv's own.
  const ir::Shape nchw = nhwc ? ir::Shape{xs[0], xs[3], xs[1], xs[2]} : xs;
  const ir::Shape oihw = nhwc ? ir::Shape{ws[3], ws[2], ws[0], ws[1]} : ws;
  auto geometry = ir::resolveConvGeometry(node, nchw, oihw);
  auto group = node.getInt("group", 1);
  if (!geometry.isOk() || !group.isOk() || *group < 1 || nchw[1] != oihw[1] * *group ||
      oihw[0] % *group != 0) {
    return std::nullopt;
  }
  return ConvShape{nchw[0],
                   nchw[1],
                   nchw[2],
                   nchw[3],
                   oihw[0],
                   geometry->output[0],
                   geometry->output[1],
                   geometry->kernel[0],
                   geometry->kernel[1],
                   geometry->strides[0],
                   geometry->strides[1],
                   geometry->dilations[0],
                   geometry->dilations[1],
                   geometry->padsBegin[0],
                   geometry->padsBegin[1],
                   *group};
}

ConvTasks ConvTasks::plan(int64_t pixels, int64_t images, int64_t maxTile, int threads) {
  ConvTasks tasks;
  if (pixels <= 0 || images <= 0) return tasks;
  tasks.tile = maxTile > 0 ? std::min(maxTile, pixels) : pixels;
  if (maxTile > 0 && threads > 1) {
    const int64_t perImage = ceilDiv(threads, images);
    if (ceilDiv(pixels, tasks.tile) < perImage) {
      // Multiples of 8 pixels keep the GEMM's column panels whole.
      const int64_t even = ceilDiv(ceilDiv(pixels, perImage), 8) * 8;
      tasks.tile = std::min(tasks.tile, std::max(even, std::min(kMinTile, pixels)));
    }
  }
  tasks.tilesPerImage = ceilDiv(pixels, tasks.tile);
  tasks.count = images * tasks.tilesPerImage;
  tasks.parallel = threads > 1 && tasks.count >= threads;
  return tasks;
}

void ChunkScratch::prepare(int64_t chunks, int64_t floats) {
  buffers_.resize(static_cast<size_t>(std::max<int64_t>(chunks, 1)));
  for (auto& buffer : buffers_) buffer.resize(static_cast<size_t>(floats));
  next_.store(0);
}

ThreadPool& inlinePool() {
  static ThreadPool pool(1);  // no workers: parallelFor runs inline, safe from any thread
  return pool;
}

SingleThreadedBlas::SingleThreadedBlas(GemmSource source) {
  if (source != GemmSource::kBlas) return;
  const int threads = openblas_get_num_threads();
  if (threads > 1) {
    restore_ = threads;
    openblas_set_num_threads(1);
  }
}

SingleThreadedBlas::~SingleThreadedBlas() {
  if (restore_ > 0) openblas_set_num_threads(restore_);
}

void finishRows(float* out, const float* residual, int64_t rows, int64_t length, int64_t rowStride,
                const float* bias, bool biasPerRow, const Epilogue& epilogue) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = out + r * rowStride;
    if (bias && biasPerRow) {
      const float b = bias[r];
      for (int64_t i = 0; i < length; ++i) row[i] += b;
    } else if (bias) {
      for (int64_t i = 0; i < length; ++i) row[i] += bias[i];
    }
    if (residual || !epilogue.empty()) {
      epilogue.apply(row, length, residual ? residual + r * rowStride : nullptr);
    }
  }
}

std::string convTactic(const ConvChoice& choice) {
  if (choice.algo == ConvAlgo::kDirect) return "direct";
  if (choice.algo == ConvAlgo::kDepthwise) return "depthwise";
  std::string tactic = choice.algo == ConvAlgo::kIm2col ? "im2col+" : "pointwise+";
  tactic += choice.gemm().native() ? "native" : "blas";
  if (choice.maxTile > 0) tactic += ".tile" + std::to_string(choice.maxTile);
  const GemmOptions& o = choice.gemm();
  if (!o.native()) return tactic;
  if (o.kc != kDefaultGemmKc) tactic += ".kc" + std::to_string(o.kc);
  if (choice.requestedKernel != "auto") {
    tactic += o.kernel == GemmKernel::kAuto ? ".auto-no-" + choice.requestedKernel
                                            : "." + choice.requestedKernel;
  }
  if (o.blockAKiB != kDefaultGemmBlockAKiB) tactic += ".a" + std::to_string(o.blockAKiB) + "k";
  if (o.blockBKiB != kDefaultGemmBlockBKiB) tactic += ".b" + std::to_string(o.blockBKiB) + "k";
  if (o.split == GemmSplit::kRows) tactic += ".rows";
  if (o.split == GemmSplit::kColumns) tactic += ".columns";
  return tactic;
}

std::unique_ptr<Step> makeConvStep(const ir::Node& node, const knobs::Route& route) {
  const bool kiln = node.domain == ir::kKilnDomain;
  const bool nhwc = kiln && node.opType == "NhwcConv";
  if (!nhwc && !(kiln && node.opType == "FusedConv") &&
      !(node.domain.empty() && node.opType == "Conv")) {
    return nullptr;
  }
  std::optional<Epilogue> epilogue = Epilogue::fromNode(node);
  if (!epilogue) return nullptr;
  const std::string& algo = route.value(kConvAlgo, &node);
  if (algo == "reference") return nullptr;
  const std::optional<ConvShape> shape = ConvShape::fromNode(node, nhwc);
  if (!shape) return nullptr;
  ConvChoice choice{
      .algo = chooseAlgo(algo, *shape),
      .maxTile = route.intValue(kIm2colTile, &node),
      .gemmOptions = gemmOptionsFor(node, route),
      .requestedKernel = route.value(kGemmKernel, &node),
  };
  // A convolution's GEMMs take cpu.conv.precision, not cpu.gemm.precision.
  choice.gemmOptions.precision =
      route.value(kConvPrecision, &node) == "bf16" ? GemmPrecision::kBf16 : GemmPrecision::kFp32;
  std::unique_ptr<Step> step;
  if (nhwc) {
    step = makeNhwcConvStep(*shape, choice, *epilogue);
  } else {
    step = std::make_unique<ConvStep>(*shape, choice, *epilogue);
    step->tactic = convTactic(choice);
  }
  // The direct and depthwise kernels compute in float32 whatever the knob says.
  if (choice.gemm().precision == GemmPrecision::kBf16 &&
      step->tactic.find("direct") == std::string::npos &&
      step->tactic.find("depthwise") == std::string::npos) {
    step->precision = "bf16";
  }
  return step;
}

}  // namespace kiln::cpu
