// Effects of the CPU backend's data-movement and reduction knobs: which kernel a node gets.
#include <gtest/gtest.h>

#include <string>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

[[maybe_unused]] const int kCopyChunkEffects = [] {
  for (const char* kib : {"256", "1024", "4096"}) {
    const std::string tactic = std::string("fast.concat.chunk") + kib + "k";
    registerKnobEffect({
        .knob = "cpu.copy.chunk",
        .value = kib,
        .shows = std::string("a Concat plans its copy in chunks of at least ") + kib +
                 " KiB a thread instead of 64",
        .graph =
            [] {
              GraphSketch g;
              g.output(g.node("Concat", {g.input("x", {64, 3, 80}), g.input("y", {64, 5, 80})},
                              {{"axis", ir::Attribute{int64_t{1}}}}, "concat"));
              return g.take();
            },
        .expect =
            [tactic](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("concat").tactic, "fast.concat");
              EXPECT_EQ(changed.layer("concat").tactic, tactic);
            },
    });
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cpu.datamove.impl",
    .value = "reference",
    .shows = "a Concat, a Slice and a Gather run on the reference kernels instead of planned "
             "strided copies",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {2, 3, 8});
          auto y = g.input("y", {2, 5, 8});
          auto concat = g.node("Concat", {x, y}, {{"axis", ir::Attribute{int64_t{1}}}}, "concat");
          auto i64 = [&](const std::string& name, std::vector<int64_t> v) {
            const int64_t n = static_cast<int64_t>(v.size());
            return g.constant(name, ir::Tensor::fromVector<int64_t>(ir::Shape{n}, v));
          };
          auto slice = g.node(
              "Slice",
              {concat, i64("starts", {7}), i64("ends", {0}), i64("axes", {1}), i64("steps", {-2})},
              {}, "slice");
          g.output(g.node("Gather", {slice, i64("indices", {1, 0, 1})},
                          {{"axis", ir::Attribute{int64_t{2}}}}, "gather"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("concat").tactic, "fast.concat") << base.summary();
          EXPECT_EQ(base.layer("slice").tactic, "fast.slice") << base.summary();
          EXPECT_EQ(base.layer("gather").tactic, "fast.gather") << base.summary();
          for (const char* layer : {"concat", "slice", "gather"}) {
            EXPECT_EQ(changed.layer(layer).tactic, "reference") << changed.summary();
          }
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.reduce.impl",
    .value = "reference",
    .shows = "a squeeze-excite ReduceMean over H and W and a ReduceMax over channels run on the "
             "reference kernel instead of the row and column loops",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {1, 8, 6, 6});
          auto axes = [&](const std::string& name, std::vector<int64_t> v) {
            const int64_t n = static_cast<int64_t>(v.size());
            return g.constant(name, ir::Tensor::fromVector<int64_t>(ir::Shape{n}, v));
          };
          g.output(g.node("ReduceMean", {x, axes("hw", {2, 3})}, {}, "mean"));
          g.output(g.node("ReduceMax", {x, axes("c", {1})}, {}, "max"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").tactic, "fast.reduce_rows") << base.summary();
          EXPECT_EQ(base.layer("max").tactic, "fast.reduce_columns") << base.summary();
          EXPECT_EQ(changed.layer("mean").tactic, "reference") << changed.summary();
          EXPECT_EQ(changed.layer("max").tactic, "reference") << changed.summary();
        },
});

}  // namespace
}  // namespace kiln::testing
