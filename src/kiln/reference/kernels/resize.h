// Resize's (and Upsample's) per-axis sampling, shared by the reference kernel (indexing_resize.cc)
// and the backends that must pick the same input elements and weights: each output coordinate
// maps back to an input coordinate per axis, which picks neighbours and weights per axis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::reference::resize {

enum class Interpolation { kNearest, kLinear, kCubic };

enum class Transform {
  kHalfPixel,
  kHalfPixelSymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
  kTfCropAndResize,
};

// kLegacy is Upsample's and opset-10 Resize's rule: floor when enlarging, ceil when shrinking.
enum class Rounding { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil, kLegacy };

struct ResizeSettings {
  Interpolation mode = Interpolation::kNearest;
  Transform transform = Transform::kAsymmetric;
  Rounding rounding = Rounding::kLegacy;
  double cubicA = -0.75;
  bool excludeOutside = false;
  bool antialias = false;
  float extrapolationValue = 0.0f;
  std::vector<double> scales;            // per axis of X
  std::vector<double> roiStart, roiEnd;  // per axis of X, tf_crop_and_resize only
};

// The input elements (clamped to the input) and weights that make one output coordinate along
// one axis; `outside` means the coordinate left the input under tf_crop_and_resize.
struct AxisSample {
  bool outside = false;
  std::vector<int64_t> index;
  std::vector<double> weight;
};

// The sample of output coordinate `x` along `axis`, whose input has `inSize` elements and output
// `outSize`.
AxisSample sampleAxis(const ResizeSettings& settings, size_t axis, int64_t x, int64_t inSize,
                      int64_t outSize);

}  // namespace kiln::reference::resize
