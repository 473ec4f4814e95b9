// Golden tests for graph passes. Each tests/passes/<pass>.test file holds cases separated by
// lines of "-----"; a case is
//
//   # what the case shows (names of negative cases start with no_)
//   pass: <pass name>[, <pass name> ...]   (run in that order; the expected IR is after the last)
//   route: <optional route text>
//   backend: <optional: the backend the passes build for, cpu (the default) or cuda>
//   model:
//   <an ONNX ModelProto in protobuf text format>
//   expect:
//   <the IR text (kiln's printer) after the pass>
//
// Besides the text, the runner checks the pass kept the model's meaning: the reference executor
// gives the same outputs before and after on seeded random inputs (ONNX Runtime's transformer
// tests do the same).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/precision.h"
#endif
#include "kiln/base/file.h"
#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"
#include "kiln/passes/pipeline.h"
#include "kiln/reference/executor.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct GoldenCase {
  std::string file;
  int index = 0;
  std::string title;
  std::string pass;
  std::string route;
  std::string backend = "cpu";
  std::string model;
  std::string expect;
};

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \n\t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \n\t") - begin + 1);
}

std::vector<GoldenCase> loadCases() {
  std::vector<GoldenCase> cases;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(KILN_PASS_TEST_DIR)) {
    if (entry.path().extension() == ".test") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const std::string text = readFileBytes(file).value();
    std::vector<std::string> chunks;
    size_t start = 0;
    while (true) {
      const auto separator = text.find("\n-----\n", start);
      chunks.push_back(text.substr(
          start, separator == std::string::npos ? std::string::npos : separator - start));
      if (separator == std::string::npos) break;
      start = separator + 7;
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      GoldenCase c;
      c.file = file.filename().string();
      c.index = static_cast<int>(i);
      std::string* section = nullptr;
      std::istringstream lines(chunks[i]);
      std::string line;
      while (std::getline(lines, line)) {
        if (!section && line.rfind("# ", 0) == 0 && c.title.empty())
          c.title = line.substr(2);
        else if (line.rfind("pass: ", 0) == 0)
          c.pass = line.substr(6);
        else if (line.rfind("route: ", 0) == 0)
          c.route = line.substr(7);
        else if (line.rfind("backend: ", 0) == 0)
          c.backend = line.substr(9);
        else if (line == "model:")
          section = &c.model;
        else if (line == "expect:")
          section = &c.expect;
        else if (section)
          *section += line + "\n";
      }
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

std::vector<ir::Tensor> randomInputs(const ir::Graph& graph) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    ir::Tensor t(ir::DType::kFloat32, input->shape);
    for (float& v : t.mutableData<float>()) v = uniform(rng);
    inputs.push_back(t.castTo(input->dtype));
  }
  return inputs;
}

void PrintTo(const GoldenCase& c, std::ostream* out) {
  *out << c.file << " case " << c.index << " (" << c.title << ")";
}

class PassGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(PassGolden, MatchesExpectedIrAndKeepsOutputs) {
  const GoldenCase& c = GetParam();
  SCOPED_TRACE(c.file + " case " + std::to_string(c.index) + ": " + c.title);
  // The CUDA backend's precision step runs after the pipeline, like a pass; its fp16/bf16 graphs
  // are compared with the original at the reduced types' precision.
  const bool precisionStep = c.pass == "cuda.assign_precision";
#if !KILN_HAVE_CUDA
  if (precisionStep) GTEST_SKIP() << "built without the CUDA backend";
#endif
  // A pass that works on what an earlier one makes (kiln-domain nodes, which models may not
  // contain) names that one first.
  std::vector<const passes::PassInfo*> pipeline;
  if (!precisionStep) {
    std::stringstream names(c.pass);
    for (std::string name; std::getline(names, name, ',');) {
      name = trim(name);
      pipeline.push_back(passes::findPass(name));
      ASSERT_TRUE(pipeline.back()) << "unknown pass '" << name << "'";
    }
  }
  auto route = knobs::Route::parse(c.route);
  ASSERT_TRUE(route.isOk()) << route.status().message();
  auto original = onnx::importModelFromText(c.model);
  ASSERT_TRUE(original.isOk()) << original.status().message();
  auto transformed = onnx::importModelFromText(c.model);
  ASSERT_TRUE(transformed.isOk());

  if (precisionStep) {
#if KILN_HAVE_CUDA
    auto changes = cuda::assignPrecision(transformed->graph, *route);
    ASSERT_TRUE(changes.isOk()) << changes.status().message();
#endif
  } else {
    for (const passes::PassInfo* pass : pipeline) {
      auto record = passes::runPass(*pass, transformed->graph, *route, c.backend);
      ASSERT_TRUE(record.isOk()) << record.status().message();
    }
  }
  const double tolerance = precisionStep ? 2e-2 : 1e-4;
  const double floor = precisionStep ? 2e-2 : 1e-5;
  EXPECT_EQ(ir::printGraph(transformed->graph), trim(c.expect) + "\n");

  const auto inputs = randomInputs(original->graph);
  auto before = reference::ReferenceExecutor::create(original->graph)->run(inputs);
  auto after = reference::ReferenceExecutor::create(transformed->graph)->run(inputs);
  ASSERT_TRUE(before.isOk()) << before.status().message();
  ASSERT_TRUE(after.isOk()) << after.status().message();
  ASSERT_EQ(before->size(), after->size());
  for (size_t i = 0; i < before->size(); ++i) {
    const ir::Tensor& a = (*before)[i];
    const ir::Tensor& b = (*after)[i];
    ASSERT_EQ(a.shape(), b.shape());
    for (int64_t k = 0; k < a.elementCount(); ++k) {
      const double x = a.elementAsDouble(k), y = b.elementAsDouble(k);
      ASSERT_LE(std::fabs(x - y), floor + tolerance * std::fabs(x))
          << "output " << i << " element " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Passes, PassGolden, ::testing::ValuesIn(loadCases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& info) {
                           std::string name =
                               info.param.file.substr(0, info.param.file.size() - 5) + "_" +
                               std::to_string(info.param.index);
                           return name;
                         });

}  // namespace
}  // namespace kiln
