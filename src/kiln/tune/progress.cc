#include "kiln/tune/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace kiln::tune {

using Clock = std::chrono::steady_clock;

ProgressStyle chooseProgressStyle(bool quiet, bool jsonProgress, bool streamIsTerminal) {
  if (jsonProgress) return ProgressStyle::kJson;
  if (quiet) return ProgressStyle::kQuiet;
  return streamIsTerminal ? ProgressStyle::kTerminal : ProgressStyle::kPlain;
}

const char* progressStyleName(ProgressStyle style) {
  switch (style) {
    case ProgressStyle::kQuiet:
      return "quiet";
    case ProgressStyle::kTerminal:
      return "terminal";
    case ProgressStyle::kPlain:
      return "plain";
    case ProgressStyle::kJson:
      return "json";
  }
  return "?";
}

std::string formatDuration(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, std::round(seconds)));
  const long long h = total / 3600, m = total / 60 % 60, s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}

namespace {

// What is left of the phase: the mean of this process's trials times the routes not yet done,
// less what the running trials have already taken, shared among the lanes. Unknown before the
// first trial ends here.
std::optional<double> secondsLeft(const ProgressState& s, Clock::time_point now) {
  if (s.measuredHere == 0 || s.phaseTotal <= s.phaseDone) return std::nullopt;
  const double mean = s.measuredSeconds / static_cast<double>(s.measuredHere);
  double left = mean * static_cast<double>(s.phaseTotal - s.phaseDone);
  for (const ProgressState::Running& trial : s.running) {
    left -= std::min(mean, std::chrono::duration<double>(now - trial.started).count());
  }
  return std::max(0.0, left) / static_cast<double>(std::max<size_t>(1, s.lanes));
}

// Most telling first: a narrow terminal cuts the end of the line.
std::string summaryParts(const ProgressState& s, double elapsed, Clock::time_point now) {
  std::string text = fmt::format(" | {} elapsed", formatDuration(elapsed));
  if (auto left = secondsLeft(s, now)) {
    text += fmt::format(", ~{} left in phase {}", formatDuration(*left), s.phase);
  }
  text += fmt::format(" | {} failed", s.failures);
  if (!s.bestRoute.empty()) {
    text += fmt::format(" | best {:.3f}x {}", s.bestSpeedup, s.bestRoute);
  } else {
    text += " | best: the default so far";
  }
  return text;
}

size_t terminalWidth(std::FILE* stream) {
  winsize size{};
  if (::ioctl(::fileno(stream), TIOCGWINSZ, &size) == 0 && size.ws_col > 20) return size.ws_col;
  return 100;
}

}  // namespace

Progress::Progress(ProgressStyle style, std::FILE* stream, double plainIntervalSeconds)
    : style_(style),
      stream_(stream),
      plainInterval_(plainIntervalSeconds > 0 ? plainIntervalSeconds : 30),
      started_(Clock::now()) {
  if (style_ == ProgressStyle::kTerminal || style_ == ProgressStyle::kPlain) {
    ticker_ = std::thread([this] { tick(); });
  }
}

Progress::~Progress() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (style_ == ProgressStyle::kTerminal) clearLiveLine();
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  std::fflush(stream_);
}

double Progress::elapsed() const {
  return std::chrono::duration<double>(Clock::now() - started_).count();
}

void Progress::say(std::string_view text) {
  if (style_ == ProgressStyle::kQuiet || style_ == ProgressStyle::kJson) return;
  std::lock_guard lock(mu_);
  clearLiveLine();
  std::fwrite(text.data(), 1, text.size(), stream_);
  lastPlainLine_ = Clock::now();
  if (style_ == ProgressStyle::kTerminal && active()) drawLiveLine();
  std::fflush(stream_);
}

void Progress::event(std::string_view name, nlohmann::json fields) {
  if (style_ != ProgressStyle::kJson) return;
  nlohmann::json line = {{"event", name}, {"elapsed_s", std::round(elapsed() * 1000) / 1000}};
  for (auto& [key, value] : fields.items()) line[key] = value;
  std::lock_guard lock(mu_);
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fputs(text.c_str(), stream_);
  std::fputc('\n', stream_);
  std::fflush(stream_);
}

void Progress::beginPhase(int phase, size_t total, size_t alreadyDone) {
  {
    std::lock_guard lock(mu_);
    state_.phase = phase;
    state_.phaseTotal = total;
    state_.phaseDone = alreadyDone;
  }
  event("phase", {{"phase", phase}, {"routes", total}, {"done", alreadyDone}});
}

void Progress::setLanes(size_t lanes) {
  std::lock_guard lock(mu_);
  state_.lanes = std::max<size_t>(1, lanes);
}

void Progress::beginTrial(const std::string& route, const std::string& display,
                          std::optional<int> gpu) {
  size_t done = 0, total = 0;
  int phase = 0;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    if (state_.running.empty()) lastPlainLine_ = now;
    state_.running.push_back({display, now});
    done = state_.phaseDone + state_.running.size() - 1;
    total = state_.phaseTotal;
    phase = state_.phase;
    if (style_ == ProgressStyle::kTerminal) drawLiveLine();
  }
  nlohmann::json fields = {
      {"phase", phase}, {"index", done + 1}, {"total", total}, {"route", route}};
  if (gpu) fields["gpu"] = *gpu;
  event("trial_start", std::move(fields));
}

namespace {
// Takes `display`'s trial out of the running ones; returns how long it ran.
std::optional<double> removeRunning(ProgressState& state, const std::string& display) {
  auto it = std::find_if(state.running.begin(), state.running.end(),
                         [&](const ProgressState::Running& r) { return r.display == display; });
  if (it == state.running.end()) return std::nullopt;
  const double seconds = std::chrono::duration<double>(Clock::now() - it->started).count();
  state.running.erase(it);
  return seconds;
}
}  // namespace

void Progress::abandonTrial(const std::string& display) {
  std::lock_guard lock(mu_);
  removeRunning(state_, display);
}

void Progress::endTrial(const std::string& display, std::string_view line, bool failed,
                        std::optional<double> speedup, nlohmann::json fields) {
  {
    std::lock_guard lock(mu_);
    if (auto seconds = removeRunning(state_, display)) {
      state_.measuredSeconds += *seconds;
      ++state_.measuredHere;
    }
    ++state_.phaseDone;
    if (failed) ++state_.failures;
    if (speedup && *speedup > 1 && *speedup > state_.bestSpeedup) {
      state_.bestSpeedup = *speedup;
      state_.bestRoute = display;
    }
    fields["phase"] = state_.phase;
    fields["done"] = state_.phaseDone;
    fields["total"] = state_.phaseTotal;
    fields["failures"] = state_.failures;
    if (auto left = secondsLeft(state_, Clock::now())) {
      fields["phase_seconds_left"] = std::round(*left * 10) / 10;
    }
  }
  say(line);
  event("trial", std::move(fields));
}

void Progress::beginStep(std::string_view name, const std::string& what) {
  {
    std::lock_guard lock(mu_);
    state_.step = what;
    state_.stepStarted = Clock::now();
    lastPlainLine_ = *state_.stepStarted;
    if (style_ == ProgressStyle::kTerminal) drawLiveLine();
  }
  event("step", {{"step", name}, {"what", what}});
}

void Progress::endStep() {
  std::lock_guard lock(mu_);
  state_.step.clear();
  state_.stepStarted.reset();
  clearLiveLine();
}

void Progress::noteBest(const std::string& display, double speedup) {
  std::lock_guard lock(mu_);
  state_.bestRoute = display;
  state_.bestSpeedup = speedup;
}

void Progress::noteFailures(size_t failures) {
  std::lock_guard lock(mu_);
  state_.failures = failures;
}

std::string Progress::statusLine(size_t width) const {
  std::lock_guard lock(mu_);
  return statusLineLocked(width);
}

std::string Progress::statusLineLocked(size_t width) const {
  const auto now = Clock::now();
  std::string text;
  if (!state_.step.empty() && state_.stepStarted) {
    text = fmt::format(
        "{} | {} so far", state_.step,
        formatDuration(std::chrono::duration<double>(now - *state_.stepStarted).count()));
  } else {
    text = fmt::format("phase {} {}/{}", state_.phase, state_.phaseDone + 1, state_.phaseTotal);
  }
  text += summaryParts(state_, elapsed(), now);
  if (state_.step.empty() && !state_.running.empty()) {
    const ProgressState::Running& oldest = state_.running.front();
    text += fmt::format(" | {} on {}",
                        formatDuration(std::chrono::duration<double>(now - oldest.started).count()),
                        oldest.display);
    if (state_.running.size() > 1) text += fmt::format(" (+{} more)", state_.running.size() - 1);
  }
  if (text.size() > width && width > 3) text = text.substr(0, width - 3) + "...";
  return text;
}

void Progress::clearLiveLine() {
  if (style_ == ProgressStyle::kTerminal && liveShown_) {
    std::fputs("\r\033[K", stream_);
    liveShown_ = false;
  }
}

void Progress::drawLiveLine() {
  const std::string text = statusLineLocked(terminalWidth(stream_) - 1);
  std::fputs("\r\033[K", stream_);
  std::fputs(text.c_str(), stream_);
  std::fflush(stream_);
  liveShown_ = true;
}

void Progress::tick() {
  const auto period = style_ == ProgressStyle::kTerminal ? std::chrono::milliseconds(500)
                                                         : std::chrono::milliseconds(1000);
  std::unique_lock lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, period);
    if (stopping_ || !active()) continue;
    if (style_ == ProgressStyle::kTerminal) {
      drawLiveLine();
      continue;
    }
    const bool inStep = !state_.step.empty();
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - lastPlainLine_).count() >= plainInterval_) {
      lastPlainLine_ = now;
      const double sinceStart =
          std::chrono::duration<double>(
              now - (inStep ? *state_.stepStarted : state_.running.front().started))
              .count();
      std::string others;
      if (!inStep && state_.running.size() > 1) {
        for (size_t i = 1; i < state_.running.size(); ++i) {
          others += (i == 1 ? "; also " : ", ") + state_.running[i].display;
        }
      }
      const std::string line =
          inStep ? fmt::format("  ... still at the {}: {} ({})\n", state_.step,
                               formatDuration(sinceStart),
                               summaryParts(state_, elapsed(), now).substr(3))
                 : fmt::format("  ... still measuring {}: {}{} (phase {} {}/{}{})\n",
                               state_.running.front().display, formatDuration(sinceStart), others,
                               state_.phase, state_.phaseDone + 1, state_.phaseTotal,
                               summaryParts(state_, elapsed(), now));
      std::fputs(line.c_str(), stream_);
      std::fflush(stream_);
    }
  }
}

}  // namespace kiln::tune
