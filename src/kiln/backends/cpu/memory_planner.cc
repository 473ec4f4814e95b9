// The arena planner: one range per value, or shared ranges for values that are never alive at
// the same time.
#include "kiln/backends/cpu/memory_planner.h"

#include <algorithm>
#include <numeric>

namespace kiln::cpu {

const knobs::Knob kMemoryPlanner = knobs::declareKnob({
    .name = "cpu.memory.planner",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"reuse", "naive"},
    .defaultValue = "reuse",
    .help = "arena planning: share memory between values whose lifetimes do not overlap, or not",
    .backends = {"cpu"},
});

namespace {
constexpr int64_t kAlignment = 64;
int64_t alignUp(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

MemoryPlan planMemory(const std::vector<Lifetime>& lifetimes, bool reuse) {
  MemoryPlan plan;
  plan.offsets.assign(lifetimes.size(), 0);
  if (!reuse) {
    for (size_t i = 0; i < lifetimes.size(); ++i) {
      plan.offsets[i] = plan.arenaBytes;
      plan.arenaBytes += alignUp(lifetimes[i].bytes);
    }
    return plan;
  }
  std::vector<size_t> order(lifetimes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lifetimes[a].bytes > lifetimes[b].bytes; });
  std::vector<size_t> placed;
  for (size_t index : order) {
    const Lifetime& current = lifetimes[index];
    // Ranges taken by placed values alive at the same time, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> taken;
    for (size_t other : placed) {
      const Lifetime& o = lifetimes[other];
      if (o.first <= current.last && current.first <= o.last) {
        taken.emplace_back(plan.offsets[other], plan.offsets[other] + alignUp(o.bytes));
      }
    }
    std::sort(taken.begin(), taken.end());
    int64_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (offset + alignUp(current.bytes) <= begin) break;
      offset = std::max(offset, end);
    }
    plan.offsets[index] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + alignUp(current.bytes));
    placed.push_back(index);
  }
  return plan;
}

}  // namespace kiln::cpu
