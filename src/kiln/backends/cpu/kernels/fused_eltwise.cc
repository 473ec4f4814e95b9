// kiln.FusedElementwise on float32: the program runs over blocks of the output, one instruction at
// a time, each a plain loop over the block into a small register file of block-sized buffers, so
// the values between instructions stay in L1 instead of going through memory. Inputs are read in
// place where the block is contiguous in them (same shape as the output), from a splat buffer
// where they are scalars, and otherwise copied per block along the same merged broadcast walk
// eltwise.cc uses (whose inner axis reads each input with stride 0 or 1). Blocks are split over
// the plan's threads.

// Loops written for the vectoriser (see fast_math.h); before the includes on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno", \
                     "fp-contract=off")
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "kiln/backends/cpu/kernels/fast_math.h"
#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/fused_elementwise.h"

namespace kiln::cpu {

// Declared in eltwise.cc: the fused kernel belongs to the elementwise family and its knob.
extern const knobs::Knob kEltwiseImpl;
// Also eltwise.cc's: cpu.eltwise.grain (elements per chunk of cheap ops) and its tactic suffix.
int64_t eltwiseGrainFor(const ir::Node& node, const knobs::Route& route, std::string* suffix);

namespace {

using ir::EltwiseOpcode;

// Elements per block: 2 KiB a buffer, so a block's registers and inputs stay in L1.
constexpr int64_t kBlock = 512;
// The deepest merged broadcast walk a gathered input may have (a walk has at most one axis per
// output axis, and adjacent axes merge).
constexpr size_t kMaxWalkRank = 16;

// What the kernel runs: the program's opcodes, and Pow by a constant scalar 2 or 0.5 as a square
// or a square root (LayerNorm and RMSNorm written out), as eltwise.cc's binary kernel does.
enum class KernelOp { kOpcode, kSquare, kSqrt };

using BlockFn = void (*)(const float* __restrict a, const float* __restrict b, float* __restrict y,
                         int64_t n, float alpha, float beta);

// NaN-propagating Max and Min, as the reference's; written with compares so the loop vectorises.
inline float maximum(float x, float y) {
  const float m = y > x ? y : x;
  return x != x ? x : (y != y ? y : m);
}

inline float minimum(float x, float y) {
  const float m = y < x ? y : x;
  return x != x ? x : (y != y ? y : m);
}

template <EltwiseOpcode kOp>
inline float applyOp(float x, float y, float alpha, float beta) {
  using enum EltwiseOpcode;
  if constexpr (kOp == kRelu) return x < 0.0f ? 0.0f : x;
  if constexpr (kOp == kSigmoid) return fastSigmoid(x);
  if constexpr (kOp == kTanh) return fastTanh(x);
  if constexpr (kOp == kExp) return fastExp(x);
  if constexpr (kOp == kLog) return std::log(x);
  if constexpr (kOp == kSqrt) return std::sqrt(x);
  if constexpr (kOp == kNeg) return -x;
  if constexpr (kOp == kAbs) return std::fabs(x);
  if constexpr (kOp == kErf) return fastErf(x);
  if constexpr (kOp == kReciprocal) return 1.0f / x;
  if constexpr (kOp == kHardSigmoid) return std::max(0.0f, std::min(1.0f, alpha * x + beta));
  if constexpr (kOp == kHardSwish) return x * std::max(0.0f, std::min(1.0f, x / 6.0f + 0.5f));
  if constexpr (kOp == kLeakyRelu) return x < 0.0f ? alpha * x : x;
  if constexpr (kOp == kClip) return std::min(std::max(x, alpha), beta);
  if constexpr (kOp == kGelu) return fastGelu(x);
  if constexpr (kOp == kGeluTanh) {
    const float k = static_cast<float>(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
    return 0.5f * x * (1.0f + fastTanh(k * (x + 0.044715f * x * x * x)));
  }
  if constexpr (kOp == kAdd) return x + y;
  if constexpr (kOp == kSub) return x - y;
  if constexpr (kOp == kMul) return x * y;
  if constexpr (kOp == kDiv) return x / y;
  if constexpr (kOp == kPow) return std::pow(x, y);
  if constexpr (kOp == kMax) return maximum(x, y);
  if constexpr (kOp == kMin) return minimum(x, y);
}

template <EltwiseOpcode kOp>
KILN_ELTWISE_CLONES void blockLoop(const float* __restrict a, const float* __restrict b,
                                   float* __restrict y, int64_t n, float alpha, float beta) {
  // The binary opcodes come last (fused_elementwise.h).
  if constexpr (kOp < EltwiseOpcode::kAdd) {
    for (int64_t i = 0; i < n; ++i) y[i] = applyOp<kOp>(a[i], 0.0f, alpha, beta);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = applyOp<kOp>(a[i], b[i], alpha, beta);
  }
}

KILN_ELTWISE_CLONES void squareLoop(const float* __restrict a, const float*, float* __restrict y,
                                    int64_t n, float, float) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * a[i];
}

KILN_ELTWISE_CLONES void sqrtLoop(const float* __restrict a, const float*, float* __restrict y,
                                  int64_t n, float, float) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(a[i]);
}

template <size_t... kOps>
BlockFn loopFor(EltwiseOpcode opcode, std::index_sequence<kOps...>) {
  static const BlockFn kLoops[] = {blockLoop<static_cast<EltwiseOpcode>(kOps)>...};
  return kLoops[static_cast<size_t>(opcode)];
}

BlockFn loopFor(EltwiseOpcode opcode, KernelOp op) {
  if (op == KernelOp::kSquare) return squareLoop;
  if (op == KernelOp::kSqrt) return sqrtLoop;
  return loopFor(opcode, std::make_index_sequence<static_cast<size_t>(EltwiseOpcode::kMin) + 1>());
}

// Rough cost of one element of an op, in units of a cheap vectorised op: exp, tanh, erf, log and
// pow cost about ten. It sizes the parallel grain so that a chunk is worth a thread's wake-up.
int64_t costOf(EltwiseOpcode opcode, KernelOp op) {
  using enum EltwiseOpcode;
  if (op != KernelOp::kOpcode) return 2;
  switch (opcode) {
    case kSigmoid:
    case kTanh:
    case kExp:
    case kLog:
    case kErf:
    case kGelu:
    case kGeluTanh:
    case kPow:
      return 10;
    case kSqrt:
    case kDiv:
    case kReciprocal:
      return 2;
    default:
      return 1;
  }
}

// Where an instruction reads or writes: a node input, a register of the block, or the output.
struct Slot {
  enum Kind { kInput, kRegister, kOutput } kind = kInput;
  int index = 0;
};

struct Instruction {
  BlockFn loop = nullptr;
  Slot a, b, dest;
  float alpha = 0, beta = 0;
};

// How a block of one input is found: in place (same element order as the output), a splat of
// its one value, or copied along its merged walk over the output's axes.
struct InputPlan {
  enum Kind { kInPlace, kScalar, kGathered } kind = kInPlace;
  std::vector<int64_t> dims, strides;  // kGathered: merged output axes, the input's strides
  int buffer = -1;                     // kScalar, kGathered: its block buffer
};

InputPlan planInput(const ir::Shape& input, const ir::Shape& output) {
  InputPlan plan;
  if (input.elementCount() == output.elementCount()) return plan;
  if (input.elementCount() == 1) {
    plan.kind = InputPlan::kScalar;
    return plan;
  }
  plan.kind = InputPlan::kGathered;
  const size_t rank = output.rank();
  int64_t stride = 1;
  std::vector<int64_t> strides(rank, 0);
  for (size_t i = input.rank(); i-- > 0;) {
    strides[rank - input.rank() + i] = input[i] == 1 ? 0 : stride;
    stride *= input[i];
  }
  for (size_t i = 0; i < rank; ++i) {
    if (output[i] == 1) continue;
    // An axis continues the previous one when the input's stride does.
    if (!plan.dims.empty() && plan.strides.back() == strides[i] * output[i]) {
      plan.dims.back() *= output[i];
      plan.strides.back() = strides[i];
      continue;
    }
    plan.dims.push_back(output[i]);
    plan.strides.push_back(strides[i]);
  }
  return plan;
}

// Elements [begin, begin + n) of the output as input `plan` sees them: a pointer into the input
// when they are one contiguous run of it, else copied into `buffer`.
const float* gather(const InputPlan& plan, const float* base, int64_t begin, int64_t n,
                    float* buffer) {
  const size_t rank = plan.dims.size();
  std::array<int64_t, kMaxWalkRank> index{};
  int64_t offset = 0;
  for (size_t d = rank, rest = static_cast<size_t>(begin); d-- > 0;) {
    const auto dim = static_cast<size_t>(plan.dims[d]);
    index[d] = static_cast<int64_t>(rest % dim);
    rest /= dim;
    offset += index[d] * plan.strides[d];
  }
  const int64_t width = plan.dims[rank - 1];
  const int64_t inner = plan.strides[rank - 1];  // 0 or 1
  if (inner == 1 && index[rank - 1] + n <= width) return base + offset;
  for (int64_t done = 0; done < n;) {
    const int64_t run = std::min(n - done, width - index[rank - 1]);
    if (inner == 1) {
      std::memcpy(buffer + done, base + offset, static_cast<size_t>(run) * sizeof(float));
    } else {
      std::fill_n(buffer + done, run, base[offset]);
    }
    done += run;
    index[rank - 1] += run;
    offset += run * inner;
    for (size_t d = rank - 1; d > 0 && index[d] == plan.dims[d]; --d) {
      offset += plan.strides[d - 1] - plan.dims[d] * plan.strides[d];
      index[d] = 0;
      ++index[d - 1];
    }
  }
  return buffer;
}

// Its loops take __restrict pointers: the output must not share memory with an input, so this
// step is no candidate for writing in place (cpu.memory.in_place).
class FusedEltwiseStep : public Step {
 public:
  FusedEltwiseStep(std::vector<Instruction> program, std::vector<InputPlan> inputPlans,
                   int registers, int buffers, int64_t grainBlocks)
      : program_(std::move(program)),
        inputPlans_(std::move(inputPlans)),
        registers_(registers),
        buffers_(buffers),
        grainBlocks_(grainBlocks) {}

  Status run(const ExecutionContext& context) const override {
    const int64_t n = outputs[0]->shape.elementCount();
    std::vector<const float*> bases;
    for (const auto& input : inputs) bases.push_back(context.data<float>(*input));
    float* y = context.data<float>(*outputs[0]);
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    context.pool().parallelFor(blocks, grainBlocks_, [&](int64_t first, int64_t last) {
      // Per chunk: chunks may run at once, so none shares its registers.
      std::vector<float> scratch(static_cast<size_t>((registers_ + buffers_) * kBlock));
      float* registers = scratch.data();
      float* buffers = registers + registers_ * kBlock;
      std::vector<const float*> in(inputPlans_.size());
      for (size_t i = 0; i < inputPlans_.size(); ++i) {
        if (inputPlans_[i].kind != InputPlan::kScalar) continue;
        in[i] = buffers + inputPlans_[i].buffer * kBlock;
        std::fill_n(buffers + inputPlans_[i].buffer * kBlock, kBlock, bases[i][0]);
      }
      for (int64_t block = first; block < last; ++block) {
        const int64_t begin = block * kBlock;
        const int64_t count = std::min(kBlock, n - begin);
        for (size_t i = 0; i < inputPlans_.size(); ++i) {
          const InputPlan& plan = inputPlans_[i];
          if (plan.kind == InputPlan::kInPlace) in[i] = bases[i] + begin;
          if (plan.kind == InputPlan::kGathered) {
            in[i] = gather(plan, bases[i], begin, count, buffers + plan.buffer * kBlock);
          }
        }
        auto address = [&](const Slot& slot) -> float* {
          if (slot.kind == Slot::kInput) return const_cast<float*>(in[slot.index]);
          if (slot.kind == Slot::kRegister) return registers + slot.index * kBlock;
          return y + begin;
        };
        for (const Instruction& instruction : program_) {
          instruction.loop(address(instruction.a), address(instruction.b),
                           address(instruction.dest), count, instruction.alpha, instruction.beta);
        }
      }
    });
    return Status::ok();
  }

 private:
  std::vector<Instruction> program_;
  std::vector<InputPlan> inputPlans_;
  int registers_;        // block buffers holding instruction results
  int buffers_;          // block buffers holding scalar and gathered inputs
  int64_t grainBlocks_;  // blocks per chunk at least
};

// The constant scalar value of `value`, if it is one.
std::optional<float> constantScalar(const ir::Value* value) {
  if (!value->constant || value->constant->elementCount() != 1) return std::nullopt;
  return value->constant->data<float>()[0];
}

}  // namespace

std::unique_ptr<Step> makeFusedEltwiseStep(const ir::Node& node, const knobs::Route& route) {
  if (node.domain != ir::kKilnDomain || node.opType != "FusedElementwise") return nullptr;
  if (route.value(kEltwiseImpl, &node) != "fast") return nullptr;
  auto text = node.getStrings("program");
  if (!text.isOk()) return nullptr;
  auto program = ir::parseEltwiseProgram(*text, node.inputs.size());
  if (!program.isOk()) return nullptr;
  const ir::Shape& shape = node.outputs[0]->shape;

  std::vector<InputPlan> inputPlans;
  int buffers = 0;
  int64_t cost = 1;  // the output's write
  for (const ir::Value* input : node.inputs) {
    if (!input || input->dtype != ir::DType::kFloat32) return nullptr;
    InputPlan plan = planInput(input->shape, shape);
    if (plan.dims.size() > kMaxWalkRank) return nullptr;
    if (plan.kind != InputPlan::kInPlace) plan.buffer = buffers++;
    if (plan.kind != InputPlan::kScalar) ++cost;
    inputPlans.push_back(std::move(plan));
  }

  // Registers by liveness: an instruction's result takes a free register (never one of its own
  // operands', so the loops' operands do not alias) and frees its operands' after their last use.
  const auto& instructions = program->instructions;
  const size_t count = instructions.size();
  std::vector<size_t> lastUse(count, 0);
  for (size_t k = 0; k < count; ++k) {
    for (int i = 0; i < instructions[k].operandCount(); ++i) {
      const ir::EltwiseOperand& operand = instructions[k].operands[static_cast<size_t>(i)];
      if (!operand.isInput) lastUse[static_cast<size_t>(operand.index)] = k;
    }
  }
  std::vector<int> registerOf(count, -1), freeRegisters;
  int registers = 0;
  std::vector<Instruction> kernelProgram;
  for (size_t k = 0; k < count; ++k) {
    const ir::EltwiseInstruction& source = instructions[k];
    Instruction instruction{.alpha = source.params[0], .beta = source.params[1]};
    auto slotOf = [&](const ir::EltwiseOperand& operand) {
      return operand.isInput
                 ? Slot{Slot::kInput, operand.index}
                 : Slot{Slot::kRegister, registerOf[static_cast<size_t>(operand.index)]};
    };
    instruction.a = slotOf(source.operands[0]);
    instruction.b = source.operandCount() > 1 ? slotOf(source.operands[1]) : instruction.a;
    KernelOp op = KernelOp::kOpcode;
    if (source.opcode == EltwiseOpcode::kPow && source.operands[1].isInput) {
      const std::optional<float> exponent =
          constantScalar(node.inputs[static_cast<size_t>(source.operands[1].index)]);
      if (exponent == 2.0f) op = KernelOp::kSquare;
      if (exponent == 0.5f) op = KernelOp::kSqrt;
    }
    instruction.loop = loopFor(source.opcode, op);
    cost += costOf(source.opcode, op);
    if (k + 1 == count) {
      instruction.dest = {Slot::kOutput, 0};
    } else {
      if (freeRegisters.empty()) freeRegisters.push_back(registers++);
      registerOf[k] = freeRegisters.back();
      freeRegisters.pop_back();
      instruction.dest = {Slot::kRegister, registerOf[k]};
    }
    for (int i = 0; i < source.operandCount(); ++i) {
      const ir::EltwiseOperand& operand = source.operands[static_cast<size_t>(i)];
      if (operand.isInput || lastUse[static_cast<size_t>(operand.index)] != k) continue;
      if (i == 1 && operand == source.operands[0]) continue;  // x * x frees once
      freeRegisters.push_back(registerOf[static_cast<size_t>(operand.index)]);
    }
    kernelProgram.push_back(instruction);
  }
  // A chunk should hold about 1M cost units, some 50 us (a unit is about 0.05 ns: Mul then Add
  // with three streams, cost 6, ran at 0.3 ns an element), well above what waking a worker
  // costs (8 us median), so small tensors stay on one thread. That is four units an element of
  // cpu.eltwise.grain (default 256K elements).
  std::string suffix;
  const int64_t grainUnits = 4 * eltwiseGrainFor(node, route, &suffix);
  const int64_t grainElements = std::max<int64_t>(kBlock, grainUnits / cost);
  auto step =
      std::make_unique<FusedEltwiseStep>(std::move(kernelProgram), std::move(inputPlans), registers,
                                         buffers, (grainElements + kBlock - 1) / kBlock);
  step->tactic = "fast.fused_eltwise" + suffix;
  return step;
}

}  // namespace kiln::cpu
