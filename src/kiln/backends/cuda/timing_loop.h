// The GPU timing loop that `kiln run --backend cuda` and the tuner's CUDA trials share: batches
// of runs enqueued back to back, each run's device time between CUDA events (Plan::time), for a
// warm-up time and then until both a minimum count and a minimum duration are reached.
#pragma once

#include <vector>

#include "kiln/backends/cuda/plan.h"

namespace kiln::cuda {

struct TimingLoop {
  TimingOptions batch{.warmUpRuns = 0, .runs = 10, .includeCopies = false};
  double warmUpMs = 200;
  int minRuns = 10;
  double minSeconds = 1;
};

struct TimedRuns {
  std::vector<double> milliseconds;  // one per run, after the warm-up
  double wallSeconds = 0;            // of the timed batches, warm-up excluded
};

Result<TimedRuns> timeRuns(Plan& plan, const std::vector<ir::Tensor>& inputs,
                           const TimingLoop& loop);

}  // namespace kiln::cuda
