// Building: passes, then lowering.
#include "kiln/engine/builder.h"

#include <chrono>

#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/precision.h"
#endif
#include "kiln/ir/shape_inference.h"
#include "kiln/knobs/listing.h"
#include "kiln/reference/executor.h"

namespace kiln {

Status BuilderConfig::setBuildRoute(const std::string& route) {
  KILN_ASSIGN_OR_RETURN(knobs::Route parsed, knobs::Route::parse(route));
  route_ = std::move(parsed);
  return Status::ok();
}

namespace {

// Shape inference (an imported graph is typed already; a graph built through the API may not
// be, and plans size their buffers from the types), selector checks, then the pass pipeline.
Result<std::vector<passes::PassRecord>> optimise(ir::Graph& graph, const BuilderConfig& config,
                                                 const std::string& backend) {
  KILN_RETURN_IF_ERROR(ir::inferShapes(graph, reference::constantEvaluator()));
  KILN_RETURN_IF_ERROR(config.route().checkSelectors(graph));
  passes::PipelineOptions options = config.pipeline;
  options.backend = backend;
  return passes::runPipeline(graph, config.route(), options);
}

}  // namespace

Result<CpuBuild> buildCpu(ir::Graph graph, const BuilderConfig& config) {
  KILN_ASSIGN_OR_RETURN(std::vector<passes::PassRecord> records, optimise(graph, config, "cpu"));
  auto shared = std::make_shared<const ir::Graph>(std::move(graph));
  KILN_ASSIGN_OR_RETURN(cpu::Plan plan, cpu::lowerToCpu(shared, config.route()));
  return CpuBuild{std::move(plan), std::move(records)};
}

#if KILN_HAVE_CUDA
Result<CudaBuild> buildCuda(ir::Graph graph, const BuilderConfig& config) {
  KILN_ASSIGN_OR_RETURN(std::vector<passes::PassRecord> records, optimise(graph, config, "cuda"));
  // The CUDA backend's precision step (fp16/bf16 regions and the casts between them), recorded
  // beside the passes so --dump-ir and the build log show it.
  passes::PassRecord precision{.name = "cuda.assign_precision", .enabled = true};
  const auto started = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(precision.changes, cuda::assignPrecision(graph, config.route()));
  precision.milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  records.push_back(std::move(precision));
  auto shared = std::make_shared<const ir::Graph>(std::move(graph));
  KILN_ASSIGN_OR_RETURN(cuda::Plan plan, cuda::lowerToCuda(shared, config.route()));
  plan.setTimingCacheFile(config.timingCacheFile);
  return CudaBuild{std::move(plan), std::move(records)};
}
#endif

std::string allBuildRoutes(const std::string& backend) {
  return knobs::knobListing(knobs::KnobRegistry::global(), backend).dump(2);
}

}  // namespace kiln
