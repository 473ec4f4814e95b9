// The JSON knob listing.
#include "kiln/knobs/listing.h"

#include <algorithm>

namespace kiln::knobs {

namespace {
const char* kindName(KnobKind kind) {
  switch (kind) {
    case KnobKind::kBool:
      return "bool";
    case KnobKind::kEnum:
      return "enum";
    case KnobKind::kInt:
      return "int";
  }
  return "unknown";
}
}  // namespace

nlohmann::json knobListing(const KnobRegistry& registry, const std::string& backend) {
  nlohmann::json options = nlohmann::json::array();
  for (const auto& [name, spec] : registry.all()) {
    const bool applies =
        backend.empty() || spec.backends.empty() ||
        std::find(spec.backends.begin(), spec.backends.end(), backend) != spec.backends.end();
    if (!applies) continue;
    nlohmann::json entry = {
        {"option", name},
        {"allowed_values", spec.kind == KnobKind::kInt
                               ? nlohmann::json{{"min", spec.minValue}, {"max", spec.maxValue}}
                               : nlohmann::json(spec.allowedValues())},
        {"default_value", spec.defaultValue},
        {"help", spec.help},
        {"kind", kindName(spec.kind)},
        {"backends", spec.backends.empty() ? std::vector<std::string>{"all"} : spec.backends},
        {"scope", spec.perNode ? "per-node" : "global"},
        {"changes_numerics", spec.changesNumerics},
    };
    options.push_back(std::move(entry));
  }
  return {{"tuner_version", kTunerVersion}, {"tuner_options", options}};
}

}  // namespace kiln::knobs
