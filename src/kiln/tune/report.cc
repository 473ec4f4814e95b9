// The terminal summary, the Markdown report and the manifest of a tuning run.
#include "kiln/tune/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "kiln/tune/tuner.h"

namespace kiln::tune {

using json = nlohmann::json;

std::string expressionTokens(const std::string& expression) {
  std::string tokens;
  std::istringstream lines(expression);
  for (std::string line; std::getline(lines, line);) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    for (std::string word; words >> word;) tokens += (tokens.empty() ? "" : " ") + word;
  }
  return tokens;
}

std::string shown(const std::string& route) { return route.empty() ? "(default)" : route; }

const TrialRecord* findRoute(const ReportInput& input, const std::string& route) {
  for (const auto& record : *input.records) {
    if (record.route == route) return &record;
  }
  return nullptr;
}

double worstLoss(const TrialRecord& record) {
  double worst = 0;
  for (const auto& a : record.accuracy) {
    if (std::isnan(a.loss) || a.loss > worst) worst = a.loss;
  }
  return worst;
}

namespace {

// Markdown table cells may not hold '|' or newlines.
std::string cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

json timingJson(const TrialTiming& t) {
  return {{"count", t.summary.count},
          {"min_ms", t.summary.min},
          {"median_ms", t.summary.median},
          {"mean_ms", t.summary.mean},
          {"p90_ms", t.summary.p90},
          {"max_ms", t.summary.max},
          {"median_ci_ms", {t.ciLow, t.ciHigh}},
          {"confidence", t.confidence}};
}

}  // namespace

json decisionJson(const Decision& d) {
  json j = {{"winner", d.winner ? json(*d.winner) : json(nullptr)},
            {"default_won", d.defaultWon()},
            {"reason", d.reason},
            {"provisional", d.provisional},
            {"notes", d.notes}};
  if (d.comparison) {
    j["speedup"] = {{"median", d.comparison->speedup()},
                    {"low", d.comparison->speedupLow()},
                    {"high", d.comparison->speedupHigh()},
                    {"pairs", d.comparison->pairs},
                    {"confidence", d.comparison->confidence}};
  }
  return j;
}

std::string summaryText(const ReportInput& input) {
  const Decision& d = *input.decision;
  std::map<std::string, int> byStatus;
  for (const auto& record : *input.records) byStatus[trialStatusName(record.status)]++;
  std::string text =
      fmt::format("{} trials in {:.1f} s:", input.records->size(), input.elapsedSeconds);
  for (const auto& [status, count] : byStatus) text += fmt::format(" {} {}", count, status);
  text += "\n";
  for (const auto& record : *input.records) {
    if (record.status != TrialStatus::kOk) {
      text += fmt::format("  excluded {}: {}: {}\n", shown(record.route),
                          trialStatusName(record.status), record.message);
    }
  }
  if (!d.winner) {
    text += "no winner: " + d.reason + "\n";
    return text;
  }
  const TrialRecord* winner = findRoute(input, *d.winner);
  text += fmt::format("winner: {}{}{}\n", shown(*d.winner),
                      d.defaultWon() ? " (the default route)" : "",
                      d.provisional ? " (provisional)" : "");
  if (winner && winner->timing) {
    text += fmt::format("  median {:.4f} ms [{:.4f}, {:.4f}]", winner->timing->summary.median,
                        winner->timing->ciLow, winner->timing->ciHigh);
    if (d.comparison) {
      text += fmt::format(", {:.3f}x the default [{:.3f}, {:.3f}]", d.comparison->speedup(),
                          d.comparison->speedupLow(), d.comparison->speedupHigh());
    }
    text += "\n";
  }
  text += "  why: " + d.reason + "\n";
  for (const auto& note : d.notes) text += "  note: " + note + "\n";
  return text;
}

std::string markdownReport(const ReportInput& input) {
  const TuneOptions& o = *input.options;
  const Decision& d = *input.decision;
  auto header = [&](const std::string& key) {
    auto it = input.header->find(key);
    return it == input.header->end() ? std::string() : it->second;
  };
  std::string md = "# kiln tuning report\n\n";
  md += fmt::format("- model: `{}` ({})\n", header("model_path"), header("model_hash"));
  if (!o.shapes.empty()) md += fmt::format("- shapes: `{}`\n", o.shapes);
  md += fmt::format("- search: {} over `{}`\n", searchModeName(o.search),
                    expressionTokens(o.expression));
  md += fmt::format("- default route: `{}`\n", shown(d.baseline));
  md += fmt::format("- accuracy: {} per output, threshold {}", metricName(o.accuracy.metric),
                    o.accuracy.threshold);
  for (const auto& [name, threshold] : o.accuracy.perOutput) {
    md += fmt::format(", `{}` {}", name, threshold);
  }
  if (o.accuracy.metric == Metric::kL0) {
    md += fmt::format(" (atol {}, rtol {})", o.accuracy.atol, o.accuracy.rtol);
  }
  md += fmt::format("; references {}\n", input.generatedReferences
                                             ? "**generated** by kiln's reference executor on "
                                               "seeded inputs (none were given)"
                                             : "given by the user");
  md += fmt::format(
      "- timing per trial: {:.0f} ms warm-up, then at least {} runs and {} s; "
      "medians with their {:.0f}% order-statistic interval\n",
      o.timing.warmUpMs, o.timing.minIterations, o.timing.minSeconds, 95.0);
  if (input.control && input.control->timing) {
    md += fmt::format(
        "- control: the default route timed again after phase one, median {:.4f} ms: drift "
        "{:.2f}% between trials, a margin every gain must clear as well as the intervals\n",
        input.control->timing->summary.median, 100 * input.drift);
  } else if (input.control) {
    md +=
        fmt::format("- control: the default route's second trial failed ({}), so no drift margin\n",
                    input.control->message);
  }
  md += fmt::format("- target: `{}`\n", header("target"));
  md += fmt::format("- command: `{}`\n", header("command_line"));
  md += fmt::format("- started {}; {} trials; this pass took {:.1f} s\n\n", header("created_at"),
                    input.records->size(), input.elapsedSeconds);

  md += "## Decision\n\n";
  if (!d.winner) {
    md += "No winner: " + d.reason + "\n\n";
  } else {
    md += fmt::format("**{}**{}{}\n\n", shown(*d.winner),
                      d.defaultWon() ? " (the default route)" : "",
                      d.provisional ? " — provisional" : "");
    md += "Why: " + d.reason + ".\n\n";
    if (d.comparison) {
      md += fmt::format(
          "Speedup over the default: **{:.3f}x** ({:.0f}% interval {:.3f}–{:.3f}, "
          "{} interleaved pairs).\n\n",
          d.comparison->speedup(), d.comparison->confidence * 100, d.comparison->speedupLow(),
          d.comparison->speedupHigh(), d.comparison->pairs);
    }
  }
  for (const auto& note : d.notes) md += "Note: " + note + ".\n\n";

  const TrialRecord* base = findRoute(input, d.baseline);
  const bool baseOk = base && base->status == TrialStatus::kOk && base->timing;
  md += "## Routes\n\n";
  md +=
      "| # | phase | route | status | median ms [95% interval] | speedup vs default | worst "
      "loss | build s | note |\n|---|---|---|---|---|---|---|---|---|\n";
  std::vector<const TrialRecord*> sorted;
  for (const auto& record : *input.records) sorted.push_back(&record);
  std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    const bool aTimed = a->status == TrialStatus::kOk && a->timing;
    const bool bTimed = b->status == TrialStatus::kOk && b->timing;
    if (aTimed != bTimed) return aTimed;
    return aTimed && a->timing->summary.median < b->timing->summary.median;
  });
  for (const TrialRecord* r : sorted) {
    std::string time = "—", speedup = "—", loss = "—";
    if (r->timing) {
      time = fmt::format("{:.4f} [{:.4f}, {:.4f}]", r->timing->summary.median, r->timing->ciLow,
                         r->timing->ciHigh);
      if (baseOk && r->route != d.baseline) {
        speedup = fmt::format(
            "{:.3f}x{}", base->timing->summary.median / r->timing->summary.median,
            significantlyFaster(*r->timing, *base->timing, input.drift) ? " (significant)" : "");
      }
    }
    if (!r->accuracy.empty()) loss = fmt::format("{:.3g}", worstLoss(*r));
    std::string note = r->message;
    if (d.winner && r->route == *d.winner) note = "**winner**" + (note.empty() ? "" : "; " + note);
    const std::string build = r->buildMs > 0 ? fmt::format("{:.2f}", r->buildMs / 1000) : "—";
    md += fmt::format("| {} | {} | `{}` | {} | {} | {} | {} | {} | {} |\n", r->iteration, r->phase,
                      cell(shown(r->route)), trialStatusName(r->status), time, speedup, loss, build,
                      cell(note));
  }
  md += "\n";
  if (o.search == SearchMode::kMixed) {
    md += "## Mixed search, phase two\n\n";
    md += input.secondPhaseKnobs.empty()
              ? "No knobs were combined"
              : fmt::format("Combined: `{}`", fmt::join(input.secondPhaseKnobs, "` `"));
    md += input.secondPhaseNote.empty() ? ".\n\n" : " (" + input.secondPhaseNote + ").\n\n";
  }
  if (!input.comparisons->empty()) {
    md += "## Finalists, re-measured interleaved with the default\n\n";
    md += "| route | pairs | speedup [interval] | significant |\n|---|---|---|---|\n";
    for (const auto& c : *input.comparisons) {
      md += fmt::format("| `{}` | {} | {:.3f}x [{:.3f}, {:.3f}] | {} |\n", cell(shown(c.route)),
                        c.comparison.pairs, c.comparison.speedup(), c.comparison.speedupLow(),
                        c.comparison.speedupHigh(),
                        c.comparison.significantlyFaster() ? "yes" : "no");
    }
    md += "\n";
  }
  return md;
}

json manifestJson(const ReportInput& input, const TrialRecord& winner, const TrialRecord* baseline,
                  const json& versions, const json& target) {
  const TuneOptions& o = *input.options;
  auto header = [&](const std::string& key) {
    auto it = input.header->find(key);
    return it == input.header->end() ? std::string() : it->second;
  };
  json data = json::parse(header("data"), nullptr, false);
  json manifest = {
      {"format", "kiln tuning manifest 1"},
      {"model", {{"path", header("model_path")}, {"hash", header("model_hash")}}},
      {"shapes", o.shapes},
      {"data", data.is_discarded() ? json(nullptr) : data},
      {"references_generated", input.generatedReferences},
      {"accuracy",
       {{"metric", metricName(o.accuracy.metric)},
        {"threshold", o.accuracy.threshold},
        {"per_output", o.accuracy.perOutput},
        {"atol", o.accuracy.atol},
        {"rtol", o.accuracy.rtol}}},
      {"search", {{"mode", searchModeName(o.search)}, {"expression", o.expression}}},
      {"command_line", header("command_line")},
      {"versions", versions},
      {"target", target},
      {"route", winner.route},
      {"default_route", input.decision->baseline},
      {"decision", decisionJson(*input.decision)},
      {"accuracy_loss", json::array()},
  };
  for (const auto& a : winner.accuracy) {
    manifest["accuracy_loss"].push_back(
        {{"output", a.output},
         {"loss", std::isfinite(a.loss) ? json(a.loss) : json("non-finite")},
         {"threshold", a.threshold}});
  }
  if (winner.timing) manifest["statistics"] = timingJson(*winner.timing);
  if (baseline && baseline->timing) manifest["default_statistics"] = timingJson(*baseline->timing);
  return manifest;
}

}  // namespace kiln::tune
