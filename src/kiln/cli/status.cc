// `kiln status tune.db [--json]`: where a study stands. `kiln best tune.db [--json]
// [--provisional]`: the route it chose, alone on stdout, for scripts:
//   kiln build model.onnx --route "$(kiln best tune.db)" --saveEngine model.kiln
// Both only read the store (src/kiln/tune/study_status.h).
#include <cstdio>

#include "kiln/cli/commands.h"
#include "kiln/tune/store.h"
#include "kiln/tune/study_status.h"

namespace kiln::cli {

namespace {

using json = nlohmann::json;

Result<json> readStudy(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(tune::TuneStore store, tune::TuneStore::open(path));
  return tune::describeStudy(store);
}

std::string phasesText(const json& study) {
  std::string text;
  for (const json& phase : study.at("phases")) {
    text += fmt::format("{}phase {}: {} of {}", text.empty() ? "" : ", ",
                        phase.at("phase").get<int>(), phase.at("done").get<size_t>(),
                        phase.at("routes").is_null()
                            ? std::string("?")
                            : std::to_string(phase.at("routes").get<size_t>()));
  }
  return text;
}

int runBest(const std::string& path, bool asJson, bool provisional) {
  auto study = readStudy(path);
  if (!study.isOk()) return reportError(study.status());
  const json& decision = study->at("decision");
  const json& best = study->at("best_so_far");
  json answer;
  if (!decision.is_null()) {
    if (decision.at("winner").is_null()) {
      return reportError(invalidInput("{}: the study found no eligible route: {}", path,
                                      decision.at("reason").get<std::string>()));
    }
    answer = {{"route", decision.at("winner")}, {"decided", true}, {"decision", decision}};
  } else if (!provisional) {
    return reportError(invalidInput(
        "{}: the study has not decided yet ({}{}); --provisional gives the fastest eligible "
        "route so far",
        path, phasesText(*study),
        study->at("running_pid").is_null()
            ? "; no tuner is running: continue it with kiln tune --continue"
            : fmt::format("; kiln tune pid {} is working on it",
                          study->at("running_pid").get<std::string>())));
  } else if (best.is_null()) {
    return reportError(
        invalidInput("{}: no eligible route has been measured yet ({})", path, phasesText(*study)));
  } else {
    // Only a gain that clears the noise is worth deploying before the finalist round.
    const bool significant = best.value("significant", false);
    answer = {{"route", significant ? best.at("route") : json(study->at("default_route"))},
              {"decided", false},
              {"best_so_far", best}};
  }
  if (asJson) {
    std::printf("%s\n", answer.dump(1).c_str());
  } else {
    std::printf("%s\n", answer.at("route").get<std::string>().c_str());
    if (!answer.at("decided").get<bool>()) {
      std::fprintf(stderr, "kiln best: provisional (%s): the fastest eligible route so far%s\n",
                   phasesText(*study).c_str(),
                   best.value("significant", false)
                       ? ""
                       : " is not significantly faster than the default, so the default");
    }
  }
  return 0;
}

}  // namespace

Command addStatusCommand(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto asJson = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "status", "Where a tuning study stands: phases, trials by status, drift, decision");
  sub->add_option("cache", *path, "the tuning cache (--cache of kiln tune)")->required();
  sub->add_flag("--json", *asJson, "as one JSON object");
  return {sub, [path, asJson] {
            auto study = readStudy(*path);
            if (!study.isOk()) return reportError(study.status());
            if (*asJson) {
              std::printf("%s\n", study->dump(1).c_str());
            } else {
              std::fputs(tune::studyText(*study).c_str(), stdout);
            }
            return 0;
          }};
}

Command addBestCommand(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto asJson = std::make_shared<bool>(false);
  auto provisional = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "best", "The route a tuning study chose, alone on stdout (\"\" is the default route)");
  sub->add_option("cache", *path, "the tuning cache (--cache of kiln tune)")->required();
  sub->add_flag("--json", *asJson, "the route with the decision (or the best so far) as JSON");
  sub->add_flag("--provisional", *provisional,
                "before the study decides: the fastest eligible route so far if its gain over "
                "the default is significant, else the default");
  sub->footer(
      "Exit codes: 0 a route was printed, 1 no decision yet (without --provisional) or "
      "no eligible route.");
  return {sub, [path, asJson, provisional] { return runBest(*path, *asJson, *provisional); }};
}

}  // namespace kiln::cli
