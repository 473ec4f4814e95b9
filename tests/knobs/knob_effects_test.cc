// The runner for knob effects (see knob_effects.h).
#include "knob_effects.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "kiln/base/file.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/printer.h"
#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/runtime.h"
#endif
#include "kiln/knobs/knob.h"
#include "kiln/knobs/listing.h"

namespace kiln::testing {

std::vector<KnobEffect>& registry() {
  static std::vector<KnobEffect> effects;
  return effects;
}

int registerKnobEffect(KnobEffect effect) {
  registry().push_back(std::move(effect));
  return static_cast<int>(registry().size());
}

const std::vector<KnobEffect>& knobEffects() { return registry(); }

std::vector<const BuildSnapshot::Layer*> BuildSnapshot::layersOf(const std::string& op) const {
  std::vector<const Layer*> found;
  for (const Layer& layer : layers) {
    if (layer.op == op) found.push_back(&layer);
  }
  return found;
}

const BuildSnapshot::Layer& BuildSnapshot::layer(const std::string& name) const {
  for (const Layer& layer : layers) {
    if (layer.name == name) return layer;
  }
  ADD_FAILURE() << "no layer '" << name << "' in\n" << summary();
  static const Layer blank;
  return blank;
}

std::string BuildSnapshot::summary() const {
  std::string text = "threads " + std::to_string(threads) + ", spin " + std::to_string(spinMicros) +
                     " us, arena " + std::to_string(arenaBytes) + " bytes" +
                     (execution.empty() ? "" : ", execution " + execution) +
                     (timingCache.empty() ? "" : ", timing cache " + timingCache) +
                     (l2Persist.empty() ? "" : ", L2 persisting " + l2Persist) +
                     (l2Limit.empty() || l2Limit == "max" ? "" : " (set-aside " + l2Limit + ")") +
                     (streams > 1 ? ", " + std::to_string(streams) + " streams" : "") +
                     (streamPriority.empty() || streamPriority == "equal"
                          ? ""
                          : ", auxiliary streams' priority " + streamPriority) +
                     (workerCpus.empty() ? "" : ", workers on cpus " + workerCpus) +
                     (chunks.empty() ? "" : ", " + chunks + " chunks") + "\n";
  for (const Layer& l : layers) {
    text += "  " + l.name + ": " + l.op + " [" + l.tactic + ", " + l.layout + ", " + l.precision +
            "]" + (l.detail.empty() ? "" : " (" + l.detail + ")") +
            (l.stream > 0 ? " on stream " + std::to_string(l.stream) : "") + "\n";
  }
  return text;
}

namespace {

std::vector<ir::Tensor> seededInputs(const ir::Graph& graph) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    ir::Tensor tensor(input->dtype, input->shape);
    if (input->dtype == ir::DType::kFloat32) {
      for (float& v : tensor.mutableData<float>()) v = uniform(rng);
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

Result<BuildSnapshot> snapshot(const KnobEffect& effect, const std::string& route) {
  BuilderConfig config;
  KILN_RETURN_IF_ERROR(config.setBuildRoute(route));
  ir::Graph graph = effect.graph();
  const std::vector<ir::Tensor> inputs = seededInputs(graph);
  BuildSnapshot shot;
  auto addLayer = [&shot](const ir::Node& node, const std::string& tactic,
                          const std::string& layout, const std::string& precision) {
    shot.layers.push_back({node.name,
                           node.domain.empty() ? node.opType : node.domain + "." + node.opType,
                           tactic, layout, precision});
  };
  if (effect.backend == "cuda") {
#if KILN_HAVE_CUDA
    KILN_ASSIGN_OR_RETURN(CudaBuild build, buildCuda(std::move(graph), config));
    shot.ir = ir::printGraph(build.plan.graph());
    // On a GPU the plan runs first, so the layers show what preparing it chose (a library's
    // algorithm, a tactic that fell back); elsewhere they show what lowering planned.
    if (cuda::deviceAvailable()) {
      KILN_ASSIGN_OR_RETURN(shot.outputs, build.plan.run(inputs));
      shot.timingHits = build.plan.timingCacheHits();
      shot.timingMisses = build.plan.timingCacheMisses();
      shot.l2WindowBytes = build.plan.l2WindowBytes();
    }
    for (size_t i = 0; i < build.plan.steps().size(); ++i) {
      const auto& step = build.plan.steps()[i];
      addLayer(*step->node, step->tactic, step->layout, step->precision);
      shot.layers.back().detail = step->detail();
      shot.layers.back().stream = build.plan.stepStream(i);
    }
    shot.streams = build.plan.streamCount();
    shot.streamPriority = build.plan.streamPriority();
    shot.arenaBytes = build.plan.arenaBytes();
    shot.execution = !build.plan.graphsAllowed() ? "steps"
                     : build.plan.graphUpload()  ? "graph, uploaded when built"
                                                 : "graph";
    shot.timingCache = build.plan.timingCacheAllowed() ? "on" : "off";
    shot.l2Persist = build.plan.l2Persist();
    shot.l2Limit = build.plan.l2PersistLimit();
    return shot;
#else
    return unsupported("this build has no CUDA backend");
#endif
  }
  KILN_ASSIGN_OR_RETURN(CpuBuild build, buildCpu(std::move(graph), config));
  shot.ir = ir::printGraph(build.plan.graph());
  for (const auto& step : build.plan.steps()) {
    addLayer(*step->node, step->tactic, step->layout, step->precision);
  }
  shot.arenaBytes = build.plan.arenaBytes();
  shot.threads = build.plan.threads();
  shot.spinMicros = build.plan.spinMicros();
  shot.chunks = build.plan.ownChunks() ? "own" : "any";
  for (int cpu : build.plan.workerCpus()) {
    shot.workerCpus += (shot.workerCpus.empty() ? "" : ",") + std::to_string(cpu);
  }
  KILN_ASSIGN_OR_RETURN(shot.outputs, build.plan.run(inputs));
  return shot;
}

std::string testName(const ::testing::TestParamInfo<size_t>& info) {
  const KnobEffect& effect = knobEffects()[info.param];
  std::string name = effect.knob + "_" + effect.value + "_" + std::to_string(info.param);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

class KnobEffectTest : public ::testing::TestWithParam<size_t> {};

TEST_P(KnobEffectTest, ChangesTheBuildAsStated) {
  const KnobEffect& effect = knobEffects()[GetParam()];
  SCOPED_TRACE("-" + effect.knob + "=" + effect.value + ": " + effect.shows);
  if (effect.skipReason) {
    if (const std::string reason = effect.skipReason(); !reason.empty()) GTEST_SKIP() << reason;
  }
  const knobs::KnobSpec* spec = knobs::KnobRegistry::global().find(effect.knob);
  ASSERT_NE(spec, nullptr) << "no knob " << effect.knob;
  if (!spec->changesNumerics) {
    EXPECT_LE(effect.tolerance, 1e-4) << "only a knob that changes numerics may widen tolerance";
  }
  auto base = snapshot(effect, effect.baseRoute);
  ASSERT_TRUE(base.isOk()) << base.status().toString();
  auto changed = snapshot(effect, effect.baseRoute + " -" + effect.knob + "=" + effect.value);
  if (!effect.expectBuildError.empty()) {
    ASSERT_FALSE(changed.isOk()) << "the build was expected to fail:\n" << changed->summary();
    EXPECT_NE(changed.status().message().find(effect.expectBuildError), std::string::npos)
        << changed.status().message();
    return;
  }
  ASSERT_TRUE(changed.isOk()) << changed.status().toString();

  const bool same = base->ir == changed->ir && base->summary() == changed->summary();
  EXPECT_FALSE(same) << "the knob changed nothing in the build:\n" << base->summary();

  ASSERT_EQ(base->outputs.size(), changed->outputs.size());
  for (size_t o = 0; o < base->outputs.size(); ++o) {
    const ir::Tensor& expected = base->outputs[o];
    const ir::Tensor& actual = changed->outputs[o];
    ASSERT_EQ(expected.shape(), actual.shape());
    ASSERT_EQ(expected.dtype(), actual.dtype());
    for (int64_t i = 0; i < expected.elementCount(); ++i) {
      const double e = expected.elementAsDouble(i), a = actual.elementAsDouble(i);
      ASSERT_NEAR(a, e, effect.tolerance * std::max(1.0, std::fabs(e)))
          << "output " << o << " element " << i;
    }
  }
  if (effect.expect) effect.expect(*base, *changed);
}

INSTANTIATE_TEST_SUITE_P(All, KnobEffectTest, ::testing::Range<size_t>(0, knobEffects().size()),
                         testName);

// The bar of the knob system: a knob nobody shows the effect of is not done.
TEST(KnobEffects, EveryKnobValueHasAnEffectCase) {
  std::set<std::pair<std::string, std::string>> covered;
  std::set<std::string> knobsCovered;
  for (const KnobEffect& effect : knobEffects()) {
    const knobs::KnobSpec* spec = knobs::KnobRegistry::global().find(effect.knob);
    ASSERT_NE(spec, nullptr) << "an effect case names no knob: " << effect.knob;
    auto value = spec->canonicalValue(effect.value);
    ASSERT_TRUE(value.isOk()) << effect.knob << ": " << value.status().toString();
    EXPECT_NE(*value, spec->defaultValue)
        << effect.knob << ": an effect case must set a value other than the default";
    covered.insert({effect.knob, *value});
    knobsCovered.insert(effect.knob);
  }
  for (const auto& [name, spec] : knobs::KnobRegistry::global().all()) {
    if (spec.kind == knobs::KnobKind::kInt) {
      EXPECT_TRUE(knobsCovered.count(name)) << "knob " << name << " has no effect case";
      continue;
    }
    for (const std::string& value : spec.allowedValues()) {
      if (value == spec.defaultValue) continue;
      EXPECT_TRUE(covered.count({name, value}))
          << "knob " << name << "=" << value << " has no effect case";
    }
  }
}

// docs/knobs.md is generated from the registry; it must not drift from the code.
TEST(KnobEffects, DocsListEveryKnobAsDeclared) {
  auto docs = readFileBytes(std::string(KILN_SOURCE_DIR) + "/docs/knobs.md");
  ASSERT_TRUE(docs.isOk()) << docs.status().toString();
  EXPECT_EQ(*docs, knobs::knobMarkdown(knobs::KnobRegistry::global()))
      << "docs/knobs.md is stale: regenerate it with `build/kiln knobs --markdown > docs/knobs.md`";
}

}  // namespace
}  // namespace kiln::testing
