// Build routes: one assignment of knob values, in trtexec's syntax
// ("-fusion.conv_act=off -cpu.threads=2"), extended with per-node selection
// ("-precision@encoder.*=fp32"). The canonical text (sorted, defaults left out) is what caches,
// engine headers and reports store.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"
#include "kiln/knobs/knob.h"

namespace kiln::knobs {

struct NodeSetting {
  std::string knob;
  std::string selector;  // fnmatch glob over node names
  std::string value;
};

class Route {
 public:
  // The default route: every knob at its default.
  explicit Route(const KnobRegistry& registry = KnobRegistry::global()) : registry_(&registry) {}

  // Parses space-separated "-knob=value" and "-knob@glob=value" tokens. Errors say what is
  // wrong: unknown knob (with "did you mean"), value not allowed (with the allowed set), a knob
  // given twice, per-node selection of a global knob, malformed token.
  static Result<Route> parse(std::string_view text,
                             const KnobRegistry& registry = KnobRegistry::global());

  Status set(const std::string& knob, const std::string& value);
  Status setForNodes(const std::string& knob, const std::string& selector,
                     const std::string& value);

  // The value in force for `knob` (at `node`, if given): a per-node setting whose selector
  // matches the node's name, else the global setting, else the default.
  const std::string& value(const Knob& knob, const ir::Node* node = nullptr) const;
  bool isOn(const Knob& knob, const ir::Node* node = nullptr) const;
  int64_t intValue(const Knob& knob, const ir::Node* node = nullptr) const;

  // Every per-node selector must match at least one node, and no node may match two selectors
  // of one knob that give it different values.
  Status checkSelectors(const ir::Graph& graph) const;

  // Sorted, defaults left out; "" for the default route.
  std::string canonicalText() const;
  // FNV-1a of the canonical text, as 16 hex digits: stable across runs and machines.
  std::string hash() const;

  const std::map<std::string, std::string>& globalSettings() const { return global_; }
  const std::vector<NodeSetting>& nodeSettings() const { return perNode_; }
  const KnobRegistry& registry() const { return *registry_; }

  bool operator==(const Route& other) const { return canonicalText() == other.canonicalText(); }

 private:
  const KnobRegistry* registry_;
  std::map<std::string, std::string> global_;  // canonical values, defaults included if set
  std::vector<NodeSetting> perNode_;
};

// Splits route text into tokens: whitespace separates them, and '#' starts a comment that runs
// to the end of the line (route files hold one token a line).
std::vector<std::string> tokenizeRouteText(std::string_view text);

// The knob's declaration, or an error naming the unknown knob with "did you mean".
Result<const KnobSpec*> findKnob(const KnobRegistry& registry, const std::string& knob);

// FNV-1a 64-bit hash as 16 hex digits.
std::string stableHash(std::string_view text);

}  // namespace kiln::knobs
