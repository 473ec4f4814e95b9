// Shape inference for kiln.FusedElementwise (made by the fuse_elementwise pass) and the parser of
// its program (fused_elementwise.h). The output is float32 with the shape all inputs broadcast
// to, as the chain of numpy-broadcasting ops it replaces has.
#include "kiln/ir/ops/fused_elementwise.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

constexpr EltwiseOpcodeInfo kOpcodes[] = {
    {"Relu", 1, 0},      {"Sigmoid", 1, 0},    {"Tanh", 1, 0},        {"Exp", 1, 0},
    {"Log", 1, 0},       {"Sqrt", 1, 0},       {"Neg", 1, 0},         {"Abs", 1, 0},
    {"Erf", 1, 0},       {"Reciprocal", 1, 0}, {"HardSigmoid", 1, 2}, {"HardSwish", 1, 0},
    {"LeakyRelu", 1, 1}, {"Clip", 1, 2},       {"Gelu", 1, 0},        {"GeluTanh", 1, 0},
    {"Add", 2, 0},       {"Sub", 2, 0},        {"Mul", 2, 0},         {"Div", 2, 0},
    {"Pow", 2, 0},       {"Max", 2, 0},        {"Min", 2, 0},
};
static_assert(std::size(kOpcodes) == static_cast<size_t>(EltwiseOpcode::kMin) + 1);

std::vector<std::string> splitWords(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// "x3" or "t0"; the index is checked by the caller.
std::optional<EltwiseOperand> parseOperand(const std::string& word) {
  if (word.size() < 2 || (word[0] != 'x' && word[0] != 't')) return std::nullopt;
  int index = 0;
  const char* end = word.data() + word.size();
  auto [ptr, error] = std::from_chars(word.data() + 1, end, index);
  if (error != std::errc() || ptr != end || index < 0) return std::nullopt;
  return EltwiseOperand{word[0] == 'x', index};
}

std::optional<float> parseFloat(const std::string& word) {
  char* end = nullptr;
  const float value = std::strtof(word.c_str(), &end);
  if (word.empty() || end != word.c_str() + word.size()) return std::nullopt;
  return value;
}

std::string operandText(const EltwiseOperand& operand) {
  return fmt::format("{}{}", operand.isInput ? 'x' : 't', operand.index);
}

Status inferFusedElementwise(InferContext& ctx) {
  const Node& node = ctx.node();
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    if (!ctx.hasInput(i)) return ctx.error("input {} is missing; every input is required", i);
    if (ctx.inputType(i) != DType::kFloat32) {
      return ctx.error("input {} has dtype {}; FusedElementwise computes in float32", i,
                       dtypeName(ctx.inputType(i)));
    }
  }
  KILN_RETURN_IF_ERROR(node.requireAttribute("program"));
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> text, node.getStrings("program"));
  auto program = parseEltwiseProgram(text, ctx.inputCount());
  if (!program.isOk()) return ctx.error("{}", program.status().message());
  std::vector<bool> read(ctx.inputCount(), false);
  for (const EltwiseInstruction& instruction : program->instructions) {
    for (int k = 0; k < instruction.operandCount(); ++k) {
      if (instruction.operands[k].isInput) read[instruction.operands[k].index] = true;
    }
  }
  Shape shape = ctx.inputShape(0);
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    // An input no instruction reads would still broadcast the output: a pass bug.
    if (!read[i]) return ctx.error("no instruction of the program reads input {} (x{})", i, i);
    auto broadcast = broadcastShapes(shape, ctx.inputShape(i));
    if (!broadcast.isOk()) {
      return ctx.error("input {} {} does not broadcast with the other inputs ({})", i,
                       ctx.inputShape(i).toString(), shape.toString());
    }
    shape = std::move(*broadcast);
  }
  ctx.setOutput(0, DType::kFloat32, std::move(shape));
  return Status::ok();
}

}  // namespace

const EltwiseOpcodeInfo& eltwiseOpcodeInfo(EltwiseOpcode opcode) {
  return kOpcodes[static_cast<size_t>(opcode)];
}

std::optional<EltwiseOpcode> findEltwiseOpcode(std::string_view name) {
  for (size_t i = 0; i < std::size(kOpcodes); ++i) {
    if (name == kOpcodes[i].name) return static_cast<EltwiseOpcode>(i);
  }
  return std::nullopt;
}

std::string EltwiseInstruction::toString() const {
  const EltwiseOpcodeInfo& info = eltwiseOpcodeInfo(opcode);
  std::string text = info.name;
  for (int k = 0; k < info.operands; ++k) text += " " + operandText(operands[k]);
  // fmt prints the shortest text that reads back as the same float (inf as "inf").
  for (int k = 0; k < info.params; ++k) text += fmt::format(" {}", params[k]);
  return text;
}

std::vector<std::string> EltwiseProgram::toStrings() const {
  std::vector<std::string> text;
  for (const EltwiseInstruction& instruction : instructions) text.push_back(instruction.toString());
  return text;
}

Result<EltwiseProgram> parseEltwiseProgram(const std::vector<std::string>& program,
                                           size_t inputCount) {
  if (program.empty()) return invalidInput("the program has no instructions");
  EltwiseProgram parsed;
  for (size_t k = 0; k < program.size(); ++k) {
    const std::vector<std::string> words = splitWords(program[k]);
    auto fail = [&](const std::string& why) {
      return invalidInput("program instruction {} (\"{}\"): {}", k, program[k], why);
    };
    if (words.empty()) return fail("empty instruction");
    const std::optional<EltwiseOpcode> opcode = findEltwiseOpcode(words[0]);
    if (!opcode) {
      std::vector<std::string> names;
      for (const EltwiseOpcodeInfo& info : kOpcodes) names.push_back(info.name);
      return fail(fmt::format("unknown opcode '{}' (known: {})", words[0], fmt::join(names, ", ")));
    }
    const EltwiseOpcodeInfo& info = eltwiseOpcodeInfo(*opcode);
    const size_t expected = 1 + static_cast<size_t>(info.operands + info.params);
    if (words.size() != expected) {
      return fail(fmt::format("{} takes {} operand(s) and {} parameter(s), got {} word(s) after it",
                              info.name, info.operands, info.params, words.size() - 1));
    }
    EltwiseInstruction instruction;
    instruction.opcode = *opcode;
    for (int i = 0; i < info.operands; ++i) {
      const std::string& word = words[1 + static_cast<size_t>(i)];
      const std::optional<EltwiseOperand> operand = parseOperand(word);
      if (!operand)
        return fail(fmt::format("operand '{}' is not x<input> or t<instruction>", word));
      if (operand->isInput && static_cast<size_t>(operand->index) >= inputCount) {
        return fail(
            fmt::format("operand {} is out of range: the node has {} input(s)", word, inputCount));
      }
      if (!operand->isInput && static_cast<size_t>(operand->index) >= k) {
        return fail(
            k == 0
                ? fmt::format("operand {} is out of range: no instruction precedes it", word)
                : fmt::format("operand {} is out of range: only t0..t{} precede it", word, k - 1));
      }
      instruction.operands[static_cast<size_t>(i)] = *operand;
    }
    for (int i = 0; i < info.params; ++i) {
      const std::string& word = words[1 + static_cast<size_t>(info.operands + i)];
      const std::optional<float> value = parseFloat(word);
      if (!value) return fail(fmt::format("parameter '{}' is not a number", word));
      instruction.params[static_cast<size_t>(i)] = *value;
    }
    parsed.instructions.push_back(instruction);
  }
  return parsed;
}

void registerFusedElementwiseSchemas(OpRegistry& registry) {
  registry.add({.opType = "FusedElementwise",
                .domain = kKilnDomain,
                .minInputs = 1,
                .maxInputs = 256,
                .infer = inferFusedElementwise});
}

}  // namespace kiln::ir
