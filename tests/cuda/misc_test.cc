// The CUDA steps of the ops of no other family (misc_steps.cc) against the reference executor:
// CumSum (every flag, constant and runtime axes, long lines), Einsum (products, diagonals, traces,
// broadcasting, three operands), OneHot, TopK (ties, NaN, both orders, long lines), EyeLike,
// Dropout with its mask or a training_mode input, and unfolded ConstantOfShape and Range, over
// several dtypes each.
#include <cmath>
#include <limits>
#include <random>

#include "cuda_test_util.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

// Seeded data of any dtype (integers in [-20, 20), unsigned ones in [0, 20)).
Tensor dataOf(DType dtype, Shape shape, unsigned seed) {
  switch (dtype) {
    case DType::kFloat32:
      return uniformTensor(std::move(shape), seed, -2, 2);
    case DType::kBool:
      return uniformTensor(std::move(shape), seed, 0, 2).castTo(DType::kInt64).castTo(dtype);
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return uniformTensor(std::move(shape), seed, 0, 20).castTo(DType::kInt64).castTo(dtype);
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat64:
      return uniformTensor(std::move(shape), seed, -2, 2).castTo(dtype);
    default:
      return uniformTensor(std::move(shape), seed, -20, 20).castTo(DType::kInt64).castTo(dtype);
  }
}

Tensor floats(Shape shape, unsigned seed) {
  return dataOf(DType::kFloat32, std::move(shape), seed);
}

Tensor ints(std::vector<int64_t> values) {
  return Tensor::fromVector<int64_t>(Shape{static_cast<int64_t>(values.size())}, values);
}

Tensor floatValues(Shape shape, std::vector<float> values) {
  return Tensor::fromVector<float>(std::move(shape), values);
}

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }

// A case with the tolerance the dtype needs: exact for integers and bool, 1e-5 relative for
// float32 and float64, a few half-precision ulps for float16 and bfloat16.
CudaOpCase opCase(std::string op, std::vector<OpInput> inputs, CudaAttributes attributes,
                  std::string tactic, DType dtype = DType::kFloat32, int opset = 18,
                  int outputs = 1, std::string route = "") {
  CudaOpCase c;
  c.opType = std::move(op);
  c.inputs = std::move(inputs);
  c.attributes = std::move(attributes);
  c.opset = opset;
  c.outputCount = outputs;
  c.route = std::move(route);
  c.expectTactic = std::move(tactic);
  if (!ir::isFloating(dtype)) {
    c.rtol = 0;
    c.atol = 0;
  } else if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    c.rtol = 1e-2;
    c.atol = 1e-2;
  }
  return c;
}

// --- CumSum ------------------------------------------------------------------------------------

TEST(CudaMisc, CumSumEveryFlagAxisAndDtype) {
  const std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kInt64,
                                    DType::kInt32,   DType::kUInt32,  DType::kUInt64,
                                    DType::kFloat16, DType::kBFloat16};
  for (DType dtype : types) {
    const Tensor x = dataOf(dtype, {3, 4, 37}, 1);
    for (int64_t axis : {0, 1, -1}) {
      for (int64_t exclusive : {0, 1}) {
        for (int64_t reverse : {0, 1}) {
          SCOPED_TRACE(std::string(ir::dtypeName(dtype)) + " axis " + std::to_string(axis) +
                       " exclusive " + std::to_string(exclusive) + " reverse " +
                       std::to_string(reverse));
          expectCudaMatchesReference(
              opCase("CumSum", {runtime(x), constant(Tensor::scalar<int64_t>(axis))},
                     {{"exclusive", intAttr(exclusive)}, {"reverse", intAttr(reverse)}},
                     "kiln.cumsum", dtype));
        }
      }
    }
  }
}

TEST(CudaMisc, CumSumLongLinesAndInt32Axis) {
  // 1000 elements along the innermost axis: the warp scan's carry across 32-element chunks.
  const Tensor x = floats({3, 1000}, 2);
  for (int64_t reverse : {0, 1}) {
    expectCudaMatchesReference(
        opCase("CumSum", {runtime(x), constant(Tensor::fromVector<int32_t>(Shape{1}, {1}))},
               {{"reverse", intAttr(reverse)}, {"exclusive", intAttr(1)}}, "kiln.cumsum"));
  }
  // Integers wrap as the reference's 64-bit sums do.
  expectCudaMatchesReference(
      opCase("CumSum",
             {runtime(Tensor::fromVector<int32_t>(Shape{4}, {2147483647, 1, -5, 2147483647})),
              constant(Tensor::scalar<int64_t>(0))},
             {}, "kiln.cumsum", DType::kInt32));
}

TEST(CudaMisc, CumSumReadsARuntimeAxisOnTheDevice) {
  const Tensor x = floats({2, 3, 5}, 3);
  for (int64_t axis : {0, 1, 2, -1, -3}) {
    SCOPED_TRACE(axis);
    expectCudaMatchesReference(opCase("CumSum",
                                      {runtime(x), runtime(Tensor::scalar<int64_t>(axis))},
                                      {{"exclusive", intAttr(axis == 1)}}, "kiln.cumsum"));
    expectCudaMatchesReference(
        opCase("CumSum",
               {runtime(dataOf(DType::kInt64, {2, 3, 5}, 4)),
                runtime(Tensor::fromVector<int32_t>(Shape{1}, {static_cast<int32_t>(axis)}))},
               {{"reverse", intAttr(1)}}, "kiln.cumsum", DType::kInt64));
  }
}

// --- Einsum ------------------------------------------------------------------------------------

struct EinsumCase {
  std::string equation;
  std::vector<Shape> shapes;
  bool product;  // one batch of matrix products: cuBLASLt for float types by default
};

const std::vector<EinsumCase>& einsumCases() {
  static const std::vector<EinsumCase> cases = {
      {"ij,jk->ik", {{3, 5}, {5, 4}}, true},
      {"ij,jk->ki", {{3, 5}, {5, 4}}, true},  // the transposed product, operands swapped
      {"bij,bjk->bik", {{2, 3, 5}, {2, 5, 4}}, true},
      {"bhid,bhjd->bhij", {{2, 3, 4, 8}, {2, 3, 5, 8}}, true},
      {"bhij,bhjd->bhid", {{2, 3, 4, 5}, {2, 3, 5, 8}}, true},
      {"ji,kj->ik", {{5, 3}, {4, 5}}, true},                    // both operands stored transposed
      {"abcd,cdef->abef", {{2, 3, 4, 5}, {4, 5, 2, 3}}, true},  // grouped rows, sums, columns
      {"bij,jk->bik", {{2, 3, 5}, {5, 4}}, true},               // the batch folds into the rows
      {"bij,bj->bi", {{2, 3, 4}, {2, 4}}, true},
      {"i,i", {{7}, {7}}, true},
      {"i,j->ij", {{3}, {4}}, true},
      {"ij,kj", {{3, 4}, {2, 4}}, true},
      {"...ij,...jk->...ik", {{2, 3, 4}, {1, 4, 2}}, true},
      // Not one product: the native kernel.
      {"bqhd,bkhd->bhqk", {{2, 4, 3, 8}, {2, 5, 3, 8}}, false},  // the batch is not one run
      {"...ij,...jk->...ik", {{2, 1, 3, 4}, {3, 4, 2}}, false},  // broadcast batch
      {"ij,ij->ij", {{3, 4}, {1, 4}}, false},
      {"ij,jk->", {{3, 5}, {5, 4}}, false},  // a label summed within one operand
      {"ij->ji", {{3, 4}}, false},
      {"ii->i", {{4, 4}}, false},
      {"ii", {{5, 5}}, false},
      {"bii->bi", {{2, 3, 3}}, false},
      {"ii,ij->ij", {{3, 3}, {3, 4}}, false},
      {"abc,cd,de->abe", {{2, 3, 4}, {4, 5}, {5, 3}}, false},
  };
  return cases;
}

TEST(CudaMisc, EinsumNativeKernelEveryEquationAndDtype) {
  const std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kInt32,
                                    DType::kFloat16};
  unsigned seed = 10;
  for (const EinsumCase& e : einsumCases()) {
    for (DType dtype : types) {
      SCOPED_TRACE(e.equation + " " + std::string(ir::dtypeName(dtype)));
      std::vector<OpInput> inputs;
      for (const Shape& shape : e.shapes) inputs.push_back(runtime(dataOf(dtype, shape, ++seed)));
      expectCudaMatchesReference(opCase("Einsum", std::move(inputs),
                                        {{"equation", stringAttr(e.equation)}}, "kiln.einsum",
                                        dtype, 18, 1, "-cuda.einsum.impl=native"));
    }
  }
}

TEST(CudaMisc, EinsumAsAMatrixProduct) {
  unsigned seed = 100;
  for (const EinsumCase& e : einsumCases()) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64}) {
      SCOPED_TRACE(e.equation + " " + std::string(ir::dtypeName(dtype)));
      std::vector<OpInput> inputs;
      for (const Shape& shape : e.shapes) inputs.push_back(runtime(dataOf(dtype, shape, ++seed)));
      const bool product = e.product && dtype != DType::kInt64;
      CudaOpCase c = opCase("Einsum", std::move(inputs), {{"equation", stringAttr(e.equation)}},
                            product ? "cublaslt" : "kiln.einsum", dtype);
      if (product && dtype == DType::kFloat32) {
        c.rtol = 1e-4;  // float32 sums, as MatMul's
        c.atol = 1e-5;
      }
      expectCudaMatchesReference(c);
    }
  }
}

TEST(CudaMisc, EinsumWithConstantOperandAndEmptySum) {
  for (const std::string impl : {"gemm", "native"}) {
    CudaOpCase c =
        opCase("Einsum", {runtime(floats({4, 6}, 30)), constant(floats({6, 3}, 31))},
               {{"equation", stringAttr("ij,jk->ik")}}, impl == "gemm" ? "cublaslt" : "kiln.einsum",
               DType::kFloat32, 18, 1, "-cuda.einsum.impl=" + impl);
    c.rtol = 1e-4;
    c.atol = 1e-5;
    expectCudaMatchesReference(c);
  }
  // A summed label of size 0: every output element is an empty sum, zero (the native kernel).
  expectCudaMatchesReference(opCase("Einsum",
                                    {runtime(floats({3, 0}, 32)), runtime(floats({0, 2}, 33))},
                                    {{"equation", stringAttr("ij,jk->ik")}}, "kiln.einsum"));
}

// --- OneHot ------------------------------------------------------------------------------------

TEST(CudaMisc, OneHotEveryAxisIndexTypeAndValueType) {
  // In range, negative (from the back at opset 11), out of range both ways.
  const std::vector<int64_t> raw = {0, 4, -1, -5, 5, 7, -6, 2, 3, 1, -2, 9};
  const Tensor indices = Tensor::fromVector<int64_t>(Shape{3, 4}, raw);
  const Tensor depth = Tensor::fromVector<int64_t>(Shape{1}, {5});
  const Tensor floatOnOff = floatValues(Shape{2}, {-1.5f, 3.25f});
  for (int64_t axis : {-1, 0, 1}) {
    SCOPED_TRACE(axis);
    expectCudaMatchesReference(opCase("OneHot",
                                      {runtime(indices), constant(depth), runtime(floatOnOff)},
                                      {{"axis", intAttr(axis)}}, "kiln.one_hot"));
  }
  expectCudaMatchesReference(opCase(
      "OneHot", {runtime(indices.castTo(DType::kInt32)), constant(depth), constant(ints({0, 7}))},
      {}, "kiln.one_hot", DType::kInt64));
  // Float indices truncate toward zero; NaN and infinities select nothing.
  const Tensor floatIndices = floatValues(
      Shape{8}, {1.7f, -0.5f, -1.2f, 4.99f, 5.5f, std::numeric_limits<float>::quiet_NaN(),
                 std::numeric_limits<float>::infinity(), -5.9f});
  expectCudaMatchesReference(opCase(
      "OneHot", {runtime(floatIndices), constant(depth), runtime(floatOnOff)}, {}, "kiln.one_hot"));
  // Before opset 11 negative indices select nothing.
  expectCudaMatchesReference(opCase("OneHot",
                                    {runtime(indices), constant(depth), runtime(floatOnOff)}, {},
                                    "kiln.one_hot", DType::kFloat32, 9));
}

// --- TopK --------------------------------------------------------------------------------------

TEST(CudaMisc, TopKBothOrdersEveryAxisAndTies) {
  // Integers in [-20, 20) over 30 elements: many ties, which keep the lower index first.
  const Tensor x = dataOf(DType::kInt64, {3, 30, 4}, 40);
  for (int64_t axis : {0, 1, 2, -1}) {
    for (int64_t largest : {1, 0}) {
      const int64_t k = axis == 1 ? 7 : 2;
      SCOPED_TRACE("axis " + std::to_string(axis) + " largest " + std::to_string(largest));
      expectCudaMatchesReference(opCase("TopK", {runtime(x), constant(ints({k}))},
                                        {{"axis", intAttr(axis)}, {"largest", intAttr(largest)}},
                                        "kiln.topk", DType::kInt64, 18, 2));
    }
  }
}

TEST(CudaMisc, TopKPlacesNaNLastAndServesEveryDtype) {
  Tensor x = floats({2, 9}, 41);
  x.mutableData<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  x.mutableData<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  x.mutableData<float>()[5] = std::numeric_limits<float>::infinity();
  x.mutableData<float>()[10] = -std::numeric_limits<float>::infinity();
  x.mutableData<float>()[12] = x.mutableData<float>()[13];  // a tie
  for (int64_t largest : {1, 0}) {
    expectCudaMatchesReference(opCase("TopK", {runtime(x), constant(ints({9}))},
                                      {{"largest", intAttr(largest)}}, "kiln.topk", DType::kFloat32,
                                      18, 2));
  }
  for (DType dtype :
       {DType::kFloat64, DType::kFloat16, DType::kInt32, DType::kUInt8, DType::kInt8}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(opCase("TopK",
                                      {runtime(dataOf(dtype, {5, 11}, 42)), constant(ints({4}))},
                                      {}, "kiln.topk", DType::kInt64, 18, 2));
  }
}

TEST(CudaMisc, TopKLongLinesAndOlderOpsets) {
  // 3000 elements per line: ranks counted across many tiles, k small and large.
  const Tensor x = floats({2, 3000}, 43);
  for (int64_t k : {1, 5, 700}) {
    expectCudaMatchesReference(
        opCase("TopK", {runtime(x), constant(ints({k}))}, {}, "kiln.topk", DType::kFloat32, 18, 2));
  }
  // Opset 10: K as an input, always the largest; opset 1: K as an attribute.
  expectCudaMatchesReference(opCase("TopK", {runtime(floats({4, 6}, 44)), constant(ints({3}))},
                                    {{"axis", intAttr(0)}}, "kiln.topk", DType::kFloat32, 10, 2));
  expectCudaMatchesReference(opCase("TopK", {runtime(floats({4, 6}, 45))}, {{"k", intAttr(2)}},
                                    "kiln.topk", DType::kFloat32, 1, 2));
}

// --- EyeLike -----------------------------------------------------------------------------------

TEST(CudaMisc, EyeLikeEveryDiagonalAndDtype) {
  const Tensor x = floats({4, 6}, 50);
  for (int64_t k : {0, 2, -3, 6, -4, 5}) {
    SCOPED_TRACE(k);
    expectCudaMatchesReference(
        opCase("EyeLike", {runtime(x)}, {{"k", intAttr(k)}}, "kiln.eye_like"));
  }
  // The dtype attribute (ONNX codes: 7 int64, 11 double, 9 bool, 10 float16) and the input's.
  for (int64_t code : {7, 11, 9, 10}) {
    SCOPED_TRACE(code);
    expectCudaMatchesReference(opCase("EyeLike", {runtime(x)}, {{"dtype", intAttr(code)}},
                                      "kiln.eye_like", DType::kInt64));
  }
  expectCudaMatchesReference(opCase("EyeLike", {runtime(dataOf(DType::kInt32, {5, 3}, 51))},
                                    {{"k", intAttr(-1)}}, "kiln.eye_like", DType::kInt32));
}

// --- Dropout -----------------------------------------------------------------------------------

const std::string kKeepDropout = "-graph.eliminate_identity=off";

TEST(CudaMisc, DropoutWritesAnAllTrueMask) {
  const Tensor x = floats({3, 7}, 60);
  expectCudaMatchesReference(
      opCase("Dropout", {runtime(x)}, {}, "kiln.dropout", DType::kFloat32, 13, 2, kKeepDropout));
  // With a ratio and training_mode false (constant), and with training on at ratio 0.
  expectCudaMatchesReference(opCase(
      "Dropout",
      {runtime(x), constant(Tensor::scalar<float>(0.5f)), constant(Tensor::scalar<bool>(false))},
      {}, "kiln.dropout", DType::kFloat32, 13, 2, kKeepDropout));
  expectCudaMatchesReference(opCase(
      "Dropout",
      {runtime(x), constant(Tensor::scalar<float>(0.0f)), constant(Tensor::scalar<bool>(true))}, {},
      "kiln.dropout", DType::kFloat32, 13, 2, kKeepDropout));
  // Before opset 10 the mask has the input's type.
  expectCudaMatchesReference(opCase("Dropout", {runtime(dataOf(DType::kFloat64, {5}, 61))}, {},
                                    "kiln.dropout", DType::kFloat64, 7, 2, kKeepDropout));
}

TEST(CudaMisc, DropoutChecksARuntimeTrainingMode) {
  const Tensor x = floats({2, 5}, 62);
  // Training off at runtime, with and without the mask; training on with a runtime ratio of 0.
  expectCudaMatchesReference(opCase(
      "Dropout",
      {runtime(x), runtime(Tensor::scalar<float>(0.3f)), runtime(Tensor::scalar<bool>(false))}, {},
      "kiln.dropout.checked", DType::kFloat32, 13, 2, kKeepDropout));
  expectCudaMatchesReference(
      opCase("Dropout", {runtime(x), OpInput{}, runtime(Tensor::scalar<bool>(false))}, {},
             "kiln.dropout.checked", DType::kFloat32, 13, 1, kKeepDropout));
  expectCudaMatchesReference(opCase(
      "Dropout",
      {runtime(x), runtime(Tensor::scalar<float>(0.0f)), runtime(Tensor::scalar<bool>(true))}, {},
      "kiln.dropout.checked", DType::kFloat32, 13, 2, kKeepDropout));
}

TEST(CudaMisc, DropoutRefusesRuntimeTrainingWithANonzeroRatio) {
  // The reference refuses random masking; so does the GPU step, when it reads the mode.
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("-cuda.host_fallback=off " + kKeepDropout).isOk());
  const std::vector<OpInput> inputs = {runtime(floats({4}, 63)),
                                       runtime(Tensor::scalar<float>(0.5f)),
                                       runtime(Tensor::scalar<bool>(true))};
  auto build = buildCuda(makeSingleOpGraph("Dropout", inputs, {}, 13, 2), config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  EXPECT_EQ(cudaTacticOf(*build, "Dropout"), "kiln.dropout.checked");
  EXPECT_FALSE(runSingleOp("Dropout", inputs, {}, 13, 2).isOk());
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  auto run = build->plan.run({inputs[0].tensor, inputs[1].tensor, inputs[2].tensor});
  ASSERT_FALSE(run.isOk());
  EXPECT_NE(run.status().message().find("training-mode Dropout"), std::string::npos)
      << run.status().toString();
}

// --- ConstantOfShape and Range (unfolded) -------------------------------------------------------

// Shape inference folds outputs of up to 2^16 elements and graph.fold_constants the rest unless
// it is off: these outputs are larger, and folding is off.
const std::string kNoFolding = "-graph.fold_constants=off";

TEST(CudaMisc, ConstantOfShapeFillsWhereNotFolded) {
  const Tensor shape = ints({3, 1, 30000});
  expectCudaMatchesReference(opCase("ConstantOfShape", {constant(shape)}, {}, "kiln.fill",
                                    DType::kFloat32, 18, 1, kNoFolding));
  expectCudaMatchesReference(
      opCase("ConstantOfShape", {constant(shape)},
             {{"value", ir::Attribute{Tensor::fromVector<int64_t>(Shape{1}, {-7})}}}, "kiln.fill",
             DType::kInt64, 18, 1, kNoFolding));
  expectCudaMatchesReference(
      opCase("ConstantOfShape", {constant(shape)},
             {{"value",
               ir::Attribute{Tensor::fromVector<float>(Shape{1}, {2.5f}).castTo(DType::kFloat16)}}},
             "kiln.fill", DType::kFloat16, 18, 1, kNoFolding));
}

TEST(CudaMisc, RangeWhereNotFolded) {
  expectCudaMatchesReference(
      opCase("Range",
             {constant(Tensor::scalar<float>(0.5f)), constant(Tensor::scalar<float>(70000.5f)),
              constant(Tensor::scalar<float>(0.7f))},
             {}, "kiln.range", DType::kFloat32, 18, 1, kNoFolding));
  expectCudaMatchesReference(
      opCase("Range",
             {constant(Tensor::scalar<int64_t>(10)), constant(Tensor::scalar<int64_t>(-300000)),
              constant(Tensor::scalar<int64_t>(-4))},
             {}, "kiln.range", DType::kInt64, 18, 1, kNoFolding));
  expectCudaMatchesReference(
      opCase("Range",
             {constant(Tensor::scalar<int32_t>(-2)), constant(Tensor::scalar<int32_t>(200000)),
              constant(Tensor::scalar<int32_t>(2))},
             {}, "kiln.range", DType::kInt32, 18, 1, kNoFolding));
  expectCudaMatchesReference(
      opCase("Range",
             {constant(Tensor::scalar<double>(1.0)), constant(Tensor::scalar<double>(2.0)),
              constant(Tensor::scalar<double>(1e-5))},
             {}, "kiln.range", DType::kFloat64, 18, 1, kNoFolding));
}

}  // namespace
}  // namespace kiln::testing
