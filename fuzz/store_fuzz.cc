// libFuzzer harness: the tuning cache reader. The first byte picks the reader:
//   even: the rest is a SQLite file opened as a tuning cache (`kiln tune --cache`, `--continue`):
//         the schema and version checks, then every trial and comparison and the JSON lines export
//   odd:  the rest is one JSON record as the cache and `kiln cache export` hold them, read as a
//         trial and as a comparison; a record that reads must write back to one that reads the same
// The seeds are caches the tuner wrote and records exported from them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "kiln/tune/store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    std::filesystem::path path = kiln::fuzz::writeScratch(data + 1, size - 1, ".db");
    {
      auto store = kiln::tune::TuneStore::open(path);
      if (store.isOk()) {
        (void)store->trials();
        (void)store->comparisons();
        (void)store->exportJsonLines();
      }
    }
    for (const char* suffix : {"", "-journal", "-wal", "-shm"}) {
      std::filesystem::remove(path.string() + suffix);
    }
    return 0;
  }
  nlohmann::json record = nlohmann::json::parse(data + 1, data + size, nullptr,
                                                /*allow_exceptions=*/false);
  if (record.is_discarded()) return 0;
  auto trial = kiln::tune::trialFromJson(record);
  if (trial.isOk()) {
    auto again = kiln::tune::trialFromJson(kiln::tune::toJson(*trial));
    if (!again.isOk() || kiln::tune::toJson(*again) != kiln::tune::toJson(*trial)) std::abort();
  }
  auto comparison = kiln::tune::comparisonFromJson(record);
  if (comparison.isOk()) {
    auto again = kiln::tune::comparisonFromJson(kiln::tune::toJson(*comparison));
    if (!again.isOk() || kiln::tune::toJson(*again) != kiln::tune::toJson(*comparison)) {
      std::abort();
    }
  }
  return 0;
}
