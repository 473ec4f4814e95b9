// The reference kernel of kiln.FusedElementwise: the program interpreted one output element at a
// time, each input read through its broadcast strides. Every instruction computes in double and
// rounds to float32, as the node it replaced stored its float32 output, so the fused node gives
// exactly what the unfused chain gives on the reference executor.
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/fused_elementwise.h"
#include "kiln/reference/kernel.h"
#include "kiln/reference/kernels/broadcast.h"

namespace kiln::reference {

namespace {

using ir::EltwiseInstruction;
using ir::EltwiseOpcode;

// NaN-propagating, as the Max and Min kernels.
double maximum(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return b > a ? b : a;
}

double minimum(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return b < a ? b : a;
}

// One instruction on double operands, written as the ONNX op's own reference kernel computes it.
double evaluate(const EltwiseInstruction& instruction, double x, double y) {
  const double alpha = instruction.params[0], beta = instruction.params[1];
  switch (instruction.opcode) {
    case EltwiseOpcode::kRelu:
      return x < 0 ? 0.0 : x;
    case EltwiseOpcode::kSigmoid:
      return 1 / (1 + std::exp(-x));
    case EltwiseOpcode::kTanh:
      return std::tanh(x);
    case EltwiseOpcode::kExp:
      return std::exp(x);
    case EltwiseOpcode::kLog:
      return std::log(x);
    case EltwiseOpcode::kSqrt:
      return std::sqrt(x);
    case EltwiseOpcode::kNeg:
      return -x;
    case EltwiseOpcode::kAbs:
      return std::fabs(x);
    case EltwiseOpcode::kErf:
      return std::erf(x);
    case EltwiseOpcode::kReciprocal:
      return 1 / x;
    case EltwiseOpcode::kHardSigmoid:
      return std::max(0.0, std::min(1.0, alpha * x + beta));
    case EltwiseOpcode::kHardSwish:
      return x * std::max(0.0, std::min(1.0, x / 6 + 0.5));
    case EltwiseOpcode::kLeakyRelu:
      return x < 0 ? alpha * x : x;
    case EltwiseOpcode::kClip:
      // min first, then max, as Clip: with min > max every value becomes max; NaN stays NaN.
      if (x < alpha) x = alpha;
      if (x > beta) x = beta;
      return x;
    case EltwiseOpcode::kGelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case EltwiseOpcode::kGeluTanh:
      return 0.5 * x *
             (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    case EltwiseOpcode::kAdd:
      return x + y;
    case EltwiseOpcode::kSub:
      return x - y;
    case EltwiseOpcode::kMul:
      return x * y;
    case EltwiseOpcode::kDiv:
      return x / y;
    case EltwiseOpcode::kPow:
      return std::pow(x, y);
    case EltwiseOpcode::kMax:
      return maximum(x, y);
    case EltwiseOpcode::kMin:
      return minimum(x, y);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

Status runFusedElementwise(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> text, ctx.node().getStrings("program"));
  auto program = ir::parseEltwiseProgram(text, ctx.inputCount());
  if (!program.isOk()) return ctx.error("{}", program.status().message());
  Tensor& y = ctx.output(0);
  const ir::Shape& shape = y.shape();
  const size_t rank = shape.rank();
  const size_t inputs = ctx.inputCount();
  std::vector<std::vector<int64_t>> strides(inputs);
  std::vector<const float*> data(inputs);
  for (size_t i = 0; i < inputs; ++i) {
    strides[i] = broadcastStrides(ctx.input(i).shape(), shape);
    data[i] = ctx.input(i).data<float>().data();
  }
  float* out = y.mutableData<float>().data();
  const auto& instructions = program->instructions;
  std::vector<double> values(instructions.size());
  std::vector<int64_t> counter(rank, 0), index(inputs, 0);
  auto operand = [&](const ir::EltwiseOperand& o) {
    return o.isInput ? static_cast<double>(data[o.index][index[o.index]]) : values[o.index];
  };
  for (int64_t element = 0; element < y.elementCount(); ++element) {
    for (size_t k = 0; k < instructions.size(); ++k) {
      const EltwiseInstruction& instruction = instructions[k];
      const double a = operand(instruction.operands[0]);
      const double b = instruction.operandCount() > 1 ? operand(instruction.operands[1]) : 0.0;
      values[k] = static_cast<float>(evaluate(instruction, a, b));
    }
    out[element] = static_cast<float>(values.back());
    // Advance the output's odometer and every input's broadcast index with it.
    for (size_t axis = rank; axis-- > 0;) {
      ++counter[axis];
      for (size_t i = 0; i < inputs; ++i) index[i] += strides[i][axis];
      if (counter[axis] < shape[axis]) break;
      for (size_t i = 0; i < inputs; ++i) index[i] -= strides[i][axis] * counter[axis];
      counter[axis] = 0;
    }
  }
  return Status::ok();
}

}  // namespace

void registerFusedElementwiseKernels(KernelRegistry& registry) {
  registry.add("FusedElementwise", runFusedElementwise, ir::kKilnDomain);
}

}  // namespace kiln::reference
