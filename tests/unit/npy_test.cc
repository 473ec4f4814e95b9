// .npy/.npz reading (against files numpy wrote) and writing (round trips, atomicity).
#include "kiln/ir/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kiln/base/file.h"

namespace kiln::ir {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(KILN_TEST_DATA_DIR) / "npy";

void expectFloats(const Tensor& t, const std::vector<float>& expected) {
  ASSERT_EQ(t.dtype(), DType::kFloat32);
  auto data = t.data<float>();
  ASSERT_EQ(data.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_FLOAT_EQ(data[i], expected[i]) << i;
}

// One folder per test and process: ctest runs these tests as parallel processes, and each
// removes its folder at the end (a folder shared by seed alone was removed under another test's
// feet: Npz.RoundTripsCompressed failed its write once under ctest -j2).
fs::path scratchDir() {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() /
                 ("kiln_npy_test_" + std::string(test->name()) + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

TEST(Npy, ReadsCOrderFloat32) {
  auto t = readNpy(kData / "c_float32.npy");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->shape(), Shape({2, 3}));
  expectFloats(*t, {0, 0.25, 0.5, 0.75, 1.0, 1.25});
}

TEST(Npy, ConvertsFortranOrderToRowMajor) {
  auto t = readNpy(kData / "fortran_float32.npy");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(t->shape(), Shape({2, 3}));
  expectFloats(*t, {0, 0.25, 0.5, 0.75, 1.0, 1.25});
}

TEST(Npy, SwapsBigEndian) {
  auto t = readNpy(kData / "bigendian_int32.npy");
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_EQ(t->dtype(), DType::kInt32);
  EXPECT_EQ(std::vector<int32_t>(t->data<int32_t>().begin(), t->data<int32_t>().end()),
            (std::vector<int32_t>{1, -2, 3, 400000}));
}

TEST(Npy, ReadsBoolScalarAndHalf) {
  auto b = readNpy(kData / "bool.npy");
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(b->dtype(), DType::kBool);
  EXPECT_TRUE(b->data<bool>()[0]);
  EXPECT_FALSE(b->data<bool>()[1]);
  auto s = readNpy(kData / "scalar_float64.npy");
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(s->rank(), 0u);
  EXPECT_EQ(s->data<double>()[0], 2.5);
  auto h = readNpy(kData / "float16.npy");
  ASSERT_TRUE(h.isOk());
  EXPECT_EQ(static_cast<float>(h->data<Float16>()[0]), 1.5f);
  EXPECT_EQ(static_cast<float>(h->data<Float16>()[1]), -0.25f);
}

TEST(Npz, ReadsStoredAndCompressedArchives) {
  for (const char* file : {"pair_stored.npz", "pair_compressed.npz"}) {
    auto tensors = readNpz(kData / file);
    ASSERT_TRUE(tensors.isOk()) << file << ": " << tensors.status().message();
    ASSERT_EQ(tensors->size(), 2u);
    EXPECT_EQ((*tensors)[0].first, "x");
    expectFloats((*tensors)[0].second, {0, 0.25, 0.5, 0.75, 1.0, 1.25});
    EXPECT_EQ((*tensors)[1].first, "mask");
    EXPECT_EQ((*tensors)[1].second.shape(), Shape({1, 3}));
    EXPECT_EQ((*tensors)[1].second.data<int64_t>()[2], 1);
  }
}

TEST(Npy, RoundTripsEveryNumpyDType) {
  const fs::path dir = scratchDir();
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt64,
                      DType::kInt32, DType::kInt16, DType::kInt8, DType::kUInt64, DType::kUInt32,
                      DType::kUInt16, DType::kUInt8, DType::kBool}) {
    Tensor source = Tensor::fromVector<float>(Shape{2, 2}, {1, 0, 3, 4}).castTo(dtype);
    const fs::path file = dir / "t.npy";
    ASSERT_TRUE(writeNpy(file, source).isOk());
    auto back = readNpy(file);
    ASSERT_TRUE(back.isOk()) << back.status().message();
    EXPECT_EQ(back->dtype(), dtype);
    EXPECT_EQ(back->shape(), source.shape());
    EXPECT_EQ(std::memcmp(back->rawData(), source.rawData(), source.byteSize()), 0);
  }
  fs::remove_all(dir);
}

TEST(Npz, RoundTripsCompressed) {
  const fs::path dir = scratchDir();
  NamedTensors tensors = {{"a", Tensor::fromVector<float>(Shape{3}, {1, 2, 3})},
                          {"b", Tensor::scalar<int64_t>(7)}};
  ASSERT_TRUE(writeNpz(dir / "o.npz", tensors, /*compressed=*/true).isOk());
  auto back = readNpz(dir / "o.npz");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].first, "b");
  EXPECT_EQ((*back)[1].second.data<int64_t>()[0], 7);
  EXPECT_FALSE(fs::exists(temporaryPathFor(dir / "o.npz")));
  fs::remove_all(dir);
}

TEST(Npy, RefusesBFloat16WithReason) {
  auto bytes = serializeNpy(Tensor(DType::kBFloat16, Shape{1}));
  ASSERT_FALSE(bytes.isOk());
  EXPECT_NE(bytes.status().message().find("numpy has no such dtype"), std::string::npos);
}

TEST(Npy, RejectsTruncatedData) {
  auto whole = readFileBytes(kData / "c_float32.npy");
  ASSERT_TRUE(whole.isOk());
  auto t = parseNpy(std::string_view(*whole).substr(0, whole->size() - 4), "cut.npy");
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(t.status().message(),
            "cut.npy: .npy data holds 20 bytes, but shape [2,3] of float32 needs 24");
}

// A version-1 .npy file with this header text (padded as numpy pads it) and these data bytes.
std::string npyWith(const std::string& header, const std::string& data) {
  std::string text = header;
  while ((10 + text.size() + 1) % 64 != 0) text.push_back(' ');
  text.push_back('\n');
  std::string bytes = "\x93NUMPY\x01";
  bytes.push_back('\0');
  bytes.push_back(static_cast<char>(text.size() & 0xff));
  bytes.push_back(static_cast<char>(text.size() >> 8));
  return bytes + text + data;
}

// The shape is checked against the bytes present before the tensor is allocated: a file of a
// hundred bytes declaring a terabyte is refused, not allocated (it used to throw bad_alloc).
TEST(Npy, RefusesAShapeLargerThanItsDataBeforeAllocating) {
  auto t = parseNpy(npyWith("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, "
                            "1048576), }",
                            "abcd"),
                    "huge.npy");
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(t.status().message(),
            "huge.npy: .npy data holds 4 bytes, but shape [1048576,1048576] of float32 needs "
            "4398046511104");
}

// The header's fields are found by a scan: in any order, with either quotes and spacing, and a
// long header is refused (std::regex, used before, recursed once per character).
TEST(Npy, ReadsHeaderFieldsInAnyOrderAndRefusesAnOverlongHeader) {
  auto t = parseNpy(npyWith("{ \"shape\" :(2,),\"fortran_order\":False , 'descr':'<f4'}",
                            std::string("\0\0\x80\x3f\0\0\0\x40", 8)),
                    "order.npy");
  ASSERT_TRUE(t.isOk()) << t.status().toString();
  expectFloats(*t, {1.0f, 2.0f});
  auto missing = parseNpy(npyWith("{'descr': '<f4', 'shape': (2,), }", ""), "missing.npy");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().message(), "missing.npy: .npy header has no 'fortran_order' field");
  std::string longHeader = "\x93NUMPY\x02";
  longHeader.push_back('\0');
  const uint32_t length = 1u << 20;
  for (int i = 0; i < 4; ++i) longHeader.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  longHeader += std::string(length, ' ');
  auto overlong = parseNpy(longHeader, "long.npy");
  ASSERT_FALSE(overlong.isOk());
  EXPECT_EQ(overlong.status().message(),
            "long.npy: .npy header of 1048576 bytes is longer than kiln reads (65536)");
}

// A dimension may have spaces around it, not inside it ("(2,99 9)" is not (2,999)), and an empty
// array whose other dimensions pass kiln's limit in one order passes it in the other.
TEST(Npy, RefusesSpacesInsideADimensionAndReadsEmptyArraysInEitherOrder) {
  auto spaced = parseNpy(
      npyWith("{'descr': '<f4', 'fortran_order': False, 'shape': (2,99\v9), }", ""), "spaced.npy");
  ASSERT_FALSE(spaced.isOk());
  EXPECT_NE(spaced.status().message().find("spaced.npy: .npy shape (2,99\v9) is malformed"),
            std::string::npos)
      << spaced.status().message();
  auto padded =
      parseNpy(npyWith("{'descr': '<f4', 'fortran_order': False, 'shape': ( 2 ,\t1 , ), }",
                       std::string(8, '\0')),
               "padded.npy");
  ASSERT_TRUE(padded.isOk()) << padded.status().toString();
  EXPECT_EQ(padded->shape(), Shape({2, 1}));
  for (const char* order : {"True", "False"}) {
    auto empty = parseNpy(npyWith(std::string("{'descr': '<f4', 'fortran_order': ") + order +
                                      ", 'shape': (2, 9999999990, 99, 0), }",
                                  ""),
                          "empty.npy");
    ASSERT_FALSE(empty.isOk()) << order;
    EXPECT_NE(empty.status().message().find("more than 2^40 elements"), std::string::npos)
        << empty.status().message();
    auto fits = parseNpy(npyWith(std::string("{'descr': '<f4', 'fortran_order': ") + order +
                                     ", 'shape': (2, 99999, 0), }",
                                 ""),
                         "fits.npy");
    ASSERT_TRUE(fits.isOk()) << fits.status().toString();
    auto back = parseNpy(serializeNpy(*fits).value(), "back.npy");
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_EQ(back->shape(), fits->shape());
  }
}

TEST(Npy, RejectsNonNpy) {
  auto t = parseNpy("hello, this is not numpy", "x.npy");
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(t.status().message(), "x.npy: not a .npy file (bad magic)");
}

TEST(Npz, RejectsNonZip) {
  const fs::path dir = scratchDir();
  ASSERT_TRUE(writeFileAtomically(dir / "bad.npz", "not a zip file at all").isOk());
  auto t = readNpz(dir / "bad.npz");
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("is not a readable .npz (zip) archive"), std::string::npos)
      << t.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::ir
