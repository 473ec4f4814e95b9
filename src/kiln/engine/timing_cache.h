// The timing cache: what build-time timing decided, kept so that later builds skip the timing.
//
// A backend that times candidates for a layer (cuBLASLt algorithms, cuDNN engine configs) asks
// the cache first, under a key naming the problem completely (shapes, strides, types, alignment,
// epilogue, the candidate filter) and a device key naming the machine and the software the
// choice depends on (GPU, driver, library versions, kiln). On a hit it rebuilds the recorded
// choice without timing; on a miss it times, then records what won. Identical layers of one
// build therefore time once, and so do the routes of a tuning run that share a layer.
//
// A cache lives in memory for the process; with a file (`--timingCacheFile`) it is loaded from
// and saved to it. One file keeps a section per device key, so a file shared by different
// machines loses nothing: each reads and extends its own section. Saving merges with what the
// file holds by then (another build may have added entries) under an exclusive lock, and
// replaces the file atomically. A file that exists but is not a readable timing cache is an
// error naming it, and is left as it is.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"

namespace kiln {

// A field of a timing cache entry, or `fallback` where the field is missing or of another type.
// Entries come from a file a user may have edited: a choice that does not read is stale, and the
// layer is timed again, rather than a JSON type error ending the build.
int64_t entryInt(const nlohmann::json& entry, const char* key, int64_t fallback);
std::string entryString(const nlohmann::json& entry, const char* key);

class TimingCache {
 public:
  // The process's cache for `path` (one object per path; "" for the in-memory one). A file is
  // read on the first call for its path; a missing file is an empty cache.
  static Result<std::shared_ptr<TimingCache>> forFile(const std::filesystem::path& path);

  // Parses a timing cache file's text; `what` names it in errors. Every entry must be an object.
  static Result<std::map<std::string, std::map<std::string, nlohmann::json>>> parse(
      const std::string& text, const std::string& what);

  std::optional<nlohmann::json> find(const std::string& device, const std::string& key) const;
  void put(const std::string& device, const std::string& key, nlohmann::json value);
  // Drops an entry whose choice could not be rebuilt (it is timed again and replaced).
  void erase(const std::string& device, const std::string& key);

  // Writes the entries this process added, merged into the file's current contents (an in-memory
  // cache has nothing to write).
  Status save();

  const std::filesystem::path& path() const { return path_; }
  size_t size() const;

 private:
  explicit TimingCache(std::filesystem::path path) : path_(std::move(path)) {}

  std::filesystem::path path_;
  mutable std::mutex mutex_;
  std::map<std::string, std::map<std::string, nlohmann::json>> entries_;  // device -> key -> value
  std::map<std::string, std::map<std::string, nlohmann::json>> added_;    // not yet saved
};

}  // namespace kiln
