// A text form of the IR, for golden tests, `kiln inspect --ir` and --dump-ir-after.
//
//   input %x : float32[1,3,8,8]
//   const %w : float32[4,3,3,3]
//   %y : float32[1,4,6,6] = Conv "conv1" (%x, %w) {kernel_shape=[3,3]}
//   output %y
#pragma once

#include <string>

#include "kiln/ir/graph.h"

namespace kiln::ir {

std::string describeValue(const Value& value);  // "x : float32[1,3,8,8]"
std::string printAttribute(const Attribute& attribute);
std::string printGraph(const Graph& graph);

}  // namespace kiln::ir
