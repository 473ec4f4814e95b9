// Shape arithmetic, tensor storage and half-precision conversion.
#include "kiln/ir/tensor.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kiln::ir {
namespace {

TEST(Shape, CountsElements) {
  EXPECT_EQ(Shape({2, 3, 4}).checkedElementCount().value(), 24);
  EXPECT_EQ(Shape({}).checkedElementCount().value(), 1);
  EXPECT_EQ(Shape({5, 0}).checkedElementCount().value(), 0);
}

TEST(Shape, RejectsOverflowingProduct) {
  auto count = Shape({int64_t{1} << 31, int64_t{1} << 31, 8}).checkedElementCount();
  ASSERT_FALSE(count.isOk());
  EXPECT_NE(count.status().message().find("more than 2^40 elements"), std::string::npos)
      << count.status().message();
}

// The limit holds on the nonzero dimensions wherever a zero stands, so a shape and its reverse
// get the same answer (the .npy fuzzer found a Fortran-order file that read as [0,99,1e10,2] and
// wrote back as [2,1e10,99,0], which was then refused).
TEST(Shape, RefusesAnEmptyShapeWhoseOtherDimensionsOverflowInAnyOrder) {
  const int64_t big = int64_t{1} << 31;
  for (const Shape& shape : {Shape({0, big, big}), Shape({big, big, 0}), Shape({big, 0, big})}) {
    auto count = shape.checkedElementCount();
    ASSERT_FALSE(count.isOk()) << shape.toString();
    EXPECT_NE(count.status().message().find("more than 2^40 elements"), std::string::npos);
  }
  EXPECT_EQ(Shape({0, big, 2}).checkedElementCount().value(), 0);
  EXPECT_EQ(Shape({big, 2, 0}).checkedElementCount().value(), 0);
}

TEST(Shape, RejectsNegativeDimension) {
  auto count = Shape({2, -1}).checkedElementCount();
  ASSERT_FALSE(count.isOk());
  EXPECT_NE(count.status().message().find("negative dimension at axis 1"), std::string::npos);
}

TEST(Shape, Strides) { EXPECT_EQ(Shape({2, 3, 4}).strides(), (std::vector<int64_t>{12, 4, 1})); }

TEST(NormalizeAxis, HandlesNegativeAndOutOfRange) {
  EXPECT_EQ(normalizeAxis(-1, 4).value(), 3);
  EXPECT_EQ(normalizeAxis(2, 4).value(), 2);
  EXPECT_FALSE(normalizeAxis(4, 4).isOk());
  EXPECT_FALSE(normalizeAxis(-5, 4).isOk());
}

TEST(Tensor, CastTruncatesTowardZero) {
  Tensor t = Tensor::fromVector<float>(Shape{3}, {1.7f, -1.7f, 0.0f});
  Tensor i = t.castTo(DType::kInt64);
  EXPECT_EQ(i.data<int64_t>()[0], 1);
  EXPECT_EQ(i.data<int64_t>()[1], -1);
  Tensor b = t.castTo(DType::kBool);
  EXPECT_TRUE(b.data<bool>()[0]);
  EXPECT_FALSE(b.data<bool>()[2]);
}

TEST(Float16, RoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(static_cast<float>(Float16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(static_cast<float>(Float16(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Float16(NAN))));
  // 1 + 2^-11 is halfway between 1 and the next half; ties go to even (1.0).
  EXPECT_EQ(static_cast<float>(Float16(1.0f + 1.0f / 2048)), 1.0f);
  EXPECT_EQ(Float16(1.0f).bits, 0x3c00);
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(3.0f)), 3.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(NAN))));
}

}  // namespace
}  // namespace kiln::ir
