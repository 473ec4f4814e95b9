// The shared GPU timing loop (see timing_loop.h).
#include "kiln/backends/cuda/timing_loop.h"

#include <chrono>

namespace kiln::cuda {

Result<TimedRuns> timeRuns(Plan& plan, const std::vector<ir::Tensor>& inputs,
                           const TimingLoop& loop) {
  using Clock = std::chrono::steady_clock;
  const auto warmUpEnd = Clock::now() + std::chrono::duration<double, std::milli>(loop.warmUpMs);
  do {
    KILN_RETURN_IF_ERROR(plan.time(inputs, loop.batch).status());
  } while (Clock::now() < warmUpEnd);
  TimedRuns timed;
  const auto start = Clock::now();
  while (static_cast<int>(timed.milliseconds.size()) < loop.minRuns ||
         Clock::now() - start < std::chrono::duration<double>(loop.minSeconds)) {
    KILN_ASSIGN_OR_RETURN(std::vector<double> ms, plan.time(inputs, loop.batch));
    timed.milliseconds.insert(timed.milliseconds.end(), ms.begin(), ms.end());
  }
  timed.wallSeconds = std::chrono::duration<double>(Clock::now() - start).count();
  return timed;
}

}  // namespace kiln::cuda
