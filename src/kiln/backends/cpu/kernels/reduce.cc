// ReduceSum, ReduceMean, ReduceMax and ReduceMin on float32 over any axes (constant), either
// keepdims. At build time the input's axes are merged into alternating kept / reduced segments
// (size-1 axes dropped), which picks the loop:
//
//   [K, R]      rows: each output is the reduction of one contiguous row (the last-axis case, and
//               the spatial axes {2, 3} of NCHW, e.g. squeeze-excite's mean)
//   [K0, R, K1] columns: R rows of K1 contiguous values accumulate into K1 outputs
//   [R]         everything: per-thread partial results, combined in chunk order
//   otherwise   one pass in input order, accumulating into the outputs
//
// Sums accumulate in double, as the reference kernel does, so only the association of the
// additions differs from it; Max and Min propagate NaN as the reference does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/steps.h"

namespace kiln::cpu {

const knobs::Knob kReduceImpl = knobs::declareKnob({
    .name = "cpu.reduce.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "ReduceSum, ReduceMean, ReduceMax and ReduceMin on float32: merged-axis loops "
            "accumulating in double, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

// The least input worth a chunk of its own on another thread: ~80 us of summing at the ~12 GB/s
// one thread reaches, ten times what waking a worker was measured to cost on the 2-core
// development machine.
constexpr int64_t kMinChunkBytes = 1024 * 1024;

int64_t grainFor(int64_t itemBytes) {
  return std::max<int64_t>(1, kMinChunkBytes / std::max<int64_t>(itemBytes, 1));
}

enum class Kind { kSum, kMean, kMax, kMin };

// Accumulator type and combination per kind: double sums, float extrema whose NaN sticks (a
// NaN value replaces the running one, and nothing replaces a NaN).
template <Kind kKind>
struct Op {
  static constexpr bool kIsSum = kKind == Kind::kSum || kKind == Kind::kMean;
  using Acc = std::conditional_t<kIsSum, double, float>;
  static constexpr Acc identity() {
    if constexpr (kIsSum) {
      return 0.0;
    } else if constexpr (kKind == Kind::kMax) {
      return -std::numeric_limits<float>::infinity();
    } else {
      return std::numeric_limits<float>::infinity();
    }
  }
  static Acc combine(Acc acc, Acc v) {
    if constexpr (kIsSum) {
      return acc + v;
    } else if constexpr (kKind == Kind::kMax) {
      return (v > acc || v != v) ? v : acc;
    } else {
      return (v < acc || v != v) ? v : acc;
    }
  }
  // The reduction of n contiguous values, with eight independent accumulators so the loop is
  // not bound by the latency of one chain.
  static Acc row(const float* x, int64_t n) {
    Acc part[8];
    for (Acc& p : part) p = identity();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int k = 0; k < 8; ++k) part[k] = combine(part[k], static_cast<Acc>(x[i + k]));
    }
    Acc acc = identity();
    for (int k = 0; k < 8; ++k) acc = combine(acc, part[k]);
    for (; i < n; ++i) acc = combine(acc, static_cast<Acc>(x[i]));
    return acc;
  }
};

// acc[c] += x[r * stride + c] for c < width over `rows` rows, row by row (the order of the
// reference's additions per column), in double. Cloned for AVX-512 and AVX2: the baseline's SSE2
// converts and adds two doubles at a time.
KILN_ELTWISE_CLONES void sumRowsInto(const float* x, int64_t rows, int64_t stride, int64_t width,
                                     double* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict row = x + r * stride;
    double* __restrict out = acc;
    for (int64_t c = 0; c < width; ++c) out[c] += static_cast<double>(row[c]);
  }
}

// One kept (false) or reduced (true) run of merged axes.
struct Segment {
  int64_t extent;
  bool reduced;
};

enum class Pattern { kCopy, kRows, kColumns, kAll, kGeneric };

class ReduceStep : public Step {
 public:
  ReduceStep(Kind kind, std::vector<Segment> segments, int64_t groupSize)
      : kind_(kind), segments_(std::move(segments)), groupSize_(groupSize) {
    pattern_ = patternOf(segments_);
  }

  Pattern pattern() const { return pattern_; }

  Status run(const ExecutionContext& context) const override {
    switch (kind_) {
      case Kind::kSum:
        return runAs<Kind::kSum>(context);
      case Kind::kMean:
        return runAs<Kind::kMean>(context);
      case Kind::kMax:
        return runAs<Kind::kMax>(context);
      case Kind::kMin:
        return runAs<Kind::kMin>(context);
    }
    return Status::ok();
  }

  static Pattern patternOf(const std::vector<Segment>& s) {
    bool anyReduced = false;
    for (const Segment& segment : s) anyReduced = anyReduced || segment.reduced;
    if (!anyReduced) return Pattern::kCopy;
    if (s.size() == 1) return Pattern::kAll;
    if (s.size() == 2 && s[1].reduced) return Pattern::kRows;
    if (s.size() == 2 || (s.size() == 3 && s[1].reduced)) return Pattern::kColumns;
    return Pattern::kGeneric;
  }

 private:
  template <Kind kKind>
  float finish(typename Op<kKind>::Acc acc) const {
    if constexpr (kKind == Kind::kMean) {
      return static_cast<float>(acc / static_cast<double>(groupSize_));
    } else {
      return static_cast<float>(acc);
    }
  }

  template <Kind kKind>
  Status runAs(const ExecutionContext& context) const {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    ThreadPool& pool = context.pool();
    switch (pattern_) {
      case Pattern::kCopy:
        std::memcpy(y, x, static_cast<size_t>(outputs[0]->bytes()));
        break;
      case Pattern::kRows:
        reduceRows<kKind>(x, y, segments_[0].extent, segments_[1].extent, pool);
        break;
      case Pattern::kColumns: {
        const bool leading = segments_.size() == 3;
        reduceColumns<kKind>(x, y, leading ? segments_[0].extent : 1,
                             segments_[leading ? 1 : 0].extent, segments_.back().extent, pool);
        break;
      }
      case Pattern::kAll:
        reduceAll<kKind>(x, y, segments_[0].extent, pool);
        break;
      case Pattern::kGeneric:
        reduceGeneric<kKind>(x, y);
        break;
    }
    return Status::ok();
  }

  template <Kind kKind>
  void reduceRows(const float* x, float* y, int64_t rows, int64_t width, ThreadPool& pool) const {
    pool.parallelFor(rows, grainFor(width * 4), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        y[r] = finish<kKind>(Op<kKind>::row(x + r * width, width));
    });
  }

  // y[o, c] = reduce over r of x[o, r, c], in blocks of columns that keep their accumulators in
  // registers or L1.
  template <Kind kKind>
  void reduceColumns(const float* x, float* y, int64_t outer, int64_t reduced, int64_t width,
                     ThreadPool& pool) const {
    using Acc = typename Op<kKind>::Acc;
    if (outer == 1 && pool.size() > 1 && reduced >= 2 * pool.size() &&
        pool.chunkCount(reduced * width, kMinBandElements) > 1) {
      reduceColumnsByRows<kKind>(x, y, reduced, width, pool);
      return;
    }
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (width + kBlock - 1) / kBlock;
    const int64_t blockBytes = reduced * std::min(width, kBlock) * 4;
    pool.parallelFor(outer * blocks, grainFor(blockBytes), [&](int64_t begin, int64_t end) {
      Acc acc[kBlock];
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t o = unit / blocks;
        const int64_t c0 = unit % blocks * kBlock;
        const int64_t n = std::min(kBlock, width - c0);
        for (int64_t c = 0; c < n; ++c) acc[c] = Op<kKind>::identity();
        const float* in = x + o * reduced * width + c0;
        if constexpr (Op<kKind>::kIsSum) {
          sumRowsInto(in, reduced, width, n, acc);
          float* out = y + o * width + c0;
          for (int64_t c = 0; c < n; ++c) out[c] = finish<kKind>(acc[c]);
          continue;
        }
        for (int64_t r = 0; r < reduced; ++r) {
          const float* row = in + r * width;
          if (n == kBlock) {  // a fixed trip count: vectorised at -O2
            for (int64_t c = 0; c < kBlock; ++c) acc[c] = Op<kKind>::combine(acc[c], row[c]);
          } else {
            for (int64_t c = 0; c < n; ++c) acc[c] = Op<kKind>::combine(acc[c], row[c]);
          }
        }
        float* out = y + o * width + c0;
        for (int64_t c = 0; c < n; ++c) out[c] = finish<kKind>(acc[c]);
      }
    });
  }

  // Bands of rows pay from 128 KiB of input, below kMinChunkBytes: the threads read what they
  // wrote in the layer before, where one thread alone would fetch the other core's half.
  // SqueezeNet's final mean (169 x 1000) at 2 threads, by --dumpProfile in alternating runs:
  // 0.080 ms on one thread, 0.058 ms in two bands (before the AVX-512 clone of the sums).
  static constexpr int64_t kMinBandElements = 32768;

  // One [reduced, width] block (a spatial mean in NHWC): a band of rows per thread into partial
  // results, combined in band order (fixed by the pool's size, so the result does not depend on
  // scheduling). Splitting the columns instead would have each thread read half of every row,
  // half of which the layer before wrote on the other core; a band of rows is what the layer
  // before (split by rows) left in this core's cache.
  template <Kind kKind>
  void reduceColumnsByRows(const float* x, float* y, int64_t reduced, int64_t width,
                           ThreadPool& pool) const {
    using Acc = typename Op<kKind>::Acc;
    const int64_t bands = std::min<int64_t>(pool.size(), reduced);
    std::vector<Acc> partial(static_cast<size_t>(bands * width), Op<kKind>::identity());
    pool.parallelFor(bands, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        Acc* acc = partial.data() + b * width;
        const int64_t first = b * reduced / bands, last = (b + 1) * reduced / bands;
        if constexpr (Op<kKind>::kIsSum) {
          sumRowsInto(x + first * width, last - first, width, width, acc);
        } else {
          for (int64_t r = first; r < last; ++r) {
            const float* row = x + r * width;
            for (int64_t c = 0; c < width; ++c) acc[c] = Op<kKind>::combine(acc[c], row[c]);
          }
        }
      }
    });
    for (int64_t c = 0; c < width; ++c) {
      Acc acc = partial[static_cast<size_t>(c)];
      for (int64_t b = 1; b < bands; ++b) {
        acc = Op<kKind>::combine(acc, partial[static_cast<size_t>(b * width + c)]);
      }
      y[c] = finish<kKind>(acc);
    }
  }

  // Everything into one value: a partial result per chunk (chunks fixed by the pool's size),
  // combined in chunk order so the result does not depend on scheduling.
  template <Kind kKind>
  void reduceAll(const float* x, float* y, int64_t count, ThreadPool& pool) const {
    using Acc = typename Op<kKind>::Acc;
    const int64_t chunks = std::max<int64_t>(1, pool.chunkCount(count, grainFor(4)));
    std::vector<Acc> partial(static_cast<size_t>(chunks), Op<kKind>::identity());
    pool.parallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t first = c * count / chunks, last = (c + 1) * count / chunks;
        partial[static_cast<size_t>(c)] = Op<kKind>::row(x + first, last - first);
      }
    });
    Acc acc = Op<kKind>::identity();
    for (Acc p : partial) acc = Op<kKind>::combine(acc, p);
    y[0] = finish<kKind>(acc);
  }

  // Any alternation of kept and reduced segments, in one pass over the input: the innermost
  // segment is either reduced row by row or accumulated column-wise into its outputs.
  template <Kind kKind>
  void reduceGeneric(const float* x, float* y) const {
    using Acc = typename Op<kKind>::Acc;
    const size_t n = segments_.size();
    std::vector<int64_t> outStrides(n, 0);
    int64_t outputs = 1;
    for (size_t s = n; s-- > 0;) {
      if (segments_[s].reduced) continue;
      outStrides[s] = outputs;
      outputs *= segments_[s].extent;
    }
    std::vector<Acc> acc(static_cast<size_t>(outputs), Op<kKind>::identity());
    const int64_t inner = segments_[n - 1].extent;
    const bool innerReduced = segments_[n - 1].reduced;
    int64_t rows = 1;
    for (size_t s = 0; s + 1 < n; ++s) rows *= segments_[s].extent;
    std::vector<int64_t> index(n - 1, 0);
    int64_t base = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * inner;
      if (innerReduced) {
        acc[static_cast<size_t>(base)] =
            Op<kKind>::combine(acc[static_cast<size_t>(base)], Op<kKind>::row(row, inner));
      } else {
        Acc* out = acc.data() + base;
        for (int64_t c = 0; c < inner; ++c) out[c] = Op<kKind>::combine(out[c], row[c]);
      }
      for (size_t s = n - 1; s-- > 0;) {
        base += outStrides[s];
        if (++index[s] < segments_[s].extent) break;
        base -= outStrides[s] * segments_[s].extent;
        index[s] = 0;
      }
    }
    for (int64_t o = 0; o < outputs; ++o) y[o] = finish<kKind>(acc[static_cast<size_t>(o)]);
  }

  Kind kind_;
  std::vector<Segment> segments_;
  int64_t groupSize_;
  Pattern pattern_;
};

// Which axes the node reduces, as the reference reads them; nullopt where they are not known
// at build time.
std::optional<std::vector<bool>> reducedAxes(const ir::Node& node, int64_t rank) {
  const int axesInputSince = node.opType == "ReduceSum" ? 13 : 18;
  std::vector<int64_t> axes;
  bool noop = false;
  if (node.opsetVersion < axesInputSince) {
    auto attr = node.getInts("axes", {});
    if (!attr.isOk()) return std::nullopt;
    axes = *attr;
  } else {
    if (const ir::Value* given = node.input(1)) {
      if (!given->constant) return std::nullopt;
      axes = given->constant->toInt64Vector();
    }
    auto flag = node.getInt("noop_with_empty_axes", 0);
    if (!flag.isOk()) return std::nullopt;
    noop = *flag != 0;
  }
  if (axes.empty()) return std::vector<bool>(static_cast<size_t>(rank), !noop);
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t axis : axes) {
    auto normalized = ir::normalizeAxis(axis, rank);
    if (!normalized.isOk()) return std::nullopt;
    reduced[static_cast<size_t>(*normalized)] = true;
  }
  return reduced;
}

}  // namespace

std::unique_ptr<Step> makeReduceStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.inputs.empty() || !node.inputs[0]) return nullptr;
  Kind kind;
  if (node.opType == "ReduceSum") {
    kind = Kind::kSum;
  } else if (node.opType == "ReduceMean") {
    kind = Kind::kMean;
  } else if (node.opType == "ReduceMax") {
    kind = Kind::kMax;
  } else if (node.opType == "ReduceMin") {
    kind = Kind::kMin;
  } else {
    return nullptr;
  }
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs.empty() ? nullptr : node.outputs[0];
  if (!y || x->dtype != ir::DType::kFloat32 || y->dtype != ir::DType::kFloat32) return nullptr;
  if (route.value(kReduceImpl, &node) != "fast") return nullptr;
  const ir::Shape& shape = x->shape;
  if (shape.elementCount() == 0) return nullptr;  // empty sets: the reference's identities
  std::optional<std::vector<bool>> reduced = reducedAxes(node, static_cast<int64_t>(shape.rank()));
  if (!reduced) return nullptr;
  std::vector<Segment> segments;
  int64_t groupSize = 1;
  for (size_t a = 0; a < shape.rank(); ++a) {
    const bool r = (*reduced)[a];
    if (r) groupSize *= shape[a];
    if (shape[a] == 1) continue;
    if (!segments.empty() && segments.back().reduced == r) {
      segments.back().extent *= shape[a];
    } else {
      segments.push_back({shape[a], r});
    }
  }
  if (y->shape.elementCount() * groupSize != shape.elementCount()) return nullptr;
  auto step = std::make_unique<ReduceStep>(kind, std::move(segments), groupSize);
  switch (step->pattern()) {
    case Pattern::kCopy:
      step->tactic = "fast.reduce_copy";
      break;
    case Pattern::kRows:
      step->tactic = "fast.reduce_rows";
      break;
    case Pattern::kColumns:
      step->tactic = "fast.reduce_columns";
      break;
    case Pattern::kAll:
      step->tactic = "fast.reduce_all";
      break;
    case Pattern::kGeneric:
      step->tactic = "fast.reduce_generic";
      break;
  }
  return step;
}

}  // namespace kiln::cpu
