// `kiln knobs [--backend cpu] [--json | --markdown]`: every knob with its allowed values, default
// and help.
#include <cstdio>

#include "kiln/cli/commands.h"
#include "kiln/knobs/listing.h"

namespace kiln::cli {

namespace {

struct KnobsOptions {
  std::string backend;
  bool json = false;
  bool markdown = false;
};

int listKnobs(const KnobsOptions& options) {
  if (options.markdown) {
    std::printf("%s", knobs::knobMarkdown(knobs::KnobRegistry::global()).c_str());
    return 0;
  }
  const nlohmann::json listing = knobs::knobListing(knobs::KnobRegistry::global(), options.backend);
  if (options.json) {
    std::printf("%s\n", listing.dump(2).c_str());
    return 0;
  }
  for (const auto& option : listing["tuner_options"]) {
    const auto& spec = *knobs::KnobRegistry::global().find(option["option"]);
    std::printf("%-36s %-22s default %-8s %s%s%s\n", spec.name.c_str(), spec.allowedText().c_str(),
                spec.defaultValue.c_str(), spec.help.c_str(), spec.perNode ? " [per-node]" : "",
                spec.changesNumerics ? " [changes numerics]" : "");
  }
  return 0;
}

}  // namespace

Command addKnobsCommand(CLI::App& app) {
  auto options = std::make_shared<KnobsOptions>();
  CLI::App* sub = app.add_subcommand("knobs", "List every knob: allowed values, default, help");
  sub->add_option("--backend", options->backend, "only knobs that apply to this backend")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--json", options->json,
                "JSON in trtexec's tuner-options shape, plus kiln's fields");
  sub->add_flag("--markdown", options->markdown, "the Markdown table of docs/knobs.md");
  return {sub, [options] { return listKnobs(*options); }};
}

}  // namespace kiln::cli
