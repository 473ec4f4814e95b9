#include "kiln/backends/node_constants.h"

#include "kiln/ir/tensor.h"

namespace kiln::backends {

std::optional<std::vector<int64_t>> constantInts(const ir::Node& node, size_t input) {
  const ir::Value* value = node.input(input);
  if (!value || !value->constant) return std::nullopt;
  if (value->dtype != ir::DType::kInt64 && value->dtype != ir::DType::kInt32) return std::nullopt;
  return value->constant->toInt64Vector();
}

std::optional<std::vector<int64_t>> padAmounts(const ir::Node& node, size_t rank) {
  std::vector<int64_t> pads;
  if (node.opsetVersion < 11) {
    auto attr = node.getInts(node.hasAttribute("paddings") ? "paddings" : "pads");
    if (!attr.isOk()) return std::nullopt;
    pads = *attr;
  } else {
    auto given = constantInts(node, 1);
    if (!given) return std::nullopt;
    pads = *given;
    if (node.hasInput(3)) {
      auto axes = constantInts(node, 3);
      if (!axes || 2 * axes->size() != pads.size()) return std::nullopt;
      std::vector<int64_t> full(2 * rank, 0);
      for (size_t i = 0; i < axes->size(); ++i) {
        auto axis = ir::normalizeAxis((*axes)[i], static_cast<int64_t>(rank));
        if (!axis.isOk()) return std::nullopt;
        full[static_cast<size_t>(*axis)] = pads[i];
        full[static_cast<size_t>(*axis) + rank] = pads[i + axes->size()];
      }
      pads = std::move(full);
    }
  }
  if (pads.size() != 2 * rank) return std::nullopt;
  return pads;
}

}  // namespace kiln::backends
