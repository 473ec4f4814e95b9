// Shape inference for the neural-network ops: convolutions, pooling, normalizations, Gemm,
// MatMul and Einsum.
#include "kiln/ir/ops/neural.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

template <typename... Args>
Status nodeError(const Node& node, fmt::format_string<Args...> format, Args&&... args) {
  return invalidInput("{}: {}", node.describe(), fmt::format(format, std::forward<Args>(args)...));
}

std::string formatInts(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ","));
}

// Pads in attribute order: [begin..., end...].
std::string formatPads(const WindowGeometry& g) {
  std::vector<int64_t> pads = g.padsBegin;
  pads.insert(pads.end(), g.padsEnd.begin(), g.padsEnd.end());
  return formatInts(pads);
}

int64_t ceilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
int64_t floorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// ---------------------------------------------------------------------------------------------
// Window geometry.

// Window attributes (kernel extents, strides, dilations, pads) are bounded so that the int64
// arithmetic on them cannot overflow for any input extent kiln accepts (below 2^40).
constexpr int64_t kMaxWindowValue = int64_t{1} << 30;

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

Result<AutoPad> readAutoPad(const Node& node) {
  KILN_ASSIGN_OR_RETURN(std::string text, node.getString("auto_pad", "NOTSET"));
  if (text == "NOTSET") return AutoPad::kNotSet;
  if (text == "SAME_UPPER") return AutoPad::kSameUpper;
  if (text == "SAME_LOWER") return AutoPad::kSameLower;
  if (text == "VALID") return AutoPad::kValid;
  return nodeError(node, "auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", text);
}

// An ints attribute with `count` values in [minValue, kMaxWindowValue]; absent or empty gives
// `count` copies of `defaultValue`.
Result<std::vector<int64_t>> readWindowInts(const Node& node, const std::string& name, size_t count,
                                            int64_t defaultValue, int64_t minValue) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> values, node.getInts(name, {}));
  if (values.empty()) return std::vector<int64_t>(count, defaultValue);
  if (values.size() != count) {
    return nodeError(node, "attribute '{}' {} has {} values, expected {}", name, formatInts(values),
                     values.size(), count);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < minValue || values[i] > kMaxWindowValue) {
      return nodeError(node, "attribute '{}' {}: value {} at position {} is outside [{}, {}]", name,
                       formatInts(values), values[i], i, minValue, kMaxWindowValue);
    }
  }
  return values;
}

Status checkWindowInput(const Node& node, const Shape& x) {
  if (x.rank() < 3) {
    return nodeError(node, "input X has shape {}; expected rank 3 or more ([N, C, D1, ...])",
                     x.toString());
  }
  return Status::ok();
}

// The spatial kernel of a weight tensor, checked against the optional kernel_shape attribute.
Result<std::vector<int64_t>> kernelFromWeight(const Node& node, const Shape& x, const Shape& w) {
  if (w.rank() != x.rank()) {
    return nodeError(node, "weight W has shape {}; expected rank {} to match X {}", w.toString(),
                     x.rank(), x.toString());
  }
  std::vector<int64_t> kernel(w.dims().begin() + 2, w.dims().end());
  for (int64_t extent : kernel) {
    if (extent < 1 || extent > kMaxWindowValue) {
      return nodeError(node, "weight W has shape {}; kernel extents must be in [1, {}]",
                       w.toString(), kMaxWindowValue);
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> declared, node.getInts("kernel_shape", {}));
  if (!declared.empty() && declared != kernel) {
    return nodeError(node, "kernel_shape {} does not match weight shape {}", formatInts(declared),
                     w.toString());
  }
  return kernel;
}

// Input extent, kernel, strides and dilations; pads and output are left to the caller.
Result<WindowGeometry> readWindow(const Node& node, const Shape& x, std::vector<int64_t> kernel) {
  const size_t spatial = x.rank() - 2;
  WindowGeometry g;
  g.input.assign(x.dims().begin() + 2, x.dims().end());
  g.kernel = std::move(kernel);
  KILN_ASSIGN_OR_RETURN(g.strides, readWindowInts(node, "strides", spatial, 1, 1));
  KILN_ASSIGN_OR_RETURN(g.dilations, readWindowInts(node, "dilations", spatial, 1, 1));
  return g;
}

// The pads attribute, [begin..., end...], into g.
Status readPads(const Node& node, WindowGeometry& g) {
  const size_t spatial = g.spatialRank();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, readWindowInts(node, "pads", 2 * spatial, 0, 0));
  g.padsBegin.assign(pads.begin(), pads.begin() + static_cast<int64_t>(spatial));
  g.padsEnd.assign(pads.begin() + static_cast<int64_t>(spatial), pads.end());
  return Status::ok();
}

// Where auto_pad or output_shape determine the pads, a pads attribute may only restate them: ONNX
// lets neither win, so a contradiction is the model's error.
Status checkPadsAgree(const Node& node, const WindowGeometry& declared,
                      const WindowGeometry& resolved, const std::string& source) {
  const std::vector<int64_t> noPads(declared.spatialRank(), 0);
  const bool anyDeclared = declared.padsBegin != noPads || declared.padsEnd != noPads;
  if (!anyDeclared ||
      (declared.padsBegin == resolved.padsBegin && declared.padsEnd == resolved.padsEnd)) {
    return Status::ok();
  }
  return nodeError(node, "pads {} disagree with {}, which implies pads {}", formatPads(declared),
                   source, formatPads(resolved));
}

Status checkAutoPadAgrees(const Node& node, AutoPad autoPad, const WindowGeometry& declared,
                          const WindowGeometry& resolved) {
  if (autoPad == AutoPad::kNotSet) return Status::ok();
  KILN_ASSIGN_OR_RETURN(std::string text, node.getString("auto_pad", ""));
  return checkPadsAgree(node, declared, resolved, "auto_pad " + text);
}

int64_t dilatedExtent(const WindowGeometry& g, size_t axis) {
  return (g.kernel[axis] - 1) * g.dilations[axis] + 1;
}

// Output extents and final pads of a forward window (Conv and the pools).
Status resolveForwardWindow(const Node& node, AutoPad autoPad, bool ceilMode, WindowGeometry& g) {
  const size_t spatial = g.spatialRank();
  g.output.assign(spatial, 0);
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t extent = dilatedExtent(g, i);
    const int64_t in = g.input[i];
    const int64_t stride = g.strides[i];
    if (autoPad == AutoPad::kSameUpper || autoPad == AutoPad::kSameLower) {
      g.output[i] = ceilDiv(in, stride);
      const int64_t total = std::max<int64_t>(0, (g.output[i] - 1) * stride + extent - in);
      const int64_t smaller = total / 2;
      g.padsBegin[i] = autoPad == AutoPad::kSameUpper ? smaller : total - smaller;
      g.padsEnd[i] = total - g.padsBegin[i];
      continue;
    }
    if (autoPad == AutoPad::kValid) g.padsBegin[i] = g.padsEnd[i] = 0;
    const int64_t padded = in + g.padsBegin[i] + g.padsEnd[i];
    if (padded < extent) {
      return nodeError(node,
                       "spatial axis {}: the (dilated) kernel spans {} positions but the padded "
                       "input has only {}",
                       i, extent, padded);
    }
    const int64_t span = padded - extent;
    if (ceilMode) {
      g.output[i] = ceilDiv(span, stride) + 1;
      // A last window that would start in the end padding is dropped.
      if ((g.output[i] - 1) * stride >= in + g.padsBegin[i]) --g.output[i];
    } else {
      g.output[i] = span / stride + 1;
    }
  }
  return Status::ok();
}

// Splits a ConvTranspose's total padding; SAME_UPPER puts the larger half at the start.
void splitTransposePadding(int64_t total, bool upper, int64_t& begin, int64_t& end) {
  const int64_t half = floorDiv(total, 2);
  begin = upper ? half : total - half;
  end = total - begin;
}

Result<std::vector<int64_t>> readTransposeOutputShape(const Node& node, size_t spatial) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> values, node.getInts("output_shape", {}));
  if (values.empty()) return values;
  // Some exporters write the full [N, M, D1, ...] shape; only the spatial part matters.
  if (values.size() == spatial + 2) values.erase(values.begin(), values.begin() + 2);
  if (values.size() != spatial) {
    return nodeError(node, "attribute 'output_shape' {} has {} values, expected {}",
                     formatInts(values), values.size(), spatial);
  }
  for (int64_t v : values) {
    if (v < 0 || v > kMaxTensorElements) {
      return nodeError(node, "attribute 'output_shape' {} has an out-of-range value {}",
                       formatInts(values), v);
    }
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// Dtype checks.

std::vector<DType> floatTypes(bool withBFloat16) {
  std::vector<DType> types = {DType::kFloat16, DType::kFloat32, DType::kFloat64};
  if (withBFloat16) types.push_back(DType::kBFloat16);
  return types;
}

Status checkDType(const InferContext& ctx, size_t input, const char* role,
                  const std::vector<DType>& allowed) {
  const DType dtype = ctx.inputType(input);
  if (std::find(allowed.begin(), allowed.end(), dtype) != allowed.end()) return Status::ok();
  std::vector<std::string_view> names;
  for (DType t : allowed) names.push_back(dtypeName(t));
  return ctx.error("input {} ({}) has dtype {}; {} at opset {} accepts {}", input, role,
                   dtypeName(dtype), ctx.node().opType, ctx.opset(), fmt::join(names, ", "));
}

Status checkSameDType(const InferContext& ctx, size_t input, const char* role, size_t reference) {
  if (!ctx.hasInput(input) || ctx.inputType(input) == ctx.inputType(reference)) {
    return Status::ok();
  }
  return ctx.error("input {} ({}) has dtype {}, but input {} has {}; they must match", input, role,
                   dtypeName(ctx.inputType(input)), reference, dtypeName(ctx.inputType(reference)));
}

Status requireOpset(const InferContext& ctx, int since) {
  if (ctx.opset() >= since) return Status::ok();
  return ctx.error("{} exists from opset {} on", ctx.node().opType, since);
}

// Whether `from` broadcasts to exactly `to` (ONNX unidirectional broadcasting).
bool broadcastsTo(const Shape& from, const Shape& to) {
  if (from.rank() > to.rank()) return false;
  const size_t offset = to.rank() - from.rank();
  for (size_t i = 0; i < from.rank(); ++i) {
    if (from[i] != 1 && from[i] != to[offset + i]) return false;
  }
  return true;
}

Status checkChannelVector(const InferContext& ctx, size_t input, const char* role,
                          int64_t channels) {
  const Shape& shape = ctx.inputShape(input);
  if (shape.rank() == 1 && shape[0] == channels) return Status::ok();
  return ctx.error("input {} ({}) has shape {}; expected [{}] (one value per channel)", input, role,
                   shape.toString(), channels);
}

Result<int64_t> readGroup(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.node().getInt("group", 1));
  if (group < 1) return ctx.error("group must be at least 1, got {}", group);
  return group;
}

// ---------------------------------------------------------------------------------------------
// Convolutions.

Status inferConv(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(false)));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "W", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 2, "B", 0));
  const Shape& x = ctx.inputShape(0);
  const Shape& w = ctx.inputShape(1);
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, resolveConvGeometry(ctx.node(), x, w));
  KILN_ASSIGN_OR_RETURN(int64_t group, readGroup(ctx));
  if (w[1] * group != x[1]) {
    return ctx.error("X {} has {} channels, but W {} with group {} expects {}", x.toString(), x[1],
                     w.toString(), group, w[1] * group);
  }
  if (w[0] % group != 0) {
    return ctx.error("W {} has {} output channels, which group {} does not divide", w.toString(),
                     w[0], group);
  }
  if (ctx.hasInput(2)) KILN_RETURN_IF_ERROR(checkChannelVector(ctx, 2, "B", w[0]));
  std::vector<int64_t> dims = {x[0], w[0]};
  dims.insert(dims.end(), g.output.begin(), g.output.end());
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

Status inferConvTranspose(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(false)));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "W", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 2, "B", 0));
  const Shape& x = ctx.inputShape(0);
  const Shape& w = ctx.inputShape(1);
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, resolveConvTransposeGeometry(ctx.node(), x, w));
  KILN_ASSIGN_OR_RETURN(int64_t group, readGroup(ctx));
  if (w[0] != x[1]) {
    return ctx.error("W {} must have X's channel count {} as its first dimension", w.toString(),
                     x[1]);
  }
  if (x[1] % group != 0) {
    return ctx.error("X {} has {} channels, which group {} does not divide", x.toString(), x[1],
                     group);
  }
  const int64_t outChannels = w[1] * group;
  if (ctx.hasInput(2)) KILN_RETURN_IF_ERROR(checkChannelVector(ctx, 2, "B", outChannels));
  std::vector<int64_t> dims = {x[0], outChannels};
  dims.insert(dims.end(), g.output.begin(), g.output.end());
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Pooling.

Shape pooledShape(const Shape& x, const std::vector<int64_t>& spatial) {
  std::vector<int64_t> dims = {x[0], x[1]};
  dims.insert(dims.end(), spatial.begin(), spatial.end());
  return Shape(std::move(dims));
}

Status checkFlag(const InferContext& ctx, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(int64_t value, ctx.node().getInt(name, 0));
  if (value != 0 && value != 1)
    return ctx.error("attribute '{}' must be 0 or 1, got {}", name, value);
  return Status::ok();
}

Status inferMaxPool(InferContext& ctx) {
  std::vector<DType> allowed = floatTypes(false);
  if (ctx.opset() >= 12) {
    allowed.push_back(DType::kInt8);
    allowed.push_back(DType::kUInt8);
  }
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", allowed));
  KILN_RETURN_IF_ERROR(checkFlag(ctx, "storage_order"));
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, resolvePoolGeometry(ctx.node(), ctx.inputShape(0)));
  const Shape out = pooledShape(ctx.inputShape(0), g.output);
  ctx.setOutput(0, ctx.inputType(0), out);
  if (ctx.outputCount() > 1) {
    if (ctx.opset() < 8) return ctx.error("the Indices output exists from opset 8 on");
    ctx.setOutput(1, DType::kInt64, out);
  }
  return Status::ok();
}

Status inferAveragePool(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(false)));
  KILN_RETURN_IF_ERROR(checkFlag(ctx, "count_include_pad"));
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, resolvePoolGeometry(ctx.node(), ctx.inputShape(0)));
  ctx.setOutput(0, ctx.inputType(0), pooledShape(ctx.inputShape(0), g.output));
  return Status::ok();
}

Status inferLpPool(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(false)));
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.node().getInt("p", 2));
  if (p < 1) return ctx.error("p must be at least 1, got {}", p);
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, resolvePoolGeometry(ctx.node(), ctx.inputShape(0)));
  ctx.setOutput(0, ctx.inputType(0), pooledShape(ctx.inputShape(0), g.output));
  return Status::ok();
}

Status inferGlobalPool(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(false)));
  const Shape& x = ctx.inputShape(0);
  KILN_RETURN_IF_ERROR(checkWindowInput(ctx.node(), x));
  ctx.setOutput(0, ctx.inputType(0), pooledShape(x, std::vector<int64_t>(x.rank() - 2, 1)));
  return Status::ok();
}

Status inferLrn(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(ctx.opset() >= 13)));
  KILN_RETURN_IF_ERROR(ctx.node().requireAttribute("size"));
  KILN_ASSIGN_OR_RETURN(int64_t size, ctx.node().getInt("size", 0));
  if (size < 1) return ctx.error("size must be at least 1, got {}", size);
  KILN_RETURN_IF_ERROR(checkWindowInput(ctx.node(), ctx.inputShape(0)));
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Normalizations.

// BatchNormalization's dtype rules: one type for all inputs before opset 14; at 14 mean and var
// may differ from X; from 15 scale and B may too.
Status checkBatchNormDTypes(const InferContext& ctx) {
  const std::vector<DType> floats = floatTypes(ctx.opset() >= 14);
  static const char* const kRoles[] = {"X", "scale", "B", "input_mean", "input_var"};
  for (size_t i = 0; i < 5; ++i) KILN_RETURN_IF_ERROR(checkDType(ctx, i, kRoles[i], floats));
  if (ctx.opset() < 15) KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "scale", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 2, "B", 1));
  if (ctx.opset() < 14) KILN_RETURN_IF_ERROR(checkSameDType(ctx, 3, "input_mean", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 4, "input_var", 3));
  return Status::ok();
}

Status inferBatchNormalization(InferContext& ctx) {
  const Node& node = ctx.node();
  KILN_ASSIGN_OR_RETURN(int64_t training, node.getInt("training_mode", 0));
  if (training != 0) {
    return ctx.unsupportedHere("training_mode={} is not supported; kiln runs inference only",
                               training);
  }
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (node.outputs[i]) {
      return ctx.unsupportedHere(
          "output {} (running or saved statistics) exists only in training mode; kiln runs "
          "inference only",
          i);
    }
  }
  KILN_RETURN_IF_ERROR(checkBatchNormDTypes(ctx));
  const Shape& x = ctx.inputShape(0);
  if (x.rank() < 2) {
    return ctx.error("input X has shape {}; expected rank 2 or more ([N, C, ...])", x.toString());
  }
  KILN_ASSIGN_OR_RETURN(int64_t spatial, node.getInt("spatial", 1));
  static const char* const kRoles[] = {"scale", "B", "input_mean", "input_var"};
  for (size_t i = 1; i < 5; ++i) {
    if (ctx.opset() < 9 && spatial == 0) {
      // Per-activation statistics: one value for each element of a sample.
      const Shape sample(std::vector<int64_t>(x.dims().begin() + 1, x.dims().end()));
      // The kernel indexes them flat, so only their count matters.
      if (ctx.inputShape(i).elementCount() != sample.elementCount()) {
        return ctx.error("input {} ({}) has shape {}; with spatial=0 expected {}", i, kRoles[i - 1],
                         ctx.inputShape(i).toString(), sample.toString());
      }
    } else {
      KILN_RETURN_IF_ERROR(checkChannelVector(ctx, i, kRoles[i - 1], x[1]));
    }
  }
  ctx.setOutput(0, ctx.inputType(0), x);
  return Status::ok();
}

// LayerNormalization's stash_type as a dtype: the type of Mean and InvStdDev.
Result<DType> stashType(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t stash, ctx.node().getInt("stash_type", 1));
  if (stash == 1) return DType::kFloat32;
  if (stash == 16) return DType::kBFloat16;
  return ctx.error("stash_type {} is not 1 (float) or 16 (bfloat16)", stash);
}

Status inferLayerNormalization(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(requireOpset(ctx, 17));
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(true)));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "Scale", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 2, "B", 0));
  const Shape& x = ctx.inputShape(0);
  if (x.rank() < 1) return ctx.error("input X must have rank 1 or more, got a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
  auto axis = normalizeAxis(rawAxis, static_cast<int64_t>(x.rank()));
  if (!axis.isOk()) return ctx.error("{}", axis.status().message());
  for (size_t i = 1; i < 3; ++i) {
    if (ctx.hasInput(i) && !broadcastsTo(ctx.inputShape(i), x)) {
      return ctx.error("input {} ({}) has shape {}, which does not broadcast to X {}", i,
                       i == 1 ? "Scale" : "B", ctx.inputShape(i).toString(), x.toString());
    }
  }
  KILN_ASSIGN_OR_RETURN(DType stash, stashType(ctx));
  std::vector<int64_t> statDims = x.dims();
  std::fill(statDims.begin() + *axis, statDims.end(), 1);
  ctx.setOutput(0, ctx.inputType(0), x);
  for (size_t i = 1; i < ctx.outputCount(); ++i) ctx.setOutput(i, stash, Shape(statDims));
  return Status::ok();
}

Status inferInstanceNormalization(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "input", floatTypes(false)));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "scale", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 2, "B", 0));
  const Shape& x = ctx.inputShape(0);
  KILN_RETURN_IF_ERROR(checkWindowInput(ctx.node(), x));
  KILN_RETURN_IF_ERROR(checkChannelVector(ctx, 1, "scale", x[1]));
  KILN_RETURN_IF_ERROR(checkChannelVector(ctx, 2, "B", x[1]));
  ctx.setOutput(0, ctx.inputType(0), x);
  return Status::ok();
}

Status inferLpNormalization(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "input", floatTypes(false)));
  const Shape& x = ctx.inputShape(0);
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
  auto axis = normalizeAxis(rawAxis, static_cast<int64_t>(x.rank()));
  if (!axis.isOk() || x.rank() == 0) {
    return ctx.error("axis {} is out of range for input of shape {}", rawAxis, x.toString());
  }
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.node().getInt("p", 2));
  if (p != 1 && p != 2) return ctx.error("p must be 1 or 2, got {}", p);
  ctx.setOutput(0, ctx.inputType(0), x);
  return Status::ok();
}

Status inferMeanVarianceNormalization(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(requireOpset(ctx, 9));
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "X", floatTypes(ctx.opset() >= 13)));
  const Shape& x = ctx.inputShape(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.node().getInts("axes", {0, 2, 3}));
  std::set<int64_t> seen;
  for (int64_t rawAxis : axes) {
    auto axis = normalizeAxis(rawAxis, static_cast<int64_t>(x.rank()));
    if (!axis.isOk()) {
      return ctx.error("axes {}: axis {} is out of range for X of shape {}", formatInts(axes),
                       rawAxis, x.toString());
    }
    if (!seen.insert(*axis).second) {
      return ctx.error("axes {} names axis {} twice", formatInts(axes), *axis);
    }
  }
  ctx.setOutput(0, ctx.inputType(0), x);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Gemm, MatMul, Einsum.

std::vector<DType> linearAlgebraTypes(int opset) {
  std::vector<DType> types = floatTypes(opset >= 13);
  if (opset >= 9) {
    types.insert(types.end(), {DType::kInt32, DType::kInt64, DType::kUInt32, DType::kUInt64});
  }
  return types;
}

Status inferGemm(InferContext& ctx) {
  const Node& node = ctx.node();
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "A", linearAlgebraTypes(ctx.opset())));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "B", 0));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 2, "C", 0));
  const Shape& a = ctx.inputShape(0);
  const Shape& b = ctx.inputShape(1);
  if (a.rank() != 2 || b.rank() != 2) {
    return ctx.error("A {} and B {} must both be matrices (rank 2)", a.toString(), b.toString());
  }
  KILN_ASSIGN_OR_RETURN(int64_t transA, node.getInt("transA", 0));
  KILN_ASSIGN_OR_RETURN(int64_t transB, node.getInt("transB", 0));
  const int64_t m = transA ? a[1] : a[0];
  const int64_t k = transA ? a[0] : a[1];
  const int64_t kB = transB ? b[1] : b[0];
  const int64_t n = transB ? b[0] : b[1];
  if (k != kB) {
    return ctx.error(
        "inner dimensions differ: A {} (transA={}) gives K={}, B {} (transB={}) "
        "gives K={}",
        a.toString(), transA, k, b.toString(), transB, kB);
  }
  const Shape out{m, n};
  if (!ctx.hasInput(2)) {
    if (ctx.opset() < 11) return ctx.error("input C is required before opset 11");
  } else {
    const Shape& c = ctx.inputShape(2);
    KILN_ASSIGN_OR_RETURN(int64_t broadcast, node.getInt("broadcast", 1));
    if (ctx.opset() < 7 && broadcast == 0 && c != out) {
      return ctx.error("with broadcast=0, C {} must have the output shape {}", c.toString(),
                       out.toString());
    }
    if (!broadcastsTo(c, out)) {
      return ctx.error("C {} does not broadcast to the output shape {}", c.toString(),
                       out.toString());
    }
  }
  ctx.setOutput(0, ctx.inputType(0), out);
  return Status::ok();
}

Status inferMatMul(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "A", linearAlgebraTypes(ctx.opset())));
  KILN_RETURN_IF_ERROR(checkSameDType(ctx, 1, "B", 0));
  const Shape& a = ctx.inputShape(0);
  const Shape& b = ctx.inputShape(1);
  if (a.rank() == 0 || b.rank() == 0) {
    return ctx.error("A {} and B {} must have rank 1 or more", a.toString(), b.toString());
  }
  // numpy promotion: a vector A is a row, a vector B a column; the added axes are dropped again.
  const int64_t k = a[a.rank() - 1];
  const int64_t kB = b.rank() == 1 ? b[0] : b[b.rank() - 2];
  if (k != kB) {
    return ctx.error("inner dimensions differ: A {} has {} columns, B {} has {} rows", a.toString(),
                     k, b.toString(), kB);
  }
  const Shape batchA(
      std::vector<int64_t>(a.dims().begin(), a.dims().end() - std::min<int64_t>(2, a.rank())));
  const Shape batchB(
      std::vector<int64_t>(b.dims().begin(), b.dims().end() - std::min<int64_t>(2, b.rank())));
  auto batch = broadcastShapes(batchA, batchB);
  if (!batch.isOk()) {
    return ctx.error("batch dimensions of A {} and B {} do not broadcast", a.toString(),
                     b.toString());
  }
  std::vector<int64_t> dims = batch->dims();
  if (a.rank() >= 2) dims.push_back(a[a.rank() - 2]);
  if (b.rank() >= 2) dims.push_back(b[b.rank() - 1]);
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

Status inferEinsum(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(requireOpset(ctx, 12));
  const std::vector<DType> allowed = {DType::kFloat16, DType::kFloat32, DType::kFloat64,
                                      DType::kInt8,    DType::kInt16,   DType::kInt32,
                                      DType::kInt64,   DType::kUInt8,   DType::kUInt16,
                                      DType::kUInt32,  DType::kUInt64};
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, "Inputs", allowed));
  std::vector<Shape> shapes;
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    if (!ctx.hasInput(i)) return ctx.error("input {} is missing", i);
    KILN_RETURN_IF_ERROR(checkSameDType(ctx, i, "Inputs", 0));
    shapes.push_back(ctx.inputShape(i));
  }
  KILN_ASSIGN_OR_RETURN(EinsumPlan plan, planEinsum(ctx.node(), shapes));
  ctx.setOutput(0, ctx.inputType(0), plan.outputShape);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Einsum equations.

// One term of an equation: letters, with kEllipsis where "..." stands.
constexpr int kEllipsis = -1;

Result<std::vector<int>> parseEinsumTerm(const Node& node, std::string_view term) {
  std::vector<int> items;
  bool ellipsis = false;
  for (size_t i = 0; i < term.size();) {
    const char c = term[i];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      items.push_back(c);
      ++i;
    } else if (term.substr(i, 3) == "...") {
      if (ellipsis) return nodeError(node, "einsum term '{}' has more than one '...'", term);
      ellipsis = true;
      items.push_back(kEllipsis);
      i += 3;
    } else {
      return nodeError(node, "einsum term '{}' has an invalid character '{}'", term, c);
    }
  }
  return items;
}

struct EinsumEquation {
  std::vector<std::vector<int>> inputs;
  std::vector<int> output;
  bool explicitOutput = false;
};

Result<EinsumEquation> parseEinsumEquation(const Node& node, size_t operandCount) {
  KILN_RETURN_IF_ERROR(node.requireAttribute("equation"));
  KILN_ASSIGN_OR_RETURN(std::string text, node.getString("equation", ""));
  std::string equation;
  for (char c : text) {
    if (c != ' ' && c != '\t') equation.push_back(c);
  }
  EinsumEquation parsed;
  std::string_view lhs = equation;
  const size_t arrow = equation.find("->");
  if (arrow != std::string::npos) {
    lhs = std::string_view(equation).substr(0, arrow);
    KILN_ASSIGN_OR_RETURN(parsed.output,
                          parseEinsumTerm(node, std::string_view(equation).substr(arrow + 2)));
    parsed.explicitOutput = true;
  }
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    KILN_ASSIGN_OR_RETURN(std::vector<int> term,
                          parseEinsumTerm(node, lhs.substr(start, comma - start)));
    parsed.inputs.push_back(std::move(term));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (parsed.inputs.size() != operandCount) {
    return nodeError(node, "equation '{}' has {} input terms, but the node has {} inputs", text,
                     parsed.inputs.size(), operandCount);
  }
  return parsed;
}

// Binds each operand axis to a label: ellipsis axes get labels [0, broadcastRank), right-aligned
// across operands as numpy broadcasting aligns them; letters follow in ASCII order.
struct EinsumBinding {
  size_t broadcastRank = 0;
  std::map<int, size_t> letterLabels;
  std::vector<std::vector<size_t>> axisLabels;  // per operand, per axis
};

Result<EinsumBinding> bindEinsumLabels(const Node& node, const EinsumEquation& equation,
                                       const std::vector<Shape>& shapes) {
  EinsumBinding binding;
  std::vector<size_t> ellipsisRanks(shapes.size(), 0);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto& term = equation.inputs[k];
    const size_t letters = std::count_if(term.begin(), term.end(), [](int c) { return c >= 0; });
    const bool hasEllipsis = letters != term.size();
    if (shapes[k].rank() < letters || (!hasEllipsis && shapes[k].rank() != letters)) {
      return nodeError(node, "operand {} has shape {}, but its einsum term names {} axes{}", k,
                       shapes[k].toString(), letters, hasEllipsis ? " besides '...'" : "");
    }
    ellipsisRanks[k] = shapes[k].rank() - letters;
    binding.broadcastRank = std::max(binding.broadcastRank, ellipsisRanks[k]);
    for (int c : term) {
      if (c >= 0) binding.letterLabels[c] = 0;
    }
  }
  size_t next = binding.broadcastRank;
  for (auto& [letter, label] : binding.letterLabels) label = next++;
  for (size_t k = 0; k < shapes.size(); ++k) {
    std::vector<size_t> labels;
    for (int c : equation.inputs[k]) {
      if (c >= 0) {
        labels.push_back(binding.letterLabels[c]);
        continue;
      }
      for (size_t j = 0; j < ellipsisRanks[k]; ++j) {
        labels.push_back(binding.broadcastRank - ellipsisRanks[k] + j);
      }
    }
    binding.axisLabels.push_back(std::move(labels));
  }
  return binding;
}

std::string labelName(const EinsumBinding& binding, size_t label) {
  if (label < binding.broadcastRank) return fmt::format("'...' axis {}", label);
  for (const auto& [letter, id] : binding.letterLabels) {
    if (id == label) return fmt::format("'{}'", static_cast<char>(letter));
  }
  return "?";
}

// Label sizes, numpy-broadcast across operands; a label repeated within one operand (a
// diagonal) must have one size there.
Result<std::vector<int64_t>> sizeEinsumLabels(const Node& node, const EinsumBinding& binding,
                                              const std::vector<Shape>& shapes) {
  const size_t labelCount = binding.broadcastRank + binding.letterLabels.size();
  std::vector<int64_t> sizes(labelCount, 1);
  for (size_t k = 0; k < shapes.size(); ++k) {
    std::map<size_t, int64_t> own;
    for (size_t axis = 0; axis < shapes[k].rank(); ++axis) {
      const size_t label = binding.axisLabels[k][axis];
      const int64_t size = shapes[k][axis];
      auto [it, inserted] = own.emplace(label, size);
      if (!inserted && it->second != size) {
        return nodeError(node, "label {} repeats in operand {} {} with different sizes {} and {}",
                         labelName(binding, label), k, shapes[k].toString(), it->second, size);
      }
      if (size == 1) continue;
      if (sizes[label] != 1 && sizes[label] != size) {
        return nodeError(node, "label {} has size {} in operand {} {} but {} in another operand",
                         labelName(binding, label), size, k, shapes[k].toString(), sizes[label]);
      }
      sizes[label] = size;
    }
  }
  return sizes;
}

Result<std::vector<size_t>> einsumOutputLabels(const Node& node, const EinsumEquation& equation,
                                               const EinsumBinding& binding) {
  std::vector<size_t> labels;
  if (!equation.explicitOutput) {
    // numpy's implicit form: the broadcast axes, then the letters used exactly once, sorted.
    for (size_t j = 0; j < binding.broadcastRank; ++j) labels.push_back(j);
    std::map<int, int> uses;
    for (const auto& term : equation.inputs) {
      for (int c : term) {
        if (c >= 0) ++uses[c];
      }
    }
    for (const auto& [letter, count] : uses) {
      if (count == 1) labels.push_back(binding.letterLabels.at(letter));
    }
    return labels;
  }
  bool ellipsis = false;
  std::set<size_t> seen;
  for (int c : equation.output) {
    if (c == kEllipsis) {
      ellipsis = true;
      for (size_t j = 0; j < binding.broadcastRank; ++j) labels.push_back(j);
      continue;
    }
    auto it = binding.letterLabels.find(c);
    if (it == binding.letterLabels.end()) {
      return nodeError(node, "output label '{}' does not appear in any input term",
                       static_cast<char>(c));
    }
    if (!seen.insert(it->second).second) {
      return nodeError(node, "output label '{}' appears twice", static_cast<char>(c));
    }
    labels.push_back(it->second);
  }
  if (!ellipsis && binding.broadcastRank > 0) {
    return nodeError(node,
                     "the inputs have {} axes under '...', but the explicit output omits '...'",
                     binding.broadcastRank);
  }
  return labels;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public geometry and plan resolution.

Result<WindowGeometry> resolveConvGeometry(const Node& node, const Shape& x, const Shape& w) {
  KILN_RETURN_IF_ERROR(checkWindowInput(node, x));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, kernelFromWeight(node, x, w));
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, readWindow(node, x, std::move(kernel)));
  KILN_ASSIGN_OR_RETURN(AutoPad autoPad, readAutoPad(node));
  KILN_RETURN_IF_ERROR(readPads(node, g));
  const WindowGeometry declared = g;
  KILN_RETURN_IF_ERROR(resolveForwardWindow(node, autoPad, /*ceilMode=*/false, g));
  KILN_RETURN_IF_ERROR(checkAutoPadAgrees(node, autoPad, declared, g));
  return g;
}

Result<WindowGeometry> resolvePoolGeometry(const Node& node, const Shape& x) {
  KILN_RETURN_IF_ERROR(checkWindowInput(node, x));
  KILN_RETURN_IF_ERROR(node.requireAttribute("kernel_shape"));
  const size_t spatial = x.rank() - 2;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kernel,
                        readWindowInts(node, "kernel_shape", spatial, 1, 1));
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, readWindow(node, x, std::move(kernel)));
  KILN_ASSIGN_OR_RETURN(AutoPad autoPad, readAutoPad(node));
  KILN_RETURN_IF_ERROR(readPads(node, g));
  KILN_ASSIGN_OR_RETURN(int64_t ceilMode, node.getInt("ceil_mode", 0));
  if (ceilMode != 0 && ceilMode != 1) {
    return nodeError(node, "attribute 'ceil_mode' must be 0 or 1, got {}", ceilMode);
  }
  const WindowGeometry declared = g;
  KILN_RETURN_IF_ERROR(resolveForwardWindow(node, autoPad, ceilMode == 1, g));
  KILN_RETURN_IF_ERROR(checkAutoPadAgrees(node, autoPad, declared, g));
  return g;
}

Result<WindowGeometry> resolveConvTransposeGeometry(const Node& node, const Shape& x,
                                                    const Shape& w) {
  KILN_RETURN_IF_ERROR(checkWindowInput(node, x));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, kernelFromWeight(node, x, w));
  KILN_ASSIGN_OR_RETURN(WindowGeometry g, readWindow(node, x, std::move(kernel)));
  KILN_ASSIGN_OR_RETURN(AutoPad autoPad, readAutoPad(node));
  KILN_RETURN_IF_ERROR(readPads(node, g));
  const size_t spatial = g.spatialRank();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> outputPadding,
                        readWindowInts(node, "output_padding", spatial, 0, 0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> outputShape, readTransposeOutputShape(node, spatial));
  const bool same = autoPad == AutoPad::kSameUpper || autoPad == AutoPad::kSameLower;
  const WindowGeometry declared = g;
  g.output.assign(spatial, 0);
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = g.input[i];
    if (in < 1 || in - 1 > kMaxTensorElements / g.strides[i]) {
      return nodeError(node,
                       "spatial axis {} of X has extent {}, which with stride {} gives no "
                       "valid output",
                       i, in, g.strides[i]);
    }
    // The extent the transposed window covers before any padding is removed.
    const int64_t full = g.strides[i] * (in - 1) + outputPadding[i] + dilatedExtent(g, i);
    if (outputShape.empty() && !same) {
      if (autoPad == AutoPad::kValid) g.padsBegin[i] = g.padsEnd[i] = 0;
      g.output[i] = full - g.padsBegin[i] - g.padsEnd[i];
      if (g.output[i] < 0) {
        return nodeError(node, "spatial axis {}: pads {} and {} exceed the output extent {}", i,
                         g.padsBegin[i], g.padsEnd[i], full);
      }
      continue;
    }
    g.output[i] = !outputShape.empty() ? outputShape[i] : in * g.strides[i];
    splitTransposePadding(full - g.output[i], autoPad == AutoPad::kSameUpper, g.padsBegin[i],
                          g.padsEnd[i]);
  }
  if (!outputShape.empty()) {
    KILN_RETURN_IF_ERROR(
        checkPadsAgree(node, declared, g, fmt::format("output_shape {}", formatInts(outputShape))));
  }
  KILN_RETURN_IF_ERROR(checkAutoPadAgrees(node, autoPad, declared, g));
  return g;
}

Result<EinsumPlan> planEinsum(const Node& node, const std::vector<Shape>& operandShapes) {
  KILN_ASSIGN_OR_RETURN(EinsumEquation equation, parseEinsumEquation(node, operandShapes.size()));
  KILN_ASSIGN_OR_RETURN(EinsumBinding binding, bindEinsumLabels(node, equation, operandShapes));
  EinsumPlan plan;
  KILN_ASSIGN_OR_RETURN(plan.labelSizes, sizeEinsumLabels(node, binding, operandShapes));
  KILN_ASSIGN_OR_RETURN(plan.outputLabels, einsumOutputLabels(node, equation, binding));
  const size_t labelCount = plan.labelSizes.size();
  for (size_t k = 0; k < operandShapes.size(); ++k) {
    std::vector<int64_t> strides(labelCount, 0);
    const std::vector<int64_t> own = operandShapes[k].strides();
    for (size_t axis = 0; axis < operandShapes[k].rank(); ++axis) {
      // A size-1 axis under a larger label is broadcast: it never advances.
      if (operandShapes[k][axis] != 1) strides[binding.axisLabels[k][axis]] += own[axis];
    }
    plan.operandStrides.push_back(std::move(strides));
  }
  std::vector<int64_t> outputDims;
  std::vector<bool> kept(labelCount, false);
  for (size_t label : plan.outputLabels) {
    outputDims.push_back(plan.labelSizes[label]);
    kept[label] = true;
  }
  for (size_t label = 0; label < labelCount; ++label) {
    if (!kept[label]) plan.summedLabels.push_back(label);
  }
  plan.outputShape = Shape(std::move(outputDims));
  return plan;
}

void registerNeuralSchemas(OpRegistry& registry) {
  registry.add({.opType = "Conv", .minInputs = 2, .maxInputs = 3, .infer = inferConv});
  registry.add(
      {.opType = "ConvTranspose", .minInputs = 2, .maxInputs = 3, .infer = inferConvTranspose});
  registry.add({.opType = "MaxPool", .maxOutputs = 2, .infer = inferMaxPool});
  registry.add({.opType = "AveragePool", .infer = inferAveragePool});
  registry.add({.opType = "LpPool", .infer = inferLpPool});
  registry.add({.opType = "GlobalAveragePool", .infer = inferGlobalPool});
  registry.add({.opType = "GlobalMaxPool", .infer = inferGlobalPool});
  registry.add({.opType = "LRN", .infer = inferLrn});
  registry.add({.opType = "BatchNormalization",
                .minInputs = 5,
                .maxInputs = 5,
                .maxOutputs = 5,
                .infer = inferBatchNormalization});
  registry.add({.opType = "LayerNormalization",
                .minInputs = 2,
                .maxInputs = 3,
                .maxOutputs = 3,
                .infer = inferLayerNormalization});
  registry.add({.opType = "InstanceNormalization",
                .minInputs = 3,
                .maxInputs = 3,
                .infer = inferInstanceNormalization});
  registry.add({.opType = "LpNormalization", .infer = inferLpNormalization});
  registry.add({.opType = "MeanVarianceNormalization", .infer = inferMeanVarianceNormalization});
  registry.add({.opType = "Gemm", .minInputs = 2, .maxInputs = 3, .infer = inferGemm});
  registry.add({.opType = "MatMul", .minInputs = 2, .maxInputs = 2, .infer = inferMatMul});
  registry.add({.opType = "Einsum", .minInputs = 1, .maxInputs = 64, .infer = inferEinsum});
}

}  // namespace kiln::ir
