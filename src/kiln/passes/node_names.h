// Node names a pass hands out: the graph's names when the pass began, and each name taken since,
// so that nodes a pass adds get names no other node has.
#pragma once

#include <string>
#include <unordered_set>

#include "kiln/ir/graph.h"

namespace kiln::passes {

class NodeNames {
 public:
  explicit NodeNames(const ir::Graph& graph) {
    for (const auto& node : graph.nodes()) taken_.insert(node->name);
  }

  // `base`, or `base` + "_1", "_2", ... where that is taken; taken from now on.
  std::string take(const std::string& base) {
    std::string name = base;
    for (int i = 1; taken_.count(name); ++i) name = base + "_" + std::to_string(i);
    taken_.insert(name);
    return name;
  }

 private:
  std::unordered_set<std::string> taken_;
};

}  // namespace kiln::passes
