// kiln.FusedElementwise: a chain (or small DAG) of float32 elementwise ops run as one node. Its
// `program` attribute lists one instruction per string, in execution order:
//
//   program = ["Add x0 x1", "Sigmoid t0", "Mul t0 t1", "Clip t2 0 6"]
//
// Instruction k writes the value t<k>; an operand is x<i> (the node's input i, broadcast to the
// output's shape) or t<j> (an earlier instruction's value, j < k). Numbers after the operands are
// the op's float parameters (LeakyRelu's alpha, HardSigmoid's alpha and beta, Clip's min and max).
// The last instruction's value is the output. The parser is shared by shape inference, the
// reference kernel and the CPU kernel, so the three read a program the same way.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/status.h"

namespace kiln::ir {

// The operations a program may use: the ONNX op of the same name (Gelu is the exact GELU,
// GeluTanh its tanh approximation; Max and Min take two operands and propagate NaN).
enum class EltwiseOpcode {
  kRelu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kErf,
  kReciprocal,
  kHardSigmoid,
  kHardSwish,
  kLeakyRelu,
  kClip,
  kGelu,
  kGeluTanh,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMax,
  kMin,
};

struct EltwiseOpcodeInfo {
  const char* name;  // as the program spells it
  int operands;      // 1 or 2
  int params;        // float parameters after the operands
};

const EltwiseOpcodeInfo& eltwiseOpcodeInfo(EltwiseOpcode opcode);
std::optional<EltwiseOpcode> findEltwiseOpcode(std::string_view name);

struct EltwiseOperand {
  bool isInput = true;  // x<index> (a node input) or t<index> (an earlier instruction's value)
  int index = 0;

  bool operator==(const EltwiseOperand&) const = default;
};

struct EltwiseInstruction {
  EltwiseOpcode opcode = EltwiseOpcode::kRelu;
  std::array<EltwiseOperand, 2> operands{};  // eltwiseOpcodeInfo(opcode).operands are used
  std::array<float, 2> params{};             // eltwiseOpcodeInfo(opcode).params are used

  int operandCount() const { return eltwiseOpcodeInfo(opcode).operands; }
  // The program text of this instruction ("Clip t2 0 6"); floats print so they read back exactly.
  std::string toString() const;
};

struct EltwiseProgram {
  std::vector<EltwiseInstruction> instructions;

  std::vector<std::string> toStrings() const;
};

// Parses and checks a program for a node with `inputCount` inputs: known opcodes, operand and
// parameter counts, operands naming an existing input or an earlier instruction, at least one
// instruction. The error says which instruction is wrong and why (callers prefix the node).
Result<EltwiseProgram> parseEltwiseProgram(const std::vector<std::string>& program,
                                           size_t inputCount);

}  // namespace kiln::ir
