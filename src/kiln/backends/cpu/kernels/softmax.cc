// Softmax and LogSoftmax in float32 over the last axis: one contiguous row at a time, so the
// max, exp and scale passes stream through memory; rows are split over the plan's threads.

// Loops written for the vectoriser (see fast_math.h); before the includes on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno", \
                     "fp-contract=off")
#endif

#include <cmath>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/steps.h"

namespace kiln::cpu {

const knobs::Knob kSoftmaxImpl = knobs::declareKnob({
    .name = "cpu.softmax.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "Softmax and LogSoftmax over the last axis: float32 rows, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

// The reductions keep kLanes partial results, which the vectoriser maps to vector lanes (it may
// not reorder a single running sum or max itself).
constexpr int64_t kLanes = 8;

float rowMax(const float* in, int64_t width) {
  float lanes[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = in[0];
  int64_t i = 0;
  for (; i + kLanes <= width; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = in[i + j] > lanes[j] ? in[i + j] : lanes[j];
  }
  float max = in[0];
  for (; i < width; ++i) max = in[i] > max ? in[i] : max;
  for (int64_t j = 0; j < kLanes; ++j) max = lanes[j] > max ? lanes[j] : max;
  return max;
}

double rowSum(const float* values, int64_t width) {
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= width; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += values[i + j];
  }
  double sum = 0.0;
  for (; i < width; ++i) sum += values[i];
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  return sum;
}

KILN_ELTWISE_CLONES void softmaxRow(const float* in, float* out, int64_t width, bool log) {
  // Subtracting the maximum keeps exp from overflowing; it cancels out of the result.
  const float max = rowMax(in, width);
  // The exponentials go through `out` (LogSoftmax overwrites them after) and are summed in
  // double: long rows would otherwise drift.
  for (int64_t i = 0; i < width; ++i) out[i] = fastExp(in[i] - max);
  const double sum = rowSum(out, width);
  if (log) {
    const float shift = max + static_cast<float>(std::log(sum));
    for (int64_t i = 0; i < width; ++i) out[i] = in[i] - shift;
  } else {
    const float scale = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < width; ++i) out[i] *= scale;
  }
}

class SoftmaxStep : public Step {
 public:
  SoftmaxStep(int64_t rows, int64_t width, bool log) : rows_(rows), width_(width), log_(log) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    // A chunk of at least 32K elements (an exp and three passes each): some tens of
    // microseconds, well above a thread's wake-up; smaller tensors stay on the calling thread.
    const int64_t grainRows = std::max<int64_t>(1, 32768 / width_);
    context.pool().parallelFor(rows_, grainRows, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r)
        softmaxRow(x + r * width_, y + r * width_, width_, log_);
    });
    return Status::ok();
  }

 private:
  int64_t rows_, width_;
  bool log_;
};

}  // namespace

std::unique_ptr<Step> makeSoftmaxStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || (node.opType != "Softmax" && node.opType != "LogSoftmax")) {
    return nullptr;
  }
  if (route.value(kSoftmaxImpl, &node) != "fast") return nullptr;
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (x->dtype != ir::DType::kFloat32 || y->dtype != ir::DType::kFloat32) return nullptr;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  // Before opset 13 the axis flattens everything after it, which is the last axis only when the
  // axis is the last one; that case and opset 13's last axis are the same computation.
  auto axis = node.getInt("axis", node.opsetVersion >= 13 ? -1 : 1);
  if (rank == 0 || !axis.isOk() || (*axis != -1 && *axis != rank - 1)) return nullptr;
  const int64_t width = x->shape[static_cast<size_t>(rank - 1)];
  if (width == 0) return nullptr;
  auto step = std::make_unique<SoftmaxStep>(x->shape.elementCount() / width, width,
                                            node.opType == "LogSoftmax");
  step->tactic = "fast.softmax_rows";
  return step;
}

}  // namespace kiln::cpu
