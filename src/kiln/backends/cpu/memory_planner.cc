// The CPU backend's memory-planning knob (the planner: kiln/backends/buffer_assignment.cc).
#include "kiln/backends/cpu/memory_planner.h"

namespace kiln::cpu {

const knobs::Knob kMemoryPlanner = knobs::declareKnob({
    .name = "cpu.memory.planner",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"reuse", "naive"},
    .defaultValue = "reuse",
    .help = "arena planning: share memory between values whose lifetimes do not overlap, or not",
    .backends = {"cpu"},
});

}  // namespace kiln::cpu
