// Reference kernels for Resize and the older Upsample, following the ONNX reference
// implementation: each output coordinate maps back to an input coordinate per axis, which picks
// neighbours and weights per axis; the n-d result is their tensor product.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/reference/kernels/indexing.h"
#include "kiln/reference/kernels/resize.h"

namespace kiln::reference {

namespace {

using resize::AxisSample;
using resize::Interpolation;
using resize::ResizeSettings;
using resize::Rounding;
using resize::Transform;

template <typename Enum>
Result<Enum> lookup(const KernelContext& ctx, const std::string& attr, const std::string& value,
                    std::initializer_list<std::pair<const char*, Enum>> table) {
  for (const auto& [name, entry] : table) {
    if (value == name) return entry;
  }
  return ctx.error("unknown {} '{}'", attr, value);
}

Result<Interpolation> readInterpolation(const KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.node().getString("mode", "nearest"));
  return lookup<Interpolation>(ctx, "mode", mode,
                               {{"nearest", Interpolation::kNearest},
                                {"linear", Interpolation::kLinear},
                                {"bilinear", Interpolation::kLinear},
                                {"cubic", Interpolation::kCubic}});
}

// Attributes of Resize from opset 11, where the coordinate transform became configurable.
Status readModernAttributes(const KernelContext& ctx, ResizeSettings& settings) {
  const ir::Node& node = ctx.node();
  KILN_ASSIGN_OR_RETURN(std::string transform,
                        node.getString("coordinate_transformation_mode", "half_pixel"));
  KILN_ASSIGN_OR_RETURN(settings.transform,
                        lookup<Transform>(ctx, "coordinate_transformation_mode", transform,
                                          {{"half_pixel", Transform::kHalfPixel},
                                           {"half_pixel_symmetric", Transform::kHalfPixelSymmetric},
                                           {"pytorch_half_pixel", Transform::kPytorchHalfPixel},
                                           {"align_corners", Transform::kAlignCorners},
                                           {"asymmetric", Transform::kAsymmetric},
                                           {"tf_half_pixel_for_nn", Transform::kTfHalfPixelForNn},
                                           {"tf_crop_and_resize", Transform::kTfCropAndResize}}));
  KILN_ASSIGN_OR_RETURN(std::string rounding, node.getString("nearest_mode", "round_prefer_floor"));
  KILN_ASSIGN_OR_RETURN(settings.rounding,
                        lookup<Rounding>(ctx, "nearest_mode", rounding,
                                         {{"round_prefer_floor", Rounding::kRoundPreferFloor},
                                          {"round_prefer_ceil", Rounding::kRoundPreferCeil},
                                          {"floor", Rounding::kFloor},
                                          {"ceil", Rounding::kCeil}}));
  KILN_ASSIGN_OR_RETURN(float cubicA, node.getFloat("cubic_coeff_a", -0.75f));
  settings.cubicA = cubicA;
  KILN_ASSIGN_OR_RETURN(int64_t exclude, node.getInt("exclude_outside", 0));
  settings.excludeOutside = exclude != 0;
  KILN_ASSIGN_OR_RETURN(settings.extrapolationValue, node.getFloat("extrapolation_value", 0.0f));
  KILN_ASSIGN_OR_RETURN(int64_t antialias, node.getInt("antialias", 0));
  settings.antialias = ctx.opset() >= 18 && antialias != 0;
  return Status::ok();
}

// Per-axis scales and roi of Resize from opset 11: given for `axes` (all axes unless the
// opset-18 attribute says otherwise), identity elsewhere.
Status readModernGeometry(KernelContext& ctx, ResizeSettings& settings) {
  const Shape& in = ctx.input(0).shape();
  const Shape& out = ctx.output(0).shape();
  const int64_t rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> axes;
  if (ctx.opset() >= 18 && ctx.node().hasAttribute("axes")) {
    KILN_ASSIGN_OR_RETURN(axes, ctx.node().getInts("axes"));
    for (int64_t& axis : axes) axis = axis < 0 ? axis + rank : axis;
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  settings.scales.assign(rank, 1.0);
  settings.roiStart.assign(rank, 0.0);
  settings.roiEnd.assign(rank, 1.0);
  const Tensor* roi = ctx.optionalInput(1);
  if (roi && roi->elementCount() == static_cast<int64_t>(2 * axes.size())) {
    for (size_t i = 0; i < axes.size(); ++i) {
      settings.roiStart[axes[i]] = roi->elementAsDouble(i);
      settings.roiEnd[axes[i]] = roi->elementAsDouble(axes.size() + i);
    }
  }
  const Tensor* scales = ctx.optionalInput(2);
  if (scales && scales->elementCount() > 0) {
    for (size_t i = 0; i < axes.size(); ++i) settings.scales[axes[i]] = scales->elementAsDouble(i);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::string policy,
                        ctx.node().getString("keep_aspect_ratio_policy", "stretch"));
  if (ctx.opset() < 18 || policy == "stretch") {
    for (int64_t axis : axes) settings.scales[axis] = static_cast<double>(out[axis]) / in[axis];
    return Status::ok();
  }
  // One scale for every resized axis: the output sizes were rounded from it.
  const std::vector<int64_t> sizes = ctx.input(3).toInt64Vector();
  double scale = static_cast<double>(sizes[0]) / in[axes[0]];
  for (size_t i = 1; i < axes.size(); ++i) {
    const double ratio = static_cast<double>(sizes[i]) / in[axes[i]];
    scale = policy == "not_larger" ? std::min(scale, ratio) : std::max(scale, ratio);
  }
  for (int64_t axis : axes) settings.scales[axis] = scale;
  return Status::ok();
}

}  // namespace

namespace resize {
namespace {

// Where output coordinate `x` of an axis lies in the input, in input element units.
double originalCoordinate(const ResizeSettings& settings, size_t axis, int64_t x, int64_t inSize,
                          int64_t outSize) {
  const double scale = settings.scales[axis];
  // The reference measures the output in fractional elements, not the rounded size.
  const double outWidth = scale * static_cast<double>(inSize);
  const double xd = static_cast<double>(x);
  switch (settings.transform) {
    case Transform::kHalfPixel:
      return (xd + 0.5) / scale - 0.5;
    case Transform::kHalfPixelSymmetric: {
      const double adjustment = static_cast<double>(outSize) / outWidth;
      const double offset = static_cast<double>(inSize) / 2 * (1 - adjustment);
      return offset + (xd + 0.5) / scale - 0.5;
    }
    case Transform::kPytorchHalfPixel:
      return outWidth == 1 ? -0.5 : (xd + 0.5) / scale - 0.5;
    case Transform::kAlignCorners:
      return outWidth == 1 ? 0.0 : xd * static_cast<double>(inSize - 1) / (outWidth - 1);
    case Transform::kAsymmetric:
      return xd / scale;
    case Transform::kTfHalfPixelForNn:
      return (xd + 0.5) / scale;
    case Transform::kTfCropAndResize: {
      const double start = settings.roiStart[axis], end = settings.roiEnd[axis];
      const double span = (end - start) * static_cast<double>(inSize - 1);
      const double offset = start * static_cast<double>(inSize - 1);
      return offset + (outWidth == 1 ? span / 2 : xd * span / (outWidth - 1));
    }
  }
  return xd / scale;
}

double cubicWeight(double distance, double a) {
  const double x = std::fabs(distance);
  if (x <= 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// Weights of the neighbours at offsets start, start+1, ... from the left neighbour, where
// `ratio` in (0, 1] is the distance of the sample point past the left neighbour. Antialiasing
// stretches the filter by 1/scale when shrinking so that every input element contributes.
std::vector<double> interpolationWeights(const ResizeSettings& settings, double ratio,
                                         double scale) {
  std::vector<double> weights;
  if (!settings.antialias) {
    if (settings.mode == Interpolation::kLinear) return {1 - ratio, ratio};
    for (int offset = -1; offset <= 2; ++offset) {
      weights.push_back(cubicWeight(offset - ratio, settings.cubicA));
    }
    return weights;
  }
  const double s = std::min(scale, 1.0);
  const bool linear = settings.mode == Interpolation::kLinear;
  const int64_t start = static_cast<int64_t>(std::floor((linear ? -1 : -2) / s) + 1);
  double sum = 0;
  for (int64_t offset = start; offset < 2 - start; ++offset) {
    const double arg = (static_cast<double>(offset) - ratio) * s;
    const double w =
        linear ? std::clamp(1 - std::fabs(arg), 0.0, 1.0) : cubicWeight(arg, settings.cubicA);
    weights.push_back(w);
    sum += w;
  }
  for (double& w : weights) w /= sum;
  return weights;
}

int64_t nearestIndex(Rounding rounding, double x, double scale) {
  const double left = std::floor(x);
  if (rounding == Rounding::kLegacy) return static_cast<int64_t>(scale < 1 ? std::ceil(x) : left);
  if (x == left) return static_cast<int64_t>(x);
  const double ratio = x - left;
  bool right = false;
  switch (rounding) {
    case Rounding::kRoundPreferFloor:
      right = ratio > 0.5;
      break;
    case Rounding::kRoundPreferCeil:
      right = ratio >= 0.5;
      break;
    case Rounding::kFloor:
      right = false;
      break;
    case Rounding::kCeil:
      right = true;
      break;
    case Rounding::kLegacy:
      break;
  }
  return static_cast<int64_t>(left) + (right ? 1 : 0);
}

}  // namespace

AxisSample sampleAxis(const ResizeSettings& settings, size_t axis, int64_t x, int64_t inSize,
                      int64_t outSize) {
  AxisSample sample;
  const double original = originalCoordinate(settings, axis, x, inSize, outSize);
  if (settings.transform == Transform::kTfCropAndResize &&
      (original < 0 || original > static_cast<double>(inSize - 1))) {
    sample.outside = true;
    return sample;
  }
  auto clampIndex = [&](int64_t i) { return std::clamp<int64_t>(i, 0, inSize - 1); };
  const double scale = settings.scales[axis];
  if (settings.mode == Interpolation::kNearest) {
    sample.index = {clampIndex(nearestIndex(settings.rounding, original, scale))};
    sample.weight = {1.0};
    return sample;
  }
  // The left neighbour is the one strictly below the point, so ratio lies in (0, 1]; the
  // neighbours are centred on the point (n/2 on each side of ceil(x) - 1/2).
  const double ceiling = std::ceil(original);
  const double ratio = original - (ceiling - 1);
  sample.weight = interpolationWeights(settings, ratio, scale);
  const int64_t count = static_cast<int64_t>(sample.weight.size());
  const int64_t first = static_cast<int64_t>(ceiling) - count / 2;
  double sum = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = first + k;
    if (settings.excludeOutside && (index < 0 || index >= inSize)) sample.weight[k] = 0;
    sum += sample.weight[k];
    sample.index.push_back(clampIndex(index));
  }
  if (settings.excludeOutside) {
    for (double& w : sample.weight) w /= sum;
  }
  return sample;
}

}  // namespace resize

namespace {

using resize::sampleAxis;

// Converts an interpolated value to the output type: integers round to nearest and saturate,
// since truncation would bias every interpolated element downward.
template <typename T>
T fromInterpolated(double value) {
  if constexpr (std::is_integral_v<T>) {
    const double rounded = std::round(value);
    if (std::isnan(rounded)) return T{0};
    const double low = static_cast<double>(std::numeric_limits<T>::lowest());
    const double high = static_cast<double>(std::numeric_limits<T>::max());
    if (rounded <= low) return std::numeric_limits<T>::lowest();
    if (rounded >= high) return std::numeric_limits<T>::max();
    return static_cast<T>(rounded);
  } else {
    return ir::convertElement<T>(value);
  }
}

// Sums weight * input over the tensor product of the per-axis samples of one output element.
template <typename T>
double interpolateElement(std::span<const T> input, const std::vector<int64_t>& strides,
                          const std::vector<const AxisSample*>& samples) {
  const size_t rank = samples.size();
  std::vector<size_t> tap(rank, 0);
  double sum = 0;
  while (true) {
    double weight = 1;
    int64_t source = 0;
    for (size_t a = 0; a < rank; ++a) {
      weight *= samples[a]->weight[tap[a]];
      source += samples[a]->index[tap[a]] * strides[a];
    }
    sum += weight * ir::convertElement<double>(input[source]);
    size_t a = rank;
    while (a-- > 0) {
      if (++tap[a] < samples[a]->index.size()) break;
      tap[a] = 0;
    }
    if (a == static_cast<size_t>(-1)) break;
  }
  return sum;
}

Status resample(KernelContext& ctx, const ResizeSettings& settings) {
  const Tensor& x = ctx.input(0);
  Tensor& out = ctx.output(0);
  const Shape& in = x.shape();
  const size_t rank = in.rank();
  if (settings.mode != Interpolation::kNearest && x.dtype() == DType::kBool) {
    return ctx.unsupportedHere("linear and cubic modes do not apply to bool tensors");
  }
  std::vector<std::vector<AxisSample>> samples(rank);
  for (size_t a = 0; a < rank; ++a) {
    for (int64_t o = 0; o < out.shape()[a]; ++o) {
      samples[a].push_back(sampleAxis(settings, a, o, in[a], out.shape()[a]));
    }
  }
  const Tensor extrapolation = Tensor::scalar<float>(settings.extrapolationValue).castTo(x.dtype());
  const std::vector<int64_t> strides = in.strides();
  ir::visitDType(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    std::vector<const AxisSample*> chosen(rank);
    forEachIndex(out.shape(), [&](int64_t flat, const std::vector<int64_t>& coords) {
      bool outside = false;
      for (size_t a = 0; a < rank; ++a) {
        chosen[a] = &samples[a][coords[a]];
        outside |= chosen[a]->outside;
      }
      if (outside) {
        copyElement(extrapolation, 0, out, flat);
      } else if (settings.mode == Interpolation::kNearest) {
        int64_t source = 0;
        for (size_t a = 0; a < rank; ++a) source += chosen[a]->index[0] * strides[a];
        copyElement(x, source, out, flat);
      } else if constexpr (!std::is_same_v<T, bool>) {
        out.mutableData<T>()[flat] =
            fromInterpolated<T>(interpolateElement<T>(x.data<T>(), strides, chosen));
      }
    });
  });
  return Status::ok();
}

// Upsample and opset-10 Resize: asymmetric coordinates, legacy nearest rounding, one scale
// per axis.
Result<ResizeSettings> legacySettings(const KernelContext& ctx, std::vector<double> scales) {
  ResizeSettings settings;
  KILN_ASSIGN_OR_RETURN(settings.mode, readInterpolation(ctx));
  settings.scales = std::move(scales);
  return settings;
}

std::vector<double> scalesFromTensor(const Tensor& scales) {
  std::vector<double> values;
  for (int64_t i = 0; i < scales.elementCount(); ++i) values.push_back(scales.elementAsDouble(i));
  return values;
}

}  // namespace

Status runResize(KernelContext& ctx) {
  if (ctx.opset() < 11) {
    KILN_ASSIGN_OR_RETURN(ResizeSettings settings,
                          legacySettings(ctx, scalesFromTensor(ctx.input(1))));
    return resample(ctx, settings);
  }
  ResizeSettings settings;
  KILN_ASSIGN_OR_RETURN(settings.mode, readInterpolation(ctx));
  KILN_RETURN_IF_ERROR(readModernAttributes(ctx, settings));
  KILN_RETURN_IF_ERROR(readModernGeometry(ctx, settings));
  return resample(ctx, settings);
}

Status runUpsample(KernelContext& ctx) {
  std::vector<double> scales;
  if (ctx.opset() < 9) {
    KILN_ASSIGN_OR_RETURN(std::vector<float> values, ctx.node().getFloats("scales"));
    scales.assign(values.begin(), values.end());
  } else {
    scales = scalesFromTensor(ctx.input(1));
  }
  KILN_ASSIGN_OR_RETURN(ResizeSettings settings, legacySettings(ctx, std::move(scales)));
  return resample(ctx, settings);
}

}  // namespace kiln::reference
