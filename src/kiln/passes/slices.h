// What the passes that see through Slices (concat_slices_to_gather, compose_row_moves) read of
// one: its parameters, where build time knows them, and the positions it takes along an axis.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

// A Slice's starts, ends, axes and steps (attributes before opset 10, constant inputs from it),
// with the defaults filled in; nothing when one of them is only known at run time.
struct SliceParameters {
  std::vector<int64_t> starts, ends, axes, steps;
};

std::optional<SliceParameters> sliceParameters(const ir::Node& slice);

// The positions a Slice with this start, end and step takes along an axis of `dim` elements, in
// order (ONNX's clamping: ir::resolveSliceAxis).
std::vector<int64_t> selectedPositions(int64_t dim, int64_t start, int64_t end, int64_t step);

}  // namespace kiln::passes
