// Route parsing, validation, per-node resolution and canonical text.
#include "kiln/knobs/route.h"

#include <fnmatch.h>

#include <algorithm>
#include <set>

namespace kiln::knobs {

std::vector<std::string> tokenizeRouteText(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  bool comment = false;
  for (char c : text) {
    if (c == '\n') comment = false;
    if (comment) continue;
    if (c == '#') {
      comment = true;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
      continue;
    }
    current.push_back(c);
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

std::string stableHash(std::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : text) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", hash);
}

Result<const KnobSpec*> findKnob(const KnobRegistry& registry, const std::string& knob) {
  if (const KnobSpec* spec = registry.find(knob)) return spec;
  const auto suggestions = registry.suggestions(knob);
  if (suggestions.empty()) {
    return invalidInput("unknown knob '{}' (`kiln knobs` lists them)", knob);
  }
  return invalidInput("unknown knob '{}'; did you mean '{}'?", knob,
                      fmt::join(suggestions, "', '"));
}

Status Route::set(const std::string& knob, const std::string& value) {
  KILN_ASSIGN_OR_RETURN(const KnobSpec* spec, findKnob(*registry_, knob));
  if (global_.count(knob)) return invalidInput("knob '{}' is given twice", knob);
  KILN_ASSIGN_OR_RETURN(std::string canonical, spec->canonicalValue(value));
  global_[knob] = canonical;
  return Status::ok();
}

Status Route::setForNodes(const std::string& knob, const std::string& selector,
                          const std::string& value) {
  KILN_ASSIGN_OR_RETURN(const KnobSpec* spec, findKnob(*registry_, knob));
  if (!spec->perNode) {
    return invalidInput(
        "knob '{}' applies to the whole graph and cannot be set per node "
        "(@{})",
        knob, selector);
  }
  if (selector.empty()) return invalidInput("knob '{}': empty node selector after '@'", knob);
  for (const auto& setting : perNode_) {
    if (setting.knob == knob && setting.selector == selector) {
      return invalidInput("knob '{}@{}' is given twice", knob, selector);
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string canonical, spec->canonicalValue(value));
  perNode_.push_back({knob, selector, canonical});
  return Status::ok();
}

Result<Route> Route::parse(std::string_view text, const KnobRegistry& registry) {
  Route route(registry);
  for (const std::string& token : tokenizeRouteText(text)) {
    const auto equals = token.find('=');
    if (token.size() < 2 || token[0] != '-' || equals == std::string::npos || equals == 1) {
      return invalidInput("route token '{}' must look like -knob=value or -knob@nodes=value",
                          token);
    }
    std::string name = token.substr(1, equals - 1);
    const std::string value = token.substr(equals + 1);
    const auto at = name.find('@');
    Status status = at == std::string::npos
                        ? route.set(name, value)
                        : route.setForNodes(name.substr(0, at), name.substr(at + 1), value);
    if (!status.isOk()) return status;
  }
  return route;
}

const std::string& Route::value(const Knob& knob, const ir::Node* node) const {
  if (node) {
    for (const auto& setting : perNode_) {
      if (setting.knob == knob.name() &&
          fnmatch(setting.selector.c_str(), node->name.c_str(), 0) == 0) {
        return setting.value;
      }
    }
  }
  auto it = global_.find(knob.name());
  if (it != global_.end()) return it->second;
  const KnobSpec* spec = registry_->find(knob.name());
  KILN_CHECK(spec != nullptr && "a Knob handle names a declared knob");
  return spec->defaultValue;
}

bool Route::isOn(const Knob& knob, const ir::Node* node) const { return value(knob, node) == "on"; }

int64_t Route::intValue(const Knob& knob, const ir::Node* node) const {
  return std::stoll(value(knob, node));
}

Status Route::checkSelectors(const ir::Graph& graph) const {
  for (const auto& setting : perNode_) {
    bool matched = false;
    for (const auto& node : graph.nodes()) {
      if (fnmatch(setting.selector.c_str(), node->name.c_str(), 0) != 0) continue;
      matched = true;
      for (const auto& other : perNode_) {
        if (&other == &setting || other.knob != setting.knob || other.value == setting.value) {
          continue;
        }
        if (fnmatch(other.selector.c_str(), node->name.c_str(), 0) == 0) {
          return invalidInput("node '{}' matches both -{}@{}={} and -{}@{}={}", node->name,
                              setting.knob, setting.selector, setting.value, other.knob,
                              other.selector, other.value);
        }
      }
    }
    if (!matched) {
      return invalidInput("-{}@{}: the selector matches no node of the graph", setting.knob,
                          setting.selector);
    }
  }
  return Status::ok();
}

std::string Route::canonicalText() const {
  std::vector<std::string> tokens;
  for (const auto& [knob, value] : global_) {
    if (value != registry_->find(knob)->defaultValue) tokens.push_back("-" + knob + "=" + value);
  }
  for (const auto& setting : perNode_) {
    tokens.push_back("-" + setting.knob + "@" + setting.selector + "=" + setting.value);
  }
  std::sort(tokens.begin(), tokens.end());
  return fmt::format("{}", fmt::join(tokens, " "));
}

std::string Route::hash() const { return stableHash(canonicalText()); }

}  // namespace kiln::knobs
