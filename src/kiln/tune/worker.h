// `kiln worker`: runs the trials of studies queued in a PostgreSQL store (`kiln tune --store
// postgresql://... --submit`), on as many machines as are started, each taking one trial at a
// time per GPU (or one at a time on the CPU). See src/kiln/tune/pg_store.h for the tables and
// docs/tuning.md ("On many machines") for how to run it.
//
// A claimed item is held under a lease that a heartbeat renews; a worker that dies stops
// renewing, the lease expires, and another worker claims the item again. An item claimed more
// than the study's max attempts is recorded as failing instead of being run again. The worker
// that completes phase one queues the control trial; the one that completes the control plans
// mixed search's phase two (once: every completion of a study holds the study's row lock); the
// one that completes the last trial queues the finalist round, whose worker decides.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>

#include "kiln/base/status.h"

namespace kiln::tune {

struct WorkerOptions {
  std::string store;    // postgresql://...
  std::string backend;  // the studies it takes: "cpu" or "cuda"
  std::string gpus;     // as kiln tune --gpus: one trial at a time on each
  // Exit once nothing of its target is queued or running for this long; < 0: never.
  double exitWhenIdleSeconds = -1;
  double leaseSeconds = 60;        // renewed every third of it
  double pollSeconds = 2;          // how often an idle worker looks for work
  int64_t onlyStudy = 0;           // 0: any study of its target
  std::filesystem::path workRoot;  // its studies' files ("": a folder under /tmp)
  bool quiet = false;
};

// Runs until `stop` (SIGINT/SIGTERM: the trial in flight is given back to the queue, its attempt
// not counted) or idle for exitWhenIdleSeconds. Returns the process exit code.
Result<int> runWorker(const WorkerOptions& options, const std::atomic<bool>& stop);

}  // namespace kiln::tune
