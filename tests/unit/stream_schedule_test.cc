// backends::scheduleStreams (stream_schedule.h): which stream each step of a GPU plan runs on and
// which steps on other streams it waits for, from the arena ranges the steps read and write.
#include "kiln/backends/stream_schedule.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln::backends {
namespace {

// A step reading the ranges `reads` and writing `writes`, each range [100 k, 100 k + 100) for a
// value k.
StepAccess step(std::vector<int> reads, std::vector<int> writes) {
  StepAccess access;
  for (int k : reads) access.reads.push_back({100 * k, 100 * k + 100});
  for (int k : writes) access.writes.push_back({100 * k, 100 * k + 100});
  return access;
}

using Waits = std::vector<std::vector<int>>;

TEST(StreamSchedule, OneStreamKeepsEverythingOnThePlansStream) {
  const auto schedule =
      scheduleStreams({step({0}, {1}), step({0}, {2}), step({1, 2}, {3})}, /*maxStreams=*/1);
  EXPECT_EQ(schedule.streams, 1);
  EXPECT_EQ(schedule.stream, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(schedule.waits, (Waits{{}, {}, {}}));
  EXPECT_EQ(schedule.signals, (std::vector<bool>{false, false, false}));
}

// x -> a; a -> b and a -> c (two branches); b, c -> d. The second branch forks to stream 1
// after a; d continues stream 1 and waits for b on stream 0.
TEST(StreamSchedule, ForkAndJoinWaitOnlyAcrossStreams) {
  const auto schedule = scheduleStreams(
      {step({0}, {1}), step({1}, {2}), step({1}, {3}), step({2, 3}, {4})}, /*maxStreams=*/2);
  EXPECT_EQ(schedule.streams, 2);
  EXPECT_EQ(schedule.stream, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(schedule.waits, (Waits{{}, {}, {0}, {1}}));
  EXPECT_EQ(schedule.signals, (std::vector<bool>{true, true, false, false}));
}

// Four branches off one value and a step that reads them all: with two streams one branch forks
// off and the rest queue on the plan's stream; with four each gets its own, and the join
// continues the last branch's stream, waiting for the other three.
TEST(StreamSchedule, BranchesSpreadUpToTheStreamLimit) {
  const std::vector<StepAccess> steps = {step({0}, {1}), step({1}, {2}), step({1}, {3}),
                                         step({1}, {4}), step({1}, {5}), step({2, 3, 4, 5}, {6})};
  const auto two = scheduleStreams(steps, 2);
  EXPECT_EQ(two.streams, 2);
  EXPECT_EQ(two.stream, (std::vector<int>{0, 0, 1, 0, 0, 0}));
  // The join waits for the one branch on stream 1; the rest are ahead of it on stream 0.
  EXPECT_EQ(two.waits.back(), (std::vector<int>{2}));
  const auto four = scheduleStreams(steps, 4);
  EXPECT_EQ(four.streams, 4);
  EXPECT_EQ(four.stream, (std::vector<int>{0, 0, 1, 2, 3, 3}));
  EXPECT_EQ(four.waits.back(), (std::vector<int>{1, 2, 3}));
  for (size_t i = 2; i <= 4; ++i) EXPECT_EQ(four.waits[i], (std::vector<int>{0})) << i;
}

// A step that writes memory an earlier step on another stream still reads (the arena reusing a
// range) must wait for it: write-after-read is a dependency too.
TEST(StreamSchedule, MemoryReuseIsADependency) {
  // 0 reads x (0) and writes value 1; 1 reads x and writes value 2 (no dependency: stream 1);
  // 2 reads value 1; 3 reads value 2 and writes a new value into value 1's range, which step 0
  // wrote and step 2 read.
  StepAccess reuse = step({2}, {});
  reuse.writes.push_back({100, 200});
  const auto schedule =
      scheduleStreams({step({0}, {1}), step({0}, {2}), step({1}, {5}), reuse}, /*maxStreams=*/2);
  EXPECT_EQ(schedule.stream, (std::vector<int>{0, 1, 0, 0}));
  EXPECT_EQ(schedule.waits[3], (std::vector<int>{1}));
  // Whatever the streams, step 3 is ordered after both steps that touched the range.
  ASSERT_EQ(schedule.stream.size(), 4u);
  const int home = schedule.stream[3];
  for (int before : {0, 2}) {
    const bool sameStream = schedule.stream[static_cast<size_t>(before)] == home;
    bool waited = false;
    for (int w : schedule.waits[3]) waited = waited || w >= before;
    EXPECT_TRUE(sameStream || waited) << "step 3 is not ordered after step " << before;
  }
}

// Waits already implied by an earlier wait on the same stream are left out (vector clocks).
TEST(StreamSchedule, TransitiveWaitsAreNotRepeated) {
  // 0 -> 1 (stream 0), 0 -> 2 (stream 1), 3 reads 1 and 2 (stream 1, waits for 1), 4 reads 0
  // and 3 (continues stream 1: 0 is already behind it through the wait for 1).
  const auto schedule = scheduleStreams(
      {step({9}, {0}), step({0}, {1}), step({0}, {2}), step({1, 2}, {3}), step({0, 3}, {4})}, 2);
  EXPECT_EQ(schedule.stream, (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(schedule.waits[3], (std::vector<int>{1}));
  EXPECT_TRUE(schedule.waits[4].empty());
}

}  // namespace
}  // namespace kiln::backends
