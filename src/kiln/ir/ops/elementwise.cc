// Shape inference for the elementwise ops: unary math and activations, numpy-broadcasting binary
// and variadic ops, comparisons and logic, Where, Clip, Cast/CastLike, Identity and Dropout.
#include <array>
#include <climits>
#include <span>
#include <string>
#include <vector>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

// A set of element types, one bit per DType: an op's ONNX type constraint.
using TypeSet = uint32_t;

constexpr TypeSet typeBit(DType dtype) { return TypeSet{1} << static_cast<int>(dtype); }

constexpr TypeSet kFloats = typeBit(DType::kFloat32) | typeBit(DType::kFloat16) |
                            typeBit(DType::kBFloat16) | typeBit(DType::kFloat64);
constexpr TypeSet kSignedInts = typeBit(DType::kInt64) | typeBit(DType::kInt32) |
                                typeBit(DType::kInt16) | typeBit(DType::kInt8);
constexpr TypeSet kUnsignedInts = typeBit(DType::kUInt64) | typeBit(DType::kUInt32) |
                                  typeBit(DType::kUInt16) | typeBit(DType::kUInt8);
constexpr TypeSet kInts = kSignedInts | kUnsignedInts;
constexpr TypeSet kNumbers = kFloats | kInts;
constexpr TypeSet kSignedNumbers = kFloats | kSignedInts;
constexpr TypeSet kBool = typeBit(DType::kBool);
constexpr TypeSet kAnyType = kNumbers | kBool;
// PRelu takes the 32- and 64-bit integers only.
constexpr TypeSet kPReluTypes = kFloats | typeBit(DType::kInt32) | typeBit(DType::kInt64) |
                                typeBit(DType::kUInt32) | typeBit(DType::kUInt64);

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                                DType::kInt64,   DType::kInt32,   DType::kInt16,    DType::kInt8,
                                DType::kUInt64,  DType::kUInt32,  DType::kUInt16,   DType::kUInt8,
                                DType::kBool};

std::string typeSetNames(TypeSet types) {
  std::string names;
  for (DType dtype : kAllDTypes) {
    if (!(types & typeBit(dtype))) continue;
    if (!names.empty()) names += ", ";
    names += dtypeName(dtype);
  }
  return names;
}

Status checkType(const InferContext& ctx, size_t input, TypeSet allowed) {
  const DType dtype = ctx.inputType(input);
  if (allowed & typeBit(dtype)) return Status::ok();
  return ctx.error("input {} has type {}; the op accepts {}", input, dtypeName(dtype),
                   typeSetNames(allowed));
}

Status checkSameType(const InferContext& ctx, size_t first, size_t other) {
  if (ctx.inputType(first) == ctx.inputType(other)) return Status::ok();
  return ctx.error("inputs {} and {} must have the same type, got {} and {}", first, other,
                   dtypeName(ctx.inputType(first)), dtypeName(ctx.inputType(other)));
}

// Reads float attributes so that one of the wrong kind fails at build time, not at run time.
// Null entries are skipped (table rows with fewer attributes).
Status checkFloatAttributes(const InferContext& ctx, std::span<const char* const> attributes) {
  for (const char* attr : attributes) {
    if (attr) KILN_RETURN_IF_ERROR(ctx.node().getFloat(attr, 0).status());
  }
  return Status::ok();
}

Result<bool> getFlag(const InferContext& ctx, const char* attr, int64_t defaultValue) {
  KILN_ASSIGN_OR_RETURN(int64_t value, ctx.node().getInt(attr, defaultValue));
  if (value != 0 && value != 1) {
    return ctx.error("attribute '{}' must be 0 or 1, got {}", attr, value);
  }
  return value == 1;
}

// --- Unary -----------------------------------------------------------------------------------

struct UnaryOp {
  const char* opType;
  TypeSet types;
  std::array<const char*, 2> floatAttributes;
};

constexpr UnaryOp kUnaryOps[] = {
    {"Relu", kSignedNumbers, {}},
    {"LeakyRelu", kFloats, {"alpha"}},
    {"Sigmoid", kFloats, {}},
    {"Tanh", kFloats, {}},
    {"HardSigmoid", kFloats, {"alpha", "beta"}},
    {"HardSwish", kFloats, {}},
    {"Elu", kFloats, {"alpha"}},
    {"Selu", kFloats, {"alpha", "gamma"}},
    {"Softplus", kFloats, {}},
    {"Softsign", kFloats, {}},
    {"Erf", kNumbers, {}},
    {"Exp", kFloats, {}},
    {"Log", kFloats, {}},
    {"Sqrt", kFloats, {}},
    {"Reciprocal", kFloats, {}},
    {"Abs", kNumbers, {}},
    {"Neg", kSignedNumbers, {}},
    {"Floor", kFloats, {}},
    {"Ceil", kFloats, {}},
    {"Round", kFloats, {}},
    {"Sign", kNumbers, {}},
    {"Sin", kFloats, {}},
    {"Cos", kFloats, {}},
    {"Tan", kFloats, {}},
    {"Asin", kFloats, {}},
    {"Acos", kFloats, {}},
    {"Atan", kFloats, {}},
    {"Sinh", kFloats, {}},
    {"Cosh", kFloats, {}},
    {"Asinh", kFloats, {}},
    {"Acosh", kFloats, {}},
    {"Atanh", kFloats, {}},
    {"Not", kBool, {}},
    {"Shrink", kNumbers, {"lambd", "bias"}},
    {"ThresholdedRelu", kFloats, {"alpha"}},
    {"Mish", kFloats, {}},
    {"BitwiseNot", kInts, {}},
    {"Identity", kAnyType, {}},
};

InferFn inferUnary(const UnaryOp& op) {
  return [&op](InferContext& ctx) -> Status {
    KILN_RETURN_IF_ERROR(checkType(ctx, 0, op.types));
    KILN_RETURN_IF_ERROR(checkFloatAttributes(ctx, op.floatAttributes));
    ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
    return Status::ok();
  };
}

Status inferCelu(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kFloats));
  KILN_ASSIGN_OR_RETURN(float alpha, ctx.node().getFloat("alpha", 1.0f));
  // Celu divides by alpha.
  if (alpha == 0) return ctx.error("attribute 'alpha' must not be 0");
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

Status inferGelu(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kFloats));
  KILN_ASSIGN_OR_RETURN(std::string approximate, ctx.node().getString("approximate", "none"));
  if (approximate != "none" && approximate != "tanh") {
    return ctx.error("attribute 'approximate' must be \"none\" or \"tanh\", got \"{}\"",
                     approximate);
  }
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

Status inferIsNaN(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kFloats));
  ctx.setOutput(0, DType::kBool, ctx.inputShape(0));
  return Status::ok();
}

Status inferIsInf(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kFloats));
  KILN_RETURN_IF_ERROR(getFlag(ctx, "detect_negative", 1).status());
  KILN_RETURN_IF_ERROR(getFlag(ctx, "detect_positive", 1).status());
  ctx.setOutput(0, DType::kBool, ctx.inputShape(0));
  return Status::ok();
}

// --- Binary ----------------------------------------------------------------------------------

// Before opset 7 binary ops broadcast only with broadcast=1, and then B onto A with B's first
// axis at A's `axis` (default: B aligned with A's trailing axes). Padding B with trailing 1s up
// to A's rank turns that into numpy broadcasting. Returns the shape B broadcasts as.
Result<Shape> legacyOperandShape(const InferContext& ctx) {
  const Shape& a = ctx.inputShape(0);
  const Shape& b = ctx.inputShape(1);
  KILN_ASSIGN_OR_RETURN(bool broadcast, getFlag(ctx, "broadcast", 0));
  if (!broadcast) {
    if (a != b) {
      return ctx.error("input shapes {} and {} differ and attribute 'broadcast' is not set",
                       a.toString(), b.toString());
    }
    return b;
  }
  const int64_t aRank = static_cast<int64_t>(a.rank());
  const int64_t bRank = static_cast<int64_t>(b.rank());
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", aRank - bRank));
  if (axis < 0) axis += aRank;
  if (axis < 0 || axis + bRank > aRank) {
    return ctx.error("legacy broadcast of B {} onto A {} at axis {} does not fit", b.toString(),
                     a.toString(), axis);
  }
  std::vector<int64_t> dims = b.dims();
  dims.resize(static_cast<size_t>(aRank - axis), 1);
  for (size_t i = 0; i < b.rank(); ++i) {
    const int64_t target = a[static_cast<size_t>(axis) + i];
    if (b[i] != target && b[i] != 1) {
      return ctx.error("legacy broadcast of B {} onto A {} at axis {}: dimension {} is {}, not {}",
                       b.toString(), a.toString(), axis, i, b[i], target);
    }
  }
  return Shape(std::move(dims));
}

// The output shape of a two-input op: numpy broadcasting, or before opset 7 the legacy rules.
Result<Shape> binaryOutputShape(const InferContext& ctx) {
  if (ctx.opset() < 7) {
    KILN_RETURN_IF_ERROR(legacyOperandShape(ctx).status());
    return ctx.inputShape(0);
  }
  auto shape = broadcastShapes(ctx.inputShape(0), ctx.inputShape(1));
  if (!shape.isOk()) return ctx.error("{}", shape.status().message());
  return shape;
}

struct BinaryOp {
  const char* opType;
  TypeSet types;
  bool boolOutput;  // comparisons and logic
};

constexpr BinaryOp kBinaryOps[] = {
    {"Add", kNumbers, false},
    {"Sub", kNumbers, false},
    {"Mul", kNumbers, false},
    {"Div", kNumbers, false},
    {"Equal", kAnyType, true},
    {"Less", kNumbers, true},
    {"Greater", kNumbers, true},
    {"LessOrEqual", kNumbers, true},
    {"GreaterOrEqual", kNumbers, true},
    {"And", kBool, true},
    {"Or", kBool, true},
    {"Xor", kBool, true},
    {"BitwiseAnd", kInts, false},
    {"BitwiseOr", kInts, false},
    {"BitwiseXor", kInts, false},
};

Status inferBinaryTyped(InferContext& ctx, TypeSet types, bool boolOutput) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, types));
  KILN_RETURN_IF_ERROR(checkSameType(ctx, 0, 1));
  KILN_ASSIGN_OR_RETURN(Shape shape, binaryOutputShape(ctx));
  ctx.setOutput(0, boolOutput ? DType::kBool : ctx.inputType(0), std::move(shape));
  return Status::ok();
}

InferFn inferBinary(const BinaryOp& op) {
  return [&op](InferContext& ctx) { return inferBinaryTyped(ctx, op.types, op.boolOutput); };
}

Status inferPow(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kNumbers));
  KILN_RETURN_IF_ERROR(checkType(ctx, 1, kNumbers));
  // Base and exponent types became independent at opset 12.
  if (ctx.opset() < 12) KILN_RETURN_IF_ERROR(checkSameType(ctx, 0, 1));
  KILN_ASSIGN_OR_RETURN(Shape shape, binaryOutputShape(ctx));
  ctx.setOutput(0, ctx.inputType(0), std::move(shape));
  return Status::ok();
}

Status inferMod(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool fmod, getFlag(ctx, "fmod", 0));
  if (!fmod && isFloating(ctx.inputType(0))) {
    return ctx.error("floating-point inputs ({}) need attribute 'fmod' set to 1",
                     dtypeName(ctx.inputType(0)));
  }
  return inferBinaryTyped(ctx, kNumbers, false);
}

Status inferBitShift(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string direction, ctx.node().getString("direction", ""));
  if (direction != "LEFT" && direction != "RIGHT") {
    return ctx.error("attribute 'direction' must be \"LEFT\" or \"RIGHT\", got \"{}\"", direction);
  }
  return inferBinaryTyped(ctx, kUnsignedInts, false);
}

// Before opset 7 PRelu's slope is a single value or one per channel (axis 1); from opset 7 it
// broadcasts onto X numpy-style. Returns the shape the slope broadcasts as.
Result<Shape> preluSlopeShape(const InferContext& ctx) {
  const Shape& x = ctx.inputShape(0);
  const Shape& slope = ctx.inputShape(1);
  if (ctx.opset() < 7) {
    if (slope.elementCount() == 1) return Shape{};
    if (slope.rank() == 1 && x.rank() >= 2 && slope[0] == x[1]) {
      std::vector<int64_t> dims(x.rank() - 1, 1);
      dims[0] = slope[0];
      return Shape(std::move(dims));
    }
    return ctx.error("slope {} must hold one value or one per channel of X {}", slope.toString(),
                     x.toString());
  }
  auto shape = broadcastShapes(x, slope);
  if (!shape.isOk() || *shape != x) {
    return ctx.error("slope {} does not broadcast onto X {}", slope.toString(), x.toString());
  }
  return slope;
}

Status inferPRelu(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kPReluTypes));
  KILN_RETURN_IF_ERROR(checkSameType(ctx, 0, 1));
  KILN_RETURN_IF_ERROR(preluSlopeShape(ctx).status());
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

// --- Variadic, Where -------------------------------------------------------------------------

Status inferVariadic(InferContext& ctx, TypeSet types) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, types));
  Shape shape = ctx.inputShape(0);
  for (size_t i = 1; i < ctx.inputCount(); ++i) {
    if (!ctx.hasInput(i)) return ctx.error("input {} is missing", i);
    KILN_RETURN_IF_ERROR(checkSameType(ctx, 0, i));
    // Broadcasting arrived at opset 8; before, all inputs have one shape.
    if (ctx.opset() < 8 && ctx.inputShape(i) != shape) {
      return ctx.error("inputs 0 and {} have shapes {} and {}; before opset 8 they must match", i,
                       shape.toString(), ctx.inputShape(i).toString());
    }
    auto broadcast = broadcastShapes(shape, ctx.inputShape(i));
    if (!broadcast.isOk()) return ctx.error("input {}: {}", i, broadcast.status().message());
    shape = std::move(*broadcast);
  }
  ctx.setOutput(0, ctx.inputType(0), std::move(shape));
  return Status::ok();
}

Status inferWhere(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kBool));
  KILN_RETURN_IF_ERROR(checkType(ctx, 1, kAnyType));
  KILN_RETURN_IF_ERROR(checkSameType(ctx, 1, 2));
  Shape shape = ctx.inputShape(0);
  for (size_t i = 1; i < 3; ++i) {
    auto broadcast = broadcastShapes(shape, ctx.inputShape(i));
    if (!broadcast.isOk()) return ctx.error("input {}: {}", i, broadcast.status().message());
    shape = std::move(*broadcast);
  }
  ctx.setOutput(0, ctx.inputType(1), std::move(shape));
  return Status::ok();
}

// --- Clip, Cast, Dropout ---------------------------------------------------------------------

Status inferClip(InferContext& ctx) {
  // min and max were attributes (float inputs only) before opset 11, optional inputs after.
  if (ctx.opset() < 11) {
    if (ctx.inputCount() > 1) return ctx.error("before opset 11 Clip takes one input");
    KILN_RETURN_IF_ERROR(checkType(ctx, 0, kFloats));
    constexpr const char* kAttributes[] = {"min", "max"};
    KILN_RETURN_IF_ERROR(checkFloatAttributes(ctx, kAttributes));
  } else {
    KILN_RETURN_IF_ERROR(checkType(ctx, 0, ctx.opset() < 12 ? kFloats : kNumbers));
    for (size_t i = 1; i < ctx.inputCount(); ++i) {
      if (!ctx.hasInput(i)) continue;
      KILN_RETURN_IF_ERROR(checkSameType(ctx, 0, i));
      if (ctx.inputShape(i).elementCount() != 1) {
        return ctx.error("input {} ({}) must be a scalar, got shape {}", i, i == 1 ? "min" : "max",
                         ctx.inputShape(i).toString());
      }
    }
  }
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

Status inferCast(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(ctx.node().requireAttribute("to"));
  KILN_ASSIGN_OR_RETURN(int64_t to, ctx.node().getInt("to", 0));
  auto converted = dtypeFromOnnxType(to);
  if (!converted.isOk()) {
    return converted.status().withContext(ctx.node().describe() + ": attribute 'to'");
  }
  const DType dtype = *converted;
  ctx.setOutput(0, dtype, ctx.inputShape(0));
  return Status::ok();
}

Status inferCastLike(InferContext& ctx) {
  ctx.setOutput(0, ctx.inputType(1), ctx.inputShape(0));
  return Status::ok();
}

// Inference-mode Dropout: the output is the input, the optional mask all "kept".
Status inferDropout(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkType(ctx, 0, kFloats));
  if (ctx.opset() < 12) {
    if (ctx.inputCount() > 1) return ctx.error("before opset 12 Dropout takes one input");
    constexpr const char* kAttributes[] = {"ratio"};
    KILN_RETURN_IF_ERROR(checkFloatAttributes(ctx, kAttributes));
  }
  if (ctx.hasInput(1)) {
    KILN_RETURN_IF_ERROR(checkType(ctx, 1, kFloats));
    if (ctx.inputShape(1).elementCount() != 1) {
      return ctx.error("input 1 (ratio) must be a scalar, got shape {}",
                       ctx.inputShape(1).toString());
    }
    if (const Tensor* ratio = ctx.inputConstant(1)) {
      const double value = ratio->elementAsDouble(0);
      if (!(value >= 0 && value < 1)) return ctx.error("ratio must be in [0, 1), got {}", value);
    }
  }
  if (ctx.hasInput(2)) {
    KILN_RETURN_IF_ERROR(checkType(ctx, 2, kBool));
    if (ctx.inputShape(2).elementCount() != 1) {
      return ctx.error("input 2 (training_mode) must be a scalar, got shape {}",
                       ctx.inputShape(2).toString());
    }
    // Training mode with ratio 0 keeps every element, so only a known nonzero ratio is refused
    // here; the kernel checks runtime values.
    const Tensor* training = ctx.inputConstant(2);
    const Tensor* ratio = ctx.inputConstant(1);
    const bool ratioKnownNonzero = !ctx.hasInput(1) || (ratio && ratio->elementAsDouble(0) != 0);
    if (training && training->data<bool>()[0] && ratioKnownNonzero) {
      return ctx.unsupportedHere(
          "training-mode Dropout with a nonzero ratio (random masking) is not supported");
    }
  }
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  // The mask became boolean at opset 10; before, it had the input's type.
  if (ctx.outputCount() > 1) {
    ctx.setOutput(1, ctx.opset() < 10 ? ctx.inputType(0) : DType::kBool, ctx.inputShape(0));
  }
  return Status::ok();
}

}  // namespace

void registerElementwiseSchemas(OpRegistry& registry) {
  for (const UnaryOp& op : kUnaryOps) registry.add({.opType = op.opType, .infer = inferUnary(op)});
  registry.add({.opType = "Celu", .infer = inferCelu});
  registry.add({.opType = "Gelu", .infer = inferGelu});
  registry.add({.opType = "IsNaN", .infer = inferIsNaN});
  registry.add({.opType = "IsInf", .infer = inferIsInf});

  for (const BinaryOp& op : kBinaryOps) {
    registry.add({.opType = op.opType, .minInputs = 2, .maxInputs = 2, .infer = inferBinary(op)});
  }
  registry.add({.opType = "Pow", .minInputs = 2, .maxInputs = 2, .infer = inferPow});
  registry.add({.opType = "Mod", .minInputs = 2, .maxInputs = 2, .infer = inferMod});
  registry.add({.opType = "BitShift", .minInputs = 2, .maxInputs = 2, .infer = inferBitShift});
  registry.add({.opType = "PRelu", .minInputs = 2, .maxInputs = 2, .infer = inferPRelu});

  for (const char* opType : {"Min", "Max"}) {
    registry.add({.opType = opType, .maxInputs = INT_MAX, .infer = [](InferContext& ctx) {
                    return inferVariadic(ctx, kNumbers);
                  }});
  }
  for (const char* opType : {"Sum", "Mean"}) {
    registry.add({.opType = opType, .maxInputs = INT_MAX, .infer = [](InferContext& ctx) {
                    return inferVariadic(ctx, kFloats);
                  }});
  }
  registry.add({.opType = "Where", .minInputs = 3, .maxInputs = 3, .infer = inferWhere});

  registry.add({.opType = "Clip", .maxInputs = 3, .infer = inferClip});
  registry.add({.opType = "Cast", .infer = inferCast});
  registry.add({.opType = "CastLike", .minInputs = 2, .maxInputs = 2, .infer = inferCastLike});
  registry.add({.opType = "Dropout", .maxInputs = 3, .maxOutputs = 2, .infer = inferDropout});
}

}  // namespace kiln::ir
