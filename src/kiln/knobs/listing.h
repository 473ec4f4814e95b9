// The knob listing of `kiln knobs --json` and of the public allBuildRoutes(): trtexec's shape
// ({"tuner_version", "tuner_options": [{"option", "allowed_values", "default_value", "help"}]})
// plus kiln's own fields.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "kiln/knobs/knob.h"

namespace kiln::knobs {

inline constexpr const char* kTunerVersion = "kiln-tuner-1";

// Every knob of `registry` that applies to `backend` ("" for all).
nlohmann::json knobListing(const KnobRegistry& registry, const std::string& backend);

// docs/knobs.md: every knob as a Markdown table, one section per area (the name's first part).
// A test keeps the checked-in file equal to this; `kiln knobs --markdown > docs/knobs.md`
// regenerates it.
std::string knobMarkdown(const KnobRegistry& registry);

}  // namespace kiln::knobs
