// `kiln inspect model.onnx`: inputs, outputs, opsets, op histogram, parameter count; for an
// engine file, its header, route and per-layer decisions.
#include <cstdio>
#include <map>

#include "kiln/cli/commands.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/work.h"
#include "kiln/onnx/import.h"

namespace kiln::cli {

namespace {

struct InspectOptions {
  std::string model;
  std::string shapes;
  bool printIr = false;
};

int inspectEngine(const InspectOptions& options) {
  if (!options.shapes.empty()) {
    return reportError(
        invalidInput("'{}' is an engine file: its input shapes are fixed, --shapes "
                     "does not apply",
                     options.model));
  }
  auto engine = loadEngine(options.model);
  if (!engine.isOk()) return reportError(engine.status());
  const EngineHeader& header = engine->header;
  const auto yesNo = [](bool value) { return value ? "yes" : "no"; };
  std::printf("engine: %s\n", options.model.c_str());
  std::printf("format_version: %u\n", header.formatVersion);
  std::printf("kiln_version: %s\n", header.kilnVersion.c_str());
  std::printf("backend: %s\n", header.backend.c_str());
  std::printf("target: %s\n", header.target.cpuModel.c_str());
  std::printf("  avx2 %s  avx512f %s  fma %s  avx512_bf16 %s\n", yesNo(header.target.avx2),
              yesNo(header.target.avx512f), yesNo(header.target.fma),
              yesNo(header.target.avx512bf16));
  std::printf("model_hash: %s\n", engine->modelHash.c_str());
  std::printf("route: %s\n", engine->route.empty() ? "(default)" : engine->route.c_str());
  const ir::Graph& graph = engine->plan.graph();
  std::printf("inputs:\n");
  for (const ir::Value* input : graph.inputs) {
    std::printf("  %s\n", ir::describeValue(*input).c_str());
  }
  std::printf("outputs:\n");
  for (const ir::Value* output : graph.outputs) {
    std::printf("  %s\n", ir::describeValue(*output).c_str());
  }
  std::printf("parameters: %lld\n", static_cast<long long>(graph.parameterCount()));
  std::printf("arena: %lld bytes\n", static_cast<long long>(engine->plan.arenaBytes()));
  std::printf("layers: %zu\n", engine->plan.steps().size());
  std::printf("  %-40s %-22s %-18s %-8s %s\n", "layer", "op", "tactic", "layout", "precision");
  for (const auto& step : engine->plan.steps()) {
    std::printf("  %-40s %-22s %-18s %-8s %s\n", step->node->name.c_str(),
                step->node->opType.c_str(), step->tactic.c_str(), step->layout.c_str(),
                step->precision.c_str());
  }
  if (options.printIr) std::printf("\n%s", ir::printGraph(graph).c_str());
  return 0;
}

int runInspect(const InspectOptions& options) {
  if (isEngineFile(options.model)) return inspectEngine(options);
  auto parsedShapes = importOptionsFromShapes(options.shapes);
  if (!parsedShapes.isOk()) return reportError(parsedShapes.status());
  onnx::ImportOptions importOptions = *parsedShapes;
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
  if (inferenceNote.empty()) {
    // What a roofline divides by a machine's peaks (bench/gpu/roofline.py reads these lines).
    const ir::GraphWork work = ir::countWork(graph);
    std::printf("work (the ops as the file writes them, before kiln's passes):\n");
    std::printf("  product_flops: %.6g\n", work.flops);
    for (const auto& [op, opWork] : work.byOp) {
      std::printf("    %-22s %.6g in %lld nodes\n", op.c_str(), opWork.flops,
                  static_cast<long long>(opWork.nodes));
    }
    std::printf("  weight_bytes: %.6g\n", work.weightBytes);
    std::printf("  io_bytes: %.6g\n", work.ioBytes);
    std::printf("  minimum_bytes: %.6g\n", work.minimumBytes());
    std::printf("  unfused_bytes: %.6g\n", work.unfusedBytes);
  }
  if (!inferenceNote.empty()) {
    std::printf("shape inference failed: %s\n", inferenceNote.c_str());
  }
  if (options.printIr) std::printf("\n%s", ir::printGraph(graph).c_str());
  return 0;
}

}  // namespace

Command addInspectCommand(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand("inspect", "Describe an ONNX model or a kiln engine file");
  sub->add_option("model", options->model, "the .onnx file or .kiln engine")->required();
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
