// `kiln status tune.db [--json]`: where a study stands. `kiln best tune.db [--json]
// [--provisional]`: the route it chose, alone on stdout, for scripts:
//   kiln build model.onnx --route "$(kiln best tune.db)" --saveEngine model.kiln
// Both only read the store (src/kiln/tune/study_status.h).
#include <cstdio>

#include "kiln/cli/commands.h"
#include "kiln/tune/pg_store.h"
#include "kiln/tune/store.h"
#include "kiln/tune/study_status.h"

namespace kiln::cli {

namespace {

using json = nlohmann::json;

// A SQLite cache, or one study of a PostgreSQL store (`study` 0: its only one).
Result<json> readStudy(const std::string& path, int64_t study) {
  if (tune::pg::isUri(path)) {
    KILN_ASSIGN_OR_RETURN(tune::pg::StudyStore store, tune::pg::StudyStore::open(path, study));
    KILN_ASSIGN_OR_RETURN(json queue, store.queueJson());
    return tune::describeStudy(store, std::nullopt, queue);
  }
  if (study != 0) {
    return invalidInput("--study {}: {} is a SQLite cache, which holds one study", study, path);
  }
  KILN_ASSIGN_OR_RETURN(tune::TuneStore store, tune::TuneStore::open(path));
  return tune::describeStudy(store, tune::runningTuner(path));
}

// `kiln status postgresql://...` of a store with several studies: one line each.
Result<std::string> studiesText(const std::string& uri, bool asJson) {
  KILN_ASSIGN_OR_RETURN(tune::pg::Connection connection, tune::pg::connectStore(uri));
  KILN_ASSIGN_OR_RETURN(json studies, tune::pg::listStudies(connection));
  if (asJson) return studies.dump(1) + "\n";
  std::string text = fmt::format("{} studies in {}\n", studies.size(), tune::pg::redacted(uri));
  for (const json& s : studies) {
    text += fmt::format("  study {}: {} search of {}, {} ended, {} running, {} queued{}\n",
                        s.at("id").get<int64_t>(), s.at("search").get<std::string>(),
                        s.at("model_path").get<std::string>(), s.at("ended").get<int64_t>(),
                        s.at("running").get<int64_t>(), s.at("queued").get<int64_t>(),
                        s.at("finished_at").is_null()
                            ? ""
                            : ", finished " + s.at("finished_at").get<std::string>());
  }
  return text;
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

int runBest(const std::string& path, int64_t studyId, bool asJson, bool provisional) {
  auto study = readStudy(path, studyId);
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
        !study->at("queue").is_null() ? "; workers are on it (kiln status shows its queue)"
        : study->at("running_pid").is_null()
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
  auto studyId = std::make_shared<int64_t>(0);
  sub->add_option("cache", *path,
                  "the tuning cache (--cache of kiln tune), or a PostgreSQL store (--store)")
      ->required();
  sub->add_option("--study", *studyId,
                  "a PostgreSQL store's study (default: its only one; with several and no "
                  "--study, every study in one line each)");
  sub->add_flag("--json", *asJson, "as one JSON object");
  return {sub, [path, asJson, studyId] {
            if (tune::pg::isUri(*path) && *studyId == 0) {
              // Several studies: list them; one: describe it.
              auto connection = tune::pg::connectStore(*path);
              if (!connection.isOk()) return reportError(connection.status());
              auto studies = tune::pg::listStudies(*connection);
              if (!studies.isOk()) return reportError(studies.status());
              if (studies->size() != 1) {
                auto text = studiesText(*path, *asJson);
                if (!text.isOk()) return reportError(text.status());
                std::fputs(text->c_str(), stdout);
                return 0;
              }
            }
            auto study = readStudy(*path, *studyId);
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
  auto studyId = std::make_shared<int64_t>(0);
  sub->add_option("cache", *path,
                  "the tuning cache (--cache of kiln tune), or a PostgreSQL store (--store)")
      ->required();
  sub->add_option("--study", *studyId, "a PostgreSQL store's study (default: its only one)");
  sub->add_flag("--json", *asJson, "the route with the decision (or the best so far) as JSON");
  sub->add_flag("--provisional", *provisional,
                "before the study decides: the fastest eligible route so far if its gain over "
                "the default is significant, else the default");
  sub->footer(
      "Exit codes: 0 a route was printed, 1 no decision yet (without --provisional) or "
      "no eligible route.");
  return {sub, [path, studyId, asJson, provisional] {
            return runBest(*path, *studyId, *asJson, *provisional);
          }};
}

}  // namespace kiln::cli
