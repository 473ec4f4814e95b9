// 2-D convolution in float32: im2col + sgemm (1x1 stride-1 convolutions skip the im2col copy),
// or a direct loop nest (the better choice for depthwise convolutions, whose per-group matrices
// are too thin for a GEMM).
#include <cblas.h>

#include <cstring>

#include "kiln/backends/cpu/kernels/epilogue.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/neural.h"

namespace kiln::cpu {

const knobs::Knob kConvAlgo = knobs::declareKnob({
    .name = "cpu.conv.algo",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "im2col", "direct", "reference"},
    .defaultValue = "auto",
    .help = "2-D convolution algorithm: auto (direct for depthwise, else im2col+sgemm), "
            "im2col+sgemm, a direct loop nest, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

struct ConvShape {
  int64_t batch, channels, height, width;    // input
  int64_t outChannels, outHeight, outWidth;  // output
  int64_t kernelH, kernelW, strideH, strideW, dilationH, dilationW, padTop, padLeft;
  int64_t group;
  int64_t groupChannels() const { return channels / group; }
  int64_t groupOutChannels() const { return outChannels / group; }
  bool pointwise() const {
    return kernelH == 1 && kernelW == 1 && strideH == 1 && strideW == 1 && padTop == 0 &&
           padLeft == 0;
  }
};

class ConvStep : public Step {
 public:
  ConvStep(ConvShape shape, bool direct, Epilogue epilogue)
      : shape_(shape), direct_(direct), epilogue_(epilogue) {}

  // Inputs: X, W, B? and, for FusedConv, the residual (same shape as the output).
  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    const float* w = context.data<float>(*inputs[1]);
    const float* bias = inputs.size() > 2 && inputs[2] ? context.data<float>(*inputs[2]) : nullptr;
    const float* residual =
        inputs.size() > 3 && inputs[3] ? context.data<float>(*inputs[3]) : nullptr;
    float* y = context.data<float>(*outputs[0]);
    if (direct_) {
      runDirect(x, w, bias, y);
    } else {
      runIm2col(x, w, bias, y);
    }
    // The epilogue runs over the whole output once; it is cheap next to the convolution.
    if (residual || !epilogue_.empty()) {
      epilogue_.apply(y, outputs[0]->shape.elementCount(), residual);
    }
    return Status::ok();
  }

 private:
  void runIm2col(const float* x, const float* w, const float* bias, float* y) const {
    const ConvShape& s = shape_;
    const int64_t cg = s.groupChannels(), mg = s.groupOutChannels();
    const int64_t patch = cg * s.kernelH * s.kernelW;
    const int64_t pixels = s.outHeight * s.outWidth;
    if (!s.pointwise()) columns_.resize(static_cast<size_t>(patch * pixels));
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t g = 0; g < s.group; ++g) {
        const float* xg = x + (n * s.channels + g * cg) * s.height * s.width;
        const float* cols = s.pointwise() ? xg : columns_.data();
        if (!s.pointwise()) fillColumns(xg, columns_.data());
        float* yg = y + (n * s.outChannels + g * mg) * pixels;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mg, pixels, patch, 1.0f,
                    w + g * mg * patch, patch, cols, pixels, 0.0f, yg, pixels);
        if (bias) {
          for (int64_t m = 0; m < mg; ++m) {
            const float b = bias[g * mg + m];
            for (int64_t p = 0; p < pixels; ++p) yg[m * pixels + p] += b;
          }
        }
      }
    }
  }

  // Rows are (channel, ky, kx), columns output pixels; padding reads as zero.
  void fillColumns(const float* x, float* columns) const {
    const ConvShape& s = shape_;
    int64_t row = 0;
    for (int64_t c = 0; c < s.groupChannels(); ++c) {
      for (int64_t ky = 0; ky < s.kernelH; ++ky) {
        for (int64_t kx = 0; kx < s.kernelW; ++kx, ++row) {
          float* out = columns + row * s.outHeight * s.outWidth;
          for (int64_t oy = 0; oy < s.outHeight; ++oy) {
            const int64_t iy = oy * s.strideH - s.padTop + ky * s.dilationH;
            for (int64_t ox = 0; ox < s.outWidth; ++ox) {
              const int64_t ix = ox * s.strideW - s.padLeft + kx * s.dilationW;
              const bool inside = iy >= 0 && iy < s.height && ix >= 0 && ix < s.width;
              out[oy * s.outWidth + ox] = inside ? x[(c * s.height + iy) * s.width + ix] : 0.0f;
            }
          }
        }
      }
    }
  }

  void runDirect(const float* x, const float* w, const float* bias, float* y) const {
    const ConvShape& s = shape_;
    const int64_t cg = s.groupChannels(), mg = s.groupOutChannels();
    for (int64_t n = 0; n < s.batch; ++n) {
      for (int64_t m = 0; m < s.outChannels; ++m) {
        const int64_t g = m / mg;
        float* out = y + (n * s.outChannels + m) * s.outHeight * s.outWidth;
        const float b = bias ? bias[m] : 0.0f;
        for (int64_t p = 0; p < s.outHeight * s.outWidth; ++p) out[p] = b;
        for (int64_t c = 0; c < cg; ++c) {
          const float* in = x + (n * s.channels + g * cg + c) * s.height * s.width;
          const float* kernel = w + (m * cg + c) * s.kernelH * s.kernelW;
          for (int64_t ky = 0; ky < s.kernelH; ++ky) {
            for (int64_t kx = 0; kx < s.kernelW; ++kx) {
              const float weight = kernel[ky * s.kernelW + kx];
              for (int64_t oy = 0; oy < s.outHeight; ++oy) {
                const int64_t iy = oy * s.strideH - s.padTop + ky * s.dilationH;
                if (iy < 0 || iy >= s.height) continue;
                const float* row = in + iy * s.width;
                float* outRow = out + oy * s.outWidth;
                for (int64_t ox = 0; ox < s.outWidth; ++ox) {
                  const int64_t ix = ox * s.strideW - s.padLeft + kx * s.dilationW;
                  if (ix >= 0 && ix < s.width) outRow[ox] += weight * row[ix];
                }
              }
            }
          }
        }
      }
    }
  }

  ConvShape shape_;
  bool direct_;
  Epilogue epilogue_;
  mutable std::vector<float> columns_;  // im2col scratch; a plan runs on one thread at a time
};

}  // namespace

std::unique_ptr<Step> makeConvStep(const ir::Node& node, const knobs::Route& route) {
  const bool fused = node.domain == ir::kKilnDomain && node.opType == "FusedConv";
  if (!fused && (!node.domain.empty() || node.opType != "Conv")) return nullptr;
  std::optional<Epilogue> epilogue = Epilogue::fromNode(node);
  if (!epilogue) return nullptr;
  const std::string& algo = route.value(kConvAlgo, &node);
  if (algo == "reference") return nullptr;
  const ir::Value* x = node.inputs[0];
  const ir::Value* w = node.inputs[1];
  const ir::Value* y = node.outputs[0];
  if (x->dtype != ir::DType::kFloat32 || x->shape.rank() != 4) return nullptr;
  auto geometry = ir::resolveConvGeometry(node, x->shape, w->shape);
  auto group = node.getInt("group", 1);
  if (!geometry.isOk() || !group.isOk()) return nullptr;
  ConvShape s{x->shape[0],
              x->shape[1],
              x->shape[2],
              x->shape[3],
              y->shape[1],
              y->shape[2],
              y->shape[3],
              geometry->kernel[0],
              geometry->kernel[1],
              geometry->strides[0],
              geometry->strides[1],
              geometry->dilations[0],
              geometry->dilations[1],
              geometry->padsBegin[0],
              geometry->padsBegin[1],
              *group};
  const bool depthwise = s.group == s.channels && s.group > 1;
  const bool direct = algo == "direct" || (algo == "auto" && depthwise);
  auto step = std::make_unique<ConvStep>(s, direct, *epilogue);
  step->tactic = direct ? "direct" : (s.pointwise() ? "pointwise+blas" : "im2col+blas");
  return step;
}

}  // namespace kiln::cpu
