// The CPU backend's ThreadPool: every index of a parallelFor runs exactly once, in the same
// deterministic chunks whatever the spin setting, over many back-to-back calls (the case the
// spinning hand-over between calls must get right), and a pool with spinning workers shuts down.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "kiln/backends/cpu/thread_pool.h"

namespace kiln::testing {
namespace {

// Runs `calls` back-to-back parallelFors of `count` indices, each index adding its call number
// to its own slot, and returns the slots.
std::vector<int64_t> runCalls(cpu::ThreadPool& pool, int calls, int64_t count, int64_t grain) {
  std::vector<int64_t> slots(static_cast<size_t>(count), 0);
  for (int call = 1; call <= calls; ++call) {
    pool.parallelFor(count, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) slots[static_cast<size_t>(i)] += call;
    });
  }
  return slots;
}

TEST(ThreadPool, EveryIndexOnceOverManyCallsWithAndWithoutSpinning) {
  constexpr int kCalls = 1000;
  const int64_t expected = int64_t{kCalls} * (kCalls + 1) / 2;
  for (int threads : {1, 2, 3}) {
    for (int spin : {0, 50}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, spin " + std::to_string(spin) + " us");
      cpu::ThreadPool pool(threads, spin);
      for (int64_t count : {1, 5, 64}) {
        const std::vector<int64_t> slots = runCalls(pool, kCalls, count, 1);
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(slots[static_cast<size_t>(i)], expected) << i;
      }
    }
  }
}

TEST(ThreadPool, ChunksDoNotDependOnSpinning) {
  for (int spin : {0, 200}) {
    cpu::ThreadPool pool(3, spin);
    std::vector<int64_t> endOf(10, -1);  // by each chunk's first index
    std::atomic<int> seen{0};
    pool.parallelFor(10, 1, [&](int64_t begin, int64_t end) {
      endOf[static_cast<size_t>(begin)] = end;
      seen.fetch_add(1);
    });
    EXPECT_EQ(seen.load(), 3);
    EXPECT_EQ(endOf, (std::vector<int64_t>{3, -1, -1, 6, -1, -1, 10, -1, -1, -1}));
  }
}

TEST(ThreadPool, ShutsDownWhileWorkersSpin) {
  for (int i = 0; i < 20; ++i) {
    cpu::ThreadPool pool(3, 100000);  // workers still spinning after the one call
    pool.parallelFor(4, 1, [](int64_t, int64_t) {});
  }
}

}  // namespace
}  // namespace kiln::testing
