// kiln.ChannelShuffle on the CPU (datamove.cc) against the reference executor, through the
// fuse_channel_shuffle pass: contiguous float32 channels (the interleaving and strided loops of
// ChannelShuffleStep), channels with a plane after them (the box copies), two and three groups,
// inputs of unequal widths, one or two outputs, 1 to 3 threads; and in a small ShuffleNet unit
// whose shuffle the layout pass carries into NHWC.
#include <gtest/gtest.h>

#include "../knobs/graph_sketch.h"
#include "cpu_conv_test_util.h"

namespace kiln::testing {
namespace {

using ir::Shape;
using ir::Tensor;

struct ShuffleCase {
  const char* name;
  std::vector<Shape> inputs;  // concatenated along `axis` (one input: no Concat)
  int64_t axis;
  int64_t groups;
  int outputs;  // 1: no Split
};

void PrintTo(const ShuffleCase& c, std::ostream* out) { *out << c.name; }

GraphFactory shuffleGraph(const ShuffleCase& c) {
  return [c] {
    GraphSketch g;
    std::vector<std::string> names;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      names.push_back(g.input("x" + std::to_string(i), c.inputs[i]));
    }
    Shape whole = c.inputs[0];
    std::vector<int64_t> dims = whole.dims();
    dims[static_cast<size_t>(c.axis)] = 0;
    for (const Shape& s : c.inputs)
      dims[static_cast<size_t>(c.axis)] += s[static_cast<size_t>(c.axis)];
    const int64_t channels = dims[static_cast<size_t>(c.axis)];
    std::string x = names[0];
    if (names.size() > 1) x = g.node("Concat", names, {{"axis", ir::Attribute{c.axis}}}, "cat");
    std::vector<int64_t> split = dims;
    split[static_cast<size_t>(c.axis)] = channels / c.groups;
    split.insert(split.begin() + c.axis, c.groups);
    std::vector<int64_t> perm(split.size());
    for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
    std::swap(perm[static_cast<size_t>(c.axis)], perm[static_cast<size_t>(c.axis) + 1]);
    auto shape = [&](const char* name, const std::vector<int64_t>& v) {
      return g.constant(name,
                        Tensor::fromVector<int64_t>(Shape{static_cast<int64_t>(v.size())}, v));
    };
    auto r = g.node("Reshape", {x, shape("split_shape", split)}, {}, "view");
    auto t = g.node("Transpose", {r}, {{"perm", ints(perm)}}, "shuffle");
    auto y = g.node("Reshape", {t, shape("whole_shape", dims)}, {}, "view_back");
    if (c.outputs == 1) {
      g.output(y);
    } else {
      // Split's outputs are named after the node and their index.
      const std::vector<std::string> parts = g.nodeOutputs(
          "Split", {y},
          {{"axis", ir::Attribute{c.axis}}, {"num_outputs", ir::Attribute{int64_t{c.outputs}}}},
          "split", c.outputs);
      for (const std::string& part : parts) g.output(part);
    }
    return g.take();
  };
}

const std::vector<ShuffleCase>& shuffleCases() {
  static const std::vector<ShuffleCase> cases = {
      // ShuffleNet's: two equal branches of 58 channels along the last axis, two groups, two
      // parts: each part interleaves runs of the two inputs (the paired loop), 29 of each, so a
      // vector ends part-way through.
      {"last_axis_two_groups", {{1, 5, 7, 58}, {1, 5, 7, 58}}, 3, 2, 2},
      // Parts of odd width: no runs pair, every one goes by the strided loop.
      {"last_axis_two_groups_odd_parts", {{1, 5, 7, 29}, {1, 5, 7, 29}}, 3, 2, 2},
      // Unequal inputs: some runs pair, some cross an input's end and go one by one.
      {"last_axis_unequal_inputs", {{2, 3, 3, 6}, {2, 3, 3, 10}}, 3, 2, 2},
      {"last_axis_three_groups_one_output", {{1, 4, 4, 21}}, 3, 3, 1},
      {"last_axis_four_groups_three_inputs_four_outputs",
       {{1, 2, 9, 8}, {1, 2, 9, 4}, {1, 2, 9, 12}},
       3,
       4,
       4},
      // NCHW: a plane after the channels (box copies).
      {"nchw_two_groups", {{1, 6, 4, 5}, {1, 6, 4, 5}}, 1, 2, 2},
      {"nchw_batch2_three_groups", {{2, 9, 3, 3}}, 1, 3, 3},
  };
  return cases;
}

class ChannelShuffle : public ::testing::TestWithParam<ShuffleCase> {};

TEST_P(ChannelShuffle, OneStepMatchesTheReferenceOverThreads) {
  const ShuffleCase& c = GetParam();
  const GraphFactory make = shuffleGraph(c);
  const std::vector<Tensor> inputs = randomInputs(make(), 5);
  const std::vector<Tensor> expected = runReference(make, inputs);
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    const RepeatedCpuRun run = runCpuTwice(make, fmt::format("-cpu.threads={}", threads), inputs);
    EXPECT_EQ(run.ops.size(), 1u);  // the Concat, Reshapes, Transpose and Split are gone
    EXPECT_EQ(run.tactic("shuffle"), "fast.channel_shuffle");
    // Element for element: a copy changes no value.
    expectClose(run.outputs, expected, 0.0);
  }
  const RepeatedCpuRun unfused = runCpuTwice(make, "-fusion.channel_shuffle=off", inputs);
  EXPECT_EQ(unfused.tactic("shuffle"), "fast.transpose_tiled");
  expectClose(unfused.outputs, expected, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ChannelShuffle, ::testing::ValuesIn(shuffleCases()),
                         [](const auto& info) { return std::string(info.param.name); });

// A ShuffleNet v2 unit: the layout pass carries the shuffle into NHWC between the convolutions,
// where the pass finds it.
TEST(ChannelShuffle, ShuffleNetUnitRunsItInNhwc) {
  const GraphFactory make = [] {
    GraphSketch g;
    auto x = g.input("x", {1, 16, 6, 6});
    auto left = g.node("Conv", {x, g.weight("w1", {8, 16, 1, 1})}, {}, "conv_left");
    auto right = g.node("Conv", {x, g.weight("w2", {8, 16, 3, 3})}, {{"pads", ints({1, 1, 1, 1})}},
                        "conv_right");
    auto cat = g.node("Concat", {left, right}, {{"axis", ir::Attribute{int64_t{1}}}}, "cat");
    auto r = g.node("Reshape",
                    {cat, g.constant("s5", Tensor::fromVector<int64_t>(Shape{5}, {1, 2, 8, 6, 6}))},
                    {}, "view");
    auto t = g.node("Transpose", {r}, {{"perm", ints({0, 2, 1, 3, 4})}}, "shuffle");
    auto y = g.node("Reshape",
                    {t, g.constant("s4", Tensor::fromVector<int64_t>(Shape{4}, {1, 16, 6, 6}))}, {},
                    "view_back");
    g.output(g.node("Conv", {y, g.weight("w3", {4, 16, 1, 1})}, {}, "conv_out"));
    return g.take();
  };
  const std::vector<Tensor> inputs = randomInputs(make(), 8);
  const std::vector<Tensor> expected = runReference(make, inputs);
  const RepeatedCpuRun run = runCpuTwice(make, "-graph.layout=nhwc", inputs);
  EXPECT_EQ(run.ops.at("shuffle"), "ChannelShuffle");
  EXPECT_EQ(run.tactic("shuffle"), "fast.channel_shuffle");
  EXPECT_EQ(run.layouts.at("conv_out"), "nhwc");
  EXPECT_EQ(run.ops.count("cat"), 0u);
  expectClose(run.outputs, expected);
}

}  // namespace
}  // namespace kiln::testing
