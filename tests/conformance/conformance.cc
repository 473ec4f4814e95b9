// Runs the ONNX backend test data (Debian's libonnx-testdata) through kiln's importer and the
// reference executor, compares with the expected outputs at the ONNX test runner's tolerances
// (rtol 1e-3, atol 1e-7), and checks the outcome against the checked-in expected-failure list.
//
// Exit code 0: every test passed or failed as the list expects. 1: a test failed that the list
// does not name, or a listed test now passes (remove it: the list may only shrink).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "kiln/onnx/import.h"
#include "kiln/reference/executor.h"
#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/runtime.h"
#endif

namespace fs = std::filesystem;
using kiln::Result;
using kiln::Status;
using kiln::StatusCode;
using kiln::ir::Tensor;

namespace {

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-7;

enum class Outcome { kPass, kFail, kUnsupported };

struct TestResult {
  Outcome outcome = Outcome::kPass;
  std::string reason;
};

std::vector<Tensor> readTensors(const fs::path& dir, const std::string& prefix, Status& status) {
  std::vector<Tensor> tensors;
  for (int i = 0;; ++i) {
    const fs::path file = dir / (prefix + std::to_string(i) + ".pb");
    if (!fs::exists(file)) break;
    auto tensor = kiln::onnx::readTensorProtoFile(file);
    if (!tensor.isOk()) {
      status = tensor.status();
      return {};
    }
    tensors.push_back(std::move(tensor->second));
  }
  return tensors;
}

// numpy.testing.assert_allclose semantics: |actual - expected| <= atol + rtol * |expected|,
// NaNs equal NaNs, infinities must match exactly.
std::string compareTensors(const Tensor& expected, const Tensor& actual) {
  if (expected.dtype() != actual.dtype()) {
    return fmt::format("dtype {} != expected {}", kiln::ir::dtypeName(actual.dtype()),
                       kiln::ir::dtypeName(expected.dtype()));
  }
  if (expected.shape() != actual.shape()) {
    return fmt::format("shape {} != expected {}", actual.shape().toString(),
                       expected.shape().toString());
  }
  for (int64_t i = 0; i < expected.elementCount(); ++i) {
    const double e = expected.elementAsDouble(i);
    const double a = actual.elementAsDouble(i);
    if (std::isnan(e) || std::isnan(a)) {
      if (std::isnan(e) != std::isnan(a)) return fmt::format("element {}: {} != {}", i, a, e);
      continue;
    }
    if (std::isinf(e) || std::isinf(a)) {
      if (e != a) return fmt::format("element {}: {} != {}", i, a, e);
      continue;
    }
    if (std::fabs(a - e) > kAtol + kRtol * std::fabs(e)) {
      return fmt::format("element {}: {} != expected {}", i, a, e);
    }
  }
  return "";
}

// Graph inputs whose values decide shapes: those that reach a shape-determining input position
// (Reshape's shape, TopK's K, Range's limit, ...), directly or through other nodes (a Cast, a
// Gather of a shape). kiln compiles for static shapes, so the test binds them at build time.
std::set<std::string> shapeDeterminingInputs(const kiln::ir::Graph& graph) {
  std::set<const kiln::ir::Value*> needed;
  for (auto it = graph.nodes().rbegin(); it != graph.nodes().rend(); ++it) {
    const kiln::ir::Node& node = **it;
    bool outputNeeded = false;
    for (const auto* output : node.outputs) outputNeeded |= output && needed.count(output);
    const auto* schema = kiln::ir::OpRegistry::instance().find(node.domain, node.opType);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const bool shapeInput =
          schema && std::find(schema->shapeInputs.begin(), schema->shapeInputs.end(),
                              static_cast<int>(i)) != schema->shapeInputs.end();
      if (node.inputs[i] && (outputNeeded || shapeInput)) needed.insert(node.inputs[i]);
    }
  }
  std::set<std::string> result;
  for (const auto* input : graph.inputs) {
    if (needed.count(input)) result.insert(input->name);
  }
  return result;
}

// ONNX 1.12's test data stores bfloat16 tensors as uint16 (numpy has no bfloat16): the same
// bits under another type name.
Tensor bfloat16Bits(const Tensor& tensor, kiln::ir::DType wanted) {
  if (tensor.dtype() != kiln::ir::DType::kUInt16 || wanted != kiln::ir::DType::kBFloat16) {
    return tensor;
  }
  Tensor bits(kiln::ir::DType::kBFloat16, tensor.shape());
  std::memcpy(bits.mutableRawData(), tensor.rawData(), tensor.byteSize());
  return bits;
}

TestResult classify(const Status& status) {
  return {status.code() == StatusCode::kUnsupported ? Outcome::kUnsupported : Outcome::kFail,
          status.message()};
}

// "reference" (the oracle), "cpu" or "cuda" (passes and that backend), from --backend; the
// compiled backends build with `route`.
std::string backend = "reference";
std::string route;

TestResult runDataSet(const fs::path& modelPath, const fs::path& dataDir) {
  // The model first: it says whether the data files hold tensors (kiln refuses sequence and
  // optional inputs, whose files would not parse as tensors).
  kiln::onnx::ImportOptions untyped;
  untyped.inferShapes = false;
  auto raw = kiln::onnx::importModel(modelPath, untyped);
  if (!raw.isOk()) return classify(raw.status());
  Status status;
  std::vector<Tensor> inputs = readTensors(dataDir, "input_", status);
  if (!status.isOk()) return classify(status);
  std::vector<Tensor> expected = readTensors(dataDir, "output_", status);
  if (!status.isOk()) return classify(status);
  const auto& rawInputs = raw->graph.inputs;
  if (rawInputs.size() != inputs.size()) {
    return {Outcome::kFail,
            fmt::format("model has {} inputs, test data {}", rawInputs.size(), inputs.size())};
  }
  const std::set<std::string> bound = shapeDeterminingInputs(raw->graph);
  kiln::onnx::ImportOptions options;
  std::vector<Tensor> runtimeInputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& name = rawInputs[i]->name;
    inputs[i] = bfloat16Bits(inputs[i], rawInputs[i]->dtype);
    if (bound.count(name)) {
      options.constantInputs[name] = inputs[i];
    } else {
      options.inputShapes[name] = inputs[i].shape().dims();
      runtimeInputs.push_back(inputs[i]);
    }
  }
  auto model = kiln::onnx::importModel(modelPath, options);
  if (!model.isOk()) return classify(model.status());
  std::vector<std::string> outputNames;
  for (const auto* output : model->graph.outputs) outputNames.push_back(output->name);
  Result<std::vector<Tensor>> outputs = Status(StatusCode::kInternal, "not run");
  kiln::BuilderConfig config;
  if (Status routed = config.setBuildRoute(route); !routed.isOk()) return classify(routed);
  if (backend == "cpu") {
    // The whole compiler: the route's passes, then the CPU backend's kernels.
    auto build = kiln::buildCpu(std::move(model->graph), config);
    if (!build.isOk()) return classify(build.status());
    outputs = build->plan.run(runtimeInputs);
  } else if (backend == "cuda") {
#if KILN_HAVE_CUDA
    auto build = kiln::buildCuda(std::move(model->graph), config);
    if (!build.isOk()) return classify(build.status());
    outputs = build->plan.run(runtimeInputs);
#endif
  } else {
    auto executor = kiln::reference::ReferenceExecutor::create(model->graph);
    if (!executor.isOk()) return classify(executor.status());
    outputs = executor->run(runtimeInputs);
  }
  if (!outputs.isOk()) return classify(outputs.status());
  if (outputs->size() != expected.size()) {
    return {Outcome::kFail,
            fmt::format("{} outputs, expected {}", outputs->size(), expected.size())};
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    std::string mismatch =
        compareTensors(bfloat16Bits(expected[i], (*outputs)[i].dtype()), (*outputs)[i]);
    if (!mismatch.empty()) {
      return {Outcome::kFail, fmt::format("output {} ('{}'): {}", i, outputNames[i], mismatch)};
    }
  }
  return {};
}

TestResult runTest(const fs::path& testDir) {
  const fs::path modelPath = testDir / "model.onnx";
  std::vector<fs::path> dataSets;
  for (const auto& entry : fs::directory_iterator(testDir)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("test_data_set_", 0) == 0) {
      dataSets.push_back(entry.path());
    }
  }
  std::sort(dataSets.begin(), dataSets.end());
  if (dataSets.empty()) return {Outcome::kUnsupported, "no test_data_set_* folder"};
  for (const auto& dataSet : dataSets) {
    TestResult result = runDataSet(modelPath, dataSet);
    if (result.outcome != Outcome::kPass) {
      // The model's path adds nothing to the reason: the test's name says which model.
      const std::string prefix = modelPath.string() + ": ";
      if (result.reason.rfind(prefix, 0) == 0) result.reason.erase(0, prefix.size());
      result.reason = dataSet.filename().string() + ": " + result.reason;
      return result;
    }
  }
  return {};
}

// "suite/test_name  reason..." lines; '#' starts a comment line.
std::map<std::string, std::string> readExpectedFailures(const fs::path& path) {
  std::map<std::string, std::string> entries;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.find_first_of(" \t");
    const std::string name = line.substr(0, space);
    const std::string reason =
        space == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", space));
    entries[name] = reason;
  }
  return entries;
}

std::string oneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (text.size() > 300) text = text.substr(0, 297) + "...";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln conformance: the ONNX backend test data through the reference executor"};
  std::string dataDir = "/usr/share/libonnx-testdata/data";
  std::vector<std::string> suites = {"node", "pytorch-converted", "pytorch-operator", "simple"};
  std::string filter;
  std::string expectedPath;
  std::string writeExpected;
  bool verbose = false;
  app.add_option("--data-dir", dataDir, "libonnx-testdata's data folder");
  app.add_option("--suites", suites, "suites to run")->delimiter(',');
  app.add_option("--filter", filter, "run only tests whose suite/name contains this text");
  app.add_option("--expected-failures", expectedPath, "the expected-failure list to check");
  app.add_option("--write-expected", writeExpected,
                 "write the list of failing tests, with their reasons, to this file");
  app.add_flag("-v,--verbose", verbose, "print every test's outcome");
  app.add_option("--backend", backend,
                 "reference (the oracle), cpu or cuda (passes + that backend; cuda exits 77, a "
                 "skip, without a GPU)")
      ->check(CLI::IsMember({"reference", "cpu", "cuda"}));
  app.add_option("--route", route, "build route for the cpu and cuda backends");
  CLI11_PARSE(app, argc, argv);
  if (backend == "cuda") {
#if KILN_HAVE_CUDA
    if (auto device = kiln::cuda::currentDevice(); !device.isOk()) {
      std::printf("conformance: skipped, %s\n", device.status().message().c_str());
      return 77;
    }
    std::printf("conformance on %s\n", kiln::cuda::currentDevice()->summary().c_str());
#else
    std::fprintf(stderr, "conformance: this build has no CUDA backend (KILN_CUDA=OFF)\n");
    return 2;
#endif
  }

  if (!fs::is_directory(dataDir)) {
    std::fprintf(stderr, "conformance: '%s' is not a folder (install libonnx-testdata)\n",
                 dataDir.c_str());
    return 2;
  }
  const auto expected = expectedPath.empty() ? std::map<std::string, std::string>{}
                                             : readExpectedFailures(expectedPath);
  std::map<std::string, TestResult> results;
  for (const auto& suite : suites) {
    std::vector<fs::path> tests;
    for (const auto& entry : fs::directory_iterator(fs::path(dataDir) / suite)) {
      if (entry.is_directory()) tests.push_back(entry.path());
    }
    std::sort(tests.begin(), tests.end());
    for (const auto& test : tests) {
      const std::string name = suite + "/" + test.filename().string();
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      results[name] = runTest(test);
    }
  }

  int passed = 0, failed = 0, unsupportedCount = 0;
  std::vector<std::string> unexpectedFailures, unexpectedPasses;
  for (const auto& [name, result] : results) {
    const bool listed = expected.count(name) > 0;
    switch (result.outcome) {
      case Outcome::kPass:
        ++passed;
        break;
      case Outcome::kFail:
        ++failed;
        break;
      case Outcome::kUnsupported:
        ++unsupportedCount;
        break;
    }
    if (verbose || (result.outcome == Outcome::kFail && !listed && !expectedPath.empty())) {
      const char* tag = result.outcome == Outcome::kPass   ? "PASS"
                        : result.outcome == Outcome::kFail ? "FAIL"
                                                           : "UNSUPPORTED";
      std::printf("%-12s %s %s\n", tag, name.c_str(), oneLine(result.reason).c_str());
    }
    if (result.outcome != Outcome::kPass && !listed) unexpectedFailures.push_back(name);
    if (result.outcome == Outcome::kPass && listed) unexpectedPasses.push_back(name);
  }
  if (!writeExpected.empty()) {
    std::ofstream out(writeExpected);
    out << "# ONNX backend tests that kiln's reference executor does not pass yet, with the "
           "reason.\n"
           "# This list may only shrink: tests/conformance/conformance.cc fails when a listed "
           "test\n"
           "# passes. Regenerate with: kiln_conformance --write-expected <file>\n";
    for (const auto& [name, result] : results) {
      if (result.outcome == Outcome::kPass) continue;
      // A reason a person wrote into the list (one not in the generated form) is kept.
      auto listed = expected.find(name);
      const bool handWritten = listed != expected.end() &&
                               listed->second.rfind("unsupported: ", 0) != 0 &&
                               listed->second.rfind("fails: ", 0) != 0;
      out << name << "  "
          << (handWritten
                  ? listed->second
                  : (result.outcome == Outcome::kUnsupported ? "unsupported: " : "fails: ") +
                        oneLine(result.reason))
          << "\n";
    }
  }

  std::printf("conformance: %d tests: %d passed, %d failed, %d unsupported\n",
              static_cast<int>(results.size()), passed, failed, unsupportedCount);
  if (expectedPath.empty()) return 0;
  for (const auto& name : unexpectedFailures) {
    std::printf("UNEXPECTED FAILURE %s: %s\n", name.c_str(), oneLine(results[name].reason).c_str());
  }
  for (const auto& name : unexpectedPasses) {
    std::printf("UNEXPECTED PASS %s: remove it from %s\n", name.c_str(), expectedPath.c_str());
  }
  return unexpectedFailures.empty() && unexpectedPasses.empty() ? 0 : 1;
}
