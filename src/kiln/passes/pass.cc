// The one gate every pass runs through.
#include "kiln/passes/pass.h"

#include <chrono>

#include "kiln/ir/shape_inference.h"

namespace kiln::passes {

Result<PassRecord> runPass(const PassInfo& pass, ir::Graph& graph, const knobs::Route& route,
                           const std::string& backend) {
  PassRecord record;
  record.name = pass.name;
  record.enabled = pass.enable == nullptr || route.isOn(*pass.enable);
  if (!record.enabled) return record;
  const auto start = std::chrono::steady_clock::now();
  PassContext context{route, record.changes, backend};
  Status status = pass.run(graph, context);
  if (!status.isOk()) return status.withContext(fmt::format("pass {}", pass.name));
  if (!record.changes.empty()) {
    graph.removeUnusedValues();
    Status verified = graph.verify();
    if (verified.isOk()) verified = ir::inferShapes(graph, nullptr);
    if (!verified.isOk()) {
      return internalError("pass {} left a broken graph: {}", pass.name, verified.message());
    }
  }
  record.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return record;
}

}  // namespace kiln::passes
