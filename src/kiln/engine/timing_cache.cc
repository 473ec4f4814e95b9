// The timing cache's file format and its process-wide instances (see timing_cache.h).
//
// {"format": "kiln timing cache", "version": 1,
//  "devices": {"<device key>": {"<problem key>": <the backend's record of its choice>, ...}}}
#include "kiln/engine/timing_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/base/file.h"

namespace kiln {

namespace {

using json = nlohmann::json;
using Sections = std::map<std::string, std::map<std::string, json>>;

constexpr const char* kFormat = "kiln timing cache";
constexpr int kVersion = 1;

// Holds an exclusive flock on `<cache>.lock` while a save merges and replaces the file.
class FileLock {
 public:
  static Result<FileLock> acquire(const std::filesystem::path& cache) {
    const std::filesystem::path path = cache.string() + ".lock";
    FileLock lock;
    lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock.fd_ < 0) {
      return ioError("cannot open the timing cache's lock {}: {}", path.string(),
                     std::strerror(errno));
    }
    while (::flock(lock.fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        return ioError("cannot lock {}: {}", path.string(), std::strerror(errno));
      }
    }
    return lock;
  }
  FileLock() = default;
  FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_ = -1;
};

Result<Sections> readFile(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return Sections{};
  KILN_ASSIGN_OR_RETURN(std::string text, readFileBytes(path));
  return TimingCache::parse(text, path.string());
}

}  // namespace

int64_t entryInt(const json& entry, const char* key, int64_t fallback) {
  if (!entry.is_object()) return fallback;
  auto it = entry.find(key);
  return it != entry.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

std::string entryString(const json& entry, const char* key) {
  if (!entry.is_object()) return {};
  auto it = entry.find(key);
  return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Result<Sections> TimingCache::parse(const std::string& text, const std::string& what) {
  json document;
  try {
    document = json::parse(text);
  } catch (const json::exception& e) {
    return invalidInput("the timing cache {} is not JSON ({}); remove it or name another file",
                        what, e.what());
  }
  if (!document.is_object() || document.value("format", "") != kFormat) {
    return invalidInput("{} is not a kiln timing cache (no \"format\": \"{}\")", what, kFormat);
  }
  if (!document.contains("version") || !document.at("version").is_number_integer() ||
      document.at("version").get<int>() != kVersion) {
    return invalidInput("the timing cache {} has version {}; this kiln reads version {}", what,
                        document.contains("version") ? document.at("version").dump() : "(none)",
                        kVersion);
  }
  if (!document.contains("devices") || !document.at("devices").is_object()) {
    return invalidInput("the timing cache {} has no \"devices\" object", what);
  }
  Sections sections;
  for (const auto& [device, entries] : document.at("devices").items()) {
    if (!entries.is_object()) {
      return invalidInput("the timing cache {}: the section of device '{}' is not an object", what,
                          device);
    }
    for (const auto& [key, value] : entries.items()) {
      if (!value.is_object()) {
        return invalidInput("the timing cache {}: entry '{}' of device '{}' is not an object", what,
                            key, device);
      }
      sections[device][key] = value;
    }
  }
  return sections;
}

Result<std::shared_ptr<TimingCache>> TimingCache::forFile(const std::filesystem::path& path) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<TimingCache>> caches;
  const std::string name = path.empty() ? "" : std::filesystem::absolute(path).string();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = caches.find(name);
  if (it != caches.end()) return it->second;
  std::shared_ptr<TimingCache> cache(new TimingCache(name));
  if (!name.empty()) {
    KILN_ASSIGN_OR_RETURN(cache->entries_, readFile(name));
  }
  caches.emplace(name, cache);
  return cache;
}

std::optional<json> TimingCache::find(const std::string& device, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto section = entries_.find(device);
  if (section == entries_.end()) return std::nullopt;
  auto entry = section->second.find(key);
  if (entry == section->second.end()) return std::nullopt;
  return entry->second;
}

void TimingCache::put(const std::string& device, const std::string& key, json value) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[device][key] = value;
  added_[device][key] = std::move(value);
}

void TimingCache::erase(const std::string& device, const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[device].erase(key);
  added_[device].erase(key);
}

size_t TimingCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t count = 0;
  for (const auto& [device, entries] : entries_) count += entries.size();
  return count;
}

Status TimingCache::save() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (path_.empty() || added_.empty()) return Status::ok();
  std::error_code error;
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), error);
  KILN_ASSIGN_OR_RETURN(FileLock fileLock, FileLock::acquire(path_));
  (void)fileLock;
  // What the file holds now (another process may have saved since this one read it), with this
  // process's entries over it; then everything known is this process's view too.
  KILN_ASSIGN_OR_RETURN(Sections merged, readFile(path_));
  for (const auto& [device, entries] : added_) {
    for (const auto& [key, value] : entries) merged[device][key] = value;
  }
  json devices = json::object();
  for (const auto& [device, entries] : merged) {
    json section = json::object();
    for (const auto& [key, value] : entries) section[key] = value;
    devices[device] = std::move(section);
  }
  const json document = {{"format", kFormat}, {"version", kVersion}, {"devices", devices}};
  KILN_RETURN_IF_ERROR(writeFileAtomically(path_, document.dump(1) + "\n")
                           .withContext(fmt::format("saving the timing cache {}", path_.string())));
  entries_ = std::move(merged);
  added_.clear();
  return Status::ok();
}

}  // namespace kiln
