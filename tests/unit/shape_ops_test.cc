// The shape and data-layout ops on cases the ONNX conformance data lacks: old-opset attribute
// forms, dtypes beyond float, clamping corners, and the errors for impossible requests.
#include <gtest/gtest.h>

#include <limits>

#include "kiln/ir/op_schema.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::Attribute;
using ir::DType;
using ir::Shape;
using ir::Tensor;

Tensor floats(Shape shape, std::vector<float> values) {
  return Tensor::fromVector<float>(std::move(shape), values);
}
Tensor int64s(std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor::fromVector<int64_t>(Shape{n}, values);
}
// A 1-D int64 input known at build time (a shape, axes, repeats, ...).
OpInput constInts(std::vector<int64_t> values) { return {int64s(std::move(values)), true}; }
// A float tensor 0, 1, 2, ... of the given shape.
Tensor iota(Shape shape) {
  std::vector<float> values(shape.checkedElementCount().value());
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  return floats(std::move(shape), values);
}

template <typename T>
std::vector<T> valuesOf(const Tensor& tensor) {
  auto data = tensor.data<T>();
  return {data.begin(), data.end()};
}

// Runs the op, expecting one output, and returns it.
Tensor runOk(const std::string& op, const std::vector<OpInput>& inputs,
             const std::map<std::string, Attribute>& attributes = {}, int opset = 18) {
  auto result = runSingleOp(op, inputs, attributes, opset);
  EXPECT_TRUE(result.isOk()) << result.status().toString();
  return result.isOk() ? (*result)[0] : Tensor();
}

// Expects the op to fail with `code` and a message containing `text`.
void expectError(const Result<std::vector<Tensor>>& result, const std::string& text,
                 StatusCode code = StatusCode::kInvalidInput) {
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), code) << result.status().toString();
  EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().message();
}

TEST(Reshape, CopiesZeroAndInfersMinusOne) {
  Tensor out = runOk("Reshape", {{iota({2, 3, 4})}, constInts({0, -1})});
  EXPECT_EQ(out.shape(), Shape({2, 12}));
  EXPECT_EQ(valuesOf<float>(out)[13], 13.0f);
}

TEST(Reshape, AllowZeroKeepsZeroDimension) {
  Tensor empty = Tensor::fromVector<float>(Shape{0, 3}, {});
  Tensor out = runOk("Reshape", {{empty}, constInts({3, 0})}, {{"allowzero", intAttr(1)}});
  EXPECT_EQ(out.shape(), Shape({3, 0}));
}

TEST(Reshape, RejectsImpossibleShapes) {
  expectError(runSingleOp("Reshape", {{iota({2, 3})}, constInts({4, -1})}),
              "cannot reshape input [2,3] (6 elements) to [4,-1]");
  expectError(runSingleOp("Reshape", {{iota({2, 3})}, constInts({4, 2})}), "to [4,2] (8 elements)");
  expectError(runSingleOp("Reshape", {{iota({2, 3})}, constInts({-1, -1})}), "more than one -1");
  expectError(runSingleOp("Reshape", {{iota({6})}, constInts({1, 0, 6})}),
              "has 0 at position 1, which copies an input dimension, but the input [6] has rank 1");
  expectError(runSingleOp("Reshape", {{iota({6})}, constInts({-2, 3})}), "has -2 at position 0");
  expectError(
      runSingleOp("Reshape", {{Tensor::fromVector<float>(Shape{0}, {})}, constInts({0, -1})},
                  {{"allowzero", intAttr(1)}}),
      "has both 0 and -1, which allowzero=1 forbids");
}

TEST(Reshape, NeedsTheShapeAtBuildTime) {
  expectError(runSingleOp("Reshape", {{iota({2, 3})}, {int64s({3, 2})}}),
              "must be known at build time");
  Tensor int32Shape = Tensor::fromVector<int32_t>(Shape{2}, {3, 2});
  expectError(runSingleOp("Reshape", {{iota({2, 3})}, {int32Shape, true}}),
              "(the shape) must be int64, got int32");
}

TEST(Flatten, NegativeAxisOnlyFromOpset11) {
  EXPECT_EQ(runOk("Flatten", {{iota({2, 3, 4})}}, {{"axis", intAttr(-1)}}).shape(), Shape({6, 4}));
  EXPECT_EQ(runOk("Flatten", {{iota({2, 3, 4})}}, {{"axis", intAttr(3)}}).shape(), Shape({24, 1}));
  expectError(runSingleOp("Flatten", {{iota({2, 3, 4})}}, {{"axis", intAttr(-1)}}, 9),
              "axis -1 is out of range for rank 3 (accepted: [0, 3])");
  expectError(runSingleOp("Flatten", {{iota({2, 3})}}, {{"axis", intAttr(3)}}),
              "axis 3 is out of range");
}

TEST(Transpose, ReversesByDefaultForAnyDtype) {
  Tensor in = Tensor::fromVector<int64_t>(Shape{2, 3}, {0, 1, 2, 3, 4, 5});
  Tensor out = runOk("Transpose", {{in}});
  EXPECT_EQ(out.shape(), Shape({3, 2}));
  EXPECT_EQ(valuesOf<int64_t>(out), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));

  Tensor half = iota({2, 1, 3}).castTo(DType::kFloat16);
  Tensor outHalf = runOk("Transpose", {{half}}, {{"perm", intsAttr({2, 0, 1})}});
  EXPECT_EQ(outHalf.shape(), Shape({3, 2, 1}));
  EXPECT_EQ(outHalf.elementAsDouble(1), 3.0);
  EXPECT_EQ(outHalf.elementAsDouble(2), 1.0);
}

TEST(Transpose, RejectsNonPermutations) {
  expectError(runSingleOp("Transpose", {{iota({2, 3})}}, {{"perm", intsAttr({0, 0})}}),
              "perm [0,0] is not a permutation of 0..1");
  expectError(runSingleOp("Transpose", {{iota({2, 3})}}, {{"perm", intsAttr({0})}}),
              "perm [0] has 1 entries, the input has rank 2");
}

TEST(Squeeze, AttributeBeforeOpset13InputFrom13) {
  EXPECT_EQ(runOk("Squeeze", {{iota({1, 3, 1})}}, {{"axes", intsAttr({-1})}}, 11).shape(),
            Shape({1, 3}));
  EXPECT_EQ(runOk("Squeeze", {{iota({1, 3, 1})}, constInts({0})}, {}, 13).shape(), Shape({3, 1}));
  EXPECT_EQ(runOk("Squeeze", {{iota({1, 3, 1})}}, {}, 13).shape(), Shape({3}));
  expectError(runSingleOp("Squeeze", {{iota({1, 3})}}, {{"axes", intsAttr({0})}}, 13),
              "axes is an input from opset 13");
  expectError(runSingleOp("Squeeze", {{iota({1, 3})}, constInts({1})}, {}, 13),
              "cannot squeeze axis 1 of input [1,3]: its size is 3, not 1");
}

TEST(Unsqueeze, InsertsAxesInEitherForm) {
  EXPECT_EQ(runOk("Unsqueeze", {{iota({3, 4})}}, {{"axes", intsAttr({0, -1})}}, 11).shape(),
            Shape({1, 3, 4, 1}));
  EXPECT_EQ(runOk("Unsqueeze", {{iota({3, 4})}, constInts({1})}, {}, 13).shape(), Shape({3, 1, 4}));
  expectError(runSingleOp("Unsqueeze", {{iota({3})}, constInts({0, -3})}, {}, 13),
              "axes [0,-3] name axis 0 twice");
  expectError(runSingleOp("Unsqueeze", {{iota({3})}, constInts({2})}, {}, 13),
              "axis 2 is out of range for rank 2");
  expectError(runSingleOp("Unsqueeze", {{iota({3})}}, {}, 13), "axes are required");
}

TEST(Concat, JoinsInt64AlongNegativeAxis) {
  Tensor a = Tensor::fromVector<int64_t>(Shape{2, 1}, {1, 2});
  Tensor b = Tensor::fromVector<int64_t>(Shape{2, 2}, {3, 4, 5, 6});
  Tensor out = runOk("Concat", {{a}, {b}}, {{"axis", intAttr(-1)}});
  EXPECT_EQ(out.shape(), Shape({2, 3}));
  EXPECT_EQ(valuesOf<int64_t>(out), (std::vector<int64_t>{1, 3, 4, 2, 5, 6}));
}

TEST(Concat, RejectsMismatches) {
  expectError(runSingleOp("Concat", {{iota({2, 3})}, {iota({3, 3})}}, {{"axis", intAttr(1)}}),
              "input 1 has shape [3,3], which does not match input 0's [2,3] outside axis 1");
  expectError(runSingleOp("Concat", {{iota({2})}, {int64s({1})}}, {{"axis", intAttr(0)}}),
              "input 1 is int64, input 0 is float32");
  expectError(runSingleOp("Concat", {{iota({2})}, {iota({2})}}), "'axis' is missing");
}

Result<std::vector<Tensor>> split(Tensor in, std::vector<OpInput> extra,
                                  std::map<std::string, Attribute> attributes, int opset,
                                  int outputs) {
  std::vector<OpInput> inputs = {{std::move(in)}};
  inputs.insert(inputs.end(), extra.begin(), extra.end());
  return runSingleOp("Split", inputs, attributes, opset, outputs);
}

TEST(Split, SizesFromAttributeOrInput) {
  auto old = split(iota({2, 5}), {}, {{"axis", intAttr(1)}, {"split", intsAttr({2, 3})}}, 11, 2);
  ASSERT_TRUE(old.isOk()) << old.status().toString();
  EXPECT_EQ(valuesOf<float>((*old)[0]), (std::vector<float>{0, 1, 5, 6}));
  EXPECT_EQ(valuesOf<float>((*old)[1]), (std::vector<float>{2, 3, 4, 7, 8, 9}));

  auto current = split(iota({5}), {constInts({4, 1})}, {}, 13, 2);
  ASSERT_TRUE(current.isOk()) << current.status().toString();
  EXPECT_EQ(valuesOf<float>((*current)[1]), (std::vector<float>{4}));
}

TEST(Split, UnevenLastChunkOnlyWithOpset18) {
  auto uneven = split(iota({10}), {}, {{"num_outputs", intAttr(3)}}, 18, 3);
  ASSERT_TRUE(uneven.isOk()) << uneven.status().toString();
  EXPECT_EQ((*uneven)[0].shape(), Shape({4}));
  EXPECT_EQ((*uneven)[2].shape(), Shape({2}));
  EXPECT_EQ(valuesOf<float>((*uneven)[2]), (std::vector<float>{8, 9}));
  expectError(split(iota({10}), {}, {}, 13, 3),
              "cannot split an axis of size 10 into 3 equal parts");
  expectError(split(iota({5}), {}, {}, 18, 4), "the last would be negative");
}

TEST(Split, RejectsInconsistentSizes) {
  expectError(split(iota({5}), {constInts({2, 2})}, {}, 13, 2),
              "split [2,2] sums to 4, but the split axis has size 5");
  expectError(split(iota({5}), {constInts({5})}, {}, 13, 2), "split [5] has 1 entries");
  expectError(split(iota({6}), {}, {{"num_outputs", intAttr(3)}}, 18, 2),
              "num_outputs is 3, but the node has 2 outputs");
  expectError(split(iota({6}), {constInts({3, 3})}, {{"num_outputs", intAttr(2)}}, 18, 2),
              "not both");
}

TEST(Slice, AttributesBeforeOpset10) {
  Tensor out = runOk(
      "Slice", {{iota({3, 4})}},
      {{"starts", intsAttr({1, -2})}, {"ends", intsAttr({100, 4})}, {"axes", intsAttr({0, 1})}}, 9);
  EXPECT_EQ(out.shape(), Shape({2, 2}));
  EXPECT_EQ(valuesOf<float>(out), (std::vector<float>{6, 7, 10, 11}));
}

TEST(Slice, NegativeStepsClampToTheWholeAxis) {
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  // From past the end back to before the start: the whole axis, reversed.
  Tensor out =
      runOk("Slice",
            {{iota({5})}, constInts({kMax}), constInts({kMin}), constInts({0}), constInts({-2})});
  EXPECT_EQ(valuesOf<float>(out), (std::vector<float>{4, 2, 0}));
  // A step of INT64_MIN takes just the first element it reaches.
  Tensor one =
      runOk("Slice",
            {{iota({5})}, constInts({-1}), constInts({kMin}), constInts({0}), constInts({kMin})});
  EXPECT_EQ(valuesOf<float>(one), (std::vector<float>{4}));
  // Starts past the end select nothing.
  Tensor none = runOk("Slice", {{iota({5})}, constInts({7}), constInts({kMax})});
  EXPECT_EQ(none.shape(), Shape({0}));
}

TEST(Slice, AcceptsInt32IndicesAndRejectsBadOnes) {
  auto i32 = [](std::vector<int32_t> v) {
    return OpInput{Tensor::fromVector<int32_t>(Shape{static_cast<int64_t>(v.size())}, v), true};
  };
  Tensor out = runOk("Slice", {{iota({2, 6})}, i32({1}), i32({6}), i32({-1}), i32({2})});
  EXPECT_EQ(valuesOf<float>(out), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  expectError(
      runSingleOp("Slice",
                  {{iota({4})}, constInts({0}), constInts({4}), constInts({0}), constInts({0})}),
      "steps [0] contains 0");
  expectError(
      runSingleOp("Slice",
                  {{iota({4, 4})}, constInts({0, 0}), constInts({4, 4}), constInts({1, -1})}),
      "name axis 1 twice");
  expectError(runSingleOp("Slice", {{iota({4})}, constInts({0, 0}), constInts({4})}),
              "must have the same length");
}

TEST(Expand, BroadcastsBothWays) {
  Tensor in = Tensor::fromVector<uint8_t>(Shape{3, 1}, {1, 2, 3});
  Tensor out = runOk("Expand", {{in}, constInts({2, 1, 2})});
  EXPECT_EQ(out.shape(), Shape({2, 3, 2}));
  EXPECT_EQ(valuesOf<uint8_t>(out), (std::vector<uint8_t>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  // A shape of lower rank with 1s keeps the input's dimensions.
  EXPECT_EQ(runOk("Expand", {{iota({2, 3})}, constInts({1})}).shape(), Shape({2, 3}));
  expectError(runSingleOp("Expand", {{iota({2, 3})}, constInts({4})}),
              "shapes [2,3] and [4] cannot be broadcast together");
}

TEST(Tile, RepeatsEachAxis) {
  Tensor in = Tensor::fromVector<int32_t>(Shape{2, 2}, {1, 2, 3, 4});
  Tensor out = runOk("Tile", {{in}, constInts({1, 2})});
  EXPECT_EQ(out.shape(), Shape({2, 4}));
  EXPECT_EQ(valuesOf<int32_t>(out), (std::vector<int32_t>{1, 2, 1, 2, 3, 4, 3, 4}));
  expectError(runSingleOp("Tile", {{in}, constInts({2})}),
              "repeats [2] has 1 entries, the input [2,2] has rank 2");
  expectError(runSingleOp("Tile", {{in}, constInts({1, -1})}), "negative entry");
}

TEST(ShapeOp, StartAndEndFromOpset15) {
  Tensor out = runOk("Shape", {{iota({2, 3, 4})}}, {{"start", intAttr(-2)}, {"end", intAttr(10)}});
  EXPECT_EQ(valuesOf<int64_t>(out), (std::vector<int64_t>{3, 4}));
  // Before opset 15 there are no bounds.
  EXPECT_EQ(valuesOf<int64_t>(runOk("Shape", {{iota({2, 3, 4})}}, {}, 13)),
            (std::vector<int64_t>{2, 3, 4}));
  // end before start gives an empty shape, not an error.
  EXPECT_EQ(runOk("Shape", {{iota({2, 3})}}, {{"start", intAttr(2)}, {"end", intAttr(1)}}).shape(),
            Shape({0}));
}

// Shape's value is known at build time even for a runtime input, so a Reshape fed by it has a
// static shape without any folding evaluator.
TEST(ShapeOp, ResolvesAReshapeOfARuntimeInput) {
  ir::Graph graph;
  auto value = [&](const std::string& name) { return graph.addValue(name); };
  ir::Value* x = value("x");
  x->shape = Shape{2, 3};
  x->hasType = true;
  graph.inputs.push_back(x);
  ir::Value* y = value("y");
  y->shape = Shape{3, 2};
  y->hasType = true;
  graph.inputs.push_back(y);
  ir::Node* shape = graph.addNode("Shape");
  shape->name = "shape";
  shape->opsetVersion = 18;
  shape->inputs = {y};
  shape->outputs = {value("y_shape")};
  ir::Node* reshape = graph.addNode("Reshape");
  reshape->name = "reshape";
  reshape->opsetVersion = 18;
  reshape->inputs = {x, shape->outputs[0]};
  reshape->outputs = {value("out")};
  graph.outputs.push_back(reshape->outputs[0]);
  ASSERT_TRUE(ir::inferShapes(graph, nullptr).isOk());
  EXPECT_EQ(reshape->outputs[0]->shape, Shape({3, 2}));
  auto executor = reference::ReferenceExecutor::create(graph);
  ASSERT_TRUE(executor.isOk());
  auto outputs = executor->run({iota({2, 3}), iota({3, 2})});
  ASSERT_TRUE(outputs.isOk()) << outputs.status().toString();
  EXPECT_EQ(valuesOf<float>((*outputs)[0]), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

// Inference already knows Shape's and Size's values, so their kernels run only when folding
// evaluates them on a constant input; what they compute must agree.
TEST(ShapeOp, KernelsAgreeWithInference) {
  for (const std::string op : {"Shape", "Size"}) {
    ir::Graph graph;
    ir::Value* x = graph.addValue("x");
    x->shape = Shape{2, 3, 4};
    x->hasType = true;
    x->constant = iota({2, 3, 4});
    ir::Node* node = graph.addNode(op);
    node->name = "node";
    node->opsetVersion = 15;
    node->attributes = {{"start", intAttr(-2)}};
    node->inputs = {x};
    node->outputs = {graph.addValue("out")};
    ASSERT_TRUE(ir::inferShapes(graph, nullptr).isOk());
    const Tensor inferred = *node->outputs[0]->constant;
    auto evaluated = reference::evaluateNode(*node, std::vector<const Tensor*>{&*x->constant});
    ASSERT_TRUE(evaluated.isOk()) << evaluated.status().toString();
    EXPECT_EQ(valuesOf<int64_t>((*evaluated)[0]), valuesOf<int64_t>(inferred)) << op;
  }
}

TEST(Size, CountsElements) {
  Tensor out = runOk("Size", {{Tensor::fromVector<bool>(Shape{2, 0, 3}, {})}});
  EXPECT_EQ(out.shape(), Shape({}));
  EXPECT_EQ(valuesOf<int64_t>(out), (std::vector<int64_t>{0}));
}

TEST(ConstantOfShape, FillsWithTheValue) {
  Tensor zeros = runOk("ConstantOfShape", {constInts({2, 2})});
  EXPECT_EQ(zeros.dtype(), DType::kFloat32);
  EXPECT_EQ(valuesOf<float>(zeros), (std::vector<float>{0, 0, 0, 0}));
  Attribute seven{Tensor::fromVector<int32_t>(Shape{1}, {7})};
  Tensor out = runOk("ConstantOfShape", {constInts({3})}, {{"value", seven}});
  EXPECT_EQ(valuesOf<int32_t>(out), (std::vector<int32_t>{7, 7, 7}));
  // An empty shape gives a scalar.
  EXPECT_EQ(runOk("ConstantOfShape", {constInts({})}, {{"value", seven}}).shape(), Shape({}));
}

TEST(ConstantOfShape, RejectsBadValues) {
  Attribute two{Tensor::fromVector<float>(Shape{2}, {1, 2})};
  expectError(runSingleOp("ConstantOfShape", {constInts({3})}, {{"value", two}}),
              "value must hold exactly one element, got shape [2]");
  expectError(runSingleOp("ConstantOfShape", {constInts({3, -1})}), "has a negative dimension");
  Attribute bf16{Tensor::scalar<ir::BFloat16>(ir::BFloat16(1.0f))};
  expectError(runSingleOp("ConstantOfShape", {constInts({3})}, {{"value", bf16}}, 19),
              "bfloat16 only from opset 20");
  EXPECT_EQ(runOk("ConstantOfShape", {constInts({3})}, {{"value", bf16}}, 20).elementAsDouble(2),
            1.0);
}

OpInput constScalar(auto value) { return {Tensor::scalar(value), true}; }

TEST(Range, IntegerAndFloatRanges) {
  Tensor down =
      runOk("Range", {constScalar(int64_t{10}), constScalar(int64_t{1}), constScalar(int64_t{-4})});
  EXPECT_EQ(valuesOf<int64_t>(down), (std::vector<int64_t>{10, 6, 2}));
  Tensor up = runOk("Range", {constScalar(0.5), constScalar(2.0), constScalar(0.5)});
  EXPECT_EQ(valuesOf<double>(up), (std::vector<double>{0.5, 1.0, 1.5}));
  // The wrong direction gives an empty range.
  Tensor empty =
      runOk("Range", {constScalar(int16_t{0}), constScalar(int16_t{5}), constScalar(int16_t{-1})});
  EXPECT_EQ(empty.shape(), Shape({0}));
}

TEST(Range, RejectsBadInputs) {
  expectError(runSingleOp("Range", {constScalar(0), constScalar(5), constScalar(0)}),
              "delta must be non-zero");
  expectError(runSingleOp("Range", {constScalar(0.0f), constScalar(5.0f), constScalar(1.0)}),
              "must have one type, got float32, float32 and float64");
  expectError(runSingleOp("Range", {constScalar(uint8_t{0}), constScalar(uint8_t{5}),
                                    constScalar(uint8_t{1})}),
              "takes float, double, int16, int32 or int64, got uint8");
  expectError(runSingleOp("Range", {{Tensor::scalar(0.0f)}, constScalar(5.0f), constScalar(1.0f)}),
              "must be known at build time");
}

TEST(EyeLike, OffsetDiagonalAndDtype) {
  Tensor out = runOk("EyeLike", {{iota({2, 3})}}, {{"k", intAttr(1)}, {"dtype", intAttr(6)}});
  EXPECT_EQ(out.dtype(), DType::kInt32);
  EXPECT_EQ(valuesOf<int32_t>(out), (std::vector<int32_t>{0, 1, 0, 0, 0, 1}));
  Tensor below =
      runOk("EyeLike", {{Tensor::fromVector<bool>(Shape{3, 2}, {})}}, {{"k", intAttr(-1)}});
  EXPECT_EQ(valuesOf<bool>(below), (std::vector<bool>{false, false, true, false, false, true}));
  Tensor outside =
      runOk("EyeLike", {{iota({2, 2})}}, {{"k", intAttr(std::numeric_limits<int64_t>::max())}});
  EXPECT_EQ(valuesOf<float>(outside), (std::vector<float>{0, 0, 0, 0}));
}

TEST(EyeLike, RejectsBadInputs) {
  expectError(runSingleOp("EyeLike", {{iota({2, 2, 2})}}), "input must be 2-D, got shape [2,2,2]");
  expectError(runSingleOp("EyeLike", {{iota({2, 2})}}, {{"dtype", intAttr(99)}}),
              "attribute 'dtype': 99 is not an ONNX element type");
  expectError(runSingleOp("EyeLike", {{iota({2, 2})}}, {{"dtype", intAttr(8)}}), "string",
              StatusCode::kUnsupported);
}

}  // namespace
}  // namespace kiln::testing
