// Build-time readings of a node's constant operands that both backends' lowerings need.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::backends {

// A constant int32/int64 input as int64 values; nullopt where it is absent or not constant.
std::optional<std::vector<int64_t>> constantInts(const ir::Node& node, size_t input);

// Pad's amounts over every axis of a rank-`rank` input, [begin_0, ..., begin_{r-1}, end_0, ...,
// end_{r-1}]: from the `pads` (or `paddings`) attribute before opset 11, else from the constant
// pads input, spread over the constant `axes` input where one is given. nullopt where they are
// not known at build time or do not fit the rank.
std::optional<std::vector<int64_t>> padAmounts(const ir::Node& node, size_t rank);

}  // namespace kiln::backends
