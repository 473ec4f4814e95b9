// Pooling in float32 on 4-D tensors: MaxPool, AveragePool and the global pools on NCHW, and the
// layout pass's kiln.NhwcMaxPool, NhwcAveragePool, NhwcGlobalAveragePool and NhwcGlobalMaxPool on
// NHWC, whose inner loops run along the contiguous channels. Each axis's window bounds are
// computed once at build time so the run loops do no bounds checks; NCHW windows wholly inside
// the input reduce their kernel rows, then their kernel columns, vectorised along the row. NCHW
// work spreads over the threads by planes, NHWC work by output rows (window pools) or channel
// blocks (global pools).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/neural.h"

// RelWithDebInfo builds at -O2, where GCC 12 vectorises only loops whose trip count it knows to
// be a multiple of the vector width; the NHWC channel loops have runtime extents.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic")
#endif

namespace kiln::cpu {

const knobs::Knob kPoolImpl = knobs::declareKnob({
    .name = "cpu.pool.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "MaxPool, AveragePool and the global pools: float32 loops, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

// Elements a parallelFor chunk should at least touch: below this, waking a thread costs more
// than the work.
constexpr int64_t kGrainWork = 16384;

// One output position's window along one axis: kernel offsets [first, last) land inside the
// input; `padded` counts the offsets inside the padded extent (count_include_pad's divisor).
struct AxisWindow {
  int64_t first, last, start, padded;  // start: input coordinate of kernel offset 0
};

std::vector<AxisWindow> axisWindows(const ir::WindowGeometry& g, size_t axis) {
  std::vector<AxisWindow> windows;
  for (int64_t o = 0; o < g.output[axis]; ++o) {
    AxisWindow w{g.kernel[axis], g.kernel[axis], o * g.strides[axis] - g.padsBegin[axis], 0};
    int64_t first = -1, last = -1;
    for (int64_t k = 0; k < g.kernel[axis]; ++k) {
      const int64_t coord = w.start + k * g.dilations[axis];
      if (coord >= 0 && coord < g.input[axis]) {
        if (first < 0) first = k;
        last = k + 1;
      }
      if (coord >= -g.padsBegin[axis] && coord < g.input[axis] + g.padsEnd[axis]) ++w.padded;
    }
    if (first >= 0) {
      w.first = first;
      w.last = last;
    } else {
      w.first = w.last = 0;
    }
    windows.push_back(w);
  }
  return windows;
}

// The windows wholly inside the input of output rows or columns [first, last): a contiguous
// range, as windows move monotonically.
struct Interior {
  int64_t first, last;
};

Interior interiorOf(const std::vector<AxisWindow>& windows, int64_t kernel) {
  Interior interior{0, 0};
  for (int64_t o = 0; o < static_cast<int64_t>(windows.size()); ++o) {
    const AxisWindow& w = windows[static_cast<size_t>(o)];
    if (w.first != 0 || w.last != kernel) continue;
    if (interior.first == interior.last) interior.first = o;
    interior.last = o + 1;
  }
  return interior;
}

// The max keeps the reference's rule: NaN loses to any number, but a window of NaNs stays NaN
// (`acc` starts as the window's first tap, or NaN). As the max of the window's numbers it does
// not depend on the order the taps come in. Written as a max (acc where unordered) and a select,
// GCC makes it branch-free in the scalar remainders of the loops too: with `v > acc || acc != acc`,
// their mispredicted branches on random data made squeezenet's first pool 2.5x slower.
template <bool Max>
[[gnu::always_inline]] inline float combine(float acc, float v) {
  if constexpr (Max) {
    const float larger = v > acc ? v : acc;
    return acc != acc ? v : larger;
  } else {
    return acc + v;
  }
}

// Output columns of one output row whose windows lie wholly inside the input, as two separable
// passes: the window's kernel rows reduced column by column into a row of scratch (contiguous
// loads), then that row's kernel columns reduced into the outputs. Stride 2 splits the scratch
// row into its even and odd columns, so that each kernel column reads consecutive floats too.
// Output columns go in blocks of kRowBlock, the scratch staying on the stack and in L1.
struct SeparableRow {
  const float* in;  // the input row under kernel row 0, from the first output's kernel column 0
  int64_t rowStep;  // floats between consecutive kernel rows: dilation * input width
  int64_t kernelH, kernelW, strideW, dilationW;
  int64_t count;  // output columns
  float* out;
};

constexpr int64_t kRowBlock = 256;
constexpr int64_t kSpan = 1024;  // scratch floats: kRowBlock windows of stride 2 and a wide kernel

// The input columns that `outputs` consecutive windows span.
int64_t blockSpan(int64_t outputs, int64_t stride, int64_t kernel, int64_t dilation) {
  return (outputs - 1) * stride + (kernel - 1) * dilation + 1;
}

// Any kernel, stride 1 or 2, any dilation: one pass per kernel row, then per kernel column.
template <bool Max>
[[gnu::always_inline]] inline void separableRow(const SeparableRow& r) {
  float column[kSpan], even[kSpan / 2], odd[kSpan / 2], row[kRowBlock];
  for (int64_t done = 0; done < r.count; done += kRowBlock) {
    const int64_t n = std::min(kRowBlock, r.count - done);
    const int64_t span = blockSpan(n, r.strideW, r.kernelW, r.dilationW);
    const float* in = r.in + done * r.strideW;
    // The kernel rows, column by column.
    const float* v = in;
    if (r.kernelH > 1) {
      float* __restrict to = column;
      const float* __restrict row0 = in;
      const float* __restrict row1 = in + r.rowStep;
      for (int64_t i = 0; i < span; ++i) to[i] = combine<Max>(row0[i], row1[i]);
      for (int64_t ky = 2; ky < r.kernelH; ++ky) {
        const float* __restrict next = in + ky * r.rowStep;
        for (int64_t i = 0; i < span; ++i) to[i] = combine<Max>(to[i], next[i]);
      }
      v = column;
    }
    if (r.strideW == 2) {
      for (int64_t j = 0; j < (span + 1) / 2; ++j) even[j] = v[2 * j];
      for (int64_t j = 0; j < span / 2; ++j) odd[j] = v[2 * j + 1];
    }
    // Output i's kernel column at offset t = kx * dilation: v[i + t] at stride 1; at stride 2,
    // v[2i + t], which is phase t % 2's float i + t / 2.
    const auto tapAt = [&](int64_t kx) -> const float* {
      const int64_t t = kx * r.dilationW;
      if (r.strideW == 1) return v + t;
      return (t % 2 == 0 ? even : odd) + t / 2;
    };
    // Then the kernel columns, the last one's pass storing the outputs (a copy at the end was
    // an expensive `rep movs` on rows this short).
    const float* acc = tapAt(0);
    if (r.kernelW > 2) {
      float* __restrict sum = row;
      const float* __restrict tap0 = acc;
      const float* __restrict tap1 = tapAt(1);
      for (int64_t i = 0; i < n; ++i) sum[i] = combine<Max>(tap0[i], tap1[i]);
      for (int64_t kx = 2; kx + 1 < r.kernelW; ++kx) {
        const float* __restrict next = tapAt(kx);
        for (int64_t i = 0; i < n; ++i) sum[i] = combine<Max>(sum[i], next[i]);
      }
      acc = sum;
    }
    const float* __restrict from = acc;
    const float* __restrict last = tapAt(r.kernelW - 1);
    float* __restrict out = r.out + done;
    const float count = static_cast<float>(r.kernelH * r.kernelW);
    if (r.kernelW == 1) {
      for (int64_t i = 0; i < n; ++i) out[i] = Max ? from[i] : from[i] / count;
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const float value = combine<Max>(from[i], last[i]);
        out[i] = Max ? value : value / count;
      }
    }
  }
}

// Input column i's kernel rows [KY, KH) added to `acc`, `step` floats apart: recursion, as
// kernelColumns.
template <bool Max, int KH, int KY = 1>
[[gnu::always_inline]] inline float kernelRows(const float* __restrict in, int64_t step, int64_t i,
                                               float acc) {
  if constexpr (KY == KH) {
    return acc;
  } else {
    return kernelRows<Max, KH, KY + 1>(in, step, i, combine<Max>(acc, in[KY * step + i]));
  }
}

// Output i's kernel columns [KX, KW) added to `acc`: column kx is v[i + kx] at stride 1, and
// at stride 2 phase kx % 2's column i + kx / 2. Recursion rather than a loop over kx, which made
// GCC leave the loop over i scalar.
template <bool Max, int KW, int SW, int KX = 1>
[[gnu::always_inline]] inline float kernelColumns(const float* __restrict even,
                                                  const float* __restrict odd, int64_t i,
                                                  float acc) {
  if constexpr (KX == KW) {
    return acc;
  } else {
    const float v = SW == 1 ? even[i + KX] : (KX % 2 == 0 ? even : odd)[i + KX / 2];
    return kernelColumns<Max, KW, SW, KX + 1>(even, odd, i, combine<Max>(acc, v));
  }
}

// A KH x KW kernel of stride SW and no column dilation, known when compiled: the kernel rows go
// in one pass (at stride 2, straight into the even and odd columns), the kernel columns in
// another. Against separableRow: 1.2x on a 3x3 stride-2 MaxPool, 1.5x on that AveragePool, 1.8x
// on 2x2 stride 2 and 2x on 3x3 stride 1.
template <bool Max, int KH, int KW, int SW>
[[gnu::always_inline]] inline void fixedRow(const SeparableRow& r) {
  float evenColumns[kSpan], oddColumns[kSpan / 2];  // stride 1: every column in evenColumns
  for (int64_t done = 0; done < r.count; done += kRowBlock) {
    const int64_t n = std::min(kRowBlock, r.count - done);
    const int64_t span = blockSpan(n, SW, KW, 1);
    const float* __restrict in = r.in + done * SW;
    float* __restrict even = evenColumns;
    float* __restrict odd = oddColumns;
    if constexpr (SW == 2) {
      for (int64_t j = 0; j < span / 2; ++j) {
        even[j] = kernelRows<Max, KH>(in, r.rowStep, 2 * j, in[2 * j]);
        odd[j] = kernelRows<Max, KH>(in, r.rowStep, 2 * j + 1, in[2 * j + 1]);
      }
      if (span % 2 == 1)
        even[span / 2] = kernelRows<Max, KH>(in, r.rowStep, span - 1, in[span - 1]);
    } else {
      for (int64_t i = 0; i < span; ++i) even[i] = kernelRows<Max, KH>(in, r.rowStep, i, in[i]);
    }
    float* __restrict out = r.out + done;
    for (int64_t i = 0; i < n; ++i) {
      const float acc = kernelColumns<Max, KW, SW>(even, odd, i, even[i]);
      out[i] = Max ? acc : acc / static_cast<float>(KH * KW);
    }
  }
}

using RowKernel = void (*)(const SeparableRow&);

KILN_ELTWISE_CLONES void maxRow(const SeparableRow& r) { separableRow<true>(r); }
KILN_ELTWISE_CLONES void averageRow(const SeparableRow& r) { separableRow<false>(r); }
KILN_ELTWISE_CLONES void maxRow3x3s2(const SeparableRow& r) { fixedRow<true, 3, 3, 2>(r); }
KILN_ELTWISE_CLONES void averageRow3x3s2(const SeparableRow& r) { fixedRow<false, 3, 3, 2>(r); }
KILN_ELTWISE_CLONES void maxRow2x2s2(const SeparableRow& r) { fixedRow<true, 2, 2, 2>(r); }
KILN_ELTWISE_CLONES void averageRow2x2s2(const SeparableRow& r) { fixedRow<false, 2, 2, 2>(r); }
KILN_ELTWISE_CLONES void maxRow3x3s1(const SeparableRow& r) { fixedRow<true, 3, 3, 1>(r); }
KILN_ELTWISE_CLONES void averageRow3x3s1(const SeparableRow& r) { fixedRow<false, 3, 3, 1>(r); }

// The separable row kernel of a window geometry; null where it does not apply (column stride
// above 2, or windows too wide for the scratch).
RowKernel rowKernelFor(const ir::WindowGeometry& g, bool max) {
  const int64_t kh = g.kernel[0], kw = g.kernel[1], stride = g.strides[1];
  if ((stride != 1 && stride != 2) || blockSpan(kRowBlock, stride, kw, g.dilations[1]) > kSpan) {
    return nullptr;
  }
  if (g.dilations[1] == 1 && kh == kw && (kh == 3 || (kh == 2 && stride == 2))) {
    if (kh == 2) return max ? maxRow2x2s2 : averageRow2x2s2;
    if (stride == 2) return max ? maxRow3x3s2 : averageRow3x3s2;
    return max ? maxRow3x3s1 : averageRow3x3s1;
  }
  return max ? maxRow : averageRow;
}

// Each output row's interior windows (wholly inside the input) go through a separable row
// kernel where the column stride is 1 or 2 (sums by kernel rows first). The rest, and every window
// of other strides, are built tap by tap: for kernel offset (ky, kx), every output column whose
// window holds that tap takes it in one loop over the row, with no per-element bounds checks;
// sums run in the same (ky, kx) order per output as a window-at-a-time loop would.
class WindowPoolStep : public Step {
 public:
  WindowPoolStep(const ir::WindowGeometry& g, int64_t planes, bool max, bool countIncludePad)
      : g_(g),
        planes_(planes),
        max_(max),
        countIncludePad_(countIncludePad),
        rows_(axisWindows(g, 0)),
        cols_(axisWindows(g, 1)),
        rowKernel_(rowKernelFor(g, max)) {
    // The output columns whose window holds kernel column kx inside the input.
    for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
      int64_t first = g.output[1], last = 0;
      for (int64_t ox = 0; ox < g.output[1]; ++ox) {
        const AxisWindow& c = cols_[static_cast<size_t>(ox)];
        if (kx >= c.first && kx < c.last) {
          first = std::min(first, ox);
          last = ox + 1;
        }
      }
      tapColumns_.push_back({std::min(first, last), last});
    }
    if (rowKernel_) {
      interiorRows_ = interiorOf(rows_, g.kernel[0]);
      interiorCols_ = interiorOf(cols_, g.kernel[1]);
    }
  }

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    const int64_t planeIn = g_.input[0] * g_.input[1], planeOut = g_.output[0] * g_.output[1];
    const int64_t planeWork = std::max<int64_t>(1, planeOut * g_.kernel[0] * g_.kernel[1]);
    context.pool().parallelFor(planes_, std::max<int64_t>(1, kGrainWork / planeWork),
                               [&](int64_t begin, int64_t end) {
                                 for (int64_t plane = begin; plane < end; ++plane) {
                                   runPlane(x + plane * planeIn, y + plane * planeOut);
                                 }
                               });
    return Status::ok();
  }

 private:
  struct Columns {
    int64_t first, last;
  };

  void runPlane(const float* in, float* out) const {
    const Interior cols = interiorCols_;
    for (int64_t oy = 0; oy < g_.output[0]; ++oy) {
      if (oy < interiorRows_.first || oy >= interiorRows_.last || cols.first == cols.last) {
        tapRow(in, out, oy, 0, g_.output[1]);
        continue;
      }
      tapRow(in, out, oy, 0, cols.first);
      const AxisWindow& r = rows_[static_cast<size_t>(oy)];
      const SeparableRow row{
          .in = in + r.start * g_.input[1] + cols_[static_cast<size_t>(cols.first)].start,
          .rowStep = g_.dilations[0] * g_.input[1],
          .kernelH = g_.kernel[0],
          .kernelW = g_.kernel[1],
          .strideW = g_.strides[1],
          .dilationW = g_.dilations[1],
          .count = cols.last - cols.first,
          .out = out + oy * g_.output[1] + cols.first};
      rowKernel_(row);
      tapRow(in, out, oy, cols.last, g_.output[1]);
    }
  }

  // Output columns [a, b) of output row oy, tap by tap.
  void tapRow(const float* in, float* out, int64_t oy, int64_t a, int64_t b) const {
    if (a >= b) return;
    const int64_t inW = g_.input[1], outW = g_.output[1];
    const int64_t strideW = g_.strides[1], dilH = g_.dilations[0], dilW = g_.dilations[1];
    const int64_t padLeft = g_.padsBegin[1];
    // NaN seeds the max: any number beats it and NaN taps keep it, so a window of NaNs stays
    // NaN while NaN loses to any number (the reference rule).
    const float seed = max_ ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
    const AxisWindow& r = rows_[static_cast<size_t>(oy)];
    float* __restrict o = out + oy * outW;
    std::fill(o + a, o + b, seed);
    for (int64_t ky = r.first; ky < r.last; ++ky) {
      const float* __restrict row = in + (r.start + ky * dilH) * inW;
      for (int64_t kx = 0; kx < g_.kernel[1]; ++kx) {
        const Columns cols = tapColumns_[static_cast<size_t>(kx)];
        const int64_t first = std::max(cols.first, a), last = std::min(cols.last, b);
        const int64_t offset = kx * dilW - padLeft;
        if (max_) {
          for (int64_t ox = first; ox < last; ++ox) {
            o[ox] = combine<true>(o[ox], row[ox * strideW + offset]);
          }
        } else {
          for (int64_t ox = first; ox < last; ++ox) o[ox] += row[ox * strideW + offset];
        }
      }
    }
    for (int64_t ox = a; ox < b; ++ox) {
      const AxisWindow& c = cols_[static_cast<size_t>(ox)];
      if (max_) {
        // A window wholly in padding yields -inf, as the reference kernel's does.
        if (r.first == r.last || c.first == c.last) o[ox] = -std::numeric_limits<float>::infinity();
      } else {
        const int64_t count =
            countIncludePad_ ? r.padded * c.padded : (r.last - r.first) * (c.last - c.first);
        o[ox] /= static_cast<float>(count);
      }
    }
  }

  ir::WindowGeometry g_;
  int64_t planes_;
  bool max_, countIncludePad_;
  std::vector<AxisWindow> rows_, cols_;
  std::vector<Columns> tapColumns_;  // per kernel column
  RowKernel rowKernel_;              // null: every row tap by tap
  // Output rows and columns whose windows rowKernel_ takes; empty without one.
  Interior interiorRows_{0, 0}, interiorCols_{0, 0};
};

class GlobalPoolStep : public Step {
 public:
  GlobalPoolStep(int64_t planes, int64_t planeSize, bool max)
      : planes_(planes), planeSize_(planeSize), max_(max) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    context.pool().parallelFor(
        planes_, std::max<int64_t>(1, kGrainWork / planeSize_), [&](int64_t begin, int64_t end) {
          for (int64_t plane = begin; plane < end; ++plane) {
            const float* in = x + plane * planeSize_;
            if (max_) {
              float best = -std::numeric_limits<float>::infinity();
              for (int64_t i = 0; i < planeSize_; ++i) best = std::max(best, in[i]);
              y[plane] = best;
            } else {
              // Double accumulation: large planes would otherwise lose low bits of the mean.
              double sum = 0.0;
              for (int64_t i = 0; i < planeSize_; ++i) sum += in[i];
              y[plane] = static_cast<float>(sum / static_cast<double>(planeSize_));
            }
          }
        });
    return Status::ok();
  }

 private:
  int64_t planes_, planeSize_;
  bool max_;
};

// One NHWC output pixel: its window's taps (channel rows of the input, `count` of them, none for
// a window wholly in padding) reduced element by element into `out`'s channel row. Rows of 8
// channels or more go by blocks held in registers over all taps (squeezenet's three pools at 2
// threads: 0.35 ms before, when every tap read and wrote `out`, 0.21 ms after); shorter ones
// combine the first two taps straight into `out`. combine<> keeps the reference's NaN rule
// branch-free, and the clones run the channel loops on AVX-512 or AVX2: with the branchy form on
// SSE2, squeezenet's first pool took 0.29 ms at 2 threads.
// 8 floats at once: one AVX register, two SSE ones. Not 16: GCC lowers comparisons of 64-byte
// vectors (AVX-512 compares into mask registers) to scalar code, even in the AVX-512 clone.
using Floats8 = float __attribute__((vector_size(32)));
using Ints8 = int32_t __attribute__((vector_size(32)));

// `Vectors` blocks of 8 channels from `at`, every tap accumulated in registers before one store
// (combined in tap order, as the scalar loops below, so the results are the same bits). No
// function takes or returns a vector: that would change the ABI between the clones.
template <bool Max, int Vectors>
[[gnu::always_inline]] inline void reduceBlock(const float* const* taps, int64_t count, int64_t at,
                                               float* __restrict out, float divisor) {
  Floats8 acc[Vectors];
  for (int v = 0; v < Vectors; ++v) std::memcpy(&acc[v], taps[0] + at + 8 * v, sizeof acc[v]);
  for (int64_t t = 1; t < count; ++t) {
    const float* tap = taps[t] + at;
    for (int v = 0; v < Vectors; ++v) {
      Floats8 x;
      std::memcpy(&x, tap + 8 * v, sizeof x);
      if constexpr (Max) {
        // combine<true> lane by lane: x where it is larger or the accumulator is NaN. As masks
        // and bit operations: GCC turns ?: on float vectors into scalar code.
        const Ints8 pick = (x > acc[v]) | (acc[v] != acc[v]);
        acc[v] = reinterpret_cast<Floats8>((reinterpret_cast<Ints8>(x) & pick) |
                                           (reinterpret_cast<Ints8>(acc[v]) & ~pick));
      } else {
        acc[v] += x;
      }
    }
  }
  for (int v = 0; v < Vectors; ++v) {
    const Floats8 result = Max ? acc[v] : acc[v] / divisor;
    std::memcpy(out + at + 8 * v, &result, sizeof result);
  }
}

template <bool Max>
[[gnu::always_inline]] inline void reducePixel(const float* const* taps, int64_t count, int64_t c,
                                               float* __restrict out, float divisor) {
  if (count > 0 && c >= 8) {
    int64_t at = 0;
    for (; at + 64 <= c; at += 64) reduceBlock<Max, 8>(taps, count, at, out, divisor);
    for (; at + 8 <= c; at += 8) reduceBlock<Max, 1>(taps, count, at, out, divisor);
    // The last channels as a block overlapping the one before, whose values it writes again.
    if (at < c) reduceBlock<Max, 1>(taps, count, c - 8, out, divisor);
    return;
  }
  if (count == 0) {
    // A window wholly in padding: -inf for the max, as the reference kernel's; 0 over the
    // divisor for the average.
    const float empty = Max ? -std::numeric_limits<float>::infinity() : 0.0f / divisor;
    std::fill(out, out + c, empty);
    return;
  }
  const float* __restrict first = taps[0];
  if (count == 1) {
    for (int64_t i = 0; i < c; ++i) out[i] = Max ? first[i] : first[i] / divisor;
    return;
  }
  const float* __restrict second = taps[1];
  for (int64_t i = 0; i < c; ++i) out[i] = combine<Max>(first[i], second[i]);
  for (int64_t t = 2; t < count; ++t) {
    const float* __restrict next = taps[t];
    for (int64_t i = 0; i < c; ++i) out[i] = combine<Max>(out[i], next[i]);
  }
  if constexpr (!Max) {
    for (int64_t i = 0; i < c; ++i) out[i] /= divisor;
  }
}

KILN_ELTWISE_CLONES void maxPixel(const float* const* taps, int64_t count, int64_t c, float* out) {
  reducePixel<true>(taps, count, c, out, 1.0f);
}
KILN_ELTWISE_CLONES void averagePixel(const float* const* taps, int64_t count, int64_t c,
                                      float* out, float divisor) {
  reducePixel<false>(taps, count, c, out, divisor);
}

// kiln.NhwcMaxPool / NhwcAveragePool on [N, H, W, C]: per output pixel, the window's taps are
// whole channel rows, reduced element by element into the output's channel row.
class NhwcWindowPoolStep : public Step {
 public:
  NhwcWindowPoolStep(const ir::WindowGeometry& g, int64_t batch, int64_t channels, bool max,
                     bool countIncludePad)
      : g_(g),
        batch_(batch),
        channels_(channels),
        max_(max),
        countIncludePad_(countIncludePad),
        rows_(axisWindows(g, 0)),
        cols_(axisWindows(g, 1)) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    const int64_t rowWork =
        std::max<int64_t>(1, g_.output[1] * channels_ * g_.kernel[0] * g_.kernel[1]);
    context.pool().parallelFor(batch_ * g_.output[0], std::max<int64_t>(1, kGrainWork / rowWork),
                               [&](int64_t begin, int64_t end) {
                                 for (int64_t row = begin; row < end; ++row) runRow(x, y, row);
                               });
    return Status::ok();
  }

 private:
  void runRow(const float* x, float* y, int64_t row) const {
    const int64_t inH = g_.input[0], inW = g_.input[1], outH = g_.output[0], outW = g_.output[1];
    const int64_t dilH = g_.dilations[0], dilW = g_.dilations[1], c = channels_;
    const int64_t n = row / outH;
    const AxisWindow& r = rows_[static_cast<size_t>(row % outH)];
    std::vector<const float*> taps;
    taps.reserve(static_cast<size_t>(g_.kernel[0] * g_.kernel[1]));
    for (int64_t ox = 0; ox < outW; ++ox) {
      const AxisWindow& w = cols_[static_cast<size_t>(ox)];
      taps.clear();
      for (int64_t ky = r.first; ky < r.last; ++ky) {
        const int64_t iy = r.start + ky * dilH;
        for (int64_t kx = w.first; kx < w.last; ++kx) {
          taps.push_back(x + ((n * inH + iy) * inW + w.start + kx * dilW) * c);
        }
      }
      float* out = y + (row * outW + ox) * c;
      const auto count = static_cast<int64_t>(taps.size());
      if (max_) {
        maxPixel(taps.data(), count, c, out);
      } else {
        const int64_t divisor =
            countIncludePad_ ? r.padded * w.padded : (r.last - r.first) * (w.last - w.first);
        averagePixel(taps.data(), count, c, out, static_cast<float>(divisor));
      }
    }
  }

  ir::WindowGeometry g_;
  int64_t batch_, channels_;
  bool max_, countIncludePad_;
  std::vector<AxisWindow> rows_, cols_;
};

// kiln.NhwcGlobalAveragePool / NhwcGlobalMaxPool on [N, H, W, C]: blocks of channels of one image
// are reduced over every pixel, the block's accumulators staying in L1.
class NhwcGlobalPoolStep : public Step {
 public:
  NhwcGlobalPoolStep(int64_t batch, int64_t pixels, int64_t channels, bool max)
      : batch_(batch), pixels_(pixels), channels_(channels), max_(max) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    const int64_t blocks = (channels_ + kBlock - 1) / kBlock;
    const int64_t blockWork = std::max<int64_t>(1, pixels_ * std::min(kBlock, channels_));
    context.pool().parallelFor(batch_ * blocks, std::max<int64_t>(1, kGrainWork / blockWork),
                               [&](int64_t begin, int64_t end) {
                                 for (int64_t task = begin; task < end; ++task) {
                                   runBlock(x, y, task / blocks, task % blocks * kBlock);
                                 }
                               });
    return Status::ok();
  }

 private:
  static constexpr int64_t kBlock = 64;

  void runBlock(const float* x, float* y, int64_t n, int64_t first) const {
    const int64_t width = std::min(kBlock, channels_ - first);
    const float* in = x + n * pixels_ * channels_ + first;
    float* out = y + n * channels_ + first;
    if (max_) {
      float best[kBlock];
      std::fill(best, best + width, -std::numeric_limits<float>::infinity());
      for (int64_t p = 0; p < pixels_; ++p) {
        const float* row = in + p * channels_;
        for (int64_t i = 0; i < width; ++i) best[i] = std::max(best[i], row[i]);
      }
      std::copy(best, best + width, out);
      return;
    }
    // Double accumulation, as the NCHW kernel: large planes would otherwise lose low bits.
    double sum[kBlock] = {};
    for (int64_t p = 0; p < pixels_; ++p) {
      const float* row = in + p * channels_;
      for (int64_t i = 0; i < width; ++i) sum[i] += row[i];
    }
    for (int64_t i = 0; i < width; ++i) {
      out[i] = static_cast<float>(sum[i] / static_cast<double>(pixels_));
    }
  }

  int64_t batch_, pixels_, channels_;
  bool max_;
};

std::unique_ptr<Step> makeNhwcPoolStep(const ir::Node& node) {
  const std::string& op = node.opType;
  const bool global = op == "NhwcGlobalAveragePool" || op == "NhwcGlobalMaxPool";
  if (!global && op != "NhwcMaxPool" && op != "NhwcAveragePool") return nullptr;
  const ir::Value* x = node.inputs.empty() ? nullptr : node.inputs[0];
  if (!x || x->dtype != ir::DType::kFloat32 || x->shape.rank() != 4) return nullptr;
  const ir::Shape& s = x->shape;
  std::unique_ptr<Step> step;
  if (global) {
    if (s[1] * s[2] == 0) return nullptr;  // as for NCHW: the reference kernel's business
    step = std::make_unique<NhwcGlobalPoolStep>(s[0], s[1] * s[2], s[3], op == "NhwcGlobalMaxPool");
  } else {
    auto geometry = ir::resolvePoolGeometry(node, ir::Shape{s[0], s[3], s[1], s[2]});
    auto countIncludePad = node.getInt("count_include_pad", 0);
    if (!geometry.isOk() || !countIncludePad.isOk() || geometry->spatialRank() != 2) {
      return nullptr;
    }
    step = std::make_unique<NhwcWindowPoolStep>(*geometry, s[0], s[3], op == "NhwcMaxPool",
                                                *countIncludePad != 0);
  }
  step->tactic = global ? "nhwc.global_pool" : "nhwc.window_pool";
  step->layout = "nhwc";
  return step;
}

}  // namespace

std::unique_ptr<Step> makePoolStep(const ir::Node& node, const knobs::Route& route) {
  if (node.domain == ir::kKilnDomain) {
    return route.value(kPoolImpl, &node) == "fast" ? makeNhwcPoolStep(node) : nullptr;
  }
  if (!node.domain.empty()) return nullptr;
  const bool global = node.opType == "GlobalAveragePool" || node.opType == "GlobalMaxPool";
  if (!global && node.opType != "MaxPool" && node.opType != "AveragePool") return nullptr;
  if (route.value(kPoolImpl, &node) != "fast") return nullptr;
  const ir::Value* x = node.inputs.empty() ? nullptr : node.inputs[0];
  if (!x || x->dtype != ir::DType::kFloat32 || x->shape.rank() != 4) return nullptr;
  // MaxPool's Indices output is left to the reference kernel.
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (node.outputs[i]) return nullptr;
  }
  const int64_t planes = x->shape[0] * x->shape[1];
  std::unique_ptr<Step> step;
  if (global) {
    const int64_t planeSize = x->shape[2] * x->shape[3];
    // The max of an empty plane and the mean of one are the reference kernel's business.
    if (planeSize == 0) return nullptr;
    step = std::make_unique<GlobalPoolStep>(planes, planeSize, node.opType == "GlobalMaxPool");
  } else {
    auto geometry = ir::resolvePoolGeometry(node, x->shape);
    auto countIncludePad = node.getInt("count_include_pad", 0);
    if (!geometry.isOk() || !countIncludePad.isOk() || geometry->spatialRank() != 2) {
      return nullptr;
    }
    step = std::make_unique<WindowPoolStep>(*geometry, planes, node.opType == "MaxPool",
                                            *countIncludePad != 0);
  }
  step->tactic = global ? "fast.global_pool" : "fast.window_pool";
  return step;
}

}  // namespace kiln::cpu
