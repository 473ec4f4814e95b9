// Elementwise float32 ops: unary activations and math, binary arithmetic with numpy
// broadcasting, and ReduceMean over the last axis. Broadcasting is reduced at build time to a
// merged walk whose innermost loop reads each operand with stride 0 or 1, so the hot loops are
// plain contiguous (or scalar-operand) loops the compiler vectorises. Each kernel splits its
// elements (or rows) over the plan's threads in chunks large enough to be worth a thread's
// wake-up, so small tensors stay on the calling thread.

// Loops written for the vectoriser (see fast_math.h); before the includes on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno", \
                     "fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/steps.h"

namespace kiln::cpu {

// Not file-local: fused_eltwise.cc's kernel for kiln.FusedElementwise reads it too.
extern const knobs::Knob kEltwiseImpl;
const knobs::Knob kEltwiseImpl = knobs::declareKnob({
    .name = "cpu.eltwise.impl",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"fast", "reference"},
    .defaultValue = "fast",
    .help = "float32 unary and broadcasting binary ops, last-axis ReduceMean and "
            "FusedElementwise: float32 loops, or the reference kernel",
    .backends = {"cpu"},
    .perNode = true,
});

// Elements a chunk of a parallel loop holds at least, for ops of about one vectorised
// instruction an element: 256K is about 50 us (a vectorised Add runs at 0.1-0.2 ns an element),
// well above what handing work to another thread costs (8 us median, 16 us p90, measured on the
// 2-core development machine), so smaller tensors stay on the calling thread. Ops that evaluate
// exp, tanh, erf or pow per element take a quarter of it. Not file-local: fused_eltwise.cc
// scales its grain by it. 2026-12-03, convnext_mini at 2 threads, its elementwise layers summed
// (three 2 s runs, shared machine): 16384 0.58-0.69 ms, 65536 0.48-0.58, 262144 0.23-0.27,
// 1048576 0.23-0.24.
constexpr const char* kDefaultGrain = "262144";
extern const knobs::Knob kEltwiseGrain;
const knobs::Knob kEltwiseGrain = knobs::declareKnob({
    .name = "cpu.eltwise.grain",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"16384", "65536", "262144", "1048576"},
    .defaultValue = kDefaultGrain,
    .help = "16384: elementwise kernels split work over threads in chunks of at least 16K cheap "
            "elements (4K for exp/tanh/erf/pow-like ops, scaled by cost in FusedElementwise); "
            "65536: chunks of at least 64K; 262144: chunks of at least 256K; 1048576: chunks of "
            "at least 1M, so tensors below that stay on the calling thread",
    .backends = {"cpu"},
    .perNode = true,
});

// The node's cpu.eltwise.grain, and the tactic suffix that names it ("" for the default).
int64_t eltwiseGrainFor(const ir::Node& node, const knobs::Route& route, std::string* suffix) {
  const std::string value = route.value(kEltwiseGrain, &node);
  if (suffix) *suffix = value == kDefaultGrain ? "" : ".g" + value;
  return std::stoll(value);
}

namespace {

enum class UnaryOp {
  kRelu,
  kSigmoid,
  kTanh,
  kErf,
  kExp,
  kSqrt,
  kNeg,
  kAbs,
  kHardSwish,
  kHardSigmoid,
  kGelu,
  kGeluTanh,
  kReciprocal,
  kLeakyRelu,
  kClip
};

// A costly op's grain (exp, tanh, erf, pow per element: several times the work) from the cheap
// ops' one (cpu.eltwise.grain).
constexpr int64_t costlyGrain(int64_t cheapGrain) { return std::max<int64_t>(1, cheapGrain / 4); }

bool isCostly(UnaryOp op) {
  switch (op) {
    case UnaryOp::kSigmoid:
    case UnaryOp::kTanh:
    case UnaryOp::kErf:
    case UnaryOp::kExp:
    case UnaryOp::kGelu:
    case UnaryOp::kGeluTanh:
      return true;
    default:
      return false;
  }
}

// y = op(x) over n elements.
KILN_ELTWISE_CLONES void unaryRange(UnaryOp op, const float* x, float* y, int64_t n, float a,
                                    float b) {
  switch (op) {
    case UnaryOp::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
      break;
    case UnaryOp::kSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = fastSigmoid(x[i]);
      break;
    case UnaryOp::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = fastTanh(x[i]);
      break;
    case UnaryOp::kErf:
      for (int64_t i = 0; i < n; ++i) y[i] = fastErf(x[i]);
      break;
    case UnaryOp::kExp:
      for (int64_t i = 0; i < n; ++i) y[i] = fastExp(x[i]);
      break;
    case UnaryOp::kSqrt:
      for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
      break;
    case UnaryOp::kNeg:
      for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
      break;
    case UnaryOp::kAbs:
      for (int64_t i = 0; i < n; ++i) y[i] = std::fabs(x[i]);
      break;
    case UnaryOp::kHardSwish:
      for (int64_t i = 0; i < n; ++i) {
        y[i] = x[i] * std::max(0.0f, std::min(1.0f, x[i] / 6.0f + 0.5f));
      }
      break;
    case UnaryOp::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = std::max(0.0f, std::min(1.0f, a * x[i] + b));
      break;
    case UnaryOp::kGelu:
      for (int64_t i = 0; i < n; ++i) y[i] = fastGelu(x[i]);
      break;
    case UnaryOp::kGeluTanh: {
      const float k = static_cast<float>(std::sqrt(2.0 / std::numbers::pi));
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + fastTanh(k * (v + 0.044715f * v * v * v)));
      }
      break;
    }
    case UnaryOp::kReciprocal:
      for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / x[i];
      break;
    case UnaryOp::kLeakyRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? a * x[i] : x[i];
      break;
    case UnaryOp::kClip:
      for (int64_t i = 0; i < n; ++i) y[i] = std::min(std::max(x[i], a), b);
      break;
  }
}

class UnaryStep : public Step {
 public:
  UnaryStep(UnaryOp op, float alpha, float beta, int64_t cheapGrain)
      : op_(op),
        alpha_(alpha),
        beta_(beta),
        grain_(isCostly(op) ? costlyGrain(cheapGrain) : cheapGrain) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    context.pool().parallelFor(outputs[0]->shape.elementCount(), grain_,
                               [&](int64_t begin, int64_t end) {
                                 unaryRange(op_, x + begin, y + begin, end - begin, alpha_, beta_);
                               });
    return Status::ok();
  }

 private:
  UnaryOp op_;
  float alpha_, beta_;
  int64_t grain_;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kSquare, kSqrt, kPow };

// The inner loop of a binary op: `aStep`/`bStep` are 0 (scalar operand) or 1 (contiguous).
// Each stride pair gets its own instantiation so the loop body has no per-element branches.
template <BinaryOp kOp, int kAStep, int kBStep>
KILN_ELTWISE_CLONES void binaryRow(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    [[maybe_unused]] const float u = a[i * kAStep], v = b[i * kBStep];
    if constexpr (kOp == BinaryOp::kAdd) y[i] = u + v;
    if constexpr (kOp == BinaryOp::kSub) y[i] = u - v;
    if constexpr (kOp == BinaryOp::kMul) y[i] = u * v;
    if constexpr (kOp == BinaryOp::kDiv) y[i] = u / v;
    if constexpr (kOp == BinaryOp::kSquare) y[i] = u * u;
    if constexpr (kOp == BinaryOp::kSqrt) y[i] = std::sqrt(u);
    if constexpr (kOp == BinaryOp::kPow) y[i] = std::pow(u, v);
  }
}

using RowFn = void (*)(const float*, const float*, float*, int64_t);

template <BinaryOp kOp>
RowFn rowFor(int64_t aStep, int64_t bStep) {
  if (aStep && bStep) return binaryRow<kOp, 1, 1>;
  if (aStep) return binaryRow<kOp, 1, 0>;
  if (bStep) return binaryRow<kOp, 0, 1>;
  return binaryRow<kOp, 0, 0>;
}

RowFn rowFor(BinaryOp op, int64_t aStep, int64_t bStep) {
  switch (op) {
    case BinaryOp::kAdd:
      return rowFor<BinaryOp::kAdd>(aStep, bStep);
    case BinaryOp::kSub:
      return rowFor<BinaryOp::kSub>(aStep, bStep);
    case BinaryOp::kMul:
      return rowFor<BinaryOp::kMul>(aStep, bStep);
    case BinaryOp::kDiv:
      return rowFor<BinaryOp::kDiv>(aStep, bStep);
    case BinaryOp::kSquare:
      return rowFor<BinaryOp::kSquare>(aStep, bStep);
    case BinaryOp::kSqrt:
      return rowFor<BinaryOp::kSqrt>(aStep, bStep);
    case BinaryOp::kPow:
      return rowFor<BinaryOp::kPow>(aStep, bStep);
  }
  return nullptr;
}

// A broadcast binary op as merged output axes with per-operand element strides (0 where the
// operand broadcasts); the last axis is the inner row.
struct BroadcastWalk {
  std::vector<int64_t> dims, aStrides, bStrides;
};

BroadcastWalk planBroadcast(const ir::Shape& a, const ir::Shape& b, const ir::Shape& y) {
  const size_t rank = y.rank();
  // Per output axis, each operand's stride (0 where it is missing or 1-sized).
  auto stridesOf = [&](const ir::Shape& s) {
    std::vector<int64_t> strides(rank, 0);
    int64_t stride = 1;
    for (size_t i = s.rank(); i-- > 0;) {
      const size_t axis = rank - s.rank() + i;
      strides[axis] = s[i] == 1 ? 0 : stride;
      stride *= s[i];
    }
    return strides;
  };
  const std::vector<int64_t> as = stridesOf(a), bs = stridesOf(b);
  BroadcastWalk walk;
  for (size_t i = 0; i < rank; ++i) {
    if (y[i] == 1) continue;
    // An axis continues the previous one when both operands' strides do.
    if (!walk.dims.empty() && walk.aStrides.back() == as[i] * y[i] &&
        walk.bStrides.back() == bs[i] * y[i]) {
      walk.dims.back() *= y[i];
      walk.aStrides.back() = as[i];
      walk.bStrides.back() = bs[i];
      continue;
    }
    walk.dims.push_back(y[i]);
    walk.aStrides.push_back(as[i]);
    walk.bStrides.push_back(bs[i]);
  }
  if (walk.dims.empty()) {  // a single element
    walk.dims.push_back(1);
    walk.aStrides.push_back(0);
    walk.bStrides.push_back(0);
  }
  return walk;
}

class BinaryStep : public Step {
 public:
  BinaryStep(BinaryOp op, BroadcastWalk walk, int64_t cheapGrain)
      : walk_(std::move(walk)),
        grain_(op == BinaryOp::kPow ? costlyGrain(cheapGrain) : cheapGrain) {
    row_ = rowFor(op, walk_.aStrides.back(), walk_.bStrides.back());
  }

  Status run(const ExecutionContext& context) const override {
    const float* a = context.data<float>(*inputs[0]);
    const float* b = context.data<float>(*inputs[1]);
    float* y = context.data<float>(*outputs[0]);
    // Chunks are ranges of output elements, so a single long row splits as well as many rows.
    context.pool().parallelFor(outputs[0]->shape.elementCount(), grain_,
                               [&](int64_t begin, int64_t end) { runRange(a, b, y, begin, end); });
    return Status::ok();
  }

 private:
  // Output elements [begin, end): the walk's index of `begin`, then row pieces from there.
  void runRange(const float* a, const float* b, float* y, int64_t begin, int64_t end) const {
    const size_t rank = walk_.dims.size();
    const int64_t width = walk_.dims[rank - 1];
    const int64_t aInner = walk_.aStrides[rank - 1], bInner = walk_.bStrides[rank - 1];
    std::vector<int64_t> index(rank, 0);
    int64_t aOffset = 0, bOffset = 0;  // of the current row's first element
    for (size_t d = rank - 1, rest = static_cast<size_t>(begin / width); d-- > 0;) {
      const auto dim = static_cast<size_t>(walk_.dims[d]);
      index[d] = static_cast<int64_t>(rest % dim);
      rest /= dim;
      aOffset += index[d] * walk_.aStrides[d];
      bOffset += index[d] * walk_.bStrides[d];
    }
    int64_t column = begin % width;
    for (int64_t at = begin; at < end;) {
      const int64_t run = std::min(width - column, end - at);
      row_(a + aOffset + column * aInner, b + bOffset + column * bInner, y + at, run);
      at += run;
      column = 0;
      for (size_t d = rank - 1; d-- > 0;) {
        aOffset += walk_.aStrides[d];
        bOffset += walk_.bStrides[d];
        if (++index[d] < walk_.dims[d]) break;
        aOffset -= walk_.aStrides[d] * walk_.dims[d];
        bOffset -= walk_.bStrides[d] * walk_.dims[d];
        index[d] = 0;
      }
    }
  }

  BroadcastWalk walk_;
  RowFn row_;
  int64_t grain_;
};

// ReduceMean over the last axis only: contiguous rows, each summed in double.
class RowMeanStep : public Step {
 public:
  RowMeanStep(int64_t rows, int64_t width, int64_t cheapGrain)
      : rows_(rows), width_(width), grainRows_(std::max<int64_t>(1, cheapGrain / width)) {}

  Status run(const ExecutionContext& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    context.pool().parallelFor(rows_, grainRows_, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        double sum = 0.0;
        for (int64_t i = 0; i < width_; ++i) sum += x[r * width_ + i];
        y[r] = static_cast<float>(sum / static_cast<double>(width_));
      }
    });
    return Status::ok();
  }

 private:
  int64_t rows_, width_, grainRows_;
};

bool isFloat32(const ir::Value* v) { return v && v->dtype == ir::DType::kFloat32; }

std::unique_ptr<Step> makeUnary(const ir::Node& node, int64_t grain) {
  struct Entry {
    const char* name;
    UnaryOp op;
  };
  static const Entry kEntries[] = {
      {"Relu", UnaryOp::kRelu},
      {"Sigmoid", UnaryOp::kSigmoid},
      {"Tanh", UnaryOp::kTanh},
      {"Erf", UnaryOp::kErf},
      {"Exp", UnaryOp::kExp},
      {"Sqrt", UnaryOp::kSqrt},
      {"Neg", UnaryOp::kNeg},
      {"Abs", UnaryOp::kAbs},
      {"HardSwish", UnaryOp::kHardSwish},
      {"HardSigmoid", UnaryOp::kHardSigmoid},
      {"Gelu", UnaryOp::kGelu},
      {"Reciprocal", UnaryOp::kReciprocal},
      {"LeakyRelu", UnaryOp::kLeakyRelu},
  };
  for (const Entry& entry : kEntries) {
    if (node.opType != entry.name) continue;
    if (node.inputs.size() != 1) return nullptr;
    UnaryOp op = entry.op;
    float alpha = 0, beta = 0;
    if (op == UnaryOp::kHardSigmoid || op == UnaryOp::kLeakyRelu) {
      auto a = node.getFloat("alpha", op == UnaryOp::kLeakyRelu ? 0.01f : 0.2f);
      auto b = node.getFloat("beta", 0.5f);
      if (!a.isOk() || !b.isOk()) return nullptr;
      alpha = *a;
      beta = *b;
    }
    if (op == UnaryOp::kGelu) {
      auto approximate = node.getString("approximate", "none");
      if (!approximate.isOk()) return nullptr;
      if (*approximate == "tanh") {
        op = UnaryOp::kGeluTanh;
      } else if (*approximate != "none") {
        return nullptr;
      }
    }
    return std::make_unique<UnaryStep>(op, alpha, beta, grain);
  }
  // Clip (opset 11+) with constant or absent bounds; the reference takes runtime bounds.
  if (node.opType == "Clip" && node.opsetVersion >= 11) {
    float bounds[2] = {-INFINITY, INFINITY};
    for (size_t i = 1; i < node.inputs.size() && i < 3; ++i) {
      const ir::Value* bound = node.inputs[i];
      if (!bound) continue;
      if (!isFloat32(bound) || !bound->constant || bound->shape.elementCount() != 1) {
        return nullptr;
      }
      bounds[i - 1] = bound->constant->data<float>()[0];
    }
    return std::make_unique<UnaryStep>(UnaryOp::kClip, bounds[0], bounds[1], grain);
  }
  return nullptr;
}

std::unique_ptr<Step> makeBinary(const ir::Node& node, int64_t grain) {
  BinaryOp op;
  if (node.opType == "Add") {
    op = BinaryOp::kAdd;
  } else if (node.opType == "Sub") {
    op = BinaryOp::kSub;
  } else if (node.opType == "Mul") {
    op = BinaryOp::kMul;
  } else if (node.opType == "Div") {
    op = BinaryOp::kDiv;
  } else if (node.opType == "Pow") {
    op = BinaryOp::kPow;
  } else {
    return nullptr;
  }
  if (node.inputs.size() != 2 || !isFloat32(node.inputs[1])) return nullptr;
  const ir::Value* a = node.inputs[0];
  const ir::Value* b = node.inputs[1];
  // A constant scalar exponent of 2 or 0.5 (LayerNorm and RMSNorm written out by hand) needs
  // no pow call; other exponents pay for powf, which is still accurate to an ulp or two.
  if (op == BinaryOp::kPow && b->constant && b->shape.elementCount() == 1) {
    const float e = b->constant->data<float>()[0];
    if (e == 2.0f) op = BinaryOp::kSquare;
    if (e == 0.5f) op = BinaryOp::kSqrt;
  }
  return std::make_unique<BinaryStep>(op, planBroadcast(a->shape, b->shape, node.outputs[0]->shape),
                                      grain);
}

std::unique_ptr<Step> makeRowMean(const ir::Node& node, int64_t grain) {
  if (node.opType != "ReduceMean") return nullptr;
  const ir::Value* x = node.inputs[0];
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  if (rank == 0) return nullptr;
  std::vector<int64_t> axes;
  if (node.opsetVersion >= 18) {
    // Axes come as a constant input; a runtime one is the reference kernel's.
    if (node.inputs.size() < 2 || !node.inputs[1]) return nullptr;
    const ir::Value* axesValue = node.inputs[1];
    if (!axesValue->constant || axesValue->dtype != ir::DType::kInt64) return nullptr;
    for (int64_t axis : axesValue->constant->data<int64_t>()) axes.push_back(axis);
  } else {
    auto attr = node.getInts("axes", {});
    if (!attr.isOk()) return nullptr;
    axes = *attr;
  }
  if (axes.size() != 1 || (axes[0] != -1 && axes[0] != rank - 1)) return nullptr;
  const int64_t width = x->shape[static_cast<size_t>(rank - 1)];
  if (width == 0) return nullptr;
  return std::make_unique<RowMeanStep>(x->shape.elementCount() / width, width, grain);
}

}  // namespace

std::unique_ptr<Step> makeEltwiseStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.inputs.empty() || node.outputs.empty()) return nullptr;
  if (!isFloat32(node.inputs[0]) || !isFloat32(node.outputs[0])) return nullptr;
  if (route.value(kEltwiseImpl, &node) != "fast") return nullptr;
  std::string suffix;
  const int64_t grain = eltwiseGrainFor(node, route, &suffix);
  std::unique_ptr<Step> step = makeUnary(node, grain);
  if (step) {
    step->tactic = "fast.unary" + suffix;
  } else if ((step = makeBinary(node, grain))) {
    step->tactic = "fast.binary_broadcast" + suffix;
  } else if ((step = makeRowMean(node, grain))) {
    step->tactic = "fast.reduce_mean_rows" + suffix;
  }
  return step;
}

}  // namespace kiln::cpu
