// Resize on the CPU with constant scales or sizes: nearest mode for any dtype and rank as a
// per-axis table gather (datamove.h), and linear mode for float32 over the last two axes
// (bilinear; the leading axes must map each output coordinate onto the same input one).
// Coordinates, rounding and weights follow the reference kernel (indexing_resize.cc) term for
// term, in double, so results agree with it exactly for finite inputs. Cubic mode, antialiasing,
// exclude_outside with linear mode and tf_crop_and_resize are left to the reference kernel.
#include <cmath>

#include "kiln/backends/cpu/kernels/datamove.h"

namespace kiln::cpu::datamove {

namespace {

enum class Transform {
  kHalfPixel,
  kHalfPixelSymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
};

// kLegacy is Upsample's and opset-10 Resize's: floor when enlarging, ceil when shrinking.
enum class Rounding { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil, kLegacy };

struct Settings {
  bool linear = false;
  Transform transform = Transform::kAsymmetric;
  Rounding rounding = Rounding::kLegacy;
  std::vector<double> scales;  // per axis
};

template <typename Enum>
std::optional<Enum> lookup(const std::string& value,
                           std::initializer_list<std::pair<const char*, Enum>> table) {
  for (const auto& [name, entry] : table) {
    if (value == name) return entry;
  }
  return std::nullopt;
}

// The per-axis scales the reference uses: the scales input where it has values, else output /
// input size (or one scale for all resized axes under keep_aspect_ratio_policy).
std::optional<std::vector<double>> modernScales(const ir::Node& node) {
  const ir::Shape& in = node.inputs[0]->shape;
  const ir::Shape& out = node.outputs[0]->shape;
  const int64_t rank = static_cast<int64_t>(in.rank());
  std::vector<int64_t> axes;
  if (node.opsetVersion >= 18 && node.hasAttribute("axes")) {
    auto attr = node.getInts("axes");
    if (!attr.isOk()) return std::nullopt;
    for (int64_t axis : *attr) {
      auto normalized = ir::normalizeAxis(axis, rank);
      if (!normalized.isOk()) return std::nullopt;
      axes.push_back(*normalized);
    }
  } else {
    for (int64_t a = 0; a < rank; ++a) axes.push_back(a);
  }
  std::vector<double> scales(static_cast<size_t>(rank), 1.0);
  if (const ir::Value* given = node.input(2)) {
    if (!given->constant) return std::nullopt;
    if (given->constant->elementCount() > 0) {
      if (given->constant->elementCount() != static_cast<int64_t>(axes.size())) {
        return std::nullopt;
      }
      for (size_t i = 0; i < axes.size(); ++i) {
        scales[static_cast<size_t>(axes[i])] = given->constant->elementAsDouble(i);
      }
      return scales;
    }
  }
  auto policy = node.getString("keep_aspect_ratio_policy", "stretch");
  if (!policy.isOk()) return std::nullopt;
  if (node.opsetVersion < 18 || *policy == "stretch") {
    for (int64_t axis : axes) {
      const size_t a = static_cast<size_t>(axis);
      scales[a] = static_cast<double>(out[a]) / static_cast<double>(in[a]);
    }
    return scales;
  }
  const ir::Value* sizesValue = node.input(3);
  if (!sizesValue || !sizesValue->constant) return std::nullopt;
  const std::vector<int64_t> sizes = sizesValue->constant->toInt64Vector();
  if (sizes.size() != axes.size() || sizes.empty()) return std::nullopt;
  double scale = static_cast<double>(sizes[0]) / static_cast<double>(in[axes[0]]);
  for (size_t i = 1; i < axes.size(); ++i) {
    const double ratio = static_cast<double>(sizes[i]) / static_cast<double>(in[axes[i]]);
    scale = *policy == "not_larger" ? std::min(scale, ratio) : std::max(scale, ratio);
  }
  for (int64_t axis : axes) scales[static_cast<size_t>(axis)] = scale;
  return scales;
}

std::optional<Settings> readSettings(const ir::Node& node) {
  Settings settings;
  auto mode = node.getString("mode", "nearest");
  if (!mode.isOk()) return std::nullopt;
  if (*mode == "linear" || *mode == "bilinear") {
    settings.linear = true;
  } else if (*mode != "nearest") {
    return std::nullopt;  // cubic
  }
  if (node.opsetVersion < 11) {
    const ir::Value* scales = node.input(1);
    if (!scales || !scales->constant) return std::nullopt;
    for (int64_t i = 0; i < scales->constant->elementCount(); ++i) {
      settings.scales.push_back(scales->constant->elementAsDouble(i));
    }
    return settings;
  }
  auto transform = node.getString("coordinate_transformation_mode", "half_pixel");
  auto rounding = node.getString("nearest_mode", "round_prefer_floor");
  auto exclude = node.getInt("exclude_outside", 0);
  auto antialias = node.getInt("antialias", 0);
  if (!transform.isOk() || !rounding.isOk() || !exclude.isOk() || !antialias.isOk()) {
    return std::nullopt;
  }
  if (node.opsetVersion >= 18 && *antialias != 0) return std::nullopt;
  if (settings.linear && *exclude != 0) return std::nullopt;
  auto t = lookup<Transform>(*transform, {{"half_pixel", Transform::kHalfPixel},
                                          {"half_pixel_symmetric", Transform::kHalfPixelSymmetric},
                                          {"pytorch_half_pixel", Transform::kPytorchHalfPixel},
                                          {"align_corners", Transform::kAlignCorners},
                                          {"asymmetric", Transform::kAsymmetric},
                                          {"tf_half_pixel_for_nn", Transform::kTfHalfPixelForNn}});
  auto r = lookup<Rounding>(*rounding, {{"round_prefer_floor", Rounding::kRoundPreferFloor},
                                        {"round_prefer_ceil", Rounding::kRoundPreferCeil},
                                        {"floor", Rounding::kFloor},
                                        {"ceil", Rounding::kCeil}});
  if (!t || !r) return std::nullopt;
  settings.transform = *t;
  settings.rounding = *r;
  auto scales = modernScales(node);
  if (!scales) return std::nullopt;
  settings.scales = std::move(*scales);
  return settings;
}

// Where output coordinate x of an axis lies in the input, in input elements.
double originalCoordinate(const Settings& settings, size_t axis, int64_t x, int64_t inSize,
                          int64_t outSize) {
  const double scale = settings.scales[axis];
  // Measured in fractional output elements, not the rounded size, as the reference does.
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
  }
  return xd / scale;
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
    case Rounding::kLegacy:
      right = true;
      break;
  }
  return static_cast<int64_t>(left) + (right ? 1 : 0);
}

// The two linear taps of one output coordinate: input indices (clamped) and weights.
struct LinearTaps {
  int64_t index[2];
  double weight[2];
};

LinearTaps linearTaps(const Settings& settings, size_t axis, int64_t x, int64_t inSize,
                      int64_t outSize) {
  const double original = originalCoordinate(settings, axis, x, inSize, outSize);
  // The left neighbour lies strictly below the point, so the ratio is in (0, 1].
  const double ceiling = std::ceil(original);
  const double ratio = original - (ceiling - 1);
  const int64_t first = static_cast<int64_t>(ceiling) - 1;
  LinearTaps taps;
  taps.weight[0] = 1 - ratio;
  taps.weight[1] = ratio;
  taps.index[0] = std::clamp<int64_t>(first, 0, inSize - 1);
  taps.index[1] = std::clamp<int64_t>(first + 1, 0, inSize - 1);
  return taps;
}

class BilinearStep : public Step {
 public:
  BilinearStep(int64_t planes, int64_t inH, int64_t inW, std::vector<LinearTaps> rows,
               std::vector<LinearTaps> cols)
      : planes_(planes), inH_(inH), inW_(inW), rows_(std::move(rows)), cols_(std::move(cols)) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    const int64_t outH = static_cast<int64_t>(rows_.size());
    const int64_t outW = static_cast<int64_t>(cols_.size());
    // Four taps per output element: count a row as four rows of a select.
    context.pool().parallelFor(
        planes_ * outH, grainFor(outW * 16, kComputeChunkBytes), [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const int64_t plane = r / outH;
            const LinearTaps& v = rows_[static_cast<size_t>(r % outH)];
            const float* row0 = x + (plane * inH_ + v.index[0]) * inW_;
            const float* row1 = x + (plane * inH_ + v.index[1]) * inW_;
            float* out = y + r * outW;
            for (int64_t c = 0; c < outW; ++c) {
              const LinearTaps& h = cols_[static_cast<size_t>(c)];
              // The reference's sum over the tensor product of taps, in its order.
              double sum = 0;
              sum += v.weight[0] * h.weight[0] * static_cast<double>(row0[h.index[0]]);
              sum += v.weight[0] * h.weight[1] * static_cast<double>(row0[h.index[1]]);
              sum += v.weight[1] * h.weight[0] * static_cast<double>(row1[h.index[0]]);
              sum += v.weight[1] * h.weight[1] * static_cast<double>(row1[h.index[1]]);
              out[c] = static_cast<float>(sum);
            }
          }
        });
    return Status::ok();
  }

 private:
  int64_t planes_, inH_, inW_;
  std::vector<LinearTaps> rows_, cols_;
};

class NearestStep : public Step {
 public:
  explicit NearestStep(AxisGather gather) : gather_(std::move(gather)) {}

  Status run(const ExecutionContext& context) const override {
    gather_.run(context.address(*inputs[0]), context.address(*outputs[0]), context.pool());
    return Status::ok();
  }

 private:
  AxisGather gather_;
};

std::unique_ptr<Step> makeNearest(const Settings& settings, const ir::Shape& in,
                                  const ir::Shape& out, size_t elementSize) {
  const std::vector<int64_t> strides = in.strides();
  std::vector<std::vector<int64_t>> offsets(in.rank());
  for (size_t a = 0; a < in.rank(); ++a) {
    for (int64_t o = 0; o < out[a]; ++o) {
      const double original = originalCoordinate(settings, a, o, in[a], out[a]);
      const int64_t index = std::clamp<int64_t>(
          nearestIndex(settings.rounding, original, settings.scales[a]), 0, in[a] - 1);
      offsets[a].push_back(index * strides[a]);
    }
  }
  auto step = std::make_unique<NearestStep>(AxisGather(std::move(offsets), elementSize));
  step->tactic = "fast.resize_nearest";
  return step;
}

std::unique_ptr<Step> makeBilinear(const Settings& settings, const ir::Shape& in,
                                   const ir::Shape& out) {
  const size_t rank = in.rank();
  if (rank < 2) return nullptr;
  // Each leading axis must map output coordinate o onto input coordinate o alone (weight 1,
  // the other tap weight 0): then the reference's product of weights is the last two axes'.
  int64_t planes = 1;
  for (size_t a = 0; a + 2 < rank; ++a) {
    if (in[a] != out[a]) return nullptr;
    for (int64_t o = 0; o < out[a]; ++o) {
      const LinearTaps taps = linearTaps(settings, a, o, in[a], out[a]);
      const bool identity = (taps.weight[0] == 0 && taps.weight[1] == 1 && taps.index[1] == o) ||
                            (taps.weight[0] == 1 && taps.weight[1] == 0 && taps.index[0] == o);
      if (!identity) return nullptr;
    }
    planes *= in[a];
  }
  std::vector<LinearTaps> rows, cols;
  for (int64_t o = 0; o < out[rank - 2]; ++o) {
    rows.push_back(linearTaps(settings, rank - 2, o, in[rank - 2], out[rank - 2]));
  }
  for (int64_t o = 0; o < out[rank - 1]; ++o) {
    cols.push_back(linearTaps(settings, rank - 1, o, in[rank - 1], out[rank - 1]));
  }
  auto step = std::make_unique<BilinearStep>(planes, in[rank - 2], in[rank - 1], std::move(rows),
                                             std::move(cols));
  step->tactic = "fast.resize_linear";
  return step;
}

}  // namespace

std::unique_ptr<Step> makeResizeStep(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const ir::Shape& in = x->shape;
  const ir::Shape& out = y->shape;
  if (in.rank() == 0 || out.rank() != in.rank() || x->dtype != y->dtype) return nullptr;
  for (size_t a = 0; a < in.rank(); ++a) {
    if (in[a] <= 0 || out[a] <= 0) return nullptr;
  }
  std::optional<Settings> settings = readSettings(node);
  if (!settings || settings->scales.size() != in.rank()) return nullptr;
  if (!settings->linear) return makeNearest(*settings, in, out, ir::dtypeSize(x->dtype));
  if (x->dtype != ir::DType::kFloat32) return nullptr;
  return makeBilinear(*settings, in, out);
}

}  // namespace kiln::cpu::datamove
