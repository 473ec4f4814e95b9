// "Every knob has a test that shows what it changes." A knob effect is one such test: a small
// graph built twice, with a base route and with the base route plus `-knob=value`. The runner
// (knob_effects_test.cc) checks, for every registered effect:
//
//   - both routes are valid and both builds succeed;
//   - the two builds differ (optimised IR, per-layer op/tactic/layout/precision, arena size or
//     thread count): a knob whose setting changes nothing fails here;
//   - their outputs agree on seeded random inputs within `tolerance` (relative); only a knob
//     declared changesNumerics may ask for more than 1e-4;
//   - the case's own expectations (`expect`), which say what the change is.
//
// and, over all effects, that every knob in the registry has one for each of its non-default
// values (bool, enum) or for at least one value (integer ranges).
//
// Cases live beside each other by area (graph_effects.cc, cpu_effects.cc, ...), registered with
// KILN_KNOB_EFFECT at static-initialisation time.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::testing {

struct BuildSnapshot {
  struct Layer {
    std::string name;  // the node's name
    std::string op;    // "Conv", "kiln.FusedConv"
    std::string tactic, layout, precision;
    // cuda: the launch details a step reports beyond its tactic ("flat, vector width 4"), or "".
    std::string detail;
    int stream = 0;  // cuda: the stream the step runs on (0: the plan's)
  };
  std::string ir;  // the optimised graph, printed
  std::vector<Layer> layers;
  int64_t arenaBytes = 0;
  int threads = 0;
  int spinMicros = 0;       // cpu: how long the plan's threads spin before they sleep
  std::string workerCpus;   // cpu: the CPUs the pool's workers are bound to ("1,0"), "" if none
  std::string chunks;       // cpu: how the pool's threads share a loop's chunks ("own", "any")
  std::string execution;    // cuda: "graph" (CUDA graph replay allowed) or "steps"
  std::string timingCache;  // cuda: "on" (timed choices go through the timing cache) or "off"
  // cuda, on a GPU: timed layers whose choice came from the timing cache, and those timed.
  int timingHits = 0;
  int timingMisses = 0;
  // cuda: the buffer the plan keeps persisting in L2 ("off", "arena", "weights") and, on a GPU,
  // the window the device gave it.
  std::string l2Persist;
  std::string l2Limit;  // cuda: the persisting set-aside asked for ("max", "half", "quarter")
  int64_t l2WindowBytes = 0;
  int streams = 1;                  // cuda: the streams runs spread the steps over
  std::string streamPriority;       // cuda: the auxiliary streams' priority ("equal", "branches")
  std::vector<ir::Tensor> outputs;  // empty for cuda builds where no GPU is present

  // Layers of op `op` (exact, domain-prefixed for kiln's ops).
  std::vector<const Layer*> layersOf(const std::string& op) const;
  // The layer built from node `name`; fails the test (and returns a blank layer) if none.
  const Layer& layer(const std::string& name) const;
  bool hasOp(const std::string& op) const { return !layersOf(op).empty(); }
  std::string summary() const;  // one line a layer, for failure messages
};

struct KnobEffect {
  std::string knob;             // "cpu.conv.algo"
  std::string value;            // the value this case sets
  std::string shows;            // what the case shows, one line
  std::string backend = "cpu";  // "cpu" or "cuda" (cuda cases compare outputs only on a GPU)
  std::function<ir::Graph()> graph;
  std::string baseRoute;    // applied to both builds (to isolate the knob's effect)
  double tolerance = 1e-4;  // relative, on the outputs
  std::function<void(const BuildSnapshot& base, const BuildSnapshot& changed)> expect;
  // Set when the knob's effect is to refuse the build: the changed build must fail with a message
  // containing this text (and the base build must succeed).
  std::string expectBuildError;
  // Optional: a reason to skip on this machine (empty: run). Evaluated at test time.
  std::function<std::string()> skipReason;
};

int registerKnobEffect(KnobEffect effect);
const std::vector<KnobEffect>& knobEffects();

}  // namespace kiln::testing

#define KILN_KNOB_EFFECT_CONCAT2(a, b) a##b
#define KILN_KNOB_EFFECT_CONCAT(a, b) KILN_KNOB_EFFECT_CONCAT2(a, b)
// KILN_KNOB_EFFECT({.knob = ..., .value = ..., .shows = ..., .graph = ..., .expect = ...});
#define KILN_KNOB_EFFECT(...)                                                        \
  [[maybe_unused]] static const int KILN_KNOB_EFFECT_CONCAT(kKnobEffect, __LINE__) = \
      ::kiln::testing::registerKnobEffect(::kiln::testing::KnobEffect __VA_ARGS__)
