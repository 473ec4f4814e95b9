// Pooling in float32 on 4-D NCHW tensors: MaxPool, AveragePool and the global pools, with each
// axis's window bounds computed once at build time so the run loops do no bounds checks.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/ops/neural.h"

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

class WindowPoolStep : public Step {
 public:
  WindowPoolStep(const ir::WindowGeometry& g, int64_t planes, bool max, bool countIncludePad)
      : g_(g),
        planes_(planes),
        max_(max),
        countIncludePad_(countIncludePad),
        rows_(axisWindows(g, 0)),
        cols_(axisWindows(g, 1)) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    const int64_t inH = g_.input[0], inW = g_.input[1];
    const int64_t outH = g_.output[0], outW = g_.output[1];
    const int64_t dilH = g_.dilations[0], dilW = g_.dilations[1];
    for (int64_t plane = 0; plane < planes_; ++plane) {
      const float* in = x + plane * inH * inW;
      float* out = y + plane * outH * outW;
      for (int64_t oy = 0; oy < outH; ++oy) {
        const AxisWindow& r = rows_[static_cast<size_t>(oy)];
        for (int64_t ox = 0; ox < outW; ++ox) {
          const AxisWindow& c = cols_[static_cast<size_t>(ox)];
          if (max_) {
            // A window wholly in padding yields -inf, as the reference kernel's does.
            float best = -std::numeric_limits<float>::infinity();
            bool first = true;
            for (int64_t ky = r.first; ky < r.last; ++ky) {
              const float* row = in + (r.start + ky * dilH) * inW + c.start;
              for (int64_t kx = c.first; kx < c.last; ++kx) {
                const float v = row[kx * dilW];
                // NaN loses to any number but a window of NaNs stays NaN (the reference rule).
                if (first || v > best || (std::isnan(best) && !std::isnan(v))) best = v;
                first = false;
              }
            }
            out[oy * outW + ox] = best;
          } else {
            float sum = 0.0f;
            for (int64_t ky = r.first; ky < r.last; ++ky) {
              const float* row = in + (r.start + ky * dilH) * inW + c.start;
              for (int64_t kx = c.first; kx < c.last; ++kx) sum += row[kx * dilW];
            }
            const int64_t count =
                countIncludePad_ ? r.padded * c.padded : (r.last - r.first) * (c.last - c.first);
            out[oy * outW + ox] = sum / static_cast<float>(count);
          }
        }
      }
    }
    return Status::ok();
  }

 private:
  ir::WindowGeometry g_;
  int64_t planes_;
  bool max_, countIncludePad_;
  std::vector<AxisWindow> rows_, cols_;
};

class GlobalPoolStep : public Step {
 public:
  GlobalPoolStep(int64_t planes, int64_t planeSize, bool max)
      : planes_(planes), planeSize_(planeSize), max_(max) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    for (int64_t plane = 0; plane < planes_; ++plane) {
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
    return Status::ok();
  }

 private:
  int64_t planes_, planeSize_;
  bool max_;
};

}  // namespace

std::unique_ptr<Step> makePoolStep(const ir::Node& node, const knobs::Route& route) {
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
