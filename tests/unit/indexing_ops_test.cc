// Indexing ops (Gather/Scatter families, Pad, Resize/Upsample, Trilu, OneHot, DepthToSpace,
// SpaceToDepth) on what the ONNX conformance data leaves out: newer opset features, other
// dtypes, and the errors for bad indices, attributes and shapes.
#include <gtest/gtest.h>

#include "op_test_util.h"

namespace kiln {
namespace {

using ir::Attribute;
using ir::Float16;
using ir::Shape;
using ir::Tensor;
using testing::floatsAttr;
using testing::intAttr;
using testing::intsAttr;
using testing::OpInput;
using testing::runSingleOp;
using testing::stringAttr;

Tensor floats(Shape shape, std::vector<float> values) {
  return Tensor::fromVector<float>(std::move(shape), values);
}
Tensor int64s(Shape shape, std::vector<int64_t> values) {
  return Tensor::fromVector<int64_t>(std::move(shape), values);
}
Tensor int32s(Shape shape, std::vector<int32_t> values) {
  return Tensor::fromVector<int32_t>(std::move(shape), values);
}

template <typename T>
std::vector<T> values(const Tensor& tensor) {
  auto data = tensor.data<T>();
  return {data.begin(), data.end()};
}

// Runs the op and returns its single output, failing the test on an error.
Tensor runOk(const std::string& op, const std::vector<OpInput>& inputs,
             const std::map<std::string, Attribute>& attributes = {}, int opset = 18) {
  auto result = runSingleOp(op, inputs, attributes, opset);
  EXPECT_TRUE(result.isOk()) << result.status().toString();
  return result.isOk() ? (*result)[0] : Tensor();
}

// Runs the op expecting an error of `code` whose message contains `text`.
void expectError(const std::string& op, const std::vector<OpInput>& inputs,
                 const std::map<std::string, Attribute>& attributes, int opset, StatusCode code,
                 const std::string& text) {
  auto result = runSingleOp(op, inputs, attributes, opset);
  ASSERT_FALSE(result.isOk()) << op << " unexpectedly succeeded";
  EXPECT_EQ(result.status().code(), code) << result.status().toString();
  EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().message();
}

// --- Gather family ---------------------------------------------------------------------------

TEST(Gather, NegativeAxisAndIndicesWithInt32) {
  Tensor data = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor out = runOk("Gather", {{data}, {int32s({2}, {-1, 0})}}, {{"axis", intAttr(-1)}}, 13);
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(out), (std::vector<float>{3, 1, 6, 4}));
}

TEST(Gather, CopiesFloat16Bits) {
  Tensor data = Tensor::fromVector<Float16>({3}, {Float16(1.5f), Float16(-2.0f), Float16(7.0f)});
  Tensor out = runOk("Gather", {{data}, {int64s({}, {2})}});
  EXPECT_EQ(out.shape(), Shape{});
  EXPECT_EQ(static_cast<float>(out.data<Float16>()[0]), 7.0f);
}

TEST(Gather, OutOfRangeIndexNamesIndexAndPosition) {
  Tensor data = floats({2, 3}, {1, 2, 3, 4, 5, 6});
  expectError("Gather", {{data}, {int64s({2, 2}, {0, 1, 1, 2})}}, {}, 13, StatusCode::kInvalidInput,
              "index 2 at indices[1,1] is out of range [-2, 2)");
}

TEST(Gather, RejectsFloatIndicesAndBadAxis) {
  Tensor data = floats({2}, {1, 2});
  expectError("Gather", {{data}, {floats({1}, {0})}}, {}, 13, StatusCode::kInvalidInput,
              "indices must be int32 or int64, got float32");
  expectError("Gather", {{data}, {int64s({1}, {0})}}, {{"axis", intAttr(1)}}, 13,
              StatusCode::kInvalidInput, "axis 1 is out of range for an input of rank 1");
}

TEST(GatherElements, RejectsRankMismatchAndOutOfRange) {
  Tensor data = floats({2, 2}, {1, 2, 3, 4});
  expectError("GatherElements", {{data}, {int64s({2}, {0, 1})}}, {}, 13, StatusCode::kInvalidInput,
              "must have the rank of data");
  expectError("GatherElements", {{data}, {int64s({1, 2}, {0, -3})}}, {}, 13,
              StatusCode::kInvalidInput, "index -3 at indices[0,1] is out of range [-2, 2)");
}

TEST(GatherND, BatchDimsOnFloats) {
  // data [2,2,2], batch_dims 1, each batch picks one row.
  Tensor data = floats({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor out =
      runOk("GatherND", {{data}, {int64s({2, 1}, {1, -2})}}, {{"batch_dims", intAttr(1)}}, 13);
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  EXPECT_EQ(values<float>(out), (std::vector<float>{2, 3, 4, 5}));
}

TEST(GatherND, BatchDimsNeedOpset12AndMatchingBatch) {
  Tensor data = floats({2, 2}, {0, 1, 2, 3});
  expectError("GatherND", {{data}, {int64s({2, 1}, {0, 1})}}, {{"batch_dims", intAttr(1)}}, 11,
              StatusCode::kInvalidInput, "batch_dims needs opset 12");
  expectError("GatherND", {{data}, {int64s({3, 1}, {0, 1, 0})}}, {{"batch_dims", intAttr(1)}}, 13,
              StatusCode::kInvalidInput, "batch dimension 0 differs");
  expectError("GatherND", {{data}, {int64s({1, 3}, {0, 0, 0})}}, {}, 13, StatusCode::kInvalidInput,
              "last dimension of indices [1,3] must be in [1, 2]");
}

// --- Scatter family --------------------------------------------------------------------------

TEST(ScatterND, MaxAndMinReductions) {
  Tensor data = floats({4}, {1, 5, 3, 7});
  Tensor indices = int64s({3, 1}, {0, 1, 0});
  Tensor updates = floats({3}, {4, 2, 9});
  Tensor high =
      runOk("ScatterND", {{data}, {indices}, {updates}}, {{"reduction", stringAttr("max")}});
  EXPECT_EQ(values<float>(high), (std::vector<float>{9, 5, 3, 7}));
  Tensor low =
      runOk("ScatterND", {{data}, {indices}, {updates}}, {{"reduction", stringAttr("min")}});
  EXPECT_EQ(values<float>(low), (std::vector<float>{1, 2, 3, 7}));
}

TEST(ScatterND, IntegerMultiplyWrapsAndSlicesUpdate) {
  Tensor data = Tensor::fromVector<int32_t>({2, 2}, {1, 2, 3, 4});
  Tensor updates = Tensor::fromVector<int32_t>({1, 2}, {10, 1 << 30});
  Tensor out = runOk("ScatterND", {{data}, {int64s({1, 1}, {1})}, {updates}},
                     {{"reduction", stringAttr("mul")}}, 16);
  // 4 * 2^30 wraps to 0 in int32, as numpy does.
  EXPECT_EQ(values<int32_t>(out), (std::vector<int32_t>{1, 2, 30, 0}));
}

TEST(ScatterND, ReductionsAreGatedByOpset) {
  Tensor data = floats({2}, {1, 2});
  std::vector<OpInput> inputs = {{data}, {int64s({1, 1}, {0})}, {floats({1}, {5})}};
  expectError("ScatterND", inputs, {{"reduction", stringAttr("max")}}, 16,
              StatusCode::kInvalidInput, "reduction 'max' needs opset 18");
  expectError("ScatterND", inputs, {{"reduction", stringAttr("add")}}, 13,
              StatusCode::kInvalidInput, "reduction 'add' needs opset 16");
  expectError("ScatterND", inputs, {{"reduction", stringAttr("mean")}}, 18,
              StatusCode::kInvalidInput, "unknown reduction 'mean'");
  expectError("ScatterND", {{data}, {int64s({1, 1}, {0})}, {floats({2}, {5, 6})}}, {}, 18,
              StatusCode::kInvalidInput, "updates [2] must have shape [1]");
}

TEST(ScatterElements, AddsDuplicatesAlongNegativeAxis) {
  Tensor data = floats({2, 3}, {0, 0, 0, 1, 1, 1});
  Tensor indices = int64s({2, 2}, {0, 0, 2, -1});
  Tensor updates = floats({2, 2}, {1, 2, 3, 4});
  Tensor out = runOk("ScatterElements", {{data}, {indices}, {updates}},
                     {{"axis", intAttr(-1)}, {"reduction", stringAttr("add")}});
  EXPECT_EQ(values<float>(out), (std::vector<float>{3, 0, 0, 1, 1, 8}));
}

TEST(ScatterElements, BoolMaxIsOrAndOutOfRangeIsAnError) {
  Tensor data = Tensor::fromVector<bool>({3}, {false, true, false});
  Tensor updates = Tensor::fromVector<bool>({2}, {true, false});
  Tensor out = runOk("ScatterElements", {{data}, {int64s({2}, {0, 1})}, {updates}},
                     {{"reduction", stringAttr("max")}});
  EXPECT_EQ(values<bool>(out), (std::vector<bool>{true, true, false}));
  expectError("ScatterElements", {{data}, {int64s({2}, {0, 3})}, {updates}}, {}, 13,
              StatusCode::kInvalidInput, "index 3 at indices[1] is out of range [-3, 3)");
}

TEST(Scatter, RemovedAtOpset11) {
  Tensor data = floats({2}, {1, 2});
  std::vector<OpInput> inputs = {{data}, {int64s({1}, {1})}, {floats({1}, {9})}};
  Tensor out = runOk("Scatter", inputs, {}, 9);
  EXPECT_EQ(values<float>(out), (std::vector<float>{1, 9}));
  expectError("Scatter", inputs, {}, 11, StatusCode::kInvalidInput,
              "replaced by ScatterElements at opset 11");
}

// --- Pad -------------------------------------------------------------------------------------

TEST(Pad, WrapModeAtOpset19) {
  Tensor data = floats({3}, {1, 2, 3});
  Tensor out =
      runOk("Pad", {{data}, {int64s({2}, {2, 4}), true}}, {{"mode", stringAttr("wrap")}}, 19);
  EXPECT_EQ(values<float>(out), (std::vector<float>{2, 3, 1, 2, 3, 1, 2, 3, 1}));
  expectError("Pad", {{data}, {int64s({2}, {1, 1}), true}}, {{"mode", stringAttr("wrap")}}, 18,
              StatusCode::kInvalidInput, "mode 'wrap' needs opset 19");
}

TEST(Pad, ReflectBeyondTheDataRepeatsTheReflection) {
  Tensor data = floats({3}, {1, 2, 3});
  Tensor out =
      runOk("Pad", {{data}, {int64s({2}, {4, 3}), true}}, {{"mode", stringAttr("reflect")}}, 13);
  EXPECT_EQ(values<float>(out), (std::vector<float>{1, 2, 3, 2, 1, 2, 3, 2, 1, 2}));
}

TEST(Pad, AxesInputAndConstantValueAtOpset18) {
  Tensor data = Tensor::fromVector<int32_t>({2, 2}, {1, 2, 3, 4});
  Tensor value = Tensor::scalar<int32_t>(-7);
  Tensor out = runOk(
      "Pad", {{data}, {int64s({2}, {1, 0}), true}, {value}, {int64s({1}, {-1}), true}}, {}, 18);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<int32_t>(out), (std::vector<int32_t>{-7, 1, 2, -7, 3, 4}));
}

TEST(Pad, NegativePadsCropBeforeEdgePadding) {
  Tensor data = floats({4}, {1, 2, 3, 4});
  Tensor out =
      runOk("Pad", {{data}, {int64s({2}, {-2, 2}), true}}, {{"mode", stringAttr("edge")}}, 13);
  EXPECT_EQ(values<float>(out), (std::vector<float>{3, 4, 4, 4}));
}

TEST(Pad, AttributeFormBeforeOpset11) {
  Tensor data = Tensor::fromVector<int64_t>({2}, {5, 6});
  Tensor out =
      runOk("Pad", {{data}}, {{"pads", intsAttr({1, 2})}, {"value", testing::floatAttr(3.9f)}}, 2);
  // The float value converts to the data's int64 type by truncation.
  EXPECT_EQ(values<int64_t>(out), (std::vector<int64_t>{3, 5, 6, 3, 3}));
}

TEST(Pad, ErrorsNameTheProblem) {
  Tensor data = floats({2, 2}, {1, 2, 3, 4});
  expectError("Pad", {{data}, {int64s({2}, {1, 1}), true}}, {}, 13, StatusCode::kInvalidInput,
              "pads has 2 values, expected 4");
  expectError("Pad", {{data}, {int64s({4}, {0, -3, 0, 0}), true}}, {}, 13,
              StatusCode::kInvalidInput, "make axis 1 of data [2,2] negative");
  expectError("Pad", {{data}, {int64s({4}, {0, 0, 0, 0})}}, {}, 13, StatusCode::kInvalidInput,
              "must be known at build time");
  expectError("Pad", {{data}, {int64s({4}, {0, 0, 0, 0}), true}}, {{"mode", stringAttr("mirror")}},
              13, StatusCode::kInvalidInput, "unknown mode 'mirror'");
  expectError("Pad", {{data}, {int64s({4}, {0, -2, 0, 1}), true}},
              {{"mode", stringAttr("reflect")}}, 13, StatusCode::kInvalidInput,
              "no data is left to copy from");
}

// --- Resize and Upsample ---------------------------------------------------------------------

Tensor counting(Shape shape) {
  std::vector<float> v(shape.elementCount());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
  return floats(std::move(shape), v);
}

void expectNear(const std::vector<float>& actual, const std::vector<float>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5) << "element " << i;
  }
}

TEST(Resize, LinearAntialiasDownsample) {
  // ONNX's test_resize_downsample_scales_linear_antialias (opset 18, not in the 1.12 data).
  Tensor out =
      runOk("Resize", {{counting({1, 1, 4, 4})}, {}, {floats({4}, {1, 1, 0.6f, 0.6f}), true}},
            {{"mode", stringAttr("linear")}, {"antialias", intAttr(1)}}, 18);
  EXPECT_EQ(out.shape(), (Shape{1, 1, 2, 2}));
  expectNear(values<float>(out), {2.875f, 4.5f, 9.375f, 11.0f});
}

TEST(Resize, CubicAntialiasDownsample) {
  // ONNX's test_resize_downsample_scales_cubic_antialias (opset 18).
  Tensor out =
      runOk("Resize", {{counting({1, 1, 4, 4})}, {}, {floats({4}, {1, 1, 0.6f, 0.6f}), true}},
            {{"mode", stringAttr("cubic")}, {"antialias", intAttr(1)}}, 18);
  expectNear(values<float>(out), {2.5180721f, 4.2858863f, 9.589329f, 11.357142f});
}

TEST(Resize, LinearAntialiasFromSizes) {
  // ONNX's test_resize_downsample_sizes_linear_antialias (opset 18).
  Tensor out =
      runOk("Resize", {{counting({1, 1, 4, 4})}, {}, {}, {int64s({4}, {1, 1, 3, 3}), true}},
            {{"mode", stringAttr("linear")}, {"antialias", intAttr(1)}}, 18);
  expectNear(values<float>(out), {2.3636363f, 3.590909f, 4.818182f, 7.2727275f, 8.5f, 9.727273f,
                                  12.181818f, 13.409091f, 14.636364f});
}

TEST(Resize, HalfPixelSymmetricUpsample) {
  // ONNX's test_resize_upsample_scales_linear_half_pixel_symmetric (opset 19).
  Tensor out =
      runOk("Resize", {{counting({1, 1, 2, 2})}, {}, {floats({4}, {1, 1, 2.3f, 2.94f}), true}},
            {{"mode", stringAttr("linear")},
             {"coordinate_transformation_mode", stringAttr("half_pixel_symmetric")}},
            19);
  ASSERT_EQ(out.shape(), (Shape{1, 1, 4, 5}));
  expectNear(values<float>(out), {1.0f,        1.15986395f, 1.5f,        1.84013605f, 2.0f,
                                  1.56521738f, 1.72508133f, 2.06521738f, 2.40535343f, 2.56521738f,
                                  2.43478262f, 2.59464657f, 2.93478262f, 3.27491867f, 3.43478262f,
                                  3.0f,        3.15986395f, 3.5f,        3.84013605f, 4.0f});
}

TEST(Resize, SizesWithAxesAndKeepAspectRatioNotLarger) {
  Tensor out = runOk(
      "Resize", {{counting({1, 1, 2, 2})}, {}, {}, {int64s({2}, {7, 8}), true}},
      {{"axes", intsAttr({2, 3})}, {"keep_aspect_ratio_policy", stringAttr("not_larger")}}, 18);
  ASSERT_EQ(out.shape(), (Shape{1, 1, 7, 7}));
  // Scale 3.5 on both axes; half_pixel with round_prefer_floor maps rows 0-3 to 0, 4-6 to 1.
  const std::vector<int> source = {0, 0, 0, 0, 1, 1, 1};
  auto v = values<float>(out);
  for (int y = 0; y < 7; ++y) {
    for (int x = 0; x < 7; ++x) {
      EXPECT_EQ(v[y * 7 + x], static_cast<float>(source[y] * 2 + source[x] + 1)) << y << "," << x;
    }
  }
}

TEST(Resize, Opset10NearestShrinksWithCeilAndGrowsWithFloor) {
  Tensor down =
      runOk("Resize", {{counting({1, 1, 2, 4})}, {floats({4}, {1, 1, 0.6f, 0.6f}), true}}, {}, 10);
  EXPECT_EQ(down.shape(), (Shape{1, 1, 1, 2}));
  EXPECT_EQ(values<float>(down), (std::vector<float>{1, 3}));
  Tensor up = runOk("Resize", {{counting({1, 3})}, {floats({2}, {1, 2}), true}}, {}, 10);
  EXPECT_EQ(values<float>(up), (std::vector<float>{1, 1, 2, 2, 3, 3}));
}

TEST(Resize, Uint8LinearRoundsToNearest) {
  Tensor data = Tensor::fromVector<uint8_t>({1, 2}, {0, 255});
  Tensor out = runOk("Resize", {{data}, {}, {}, {int64s({2}, {1, 4}), true}},
                     {{"mode", stringAttr("linear")}}, 13);
  // half_pixel: positions -0.25, 0.25, 0.75, 1.25 -> 0, 63.75, 191.25, 255 (clamped ends).
  EXPECT_EQ(values<uint8_t>(out), (std::vector<uint8_t>{0, 64, 191, 255}));
}

TEST(Resize, HalfPixelSymmetricNeedsOpset19) {
  // Width 5 at scale 0.5 is 2.5 elements, rounded down to 2: the symmetric transform centres
  // the two outputs (at 1 and 3) where half_pixel would put them at 0.5 and 2.5.
  std::vector<OpInput> inputs = {{counting({1, 5})}, {}, {floats({2}, {1, 0.5f}), true}};
  std::map<std::string, Attribute> attrs = {
      {"mode", stringAttr("linear")},
      {"coordinate_transformation_mode", stringAttr("half_pixel_symmetric")}};
  Tensor out = runOk("Resize", inputs, attrs, 19);
  expectNear(values<float>(out), {2, 4});
  expectError("Resize", inputs, attrs, 18, StatusCode::kInvalidInput,
              "coordinate_transformation_mode 'half_pixel_symmetric' is not defined at opset 18");
}

TEST(Resize, ErrorsNameTheProblem) {
  Tensor x = counting({1, 4});
  expectError("Resize", {{x}, {}, {floats({2}, {1, 2}), true}, {int64s({2}, {1, 8}), true}}, {}, 13,
              StatusCode::kInvalidInput, "only one of scales and sizes may be given");
  expectError("Resize", {{x}, {}, {floats({2}, {1, 2})}}, {}, 13, StatusCode::kInvalidInput,
              "must be known at build time");
  expectError("Resize", {{x}, {}, {floats({2}, {1, -2}), true}}, {}, 13, StatusCode::kInvalidInput,
              "scales must be positive and finite, got -2");
  expectError("Resize", {{x}, {}, {floats({1}, {2}), true}}, {}, 13, StatusCode::kInvalidInput,
              "scales has 1 values, expected 2");
  expectError("Resize", {{x}, {}, {floats({2}, {1, 2}), true}}, {{"mode", stringAttr("area")}}, 13,
              StatusCode::kInvalidInput, "unknown mode 'area'");
  expectError("Resize", {{x}, {}, {}, {int64s({2}, {1, 8}), true}},
              {{"coordinate_transformation_mode", stringAttr("tf_crop_and_resize")}}, 13,
              StatusCode::kInvalidInput, "tf_crop_and_resize needs roi");
}

TEST(Upsample, ScalesAttributeAtOpset7AndInputAtOpset9) {
  Tensor x = counting({1, 2});
  Tensor seven = runOk("Upsample", {{x}}, {{"scales", floatsAttr({1, 2})}}, 7);
  EXPECT_EQ(values<float>(seven), (std::vector<float>{1, 1, 2, 2}));
  Tensor nine =
      runOk("Upsample", {{x}, {floats({2}, {1, 2}), true}}, {{"mode", stringAttr("linear")}}, 9);
  // Asymmetric coordinates 0, 0.5, 1, 1.5 (clamped to the last element).
  expectNear(values<float>(nine), {1, 1.5f, 2, 2});
  expectError("Upsample", {{x}, {floats({2}, {1, 2}), true}}, {}, 10, StatusCode::kInvalidInput,
              "replaced by Resize at opset 10");
}

// --- Trilu, OneHot, DepthToSpace, SpaceToDepth ------------------------------------------------

TEST(Trilu, LowerWithNegativeKOverABatch) {
  Tensor x = Tensor::fromVector<int64_t>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor out = runOk("Trilu", {{x}, {int64s({}, {-1})}}, {{"upper", intAttr(0)}}, 14);
  EXPECT_EQ(values<int64_t>(out), (std::vector<int64_t>{0, 0, 3, 0, 0, 0, 7, 0}));
  expectError("Trilu", {{int64s({2}, {1, 2})}}, {}, 14, StatusCode::kInvalidInput,
              "input must have rank >= 2");
}

TEST(OneHot, NegativeIndicesCountFromTheBackOnlyFromOpset11) {
  std::vector<OpInput> inputs = {
      {int64s({2}, {-1, 1})}, {int64s({}, {3}), true}, {floats({2}, {0, 5})}};
  Tensor eleven = runOk("OneHot", inputs, {}, 11);
  EXPECT_EQ(eleven.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<float>(eleven), (std::vector<float>{0, 0, 5, 0, 5, 0}));
  Tensor nine = runOk("OneHot", inputs, {}, 9);
  EXPECT_EQ(values<float>(nine), (std::vector<float>{0, 0, 0, 0, 5, 0}));
}

TEST(OneHot, FloatIndicesTruncateAndAxisZero) {
  Tensor out = runOk(
      "OneHot", {{floats({2}, {1.7f, 7.0f})}, {floats({1}, {2}), true}, {int32s({2}, {-1, 1})}},
      {{"axis", intAttr(0)}}, 11);
  EXPECT_EQ(out.shape(), (Shape{2, 2}));
  // Column 0 is index 1.7 -> class 1; column 1 is out of range -> all off.
  EXPECT_EQ(values<int32_t>(out), (std::vector<int32_t>{-1, -1, 1, -1}));
}

TEST(OneHot, DepthMustBeConstantAndPositive) {
  Tensor indices = int64s({1}, {0});
  Tensor onOff = floats({2}, {0, 1});
  expectError("OneHot", {{indices}, {int64s({}, {3})}, {onOff}}, {}, 11, StatusCode::kInvalidInput,
              "must be known at build time");
  expectError("OneHot", {{indices}, {int64s({}, {0}), true}, {onOff}}, {}, 11,
              StatusCode::kInvalidInput, "depth must be positive, got 0");
  expectError("OneHot", {{indices}, {int64s({}, {2}), true}, {floats({3}, {0, 1, 2})}}, {}, 11,
              StatusCode::kInvalidInput, "values must have shape [2]");
}

TEST(DepthToSpace, SpaceToDepthInvertsDcr) {
  Tensor x = counting({1, 8, 2, 3});
  Tensor deep =
      runOk("SpaceToDepth", {{runOk("DepthToSpace", {{x}}, {{"blocksize", intAttr(2)}}, 13)}},
            {{"blocksize", intAttr(2)}}, 13);
  EXPECT_EQ(deep.shape(), x.shape());
  EXPECT_EQ(values<float>(deep), values<float>(x));
}

TEST(DepthToSpace, ErrorsNameTheProblem) {
  expectError("DepthToSpace", {{counting({1, 6, 2, 2})}}, {{"blocksize", intAttr(2)}}, 13,
              StatusCode::kInvalidInput, "channels 6 are not divisible by blocksize^2 = 4");
  expectError("DepthToSpace", {{counting({1, 4, 2, 2})}}, {}, 13, StatusCode::kInvalidInput,
              "blocksize");
  expectError("DepthToSpace", {{counting({1, 4, 2, 2})}},
              {{"blocksize", intAttr(2)}, {"mode", stringAttr("RDC")}}, 13,
              StatusCode::kInvalidInput, "unknown mode 'RDC'");
  expectError("SpaceToDepth", {{counting({1, 1, 3, 4})}}, {{"blocksize", intAttr(2)}}, 13,
              StatusCode::kInvalidInput, "height 3 and width 4 must be divisible by blocksize 2");
  expectError("SpaceToDepth", {{counting({4, 4})}}, {{"blocksize", intAttr(2)}}, 13,
              StatusCode::kInvalidInput, "input must have rank 4");
}

}  // namespace
}  // namespace kiln
