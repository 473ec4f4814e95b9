// The arena planner: values alive at the same time never overlap; "reuse" shares the rest.
#include "kiln/backends/cpu/memory_planner.h"

#include <gtest/gtest.h>

namespace kiln::cpu {
namespace {

bool overlaps(const std::vector<Lifetime>& l, const MemoryPlan& p, size_t a, size_t b) {
  const bool timeOverlap = l[a].first <= l[b].last && l[b].first <= l[a].last;
  const bool spaceOverlap =
      p.offsets[a] < p.offsets[b] + l[b].bytes && p.offsets[b] < p.offsets[a] + l[a].bytes;
  return timeOverlap && spaceOverlap;
}

TEST(MemoryPlanner, ChainReusesMemory) {
  // x -> a -> b -> c: each value dies after the next step reads it.
  std::vector<Lifetime> chain = {{1000, -1, 0}, {1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}};
  MemoryPlan reuse = planMemory(chain, true);
  MemoryPlan naive = planMemory(chain, false);
  EXPECT_EQ(naive.arenaBytes, 4 * 1024);  // 1000 rounded up to 64-byte multiples
  EXPECT_EQ(reuse.arenaBytes, 2 * 1024);  // two alive at once at most
  for (size_t a = 0; a < chain.size(); ++a) {
    for (size_t b = a + 1; b < chain.size(); ++b) EXPECT_FALSE(overlaps(chain, reuse, a, b));
  }
  for (int64_t offset : reuse.offsets) EXPECT_EQ(offset % 64, 0);
}

TEST(MemoryPlanner, NeverOverlapsLiveValues) {
  std::vector<Lifetime> values;
  for (int i = 0; i < 60; ++i) {
    values.push_back({(i * 7919) % 5000 + 1, (i * 13) % 40 - 1, (i * 13) % 40 + (i % 9)});
  }
  MemoryPlan plan = planMemory(values, true);
  int64_t naiveBytes = planMemory(values, false).arenaBytes;
  EXPECT_LT(plan.arenaBytes, naiveBytes);
  for (size_t a = 0; a < values.size(); ++a) {
    EXPECT_LE(plan.offsets[a] + values[a].bytes, plan.arenaBytes);
    for (size_t b = a + 1; b < values.size(); ++b) {
      EXPECT_FALSE(overlaps(values, plan, a, b)) << a << " and " << b;
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
