// Reading Slices for the passes (slices.h).
#include "kiln/passes/slices.h"

#include <numeric>
#include <utility>

#include "kiln/ir/ops/slice.h"

namespace kiln::passes {

namespace {

std::optional<std::vector<int64_t>> constantInts(const ir::Value* value) {
  if (!value || !value->constant) return std::nullopt;
  return value->constant->toInt64Vector();
}

}  // namespace

std::optional<SliceParameters> sliceParameters(const ir::Node& slice) {
  SliceParameters p;
  if (slice.opsetVersion < 10) {
    auto starts = slice.getInts("starts");
    auto ends = slice.getInts("ends");
    auto axes = slice.getInts("axes");
    if (!starts.isOk() || !ends.isOk() || !axes.isOk()) return std::nullopt;
    p.starts = *starts;
    p.ends = *ends;
    p.axes = *axes;
  } else {
    auto starts = constantInts(slice.input(1));
    auto ends = constantInts(slice.input(2));
    if (!starts || !ends) return std::nullopt;
    p.starts = std::move(*starts);
    p.ends = std::move(*ends);
    for (auto [index, field] : {std::pair{size_t{3}, &p.axes}, std::pair{size_t{4}, &p.steps}}) {
      if (!slice.hasInput(index)) continue;
      auto values = constantInts(slice.input(index));
      if (!values) return std::nullopt;
      *field = std::move(*values);
    }
  }
  if (p.axes.empty()) {
    p.axes.resize(p.starts.size());
    std::iota(p.axes.begin(), p.axes.end(), int64_t{0});
  }
  if (p.steps.empty()) p.steps.assign(p.starts.size(), 1);
  if (p.ends.size() != p.starts.size() || p.axes.size() != p.starts.size() ||
      p.steps.size() != p.starts.size()) {
    return std::nullopt;
  }
  return p;
}

std::vector<int64_t> selectedPositions(int64_t dim, int64_t start, int64_t end, int64_t step) {
  const ir::SliceAxis axis = ir::resolveSliceAxis(start, end, step, dim);
  std::vector<int64_t> positions(static_cast<size_t>(axis.length));
  for (int64_t k = 0; k < axis.length; ++k) {
    positions[static_cast<size_t>(k)] = axis.first + k * step;
  }
  return positions;
}

}  // namespace kiln::passes
