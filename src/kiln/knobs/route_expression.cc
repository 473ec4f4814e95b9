// Route-expression parsing and expansion.
#include "kiln/knobs/route_expression.h"

#include <algorithm>
#include <set>

namespace kiln::knobs {

namespace {

Result<std::vector<std::string>> parseValues(const KnobSpec& spec, const std::string& text) {
  if (text == "*") return spec.allowedValues();
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') {
    return std::vector<std::string>{text};
  }
  const std::string inner = text.substr(1, text.size() - 2);
  std::vector<std::string> raw;
  const auto dots = inner.find("..");
  if (dots != std::string::npos && inner.find('|') == std::string::npos) {
    if (spec.kind != KnobKind::kInt) {
      return invalidInput("knob '{}' is not an integer knob; a range '{}' does not apply",
                          spec.name, text);
    }
    KILN_ASSIGN_OR_RETURN(std::string lo, spec.canonicalValue(inner.substr(0, dots)));
    KILN_ASSIGN_OR_RETURN(std::string hi, spec.canonicalValue(inner.substr(dots + 2)));
    if (std::stoll(lo) > std::stoll(hi)) {
      return invalidInput("knob '{}': range '{}' is empty", spec.name, text);
    }
    for (int64_t v = std::stoll(lo); v <= std::stoll(hi); ++v) raw.push_back(std::to_string(v));
    return raw;
  }
  size_t start = 0;
  while (true) {
    const auto bar = inner.find('|', start);
    raw.push_back(inner.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return raw;
}

}  // namespace

Route withSetting(const Route& base, const KnobAxis& axis, const std::string& value) {
  Route route = base;
  // The baseline cannot hold this axis (parseRouteExpression refuses a knob both pinned and
  // varied), so setting it cannot fail.
  Status status = axis.selector.empty() ? route.set(axis.knob, value)
                                        : route.setForNodes(axis.knob, axis.selector, value);
  KILN_CHECK(status.isOk());
  return route;
}

std::string RouteExpression::baselineValue(const KnobAxis& axis) const {
  // Per-node axes start from the knob's global value.
  return pinned.value(Knob(axis.knob));
}

Result<uint64_t> RouteExpression::fullCount(uint64_t limit) const {
  uint64_t count = 1;
  for (const auto& axis : axes) {
    if (__builtin_mul_overflow(count, axis.values.size(), &count) || count > limit) {
      return invalidInput("the full product of this expression has more than {} routes", limit);
    }
  }
  return count;
}

Result<RouteExpression> parseRouteExpression(std::string_view text, const KnobRegistry& registry) {
  RouteExpression expression(registry);
  std::set<std::string> seen;
  for (const std::string& token : tokenizeRouteText(text)) {
    const auto equals = token.find('=');
    if (token.size() < 2 || token[0] != '-' || equals == std::string::npos || equals == 1) {
      return invalidInput(
          "expression token '{}' must look like -knob=value, -knob=[a|b] or "
          "-knob=*",
          token);
    }
    const std::string label = token.substr(1, equals - 1);
    const std::string valueText = token.substr(equals + 1);
    const auto at = label.find('@');
    const std::string knob = label.substr(0, at);
    const std::string selector = at == std::string::npos ? "" : label.substr(at + 1);
    if (!seen.insert(label).second) return invalidInput("knob '{}' is given twice", label);
    const bool varied = valueText == "*" || (valueText.size() >= 2 && valueText.front() == '[');
    if (!varied) {
      Status status = selector.empty() ? expression.pinned.set(knob, valueText)
                                       : expression.pinned.setForNodes(knob, selector, valueText);
      if (!status.isOk()) return status;
      continue;
    }
    KILN_ASSIGN_OR_RETURN(const KnobSpec* spec, findKnob(registry, knob));
    if (!selector.empty() && !spec->perNode) {
      return invalidInput("knob '{}' applies to the whole graph and cannot be set per node (@{})",
                          knob, selector);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<std::string> raw, parseValues(*spec, valueText));
    KnobAxis axis{knob, selector, {}};
    for (const auto& value : raw) {
      KILN_ASSIGN_OR_RETURN(std::string canonical, spec->canonicalValue(value));
      if (std::find(axis.values.begin(), axis.values.end(), canonical) == axis.values.end()) {
        axis.values.push_back(canonical);
      }
    }
    expression.axes.push_back(std::move(axis));
  }
  return expression;
}

std::vector<Route> expandFast(const RouteExpression& expression) {
  std::vector<Route> routes{expression.pinned};
  std::set<std::string> seen{expression.pinned.canonicalText()};
  for (const auto& axis : expression.axes) {
    const std::string baseline = expression.baselineValue(axis);
    for (const auto& value : axis.values) {
      if (value == baseline) continue;
      Route route = withSetting(expression.pinned, axis, value);
      if (seen.insert(route.canonicalText()).second) routes.push_back(std::move(route));
    }
  }
  return routes;
}

std::vector<Route> expandProduct(const RouteExpression& expression,
                                 const std::vector<KnobAxis>& axes) {
  std::vector<Route> routes{expression.pinned};
  for (const auto& axis : axes) {
    std::vector<Route> next;
    for (const auto& route : routes) {
      for (const auto& value : axis.values) {
        // A per-node value equal to the baseline's is the baseline under another name: leave
        // the route as it is, as fast search does, so no route is built twice.
        if (!axis.selector.empty() && value == expression.baselineValue(axis)) {
          next.push_back(route);
        } else {
          next.push_back(withSetting(route, axis, value));
        }
      }
    }
    routes = std::move(next);
  }
  // Duplicates could only come from repeated values, removed at parse.
  return routes;
}

}  // namespace kiln::knobs
