// The kiln command: one subcommand per file in src/kiln/cli/.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <new>

#include "kiln/cli/commands.h"

int main(int argc, char** argv) {
  // A write past a file size limit (ulimit -f) fails with EFBIG and is reported like a full disk,
  // instead of SIGXFSZ killing the process with a tuning cache half written.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"kiln: an ONNX inference compiler with a global performance tuner"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(kiln::cli::kVersion));
  std::vector<kiln::cli::Command> commands;
  commands.push_back(kiln::cli::addInspectCommand(app));
  commands.push_back(kiln::cli::addBuildCommand(app));
  commands.push_back(kiln::cli::addRunCommand(app));
  commands.push_back(kiln::cli::addKnobsCommand(app));
  commands.push_back(kiln::cli::addTuneCommand(app));
  commands.push_back(kiln::cli::addTrialCommand(app));
  commands.push_back(kiln::cli::addCacheCommand(app));
  commands.push_back(kiln::cli::addExplainCommand(app));
  commands.push_back(kiln::cli::addVerifyCommand(app));
  commands.push_back(kiln::cli::addStatusCommand(app));
  commands.push_back(kiln::cli::addBestCommand(app));
  commands.push_back(kiln::cli::addWorkerCommand(app));
  kiln::cli::setCommandLine(argc, argv);
  CLI11_PARSE(app, argc, argv);
  // Errors are Status values; what still throws is a failure to allocate (a model or input
  // larger than memory) or a bug. Either is reported as an error, not an abort with a core dump.
  try {
    for (const auto& command : commands) {
      if (command.subcommand->parsed()) return command.run();
    }
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: internal error: %s\n", error.what());
    return 1;
  }
  return 2;
}
