// `kiln build model.onnx --saveEngine m.kiln`: import, optimise and lower once, and save the
// result as an engine file that `kiln run` loads without rebuilding.
#include <cstdio>

#include "kiln/base/file.h"
#include "kiln/cli/commands.h"
#include "kiln/engine/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"

namespace kiln::cli {

namespace {

struct BuildOptions {
  std::string model;
  std::string shapes;
  std::string route;
  std::string saveEngine;
  std::string dumpIrAfter;
};

}  // namespace

Result<onnx::ImportOptions> importOptionsFromShapes(const std::string& shapes) {
  onnx::ImportOptions options;
  if (!shapes.empty()) {
    KILN_ASSIGN_OR_RETURN(options.inputShapes, onnx::parseShapeSpec(shapes));
  }
  return options;
}

Result<BuilderConfig> builderConfigFromFlags(const std::string& route,
                                             const std::string& dumpIrAfter) {
  BuilderConfig config;
  KILN_RETURN_IF_ERROR(config.setBuildRoute(route));
  config.pipeline.dumpAfter = dumpIrAfter;
  config.pipeline.dump = [](const std::string& pass, const ir::Graph& graph) {
    std::printf("--- IR after %s ---\n%s", pass.c_str(), ir::printGraph(graph).c_str());
  };
  return config;
}

namespace {

int runBuild(const BuildOptions& options) {
  auto parsedShapes = importOptionsFromShapes(options.shapes);
  if (!parsedShapes.isOk()) return reportError(parsedShapes.status());
  onnx::ImportOptions importOptions = *parsedShapes;
  // The hash is of the bytes the build read, so it identifies the model an engine came from.
  auto bytes = readFileBytes(options.model);
  if (!bytes.isOk()) return reportError(bytes.status());
  auto model = onnx::importModel(options.model, importOptions);
  if (!model.isOk()) return reportError(model.status());

  EngineContents contents;
  contents.kilnVersion = std::string(kVersion);
  contents.modelHash = modelHashOf(*bytes);
  for (const ir::Value* input : model->graph.inputs) {
    contents.inputShapes[input->name] = input->shape.dims();
  }

  auto flags = builderConfigFromFlags(options.route, options.dumpIrAfter);
  if (!flags.isOk()) return reportError(flags.status());
  const BuilderConfig& config = *flags;
  auto built = buildCpu(std::move(model->graph), config);
  if (!built.isOk()) return reportError(built.status());
  contents.route = config.getBuildRoute();
  contents.plan = &built->plan;

  Status saved = saveEngine(options.saveEngine, contents);
  if (!saved.isOk()) return reportError(saved);
  std::printf("model: %s (%s)\n", options.model.c_str(), contents.modelHash.c_str());
  std::printf("route: %s\n", contents.route.empty() ? "(default)" : contents.route.c_str());
  std::printf("layers: %zu\n", built->plan.steps().size());
  std::printf("saved engine to %s\n", options.saveEngine.c_str());
  return 0;
}

}  // namespace

Command addBuildCommand(CLI::App& app) {
  auto options = std::make_shared<BuildOptions>();
  CLI::App* sub = app.add_subcommand("build", "Build a model into an engine file (CPU backend)");
  sub->add_option("model", options->model, "the .onnx file")->required();
  sub->add_option("--shapes", options->shapes,
                  "fix dynamic input shapes: name:1x3x224x224,name2:...");
  sub->add_option("--route", options->route,
                  "build route: space-separated -knob=value tokens (`kiln knobs` lists them)");
  sub->add_option("--saveEngine", options->saveEngine, "write the engine to this file (.kiln)")
      ->required();
  sub->add_option("--dump-ir-after", options->dumpIrAfter,
                  "print the IR after this pass (or 'all')");
  return {sub, [options] { return runBuild(*options); }};
}

}  // namespace kiln::cli
