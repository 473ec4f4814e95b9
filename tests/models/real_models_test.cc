// The small torch-exported models of the shared models folder through kiln's importer and
// reference executor, compared with ONNX Runtime's outputs on the same inputs
// (tests/data/ort/README.md says how those were made).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "kiln/engine/builder.h"
#include "kiln/ir/npy.h"
#include "kiln/onnx/import.h"
#include "kiln/reference/executor.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Largest element error relative to the largest reference magnitude: the scale of these
// randomly initialised models varies from 1e-9 to 1, so an absolute tolerance would either pass
// everything or nothing.
double normalizedMaxError(const ir::Tensor& actual, const ir::Tensor& expected) {
  double maxError = 0, maxMagnitude = 0;
  for (int64_t i = 0; i < expected.elementCount(); ++i) {
    const double e = expected.elementAsDouble(i);
    const double a = actual.elementAsDouble(i);
    if (!std::isfinite(a)) return INFINITY;
    maxError = std::max(maxError, std::fabs(a - e));
    maxMagnitude = std::max(maxMagnitude, std::fabs(e));
  }
  return maxMagnitude == 0 ? maxError : maxError / maxMagnitude;
}

class RealModel : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(RealModel, MatchesOnnxRuntime) {
  const auto& [name, backend] = GetParam();
  const fs::path modelPath = fs::path(KILN_SHARED_MODELS_DIR) / (name + ".onnx");
  if (!fs::exists(modelPath)) GTEST_SKIP() << modelPath << " is not present";
  auto reference = ir::readNpz(fs::path(KILN_TEST_DATA_DIR) / "ort" / (name + ".npz"));
  ASSERT_TRUE(reference.isOk()) << reference.status().message();

  auto model = onnx::importModel(modelPath);
  ASSERT_TRUE(model.isOk()) << model.status().message();
  ir::Graph& graph = model->graph;

  std::map<std::string, ir::Tensor> inputs;
  std::vector<std::pair<std::string, ir::Tensor>> expected;
  for (const auto& [key, tensor] : *reference) {
    if (key.rfind("input.", 0) == 0) inputs[key.substr(6)] = tensor;
    if (key.rfind("output.", 0) == 0) expected.emplace_back(key.substr(7), tensor);
  }
  // Ask for every compared value as a graph output, the classifier's input included.
  graph.outputs.clear();
  for (const auto& [valueName, tensor] : expected) {
    ir::Value* value = graph.findValue(valueName);
    ASSERT_NE(value, nullptr) << valueName;
    graph.outputs.push_back(value);
  }
  std::vector<ir::Tensor> feeds;
  for (const ir::Value* input : graph.inputs) feeds.push_back(inputs.at(input->name));

  Result<std::vector<ir::Tensor>> outputs = Status(StatusCode::kInternal, "not run");
  if (backend == "reference") {
    auto executor = reference::ReferenceExecutor::create(graph);
    ASSERT_TRUE(executor.isOk()) << executor.status().message();
    outputs = executor->run(feeds);
  } else {
    // The default route: every pass of the pipeline, then the CPU backend's kernels.
    auto build = buildCpu(std::move(graph), BuilderConfig());
    ASSERT_TRUE(build.isOk()) << build.status().message();
    outputs = build->plan.run(feeds);
  }
  ASSERT_TRUE(outputs.isOk()) << outputs.status().message();
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [valueName, want] = expected[i];
    const ir::Tensor& got = (*outputs)[i];
    ASSERT_EQ(got.shape(), want.shape()) << valueName;
    const double error = normalizedMaxError(got, want);
    EXPECT_LT(error, 1e-4) << name << " output '" << valueName << "'";
    std::printf("%s on %s, %s: normalized max error %.3g\n", name.c_str(), backend.c_str(),
                valueName.c_str(), error);
  }
}

INSTANTIATE_TEST_SUITE_P(
    SharedModels, RealModel,
    ::testing::Combine(::testing::Values("bert_mini", "convnext_mini", "mobilenet_v3_small",
                                         "shufflenet_v2_x1_0", "squeezenet1_1", "vit_tiny"),
                       ::testing::Values("reference", "cpu")),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace kiln
