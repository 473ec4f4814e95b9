// The subcommands of `kiln`; each file in src/kiln/cli/ adds one.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string_view>

#include "kiln/base/status.h"
#include "kiln/base/version.h"
#include "kiln/engine/builder.h"
#include "kiln/onnx/import.h"

namespace kiln::cli {

inline constexpr std::string_view kVersion = kKilnVersion;

struct Command {
  CLI::App* subcommand;
  std::function<int()> run;  // returns the process exit code
};

Command addInspectCommand(CLI::App& app);
Command addBuildCommand(CLI::App& app);
Command addRunCommand(CLI::App& app);
Command addKnobsCommand(CLI::App& app);
Command addTuneCommand(CLI::App& app);
Command addTrialCommand(CLI::App& app);
Command addCacheCommand(CLI::App& app);
Command addExplainCommand(CLI::App& app);
Command addVerifyCommand(CLI::App& app);
Command addStatusCommand(CLI::App& app);
Command addBestCommand(CLI::App& app);
Command addWorkerCommand(CLI::App& app);

// The command line as the user typed it (set by main), recorded in tuning caches.
const std::string& commandLine();
void setCommandLine(int argc, char** argv);

// The flags the building commands share. --shapes becomes import options; --route and
// --dump-ir-after a BuilderConfig that prints the IR to stdout after the named pass.
Result<onnx::ImportOptions> importOptionsFromShapes(const std::string& shapes);
Result<BuilderConfig> builderConfigFromFlags(const std::string& route,
                                             const std::string& dumpIrAfter);

// Prints "kiln: error: <message>" to stderr and returns the exit code for the status: 1 for
// errors in the user's input, 3 for internal errors.
int reportError(const Status& status);

}  // namespace kiln::cli
