// `kiln tune model.onnx --tune "<route expression>" [--search fast|mixed|full]`: the global
// performance tuner (src/kiln/tune/), with trtexec's flag names where trtexec has the flag.
// Also the hidden `kiln __trial request.json` that the tuner starts for each trial, and
// `kiln cache export --jsonl tune.db`.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>

#include "kiln/base/file.h"
#include "kiln/cli/commands.h"
#include "kiln/tune/store.h"
#include "kiln/tune/trial.h"
#include "kiln/tune/tuner.h"
#include "kiln/tune/worker.h"

namespace kiln::cli {

namespace {

std::atomic<bool> gStopRequested{false};

extern "C" void onStopSignal(int signal) {
  gStopRequested.store(true);
  // A second Ctrl-C ends the tuner at once (its trial child dies with it: PDEATHSIG).
  ::signal(signal, SIG_DFL);
}

struct TuneFlags {
  tune::TuneOptions options;
  std::string model;
  std::string tuneText, tuneFile;
  std::string search = "fast";
  std::string metric = "cos";
  std::string thresholds;
  double trialMemoryMiB = -1;  // -1: three quarters of physical memory
};

Status prepare(TuneFlags& flags, const CLI::App& sub) {
  tune::TuneOptions& o = flags.options;
  o.trialLimits.memoryBytes = flags.trialMemoryMiB < 0
                                  ? tune::kDefaultTrialMemory
                                  : static_cast<uint64_t>(flags.trialMemoryMiB * 1024 * 1024);
  if (o.resume) {
    // A continued run takes its study from the cache; only how it runs may be given again.
    for (const char* study : {"--tune",
                              "--tune-file",
                              "--backend",
                              "--search",
                              "--shapes",
                              "--loadInputs",
                              "--loadRefOutputs",
                              "--seed",
                              "--accuracy-metric",
                              "--accuracy-threshold",
                              "--atol",
                              "--rtol",
                              "--warmUp",
                              "--iterations",
                              "--duration",
                              "--finalists",
                              "--mixed-min-gain",
                              "--mixed-max-routes",
                              "--saveEngine",
                              "--report",
                              "--save-all-engines",
                              "--timingCacheFile",
                              "--dry-run"}) {
      if (sub.count(study) > 0) {
        return invalidInput(
            "--continue takes the study's settings from the cache; {} cannot be changed (start "
            "a new run with another --cache to change it)",
            study);
      }
    }
    if (!flags.model.empty()) o.model = flags.model;  // checked against the cache's hash
    return Status::ok();
  }
  if (flags.model.empty()) return invalidInput("kiln tune needs a model (or --continue --cache)");
  o.model = flags.model;
  if (flags.tuneText.empty() == flags.tuneFile.empty()) {
    return invalidInput(
        "give the routes to search with exactly one of --tune \"<expression>\" and "
        "--tune-file FILE (e.g. --tune \"-cpu.gemm.source=[native|blas] -fusion.conv_act=*\")");
  }
  if (!flags.tuneFile.empty()) {
    KILN_ASSIGN_OR_RETURN(o.expression, readFileBytes(flags.tuneFile));
  } else {
    o.expression = flags.tuneText;
  }
  KILN_ASSIGN_OR_RETURN(o.search, tune::parseSearchMode(flags.search));
  KILN_ASSIGN_OR_RETURN(o.accuracy.metric, tune::parseMetric(flags.metric));
  if (!flags.thresholds.empty()) {
    KILN_RETURN_IF_ERROR(tune::parseThresholds(flags.thresholds, o.accuracy));
  } else if (o.accuracy.metric == tune::Metric::kL0) {
    o.accuracy.threshold = 0;  // no element outside atol + rtol * |ref|
  } else if (o.accuracy.metric != tune::Metric::kCos) {
    return invalidInput(
        "--accuracy-metric {} needs --accuracy-threshold (the default threshold, 1e-5, is for "
        "cos)",
        flags.metric);
  }
  return Status::ok();
}

// Runs `work` (kiln tune, kiln worker) with SIGINT and SIGTERM setting gStopRequested, so that
// it stops cleanly, and reports its error.
int runStoppable(const std::function<Result<int>(const std::atomic<bool>&)>& work) {
  struct sigaction action {};
  action.sa_handler = onStopSignal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  try {
    auto result = work(gStopRequested);
    if (!result.isOk()) return reportError(result.status());
    return *result;
  } catch (const std::filesystem::filesystem_error& e) {
    // A file operation the tuner did not expect to fail (a full disk, a folder removed under
    // it): every completed trial is already in the store.
    return reportError(ioError("{}", e.what()));
  }
}

int runTuneCommand(TuneFlags& flags, const CLI::App& sub) {
  if (Status s = prepare(flags, sub); !s.isOk()) return reportError(s);
  flags.options.commandLine = commandLine();
  return runStoppable(
      [&](const std::atomic<bool>& stop) { return tune::runTune(flags.options, stop); });
}

int exportCache(const std::string& path) {
  auto store = tune::TuneStore::open(path);
  if (!store.isOk()) return reportError(store.status());
  auto lines = store->exportJsonLines();
  if (!lines.isOk()) return reportError(lines.status());
  std::fputs(lines->c_str(), stdout);
  return 0;
}

}  // namespace

namespace {
std::string& commandLineStorage() {
  static std::string text;
  return text;
}
}  // namespace

const std::string& commandLine() { return commandLineStorage(); }

void setCommandLine(int argc, char** argv) {
  std::string text;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    const bool plain = !arg.empty() && arg.find_first_of(" \t\"'$\\") == std::string::npos;
    if (!plain) {
      std::string quoted = "'";
      for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      arg = quoted + "'";
    }
    text += (i ? " " : "") + arg;
  }
  commandLineStorage() = text;
}

Command addTuneCommand(CLI::App& app) {
  auto flags = std::make_shared<TuneFlags>();
  tune::TuneOptions& o = flags->options;
  CLI::App* sub = app.add_subcommand(
      "tune", "Search build routes for the fastest engine that meets the accuracy threshold");
  sub->add_option("model", flags->model, "the .onnx file");
  sub->add_option("--shapes", o.shapes, "fix dynamic input shapes: name:1x3x224x224,name2:...");
  sub->add_option("--backend", o.backend,
                  "cpu (engine files, the default) or cuda (each trial builds and times a CUDA "
                  "plan on the GPU, with CUDA events)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--tune", flags->tuneText,
                  "route expression: -knob=[a|b] varies a knob, -knob=* over every value, "
                  "-knob=value pins it, -knob@glob=[a|b] per node");
  sub->add_option("--tune-file", flags->tuneFile, "read the route expression from a file");
  sub->add_option("--search", flags->search,
                  "fast: default + one knob changed at a time; full: the Cartesian product; "
                  "mixed: fast, then the product over the knobs that gained significantly")
      ->check(CLI::IsMember({"fast", "mixed", "full"}));
  sub->add_flag("--dry-run", o.dryRun, "list the routes without building (mixed: phase one)");
  sub->add_flag("--allow-large-search", o.allowLargeSearch,
                fmt::format("run a full search of more than {} routes", tune::kLargeSearchRoutes));
  sub->add_option("--loadInputs", o.loadInputs,
                  "one input set per use: file.npz (arrays named after the inputs) or "
                  "name:file.npy,...; inputs not given are seeded random");
  sub->add_option("--loadRefOutputs", o.loadRefOutputs,
                  "reference outputs, one per --loadInputs (default: computed by the reference "
                  "executor)");
  sub->add_option("--seed", o.seed, "seed for random inputs")->default_val(0);
  sub->add_option("--accuracy-metric", flags->metric,
                  "l0 (fraction outside atol+rtol*|ref|), l1, l2, linf or cos (1 - cosine "
                  "similarity)")
      ->default_val("cos");
  sub->add_option("--accuracy-threshold", flags->thresholds,
                  "largest acceptable loss: 1e-5 for every output and/or name:1e-3 entries "
                  "(default 1e-5 for cos, 0 for l0)");
  sub->add_option("--atol", o.accuracy.atol, "l0's absolute tolerance")->default_val(1e-5);
  sub->add_option("--rtol", o.accuracy.rtol, "l0's relative tolerance")->default_val(1e-5);
  sub->add_option("--cache", o.cache,
                  "the result store (SQLite); every completed trial is kept there, so the run "
                  "can be continued");
  sub->add_flag("--continue", o.resume, "continue the run recorded in --cache");
  sub->add_option("--store", o.store,
                  "a PostgreSQL store shared by workers on many machines (postgresql://...): "
                  "the study goes there and `kiln worker`s run its trials");
  sub->add_flag("--submit", o.submit,
                "with --store: queue the study and return (otherwise this process works on it "
                "until it is decided)");
  sub->add_option("--max-attempts", o.maxAttempts,
                  "with --store: claims of one trial (its worker lost each time) before it is "
                  "recorded as failing")
      ->default_val(3);
  sub->add_option("--gpus", o.gpus,
                  "cuda: run trials on these GPUs at once, one per GPU: 'all' or '0,1,3' "
                  "(default: one trial at a time on the first GPU)");
  sub->add_option("--trial-timeout", o.trialLimits.timeoutSeconds,
                  "seconds one trial (build + run + timing) may take before it is killed")
      ->default_val(600)
      ->check(CLI::PositiveNumber);
  sub->add_option(
         "--trial-memory-limit", flags->trialMemoryMiB,
         "memory limit of a trial process (RLIMIT_DATA: heap, stacks, private mappings), MiB "
         "(default: 3/4 of physical memory; "
         "0: none)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--tuning-timeout", o.tuningTimeoutSeconds,
                  "seconds the whole run may take; it then stops cleanly (0: no limit)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--warmUp", o.timing.warmUpMs, "warm-up per trial, ms")
      ->default_val(200)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--iterations", o.timing.minIterations, "minimum timed runs per trial")
      ->default_val(20)
      ->check(CLI::PositiveNumber);
  sub->add_option("--duration", o.timing.minSeconds, "minimum timed seconds per trial")
      ->default_val(1.0)
      ->check(CLI::NonNegativeNumber);
  sub->add_option_function<double>(
         "--mixed-min-gain", [&o](double percent) { o.mixedMinGain = percent / 100; },
         "mixed: the smallest one-off gain, in percent of the default's time, that phase two "
         "combines (a significant gain below it is reported and left out; 0 combines every "
         "significant gain)")
      ->default_str("0.5")
      ->check(CLI::Range(0.0, 99.0));
  sub->add_option("--mixed-max-routes", o.mixedMaxRoutes,
                  "mixed: the most routes phase two's product may hold; where the significant "
                  "gains' product is larger, the largest gains enter it first and the rest are "
                  "reported and left out (0: no bound)")
      ->default_val(128)
      ->check(CLI::Range(size_t{0}, size_t{1} << 40));
  sub->add_option("--finalists", o.finalists,
                  "routes re-measured interleaved with the default before a winner is declared")
      ->default_val(3)
      ->check(CLI::PositiveNumber);
  sub->add_option("--saveEngine", o.saveEngine,
                  "write the winning engine here, with NAME.manifest.json and NAME.report.md "
                  "beside it");
  sub->add_option("--report", o.report,
                  "write the report here: one self-contained HTML page with charts when the name "
                  "ends in .html, Markdown otherwise");
  sub->add_option("--save-all-engines", o.saveAllEngines, "keep every candidate's engine here");
  sub->add_option("--timingCacheFile", o.timingCacheFile,
                  "cuda: the timing cache every trial reads and extends (default: one in the "
                  "run's work folder, shared by this run's routes)");
  sub->add_flag("--quiet", o.quiet, "print nothing but errors");
  sub->add_flag("--json-progress", o.jsonProgress,
                "write progress as one JSON object a line on stdout (events start, phase, "
                "trial_start, trial, control, phase_two_plan, finalists, comparison, warning, "
                "stopped, done) and nothing else");
  sub->add_option("--progress-interval", o.progressIntervalSeconds,
                  "when stdout is not a terminal: seconds between the lines saying which route "
                  "a long trial is still measuring")
      ->default_val(30)
      ->check(CLI::PositiveNumber);
  sub->footer(
      "Exit codes: 0 a winner was chosen (possibly the default route), 1 bad input or no "
      "eligible route, 2 bad command line, 3 internal error, 130 stopped by a signal (resumable "
      "with --continue).");
  return {sub, [flags, sub] {
            // The command line is part of the cache's header, for the record.
            return runTuneCommand(*flags, *sub);
          }};
}

Command addWorkerCommand(CLI::App& app) {
  auto options = std::make_shared<tune::WorkerOptions>();
  CLI::App* sub = app.add_subcommand(
      "worker", "Run the trials of studies queued in a PostgreSQL store (kiln tune --submit)");
  sub->add_option("--store", options->store, "the store: postgresql://...")->required();
  options->backend = "cpu";
  sub->add_option("--backend", options->backend, "the studies it takes: cpu or cuda (default cpu)");
  sub->add_option("--gpus", options->gpus,
                  "cuda: one trial at a time on each of these GPUs: 'all' or '0,1,3' (default: "
                  "the first GPU)");
  sub->add_option("--exit-when-idle", options->exitWhenIdleSeconds,
                  "exit once nothing it could take is queued or running for this many seconds "
                  "(default: wait for work forever)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--lease", options->leaseSeconds,
                  "seconds a claimed trial stays this worker's without a heartbeat; a worker "
                  "that dies loses its trials after this long")
      ->default_val(60)
      ->check(CLI::PositiveNumber);
  sub->add_option("--poll", options->pollSeconds, "seconds between looks for work when idle")
      ->default_val(2)
      ->check(CLI::PositiveNumber);
  sub->add_option("--study", options->onlyStudy, "take trials of this study only");
  sub->add_option("--work-dir", options->workRoot,
                  "where the studies' models, data and trial folders go (default: "
                  "/tmp/kiln-worker-<uid>)");
  sub->add_flag("--quiet", options->quiet, "print nothing but errors");
  sub->footer(
      "Exit codes: 0 idle for --exit-when-idle, 1 bad input, 3 internal error, 130 stopped by a "
      "signal (the trial in flight goes back to the queue).");
  return {sub, [options] {
            return runStoppable(
                [&](const std::atomic<bool>& stop) { return tune::runWorker(*options, stop); });
          }};
}

Command addTrialCommand(CLI::App& app) {
  auto request = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("__trial", "");
  sub->group("");  // hidden: started by `kiln tune` only
  sub->add_option("request", *request)->required();
  return {sub, [request] { return tune::runTrialRequest(*request); }};
}

Command addCacheCommand(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto jsonl = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand("cache", "Read a tuning cache");
  sub->require_subcommand(1);
  CLI::App* exportSub = sub->add_subcommand("export", "Write the header and every trial");
  exportSub->add_option("cache", *path, "the tuning cache (--cache of kiln tune)")->required();
  exportSub->add_flag("--jsonl", *jsonl, "as JSON lines (the only format so far)")->required();
  return {sub, [path] { return exportCache(*path); }};
}

}  // namespace kiln::cli
