// The kiln command: one subcommand per file in src/kiln/cli/.
#include <CLI/CLI.hpp>

#include "kiln/cli/commands.h"

int main(int argc, char** argv) {
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
  for (const auto& command : commands) {
    if (command.subcommand->parsed()) return command.run();
  }
  return 2;
}
