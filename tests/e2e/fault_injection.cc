// Test builds only (linked into `kiln_faulty`, never into `kiln`): knobs that make a trial fail
// in each way the tuner must survive, and knobs that slow a route down by a known amount so that
// which routes are significant gains (and so mixed search's second phase) is deterministic.
//
//   -test.fault=crash     SIGSEGV after the build
//   -test.fault=hang      never finishes (the trial timeout must kill it)
//   -test.fault=oom       allocates until the memory limit (RLIMIT_DATA) refuses
//   -test.fault=noresult  exits 0 without writing its result
//   -test.fault=wrong     reports outputs negated and shifted (accuracy must fail)
//   -test.fault=nan       reports a NaN in the first output (accuracy must fail)
//   -test.fault=slow      sleeps 3 s after the build, then runs normally (time to kill its worker)
//   -test.fault=killworker  SIGKILLs the process that started the trial (a `kiln worker` lost
//                         mid-trial, every time), then waits to die with it
//   -test.delay_a=on      4 ms added to every run (the default: turning it off is a gain)
//   -test.delay_b=on      likewise, independently
//
// It also pretends to have 4 GPUs, so that `kiln_faulty tune --gpus 0,1,2` schedules trials over
// several "GPUs" (each trial pinned to one) on a machine with none.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "kiln/knobs/knob.h"
#include "kiln/knobs/route.h"
#include "kiln/tune/trial.h"

namespace {

using kiln::knobs::KnobKind;

const kiln::knobs::Knob kFault = kiln::knobs::declareKnob({
    .name = "test.fault",
    .kind = KnobKind::kEnum,
    .choices = {"none", "crash", "hang", "oom", "noresult", "wrong", "nan", "slow", "killworker"},
    .defaultValue = "none",
    .help = "test builds only: make this route's trial fail in the named way",
    .backends = {"cpu"},
    .changesNumerics = true,
});
const kiln::knobs::Knob kDelayA = kiln::knobs::declareKnob({
    .name = "test.delay_a",
    .kind = KnobKind::kBool,
    .defaultValue = "on",
    .help = "test builds only: add 4 ms to every run of the engine",
    .backends = {"cpu"},
});
const kiln::knobs::Knob kDelayB = kiln::knobs::declareKnob({
    .name = "test.delay_b",
    .kind = KnobKind::kBool,
    .defaultValue = "on",
    .help = "test builds only: add 4 ms to every run of the engine",
    .backends = {"cpu"},
});

void afterBuild(const kiln::knobs::Route& route) {
  const std::string& fault = route.value(kFault);
  if (fault == "crash") {
    ::raise(SIGSEGV);
  } else if (fault == "hang") {
    while (true) ::pause();
  } else if (fault == "oom") {
    // The data limit (private writable mappings) runs out whether or not the pages are touched;
    // touching one byte a block keeps the allocations real without spending seconds in page faults.
    std::vector<std::unique_ptr<char[]>> hoard;
    volatile char sink = 0;
    while (true) {
      hoard.emplace_back(new char[64 << 20]);
      hoard.back()[0] = 1;
      sink = sink + hoard.back()[0];
    }
  } else if (fault == "slow") {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  } else if (fault == "killworker") {
    ::kill(::getppid(), SIGKILL);
    while (true) ::pause();  // PDEATHSIG ends this process with its parent
  } else if (fault == "noresult") {
    std::fflush(nullptr);
    ::_exit(0);
  }
}

void onOutputs(const kiln::knobs::Route& route, std::vector<kiln::ir::Tensor>& outputs) {
  const std::string& fault = route.value(kFault);
  if (outputs.empty() || outputs[0].dtype() != kiln::ir::DType::kFloat32) return;
  auto values = outputs[0].mutableData<float>();
  if (fault == "wrong") {
    for (float& v : values) v = 0.5f - v;
  } else if (fault == "nan" && !values.empty()) {
    values[0] = std::nanf("");
  }
}

void beforeRun(const kiln::knobs::Route& route) {
  const int delays = route.isOn(kDelayA) + route.isOn(kDelayB);
  if (delays) std::this_thread::sleep_for(std::chrono::milliseconds(4 * delays));
}

const bool kInstalled = [] {
  kiln::tune::setFaultInjector(
      {.afterBuild = afterBuild, .onOutputs = onOutputs, .beforeRun = beforeRun, .pretendGpus = 4});
  return true;
}();

}  // namespace
