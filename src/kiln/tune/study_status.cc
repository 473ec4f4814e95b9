#include "kiln/tune/study_status.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "kiln/knobs/route_expression.h"
#include "kiln/tune/report.h"
#include "kiln/tune/tuner.h"

namespace kiln::tune {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string lockHolder(int fd) {
  char holder[32] = {};
  const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
  return n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown";
}

std::optional<std::string> runningTuner(const fs::path& cache) {
  const fs::path lock = fs::path(cache.string() + ".d") / "lock";
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> pid;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    pid = lockHolder(fd);
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return pid;
}

namespace {

std::string headerText(const std::map<std::string, std::string>& header, const std::string& key) {
  auto it = header.find(key);
  return it == header.end() ? "" : it->second;
}

}  // namespace

Result<json> describeStudy(const ResultStore& store, const std::optional<std::string>& running,
                           const json& queue) {
  const auto& header = store.header();
  const json study = json::parse(headerText(header, "study"), nullptr, false);
  if (!study.is_object()) {
    return invalidInput("{}: the header has no readable study", store.where());
  }
  TuneOptions options;
  KILN_RETURN_IF_ERROR(options.restoreStudy(study).withContext(store.where()));
  KILN_ASSIGN_OR_RETURN(knobs::RouteExpression expression,
                        knobs::parseRouteExpression(options.expression));
  const std::string baseline = expression.pinned.canonicalText();
  KILN_ASSIGN_OR_RETURN(std::vector<TrialRecord> records, store.trials());

  auto find = [&](const std::string& route) -> const TrialRecord* {
    for (const auto& r : records) {
      if (r.route == route) return &r;
    }
    return nullptr;
  };
  const TrialRecord* base = find(baseline);

  // The drift, as the tuner computes it.
  const std::optional<double> drift = controlDrift(base, controlTrials(header));

  // The phases: phase one from the expression; mixed's phase two once phase one is complete,
  // planned from the measurements as the tuner plans it.
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> phaseOne,
                        firstPhaseRoutes(expression, options.search));
  size_t phaseOneDone = 0;
  for (const std::string& route : phaseOne) phaseOneDone += find(route) != nullptr;
  json phases = json::array({{{"phase", 1}, {"routes", phaseOne.size()}, {"done", phaseOneDone}}});
  if (options.search == SearchMode::kMixed) {
    size_t phaseTwoDone = 0;
    for (const auto& r : records) phaseTwoDone += r.phase == 2;
    json total = nullptr;
    if (phaseOneDone == phaseOne.size() && header.count("control")) {
      const SecondPhase plan = planSecondPhase(expression, records, drift.value_or(0.0),
                                               options.mixedMinGain, options.mixedMaxRoutes);
      total = plan.routes.size() + phaseTwoDone;
    }
    phases.push_back({{"phase", 2}, {"routes", total}, {"done", phaseTwoDone}});
  }

  std::map<std::string, int> byStatus;
  for (const auto& r : records) byStatus[trialStatusName(r.status)]++;

  // The fastest eligible route so far, and whether its gain over the default clears the noise.
  json best = nullptr;
  const TrialRecord* fastest = nullptr;
  for (const auto& r : records) {
    if (eligible(&r) && (!fastest || r.timing->summary.median < fastest->timing->summary.median)) {
      fastest = &r;
    }
  }
  if (fastest) {
    best = {{"route", fastest->route}, {"median_ms", fastest->timing->summary.median}};
    if (eligible(base)) {
      best["speedup"] = base->timing->summary.median / fastest->timing->summary.median;
      best["significant"] = fastest != base && significantlyFaster(*fastest->timing, *base->timing,
                                                                   drift.value_or(0.0));
    }
  }

  json decision = nullptr;
  if (header.count("decision")) {
    decision = json::parse(header.at("decision"), nullptr, false);
    if (decision.is_discarded()) decision = nullptr;
  }
  return json{
      {"cache", store.where()},
      {"model",
       {{"path", headerText(header, "model_path")}, {"hash", headerText(header, "model_hash")}}},
      {"backend", options.backend},
      {"search", searchModeName(options.search)},
      {"expression", options.expression},
      {"default_route", baseline},
      {"created_at", headerText(header, "created_at")},
      {"finished_at", header.count("finished_at") ? json(header.at("finished_at")) : json(nullptr)},
      {"running_pid", running ? json(*running) : json(nullptr)},
      {"queue", queue},
      {"phases", phases},
      {"trials", records.size()},
      {"by_status", byStatus},
      {"drift", drift ? json(*drift) : json(nullptr)},
      {"best_so_far", best},
      {"decision", decision}};
}

std::string studyText(const json& s) {
  // A SQLite cache is named by its file; a shared store's study by "<uri> study N".
  const std::string where = s.at("cache").get<std::string>();
  std::string text = s.value("queue", json(nullptr)).is_null() ? fmt::format("study {}\n", where)
                                                               : fmt::format("{}\n", where);
  text += fmt::format("  model {} ({})\n", s.at("model").at("path").get<std::string>(),
                      s.at("model").at("hash").get<std::string>());
  text += fmt::format("  {} search on {}: {}\n", s.at("search").get<std::string>(),
                      s.at("backend").get<std::string>(), s.at("expression").get<std::string>());
  text += fmt::format("  created {}", s.at("created_at").get<std::string>());
  if (!s.at("finished_at").is_null()) {
    text += fmt::format(", finished {}", s.at("finished_at").get<std::string>());
  }
  text += "\n";
  const json& queue = s.value("queue", json(nullptr));
  if (!queue.is_null()) {
    // A study in a PostgreSQL store: its work queue and the workers on it now.
    text += fmt::format(
        "  queue: {} queued, {} running, {} done, {} failed (a trial is claimed at most {} "
        "times)\n",
        queue.at("queued").get<int64_t>(), queue.at("running").get<int64_t>(),
        queue.at("done").get<int64_t>(), queue.at("failed").get<int64_t>(),
        queue.at("max_attempts").get<int64_t>());
    for (const json& item : queue.at("running_items")) {
      text +=
          fmt::format("    {} {} on worker {} (attempt {})\n", item.at("kind").get<std::string>(),
                      shown(item.at("route").get<std::string>()),
                      item.at("worker").get<std::string>(), item.at("attempts").get<int64_t>());
    }
    if (queue.at("target").is_null()) {
      text += "  target: not bound yet (the first worker to take a trial binds it)\n";
    }
  } else if (!s.at("running_pid").is_null()) {
    text +=
        fmt::format("  running now: kiln tune, pid {}\n", s.at("running_pid").get<std::string>());
  } else if (s.at("finished_at").is_null()) {
    text += "  not running, not finished: `kiln tune --continue --cache ...` goes on with it\n";
  }
  for (const json& phase : s.at("phases")) {
    if (phase.at("routes").is_null()) {
      text += fmt::format(
          "  phase {}: {} routes so far (planned when phase one and the control "
          "are done)\n",
          phase.at("phase").get<int>(), phase.at("done").get<size_t>());
    } else {
      text += fmt::format("  phase {}: {} of {} routes\n", phase.at("phase").get<int>(),
                          phase.at("done").get<size_t>(), phase.at("routes").get<size_t>());
    }
  }
  text += fmt::format("  {} trial{}:", s.at("trials").get<size_t>(),
                      s.at("trials").get<size_t>() == 1 ? "" : "s");
  for (const auto& [status, count] : s.at("by_status").items()) {
    text += fmt::format(" {} {}", count.get<int>(), status);
  }
  text += "\n";
  if (!s.at("drift").is_null()) {
    text += fmt::format("  drift {:.2f}% (the default measured again)\n",
                        100 * s.at("drift").get<double>());
  }
  const json& best = s.at("best_so_far");
  if (!best.is_null()) {
    text +=
        fmt::format("  fastest eligible so far: {}, median {:.4f} ms",
                    shown(best.at("route").get<std::string>()), best.at("median_ms").get<double>());
    if (best.contains("speedup")) {
      text += fmt::format(", {:.3f}x the default ({})", best.at("speedup").get<double>(),
                          best.at("significant").get<bool>() ? "significant" : "within the noise");
    }
    text += "\n";
  }
  const json& d = s.at("decision");
  if (d.is_null()) {
    text += "  decision: none yet\n";
  } else if (d.at("winner").is_null()) {
    text += fmt::format("  decision: no eligible route ({})\n", d.at("reason").get<std::string>());
  } else {
    text += fmt::format("  decision: {}{}\n    why: {}\n", shown(d.at("winner").get<std::string>()),
                        d.value("provisional", false) ? " (provisional)" : "",
                        d.at("reason").get<std::string>());
  }
  return text;
}

}  // namespace kiln::tune
