// What a tuning run tells people: the decision and why, a summary for the terminal, the
// Markdown report (every route with status, time, loss and speedup) and the manifest that
// travels with the winning engine.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/tune/store.h"
#include "kiln/tune/timing.h"

namespace kiln::tune {

struct TuneOptions;

struct Decision {
  std::string baseline;                        // the study's default route (canonical)
  std::optional<std::string> winner;           // none: no route was eligible
  std::string reason;                          // why this route won (or the default stayed)
  std::optional<PairedComparison> comparison;  // the winner against the default, interleaved
  bool provisional = false;  // the run ended early (tuning timeout); --continue finishes it
  std::vector<std::string> notes;

  bool defaultWon() const { return winner && *winner == baseline; }
};

nlohmann::json decisionJson(const Decision& decision);

struct ReportInput {
  const TuneOptions* options = nullptr;
  const std::map<std::string, std::string>* header = nullptr;
  const std::vector<TrialRecord>* records = nullptr;
  const std::vector<ComparisonRecord>* comparisons = nullptr;
  const Decision* decision = nullptr;
  std::vector<std::string> secondPhaseKnobs;
  std::string secondPhaseNote;
  bool generatedReferences = false;
  double elapsedSeconds = 0;
  const TrialRecord* control = nullptr;  // the default route measured again after phase one
  double drift = 0;                      // the relative move of its median (a gain must clear it)
};

// A few lines for the terminal: counts by status, the winner, its speedup and the reason.
std::string summaryText(const ReportInput& input);

// The whole report as Markdown.
std::string markdownReport(const ReportInput& input);

// The whole report as one self-contained HTML page (no script, no network; charts as inline
// SVG): settings and target, the decision, every route's median with its interval, accuracy
// loss against speed with the threshold, the effect of each knob changed alone, the failures,
// and the finalist round. `--report` picks it for a file name ending in .html or .htm.
std::string htmlReport(const ReportInput& input);
bool isHtmlReportPath(const std::string& path);

// Shared by the reports.
std::string expressionTokens(const std::string& expression);  // a --tune-file's tokens, one line
std::string shown(const std::string& route);                  // "" is "(default)"
const TrialRecord* findRoute(const ReportInput& input, const std::string& route);
double worstLoss(const TrialRecord& record);  // over the outputs; NaN if any is NaN

// What a deployment needs to trust the winning engine (the caller adds the engine file entry).
nlohmann::json manifestJson(const ReportInput& input, const TrialRecord& winner,
                            const TrialRecord* baseline, const nlohmann::json& versions,
                            const nlohmann::json& target);

}  // namespace kiln::tune
