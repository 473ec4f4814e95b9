// Effects of the elementwise-chain fusion knobs: fusion.eltwise_chain and
// fusion.eltwise_chain.max_ops.
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "kiln/ir/op_schema.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

KILN_KNOB_EFFECT({
    .knob = "fusion.eltwise_chain",
    .value = "off",
    .shows = "x * sigmoid(x) + bias stays three layers instead of one FusedElementwise",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {2, 8, 16});
          auto gate = g.node("Sigmoid", {x}, {}, "gate");
          auto silu = g.node("Mul", {x, gate}, {}, "silu");
          g.output(g.node("Add", {silu, g.weight("bias", {16})}, {}, "bias_add"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          ASSERT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layer("bias_add").op, "kiln.FusedElementwise");
          EXPECT_EQ(base.layer("bias_add").tactic, "fast.fused_eltwise");
          EXPECT_EQ(changed.layers.size(), 3u) << changed.summary();
          EXPECT_EQ(changed.layer("gate").op, "Sigmoid");
          EXPECT_EQ(changed.layer("silu").op, "Mul");
          EXPECT_EQ(changed.layer("bias_add").op, "Add");
        },
});

// A chain of `length` unary nodes n0 .. n<length-1> (bounded ops, so any grouping gives the same
// values).
ir::Graph unaryChain(int length) {
  static const char* const kOps[] = {"Tanh", "Neg", "Sigmoid", "Abs"};
  GraphSketch g;
  std::string value = g.input("x", {4, 33});
  for (int i = 0; i < length; ++i) {
    value = g.node(kOps[i % 4], {value}, {}, "n" + std::to_string(i));
  }
  g.output(value);
  return g.take();
}

// The layers the chain builds into: how many nodes each FusedElementwise took (its program's
// length, read off the IR) is what the cap changes; 1 for a node left on its own.
std::vector<size_t> groupSizes(const BuildSnapshot& shot) {
  std::vector<size_t> sizes;
  for (const BuildSnapshot::Layer& layer : shot.layers) {
    if (layer.op != "kiln.FusedElementwise") {
      sizes.push_back(1);
      continue;
    }
    // The layer's line in the IR: ... kiln.FusedElementwise "<name>" (...) {program=[...]}.
    const size_t line = shot.ir.find("kiln.FusedElementwise \"" + layer.name + "\"");
    const size_t end = shot.ir.find('\n', line);
    const std::string text = shot.ir.substr(line, end - line);
    sizes.push_back(static_cast<size_t>(std::count(text.begin(), text.end(), '"')) / 2 - 1);
  }
  return sizes;
}

KnobEffect capEffect(const char* value, int length, std::vector<size_t> baseSizes,
                     std::vector<size_t> cappedSizes) {
  return {
      .knob = "fusion.eltwise_chain.max_ops",
      .value = value,
      .shows = fmt::format("a chain of {} unary nodes groups as [{}] instead of [{}]", length,
                           fmt::join(cappedSizes, ","), fmt::join(baseSizes, ",")),
      .graph = [length] { return unaryChain(length); },
      .expect =
          [baseSizes, cappedSizes](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(groupSizes(base), baseSizes) << base.summary() << base.ir;
            EXPECT_EQ(groupSizes(changed), cappedSizes) << changed.summary() << changed.ir;
          },
  };
}

// Groups grow back from the chain's end, so the cap leaves the remainder at the start.
const int kCapEffects[] = {
    registerKnobEffect(capEffect("2", 5, {5}, {1, 2, 2})),
    registerKnobEffect(capEffect("4", 5, {5}, {1, 4})),
    registerKnobEffect(capEffect("8", 11, {11}, {3, 8})),
    registerKnobEffect(capEffect("32", 20, {4, 16}, {20})),
};

}  // namespace
}  // namespace kiln::testing
