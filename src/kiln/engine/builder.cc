// Building: passes, then lowering.
#include "kiln/engine/builder.h"

#include "kiln/knobs/listing.h"

namespace kiln {

Status BuilderConfig::setBuildRoute(const std::string& route) {
  KILN_ASSIGN_OR_RETURN(knobs::Route parsed, knobs::Route::parse(route));
  route_ = std::move(parsed);
  return Status::ok();
}

Result<CpuBuild> buildCpu(ir::Graph graph, const BuilderConfig& config) {
  KILN_RETURN_IF_ERROR(config.route().checkSelectors(graph));
  KILN_ASSIGN_OR_RETURN(std::vector<passes::PassRecord> records,
                        passes::runPipeline(graph, config.route(), config.pipeline));
  auto shared = std::make_shared<const ir::Graph>(std::move(graph));
  KILN_ASSIGN_OR_RETURN(cpu::Plan plan, cpu::lowerToCpu(shared, config.route()));
  return CpuBuild{std::move(plan), std::move(records)};
}

std::string allBuildRoutes(const std::string& backend) {
  return knobs::knobListing(knobs::KnobRegistry::global(), backend).dump(2);
}

}  // namespace kiln
