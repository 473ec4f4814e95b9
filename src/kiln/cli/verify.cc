// `kiln verify best.manifest.json`: whether a tuned engine still wins and still passes on this
// machine (src/kiln/tune/verify.h).
#include "kiln/tune/verify.h"
#include "kiln/cli/commands.h"

namespace kiln::cli {

Command addVerifyCommand(CLI::App& app) {
  auto options = std::make_shared<tune::VerifyOptions>();
  CLI::App* sub = app.add_subcommand(
      "verify",
      "Check a tuned engine against its manifest on this machine: model, data and engine "
      "hashes, target and versions, accuracy again, and speed against a fresh default build");
  sub->add_option("manifest", options->manifest,
                  "NAME.manifest.json, written beside the engine by kiln tune --saveEngine")
      ->required();
  sub->add_option("--model", options->model,
                  "the model, where it is not at the manifest's path any more (its hash is "
                  "checked)");
  sub->add_option("--duration", options->durationS, "minimum seconds of interleaved timing")
      ->default_val(2.0)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--pairs", options->minPairs, "minimum interleaved pairs")
      ->default_val(30)
      ->check(CLI::PositiveNumber);
  sub->add_option("--warmUp", options->warmUpMs, "warm-up of both engines, ms")
      ->default_val(200)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--tolerance", options->tolerance,
                  "when the tuner kept the default route: the slowdown of the saved engine against "
                  "a fresh build of it (a fraction) below which it is not a regression")
      ->default_val(0.02)
      ->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--json", options->json, "print the checks and the verdict as JSON");
  sub->footer(
      "Exit codes: 0 the engine still wins and passes; 1 bad input or a file the manifest names "
      "is missing; 4 re-tune (the model, data or engine changed, the engine no longer loads, "
      "passes or wins).");
  return {sub, [options] {
            auto result = tune::runVerify(*options);
            if (!result.isOk()) return reportError(result.status());
            return *result;
          }};
}

}  // namespace kiln::cli
