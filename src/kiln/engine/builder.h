// The public way to build: a BuilderConfig carries the build route (TensorRT's
// setBuildRoute/getBuildRoute), buildCpu runs the pass pipeline and lowers to a CPU plan.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/cpu/plan.h"
#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/plan.h"
#endif
#include "kiln/knobs/route.h"
#include "kiln/passes/pipeline.h"

namespace kiln {

class BuilderConfig {
 public:
  // Validates and sets the route ("-fusion.conv_act=off -cpu.threads=2"); on error the config
  // keeps its previous route.
  Status setBuildRoute(const std::string& route);
  // The route in canonical form (sorted, defaults left out; "" for the default route).
  std::string getBuildRoute() const { return route_.canonicalText(); }
  const knobs::Route& route() const { return route_; }

  passes::PipelineOptions pipeline;  // --dump-ir-after and its printer
  // CUDA: the timing cache file timed choices are read from and saved to (--timingCacheFile;
  // "" keeps them in the process only). cuda.timing_cache=off ignores it.
  std::filesystem::path timingCacheFile;

 private:
  knobs::Route route_;
};

struct CpuBuild {
  cpu::Plan plan;
  std::vector<passes::PassRecord> passes;
};

// Runs the pass pipeline on `graph` (consumed) and lowers it to a CPU plan.
Result<CpuBuild> buildCpu(ir::Graph graph, const BuilderConfig& config);

#if KILN_HAVE_CUDA
struct CudaBuild {
  cuda::Plan plan;
  std::vector<passes::PassRecord> passes;
};

// Runs the pass pipeline on `graph` (consumed) and lowers it to a CUDA plan. Touches no device:
// the plan makes its device resources on its first run.
Result<CudaBuild> buildCuda(ir::Graph graph, const BuilderConfig& config);
#endif

// Every knob with its allowed values, default and help, as JSON in trtexec's shape
// ({"tuner_version", "tuner_options": [...]}) plus kiln's fields; `backend` filters ("" = all).
std::string allBuildRoutes(const std::string& backend = "");

}  // namespace kiln
