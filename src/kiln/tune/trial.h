// Trials in child processes. The tuner never builds or runs a candidate route in its own
// process: each trial is the `kiln` binary itself, started with the hidden `__trial`
// subcommand, a request file and a result file, under a time limit and a memory limit.
// Whatever happens to the child (a crash, a hang, running out of memory, a build error, a result
// that is missing or unreadable) becomes a recorded reason, and the tuning run goes on.
//
// The child side (runTrialRequest) builds the route, saves its engine, loads that engine back
// (so what is timed is the file a deployment would load), runs every input set and saves the
// outputs, then times the first input set; or, for the finalist round, loads several engines
// and times them interleaved, one run of each per round.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"
#include "kiln/ir/tensor.h"
#include "kiln/knobs/route.h"

namespace kiln::cpu {
class Plan;
}

namespace kiln::tune {

// How long a child runs the model before and while timing it.
struct TimingSettings {
  double warmUpMs = 200;  // trtexec's default
  int minIterations = 20;
  double minSeconds = 1.0;
};

// ---- the child side -------------------------------------------------------------------------

// Exit codes of `kiln __trial` beyond 0 (a result file was written, whatever its status).
inline constexpr int kTrialExitOutOfMemory = 86;   // std::bad_alloc under the memory limit
inline constexpr int kTrialExitBadRequest = 87;    // the request file itself was unusable
inline constexpr int kTrialExitCannotStart = 127;  // exec failed (or the tuner died first)

// Runs the request in `requestPath` and writes its result JSON atomically to the request's
// "result" path. Returns the process exit code.
int runTrialRequest(const std::filesystem::path& requestPath);

// Test builds only: faults injected into trial children (tests/e2e/fault_injection.cc registers
// the `test.*` knobs and sets this). afterBuild may crash, hang, exhaust memory or exit without
// a result; onOutputs may corrupt the outputs the trial reports; beforeRun (called before every
// timed or warm-up run of an engine) may slow a route down by a known amount.
struct FaultInjector {
  std::function<void(const knobs::Route&)> afterBuild;
  std::function<void(const knobs::Route&, std::vector<ir::Tensor>&)> onOutputs;
  std::function<void(const knobs::Route&)> beforeRun;
  // GPUs that `kiln tune --gpus` may name on a machine without them, for any backend: each trial
  // is still pinned (CUDA_VISIBLE_DEVICES) and reports what it saw, so the tuner's scheduling
  // over several GPUs is tested where there are none. 0: only real GPUs, only --backend cuda.
  int pretendGpus = 0;
};
// The injector set (all empty outside test builds).
const FaultInjector& faultInjection();
void setFaultInjector(FaultInjector injector);

// One run of a CPU engine as a trial times it (with a test build's injected delay), and one run
// for its outputs (with a test build's injected corruption): `kiln verify` measures and checks
// an engine exactly as its trial did.
Status runAsTimed(const cpu::Plan& plan, const knobs::Route& route,
                  const std::vector<ir::Tensor>& inputs);
Result<std::vector<ir::Tensor>> runForOutputs(const cpu::Plan& plan, const knobs::Route& route,
                                              const std::vector<ir::Tensor>& inputs);

// ---- the parent side ------------------------------------------------------------------------

struct ChildLimits {
  double timeoutSeconds = 0;  // 0: none
  // --trial-memory-limit; 0: none. Not applied by runChild: the tuner passes it in the trial's
  // request, and the trial limits itself above its start-up footprint (trial.cc limitMemory).
  uint64_t memoryBytes = 0;
};

struct ChildOutcome {
  enum class Kind { kExited, kSignaled, kTimedOut, kStopped };
  Kind kind = Kind::kExited;
  int exitCode = 0;     // kExited
  int signal = 0;       // kSignaled
  double seconds = 0;   // wall time
  std::string logTail;  // the last lines the child wrote to stdout/stderr
};

// Starts `executable` with `arguments` in its own process group (so a terminal's Ctrl-C reaches
// only the tuner, which then stops the child itself), killed if the tuner dies (PDEATHSIG),
// stdout and stderr to `logPath`. Waits until it ends, `limits.timeoutSeconds` passes (the
// whole group is killed: kTimedOut), `deadline` passes or `*stop` becomes true (killed:
// kStopped). `environment` ("NAME=value" entries) replaces or adds those variables in the
// child's environment (CUDA_VISIBLE_DEVICES, to pin a trial to one GPU). Safe to call from
// several threads at once; a thread that starts a child must outlive it (PDEATHSIG follows the
// thread that forked), which runChild ensures by waiting for the child.
Result<ChildOutcome> runChild(
    const std::filesystem::path& executable, const std::vector<std::string>& arguments,
    const std::filesystem::path& logPath, const ChildLimits& limits, const std::atomic<bool>* stop,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
    const std::vector<std::string>& environment = {});

// The running binary (/proc/self/exe), for starting trials of the same build.
Result<std::filesystem::path> currentExecutable();

// "fnv1a64:<hex>" of a file's bytes.
Result<std::string> fileHash(const std::filesystem::path& path);

}  // namespace kiln::tune
