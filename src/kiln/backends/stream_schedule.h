// Spreading a GPU plan's steps over auxiliary streams (cuda.streams): independent branches (the
// atrous convolutions of an ASPP head, a ResNet block's shortcut beside its main path) run side
// by side, each stream's steps in plan order, with an event wherever a step on one stream needs a
// step on another. Host logic only: it sees each step as the byte ranges it reads and writes, so
// it is tested without a GPU.
//
// Two steps depend on each other when one writes a range the other reads or writes (the arena
// reuses memory between values whose lifetimes do not overlap in plan order, so a reuse is a
// dependency too). Each stream has its own workspace, so workspace never makes two steps depend.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::backends {

// Bytes [begin, end) of one buffer (the arena; constants are never written, so they are left
// out).
struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;
};

struct StepAccess {
  std::vector<ByteRange> reads;
  std::vector<ByteRange> writes;
};

struct StreamSchedule {
  int streams = 1;                      // streams used (1: everything on the plan's stream)
  std::vector<int> stream;              // per step: 0 (the plan's stream) to streams - 1
  std::vector<std::vector<int>> waits;  // per step: steps on other streams to wait for first
  std::vector<bool> signals;            // per step: whether a later step waits for it (an event)
};

// Assigns each of `steps` (in plan order) a stream, at most `maxStreams`. A step continues its
// latest dependency's stream when that stream's last step is that dependency; otherwise it takes
// a stream whose queued work it must wait for anyway (the lowest such), or its latest
// dependency's stream. A step waits only for what the stream it lands on is not already ordered
// after (vector clocks through earlier waits).
StreamSchedule scheduleStreams(const std::vector<StepAccess>& steps, int maxStreams);

}  // namespace kiln::backends
