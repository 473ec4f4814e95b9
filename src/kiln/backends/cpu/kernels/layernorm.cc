// LayerNormalization in float32 over the trailing axes: a two-pass mean and variance per row
// (the one-pass E[x^2] - E[x]^2 form cancels badly; cpu.layernorm.variance=one_pass asks for it
// anyway, saving a read of the row), then one scale-and-shift pass. Rows are split over the
// plan's threads.

// Loops written for the vectoriser (see fast_math.h); before the includes on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno", \
                     "fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"

namespace kiln::cpu {

const knobs::Knob kLayerNormImpl = knobs::declareKnob({
    .name = "cpu.layernorm.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "LayerNormalization (and kiln.AddLayerNormalization): float32 rows with a two-pass "
            "variance, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kLayerNormVariance = knobs::declareKnob({
    .name = "cpu.layernorm.variance",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"two_pass", "one_pass"},
    .defaultValue = "two_pass",
    .help = "two_pass: the fast kernel takes each row's mean, then the mean of squared deviations "
            "from it; one_pass: it accumulates the sum and the sum of squares in one read of the "
            "row and takes E[x^2] - E[x]^2, which loses precision when the mean is large against "
            "the spread",
    .backends = {"cpu"},
    .perNode = true,
    .changesNumerics = true,
});

namespace {

// The mean and 1 / sqrt(variance + epsilon) of one row, from one read of it: sums of x and x^2
// in double, variance = E[x^2] - E[x]^2 (clamped at 0).
KILN_ELTWISE_CLONES void onePassMoments(const float* in, int64_t width, float epsilon, double& mean,
                                        double& invStdDev) {
  constexpr int64_t kLanes = 8;
  const int64_t bulk = width / kLanes * kLanes;
  double sums[kLanes] = {}, squares[kLanes] = {};
  for (int64_t i = 0; i < bulk; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const double v = in[i + j];
      sums[j] += v;
      squares[j] += v * v;
    }
  }
  double sum = 0.0, square = 0.0;
  for (int64_t i = bulk; i < width; ++i) {
    const double v = in[i];
    sum += v;
    square += v * v;
  }
  for (int64_t j = 0; j < kLanes; ++j) {
    sum += sums[j];
    square += squares[j];
  }
  const double n = static_cast<double>(width);
  mean = sum / n;
  const double variance = std::max(0.0, square / n - mean * mean);
  invStdDev = 1.0 / std::sqrt(variance + epsilon);
}

// One row (one-pass moments): y = (x - mean) * invStdDev * scale + bias (bias may be null).
KILN_ELTWISE_CLONES void layerNormRowOnePass(const float* in, const float* scale, const float* bias,
                                             float* out, int64_t width, float epsilon) {
  double mean = 0.0, invStdDev = 0.0;
  onePassMoments(in, width, epsilon, mean, invStdDev);
  for (int64_t i = 0; i < width; ++i) {
    out[i] = static_cast<float>((in[i] - mean) * invStdDev) * scale[i];
  }
  if (bias) {
    for (int64_t i = 0; i < width; ++i) out[i] += bias[i];
  }
}

// One row: y = (x - mean) / sqrt(var + epsilon) * scale + bias (bias may be null).
KILN_ELTWISE_CLONES void layerNormRow(const float* in, const float* scale, const float* bias,
                                      float* out, int64_t width, float epsilon) {
  // Mean, deviations and sums are taken in double: with a large common offset the float
  // mean alone is off by half an ulp of the offset, which the division by the (small)
  // standard deviation would magnify. Only the final scale-and-shift is float.
  // Both sums keep kLanes partial sums, which the vectoriser maps to vector lanes (it may not
  // reorder a single running sum itself).
  constexpr int64_t kLanes = 8;
  const int64_t bulk = width / kLanes * kLanes;
  double lanes[kLanes] = {};
  for (int64_t i = 0; i < bulk; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += in[i + j];
  }
  double sum = 0.0;
  for (int64_t i = bulk; i < width; ++i) sum += in[i];
  for (int64_t j = 0; j < kLanes; ++j) sum += lanes[j];
  const double mean = sum / static_cast<double>(width);
  for (int64_t j = 0; j < kLanes; ++j) lanes[j] = 0.0;
  for (int64_t i = 0; i < bulk; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) {
      const double d = in[i + j] - mean;
      lanes[j] += d * d;
    }
  }
  double squares = 0.0;
  for (int64_t i = bulk; i < width; ++i) {
    const double d = in[i] - mean;
    squares += d * d;
  }
  for (int64_t j = 0; j < kLanes; ++j) squares += lanes[j];
  const double invStdDev = 1.0 / std::sqrt(squares / static_cast<double>(width) + epsilon);
  for (int64_t i = 0; i < width; ++i) {
    out[i] = static_cast<float>((in[i] - mean) * invStdDev) * scale[i];
  }
  if (bias) {
    for (int64_t i = 0; i < width; ++i) out[i] += bias[i];
  }
}

// LayerNormalization, or kiln.AddLayerNormalization (`skip`: the rows normalised are x + skip,
// written to the Sum output when there is one, else to a row of scratch per chunk).
class LayerNormStep : public Step {
 public:
  LayerNormStep(int64_t rows, int64_t width, float epsilon, bool skip, bool onePass)
      : rows_(rows), width_(width), epsilon_(epsilon), skip_(skip), onePass_(onePass) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    const float* scale = context.data<float>(*inputs[1]);
    const float* bias = inputs.size() > 2 && inputs[2] ? context.data<float>(*inputs[2]) : nullptr;
    const float* skip = skip_ ? context.data<float>(*inputs[3]) : nullptr;
    float* sum =
        skip_ && outputs.size() > 1 && outputs[1] ? context.data<float>(*outputs[1]) : nullptr;
    float* y = context.data<float>(*outputs[0]);
    // A chunk of at least 64K elements (three passes over each): some tens of microseconds, well
    // above a thread's wake-up; smaller tensors stay on the calling thread.
    const int64_t grainRows = std::max<int64_t>(1, 65536 / width_);
    context.pool().parallelFor(rows_, grainRows, [&](int64_t first, int64_t last) {
      std::vector<float> scratch(skip && !sum ? static_cast<size_t>(width_) : 0);
      for (int64_t r = first; r < last; ++r) {
        const float* row = x + r * width_;
        if (skip) {
          float* s = sum ? sum + r * width_ : scratch.data();
          const float* other = skip + r * width_;
          for (int64_t i = 0; i < width_; ++i) s[i] = row[i] + other[i];
          row = s;
        }
        if (onePass_) {
          layerNormRowOnePass(row, scale, bias, y + r * width_, width_, epsilon_);
        } else {
          layerNormRow(row, scale, bias, y + r * width_, width_, epsilon_);
        }
      }
    });
    return Status::ok();
  }

 private:
  int64_t rows_, width_;
  float epsilon_;
  bool skip_;
  bool onePass_;
};

// True when `param` (scale or bias) holds exactly one value per normalised element, laid out as
// the trailing axes of x, so row i of x pairs with param[i] without broadcasting.
bool matchesTrailingAxes(const ir::Value* param, const ir::Shape& x, int64_t axis) {
  if (!param || param->dtype != ir::DType::kFloat32) return false;
  const ir::Shape& p = param->shape;
  if (p.rank() > x.rank()) return false;
  const size_t offset = x.rank() - p.rank();
  for (size_t i = 0; i < p.rank(); ++i) {
    const size_t xi = offset + i;
    if (static_cast<int64_t>(xi) < axis ? p[i] != 1 : p[i] != x[xi]) return false;
  }
  // Every normalised axis must be present (or 1) in the parameter for a one-to-one pairing.
  for (size_t xi = static_cast<size_t>(axis); xi < offset; ++xi) {
    if (x[xi] != 1) return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<Step> makeLayerNormStep(const ir::Node& node, const knobs::Route& route) {
  const bool skip = node.domain == ir::kKilnDomain && node.opType == "AddLayerNormalization";
  if (!skip && (!node.domain.empty() || node.opType != "LayerNormalization")) return nullptr;
  if (route.value(kLayerNormImpl, &node) != "fast") return nullptr;
  // The Mean and InvStdDev outputs are left to the reference kernel (AddLayerNormalization's
  // output 1 is its Sum).
  for (size_t i = skip ? 2 : 1; i < node.outputs.size(); ++i) {
    if (node.outputs[i]) return nullptr;
  }
  if (skip) {
    const ir::Value* other = node.input(3);
    if (!other || other->dtype != ir::DType::kFloat32 || other->shape != node.inputs[0]->shape) {
      return nullptr;
    }
  }
  if (node.inputs.size() < 2) return nullptr;
  const ir::Value* x = node.inputs[0];
  if (x->dtype != ir::DType::kFloat32 || node.outputs[0]->dtype != ir::DType::kFloat32) {
    return nullptr;
  }
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  auto rawAxis = node.getInt("axis", -1);
  auto epsilon = node.getFloat("epsilon", 1e-5f);
  if (!rawAxis.isOk() || !epsilon.isOk() || *rawAxis < -rank || *rawAxis >= rank) return nullptr;
  const int64_t axis = *rawAxis < 0 ? *rawAxis + rank : *rawAxis;
  if (!matchesTrailingAxes(node.inputs[1], x->shape, axis)) return nullptr;
  const bool hasBias = node.inputs.size() > 2 && node.inputs[2];
  if (hasBias && !matchesTrailingAxes(node.inputs[2], x->shape, axis)) return nullptr;
  int64_t width = 1;
  for (int64_t i = axis; i < rank; ++i) width *= x->shape[static_cast<size_t>(i)];
  if (width == 0) return nullptr;
  const bool onePass = route.value(kLayerNormVariance, &node) == "one_pass";
  auto step = std::make_unique<LayerNormStep>(x->shape.elementCount() / width, width, *epsilon,
                                              skip, onePass);
  step->tactic = onePass ? "fast.layernorm_rows.one_pass" : "fast.layernorm_rows";
  return step;
}

}  // namespace kiln::cpu
