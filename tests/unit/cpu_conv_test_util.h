// What the CPU convolution tests share: seeded random inputs, the reference executor's outputs,
// a closeness check, and a build of a graph on the CPU backend run twice (the second run must
// give the same bytes: a plan's steps reuse their buffers, reorders and scratch).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/backends/cpu/plan.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/reference/executor.h"

namespace kiln::testing {

using GraphFactory = std::function<ir::Graph()>;
using Attributes = std::map<std::string, ir::Attribute>;

inline ir::Attribute intAttr(int64_t v) { return {v}; }

// Uniform in [-1, 1) for every float32 input of `graph`, from `seed`.
inline std::vector<ir::Tensor> randomInputs(const ir::Graph& graph, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    ir::Tensor tensor(ir::DType::kFloat32, input->shape);
    for (float& v : tensor.mutableData<float>()) v = uniform(rng);
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

// The reference executor's outputs (none, with a failed expectation, if it cannot run).
inline std::vector<ir::Tensor> runReference(const GraphFactory& make,
                                            const std::vector<ir::Tensor>& inputs) {
  ir::Graph graph = make();
  const Status inferred = ir::inferShapes(graph, nullptr);
  EXPECT_TRUE(inferred.isOk()) << inferred.toString();
  if (!inferred.isOk()) return {};
  auto executor = reference::ReferenceExecutor::create(graph);
  EXPECT_TRUE(executor.isOk()) << executor.status().toString();
  if (!executor.isOk()) return {};
  auto outputs = executor->run(inputs);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().toString();
  return outputs.isOk() ? *outputs : std::vector<ir::Tensor>{};
}

// Every element within `tolerance`, absolute plus relative.
inline void expectClose(const std::vector<ir::Tensor>& actual,
                        const std::vector<ir::Tensor>& expected, double tolerance = 1e-4) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t o = 0; o < expected.size(); ++o) {
    ASSERT_EQ(actual[o].shape(), expected[o].shape());
    for (int64_t i = 0; i < expected[o].elementCount(); ++i) {
      const double e = expected[o].elementAsDouble(i), a = actual[o].elementAsDouble(i);
      ASSERT_NEAR(a, e, tolerance + tolerance * std::fabs(e)) << "output " << o << " element " << i;
    }
  }
}

// What a CPU build chose per node (by node name), and its outputs.
struct RepeatedCpuRun {
  std::map<std::string, std::string> tactics;
  std::map<std::string, std::string> ops;
  std::map<std::string, std::string> layouts;
  std::vector<ir::Tensor> outputs;

  std::string tactic(const std::string& name) const {
    auto it = tactics.find(name);
    return it == tactics.end() ? "(no step)" : it->second;
  }
};

// Builds the graph on the CPU backend with `route` (as given: no knob pinned) and runs the plan
// twice, expecting the same bytes both times.
inline RepeatedCpuRun runCpuTwice(const GraphFactory& make, const std::string& route,
                                  const std::vector<ir::Tensor>& inputs) {
  RepeatedCpuRun run;
  BuilderConfig config;
  Status routed = config.setBuildRoute(route);
  EXPECT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCpu(make(), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return run;
  for (const auto& step : build->plan.steps()) {
    run.tactics[step->node->name] = step->tactic;
    run.ops[step->node->name] = step->node->opType;
    run.layouts[step->node->name] = step->layout;
  }
  auto first = build->plan.run(inputs);
  EXPECT_TRUE(first.isOk()) << first.status().toString();
  auto second = build->plan.run(inputs);
  EXPECT_TRUE(second.isOk()) << second.status().toString();
  if (!first.isOk() || !second.isOk()) return run;
  for (size_t o = 0; o < first->size(); ++o) {
    EXPECT_EQ(std::memcmp((*first)[o].rawData(), (*second)[o].rawData(), (*first)[o].byteSize()), 0)
        << "output " << o << " changed between runs";
  }
  run.outputs = std::move(*first);
  return run;
}

}  // namespace kiln::testing
