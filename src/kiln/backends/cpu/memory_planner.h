// The CPU backend's memory-planning knobs; the planner itself is shared by the backends
// (kiln/backends/buffer_assignment.h).
#pragma once

#include <cstdint>

#include "kiln/backends/buffer_assignment.h"
#include "kiln/knobs/knob.h"
#include "kiln/knobs/route.h"

namespace kiln::cpu {

extern const knobs::Knob kMemoryPlanner;
extern const knobs::Knob kMemoryAlignment;
extern const knobs::Knob kMemoryFit;
extern const knobs::Knob kMemoryOrder;

// cpu.memory.fit and cpu.memory.order: how the reuse planner places values.
backends::Fit memoryFit(const knobs::Route& route);
backends::Order memoryOrder(const knobs::Route& route);

// The byte alignment of each value's offset in the arena that `route` asks for.
int64_t memoryAlignment(const knobs::Route& route);

using backends::Lifetime;
using backends::MemoryPlan;
using backends::planMemory;

}  // namespace kiln::cpu
