// Small graphs on which the reuse planner's choices (tests/knobs: cpu.memory.*, cuda.memory.*)
// give different arenas, in units of the backend's alignment: `unit` float32 elements make one
// aligned range (16 for the CPU's 64 bytes, 64 for the GPU's 256).
#pragma once

#include <cstdint>

#include "graph_sketch.h"

namespace kiln::testing {

// x [unit] -> Pad to [4 unit] -> Slice to [3 unit]: values of 1, 4 and 3 units; x lives with the
// padded value, the padded value with the slice. Largest first: the padded value at 0, then the
// slice and x both at 4 (they never live together): 7 units. In order of definition: x at 0,
// the padded value at 1, and the slice finds no gap below it, so goes at 5: 8 units.
inline ir::Graph padThenSlice(int64_t unit) {
  GraphSketch g;
  auto pads = g.constant("pads", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {unit, 2 * unit}));
  auto padded = g.node("Pad", {g.input("x", {unit}), pads}, {}, "pad");
  auto starts = g.constant("starts", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {unit / 2}));
  auto ends =
      g.constant("ends", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {unit / 2 + 3 * unit}));
  g.output(g.node("Slice", {padded, starts, ends}, {}, "slice"));
  return g.take();
}

// x [2 unit] -> Pad to [3 unit] (an output) -> Neg; Neg(x); Concat of the two Negs [5 unit] (an
// output) -> Neg (an output): six values of 2, 3, 3, 2, 5 and 5 units, found by a search over
// small graphs for one where the fits differ. Largest first, first fit packs them in 13 units;
// best fit puts the 3-unit Neg in a tighter gap that later forces a 5-unit value past the end:
// 15 units.
inline ir::Graph fitChooser(int64_t unit) {
  GraphSketch g;
  auto x = g.input("x", {2 * unit});
  auto pads = g.constant("pads", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {0, unit}));
  auto padded = g.node("Pad", {x, pads}, {}, "pad");
  auto n1 = g.node("Neg", {padded}, {}, "n1");
  auto n2 = g.node("Neg", {x}, {}, "n2");
  auto cat = g.node("Concat", {n2, n1}, {{"axis", ir::Attribute{int64_t{0}}}}, "cat");
  g.output(padded);
  g.output(cat);
  g.output(g.node("Neg", {cat}, {}, "n3"));
  return g.take();
}

}  // namespace kiln::testing
