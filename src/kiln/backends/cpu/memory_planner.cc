// The CPU backend's memory-planning knobs (the planner: kiln/backends/buffer_assignment.cc).
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

const knobs::Knob kMemoryAlignment = knobs::declareKnob({
    .name = "cpu.memory.alignment",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"64", "4096"},
    .defaultValue = "64",
    .help = "64: each value's offset in the arena (and its range's size) is a multiple of a cache "
            "line; 4096: a multiple of a 4 KiB page, so no two values share a page",
    .backends = {"cpu"},
});

const knobs::Knob kMemoryFit = knobs::declareKnob({
    .name = "cpu.memory.fit",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"first", "best"},
    .defaultValue = "first",
    .help =
        "where the reuse planner puts a value among the gaps left by overlapping values already "
        "placed: first, the lowest gap that holds it; best, the smallest such gap (neither "
        "always gives the smaller arena)",
    .backends = {"cpu"},
});

const knobs::Knob kMemoryOrder = knobs::declareKnob({
    .name = "cpu.memory.order",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"size", "time"},
    .defaultValue = "size",
    .help = "the order in which the reuse planner places values: size, largest first; time, in "
            "the order the plan defines them",
    .backends = {"cpu"},
});

backends::Fit memoryFit(const knobs::Route& route) {
  return route.value(kMemoryFit) == "best" ? backends::Fit::kBest : backends::Fit::kFirst;
}

backends::Order memoryOrder(const knobs::Route& route) {
  return route.value(kMemoryOrder) == "time" ? backends::Order::kTime : backends::Order::kSize;
}

int64_t memoryAlignment(const knobs::Route& route) {
  return route.value(kMemoryAlignment) == "4096" ? 4096 : 64;
}

}  // namespace kiln::cpu
