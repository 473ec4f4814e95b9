// Stream assignment for a GPU plan's steps (see stream_schedule.h).
#include "kiln/backends/stream_schedule.h"

#include <algorithm>

namespace kiln::backends {

namespace {

bool overlaps(const ByteRange& a, const ByteRange& b) {
  return a.begin < b.end && b.begin < a.end && a.begin < a.end && b.begin < b.end;
}

bool anyOverlap(const std::vector<ByteRange>& a, const std::vector<ByteRange>& b) {
  for (const ByteRange& x : a) {
    for (const ByteRange& y : b) {
      if (overlaps(x, y)) return true;
    }
  }
  return false;
}

// Whether `later` must run after `earlier`: a write of either meets a read or write of the
// other.
bool dependsOn(const StepAccess& later, const StepAccess& earlier) {
  return anyOverlap(earlier.writes, later.reads) || anyOverlap(earlier.writes, later.writes) ||
         anyOverlap(earlier.reads, later.writes);
}

}  // namespace

StreamSchedule scheduleStreams(const std::vector<StepAccess>& steps, int maxStreams) {
  const size_t n = steps.size();
  const int limit = std::max(maxStreams, 1);
  StreamSchedule schedule;
  schedule.stream.assign(n, 0);
  schedule.waits.assign(n, {});
  schedule.signals.assign(n, false);
  if (limit == 1) return schedule;

  // clock[s][t]: the latest step of stream t that everything queued next on stream s is ordered
  // after (-1: none). stepClock[i]: stream(i)'s clock just after step i.
  std::vector<std::vector<int>> clock(static_cast<size_t>(limit), std::vector<int>(limit, -1));
  std::vector<std::vector<int>> stepClock(n);
  std::vector<int> last(static_cast<size_t>(limit), -1);  // each stream's last step
  for (size_t j = 0; j < n; ++j) {
    std::vector<int> deps;  // latest first
    for (size_t i = j; i-- > 0;) {
      if (dependsOn(steps[j], steps[i])) deps.push_back(static_cast<int>(i));
    }
    // What j's dependencies alone order it after, stream by stream.
    std::vector<int> ready(static_cast<size_t>(limit), -1);
    for (int i : deps) {
      for (int t = 0; t < limit; ++t) ready[t] = std::max(ready[t], stepClock[i][t]);
    }
    int chosen = 0;
    if (!deps.empty()) {
      const int latest = deps.front();
      const int home = schedule.stream[latest];
      if (last[home] == latest) {
        chosen = home;  // the chain goes on
      } else {
        chosen = home;
        for (int s = 0; s < limit; ++s) {
          if (last[s] <= ready[s]) {  // idle by the time j may start
            chosen = s;
            break;
          }
        }
      }
    } else {
      // No dependency: an idle stream, else the plan's.
      for (int s = 0; s < limit; ++s) {
        if (last[s] < 0) {
          chosen = s;
          break;
        }
      }
    }
    // Wait for each dependency the chosen stream is not already ordered after, latest first (a
    // wait orders the stream after everything the awaited step was ordered after).
    std::vector<int>& own = clock[static_cast<size_t>(chosen)];
    for (int i : deps) {
      const int t = schedule.stream[i];
      if (own[t] >= i) continue;
      schedule.waits[j].push_back(i);
      schedule.signals[i] = true;
      for (int u = 0; u < limit; ++u) own[u] = std::max(own[u], stepClock[i][u]);
    }
    std::reverse(schedule.waits[j].begin(), schedule.waits[j].end());
    schedule.stream[j] = chosen;
    own[chosen] = static_cast<int>(j);
    last[chosen] = static_cast<int>(j);
    stepClock[j] = own;
    schedule.streams = std::max(schedule.streams, chosen + 1);
  }
  return schedule;
}

}  // namespace kiln::backends
