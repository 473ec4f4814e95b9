// `kiln inspect model.onnx`: inputs, outputs, opsets, op histogram, parameter count.
#include <cstdio>
#include <map>

#include "kiln/cli/commands.h"
#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"

namespace kiln::cli {

namespace {

struct InspectOptions {
  std::string model;
  std::string shapes;
  bool printIr = false;
};

int runInspect(const InspectOptions& options) {
  onnx::ImportOptions importOptions;
  if (!options.shapes.empty()) {
    auto shapes = onnx::parseShapeSpec(options.shapes);
    if (!shapes.isOk()) return reportError(shapes.status());
    importOptions.inputShapes = *shapes;
  }
  auto model = onnx::importModel(options.model, importOptions);
  std::string inferenceNote;
  if (!model.isOk()) {
    // Still describe what the file holds when kiln cannot type it (e.g. an unsupported op).
    importOptions.inferShapes = false;
    auto untyped = onnx::importModel(options.model, importOptions);
    if (!untyped.isOk()) return reportError(model.status());
    inferenceNote = model.status().message();
    model = std::move(untyped);
  }
  const ir::Graph& graph = model->graph;
  const onnx::ModelInfo& info = model->info;
  std::printf("model: %s\n", options.model.c_str());
  std::printf("ir_version: %lld\n", static_cast<long long>(info.irVersion));
  std::printf("producer: %s %s\n", info.producerName.c_str(), info.producerVersion.c_str());
  for (const auto& [domain, version] : info.opsetImports) {
    std::printf("opset: %s %lld\n", domain.empty() ? "ai.onnx" : domain.c_str(),
                static_cast<long long>(version));
  }
  std::printf("inputs:\n");
  for (const ir::Value* input : graph.inputs) {
    std::printf("  %s\n", ir::describeValue(*input).c_str());
  }
  std::printf("outputs:\n");
  for (const ir::Value* output : graph.outputs) {
    std::printf("  %s\n", ir::describeValue(*output).c_str());
  }
  std::map<std::string, int> histogram;
  for (const auto& node : graph.nodes()) ++histogram[node->opType];
  std::printf("nodes: %zu\n", graph.nodes().size());
  for (const auto& [op, count] : histogram) std::printf("  %-24s %d\n", op.c_str(), count);
  std::printf("parameters: %lld\n", static_cast<long long>(graph.parameterCount()));
  if (!inferenceNote.empty()) {
    std::printf("shape inference failed: %s\n", inferenceNote.c_str());
  }
  if (options.printIr) std::printf("\n%s", ir::printGraph(graph).c_str());
  return 0;
}

}  // namespace

Command addInspectCommand(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe an ONNX model");
  sub->add_option("model", options->model, "the .onnx file")->required();
  sub->add_option("--shapes", options->shapes,
                  "fix dynamic input shapes: name:1x3x224x224,name2:...");
  sub->add_flag("--ir", options->printIr, "print the graph as kiln IR text");
  return {sub, [options] { return runInspect(*options); }};
}

int reportError(const Status& status) {
  std::fprintf(stderr, "kiln: error: %s\n", status.message().c_str());
  return status.code() == StatusCode::kInternal ? 3 : 1;
}

}  // namespace kiln::cli
