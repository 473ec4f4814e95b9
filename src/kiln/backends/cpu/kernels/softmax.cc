// Softmax and LogSoftmax in float32 over the last axis: one contiguous row at a time, so the
// max, exp and scale passes stream through memory.
#include <cmath>

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

class SoftmaxStep : public Step {
 public:
  SoftmaxStep(int64_t rows, int64_t width, bool log) : rows_(rows), width_(width), log_(log) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    for (int64_t r = 0; r < rows_; ++r) {
      const float* in = x + r * width_;
      float* out = y + r * width_;
      // Subtracting the maximum keeps exp from overflowing; it cancels out of the result.
      float max = in[0];
      for (int64_t i = 1; i < width_; ++i) max = std::max(max, in[i]);
      // The exponentials are summed in double: long rows would otherwise drift.
      double sum = 0.0;
      if (log_) {
        for (int64_t i = 0; i < width_; ++i) sum += std::exp(in[i] - max);
        const float shift = max + static_cast<float>(std::log(sum));
        for (int64_t i = 0; i < width_; ++i) out[i] = in[i] - shift;
      } else {
        for (int64_t i = 0; i < width_; ++i) {
          out[i] = std::exp(in[i] - max);
          sum += out[i];
        }
        const float scale = static_cast<float>(1.0 / sum);
        for (int64_t i = 0; i < width_; ++i) out[i] *= scale;
      }
    }
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
