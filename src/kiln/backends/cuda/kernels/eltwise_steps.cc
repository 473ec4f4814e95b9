// The CUDA backend's elementwise steps (eltwise.h's kernels): unary math and activations, Clip
// and Cast/CastLike ("kiln.unary"); broadcasting binary ops, Pow, Where and the variadic
// Sum/Mean/Max/Min ("kiln.binary"); and kiln.FusedElementwise ("kiln.fused_eltwise"). The
// factory reads a node's attributes and shapes into a launch (op, element type, broadcast
// geometry) at lowering; what the kernels do not compute as the reference does (an element type
// outside an op's set, more operands or dimensions than a geometry holds) gets nullptr, so the
// node falls through to the host.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "kiln/backends/cuda/codegen/fused_codegen.h"
#include "kiln/backends/cuda/codegen/nvrtc.h"
#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/eltwise.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/fused_elementwise.h"

namespace kiln::cuda {

const knobs::Knob kEltwiseVectorWidth = knobs::declareKnob({
    .name = "cuda.eltwise.vector_width",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"4", "1"},
    .defaultValue = "4",
    .help = "elementwise kernels on operands of the output's shape (or scalars): 4 moves four "
            "elements per thread as one aligned load and store (16 bytes for float32), 1 moves "
            "one element at a time",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kEltwiseBlock = knobs::declareKnob({
    .name = "cuda.eltwise.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of kiln's prebuilt elementwise kernels (unary, binary, Clip, Cast, "
            "Pow, Where, Sum/Mean/Max/Min, and the FusedElementwise interpreter; generated "
            "kernels take cuda.eltwise.codegen.block)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kEltwiseCodegen = knobs::declareKnob({
    .name = "cuda.eltwise.codegen",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"nvrtc", "interpreter"},
    .defaultValue = "nvrtc",
    .help = "kiln.FusedElementwise: a kernel generated for the node (its program as straight-line "
            "code, its shape and broadcast strides as constants) and compiled by NVRTC when the "
            "plan initializes, or the one kernel that interprets any program (also what nvrtc "
            "falls back to where libnvrtc cannot be loaded)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kEltwiseCodegenBlock = knobs::declareKnob({
    .name = "cuda.eltwise.codegen.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of a generated elementwise kernel (cuda.eltwise.codegen=nvrtc)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kEltwiseCodegenVectorBytes = knobs::declareKnob({
    .name = "cuda.eltwise.codegen.vector_bytes",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"16", "8", "4"},
    .defaultValue = "16",
    .help = "bytes a thread of a generated elementwise kernel loads and stores at once where an "
            "operand walks the innermost axis (16: four float32 or eight float16 elements); 4 is "
            "one float32 element, so no packs",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kEltwiseCodegenFastMath = knobs::declareKnob({
    .name = "cuda.eltwise.codegen.fast_math",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "generated elementwise kernels compute Exp, Log, Sigmoid, Tanh, GELU (tanh form), "
            "Div and Reciprocal with the hardware's approximations (__expf, __logf, __fdividef, "
            "tanh.approx) instead of the correctly rounded functions",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kEltwiseCodegenUnroll = knobs::declareKnob({
    .name = "cuda.eltwise.codegen.unroll",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1", "2", "4"},
    .defaultValue = "1",
    .help = "packs each thread of a generated elementwise kernel takes per trip of its loop, one "
            "block's width apart (more loads in flight a thread, fewer blocks)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kEltwiseCodegenIndex = knobs::declareKnob({
    .name = "cuda.eltwise.codegen.index",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "64"},
    .defaultValue = "auto",
    .help = "the index arithmetic of generated elementwise kernels: 32-bit where every element "
            "index and operand offset fits (auto; a strided walk's divisions are much cheaper), "
            "or 64-bit always",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

using ir::DType;

// Every element index and operand offset below this lets the strided walk divide in 32 bits.
constexpr int64_t kNarrowLimit = int64_t{1} << 30;

// How operands of `shapes` (each broadcasting numpy-style to `output`) are read at each output
// element: size-1 output axes dropped, neighbouring axes merged where every operand walks them as
// one; flat when that leaves at most one axis (every operand full-size or a scalar). nullopt when
// a shape does not broadcast or the merged walk is deeper than kMaxBroadcastRank.
std::optional<BroadcastGeometry> broadcastGeometry(const ir::Shape& output,
                                                   const std::vector<ir::Shape>& shapes) {
  const int operands = static_cast<int>(shapes.size());
  if (operands < 1 || operands > kMaxBroadcastOperands) return std::nullopt;
  const size_t rank = output.rank();
  BroadcastGeometry g;
  g.count = output.elementCount();
  g.operands = operands;
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides(static_cast<size_t>(operands));
  bool narrow = g.count < kNarrowLimit;
  std::vector<std::vector<int64_t>> aligned(static_cast<size_t>(operands));
  for (int k = 0; k < operands; ++k) {
    const ir::Shape& shape = shapes[static_cast<size_t>(k)];
    if (shape.rank() > rank) return std::nullopt;
    std::vector<int64_t> dimsK(rank - shape.rank(), 1);
    dimsK.insert(dimsK.end(), shape.dims().begin(), shape.dims().end());
    for (size_t a = 0; a < rank; ++a) {
      if (dimsK[a] != output[a] && dimsK[a] != 1) return std::nullopt;
    }
    narrow = narrow && shape.elementCount() < kNarrowLimit;
    aligned[static_cast<size_t>(k)] = std::move(dimsK);
  }
  g.narrowIndex = narrow;
  if (g.count == 0) return g;  // nothing to launch
  for (int k = 0; k < operands; ++k) {
    const std::vector<int64_t> contiguous = ir::Shape(aligned[static_cast<size_t>(k)]).strides();
    for (size_t a = 0; a < rank; ++a) {
      if (output[a] == 1) continue;
      strides[static_cast<size_t>(k)].push_back(
          aligned[static_cast<size_t>(k)][a] == output[a] ? contiguous[a] : 0);
    }
  }
  for (size_t a = 0; a < rank; ++a) {
    if (output[a] != 1) dims.push_back(output[a]);
  }
  // Merge axis a into the merged axis before it where every operand steps over both as one.
  std::vector<int64_t> mergedDims;
  std::vector<std::vector<int64_t>> mergedStrides(static_cast<size_t>(operands));
  for (size_t a = 0; a < dims.size(); ++a) {
    bool merge = !mergedDims.empty();
    for (int k = 0; k < operands && merge; ++k) {
      const auto& s = strides[static_cast<size_t>(k)];
      merge = mergedStrides[static_cast<size_t>(k)].back() == s[a] * dims[a];
    }
    if (merge) {
      mergedDims.back() *= dims[a];
      for (int k = 0; k < operands; ++k) {
        mergedStrides[static_cast<size_t>(k)].back() = strides[static_cast<size_t>(k)][a];
      }
      continue;
    }
    mergedDims.push_back(dims[a]);
    for (int k = 0; k < operands; ++k) {
      mergedStrides[static_cast<size_t>(k)].push_back(strides[static_cast<size_t>(k)][a]);
    }
  }
  if (mergedDims.size() > static_cast<size_t>(kMaxBroadcastRank)) return std::nullopt;
  g.rank = static_cast<int>(mergedDims.size());
  for (int d = 0; d < g.rank; ++d) {
    g.dims[d] = mergedDims[static_cast<size_t>(d)];
    for (int k = 0; k < operands; ++k) {
      g.strides[k][d] = mergedStrides[static_cast<size_t>(k)][static_cast<size_t>(d)];
    }
  }
  g.flat = g.rank <= 1;
  for (int k = 0; k < operands; ++k) {
    g.scalar[k] = g.rank == 0 || shapes[static_cast<size_t>(k)].elementCount() == 1;
  }
  if (g.rank == 0) {  // one element: a flat walk of one
    g.rank = 1;
    g.dims[0] = 1;
  }
  return g;
}

int blockThreadsFor(const ir::Node& node, const knobs::Route& route) {
  return std::stoi(route.value(kEltwiseBlock, &node));
}

// ", 256-thread blocks": a launch's block, for detail().
template <typename Launch>
std::string blockText(const Launch& launch) {
  return ", " + std::to_string(launch.blockThreads) + "-thread blocks";
}

int vectorWidthFor(const ir::Node& node, const knobs::Route& route) {
  return route.value(kEltwiseVectorWidth, &node) == "1" ? 1 : 4;
}

// "flat, vector width 4" or "strided rank 3 (32-bit index)".
std::string geometryDetail(const BroadcastGeometry& g, int vectorWidth) {
  if (g.flat) return "flat, vector width " + std::to_string(vectorWidth);
  return "strided rank " + std::to_string(g.rank) + (g.narrowIndex ? " (32-bit index)" : "");
}

// --- Steps -------------------------------------------------------------------------------------

// Every step of this file: each says its launch in detail().
class EltwiseStep : public Step {};

class UnaryStep final : public EltwiseStep {
 public:
  explicit UnaryStep(UnaryLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    UnaryLaunch launch = launch_;
    launch.x = context.address(*inputs[0]);
    launch.y = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchUnary(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the unary kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return "flat, vector width " + std::to_string(launch_.vectorWidth) + blockText(launch_);
  }

 private:
  UnaryLaunch launch_;
};

class ClipStep final : public EltwiseStep {
 public:
  explicit ClipStep(ClipLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    ClipLaunch launch = launch_;
    launch.x = context.address(*inputs[0]);
    launch.y = context.address(*outputs[0]);
    auto bound = [&](size_t i) -> const void* {
      return i < inputs.size() && inputs[i] ? context.address(*inputs[i]) : nullptr;
    };
    // Before opset 11 the bounds are attributes (launch_'s values) and there are no such inputs.
    launch.min = bound(1);
    launch.max = bound(2);
    KILN_CUDA_CHECK(launchClip(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the clip kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return "flat, vector width " + std::to_string(launch_.vectorWidth) + blockText(launch_);
  }

 private:
  ClipLaunch launch_;
};

class CastStep final : public EltwiseStep {
 public:
  explicit CastStep(CastLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    CastLaunch launch = launch_;
    launch.x = context.address(*inputs[0]);
    launch.y = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchCast(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the cast kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return "flat, vector width " + std::to_string(launch_.vectorWidth) + blockText(launch_);
  }

 private:
  CastLaunch launch_;
};

class BinaryStep final : public EltwiseStep {
 public:
  explicit BinaryStep(BinaryLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    BinaryLaunch launch = launch_;
    launch.a = context.address(*inputs[0]);
    launch.b = context.address(*inputs[1]);
    launch.y = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchBinary(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the binary kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return geometryDetail(launch_.geometry, launch_.vectorWidth) + blockText(launch_);
  }

 private:
  BinaryLaunch launch_;
};

class PowStep final : public EltwiseStep {
 public:
  explicit PowStep(PowLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    PowLaunch launch = launch_;
    launch.a = context.address(*inputs[0]);
    launch.b = context.address(*inputs[1]);
    launch.y = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchPow(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the pow kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return geometryDetail(launch_.geometry, 1) + blockText(launch_);
  }

 private:
  PowLaunch launch_;
};

class WhereStep final : public EltwiseStep {
 public:
  explicit WhereStep(WhereLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    WhereLaunch launch = launch_;
    launch.condition = context.address(*inputs[0]);
    launch.x = context.address(*inputs[1]);
    launch.y = context.address(*inputs[2]);
    launch.out = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchWhere(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the where kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return geometryDetail(launch_.geometry, 1) + blockText(launch_);
  }

 private:
  WhereLaunch launch_;
};

class VariadicStep final : public EltwiseStep {
 public:
  explicit VariadicStep(VariadicLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    VariadicLaunch launch = launch_;
    for (int k = 0; k < launch.geometry.operands; ++k) {
      launch.inputs[k] = context.address(*inputs[static_cast<size_t>(k)]);
    }
    launch.y = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchVariadic(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the variadic kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return geometryDetail(launch_.geometry, 1) + blockText(launch_);
  }

 private:
  VariadicLaunch launch_;
};

class FusedStep final : public EltwiseStep {
 public:
  explicit FusedStep(FusedLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    FusedLaunch launch = launch_;
    for (int k = 0; k < launch.geometry.operands; ++k) {
      launch.inputs[k] = context.address(*inputs[static_cast<size_t>(k)]);
    }
    launch.y = context.address(*outputs[0]);
    KILN_CUDA_CHECK(launchFused(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the fused elementwise kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return geometryDetail(launch_.geometry, launch_.vectorWidth) + ", " +
           std::to_string(launch_.program.length) + " instructions" + blockText(launch_);
  }

 private:
  FusedLaunch launch_;
};

// kiln.FusedElementwise through a kernel generated for it (codegen/fused_codegen.h): the plan
// compiles the definitions and binds the step to them before it prepares.
class GeneratedFusedStep final : public EltwiseStep {
 public:
  explicit GeneratedFusedStep(GeneratedFusedKernel kernel) : kernel_(std::move(kernel)) {}

  std::string generatedCode() const override { return kernel_.source; }

  Status bindGenerated(cudaLibrary_t library) override {
    if (kernel_.vector > 1) {
      KILN_CUDA_CHECK(cudaLibraryGetKernel(&vector_, library, (kernel_.name + "_v").c_str()));
    }
    KILN_CUDA_CHECK(cudaLibraryGetKernel(&scalar_, library, (kernel_.name + "_s").c_str()));
    return Status::ok();
  }

  Status enqueue(const Context& context) const override {
    if (kernel_.elements == 0) return Status::ok();
    if (!scalar_) return internalError("the generated kernel {} was not bound", kernel_.name);
    const void* pointers[kMaxBroadcastOperands] = {};
    void* out = context.address(*outputs[0]);
    void* arguments[kMaxBroadcastOperands + 1];
    // The vector kernel loads packs of the operands that walk the innermost axis (and stores
    // them): each of those must be pack-aligned, or the scalar kernel runs.
    const uintptr_t alignment = static_cast<uintptr_t>(kernel_.vector * kernel_.elementBytes);
    bool packed = vector_ != nullptr && reinterpret_cast<uintptr_t>(out) % alignment == 0;
    for (int k = 0; k < kernel_.operands; ++k) {
      pointers[k] = context.address(*inputs[static_cast<size_t>(k)]);
      if (kernel_.packedOperand[k] && reinterpret_cast<uintptr_t>(pointers[k]) % alignment != 0) {
        packed = false;
      }
      arguments[k] = &pointers[k];
    }
    arguments[kernel_.operands] = &out;
    const int64_t work = packed ? kernel_.packs : kernel_.elements;
    const int64_t perBlock = int64_t{kernel_.blockThreads} * kernel_.unroll;
    const auto blocks = static_cast<unsigned>(
        std::clamp<int64_t>((work + perBlock - 1) / perBlock, 1, int64_t{1} << 20));
    KILN_CUDA_CHECK(cudaLaunchKernel(
        reinterpret_cast<const void*>(packed ? vector_ : scalar_), dim3(blocks),
        dim3(static_cast<unsigned>(kernel_.blockThreads)), arguments, 0, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the generated fused elementwise kernel");
    return Status::ok();
  }

  std::string detail() const override {
    return fmt::format("generated {}, vector {} ({} bytes), block {}, unroll {}{}{}", kernel_.name,
                       kernel_.vector, kernel_.vector * kernel_.elementBytes, kernel_.blockThreads,
                       kernel_.unroll, kernel_.fastMath ? ", fast math" : "",
                       kernel_.narrowIndex ? "" : ", 64-bit index");
  }

 private:
  GeneratedFusedKernel kernel_;
  cudaKernel_t vector_ = nullptr;
  cudaKernel_t scalar_ = nullptr;
};

template <typename S>
std::unique_ptr<Step> withTactic(std::unique_ptr<S> step, const char* tactic) {
  step->tactic = tactic;
  return step;
}

// --- Unary -------------------------------------------------------------------------------------

struct UnaryEntry {
  UnaryOp op;
  // The float attributes read into alpha and beta, with the reference's defaults.
  const char* alphaAttribute = nullptr;
  float alphaDefault = 0;
  const char* betaAttribute = nullptr;
  float betaDefault = 0;
};

const std::map<std::string, UnaryEntry>& unaryOps() {
  static const std::map<std::string, UnaryEntry> ops = {
      {"Abs", {UnaryOp::kAbs}},
      {"Acos", {UnaryOp::kAcos}},
      {"Acosh", {UnaryOp::kAcosh}},
      {"Asin", {UnaryOp::kAsin}},
      {"Asinh", {UnaryOp::kAsinh}},
      {"Atan", {UnaryOp::kAtan}},
      {"Atanh", {UnaryOp::kAtanh}},
      {"BitwiseNot", {UnaryOp::kBitwiseNot}},
      {"Ceil", {UnaryOp::kCeil}},
      {"Celu", {UnaryOp::kCelu, "alpha", 1.0f}},
      {"Cos", {UnaryOp::kCos}},
      {"Cosh", {UnaryOp::kCosh}},
      {"Elu", {UnaryOp::kElu, "alpha", 1.0f}},
      {"Erf", {UnaryOp::kErf}},
      {"Exp", {UnaryOp::kExp}},
      {"Floor", {UnaryOp::kFloor}},
      {"Gelu", {UnaryOp::kGelu}},  // approximate = "tanh" picks kGeluTanh
      {"HardSigmoid", {UnaryOp::kHardSigmoid, "alpha", 0.2f, "beta", 0.5f}},
      {"HardSwish", {UnaryOp::kHardSwish}},
      {"IsInf", {UnaryOp::kIsInf}},  // integer attributes, read separately
      {"IsNaN", {UnaryOp::kIsNaN}},
      {"LeakyRelu", {UnaryOp::kLeakyRelu, "alpha", 0.01f}},
      {"Log", {UnaryOp::kLog}},
      {"Mish", {UnaryOp::kMish}},
      {"Neg", {UnaryOp::kNeg}},
      {"Not", {UnaryOp::kNot}},
      {"Reciprocal", {UnaryOp::kReciprocal}},
      {"Relu", {UnaryOp::kRelu}},
      {"Round", {UnaryOp::kRound}},
      {"Selu",
       {UnaryOp::kSelu, "alpha", 1.67326319217681884765625f, "gamma", 1.05070102214813232421875f}},
      {"Shrink", {UnaryOp::kShrink, "lambd", 0.5f, "bias", 0.0f}},
      {"Sigmoid", {UnaryOp::kSigmoid}},
      {"Sign", {UnaryOp::kSign}},
      {"Sin", {UnaryOp::kSin}},
      {"Sinh", {UnaryOp::kSinh}},
      {"Softplus", {UnaryOp::kSoftplus}},
      {"Softsign", {UnaryOp::kSoftsign}},
      {"Sqrt", {UnaryOp::kSqrt}},
      {"Tan", {UnaryOp::kTan}},
      {"Tanh", {UnaryOp::kTanh}},
      {"ThresholdedRelu", {UnaryOp::kThresholdedRelu, "alpha", 1.0f}},
  };
  return ops;
}

std::unique_ptr<Step> makeUnary(const ir::Node& node, const UnaryEntry& entry,
                                const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const auto type = elementTypeOf(x);
  if (!type || x->shape != y->shape) return nullptr;
  UnaryLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.op = entry.op;
  launch.type = *type;
  if (entry.alphaAttribute) {
    auto alpha = node.getFloat(entry.alphaAttribute, entry.alphaDefault);
    if (!alpha.isOk()) return nullptr;
    launch.alpha = *alpha;
  }
  if (entry.betaAttribute) {
    auto beta = node.getFloat(entry.betaAttribute, entry.betaDefault);
    if (!beta.isOk()) return nullptr;
    launch.beta = *beta;
  }
  if (entry.op == UnaryOp::kGelu) {
    auto approximate = node.getString("approximate", "none");
    if (!approximate.isOk() || (*approximate != "none" && *approximate != "tanh")) return nullptr;
    if (*approximate == "tanh") launch.op = UnaryOp::kGeluTanh;
  }
  if (entry.op == UnaryOp::kIsInf) {
    auto negative = node.getInt("detect_negative", 1);
    auto positive = node.getInt("detect_positive", 1);
    if (!negative.isOk() || !positive.isOk()) return nullptr;
    launch.alpha = *negative != 0 ? 1.0f : 0.0f;
    launch.beta = *positive != 0 ? 1.0f : 0.0f;
  }
  const bool givesBool = entry.op == UnaryOp::kIsInf || entry.op == UnaryOp::kIsNaN;
  if (y->dtype != (givesBool ? DType::kBool : x->dtype)) return nullptr;
  if (!unarySupported(launch.op, launch.type)) return nullptr;
  launch.count = x->shape.elementCount();
  launch.vectorWidth = vectorWidthFor(node, route);
  return withTactic(std::make_unique<UnaryStep>(launch), "kiln.unary");
}

// --- Clip, Cast --------------------------------------------------------------------------------

std::unique_ptr<Step> makeClip(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const auto type = elementTypeOf(x);
  if (!type || !clipSupported(*type) || x->dtype != y->dtype || x->shape != y->shape) {
    return nullptr;
  }
  ClipLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.type = *type;
  if (node.opsetVersion < 11) {
    // The attributes, defaulting to float's range as the reference (and the spec) do.
    if (node.inputs.size() > 1 || !ir::isFloating(x->dtype)) return nullptr;
    auto low = node.getFloat("min", std::numeric_limits<float>::lowest());
    auto high = node.getFloat("max", std::numeric_limits<float>::max());
    if (!low.isOk() || !high.isOk()) return nullptr;
    launch.floatMin = *low;
    launch.floatMax = *high;
  } else {
    for (size_t i = 1; i < node.inputs.size(); ++i) {
      const ir::Value* bound = node.inputs[i];
      if (!bound) continue;
      if (i > 2 || bound->dtype != x->dtype || bound->shape.elementCount() != 1) return nullptr;
    }
  }
  launch.count = x->shape.elementCount();
  launch.vectorWidth = vectorWidthFor(node, route);
  return withTactic(std::make_unique<ClipStep>(launch), "kiln.unary");
}

std::unique_ptr<Step> makeCast(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const auto from = elementTypeOf(x);
  const auto to = elementTypeOf(y);
  if (!from || !to || !castSupported(*from, *to) || x->shape != y->shape) return nullptr;
  CastLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.from = *from;
  launch.to = *to;
  launch.count = x->shape.elementCount();
  launch.vectorWidth = vectorWidthFor(node, route);
  return withTactic(std::make_unique<CastStep>(launch), "kiln.unary");
}

// --- Binary, Pow -------------------------------------------------------------------------------

// The shapes a binary op's inputs broadcast as: numpy's from opset 7; before, B (with
// broadcast=1) lines up with A from `axis` on, which padding B with trailing 1s makes numpy's.
// PRelu's slope before opset 7 is one value or one per channel (axis 1).
std::optional<std::vector<ir::Shape>> binaryOperandShapes(const ir::Node& node) {
  const ir::Shape& a = node.inputs[0]->shape;
  const ir::Shape& b = node.inputs[1]->shape;
  if (node.opsetVersion >= 7 || a == b) return std::vector<ir::Shape>{a, b};
  if (node.opType == "PRelu") {
    if (b.elementCount() == 1) return std::vector<ir::Shape>{a, ir::Shape{}};
    if (a.rank() < 2) return std::nullopt;
    std::vector<int64_t> dims(a.rank() - 1, 1);
    dims[0] = b.elementCount();
    return std::vector<ir::Shape>{a, ir::Shape(std::move(dims))};
  }
  const int64_t aRank = static_cast<int64_t>(a.rank());
  auto axis = node.getInt("axis", aRank - static_cast<int64_t>(b.rank()));
  if (!axis.isOk()) return std::nullopt;
  int64_t at = *axis < 0 ? *axis + aRank : *axis;
  if (at < 0 || at > aRank) return std::nullopt;
  std::vector<int64_t> dims = b.dims();
  dims.resize(static_cast<size_t>(aRank - at), 1);
  return std::vector<ir::Shape>{a, ir::Shape(std::move(dims))};
}

std::optional<BinaryOp> binaryOpOf(const ir::Node& node) {
  static const std::map<std::string, BinaryOp> kOps = {
      {"Add", BinaryOp::kAdd},
      {"Sub", BinaryOp::kSub},
      {"Mul", BinaryOp::kMul},
      {"Div", BinaryOp::kDiv},
      {"PRelu", BinaryOp::kPRelu},
      {"Max", BinaryOp::kMax},
      {"Min", BinaryOp::kMin},
      {"Equal", BinaryOp::kEqual},
      {"Less", BinaryOp::kLess},
      {"LessOrEqual", BinaryOp::kLessOrEqual},
      {"Greater", BinaryOp::kGreater},
      {"GreaterOrEqual", BinaryOp::kGreaterOrEqual},
      {"And", BinaryOp::kAnd},
      {"Or", BinaryOp::kOr},
      {"Xor", BinaryOp::kXor},
      {"BitwiseAnd", BinaryOp::kBitwiseAnd},
      {"BitwiseOr", BinaryOp::kBitwiseOr},
      {"BitwiseXor", BinaryOp::kBitwiseXor},
  };
  if (node.opType == "Mod") {
    auto fmod = node.getInt("fmod", 0);
    if (!fmod.isOk()) return std::nullopt;
    return *fmod != 0 ? BinaryOp::kFmod : BinaryOp::kMod;
  }
  if (node.opType == "BitShift") {
    auto direction = node.getString("direction", "");
    if (!direction.isOk()) return std::nullopt;
    if (*direction == "LEFT") return BinaryOp::kShiftLeft;
    if (*direction == "RIGHT") return BinaryOp::kShiftRight;
    return std::nullopt;
  }
  auto it = kOps.find(node.opType);
  if (it == kOps.end()) return std::nullopt;
  return it->second;
}

// A generated kernel for `program` (cuda.eltwise.codegen=nvrtc, where NVRTC loads), else nullptr.
std::unique_ptr<Step> makeGenerated(const ir::Node& node, const ir::EltwiseProgram& program,
                                    ElementType type, const BroadcastGeometry& geometry,
                                    const knobs::Route& route, const char* tactic) {
  if (route.value(kEltwiseCodegen, &node) != "nvrtc" || !nvrtcAvailable()) return nullptr;
  FusedCodegenOptions options;
  options.blockThreads = std::stoi(route.value(kEltwiseCodegenBlock, &node));
  options.vectorBytes = std::stoi(route.value(kEltwiseCodegenVectorBytes, &node));
  options.unroll = std::stoi(route.value(kEltwiseCodegenUnroll, &node));
  options.fastMath = route.value(kEltwiseCodegenFastMath, &node) == "on";
  BroadcastGeometry walk = geometry;
  if (route.value(kEltwiseCodegenIndex, &node) == "64") walk.narrowIndex = false;
  return withTactic(
      std::make_unique<GeneratedFusedStep>(generateFusedKernel(program, type, walk, options)),
      tactic);
}

// The program opcode of a float binary op a generated kernel computes as kiln.binary does.
std::optional<ir::EltwiseOpcode> generatedBinaryOpcode(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return ir::EltwiseOpcode::kAdd;
    case BinaryOp::kSub:
      return ir::EltwiseOpcode::kSub;
    case BinaryOp::kMul:
      return ir::EltwiseOpcode::kMul;
    case BinaryOp::kDiv:
      return ir::EltwiseOpcode::kDiv;
    case BinaryOp::kMax:
      return ir::EltwiseOpcode::kMax;
    case BinaryOp::kMin:
      return ir::EltwiseOpcode::kMin;
    default:
      return std::nullopt;
  }
}

std::unique_ptr<Step> makeBinary(const ir::Node& node, BinaryOp op, const knobs::Route& route) {
  if (node.inputs.size() != 2 || !node.inputs[1]) return nullptr;
  const ir::Value* a = node.inputs[0];
  const ir::Value* b = node.inputs[1];
  const ir::Value* y = node.outputs[0];
  const auto type = elementTypeOf(a);
  if (!type || a->dtype != b->dtype || !binarySupported(op, *type)) return nullptr;
  if (y->dtype != (binaryGivesBool(op) ? DType::kBool : a->dtype)) return nullptr;
  auto shapes = binaryOperandShapes(node);
  if (!shapes) return nullptr;
  auto geometry = broadcastGeometry(y->shape, *shapes);
  if (!geometry) return nullptr;
  // A broadcast that leaves a strided walk (a bias or scale per channel of NHWC, say): a kernel
  // generated for its shape, where the general one divides by the dims at run time.
  const auto opcode = generatedBinaryOpcode(op);
  if (!geometry->flat && opcode && fusedSupported(*type)) {
    ir::EltwiseProgram program;
    ir::EltwiseInstruction& instruction = program.instructions.emplace_back();
    instruction.opcode = *opcode;
    instruction.operands = {ir::EltwiseOperand{true, 0}, ir::EltwiseOperand{true, 1}};
    if (auto generated =
            makeGenerated(node, program, *type, *geometry, route, "kiln.eltwise.nvrtc")) {
      return generated;
    }
  }
  BinaryLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.op = op;
  launch.type = *type;
  launch.geometry = *geometry;
  launch.vectorWidth = vectorWidthFor(node, route);
  return withTactic(std::make_unique<BinaryStep>(launch), "kiln.binary");
}

std::unique_ptr<Step> makePow(const ir::Node& node, const knobs::Route& route) {
  if (node.inputs.size() != 2 || !node.inputs[1]) return nullptr;
  const ir::Value* y = node.outputs[0];
  const auto base = elementTypeOf(node.inputs[0]);
  const auto exponent = elementTypeOf(node.inputs[1]);
  if (!base || !exponent || !powSupported(*base, *exponent)) return nullptr;
  if (y->dtype != node.inputs[0]->dtype) return nullptr;
  auto shapes = binaryOperandShapes(node);
  if (!shapes) return nullptr;
  auto geometry = broadcastGeometry(y->shape, *shapes);
  if (!geometry) return nullptr;
  PowLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.base = *base;
  launch.exponent = *exponent;
  launch.geometry = *geometry;
  return withTactic(std::make_unique<PowStep>(launch), "kiln.binary");
}

// --- Where, variadic ---------------------------------------------------------------------------

std::unique_ptr<Step> makeWhere(const ir::Node& node, const knobs::Route& route) {
  if (node.inputs.size() != 3) return nullptr;
  for (const ir::Value* input : node.inputs) {
    if (!input) return nullptr;
  }
  const ir::Value* y = node.outputs[0];
  if (node.inputs[0]->dtype != DType::kBool || node.inputs[1]->dtype != y->dtype ||
      node.inputs[2]->dtype != y->dtype) {
    return nullptr;
  }
  auto geometry = broadcastGeometry(
      y->shape, {node.inputs[0]->shape, node.inputs[1]->shape, node.inputs[2]->shape});
  if (!geometry) return nullptr;
  WhereLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.elementBytes = static_cast<int>(ir::dtypeSize(y->dtype));
  launch.geometry = *geometry;
  return withTactic(std::make_unique<WhereStep>(launch), "kiln.binary");
}

std::unique_ptr<Step> makeVariadic(const ir::Node& node, VariadicOp op, const knobs::Route& route) {
  const ir::Value* y = node.outputs[0];
  const auto type = elementTypeOf(y);
  if (!type || !variadicSupported(op, *type) || node.inputs.empty() ||
      node.inputs.size() > static_cast<size_t>(kMaxBroadcastOperands)) {
    return nullptr;
  }
  std::vector<ir::Shape> shapes;
  for (const ir::Value* input : node.inputs) {
    if (!input || input->dtype != y->dtype) return nullptr;
    shapes.push_back(input->shape);
  }
  auto geometry = broadcastGeometry(y->shape, shapes);
  if (!geometry) return nullptr;
  VariadicLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.op = op;
  launch.type = *type;
  launch.geometry = *geometry;
  return withTactic(std::make_unique<VariadicStep>(launch), "kiln.binary");
}

// --- kiln.FusedElementwise ---------------------------------------------------------------------

static_assert(static_cast<int>(ir::EltwiseOpcode::kMin) == static_cast<int>(FusedOpcode::kMin) &&
                  static_cast<int>(ir::EltwiseOpcode::kAdd) == static_cast<int>(FusedOpcode::kAdd),
              "FusedOpcode mirrors ir::EltwiseOpcode one for one");

std::unique_ptr<Step> makeFused(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* y = node.outputs[0];
  const auto type = elementTypeOf(y);
  if (!type || !fusedSupported(*type)) return nullptr;
  const size_t inputCount = node.inputs.size();
  if (inputCount < 1 || inputCount > static_cast<size_t>(kMaxBroadcastOperands)) return nullptr;
  std::vector<ir::Shape> shapes;
  for (const ir::Value* input : node.inputs) {
    if (!input || input->dtype != y->dtype) return nullptr;
    shapes.push_back(input->shape);
  }
  auto text = node.getStrings("program");
  if (!text.isOk()) return nullptr;
  auto program = ir::parseEltwiseProgram(*text, inputCount);
  if (!program.isOk()) return nullptr;
  const auto& instructions = program->instructions;
  if (instructions.empty() || instructions.size() > static_cast<size_t>(kMaxFusedInstructions)) {
    return nullptr;
  }
  auto geometry = broadcastGeometry(y->shape, shapes);
  if (!geometry) return nullptr;
  if (auto generated =
          makeGenerated(node, *program, *type, *geometry, route, "kiln.fused_eltwise.nvrtc")) {
    return generated;
  }
  FusedLaunch launch;
  launch.blockThreads = blockThreadsFor(node, route);
  launch.type = *type;
  launch.geometry = *geometry;
  launch.vectorWidth = vectorWidthFor(node, route);
  launch.program.length = static_cast<int>(instructions.size());
  for (size_t j = 0; j < instructions.size(); ++j) {
    const ir::EltwiseInstruction& source = instructions[j];
    FusedInstruction& target = launch.program.code[j];
    target.opcode = static_cast<FusedOpcode>(static_cast<int>(source.opcode));
    target.operandCount = static_cast<uint8_t>(source.operandCount());
    for (int k = 0; k < source.operandCount(); ++k) {
      const ir::EltwiseOperand& operand = source.operands[static_cast<size_t>(k)];
      target.operands[k] =
          static_cast<int8_t>(operand.isInput ? operand.index : -1 - operand.index);
    }
    target.params[0] = source.params[0];
    target.params[1] = source.params[1];
  }
  return withTactic(std::make_unique<FusedStep>(launch), "kiln.fused_eltwise");
}

// --- The factory -------------------------------------------------------------------------------

std::unique_ptr<Step> makeEltwiseStep(const ir::Node& node, const knobs::Route& route) {
  if (node.inputs.empty() || !node.inputs[0]) return nullptr;
  if (node.outputs.size() != 1 || !node.outputs[0]) return nullptr;
  if (node.domain == ir::kKilnDomain && node.opType == "FusedElementwise") {
    return makeFused(node, route);
  }
  if (!node.domain.empty()) return nullptr;
  const std::string& op = node.opType;
  if (auto it = unaryOps().find(op); it != unaryOps().end()) {
    if (node.inputs.size() != 1) return nullptr;
    return makeUnary(node, it->second, route);
  }
  if (op == "Clip") return makeClip(node, route);
  if (op == "Cast" || op == "CastLike") return makeCast(node, route);
  if (op == "Pow") return makePow(node, route);
  if (op == "Where") return makeWhere(node, route);
  if (op == "Sum") return makeVariadic(node, VariadicOp::kSum, route);
  if (op == "Mean") return makeVariadic(node, VariadicOp::kMean, route);
  if ((op == "Max" || op == "Min") && node.inputs.size() != 2) {
    return makeVariadic(node, op == "Max" ? VariadicOp::kMax : VariadicOp::kMin, route);
  }
  if (auto binary = binaryOpOf(node)) return makeBinary(node, *binary, route);
  return nullptr;
}

const int kRegistered = registerStepFactory(kRankEltwise, "eltwise", makeEltwiseStep);

}  // namespace

}  // namespace kiln::cuda
