// The CPU backend's memory-planning knob; the planner itself is shared by the backends
// (kiln/backends/buffer_assignment.h).
#pragma once

#include "kiln/backends/buffer_assignment.h"
#include "kiln/knobs/knob.h"

namespace kiln::cpu {

extern const knobs::Knob kMemoryPlanner;

using backends::Lifetime;
using backends::MemoryPlan;
using backends::planMemory;

}  // namespace kiln::cpu
