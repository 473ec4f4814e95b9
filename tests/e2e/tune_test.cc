// `kiln tune` end to end, as a user runs it: dry runs, real searches on the sample model, every
// way a trial can fail (through kiln_faulty's test.* knobs), kill -9 and SIGINT followed by
// --continue, the tuning timeout, and caches that must be refused.
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "kiln/base/file.h"
#include "kiln/ir/npy.h"
#include "kiln/knobs/route.h"
#include "kiln/tune/pg_store.h"
#include "kiln/tune/store.h"
#include "postgres/test_server.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kiln::tune::TrialRecord;
using kiln::tune::TrialStatus;

struct Outcome {
  int exitCode = -1;
  std::string out;
  std::string err;
};

// Small timing budgets: these tests check behaviour, not speed. Thirty runs at least: the median
// interval of 30 samples lies between the 10th and 21st, so up to nine runs slowed by a loaded
// machine (ctest runs tests in parallel) cannot hide the test.delay gains.
const std::string kQuickTiming = "--warmUp 0 --iterations 30 --duration 0.05";

// Pinned beside -cpu.conv.algo=[auto|direct] where a study needs direct convolution to be slower:
// kiln's NCHW kernels (by default convolutions run NHWC, through oneDNN where kiln has it, and
// cpu.conv.algo changes nothing there).
#if KILN_HAVE_ONEDNN
#define KILN_NATIVE_NCHW_CONV " -graph.layout=nchw -cpu.conv.source=native"
#define KILN_NATIVE_NCHW_CANONICAL "-cpu.conv.source=native -graph.layout=nchw "
#else
#define KILN_NATIVE_NCHW_CONV " -graph.layout=nchw"
#define KILN_NATIVE_NCHW_CANONICAL "-graph.layout=nchw "
#endif
// Those studies' winner: both delays off, beside the pinned settings (routes in canonical order).
const std::string kDelaysOff = KILN_NATIVE_NCHW_CANONICAL "-test.delay_a=off -test.delay_b=off";

class KilnTune : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("kiln_tune_{}_{}", info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Outcome run(const std::string& binary, const std::string& args, const fs::path& cwd = {}) {
    const fs::path out = dir_ / "stdout.txt";
    const fs::path err = dir_ / "stderr.txt";
    const std::string command =
        fmt::format("cd '{}' && '{}' {} > '{}' 2> '{}'", (cwd.empty() ? dir_ : cwd).string(),
                    binary, args, out.string(), err.string());
    const int status = std::system(command.c_str());
    Outcome outcome;
    outcome.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.out = kiln::readFileBytes(out).value();
    outcome.err = kiln::readFileBytes(err).value();
    return outcome;
  }
  Outcome kiln(const std::string& args) { return run(KILN_BINARY, args); }
  Outcome faulty(const std::string& args) { return run(KILN_FAULTY_BINARY, args); }

  // Starts kiln_faulty in the background (its own argv, no shell, so signals reach it).
  // Starts a slow tune, sends `signal` after its first trial, and checks the stop and the resume.
  void stopsCleanlyOn(int signal);

  // A tune of 7 routes into tune.db whose trials take long enough (test.delay_a) to be caught
  // in the middle of the run.
  pid_t startSlowTune(const fs::path& log);

  pid_t start(const std::vector<std::string>& args, const fs::path& log) {
    std::vector<std::string> storage{KILN_FAULTY_BINARY};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& arg : storage) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::chdir(dir_.c_str()) != 0) ::_exit(126);
      FILE* file = std::freopen(log.c_str(), "w", stdout);
      if (!file) ::_exit(126);
      ::dup2(::fileno(stdout), STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }

  static int waitFor(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // The trials recorded so far; empty while the store does not exist yet or is being created.
  std::vector<TrialRecord> recorded(const fs::path& cache) {
    if (!fs::exists(cache)) return {};
    auto store = kiln::tune::TuneStore::open(cache);
    if (!store.isOk()) return {};
    auto trials = store->trials();
    return trials.isOk() ? *trials : std::vector<TrialRecord>{};
  }

  // Waits (up to a minute) until at least `count` trials are recorded.
  bool waitForTrials(const fs::path& cache, size_t count, pid_t pid) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < end) {
      if (recorded(cache).size() >= count) return true;
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return recorded(cache).size() >= count;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  static std::map<std::string, std::string> statusesByRoute(const std::vector<TrialRecord>& r) {
    std::map<std::string, std::string> statuses;
    for (const auto& record : r)
      statuses[record.route] = kiln::tune::trialStatusName(record.status);
    return statuses;
  }

  std::map<std::string, std::string> headerOf(const fs::path& cache) {
    auto store = kiln::tune::TuneStore::open(cache);
    EXPECT_TRUE(store.isOk()) << store.status().message();
    return store.isOk() ? store->header() : std::map<std::string, std::string>{};
  }

  fs::path dir_;
};

std::string sample() { return KILN_SAMPLE_MODEL; }

int countRouteLines(const std::string& out) {
  // --dry-run lists "  <number>  <route>" lines.
  static const std::regex kRouteLine(R"(^ +[0-9]+  \S.*$)");
  int lines = 0;
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) lines += std::regex_match(line, kRouteLine);
  return lines;
}

TEST_F(KilnTune, DryRunCountsFastFullAndMixed) {
  const std::string expression =
      "-cpu.conv.algo=[auto|im2col|direct] -fusion.conv_act=* -graph.layout=*";
  Outcome fast = kiln(fmt::format("tune {} --tune '{}' --dry-run", sample(), expression));
  ASSERT_EQ(fast.exitCode, 0) << fast.err;
  EXPECT_NE(fast.out.find("fast search: 5 routes"), std::string::npos) << fast.out;  // 1+2+1+1
  EXPECT_EQ(countRouteLines(fast.out), 5) << fast.out;

  Outcome full =
      kiln(fmt::format("tune {} --tune '{}' --search full --dry-run", sample(), expression));
  ASSERT_EQ(full.exitCode, 0) << full.err;
  EXPECT_NE(full.out.find("full search: 12 routes"), std::string::npos) << full.out;  // 3*2*2
  EXPECT_EQ(countRouteLines(full.out), 12);

  Outcome mixed =
      kiln(fmt::format("tune {} --tune '{}' --search mixed --dry-run", sample(), expression));
  ASSERT_EQ(mixed.exitCode, 0) << mixed.err;
  EXPECT_NE(mixed.out.find("mixed search: 5 routes in phase one"), std::string::npos) << mixed.out;
  EXPECT_NE(mixed.out.find("phase two: at most 7 more routes"), std::string::npos) << mixed.out;

  // Per-node knobs are searched like any other.
  Outcome perNode = kiln(fmt::format(
      "tune {} --tune '-fusion.conv_act@block*=[on|off] -cpu.threads=1' --dry-run", sample()));
  ASSERT_EQ(perNode.exitCode, 0) << perNode.err;
  EXPECT_NE(perNode.out.find("-cpu.threads=1 -fusion.conv_act@block*=off"), std::string::npos)
      << perNode.out;
  EXPECT_EQ(countRouteLines(perNode.out), 2);
}

TEST_F(KilnTune, LargeFullSearchNeedsConfirmation) {
  // 6 * 4 * 2 * 2 * 2 = 192 routes (cpu.conv.algo has six values).
  const std::string expression =
      "-cpu.conv.algo=* -cpu.gemm.kc=* -graph.layout=* -fusion.conv_act=* -fusion.gemm_act=*";
  Outcome refused =
      kiln(fmt::format("tune {} --tune '{}' --search full --dry-run", sample(), expression));
  EXPECT_EQ(refused.exitCode, 1);
  EXPECT_NE(refused.err.find("192 routes"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("--allow-large-search"), std::string::npos) << refused.err;
  Outcome allowed = kiln(fmt::format(
      "tune {} --tune '{}' --search full --dry-run --allow-large-search", sample(), expression));
  EXPECT_EQ(allowed.exitCode, 0) << allowed.err;
  EXPECT_EQ(countRouteLines(allowed.out), 192);
}

TEST_F(KilnTune, BadExpressionsAndFlagsAreUserErrors) {
  Outcome unknown =
      kiln(fmt::format("tune {} --tune '-fusion.conv_akt=[on|off]' --dry-run", sample()));
  EXPECT_EQ(unknown.exitCode, 1);
  EXPECT_NE(unknown.err.find("fusion.conv_act"), std::string::npos) << unknown.err;  // did you mean
  Outcome none = kiln(fmt::format("tune {}", sample()));
  EXPECT_EQ(none.exitCode, 1);
  EXPECT_NE(none.err.find("--tune"), std::string::npos) << none.err;
  Outcome metric =
      kiln(fmt::format("tune {} --tune '-graph.layout=*' --accuracy-metric l1", sample()));
  EXPECT_EQ(metric.exitCode, 1);
  EXPECT_NE(metric.err.find("--accuracy-threshold"), std::string::npos) << metric.err;
}

TEST_F(KilnTune, EveryFaultIsRecordedAndExcluded) {
  Outcome outcome =
      // Every failing value (slow succeeds; killworker is for `kiln worker`, it kills its parent).
      faulty(fmt::format("tune {} --tune '-test.fault=[none|crash|hang|oom|noresult|wrong|nan]' "
                         "--cache tune.db --trial-timeout 5 "
                         "--trial-memory-limit 1024 {}",
                         sample(), kQuickTiming));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  const auto trials = recorded(dir_ / "tune.db");
  ASSERT_EQ(trials.size(), 7u) << outcome.out;
  std::map<std::string, const TrialRecord*> byRoute;
  for (const auto& t : trials) byRoute[t.route] = &t;
  auto expect = [&](const std::string& route, TrialStatus status, const std::string& message) {
    ASSERT_TRUE(byRoute.count(route)) << route;
    const TrialRecord& t = *byRoute[route];
    EXPECT_EQ(kiln::tune::trialStatusName(t.status),
              std::string(kiln::tune::trialStatusName(status)))
        << route << ": " << t.message;
    EXPECT_NE(t.message.find(message), std::string::npos) << route << ": " << t.message;
  };
  expect("", TrialStatus::kOk, "");
  expect("-test.fault=crash", TrialStatus::kCrash, "SIGSEGV");
  expect("-test.fault=hang", TrialStatus::kTimeout, "--trial-timeout");
  expect("-test.fault=oom", TrialStatus::kOom, "1024 MiB");
  expect("-test.fault=noresult", TrialStatus::kCrash, "without a readable result");
  expect("-test.fault=wrong", TrialStatus::kAccuracyFail, "exceeds the threshold");
  expect("-test.fault=nan", TrialStatus::kAccuracyFail, "NaN at element 0");
  // Only the default route was eligible, so it stays; the summary names every exclusion.
  EXPECT_NE(outcome.out.find("winner: (default)"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find("excluded -test.fault=hang: timeout"), std::string::npos)
      << outcome.out;
}

// --json-progress: stdout is one JSON event a line and nothing else, in an order a script can
// follow, with the failures counted as they happen and the decision last.
TEST_F(KilnTune, JsonProgressIsOneEventALine) {
  Outcome outcome = faulty(fmt::format(
      "tune {} --tune '-test.fault=[none|crash|wrong] -test.delay_a=[on|off]' --cache tune.db "
      "--json-progress --trial-timeout 20 {}",
      sample(), kQuickTiming));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  std::vector<json> events;
  std::istringstream stream(outcome.out);
  for (std::string line; std::getline(stream, line);) {
    json event = json::parse(line, nullptr, false);
    ASSERT_FALSE(event.is_discarded()) << "not JSON: " << line;
    ASSERT_TRUE(event.contains("event") && event.contains("elapsed_s")) << line;
    events.push_back(event);
  }
  ASSERT_GE(events.size(), 9u) << outcome.out;
  EXPECT_EQ(events.front()["event"], "start");
  EXPECT_EQ(events.front()["search"], "fast");
  EXPECT_EQ(events[1]["event"], "phase");
  EXPECT_EQ(events[1]["routes"], 4);  // the default, crash, wrong, delay_a=off
  std::vector<json> trials;
  int starts = 0;
  double lastElapsed = 0;
  for (const json& e : events) {
    EXPECT_GE(e["elapsed_s"].get<double>(), lastElapsed);
    lastElapsed = e["elapsed_s"].get<double>();
    starts += e["event"] == "trial_start";
    if (e["event"] == "trial") trials.push_back(e);
  }
  EXPECT_EQ(starts, 4);
  ASSERT_EQ(trials.size(), 4u) << outcome.out;
  std::map<std::string, json> byRoute;
  for (size_t i = 0; i < trials.size(); ++i) {
    EXPECT_EQ(trials[i]["done"], i + 1);
    EXPECT_EQ(trials[i]["total"], 4);
    byRoute[trials[i]["route"]] = trials[i];
  }
  EXPECT_EQ(byRoute.at("-test.fault=crash")["status"], "crash");
  EXPECT_NE(byRoute.at("-test.fault=crash")["message"].get<std::string>().find("SIGSEGV"),
            std::string::npos);
  EXPECT_EQ(byRoute.at("-test.fault=wrong")["status"], "accuracy-fail");
  EXPECT_EQ(trials.back()["failures"], 2);
  const json& off = byRoute.at("-test.delay_a=off");
  EXPECT_EQ(off["status"], "ok");
  EXPECT_GT(off["speedup"].get<double>(), 1.5);  // 4 ms a run less
  ASSERT_EQ(off["interval_ms"].size(), 2u);
  EXPECT_LE(off["interval_ms"][0].get<double>(), off["median_ms"].get<double>());
  EXPECT_EQ(events.back()["event"], "done");
  EXPECT_EQ(events.back()["exit_code"], 0);
  EXPECT_EQ(events.back()["winner"], "-test.delay_a=off");
  // The steps between the trials say when they begin: the control trial, then the finalists.
  std::vector<std::string> steps;
  for (const json& e : events) {
    if (e["event"] == "step") steps.push_back(e["step"]);
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"control", "finalists"})) << outcome.out;
}

// Not a terminal: one line per trial, and a line every --progress-interval while a long trial
// runs, saying which route it is on.
TEST_F(KilnTune, PlainProgressSaysWhichRouteALongTrialIsOn) {
  Outcome outcome =
      kiln(fmt::format("tune {} --tune '-graph.layout=*' --warmUp 0 --iterations 5 "
                       "--duration 1.5 --progress-interval 0.5",
                       sample()));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  EXPECT_NE(outcome.out.find("still measuring (default): 0:0"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find("still measuring -graph.layout=nchw"), std::string::npos)
      << outcome.out;
  EXPECT_NE(outcome.out.find("[phase 1 2/2] -graph.layout=nchw: ok"), std::string::npos)
      << outcome.out;
  // The control trial, after the phase, is a step of its own.
  EXPECT_NE(outcome.out.find("still at the control trial (the default route again, for the "
                             "drift): 0:0"),
            std::string::npos)
      << outcome.out;
  EXPECT_EQ(outcome.out.find('\r'), std::string::npos);  // no terminal control in a file
  // The finalist round (at least a second of interleaved pairs) says so too.
  Outcome finalists =
      faulty(fmt::format("tune {} --tune '-test.delay_a=[on|off]' --progress-interval 0.3 {}",
                         sample(), kQuickTiming));
  ASSERT_EQ(finalists.exitCode, 0) << finalists.out << finalists.err;
  EXPECT_NE(finalists.out.find("still at the finalist round (1 route interleaved with the "
                               "default): 0:0"),
            std::string::npos)
      << finalists.out;
  EXPECT_NE(finalists.out.find("| best 1."), std::string::npos) << finalists.out;
  Outcome quiet =
      kiln(fmt::format("tune {} --tune '-graph.layout=*' --quiet {}", sample(), kQuickTiming));
  ASSERT_EQ(quiet.exitCode, 0) << quiet.err;
  EXPECT_EQ(quiet.out, "");
}

// On a terminal (a pseudo-terminal here) the live line is redrawn in place with the phase, the
// counts, the time and the route being measured.
TEST_F(KilnTune, TerminalProgressRedrawsALiveLine) {
  int master = -1;
  winsize size{.ws_row = 40, .ws_col = 200, .ws_xpixel = 0, .ws_ypixel = 0};
  const std::string model = sample();
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, &size);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::chdir(dir_.c_str()) != 0) ::_exit(126);
    ::execl(KILN_BINARY, KILN_BINARY, "tune", model.c_str(), "--tune", "-graph.layout=*",
            "--warmUp", "0", "--iterations", "5", "--duration", "1.5", nullptr);
    ::_exit(127);
  }
  std::string screen;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(master, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO once the child has exited
    screen.append(buffer, static_cast<size_t>(n));
  }
  ::close(master);
  ASSERT_EQ(waitFor(pid), 0) << screen;
  EXPECT_NE(screen.find("\r\033[Kphase 1 1/2 | 0:0"), std::string::npos) << screen;
  EXPECT_NE(screen.find("on (default)"), std::string::npos) << screen;
  // After the first trial: its time is known, so the second's line estimates what is left.
  static const std::regex kSecond(
      R"(phase 1 2/2 \| 0:0[0-9] elapsed, ~0:0[0-9] left in phase 1 \| 0 failed \| best: the )"
      R"(default so far \| 0:0[0-9] on -graph\.layout=nchw)");
  EXPECT_TRUE(std::regex_search(screen, kSecond)) << screen;
  EXPECT_NE(screen.find("[phase 1 2/2] -graph.layout=nchw: ok"), std::string::npos) << screen;
  // The control trial after the phase has a live line of its own.
  EXPECT_NE(screen.find("\r\033[Kcontrol trial (the default route again, for the drift) | 0:0"),
            std::string::npos)
      << screen;
}

// --report report.html: one self-contained page (no script, nothing fetched), rendered by a real
// browser: headless Chromium parses it (its DOM keeps every chart element where it was written)
// and prints it, and the printed page's text shows the decision, the charts' labels and the
// failures.
TEST_F(KilnTune, HtmlReportRendersInChromium) {
  Outcome outcome = faulty(fmt::format(
      "tune {} --tune '-test.fault=[none|crash|wrong] -test.delay_a=[on|off]' --report report.html "
      "--trial-timeout 20 --quiet {}",
      sample(), kQuickTiming));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  const std::string html = kiln::readFileBytes(dir_ / "report.html").value();
  ASSERT_TRUE(html.starts_with("<!DOCTYPE html>")) << html.substr(0, 200);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  // The only address is SVG's namespace name, which is never fetched.
  size_t addresses = 0;
  for (size_t at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1)) {
    EXPECT_EQ(html.compare(at, 26, "http://www.w3.org/2000/svg"), 0) << html.substr(at, 60);
    ++addresses;
  }
  EXPECT_EQ(addresses, 3u);  // one per chart

  const char* browser = nullptr;
  for (const char* candidate : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (fs::exists(candidate)) browser = candidate;
  }
  ASSERT_NE(browser, nullptr)
      << "headless Chromium is needed to check the HTML report: apt-get install chromium "
         "poppler-utils (scripts/setup.sh installs them)";
  const std::string flags = fmt::format(
      "--headless --no-sandbox --disable-gpu --no-pdf-header-footer --user-data-dir='{}'",
      (dir_ / "chromium-profile").string());
  const std::string page = "file://" + (dir_ / "report.html").string();
  Outcome dom =
      run("/usr/bin/timeout", fmt::format("120 {} {} --dump-dom '{}'", browser, flags, page));
  ASSERT_EQ(dom.exitCode, 0) << dom.err;
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  // Three routes were timed (the crash never ran): a median dot each in the route chart, a point
  // each in the loss chart.
  EXPECT_EQ(count(dom.out, "<circle class=\"median\""), 3u) << dom.out;
  EXPECT_EQ(count(dom.out, "<g class=\"point "), 3u) << dom.out;
  EXPECT_EQ(count(dom.out, "<g class=\"route ok default\">"), 1u);
  EXPECT_EQ(count(dom.out, "<g class=\"route ok winner\">"), 1u);
  EXPECT_EQ(count(dom.out, "<g class=\"route fail\">"), 1u);  // wrong: timed, then excluded
  EXPECT_EQ(count(dom.out, "<line class=\"threshold\""), 1u);
  EXPECT_EQ(count(dom.out, "<g class=\"effect gain\"><title>-test.delay_a=off</title>"), 1u)
      << dom.out;
  EXPECT_EQ(count(dom.out, "<g class=\"effect fail\">"), 2u);  // crash and wrong

  Outcome print = run("/usr/bin/timeout", fmt::format("120 {} {} --print-to-pdf='{}' '{}'", browser,
                                                      flags, (dir_ / "report.pdf").string(), page));
  ASSERT_EQ(print.exitCode, 0) << print.err;
  Outcome text = run("/usr/bin/pdftotext", fmt::format("'{}' -", (dir_ / "report.pdf").string()));
  ASSERT_EQ(text.exitCode, 0) << text.err << " (pdftotext is in Debian's poppler-utils)";
  for (const char* visible :
       {"Winner: -test.delay_a=off", "Why it won: the fastest of", "Target fingerprint",
        "median ms, with its 95% interval", "-test.fault=wrong [accuracy-fail]",
        "-test.delay_a=off [winner]", "threshold 1e-05", "worst loss (cos)", "test.delay_a=off",
        "Failures", "SIGSEGV", "exceeds the threshold"}) {
    EXPECT_NE(text.out.find(visible), std::string::npos) << visible << "\n" << text.out;
  }
}

// kiln verify on a tuned engine's manifest: it still wins and passes; then each way it can stop
// holding (the default caught up, a stricter threshold, another model) says RE-TUNE with exit 4,
// a software change is reported without overturning a measurement that still holds, and a
// missing engine or a file that is not a manifest cannot be verified (exit 1).
TEST_F(KilnTune, VerifySaysWhetherTheTunedEngineStillHolds) {
  const fs::path model = dir_ / "m.onnx";
  fs::copy_file(sample(), model);
  Outcome tuned = faulty(fmt::format(
      "tune m.onnx --tune '-test.delay_a=[on|off] -graph.layout=*' --saveEngine best.kiln "
      "--cache t.db {}",
      kQuickTiming));
  ASSERT_EQ(tuned.exitCode, 0) << tuned.out << tuned.err;
  const fs::path manifestPath = dir_ / "best.manifest.json";
  const json manifest = json::parse(kiln::readFileBytes(manifestPath).value());
  // The run's own account of its decision, should it not be the 4 ms gain.
  ASSERT_EQ(manifest["route"], "-test.delay_a=off") << tuned.out << tuned.err;
  const std::string verify = "verify best.manifest.json --duration 0.2 --warmUp 0";

  Outcome holds = faulty(verify);
  EXPECT_EQ(holds.exitCode, 0) << holds.out << holds.err;
  for (const char* line :
       {"  ok        model ", "  ok        engine ", "  ok        target ", "  ok        versions ",
        "  ok        data set 0   inputs seeded (0), references generated again",
        "  ok        accuracy     probs cos", "  ok        speed        ",
        "OK: the tuned engine still wins"}) {
    EXPECT_NE(holds.out.find(line), std::string::npos) << line << "\n" << holds.out;
  }
  Outcome asJson = faulty(verify + " --json");
  ASSERT_EQ(asJson.exitCode, 0) << asJson.err;
  const json report = json::parse(asJson.out);
  EXPECT_EQ(report["exit_code"], 0);
  EXPECT_TRUE(report["speed"]["significant"].get<bool>());
  EXPECT_GT(report["speed"]["speedup"].get<double>(), 1.5);  // 4 ms a run of 8 less: about 2x
  EXPECT_LT(report["speed"]["speedup"].get<double>(), 2.5);
  for (const auto& check : report["checks"]) EXPECT_EQ(check["state"], "ok") << check.dump();

  auto rewrite = [&](const std::function<void(json&)>& change) {
    json edited = manifest;
    change(edited);
    ASSERT_TRUE(kiln::writeFileAtomically(manifestPath, edited.dump(1)).isOk());
  };
  // Another OpenBLAS than the tuning run's: said, and the measurement still decides.
  rewrite([](json& m) { m["versions"]["openblas"] = "OpenBLAS 0.0.1"; });
  Outcome upgraded = faulty(verify);
  EXPECT_EQ(upgraded.exitCode, 0) << upgraded.out;
  EXPECT_NE(upgraded.out.find("  changed   versions     openblas: \"OpenBLAS 0.0.1\" then, "),
            std::string::npos)
      << upgraded.out;
  EXPECT_NE(upgraded.out.find("although the machine or the software changed"), std::string::npos);

  // The default route overtook it (as after an upgrade that sped it up): no longer a win. The
  // new default skips both 4 ms delays, the engine one, so the outcome is certain.
  rewrite([](json& m) { m["default_route"] = "-test.delay_a=off -test.delay_b=off"; });
  Outcome caughtUp = faulty(verify);
  EXPECT_EQ(caughtUp.exitCode, 4) << caughtUp.out;
  EXPECT_NE(caughtUp.out.find("  regressed speed "), std::string::npos) << caughtUp.out;
  EXPECT_NE(caughtUp.out.find("RE-TUNE: the tuned engine no longer holds"), std::string::npos);
  EXPECT_NE(caughtUp.out.find("Re-tune with a new --cache: "), std::string::npos);

  // A stricter accuracy requirement than the engine meets.
  rewrite([](json& m) { m["accuracy"]["threshold"] = 1e-30; });
  Outcome strict = faulty(verify);
  EXPECT_EQ(strict.exitCode, 4) << strict.out;
  EXPECT_NE(strict.out.find("  regressed accuracy     probs cos"), std::string::npos) << strict.out;
  EXPECT_NE(strict.out.find("exceeds 1e-30"), std::string::npos) << strict.out;

  // The model changed under the engine.
  rewrite([](json&) {});
  const std::string original = kiln::readFileBytes(model).value();
  ASSERT_TRUE(kiln::writeFileAtomically(model, original + std::string(1, '\0')).isOk());
  Outcome otherModel = faulty(verify);
  EXPECT_EQ(otherModel.exitCode, 4) << otherModel.out;
  EXPECT_NE(otherModel.out.find("changed since the tuning run"), std::string::npos)
      << otherModel.out;
  ASSERT_TRUE(kiln::writeFileAtomically(model, original).isOk());

  // No engine: nothing can be said about it.
  fs::rename(dir_ / "best.kiln", dir_ / "moved.kiln");
  Outcome noEngine = faulty(verify);
  EXPECT_EQ(noEngine.exitCode, 1) << noEngine.out;
  EXPECT_NE(noEngine.out.find("  missing   engine "), std::string::npos) << noEngine.out;
  EXPECT_NE(noEngine.out.find("CANNOT VERIFY"), std::string::npos) << noEngine.out;

  ASSERT_TRUE(kiln::writeFileAtomically(manifestPath, "{}").isOk());
  Outcome notManifest = faulty(verify);
  EXPECT_EQ(notManifest.exitCode, 1);
  EXPECT_NE(notManifest.err.find("is not a kiln tuning manifest"), std::string::npos)
      << notManifest.err;
}

TEST_F(KilnTune, VerifyOfAKeptDefaultRouteAllowsNoiseButNotASlowdown) {
  // The only route tried is the default's, so the tuner keeps it; the saved engine waits 8 ms a
  // run (both delays on).
  Outcome tuned =
      faulty(fmt::format("tune {} --tune '-test.delay_a=on' --saveEngine kept.kiln "
                         "--cache t.db --quiet {}",
                         sample(), kQuickTiming));
  ASSERT_EQ(tuned.exitCode, 0) << tuned.out << tuned.err;
  const fs::path manifestPath = dir_ / "kept.manifest.json";
  json manifest = json::parse(kiln::readFileBytes(manifestPath).value());
  ASSERT_EQ(manifest["route"], manifest["default_route"]);
  const std::string verify = "verify kept.manifest.json --duration 0.2 --warmUp 0";

  // Against a fresh build of the same route, a generous tolerance: timing noise is no verdict.
  Outcome same = faulty(verify + " --tolerance 0.5");
  EXPECT_EQ(same.exitCode, 0) << same.out << same.err;
  EXPECT_NE(same.out.find("as fast as a fresh build of it"), std::string::npos) << same.out;
  EXPECT_NE(same.out.find("OK: the tuner kept the default route"), std::string::npos) << same.out;

  // The default route sped up (both delays gone): the kept engine is now far slower.
  manifest["default_route"] = "-test.delay_a=off -test.delay_b=off";
  ASSERT_TRUE(kiln::writeFileAtomically(manifestPath, manifest.dump(1)).isOk());
  Outcome slower = faulty(verify);
  EXPECT_EQ(slower.exitCode, 4) << slower.out << slower.err;
  EXPECT_NE(slower.out.find("more than 2% slower than a fresh build of it"), std::string::npos)
      << slower.out;
  Outcome badTolerance = faulty(verify + " --tolerance 2");
  EXPECT_NE(badTolerance.exitCode, 0);
  EXPECT_NE(badTolerance.err.find("--tolerance"), std::string::npos) << badTolerance.err;
}

TEST_F(KilnTune, BuildErrorsAreRecordedAndTheRunGoesOn) {
  Outcome outcome = kiln(fmt::format(
      "tune {} --tune '-fusion.conv_act@no_such_node=[on|off] -graph.layout=*' --cache tune.db {}",
      sample(), kQuickTiming));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  const auto statuses = statusesByRoute(recorded(dir_ / "tune.db"));
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_EQ(statuses.at("-fusion.conv_act@no_such_node=off"), "build-error");
  EXPECT_EQ(statuses.at("-graph.layout=nchw"), "ok");
}

TEST_F(KilnTune, MixedSearchCombinesTheSignificantGains) {
  // Each delay knob adds 4 ms a run when on (its default); turning either off is a large,
  // certain gain, so phase two is exactly the route with both off. Direct convolution is slower.
  Outcome outcome =
      faulty(fmt::format("tune {} --tune '-test.delay_a=* -test.delay_b=* "
                         "-cpu.conv.algo=[auto|direct]" KILN_NATIVE_NCHW_CONV "' "
                         "--search mixed --cache tune.db --saveEngine best.kiln {}",
                         sample(), kQuickTiming));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  const auto trials = recorded(dir_ / "tune.db");
  ASSERT_EQ(trials.size(), 5u) << outcome.out;
  int phaseTwo = 0;
  for (const auto& t : trials) {
    EXPECT_EQ(t.status, TrialStatus::kOk) << t.route << ": " << t.message;
    if (t.phase == 2) {
      ++phaseTwo;
      EXPECT_EQ(t.route, kDelaysOff);
    }
  }
  EXPECT_EQ(phaseTwo, 1);
  EXPECT_NE(outcome.out.find("winner: " + kDelaysOff), std::string::npos) << outcome.out;

  // The engine, its manifest and the report agree with the store.
  const auto header = headerOf(dir_ / "tune.db");
  ASSERT_TRUE(header.count("decision"));
  EXPECT_EQ(json::parse(header.at("decision")).at("winner"), kDelaysOff);
  const json manifest = json::parse(kiln::readFileBytes(dir_ / "best.manifest.json").value());
  EXPECT_EQ(manifest.at("route"), kDelaysOff);
  EXPECT_EQ(manifest.at("model").at("hash"), header.at("model_hash"));
  const std::string engineBytes = kiln::readFileBytes(dir_ / "best.kiln").value();
  EXPECT_EQ(manifest.at("engine").at("hash"), "fnv1a64:" + kiln::knobs::stableHash(engineBytes));
  EXPECT_GT(manifest.at("decision").at("speedup").at("low").get<double>(), 1.0);
  EXPECT_TRUE(manifest.at("references_generated").get<bool>());
  const std::string report = kiln::readFileBytes(dir_ / "best.report.md").value();
  for (const auto& t : trials) {
    EXPECT_NE(report.find("`" + (t.route.empty() ? std::string("(default)") : t.route) + "`"),
              std::string::npos)
        << t.route;
  }
  EXPECT_NE(report.find("generated"), std::string::npos);
  // The saved engine runs.
  Outcome ran = faulty("run best.kiln --iterations 1 --duration 0 --warmUp 0");
  EXPECT_EQ(ran.exitCode, 0) << ran.err;
}

// --gpus: trials run at once, one per GPU, each process pinned to its GPU; the outcome is a
// one-GPU run's. kiln_faulty pretends to have 4 GPUs (each trial still gets its
// CUDA_VISIBLE_DEVICES and reports what it saw, which the tuner checks), so the scheduling is
// tested here without one. The "GPUs" are this machine's cores, shared: two lanes and one thread
// per trial, so that trials running at once do not slow each other down (with a thread pool per
// trial on 16 cores, three at once moved the default's median by 30%, more than any gain).
TEST_F(KilnTune, TrialsOnSeveralGpusGiveTheOneGpuOutcome) {
  const std::string study = fmt::format(
      "tune {} --tune '-test.fault=[none|crash|wrong] -test.delay_a=* -test.delay_b=* "
      "-cpu.conv.algo=[auto|direct] -cpu.threads=1" KILN_NATIVE_NCHW_CONV
      "' --search mixed --trial-timeout 20 {}",
      sample(), kQuickTiming);
  Outcome one = faulty(study + " --cache one.db");
  ASSERT_EQ(one.exitCode, 0) << one.out << one.err;
  Outcome two = faulty(study + " --cache two.db --gpus 1,3 --json-progress");
  ASSERT_EQ(two.exitCode, 0) << two.out << two.err;

  // The same routes with the same statuses, and the same winner.
  const auto oneTrials = recorded(dir_ / "one.db");
  const auto twoTrials = recorded(dir_ / "two.db");
  ASSERT_EQ(oneTrials.size(), 7u) << one.out;  // 6 in phase one, both delays off in phase two
  EXPECT_EQ(statusesByRoute(twoTrials), statusesByRoute(oneTrials)) << two.out;
  for (size_t i = 0; i < twoTrials.size(); ++i) EXPECT_EQ(twoTrials[i].iteration, int64_t(i));
  const json winner = json::parse(headerOf(dir_ / "one.db").at("decision")).at("winner");
  EXPECT_NE(winner.get<std::string>().find("-test.delay_a=off -test.delay_b=off"),
            std::string::npos)
      << one.out;
  EXPECT_EQ(json::parse(headerOf(dir_ / "two.db").at("decision")).at("winner"), winner);

  // Every GPU was used, never by two trials at once, and several ran together.
  std::map<int, int> running;  // gpu -> trials running on it
  std::set<int> used;
  size_t mostAtOnce = 0, atOnce = 0;
  bool sawControl = false;
  std::istringstream stream(two.out);
  for (std::string line; std::getline(stream, line);) {
    const json event = json::parse(line, nullptr, false);
    ASSERT_FALSE(event.is_discarded()) << line;
    if (event["event"] == "trial_start") {
      ASSERT_TRUE(event.contains("gpu")) << line;
      const int gpu = event["gpu"].get<int>();
      EXPECT_TRUE(gpu == 1 || gpu == 3) << line;
      EXPECT_EQ(running[gpu]++, 0) << "two trials at once on GPU " << gpu;
      used.insert(gpu);
      mostAtOnce = std::max(mostAtOnce, ++atOnce);
    } else if (event["event"] == "trial") {
      ASSERT_TRUE(event.contains("gpu")) << line;
      EXPECT_EQ(--running[event["gpu"].get<int>()], 0) << line;
      --atOnce;
    } else if (event["event"] == "control") {
      // The default measured again on the other GPU, for the drift between GPUs.
      sawControl = true;
      ASSERT_TRUE(event.contains("other_gpus")) << line;
      EXPECT_EQ(event["other_gpus"].size(), 1u) << line;
    }
  }
  EXPECT_EQ(used, (std::set<int>{1, 3}));
  EXPECT_EQ(mostAtOnce, 2u);
  EXPECT_TRUE(sawControl) << two.out;
  EXPECT_TRUE(headerOf(dir_ / "two.db").count("control_other_gpus"));

  // GPUs that are not there, or named twice, are refused before anything runs; so is --gpus
  // for the CPU backend, whose trials would share the cores they time.
  Outcome missing = faulty(study + " --cache missing.db --gpus 0,4");
  EXPECT_EQ(missing.exitCode, 1);
  EXPECT_NE(missing.err.find("'4' is not a GPU of this machine"), std::string::npos) << missing.err;
  EXPECT_FALSE(fs::exists(dir_ / "missing.db"));
  Outcome twice = faulty(study + " --cache twice.db --gpus 1,1");
  EXPECT_EQ(twice.exitCode, 1);
  EXPECT_NE(twice.err.find("GPU 1 is named twice"), std::string::npos) << twice.err;
  Outcome cpu = kiln(fmt::format("tune {} --tune '-graph.layout=*' --gpus all", sample()));
  EXPECT_EQ(cpu.exitCode, 1);
  EXPECT_NE(cpu.err.find("GPUs are for --backend cuda"), std::string::npos) << cpu.err;
}

// The text of a file that may not exist yet.
std::string fileText(const fs::path& path) {
  auto bytes = kiln::readFileBytes(path);
  return bytes.isOk() ? *bytes : std::string();
}

// A study in a PostgreSQL store, run by three CPU workers, one of them killed mid-trial: its trial
// goes back to the queue and another worker runs it; nothing is lost or recorded twice; and the
// outcome is the one-process SQLite run's (the same routes, statuses, phase two and winner).
TEST_F(KilnTune, ThreeWorkersOnAPostgresStoreGiveTheOneProcessOutcome) {
  kiln::testing::PgTestServer server(dir_ / "pg");
  ASSERT_TRUE(server.started()) << server.error();
  const std::string study = fmt::format(
      "tune {} --tune '-test.fault=[none|crash|wrong|slow] -test.delay_a=* -test.delay_b=* "
      "-cpu.threads=1' --search mixed --trial-timeout 20 {}",
      sample(), kQuickTiming);
  Outcome one = faulty(study + " --cache one.db");
  ASSERT_EQ(one.exitCode, 0) << one.out << one.err;

  Outcome submitted = faulty(study + fmt::format(" --store '{}' --submit", server.uri()));
  ASSERT_EQ(submitted.exitCode, 0) << submitted.out << submitted.err;
  EXPECT_NE(submitted.out.find("submitted study 1"), std::string::npos) << submitted.out;
  EXPECT_NE(submitted.out.find("kiln worker --store"), std::string::npos) << submitted.out;

  std::vector<pid_t> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(
        start({"worker", "--store", server.uri(), "--exit-when-idle", "3", "--lease", "3", "--poll",
               "0.2", "--work-dir", (dir_ / fmt::format("w{}", i)).string()},
              dir_ / fmt::format("w{}.txt", i)));
  }
  // Kill the worker that starts the slow route's trial (3 s of it), mid-trial.
  int killed = -1;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (killed < 0 && std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 3 && killed < 0; ++i) {
      const std::string log = fileText(dir_ / fmt::format("w{}.txt", i));
      if (std::regex_search(log, std::regex("trial of [^\\n]*test.fault=slow[^\\n]*: starting"))) {
        ASSERT_EQ(::kill(workers[static_cast<size_t>(i)], SIGKILL), 0);
        killed = i;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(killed, 0) << "no worker started the slow route";
  std::string logs;
  for (int i = 0; i < 3; ++i) {
    const int code = waitFor(workers[static_cast<size_t>(i)]);
    logs += fmt::format("--- worker {} (exit {}):\n{}", i, code,
                        fileText(dir_ / fmt::format("w{}.txt", i)));
    EXPECT_EQ(code, i == killed ? 128 + SIGKILL : 0);
  }

  auto store = kiln::tune::pg::StudyStore::open(server.uri(), 1);
  ASSERT_TRUE(store.isOk()) << store.status().message();
  auto trials = store->trials();
  ASSERT_TRUE(trials.isOk()) << trials.status().message();
  const auto oneTrials = recorded(dir_ / "one.db");
  ASSERT_EQ(oneTrials.size(), 7u) << one.out;  // 6 in phase one, both delays off in phase two
  EXPECT_EQ(statusesByRoute(*trials), statusesByRoute(oneTrials)) << logs;
  EXPECT_EQ(trials->size(), oneTrials.size()) << logs;  // each route once
  for (size_t i = 0; i < trials->size(); ++i) EXPECT_EQ((*trials)[i].iteration, int64_t(i));
  const auto& header = store->header();
  ASSERT_TRUE(header.count("decision")) << logs;
  EXPECT_TRUE(header.count("finished_at"));
  EXPECT_TRUE(header.count("control"));
  EXPECT_EQ(json::parse(header.at("decision")).at("winner"),
            json::parse(headerOf(dir_ / "one.db").at("decision")).at("winner"))
      << logs;
  EXPECT_EQ(json::parse(header.at("decision")).at("winner"),
            "-cpu.threads=1 -test.delay_a=off -test.delay_b=off")
      << logs;

  // The killed worker's trial was claimed again and recorded once, by another worker.
  auto connection = kiln::tune::pg::connectStore(server.uri());
  ASSERT_TRUE(connection.isOk());
  auto slow = connection->exec(
      "SELECT q.attempts, q.last_worker, q.worker, t.worker FROM queue q JOIN trials t ON "
      "t.study = q.study AND t.route = q.route WHERE q.kind = 'trial' AND q.route LIKE "
      "'%test.fault=slow%'");
  ASSERT_TRUE(slow.isOk()) << slow.status().message();
  ASSERT_EQ(slow->rows.size(), 1u);
  EXPECT_EQ(slow->rows[0][0], "2") << logs;
  const std::string killedName = fmt::format(":{}", workers[static_cast<size_t>(killed)]);
  EXPECT_NE(slow->rows[0][1]->find(killedName), std::string::npos) << logs;
  EXPECT_EQ(slow->rows[0][2]->find(killedName), std::string::npos) << logs;
  EXPECT_EQ(slow->rows[0][2], slow->rows[0][3]);
  auto counts = connection->exec("SELECT state, count(*) FROM queue GROUP BY state");
  ASSERT_TRUE(counts.isOk());
  ASSERT_EQ(counts->rows.size(), 1u) << logs;  // everything done
  EXPECT_EQ(counts->rows[0][0], "done");

  // kiln status and kiln best read the study from the store.
  Outcome status = faulty(fmt::format("status '{}'", server.uri()));
  EXPECT_EQ(status.exitCode, 0) << status.err;
  EXPECT_NE(status.out.find("queue: 0 queued, 0 running"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("decision: "), std::string::npos) << status.out;
  Outcome best = faulty(fmt::format("best '{}' --study 1", server.uri()));
  EXPECT_EQ(best.exitCode, 0) << best.err;
  EXPECT_EQ(best.out, json::parse(header.at("decision")).at("winner").get<std::string>() + "\n");
}

// A trial that kills every worker that runs it is recorded as failing after --max-attempts
// claims, and the study still finishes.
TEST_F(KilnTune, ATrialThatKillsItsWorkersIsRecordedAsFailingAfterItsAttempts) {
  kiln::testing::PgTestServer server(dir_ / "pg");
  ASSERT_TRUE(server.started()) << server.error();
  Outcome submitted = faulty(fmt::format(
      "tune {} --tune '-test.fault=[none|killworker] -cpu.threads=1' {} --store '{}' --submit "
      "--max-attempts 2",
      sample(), kQuickTiming, server.uri()));
  ASSERT_EQ(submitted.exitCode, 0) << submitted.out << submitted.err;
  std::vector<pid_t> workers;
  for (int i = 0; i < 3; ++i) {
    workers.push_back(
        start({"worker", "--store", server.uri(), "--exit-when-idle", "2", "--lease", "2", "--poll",
               "0.2", "--work-dir", (dir_ / fmt::format("w{}", i)).string()},
              dir_ / fmt::format("w{}.txt", i)));
  }
  std::string logs;
  int survivors = 0;
  for (int i = 0; i < 3; ++i) {
    const int code = waitFor(workers[static_cast<size_t>(i)]);
    logs += fmt::format("--- worker {} (exit {}):\n{}", i, code,
                        fileText(dir_ / fmt::format("w{}.txt", i)));
    EXPECT_TRUE(code == 0 || code == 128 + SIGKILL) << code;
    survivors += code == 0;
  }
  EXPECT_EQ(survivors, 1) << logs;  // two attempts, two workers lost
  auto store = kiln::tune::pg::StudyStore::open(server.uri(), 0);
  ASSERT_TRUE(store.isOk()) << store.status().message();
  auto trials = store->trials();
  ASSERT_TRUE(trials.isOk());
  const auto statuses = statusesByRoute(*trials);
  ASSERT_EQ(statuses.size(), 2u) << logs;
  EXPECT_EQ(statuses.at("-cpu.threads=1"), "ok");
  for (const auto& trial : *trials) {
    if (trial.route.find("killworker") == std::string::npos) continue;
    EXPECT_EQ(trial.status, TrialStatus::kCrash);
    EXPECT_NE(trial.message.find("its worker was lost 2 times"), std::string::npos)
        << trial.message;
  }
  EXPECT_TRUE(store->header().count("finished_at")) << logs;
}

// A study in the store run by `kiln tune --store` itself (no --submit): it works on the study
// as one worker and prints where it ended; flags that need one machine's files are refused.
TEST_F(KilnTune, TuneWithAStoreWorksOnItsStudyUntilDecided) {
  kiln::testing::PgTestServer server(dir_ / "pg");
  ASSERT_TRUE(server.started()) << server.error();
  Outcome tuned =
      faulty(fmt::format("tune {} --tune '-test.delay_a=* -cpu.threads=1' {} --store '{}'",
                         sample(), kQuickTiming, server.uri()));
  ASSERT_EQ(tuned.exitCode, 0) << tuned.out << tuned.err;
  EXPECT_NE(tuned.out.find("decision: -cpu.threads=1 -test.delay_a=off"), std::string::npos)
      << tuned.out;
  for (const char* flag : {"--cache x.db", "--gpus all", "--saveEngine x.kiln", "--report x.md"}) {
    Outcome refused = faulty(fmt::format("tune {} --tune '-test.delay_a=*' --store '{}' {}",
                                         sample(), server.uri(), flag));
    EXPECT_EQ(refused.exitCode, 1) << flag;
    EXPECT_NE(refused.err.find("does not apply to a study in a shared store"), std::string::npos)
        << refused.err;
  }
  Outcome notPg = faulty(fmt::format("tune {} --tune '-test.delay_a=*' --store x.db", sample()));
  EXPECT_EQ(notPg.exitCode, 1);
  EXPECT_NE(notPg.err.find("a shared store is a PostgreSQL URI"), std::string::npos) << notPg.err;
  Outcome submitAlone = faulty(fmt::format("tune {} --tune '-test.delay_a=*' --submit", sample()));
  EXPECT_EQ(submitAlone.exitCode, 1);
  Outcome unreachable = kiln(
      "worker --store 'postgresql:///kiln?host=/nonexistent' "
      "--exit-when-idle 0");
  EXPECT_EQ(unreachable.exitCode, 1) << unreachable.err;
  EXPECT_NE(unreachable.err.find("postgresql:///kiln?host=/nonexistent"), std::string::npos)
      << unreachable.err;
}

// The store stopped mid-trial and started again: the worker waits for it, its trial goes back to
// the queue (the result it could not record is not lost in a half-written state), and the study
// finishes with every route recorded once.
TEST_F(KilnTune, AWorkerWaitsForTheStoreToComeBack) {
  kiln::testing::PgTestServer server(dir_ / "pg");
  ASSERT_TRUE(server.started()) << server.error();
  Outcome submitted = faulty(fmt::format(
      "tune {} --tune '-test.fault=[none|slow] -cpu.threads=1' {} --store '{}' --submit", sample(),
      kQuickTiming, server.uri()));
  ASSERT_EQ(submitted.exitCode, 0) << submitted.out << submitted.err;
  const pid_t worker = start({"worker", "--store", server.uri(), "--exit-when-idle", "2", "--lease",
                              "2", "--poll", "0.2", "--work-dir", (dir_ / "work").string()},
                             dir_ / "worker.txt");
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (fileText(dir_ / "worker.txt").find("test.fault=slow (phase 1): starting") ==
             std::string::npos &&
         std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(server.stop());
  std::this_thread::sleep_for(std::chrono::seconds(4));  // the slow trial ends meanwhile
  ASSERT_TRUE(server.restart());
  EXPECT_EQ(waitFor(worker), 0) << fileText(dir_ / "worker.txt");
  const std::string log = fileText(dir_ / "worker.txt");
  EXPECT_NE(log.find("the store cannot be reached"), std::string::npos) << log;
  auto store = kiln::tune::pg::StudyStore::open(server.uri(), 0);
  ASSERT_TRUE(store.isOk()) << store.status().message();
  auto trials = store->trials();
  ASSERT_TRUE(trials.isOk());
  EXPECT_EQ(statusesByRoute(*trials),
            (std::map<std::string, std::string>{{"-cpu.threads=1", "ok"},
                                                {"-cpu.threads=1 -test.fault=slow", "ok"}}))
      << log;
  EXPECT_TRUE(store->header().count("finished_at")) << log;
}

// A worker with --gpus runs one trial at a time on each GPU named, and holds those GPUs: another
// kiln worker or kiln tune on one of them is refused (two trials timed on one GPU would disturb
// each other), while one on another GPU runs beside it.
TEST_F(KilnTune, AWorkerRunsATrialPerGpuAndHoldsItsGpus) {
  kiln::testing::PgTestServer server(dir_ / "pg");
  ASSERT_TRUE(server.started()) << server.error();
  Outcome submitted = faulty(fmt::format(
      "tune {} --tune '-test.fault=[none|slow] -test.delay_a=* -cpu.threads=1' {} --store '{}' "
      "--submit",
      sample(), kQuickTiming, server.uri()));
  ASSERT_EQ(submitted.exitCode, 0) << submitted.out << submitted.err;
  const pid_t worker = start({"worker", "--store", server.uri(), "--gpus", "1,3",
                              "--exit-when-idle", "2", "--poll", "0.2"},
                             dir_ / "worker.txt");
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (fileText(dir_ / "worker.txt").find("starting") == std::string::npos &&
         std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Outcome second =
      faulty(fmt::format("worker --store '{}' --gpus 3 --exit-when-idle 0", server.uri()));
  EXPECT_EQ(second.exitCode, 1) << second.out << second.err;
  EXPECT_NE(second.err.find(fmt::format("GPU 3 (pretend-")), std::string::npos) << second.err;
  EXPECT_NE(second.err.find(
                fmt::format("is in use by another kiln tune or kiln worker (pid {})", worker)),
            std::string::npos)
      << second.err;
  Outcome tune =
      faulty(fmt::format("tune {} --tune '-test.delay_a=*' --gpus 1 {}", sample(), kQuickTiming));
  EXPECT_EQ(tune.exitCode, 1) << tune.out << tune.err;
  EXPECT_NE(tune.err.find("is in use by another kiln tune or kiln worker"), std::string::npos)
      << tune.err;
  Outcome beside = faulty(
      fmt::format("tune {} --tune '-test.delay_a=*' --gpus 0 {} --quiet", sample(), kQuickTiming));
  EXPECT_EQ(beside.exitCode, 0) << beside.err;

  EXPECT_EQ(waitFor(worker), 0) << fileText(dir_ / "worker.txt");
  auto connection = kiln::tune::pg::connectStore(server.uri());
  ASSERT_TRUE(connection.isOk());
  auto workers = connection->exec("SELECT DISTINCT worker FROM trials ORDER BY worker");
  ASSERT_TRUE(workers.isOk());
  ASSERT_EQ(workers->rows.size(), 2u) << fileText(dir_ / "worker.txt");
  EXPECT_NE(workers->rows[0][0]->find("/gpu1"), std::string::npos);
  EXPECT_NE(workers->rows[1][0]->find("/gpu3"), std::string::npos);
}

// deploy/slurm's script, run with a stand-in for srun that starts two tasks on this machine as
// Slurm would (SLURM_PROCID 0 and 1): its workers finish a queued study and exit when idle.
TEST_F(KilnTune, TheSlurmScriptsWorkersFinishAStudy) {
  kiln::testing::PgTestServer server(dir_ / "pg");
  ASSERT_TRUE(server.started()) << server.error();
  Outcome submitted = faulty(fmt::format(
      "tune {} --tune '-test.delay_a=* -test.delay_b=* -cpu.threads=1' --search mixed {} --store "
      "'{}' --submit",
      sample(), kQuickTiming, server.uri()));
  ASSERT_EQ(submitted.exitCode, 0) << submitted.out << submitted.err;
  fs::create_directories(dir_ / "bin");
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "bin" / "srun",
                                        "#!/usr/bin/env bash\n"
                                        "while [[ $1 == --* ]]; do shift; done\n"
                                        "for task in 0 1; do SLURM_JOB_ID=7 SLURM_PROCID=$task "
                                        "\"$@\" & done\n"
                                        "wait\n")
                  .isOk());
  fs::permissions(dir_ / "bin" / "srun", fs::perms::owner_all);
  Outcome job = run("/usr/bin/env",
                    fmt::format("PATH='{}:/usr/bin:/bin' TMPDIR='{}' bash '{}' '{}' 2 '{}' cpu",
                                (dir_ / "bin").string(), dir_.string(), KILN_SLURM_SCRIPT,
                                server.uri(), KILN_FAULTY_BINARY));
  EXPECT_EQ(job.exitCode, 0) << job.out << job.err;
  EXPECT_TRUE(fs::exists(dir_ / "kiln-worker-7-0")) << job.out;
  EXPECT_TRUE(fs::exists(dir_ / "kiln-worker-7-1")) << job.out;
  auto store = kiln::tune::pg::StudyStore::open(server.uri(), 0);
  ASSERT_TRUE(store.isOk()) << store.status().message();
  EXPECT_TRUE(store->header().count("finished_at")) << job.out;
  auto trials = store->trials();
  ASSERT_TRUE(trials.isOk());
  EXPECT_EQ(trials->size(), 4u) << job.out;  // three in phase one, both delays off in phase two
}

// kiln status and kiln best read a study while a tuner works on it, after it stopped, and once
// it decided; best prints the chosen route alone, for scripts.
TEST_F(KilnTune, StatusAndBestReadAStudy) {
  const fs::path cache = dir_ / "tune.db";
  // The second route hangs, which keeps the tuner busy while the study is read.
  const pid_t pid = start({"tune", sample(), "--tune", "-test.fault=[none|hang] -test.delay_a=*",
                           "--search", "mixed", "--cache", "tune.db", "--trial-timeout", "60",
                           "--warmUp", "0", "--iterations", "30", "--duration", "0.05"},
                          dir_ / "log.txt");
  ASSERT_TRUE(waitForTrials(cache, 1, pid));
  Outcome during = faulty("status tune.db --json");
  ASSERT_EQ(during.exitCode, 0) << during.err;
  json study = json::parse(during.out);
  EXPECT_EQ(study["running_pid"], std::to_string(pid));
  EXPECT_EQ(study["search"], "mixed");
  EXPECT_EQ(study["phases"][0]["routes"], 3);  // the default, hang, delay_a=off
  EXPECT_EQ(study["phases"][0]["done"], 1);
  EXPECT_TRUE(study["phases"][1]["routes"].is_null());  // not planned yet
  EXPECT_TRUE(study["decision"].is_null());
  Outcome undecided = faulty("best tune.db");
  EXPECT_EQ(undecided.exitCode, 1);
  EXPECT_NE(undecided.err.find("has not decided yet"), std::string::npos) << undecided.err;
  EXPECT_NE(undecided.err.find(fmt::format("pid {}", pid)), std::string::npos) << undecided.err;
  // Before a decision, --provisional falls back to the default unless a gain is significant.
  Outcome provisional = faulty("best tune.db --provisional");
  EXPECT_EQ(provisional.exitCode, 0) << provisional.err;
  EXPECT_EQ(provisional.out, "\n");  // the default route
  EXPECT_NE(provisional.err.find("provisional"), std::string::npos);

  ::kill(pid, SIGINT);
  EXPECT_EQ(waitFor(pid), 130);
  Outcome stopped = faulty("status tune.db");
  EXPECT_EQ(stopped.exitCode, 0) << stopped.err;
  EXPECT_NE(stopped.out.find("not running, not finished"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("phase 1: 1 of 3 routes"), std::string::npos) << stopped.out;

  Outcome finished = faulty("tune --continue --cache tune.db --trial-timeout 6");
  ASSERT_EQ(finished.exitCode, 0) << finished.out << finished.err;
  study = json::parse(faulty("status tune.db --json").out);
  EXPECT_TRUE(study["running_pid"].is_null());
  EXPECT_FALSE(study["finished_at"].is_null());
  EXPECT_EQ(study["phases"][0]["done"], 3);
  EXPECT_EQ(study["phases"][1]["routes"], 0);  // delay_a=off alone: nothing to combine
  EXPECT_EQ(study["by_status"], json({{"ok", 2}, {"timeout", 1}}));
  EXPECT_GE(study["drift"].get<double>(), 0.0);
  EXPECT_EQ(study["best_so_far"]["route"], "-test.delay_a=off");
  EXPECT_TRUE(study["best_so_far"]["significant"].get<bool>());
  EXPECT_EQ(study["decision"]["winner"], "-test.delay_a=off");
  Outcome best = faulty("best tune.db");
  EXPECT_EQ(best.exitCode, 0) << best.err;
  EXPECT_EQ(best.out, "-test.delay_a=off\n");
  EXPECT_EQ(best.err, "");
  EXPECT_EQ(json::parse(faulty("best tune.db --json").out)["decided"], true);
  // Not a study: refused with the reason.
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "notes.db", "not a database\n").isOk());
  Outcome bad = faulty("status notes.db");
  EXPECT_EQ(bad.exitCode, 1);
  EXPECT_NE(bad.err.find("notes.db"), std::string::npos) << bad.err;
}

TEST_F(KilnTune, KillNineAtSeveralPointsThenContinueLosesAndRepeatsNothing) {
  const std::vector<std::string> args = {
      "tune",
      sample(),
      "--tune",
      "-test.delay_a=* -test.delay_b=* -cpu.conv.algo=[auto|direct]" KILN_NATIVE_NCHW_CONV,
      "--search",
      "mixed",
      "--cache",
      "tune.db",
      "--warmUp",
      "0",
      "--iterations",
      "30",
      "--duration",
      "0.05"};
  const fs::path cache = dir_ / "tune.db";
  // Kill points: during the first trial, after two, during phase two (4 recorded), and in the
  // finalist round (all 5 recorded).
  bool first = true;
  for (size_t point : {0u, 2u, 4u, 5u}) {
    std::vector<std::string> attempt = args;
    if (!first) attempt = {"tune", "--continue", "--cache", "tune.db"};
    const pid_t pid = start(attempt, dir_ / fmt::format("log_{}.txt", point));
    if (point == 0) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!fs::exists(dir_ / "tune.db.d" / "trials" / "p1-0" / "request.json") &&
             std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } else {
      ASSERT_TRUE(waitForTrials(cache, point, pid)) << "never reached " << point << " trials";
    }
    ::kill(pid, SIGKILL);
    EXPECT_EQ(waitFor(pid), 128 + SIGKILL);
    const auto trials = recorded(cache);
    for (size_t i = 0; i < trials.size(); ++i)
      EXPECT_EQ(trials[i].iteration, static_cast<int64_t>(i));
    first = false;
  }
  Outcome finished = faulty("tune --continue --cache tune.db");
  ASSERT_EQ(finished.exitCode, 0) << finished.out << finished.err;
  const auto resumed = recorded(cache);

  // The same study without interruption.
  Outcome straight =
      faulty(fmt::format("tune {} --tune '-test.delay_a=* -test.delay_b=* "
                         "-cpu.conv.algo=[auto|direct]" KILN_NATIVE_NCHW_CONV "' "
                         "--search mixed --cache straight.db {}",
                         sample(), kQuickTiming));
  ASSERT_EQ(straight.exitCode, 0) << straight.err;
  const auto uninterrupted = recorded(dir_ / "straight.db");
  EXPECT_EQ(statusesByRoute(resumed), statusesByRoute(uninterrupted));
  EXPECT_EQ(resumed.size(), uninterrupted.size());  // no trial repeated (routes are unique)
  std::set<std::string> routes;
  for (const auto& t : resumed) EXPECT_TRUE(routes.insert(t.route).second) << t.route;
  EXPECT_EQ(json::parse(headerOf(cache).at("decision")).at("winner"), kDelaysOff);
  // A finished run has nothing left to do.
  Outcome again = faulty("tune --continue --cache tune.db");
  EXPECT_EQ(again.exitCode, 0);
  EXPECT_NE(again.out.find("nothing remains"), std::string::npos) << again.out;
  EXPECT_EQ(recorded(cache).size(), resumed.size());
}

// SIGINT (Ctrl-C) and SIGTERM (what a batch system or `kill` sends) stop the same way: the
// trial in flight is abandoned, every finished one is kept, and the run says how to resume.
TEST_F(KilnTune, SigintStopsCleanlyAndSaysHowToResume) {
  for (int signal : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(signal == SIGINT ? "SIGINT" : "SIGTERM");
    fs::remove(dir_ / "tune.db");
    fs::remove_all(dir_ / "tune.db.d");
    stopsCleanlyOn(signal);
  }
}

pid_t KilnTune::startSlowTune(const fs::path& log) {
  return start({"tune", sample(), "--tune", "-test.delay_a=* -cpu.conv.algo=*", "--cache",
                "tune.db", "--warmUp", "0", "--iterations", "30", "--duration", "0.05"},
               log);
}

void KilnTune::stopsCleanlyOn(int signal) {
  const fs::path log = dir_ / "log.txt";
  const pid_t pid = startSlowTune(log);
  ASSERT_TRUE(waitForTrials(dir_ / "tune.db", 1, pid));
  ::kill(pid, signal);
  EXPECT_EQ(waitFor(pid), 130);
  const std::string out = kiln::readFileBytes(log).value();
  EXPECT_NE(out.find("stopped:"), std::string::npos) << out;
  EXPECT_NE(out.find("resume with: kiln tune --continue --cache tune.db"), std::string::npos)
      << out;
  const size_t before = recorded(dir_ / "tune.db").size();
  EXPECT_LT(before, 7u);  // 1 + 1 + 5 routes planned
  Outcome resumed = faulty("tune --continue --cache tune.db");
  ASSERT_EQ(resumed.exitCode, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find(fmt::format("continuing: {} trials already recorded", before)),
            std::string::npos)
      << resumed.out;
  EXPECT_EQ(recorded(dir_ / "tune.db").size(), 7u);
}

// The cache deleted while the run records into it: the run stops at the next trial, with an
// error that says what happened and what was kept, instead of going on into a file nobody can
// open again.
TEST_F(KilnTune, ACacheDeletedDuringTheRunStopsIt) {
  const fs::path log = dir_ / "log.txt";
  const pid_t pid = startSlowTune(log);
  ASSERT_TRUE(waitForTrials(dir_ / "tune.db", 1, pid));
  fs::remove(dir_ / "tune.db");
  EXPECT_EQ(waitFor(pid), 1);
  const std::string out = kiln::readFileBytes(log).value();
  EXPECT_NE(out.find("'tune.db' was deleted or replaced while kiln was recording into it"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("stopped: the trial of route"), std::string::npos) << out;
  EXPECT_NE(out.find("earlier trials are in the cache"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ / "tune.db"));
}

// A cache that cannot grow (here a file size limit, which fails writes as a full disk does):
// the run stops with what it could not record and what it kept, and resumes once it can write.
TEST_F(KilnTune, ACacheThatCannotGrowStopsTheRunAndItResumes) {
  const std::string command = fmt::format(
      "cd '{}' && (ulimit -f 100; '{}' tune '{}' --tune '-cpu.conv.algo=* -graph.layout=*' "
      "--cache tune.db {}) > full.txt 2>&1",
      dir_.string(), KILN_FAULTY_BINARY, sample(), kQuickTiming);
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string out = kiln::readFileBytes(dir_ / "full.txt").value();
  EXPECT_NE(out.find("could not be recorded; "), std::string::npos) << out;
  EXPECT_NE(out.find(" earlier trials are in the cache; once it can be written, resume with: "
                     "kiln tune --continue --cache tune.db"),
            std::string::npos)
      << out;
  const size_t kept = recorded(dir_ / "tune.db").size();
  EXPECT_GE(kept, 1u);
  Outcome resumed = faulty("tune --continue --cache tune.db");
  ASSERT_EQ(resumed.exitCode, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find(fmt::format("continuing: {} trials already recorded", kept)),
            std::string::npos)
      << resumed.out;
  EXPECT_EQ(recorded(dir_ / "tune.db").size(), 7u);
}

TEST_F(KilnTune, TuningTimeoutFinishesCleanly) {
  const auto begin = std::chrono::steady_clock::now();
  Outcome outcome =
      faulty(fmt::format("tune {} --tune '-test.fault=[none|hang] -graph.layout=*' --cache tune.db "
                         "--trial-timeout 120 --tuning-timeout 4 {}",
                         sample(), kQuickTiming));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  EXPECT_LT(seconds, 60);  // the hanging trial was stopped by the run's deadline, not its own
  EXPECT_NE(outcome.out.find("tuning timeout"), std::string::npos) << outcome.out;
  const auto header = headerOf(dir_ / "tune.db");
  EXPECT_EQ(header.count("finished_at"), 0u);  // incomplete: --continue would finish it
  for (const auto& t : recorded(dir_ / "tune.db")) EXPECT_NE(t.route, "-test.fault=hang");
}

TEST_F(KilnTune, CorruptForeignAndMismatchedCachesAreRefused) {
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "text.db", "hello, not a database\n").isOk());
  Outcome text = kiln("tune --continue --cache text.db");
  EXPECT_EQ(text.exitCode, 1);
  EXPECT_NE(text.err.find("text.db"), std::string::npos) << text.err;
  EXPECT_NE(text.err.find("not a SQLite database"), std::string::npos) << text.err;
  EXPECT_EQ(kiln::readFileBytes(dir_ / "text.db").value(), "hello, not a database\n");

  // A real cache, then a truncated copy of it.
  Outcome made = kiln(
      fmt::format("tune {} --tune '-graph.layout=*' --cache tune.db {}", sample(), kQuickTiming));
  ASSERT_EQ(made.exitCode, 0) << made.err;
  const std::string bytes = kiln::readFileBytes(dir_ / "tune.db").value();
  ASSERT_TRUE(
      kiln::writeFileAtomically(dir_ / "cut.db", bytes.substr(0, bytes.size() / 2 + 7)).isOk());
  Outcome cut = kiln("tune --continue --cache cut.db");
  EXPECT_EQ(cut.exitCode, 1);
  EXPECT_NE(cut.err.find("cut.db"), std::string::npos) << cut.err;

  // A fresh run may not overwrite a cache; a continued one may not change the study.
  Outcome overwrite =
      kiln(fmt::format("tune {} --tune '-graph.layout=*' --cache tune.db", sample()));
  EXPECT_EQ(overwrite.exitCode, 1);
  EXPECT_NE(overwrite.err.find("--continue"), std::string::npos) << overwrite.err;
  Outcome changed = kiln("tune --continue --cache tune.db --tune '-fusion.conv_act=*'");
  EXPECT_EQ(changed.exitCode, 1);
  EXPECT_NE(changed.err.find("cannot be changed"), std::string::npos) << changed.err;

  // A model that changed after the run started.
  fs::copy_file(sample(), dir_ / "model.onnx");
  Outcome started =
      kiln(fmt::format("tune model.onnx --tune '-graph.layout=*' --cache m.db {}", kQuickTiming));
  ASSERT_EQ(started.exitCode, 0) << started.err;
  std::string model = kiln::readFileBytes(dir_ / "model.onnx").value();
  model += std::string("\x0a\x00", 2);  // an extra empty field: still a valid ModelProto
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "model.onnx", model).isOk());
  const std::string cacheBefore = kiln::readFileBytes(dir_ / "m.db").value();
  Outcome moved = kiln("tune --continue --cache m.db");
  EXPECT_EQ(moved.exitCode, 1);
  EXPECT_NE(moved.err.find("the model changed since the run started"), std::string::npos)
      << moved.err;
  // Refused, the cache is left as it was: same bytes, no log beside it.
  EXPECT_EQ(kiln::readFileBytes(dir_ / "m.db").value(), cacheBefore);
  EXPECT_FALSE(fs::exists(dir_ / "m.db-wal"));
}

TEST_F(KilnTune, GivenReferencesDecideEligibility) {
  // Inputs written by the test, references from the reference executor through `kiln run`.
  kiln::ir::Tensor image(kiln::ir::DType::kFloat32, kiln::ir::Shape{1, 3, 32, 32});
  float v = -1.0f;
  for (float& x : image.mutableData<float>()) x = (v += 0.0007f);
  ASSERT_TRUE(kiln::ir::writeNpz(dir_ / "in.npz", {{"image", image}}).isOk());
  ASSERT_EQ(kiln(fmt::format("run {} --backend reference --loadInputs in.npz --saveOutputs "
                             "ref.npz --iterations 1 --duration 0 --warmUp 0",
                             sample()))
                .exitCode,
            0);
  Outcome good = kiln(
      fmt::format("tune {} --tune '-graph.layout=*' --loadInputs in.npz --loadRefOutputs ref.npz "
                  "--saveEngine best.kiln {}",
                  sample(), kQuickTiming));
  ASSERT_EQ(good.exitCode, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("references given"), std::string::npos) << good.out;
  EXPECT_FALSE(json::parse(kiln::readFileBytes(dir_ / "best.manifest.json").value())
                   .at("references_generated")
                   .get<bool>());

  // A run over these files may not continue once they change, nor on another target.
  Outcome started =
      kiln(fmt::format("tune {} --tune '-graph.layout=* -fusion.conv_act=*' --loadInputs in.npz "
                       "--loadRefOutputs ref.npz --cache data.db {}",
                       sample(), kQuickTiming));
  ASSERT_EQ(started.exitCode, 0) << started.err;
  ASSERT_TRUE(fs::copy_file(dir_ / "data.db", dir_ / "target.db"));
  fs::copy(dir_ / "data.db.d", dir_ / "target.db.d", fs::copy_options::recursive);
  {
    auto store = kiln::tune::TuneStore::open(dir_ / "target.db");
    ASSERT_TRUE(store.isOk()) << store.status().message();
    json target = json::parse(store->header().at("target"));
    target["cpu_model"] = "Some Other CPU";
    ASSERT_TRUE(store->setHeaderField("target", target.dump()).isOk());
  }
  Outcome otherTarget = kiln("tune --continue --cache target.db");
  EXPECT_EQ(otherTarget.exitCode, 1);
  EXPECT_NE(otherTarget.err.find("another target"), std::string::npos) << otherTarget.err;
  for (float& x : image.mutableData<float>()) x = -x;
  ASSERT_TRUE(kiln::ir::writeNpz(dir_ / "in.npz", {{"image", image}}).isOk());
  Outcome changedData = kiln("tune --continue --cache data.db");
  EXPECT_EQ(changedData.exitCode, 1);
  EXPECT_NE(changedData.err.find("the data changed since the run started: '" +
                                 (dir_ / "in.npz").string() + "'"),
            std::string::npos)
      << changedData.err;
  for (float& x : image.mutableData<float>()) x = -x;
  ASSERT_TRUE(kiln::ir::writeNpz(dir_ / "in.npz", {{"image", image}}).isOk());

  // Wrong references: no route can be eligible, and kiln says so.
  kiln::ir::Tensor wrong = kiln::ir::readNpz(dir_ / "ref.npz").value()[0].second;
  for (float& x : wrong.mutableData<float>()) x = 1.0f - x;
  ASSERT_TRUE(kiln::ir::writeNpz(dir_ / "wrong.npz", {{"probs", wrong}}).isOk());
  Outcome bad = kiln(fmt::format(
      "tune {} --tune '-graph.layout=*' --loadInputs in.npz --loadRefOutputs wrong.npz {}",
      sample(), kQuickTiming));
  EXPECT_EQ(bad.exitCode, 1) << bad.out;
  EXPECT_NE(bad.out.find("no route was eligible"), std::string::npos) << bad.out;

  // A reference that is one value repeated cannot tell routes apart: kiln warns.
  for (float& x : wrong.mutableData<float>()) x = 0.1f;
  ASSERT_TRUE(kiln::ir::writeNpz(dir_ / "flat.npz", {{"probs", wrong}}).isOk());
  Outcome flat = kiln(fmt::format(
      "tune {} --tune '-graph.layout=*' --loadInputs in.npz --loadRefOutputs flat.npz {}", sample(),
      kQuickTiming));
  EXPECT_NE(flat.out.find("warning: the reference of output 'probs' is one value repeated"),
            std::string::npos)
      << flat.out;
  EXPECT_EQ(good.out.find("warning:"), std::string::npos) << good.out;

  // Several input sets, each with its references: a route must pass on every one, and the
  // manifest lists each set's files and hashes.
  kiln::ir::Tensor other = image;
  for (float& x : other.mutableData<float>()) x = 0.25f - x;
  ASSERT_TRUE(kiln::ir::writeNpz(dir_ / "in2.npz", {{"image", other}}).isOk());
  ASSERT_EQ(kiln(fmt::format("run {} --backend reference --loadInputs in2.npz --saveOutputs "
                             "ref2.npz --iterations 1 --duration 0 --warmUp 0",
                             sample()))
                .exitCode,
            0);
  Outcome pairs = kiln(
      fmt::format("tune {} --tune '-graph.layout=*' --loadInputs in.npz --loadRefOutputs ref.npz "
                  "--loadInputs in2.npz --loadRefOutputs ref2.npz --saveEngine pairs.kiln {}",
                  sample(), kQuickTiming));
  ASSERT_EQ(pairs.exitCode, 0) << pairs.out << pairs.err;
  const json pairsManifest = json::parse(kiln::readFileBytes(dir_ / "pairs.manifest.json").value());
  ASSERT_EQ(pairsManifest.at("data").size(), 2u);
  EXPECT_NE(pairsManifest.at("data")[1].at("references_given").get<std::string>().find("ref2.npz"),
            std::string::npos);
  // The second set's reference swapped for the first's: every route fails on set two.
  Outcome swapped = kiln(
      fmt::format("tune {} --tune '-graph.layout=*' --loadInputs in.npz --loadRefOutputs ref.npz "
                  "--loadInputs in2.npz --loadRefOutputs ref.npz {}",
                  sample(), kQuickTiming));
  EXPECT_EQ(swapped.exitCode, 1) << swapped.out;
  EXPECT_NE(swapped.out.find("no route was eligible"), std::string::npos) << swapped.out;

  // Reference files must pair with input sets.
  Outcome unpaired =
      kiln(fmt::format("tune {} --tune '-graph.layout=*' --loadInputs in.npz --loadInputs in.npz "
                       "--loadRefOutputs ref.npz",
                       sample()));
  EXPECT_EQ(unpaired.exitCode, 1);
  EXPECT_NE(unpaired.err.find("each reference file belongs to one input set"), std::string::npos)
      << unpaired.err;
}

TEST_F(KilnTune, OneRunPerCacheAndContinueFromAnotherFolder) {
  fs::copy_file(sample(), dir_ / "model.onnx");
  const pid_t pid =
      start({"tune", "model.onnx", "--tune", "-test.delay_a=* -cpu.conv.algo=*", "--cache",
             "tune.db", "--warmUp", "0", "--iterations", "30", "--duration", "0.05"},
            dir_ / "log.txt");
  ASSERT_TRUE(waitForTrials(dir_ / "tune.db", 1, pid));
  // While it runs, a second run on the same cache is refused and changes nothing.
  Outcome second = faulty("tune --continue --cache tune.db");
  EXPECT_EQ(second.exitCode, 1);
  EXPECT_NE(second.err.find(fmt::format("another kiln tune (pid {}) is using tune.db", pid)),
            std::string::npos)
      << second.err;
  ::kill(pid, SIGINT);
  EXPECT_EQ(waitFor(pid), 130);

  // Continued from another folder, with the model moved there: the recorded hash decides.
  fs::create_directories(dir_ / "elsewhere");
  fs::rename(dir_ / "model.onnx", dir_ / "elsewhere" / "moved.onnx");
  Outcome resumed =
      run(KILN_FAULTY_BINARY, "tune moved.onnx --continue --cache ../tune.db", dir_ / "elsewhere");
  ASSERT_EQ(resumed.exitCode, 0) << resumed.out << resumed.err;
  EXPECT_EQ(recorded(dir_ / "tune.db").size(), 7u);
}

TEST_F(KilnTune, SaveAllEnginesKeepsEveryCandidateAndCacheExports) {
  Outcome outcome =
      kiln(fmt::format("tune {} --tune '-graph.layout=* -fusion.conv_act=*' --cache tune.db "
                       "--save-all-engines all {}",
                       sample(), kQuickTiming));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  const json index = json::parse(kiln::readFileBytes(dir_ / "all" / "index.json").value());
  ASSERT_EQ(index.size(), 3u);
  for (const auto& entry : index) {
    EXPECT_TRUE(fs::exists(dir_ / "all" / entry.at("file").get<std::string>()));
  }
  Outcome exported = kiln("cache export --jsonl tune.db");
  ASSERT_EQ(exported.exitCode, 0) << exported.err;
  std::istringstream lines(exported.out);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) {
    EXPECT_NO_THROW(json::parse(line)) << line;
  }
  EXPECT_GE(count, 4);  // the header and three trials (and any comparisons)
}

// The GPU: each trial builds and times a CUDA plan in its own process; bf16 under a tight
// threshold is measured and excluded; the store's target names the GPU, so --continue of the
// finished run checks it again. Without a GPU (CI) or the CUDA backend: a clear error.
TEST_F(KilnTune, TunesOnTheGpuOrSaysWhyNot) {
  // What a CUDA run cannot do is refused before anything runs.
  Outcome engine = kiln(fmt::format(
      "tune {} --backend cuda --tune '-cuda.graphs=*' --saveEngine best.kiln", sample()));
  EXPECT_EQ(engine.exitCode, 1);
  EXPECT_NE(engine.err.find("no engine files to save"), std::string::npos) << engine.err;
  Outcome limit = kiln(fmt::format(
      "tune {} --backend cuda --tune '-cuda.graphs=*' --trial-memory-limit 4096", sample()));
  EXPECT_EQ(limit.exitCode, 1);
  EXPECT_NE(limit.err.find("--trial-memory-limit does not apply to --backend cuda"),
            std::string::npos)
      << limit.err;
  Outcome outcome = kiln(fmt::format(
      "tune {} --backend cuda --tune '-cuda.graphs=[on|off] -cuda.precision=[fp32|bf16] "
      "-cuda.conv.algo=[heuristic|timed]' "
      "--accuracy-threshold 1e-7 --cache tune.db --report report.md {}",
      sample(), kQuickTiming));
#if KILN_HAVE_CUDA
  if (outcome.exitCode == 1 && outcome.err.find("no CUDA device is visible") != std::string::npos) {
    GTEST_SKIP() << "no GPU: " << outcome.err;
  }
  ASSERT_EQ(outcome.exitCode, 0) << outcome.out << outcome.err;
  const auto trials = recorded(dir_ / "tune.db");
  const auto statuses = statusesByRoute(trials);
  ASSERT_EQ(statuses.size(), 4u) << outcome.out;
  EXPECT_EQ(statuses.at(""), "ok");
  EXPECT_EQ(statuses.at("-cuda.graphs=off"), "ok");
  EXPECT_EQ(statuses.at("-cuda.conv.algo=timed"), "ok");
  // The trials share the run's timing cache, in its work folder.
  const json timing = json::parse(kiln::readFileBytes(dir_ / "tune.db.d" / "timing.cache").value());
  EXPECT_EQ(timing.at("format"), "kiln timing cache");
  EXPECT_EQ(timing.at("devices").size(), 1u);
  EXPECT_EQ(statuses.at("-cuda.precision=bf16"), "accuracy-fail");
  for (const TrialRecord& t : trials) {
    EXPECT_GT(t.buildMs, 0) << t.route;
    EXPECT_TRUE(t.enginePath.empty()) << t.route;  // a CUDA trial leaves no engine file
    if (t.status == TrialStatus::kOk) {
      ASSERT_TRUE(t.timing.has_value()) << t.route;
      EXPECT_GE(t.timing->summary.count, 30) << t.route;
      EXPECT_GT(t.timing->summary.median, 0) << t.route;
      ASSERT_EQ(t.accuracy.size(), 1u);
      EXPECT_LE(t.accuracy[0].loss, 1e-7) << t.route;
    }
  }
  const auto header = headerOf(dir_ / "tune.db");
  const json target = json::parse(header.at("target"));
  EXPECT_EQ(target.at("backend"), "cuda");
  EXPECT_FALSE(target.at("gpu").get<std::string>().empty());
  EXPECT_EQ(json::parse(header.at("study")).at("backend"), "cuda");
  ASSERT_TRUE(header.count("decision"));
  const std::string report = kiln::readFileBytes(dir_ / "report.md").value();
  EXPECT_NE(report.find("`-cuda.precision=bf16` | accuracy-fail"), std::string::npos) << report;
  Outcome again = kiln("tune --continue --cache tune.db");
  EXPECT_EQ(again.exitCode, 0) << again.err;
  EXPECT_NE(again.out.find("this run finished"), std::string::npos) << again.out;

  // The finalist round's child (run only when a route looked faster): every route's plan built
  // again in one process and timed in rotation, the same number of samples for each; a route
  // that cannot be rebuilt is a build error naming it.
  const json data = json::parse(header.at("data"));
  json request = {{"mode", "interleave"},
                  {"backend", "cuda"},
                  {"model", sample()},
                  {"shapes", ""},
                  {"routes", {"", "-cuda.graphs=off"}},
                  {"inputs", data.at(0).at("inputs_file")},
                  {"timing", {{"warmup_ms", 0}, {"min_iterations", 30}, {"min_seconds", 0.05}}},
                  {"result", (dir_ / "interleave.json").string()}};
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "request.json", request.dump()).isOk());
  ASSERT_EQ(kiln("__trial request.json").exitCode, 0);
  const json result = json::parse(kiln::readFileBytes(dir_ / "interleave.json").value());
  ASSERT_EQ(result.at("status"), "ok") << result.dump();
  const auto samples = result.at("samples").get<std::vector<std::vector<double>>>();
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_GE(samples[0].size(), 30u);
  EXPECT_EQ(samples[0].size(), samples[1].size());
  for (const auto& plan : samples) {
    for (double ms : plan) EXPECT_GT(ms, 0);
  }
  request["routes"] = {"", "-cuda.precision=fp17"};
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "request.json", request.dump()).isOk());
  ASSERT_EQ(kiln("__trial request.json").exitCode, 0);
  const json bad = json::parse(kiln::readFileBytes(dir_ / "interleave.json").value());
  EXPECT_EQ(bad.at("status"), "build-error");
  EXPECT_NE(bad.at("message").get<std::string>().find("-cuda.precision=fp17"), std::string::npos)
      << bad.dump();
#else
  EXPECT_EQ(outcome.exitCode, 1);
  EXPECT_NE(outcome.err.find("built without the CUDA backend"), std::string::npos) << outcome.err;
#endif
}

}  // namespace
