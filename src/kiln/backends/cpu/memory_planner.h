// Places every runtime value of a plan in one arena.
#pragma once

#include <vector>

#include "kiln/knobs/knob.h"

namespace kiln::cpu {

extern const knobs::Knob kMemoryPlanner;

// A value to place: its size and the steps between which it must stay intact (first = the step
// that writes it, or -1 for graph inputs; last = the last step that reads it, or the step count
// for graph outputs).
struct Lifetime {
  int64_t bytes = 0;
  int first = 0;
  int last = 0;
};

// Offsets (64-byte aligned) for each lifetime, and the arena size they need. "naive" gives every
// value its own range; "reuse" lets values whose lifetimes do not overlap share memory
// (greedy by size: the largest values are placed first, each at the lowest offset that does not
// collide with an overlapping value already placed).
struct MemoryPlan {
  std::vector<int64_t> offsets;
  int64_t arenaBytes = 0;
};
MemoryPlan planMemory(const std::vector<Lifetime>& lifetimes, bool reuse);

}  // namespace kiln::cpu
