// What a study's store says, read without running anything: `kiln status` (where the study
// stands: its phases, the trials by status, the drift, the decision, whether a tuner is working
// on it now) and `kiln best` (the route it chose, or the best so far).
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"
#include "kiln/tune/store.h"

namespace kiln::tune {

// The pid a work folder's lock file holds (written by the tuner that locked it), or "unknown".
std::string lockHolder(int fd);

// The pid of the `kiln tune` working on the store at `cache` now (it holds the lock of the work
// folder `<cache>.d`), or nothing. Takes no lock and changes nothing.
std::optional<std::string> runningTuner(const std::filesystem::path& cache);

// The study in `store`, as JSON:
//   cache (where the store is), model {path, hash}, backend, search, expression, default_route,
//   created_at, finished_at (null while unfinished), running_pid (`running`: the pid of a
//   tuner holding a SQLite store's work folder, else null), queue (`queue`: a PostgreSQL
//   study's work queue, see pg::StudyStore::queueJson; null for SQLite),
//   phases: [{phase, routes (null: not planned yet), done}],
//   trials, by_status {status: count}, drift (null before the control trial),
//   best_so_far: {route, median_ms, speedup, significant} among eligible routes (null: none),
//   decision (null until the run decides).
// Phase totals are recomputed from the recorded expression and measurements exactly as the tuner
// plans them.
Result<nlohmann::json> describeStudy(const ResultStore& store,
                                     const std::optional<std::string>& running,
                                     const nlohmann::json& queue = nullptr);

// Human text for describeStudy's JSON.
std::string studyText(const nlohmann::json& study);

}  // namespace kiln::tune
