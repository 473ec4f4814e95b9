// `kiln verify best.manifest.json`: whether a tuned CPU engine still holds on this machine. It
// checks the model, the data and the engine against the hashes the manifest recorded, compares
// the target and the library versions with the tuning run's, runs the engine on the recorded
// input sets and holds its outputs to the recorded accuracy settings again, and re-measures it
// interleaved with a fresh build of the study's default route. The verdict says plainly whether
// the engine still wins and still passes, or has regressed and should be re-tuned.
#pragma once

#include <filesystem>
#include <string>

#include "kiln/base/status.h"

namespace kiln::tune {

struct VerifyOptions {
  std::filesystem::path manifest;
  std::string model;  // overrides the manifest's model path (a model moved since)
  double durationS = 2.0;
  int minPairs = 30;
  double warmUpMs = 200;
  // When the tuner kept the default route, the saved engine and a fresh build of it are the same
  // plan: only a slowdown beyond this fraction (and significant) is called a regression, so two
  // equal engines are not sent to re-tuning by timing noise or the order they ran in.
  double tolerance = 0.02;
  bool json = false;  // the checks and the verdict as JSON on stdout
};

// Exit codes of `kiln verify` beyond 0 (the engine still wins and passes) and 1 (bad input: an
// unreadable manifest, a missing file).
inline constexpr int kVerifyExitRegressed = 4;  // re-tune: it no longer wins, passes or applies

Result<int> runVerify(const VerifyOptions& options);

}  // namespace kiln::tune
