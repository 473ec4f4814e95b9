// kiln.NhwcConv in float32: the layout pass's convolution, whose input and output are NHWC and
// whose weights are [kH, kW, C/group, M] (so each kernel tap's weights are a [C/group, M] matrix
// and a depthwise tap's a contiguous row over channels).
//
//   - pointwise: the input already is the [N*H*W, C] matrix; one GEMM per row tile and group;
//   - im2col: a row tile's patches are channel-contiguous copies into [tile, kH*kW*C/group];
//   - direct: per output row, taps accumulate along the channels (depthwise: one weight row per
//     tap; otherwise a [C/group, M/group] block per tap and group).
#include <algorithm>
#include <cstring>

#include "kiln/backends/cpu/kernels/conv.h"

// See conv.cc: vectorise the runtime-length channel loops at -O2 too.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

namespace kiln::cpu {

namespace {

// One output row (n, oy) of a direct NHWC convolution: the kernel rows that land inside the
// input, as pointers to their input rows and to their [kW, C/group, M] weights.
struct DirectRow {
  static constexpr int kMaxKernelRows = 64;
  const ConvShape* shape;
  const float* image;  // [H, W, C] of image n
  const float* weights;
  const float* bias;  // [M] or null
  float* out;         // [OW, M]
  const float* inputRows[kMaxKernelRows];
  const float* weightRows[kMaxKernelRows];
  int64_t rows = 0;
};

// Kernel columns [first, last) whose input column lies inside the row, for output column ox.
struct TapColumns {
  int64_t first, last;
};

inline TapColumns tapColumns(const ConvShape& s, int64_t ox) {
  const int64_t ix = ox * s.strideW - s.padLeft;
  int64_t first = 0, last = s.kernelW;
  while (first < last && ix + first * s.dilationW < 0) ++first;
  while (last > first && ix + (last - 1) * s.dilationW >= s.width) --last;
  return {first, last};
}

// 16 floats operated on at once: one AVX-512 register, two AVX2 ones or four SSE ones.
using Floats16 = float __attribute__((vector_size(64)));

// Depthwise (one input and one output channel per group): per output pixel, blocks of 16
// channels accumulate every tap in registers before one store. A channel count that is no
// multiple of 16 ends with a block overlapping the one before, which recomputes (and rewrites)
// the same values.
KILN_VECTOR_CLONES
void depthwiseRow(const DirectRow& r) {
  constexpr int64_t kBlock = 16;
  const ConvShape& s = *r.shape;
  const int64_t c = s.channels;
  const int64_t stepX = s.dilationW * c;
  for (int64_t ox = 0; ox < s.outWidth; ++ox) {
    const TapColumns taps = tapColumns(s, ox);
    const int64_t offset = (ox * s.strideW - s.padLeft) * c;
    float* __restrict out = r.out + ox * c;
    for (int64_t block = 0; block < c; block += kBlock) {
      const int64_t first = block + kBlock <= c ? block : c - kBlock;
      if (first < 0) {  // fewer than 16 channels: one channel at a time
        for (int64_t i = 0; i < c; ++i) {
          float acc = r.bias ? r.bias[i] : 0.0f;
          for (int64_t t = 0; t < r.rows; ++t) {
            for (int64_t kx = taps.first; kx < taps.last; ++kx) {
              acc += r.inputRows[t][offset + kx * stepX + i] * r.weightRows[t][kx * c + i];
            }
          }
          out[i] = acc;
        }
        break;
      }
      // A vector type, so the 16 sums stay in registers across the taps (a float array would
      // round-trip through the stack).
      Floats16 acc = {};
      if (r.bias) std::memcpy(&acc, r.bias + first, sizeof acc);
      for (int64_t t = 0; t < r.rows; ++t) {
        const float* in = r.inputRows[t] + first;
        const float* w = r.weightRows[t] + first;
        for (int64_t kx = taps.first; kx < taps.last; ++kx) {
          Floats16 x, k;
          std::memcpy(&x, in + (offset + kx * stepX), sizeof x);
          std::memcpy(&k, w + kx * c, sizeof k);
          acc += x * k;
        }
      }
      std::memcpy(out + first, &acc, sizeof acc);
    }
  }
}

// Any grouping: per output pixel and tap, each input channel scales its row of the tap's
// [C/group, M] weights into the group's outputs.
KILN_VECTOR_CLONES
void directRowGeneral(const DirectRow& r) {
  const ConvShape& s = *r.shape;
  const int64_t cg = s.groupChannels(), mg = s.groupOutChannels(), m = s.outChannels;
  for (int64_t ox = 0; ox < s.outWidth; ++ox) {
    const TapColumns taps = tapColumns(s, ox);
    float* __restrict acc = r.out + ox * m;
    for (int64_t j = 0; j < m; ++j) acc[j] = r.bias ? r.bias[j] : 0.0f;
    for (int64_t t = 0; t < r.rows; ++t) {
      for (int64_t kx = taps.first; kx < taps.last; ++kx) {
        const float* in =
            r.inputRows[t] + (ox * s.strideW - s.padLeft + kx * s.dilationW) * s.channels;
        const float* tap = r.weightRows[t] + kx * cg * m;
        for (int64_t g = 0; g < s.group; ++g) {
          for (int64_t ci = 0; ci < cg; ++ci) {
            const float v = in[g * cg + ci];
            const float* __restrict w = tap + ci * m + g * mg;
            float* __restrict accG = acc + g * mg;
            for (int64_t j = 0; j < mg; ++j) accG[j] += v * w[j];
          }
        }
      }
    }
  }
}

class NhwcConvStep : public Step {
 public:
  NhwcConvStep(ConvShape shape, ConvChoice choice, Epilogue epilogue)
      : shape_(shape), choice_(choice), epilogue_(epilogue) {}

  // Inputs: X [N, H, W, C], W [kH, kW, C/group, M], B? [M], residual? [N, OH, OW, M].
  Status run(const ExecutionContext& context) const override {
    Operands o;
    o.x = context.data<float>(*inputs[0]);
    o.w = context.data<float>(*inputs[1]);
    o.bias = inputs.size() > 2 && inputs[2] ? context.data<float>(*inputs[2]) : nullptr;
    o.residual = inputs.size() > 3 && inputs[3] ? context.data<float>(*inputs[3]) : nullptr;
    o.y = context.data<float>(*outputs[0]);
    if (choice_.algo == ConvAlgo::kDirect) {
      runDirect(o, context.pool());
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

  // Output pixels of the whole batch are one row space: a task is a tile of rows, every group.
  void runGemm(const Operands& o, ThreadPool& pool) const {
    const ConvShape& s = shape_;
    const ConvTasks tasks = ConvTasks::plan(s.batch * s.pixels(), 1, choice_.maxTile, pool.size());
    const int64_t columnFloats = choice_.algo == ConvAlgo::kIm2col ? tasks.tile * s.patch() : 0;
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

  void runTask(const Operands& o, const ConvTasks& tasks, int64_t task, float* columns,
               ThreadPool* pool) const {
    const ConvShape& s = shape_;
    const int64_t first = task * tasks.tile;
    const int64_t length = std::min(tasks.tile, s.batch * s.pixels() - first);
    const int64_t cg = s.groupChannels(), mg = s.groupOutChannels();
    const int64_t rowGrain = std::max<int64_t>(1, 4096 / std::max<int64_t>(s.patch(), 1));
    for (int64_t g = 0; g < s.group; ++g) {
      const float* a = o.x + first * s.channels + g * cg;  // pointwise: rows of the input
      int64_t lda = s.channels;
      if (choice_.algo == ConvAlgo::kIm2col) {
        const auto fill = [&](int64_t begin, int64_t end) {
          fillColumns(o.x, g, first + begin, end - begin, columns + begin * s.patch());
        };
        if (pool) {
          pool->parallelFor(length, rowGrain, fill);
        } else {
          fill(0, length);
        }
        a = columns;
        lda = s.patch();
      }
      sgemm(choice_.gemm(),
            GemmArgs{.m = length,
                     .n = mg,
                     .k = s.patch(),
                     .a = a,
                     .lda = lda,
                     .b = o.w + g * mg,
                     .ldb = s.outChannels,
                     .c = o.y + first * s.outChannels + g * mg,
                     .ldc = s.outChannels},
            pool ? *pool : inlinePool());
    }
    const auto finish = [&](int64_t begin, int64_t end) {
      const int64_t offset = (first + begin) * s.outChannels;
      finishRows(o.y + offset, o.residual ? o.residual + offset : nullptr, end - begin,
                 s.outChannels, s.outChannels, o.bias, false, epilogue_);
    };
    if (pool) {
      pool->parallelFor(length, std::max<int64_t>(1, 4096 / s.outChannels), finish);
    } else {
      finish(0, length);
    }
  }

  // `count` rows of group g's columns from output row `row` on: per output pixel, the
  // [kH, kW, C/group] patch around it (zero in the padding). Without groups or dilation, a
  // kernel row's taps are one contiguous run of the input row, copied at once.
  void fillColumns(const float* x, int64_t g, int64_t row, int64_t count, float* out) const {
    const ConvShape& s = shape_;
    const int64_t cg = s.groupChannels();
    const bool runs = s.group == 1 && s.dilationW == 1;
    for (int64_t r = row; r < row + count; ++r) {
      const int64_t n = r / s.pixels(), oy = r % s.pixels() / s.outWidth, ox = r % s.outWidth;
      const TapColumns taps = tapColumns(s, ox);
      const int64_t ix = ox * s.strideW - s.padLeft;
      for (int64_t ky = 0; ky < s.kernelH; ++ky, out += s.kernelW * cg) {
        const int64_t iy = oy * s.strideH - s.padTop + ky * s.dilationH;
        if (iy < 0 || iy >= s.height || taps.first == taps.last) {
          std::fill(out, out + s.kernelW * cg, 0.0f);
          continue;
        }
        const float* in = x + ((n * s.height + iy) * s.width) * s.channels + g * cg;
        std::fill(out, out + taps.first * cg, 0.0f);
        if (runs) {
          std::memcpy(out + taps.first * cg, in + (ix + taps.first) * s.channels,
                      sizeof(float) * cg * (taps.last - taps.first));
        } else {
          for (int64_t kx = taps.first; kx < taps.last; ++kx) {
            std::memcpy(out + kx * cg, in + (ix + kx * s.dilationW) * s.channels,
                        sizeof(float) * cg);
          }
        }
        std::fill(out + taps.last * cg, out + s.kernelW * cg, 0.0f);
      }
    }
  }

  // Output rows (n, oy) spread over the threads; each row's epilogue runs right after it.
  void runDirect(const Operands& o, ThreadPool& pool) const {
    const ConvShape& s = shape_;
    const int64_t rowWork = std::max<int64_t>(1, s.outWidth * s.outChannels * s.patch());
    pool.parallelFor(s.batch * s.outHeight, std::max<int64_t>(1, 16384 / rowWork),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t row = begin; row < end; ++row) directRow(o, row);
                     });
  }

  void directRow(const Operands& o, int64_t row) const {
    const ConvShape& s = shape_;
    const int64_t n = row / s.outHeight, oy = row % s.outHeight;
    DirectRow r{.shape = &s,
                .image = o.x + n * s.height * s.width * s.channels,
                .weights = o.w,
                .bias = o.bias,
                .out = o.y + row * s.outWidth * s.outChannels};
    for (int64_t ky = 0; ky < s.kernelH; ++ky) {
      const int64_t iy = oy * s.strideH - s.padTop + ky * s.dilationH;
      if (iy < 0 || iy >= s.height) continue;
      r.inputRows[r.rows] = r.image + iy * s.width * s.channels;
      r.weightRows[r.rows] = o.w + ky * s.kernelW * s.groupChannels() * s.outChannels;
      ++r.rows;
    }
    if (s.groupChannels() == 1 && s.groupOutChannels() == 1) {
      depthwiseRow(r);
    } else {
      directRowGeneral(r);
    }
    const int64_t length = s.outWidth * s.outChannels;
    finishRows(r.out, o.residual ? o.residual + row * length : nullptr, 1, length, length, nullptr,
               false, epilogue_);
  }

  ConvShape shape_;
  ConvChoice choice_;
  Epilogue epilogue_;
  mutable ChunkScratch scratch_;  // im2col columns; a plan runs on one thread at a time
};

}  // namespace

std::unique_ptr<Step> makeNhwcConvStep(const ConvShape& shape, const ConvChoice& choice,
                                       const Epilogue& epilogue) {
  ConvChoice chosen = choice;
  // The depthwise kernel is NCHW's; NHWC's direct kernel already runs depthwise rows along the
  // channels.
  if (chosen.algo == ConvAlgo::kDepthwise) chosen.algo = ConvAlgo::kDirect;
  // The direct kernel keeps each output row's kernel rows on the stack.
  if (chosen.algo == ConvAlgo::kDirect && shape.kernelH > DirectRow::kMaxKernelRows) {
    chosen.algo = ConvAlgo::kIm2col;
  }
  auto step = std::make_unique<NhwcConvStep>(shape, chosen, epilogue);
  const bool depthwise = shape.groupChannels() == 1 && shape.groupOutChannels() == 1;
  step->tactic = chosen.algo == ConvAlgo::kDirect && depthwise ? "nhwc.depthwise"
                                                               : "nhwc." + convTactic(chosen);
  step->layout = "nhwc";
  return step;
}

}  // namespace kiln::cpu
