// Where a tuning run stands, told four ways: a live status line on a terminal (routes done of
// the phase's total, the route being measured and for how long, the best route so far and its
// speedup, failures so far, elapsed time and an estimate of what is left), plain lines when the
// output is a file or a pipe (one per finished trial and a "still measuring" line every
// interval while a trial runs), nothing (--quiet), or one JSON object a line (--json-progress)
// for scripts, in which case nothing else is written to the stream.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::tune {

enum class ProgressStyle { kQuiet, kTerminal, kPlain, kJson };

// --json-progress wins over --quiet (a script asked for events); otherwise the stream decides.
ProgressStyle chooseProgressStyle(bool quiet, bool jsonProgress, bool streamIsTerminal);
const char* progressStyleName(ProgressStyle style);

// What the live line and the events know about the run. All times are the run's own (a
// continued run's estimate uses only the trials it measured itself).
struct ProgressState {
  int phase = 0;
  size_t phaseDone = 0, phaseTotal = 0;
  // The trials running now, oldest first (several with --gpus).
  struct Running {
    std::string display;
    std::chrono::steady_clock::time_point started;
  };
  std::vector<Running> running;
  size_t lanes = 1;  // trials run at once at most
  std::string bestRoute;
  double bestSpeedup = 0;   // 0: no eligible route faster than the default yet (or no default)
  size_t failures = 0;      // trials that crashed, hung, failed to build or missed the threshold
  size_t measuredHere = 0;  // trials this process ran
  double measuredSeconds = 0;
  // A step between the phases' trials (the control trial, the finalist round): what it is and
  // when it began; "" when none runs.
  std::string step;
  std::optional<std::chrono::steady_clock::time_point> stepStarted;
};

class Progress {
 public:
  // `stream` is written from the caller's thread and, for kTerminal and kPlain, from a ticker
  // thread that redraws the live line (every half second) or writes the periodic line (every
  // `plainIntervalSeconds` of one trial).
  Progress(ProgressStyle style, std::FILE* stream, double plainIntervalSeconds = 30);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  ProgressStyle style() const { return style_; }

  // Human text (a finished line or several); written as is, above the live line on a terminal.
  // Nothing in kQuiet and kJson.
  void say(std::string_view text);
  // One event: {"event": name, "elapsed_s": …, …fields}. Only in kJson.
  void event(std::string_view name, nlohmann::json fields = nlohmann::json::object());

  void beginPhase(int phase, size_t total, size_t alreadyDone);
  // The number of trials that run at once (--gpus), for the estimate of what is left.
  void setLanes(size_t lanes);
  // `gpu`: the trial's GPU (--gpus), in the trial_start event.
  void beginTrial(const std::string& route, const std::string& display,
                  std::optional<int> gpu = std::nullopt);
  // A trial that ended without a result (the run was stopped, or its harness failed).
  void abandonTrial(const std::string& display);
  // `line` is the human line for the finished trial; `failed` counts it among the failures;
  // `speedup` (over the default, when both were measured) may make it the best so far.
  void endTrial(const std::string& display, std::string_view line, bool failed,
                std::optional<double> speedup, nlohmann::json fields);
  // A step outside the phases' trials, shown like a trial (the live line, the periodic plain
  // line) with `what` in place of the route; in kJson one "step" event {step: name, what}.
  void beginStep(std::string_view name, const std::string& what);
  void endStep();
  void noteBest(const std::string& display, double speedup);
  void noteFailures(size_t failures);

  // The live line as it would be drawn now, `width` columns at most (tests, and the ticker).
  std::string statusLine(size_t width) const;

 private:
  void tick();
  std::string statusLineLocked(size_t width) const;  // with mu_ held
  void clearLiveLine();                              // with mu_ held
  void drawLiveLine();                               // with mu_ held
  double elapsed() const;
  bool active() const {  // with mu_ held: a trial or a step is running
    return (!state_.step.empty() && state_.stepStarted) || !state_.running.empty();
  }

  const ProgressStyle style_;
  std::FILE* stream_;
  const double plainInterval_;
  const std::chrono::steady_clock::time_point started_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool liveShown_ = false;
  // When the last plain line was written (a trial's line or a periodic one): a periodic line
  // comes when a trial or step has run a whole interval since.
  std::chrono::steady_clock::time_point lastPlainLine_;
  ProgressState state_;
  std::thread ticker_;
};

// "1:02:03", "4:05", "0:07".
std::string formatDuration(double seconds);

}  // namespace kiln::tune
