// The harness for the CUDA backend's kernel tests: a one-node graph built for the CUDA backend
// with a route, its tactic checked (anywhere: lowering needs no GPU), then, where a GPU is
// present, run on a poisoned arena and compared with the reference executor.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "../unit/op_test_util.h"
#include "kiln/backends/cuda/runtime.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"

namespace kiln::testing {

using CudaAttributes = std::map<std::string, ir::Attribute>;

struct CudaOpCase {
  std::string opType;
  std::vector<OpInput> inputs;
  CudaAttributes attributes;
  int opset = 18;
  int outputCount = 1;
  std::string domain;
  // The route; the host fallback is off unless the route turns it on, so a case proves the op
  // runs on the GPU, and cuda.layout is nchw unless the route sets it.
  std::string route;
  std::string expectTactic;  // the op's step must choose this tactic ("" : any)
  // |actual - expected| <= atol + rtol * |expected|; NaN must match NaN, infinities exactly.
  double rtol = 1e-5;
  double atol = 1e-6;
};

// A kiln.FusedElementwise case running `program` (kiln/ir/ops/fused_elementwise.h) on `inputs`.
inline CudaOpCase fusedElementwiseCase(std::vector<std::string> program,
                                       std::vector<OpInput> inputs, double rtol, double atol) {
  CudaOpCase c;
  c.opType = "FusedElementwise";
  c.domain = ir::kKilnDomain;
  c.opset = 1;
  c.inputs = std::move(inputs);
  c.attributes = {{"program", ir::Attribute{std::move(program)}}};
  c.rtol = rtol;
  c.atol = atol;
  return c;
}

// The tactic the CUDA lowering chose for the case's node ("" if the node became no step).
inline std::string cudaTacticOf(const CudaBuild& build, const std::string& opType) {
  for (const auto& step : build.plan.steps()) {
    if (step->node->opType == opType) return step->tactic;
  }
  return "";
}

// The first output of `c` built with `route` (after "-cuda.host_fallback=off") and run on a
// poisoned arena, for comparing two routes' bits; c.route and the tolerances are not used. The
// step of c's op says its tactic and detail in `step` (if not null). Empty without a GPU.
struct StepReport {
  std::string tactic, detail;
};
inline ir::Tensor runCudaCase(const CudaOpCase& c, const std::string& route,
                              StepReport* step = nullptr) {
  BuilderConfig config;
  EXPECT_TRUE(config.setBuildRoute("-cuda.host_fallback=off " + route).isOk());
  auto build = buildCuda(
      makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, c.outputCount, c.domain),
      config);
  if (!build.isOk()) {
    ADD_FAILURE() << build.status().toString();
    return {};
  }
  for (const auto& s : build->plan.steps()) {
    if (step && s->node->opType == c.opType) *step = {s->tactic, s->detail()};
  }
  if (!cuda::deviceAvailable()) return {};
  std::vector<ir::Tensor> runtime;
  for (const OpInput& input : c.inputs) {
    if (!input.constant && !input.tensor.empty()) runtime.push_back(input.tensor);
  }
  EXPECT_TRUE(build->plan.fillArena(0xFF).isOk());
  auto ran = build->plan.run(runtime);
  if (!ran.isOk()) {
    ADD_FAILURE() << ran.status().toString();
    return {};
  }
  return std::move((*ran)[0]);
}

inline void expectCudaMatchesReference(const CudaOpCase& c) {
  SCOPED_TRACE(c.opType + (c.route.empty() ? "" : " [" + c.route + "]"));
  auto expected = runSingleOp(c.opType, c.inputs, c.attributes, c.opset, c.outputCount, c.domain);
  ASSERT_TRUE(expected.isOk()) << expected.status().toString();

  BuilderConfig config;
  // NCHW: the case's op is tested as it is written (the GPU's default layout would turn a Conv
  // into transposes around a kiln.NhwcConv).
  Status routed = config.setBuildRoute("-cuda.host_fallback=off -cuda.layout=nchw " + c.route);
  ASSERT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCuda(
      makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, c.outputCount, c.domain),
      config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  if (!c.expectTactic.empty()) {
    EXPECT_EQ(cudaTacticOf(*build, c.opType), c.expectTactic);
  }
  if (!cuda::deviceAvailable()) {
    GTEST_SKIP() << cuda::currentDevice().status().message();
  }

  std::vector<ir::Tensor> runtime;
  for (const OpInput& input : c.inputs) {
    if (!input.constant && !input.tensor.empty()) runtime.push_back(input.tensor);
  }
  Status poisoned = build->plan.fillArena(0xFF);
  ASSERT_TRUE(poisoned.isOk()) << poisoned.toString();
  auto actual = build->plan.run(runtime);
  ASSERT_TRUE(actual.isOk()) << actual.status().toString();
  ASSERT_EQ(actual->size(), expected->size());
  for (size_t o = 0; o < expected->size(); ++o) {
    const ir::Tensor& e = (*expected)[o];
    const ir::Tensor& a = (*actual)[o];
    ASSERT_EQ(a.dtype(), e.dtype()) << "output " << o;
    ASSERT_EQ(a.shape(), e.shape()) << "output " << o;
    int reported = 0;
    for (int64_t i = 0; i < e.elementCount(); ++i) {
      const double ev = e.elementAsDouble(i), av = a.elementAsDouble(i);
      bool ok;
      if (std::isnan(ev)) {
        ok = std::isnan(av);
      } else if (std::isinf(ev)) {
        ok = av == ev;
      } else {
        ok = std::fabs(av - ev) <= c.atol + c.rtol * std::fabs(ev);
      }
      if (!ok && reported++ < 5) {
        ADD_FAILURE() << "output " << o << " element " << i << ": got " << av << ", expected "
                      << ev;
      }
    }
    if (reported > 5) ADD_FAILURE() << "output " << o << ": " << reported << " elements differ";
  }
}

}  // namespace kiln::testing
