// Route expressions: what the tuner searches. "-knob=[a|b|c]" varies a knob over the listed
// values, "-knob=*" over every allowed value, "-knob=[2..8]" over an integer range, and
// "-knob=value" pins it; per-node selection ("-knob@glob=[a|b]") varies like any other.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/knobs/route.h"

namespace kiln::knobs {

// One varied knob (optionally at a node selector) and the values it takes.
struct KnobAxis {
  std::string knob;
  std::string selector;             // empty: the whole graph
  std::vector<std::string> values;  // canonical, deduplicated, in the order written

  std::string label() const { return selector.empty() ? knob : knob + "@" + selector; }
};

struct RouteExpression {
  Route pinned;                // the fixed settings; every candidate starts from it
  std::vector<KnobAxis> axes;  // in the order written

  explicit RouteExpression(const KnobRegistry& registry = KnobRegistry::global())
      : pinned(registry) {}

  // The value an axis takes in the baseline route (pinned settings + defaults).
  std::string baselineValue(const KnobAxis& axis) const;
  // Number of routes of the full product, or an error when it exceeds `limit`.
  Result<uint64_t> fullCount(uint64_t limit) const;
};

// Parses an expression (tokens separated by whitespace; '#' comments; one token a line in a
// file). A knob varied or pinned twice is an error.
Result<RouteExpression> parseRouteExpression(std::string_view text,
                                             const KnobRegistry& registry = KnobRegistry::global());

// `base` with the axis set to `value` (globally, or for the axis's node selector).
Route withSetting(const Route& base, const KnobAxis& axis, const std::string& value);

// The baseline, then for each axis each of its values other than the baseline's, one knob
// changed at a time: 1 + Σ(nᵢ − 1) routes when every axis includes its baseline value.
std::vector<Route> expandFast(const RouteExpression& expression);

// The Cartesian product over `axes` (a subset of the expression's, or all), other knobs at the
// baseline; deterministic: the first axis varies slowest.
std::vector<Route> expandProduct(const RouteExpression& expression,
                                 const std::vector<KnobAxis>& axes);

}  // namespace kiln::knobs
