// `kiln run model.onnx`: feed inputs (from .npy/.npz files, or seeded random), run the model on
// the CPU, print a summary of every output and optionally save them.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <sstream>

#include "kiln/cli/commands.h"
#include "kiln/ir/npy.h"
#include "kiln/onnx/import.h"
#include "kiln/reference/executor.h"

namespace kiln::cli {

namespace {

struct RunOptions {
  std::string model;
  std::string shapes;
  std::vector<std::string> loadInputs;
  std::string saveOutputs;
  uint64_t seed = 0;
};

// Parses trtexec-style "name:file.npy,name2:file.npz" entries, or bare .npz files whose arrays
// are named after the inputs.
Result<std::map<std::string, ir::Tensor>> loadInputFiles(const std::vector<std::string>& specs) {
  std::map<std::string, ir::Tensor> inputs;
  for (const auto& spec : specs) {
    std::stringstream entries(spec);
    std::string entry;
    while (std::getline(entries, entry, ',')) {
      const auto colon = entry.find(':');
      const std::string name = colon == std::string::npos ? "" : entry.substr(0, colon);
      const std::string file = colon == std::string::npos ? entry : entry.substr(colon + 1);
      if (name.empty() && file.size() > 4 && file.substr(file.size() - 4) == ".npy") {
        return invalidInput("--loadInputs '{}': an .npy file needs the input name (name:{})", entry,
                            file);
      }
      KILN_ASSIGN_OR_RETURN(ir::NamedTensors tensors, ir::readTensorFile(file, name));
      for (auto& [tensorName, tensor] : tensors) {
        // name:file.npz with one array binds that array to `name`.
        const std::string key = !name.empty() && tensors.size() == 1 ? name : tensorName;
        if (inputs.count(key)) return invalidInput("--loadInputs gives input '{}' twice", key);
        inputs[key] = std::move(tensor);
      }
    }
  }
  return inputs;
}

ir::Tensor randomTensor(ir::DType dtype, const ir::Shape& shape, std::mt19937_64& rng) {
  ir::Tensor floats(ir::DType::kFloat32, shape);
  if (ir::isFloating(dtype)) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& v : floats.mutableData<float>()) v = uniform(rng);
  } else {
    // Small non-negative integers: valid as indices, token ids and masks in most models.
    std::uniform_int_distribution<int> uniform(0, dtype == ir::DType::kBool ? 1 : 7);
    for (float& v : floats.mutableData<float>()) v = static_cast<float>(uniform(rng));
  }
  return floats.castTo(dtype);
}

void printSummary(const std::string& name, const ir::Tensor& tensor) {
  double sum = 0, lo = INFINITY, hi = -INFINITY;
  int64_t nonFinite = 0;
  for (int64_t i = 0; i < tensor.elementCount(); ++i) {
    const double v = tensor.elementAsDouble(i);
    if (!std::isfinite(v)) {
      ++nonFinite;
      continue;
    }
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const int64_t finite = tensor.elementCount() - nonFinite;
  std::printf("  %s : %s%s  min %.6g  max %.6g  mean %.6g", name.c_str(),
              std::string(ir::dtypeName(tensor.dtype())).c_str(), tensor.shape().toString().c_str(),
              finite ? lo : NAN, finite ? hi : NAN,
              finite ? sum / static_cast<double>(finite) : NAN);
  if (nonFinite) std::printf("  non-finite %lld", static_cast<long long>(nonFinite));
  std::printf("\n    first:");
  for (int64_t i = 0; i < std::min<int64_t>(tensor.elementCount(), 6); ++i) {
    std::printf(" %.6g", tensor.elementAsDouble(i));
  }
  std::printf("\n");
}

int runModel(const RunOptions& options) {
  onnx::ImportOptions importOptions;
  if (!options.shapes.empty()) {
    auto shapes = onnx::parseShapeSpec(options.shapes);
    if (!shapes.isOk()) return reportError(shapes.status());
    importOptions.inputShapes = *shapes;
  }
  auto given = loadInputFiles(options.loadInputs);
  if (!given.isOk()) return reportError(given.status());
  // A loaded input fixes its own shape, so dynamic dimensions need no --shapes for it.
  for (const auto& [name, tensor] : *given) {
    importOptions.inputShapes.try_emplace(name, tensor.shape().dims());
  }
  auto model = onnx::importModel(options.model, importOptions);
  if (!model.isOk()) return reportError(model.status());
  const ir::Graph& graph = model->graph;

  std::mt19937_64 rng(options.seed);
  std::vector<ir::Tensor> inputs;
  std::set<std::string> used;
  std::printf("inputs:\n");
  for (const ir::Value* input : graph.inputs) {
    auto it = given->find(input->name);
    if (it == given->end()) {
      inputs.push_back(randomTensor(input->dtype, input->shape, rng));
      std::printf("  %s : %s%s  (random, seed %llu)\n", input->name.c_str(),
                  std::string(ir::dtypeName(input->dtype)).c_str(), input->shape.toString().c_str(),
                  static_cast<unsigned long long>(options.seed));
      continue;
    }
    if (it->second.dtype() != input->dtype) {
      return reportError(invalidInput("input '{}' is {} in the model, but the file holds {}",
                                      input->name, ir::dtypeName(input->dtype),
                                      ir::dtypeName(it->second.dtype())));
    }
    inputs.push_back(it->second);
    used.insert(input->name);
    std::printf("  %s : %s%s  (loaded)\n", input->name.c_str(),
                std::string(ir::dtypeName(input->dtype)).c_str(), input->shape.toString().c_str());
  }
  for (const auto& [name, tensor] : *given) {
    if (!used.count(name)) {
      return reportError(
          invalidInput("--loadInputs gives '{}', which is not an input of the "
                       "model",
                       name));
    }
  }

  auto executor = reference::ReferenceExecutor::create(graph);
  if (!executor.isOk()) return reportError(executor.status());
  const auto start = std::chrono::steady_clock::now();
  auto outputs = executor->run(inputs);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  if (!outputs.isOk()) return reportError(outputs.status());
  std::printf("ran on the reference executor in %.3f ms\noutputs:\n",
              std::chrono::duration<double, std::milli>(elapsed).count());
  ir::NamedTensors named;
  for (size_t i = 0; i < outputs->size(); ++i) {
    printSummary(graph.outputs[i]->name, (*outputs)[i]);
    named.emplace_back(graph.outputs[i]->name, (*outputs)[i]);
  }
  if (!options.saveOutputs.empty()) {
    const std::filesystem::path path(options.saveOutputs);
    const bool asNpy = path.extension() == ".npy" && named.size() == 1;
    if (!asNpy && path.extension() != ".npz") {
      return reportError(invalidInput(
          "--saveOutputs '{}' must end in .npz (or .npy when the model has one output)",
          options.saveOutputs));
    }
    Status saved = asNpy ? ir::writeNpy(path, named[0].second)
                         : ir::writeNpz(path, named, /*compressed=*/false);
    if (!saved.isOk()) return reportError(saved);
    std::printf("saved outputs to %s\n", options.saveOutputs.c_str());
  }
  return 0;
}

}  // namespace

Command addRunCommand(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand("run", "Run a model on the CPU and summarise its outputs");
  sub->add_option("model", options->model, "the .onnx file")->required();
  sub->add_option("--shapes", options->shapes,
                  "fix dynamic input shapes: name:1x3x224x224,name2:...");
  sub->add_option("--loadInputs", options->loadInputs,
                  "input files: name:file.npy, name:file.npz or file.npz (arrays named after "
                  "inputs); inputs not given are seeded random");
  sub->add_option("--saveOutputs", options->saveOutputs, "write the outputs to this .npz file");
  sub->add_option("--seed", options->seed, "seed for random inputs")->default_val(0);
  return {sub, [options] { return runModel(*options); }};
}

}  // namespace kiln::cli
