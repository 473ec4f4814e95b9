// The IR text printer.
#include "kiln/ir/printer.h"

#include <sstream>

namespace kiln::ir {

namespace {
std::string typeText(const Value& value) {
  if (!value.hasType) return "?";
  return fmt::format("{}{}", dtypeName(value.dtype), value.shape.toString());
}

std::string tensorSummary(const Tensor& tensor) {
  if (tensor.elementCount() > 8) {
    return fmt::format("<{}{}>", dtypeName(tensor.dtype()), tensor.shape().toString());
  }
  std::vector<std::string> elements;
  for (int64_t i = 0; i < tensor.elementCount(); ++i) {
    elements.push_back(fmt::format("{}", tensor.elementAsDouble(i)));
  }
  return fmt::format("{}{}{{{}}}", dtypeName(tensor.dtype()), tensor.shape().toString(),
                     fmt::join(elements, ","));
}
}  // namespace

std::string describeValue(const Value& value) {
  return fmt::format("{} : {}", value.name, typeText(value));
}

std::string printAttribute(const Attribute& attribute) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return fmt::format("\"{}\"", v);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          return tensorSummary(v);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::vector<std::string> quoted;
          for (const auto& s : v) quoted.push_back("\"" + s + "\"");
          return fmt::format("[{}]", fmt::join(quoted, ","));
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                             std::is_same_v<T, std::vector<float>>) {
          return fmt::format("[{}]", fmt::join(v, ","));
        } else {
          return fmt::format("{}", v);
        }
      },
      attribute.value);
}

std::string printGraph(const Graph& graph) {
  std::ostringstream out;
  for (const Value* input : graph.inputs) out << "input %" << describeValue(*input) << "\n";
  for (const auto& value : graph.values()) {
    if (value->isInitializer) out << "const %" << describeValue(*value) << "\n";
  }
  for (const auto& node : graph.nodes()) {
    std::vector<std::string> outputs;
    for (const Value* output : node->outputs) {
      outputs.push_back(output ? "%" + describeValue(*output) : "_");
    }
    std::vector<std::string> inputs;
    for (const Value* input : node->inputs) inputs.push_back(input ? "%" + input->name : "_");
    std::vector<std::string> attributes;
    for (const auto& [name, attribute] : node->attributes) {
      attributes.push_back(name + "=" + printAttribute(attribute));
    }
    const std::string op = node->domain.empty() ? node->opType : node->domain + "." + node->opType;
    out << fmt::format("{} = {} \"{}\" ({})", fmt::join(outputs, ", "), op, node->name,
                       fmt::join(inputs, ", "));
    if (!attributes.empty()) out << fmt::format(" {{{}}}", fmt::join(attributes, ", "));
    out << "\n";
  }
  for (const Value* output : graph.outputs) out << "output %" << output->name << "\n";
  return out.str();
}

}  // namespace kiln::ir
