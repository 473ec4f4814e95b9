// `kiln run`: load a model, feed inputs (from files or seeded random), run, save outputs.
#include "kiln/cli/commands.h"

namespace kiln::cli {

Command addRunCommand(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("run", "Run a model on the CPU");
  return {sub, [] { return 0; }};
}

}  // namespace kiln::cli
