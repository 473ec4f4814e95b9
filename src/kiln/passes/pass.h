// A graph pass: a free function over ir::Graph, gated by a knob declared beside it, run through
// one gate (runPass) that skips it when its knob is off, times it, logs what it changed and
// checks the graph's invariants afterwards.
#pragma once

#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"
#include "kiln/knobs/route.h"

namespace kiln::passes {

// What a pass sees besides the graph: the route (for per-node knobs) and a log of changes.
struct PassContext {
  const knobs::Route& route;
  std::vector<std::string>& changes;  // one line per rewrite: "folded bn1 into conv1"
  // The backend the graph is built for ("cpu" or "cuda"): knobs whose best value depends on it
  // (graph.layout=auto) read it.
  std::string backend = "cpu";

  template <typename... Args>
  void note(fmt::format_string<Args...> format, Args&&... args) {
    changes.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
};

using PassFn = Status (*)(ir::Graph& graph, PassContext& context);

struct PassInfo {
  const char* name;  // "fold_constants": what --dump-ir-after names
  // The bool knob that turns it on or off; null for a pass that always runs and reads its own
  // (non-bool) knobs to decide what to change, like layout_nhwc with graph.layout.
  const knobs::Knob* enable;
  PassFn run;
};

struct PassRecord {
  std::string name;
  bool enabled = false;
  double milliseconds = 0;
  std::vector<std::string> changes;
};

// Runs one pass through the gate. After a pass that changed the graph, types are re-inferred
// and the graph's invariants checked, so a broken rewrite is caught where it happens.
Result<PassRecord> runPass(const PassInfo& pass, ir::Graph& graph, const knobs::Route& route,
                           const std::string& backend = "cpu");

}  // namespace kiln::passes
