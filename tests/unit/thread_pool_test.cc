// The CPU backend's ThreadPool: every index of a parallelFor runs exactly once, in the same
// deterministic chunks whatever the spin setting, over many back-to-back calls (the case the
// spinning hand-over between calls must get right), with chunks owned by threads or taken by
// whoever comes first; that owned chunk t runs on thread t on every call; and a pool with
// spinning workers shuts down.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
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
      for (bool own : {true, false}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, spin " + std::to_string(spin) + " us, " +
                     (own ? "own" : "any") + " chunks");
        cpu::ThreadPool pool(threads, spin, /*pinWorkers=*/false, own);
        for (int64_t count : {1, 5, 64}) {
          const std::vector<int64_t> slots = runCalls(pool, kCalls, count, 1);
          for (int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(slots[static_cast<size_t>(i)], expected) << i;
          }
        }
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

// Every chunk waits until all of the call's chunks have started, so no thread can finish its own
// and take another's: chunk t must then run on thread t (the caller is thread 0), call after call,
// whether the workers spin or sleep in between. With fewer chunks than threads the extra workers
// take none.
TEST(ThreadPool, OwnChunksGoToTheirThreads) {
  for (int spin : {0, 200}) {
    for (int64_t chunks : {3, 2}) {
      SCOPED_TRACE("spin " + std::to_string(spin) + " us, " + std::to_string(chunks) + " chunks");
      cpu::ThreadPool pool(3, spin, /*pinWorkers=*/false, /*ownChunks=*/true);
      std::vector<std::thread::id> owner(static_cast<size_t>(chunks));
      for (int call = 0; call < 50; ++call) {
        std::atomic<int> started{0};
        std::atomic<bool> timedOut{false};
        std::mutex mutex;
        std::vector<std::thread::id> ranOn(static_cast<size_t>(chunks));
        pool.parallelFor(chunks, 1, [&](int64_t begin, int64_t end) {
          ASSERT_EQ(end, begin + 1);
          {
            std::lock_guard lock(mutex);
            ranOn[static_cast<size_t>(begin)] = std::this_thread::get_id();
          }
          started.fetch_add(1);
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (started.load() < chunks) {
            if (std::chrono::steady_clock::now() > deadline) {
              timedOut.store(true);
              return;
            }
            std::this_thread::yield();
          }
        });
        ASSERT_FALSE(timedOut.load()) << "call " << call << ": a chunk never started";
        EXPECT_EQ(ranOn[0], std::this_thread::get_id()) << "call " << call;
        if (call == 0) owner = ranOn;
        EXPECT_EQ(ranOn, owner) << "call " << call << ": a chunk moved to another thread";
      }
      for (size_t a = 0; a < owner.size(); ++a) {
        for (size_t b = a + 1; b < owner.size(); ++b) EXPECT_NE(owner[a], owner[b]);
      }
    }
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
