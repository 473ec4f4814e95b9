// The kiln binary as a user runs it: good runs, and bad input that must fail with a message a
// user can act on, never a crash.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../unit/cpu_route_util.h"
#include "kiln/base/file.h"
#include "kiln/ir/npy.h"

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int exitCode = -1;
  std::string out;
  std::string err;
};

class KilnCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("kiln_e2e_{}_{}", info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Outcome kiln(const std::string& args) {
    const fs::path out = dir_ / "stdout.txt";
    const fs::path err = dir_ / "stderr.txt";
    const std::string command =
        fmt::format("'{}' {} > '{}' 2> '{}'", KILN_BINARY, args, out.string(), err.string());
    const int status = std::system(command.c_str());
    Outcome outcome;
    // A signal (a crash) shows as a non-exited status: the tests treat it as a failure.
    outcome.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.out = kiln::readFileBytes(out).value();
    outcome.err = kiln::readFileBytes(err).value();
    return outcome;
  }

  static fs::path model(const std::string& stem) {
    return fs::path(KILN_E2E_MODEL_DIR) / (stem + ".onnx");
  }

  // Copies a fixture model into the scratch folder (for external-data layouts).
  fs::path stage(const std::string& stem, const fs::path& folder) {
    fs::create_directories(folder);
    const fs::path target = folder / (stem + ".onnx");
    fs::copy_file(model(stem), target, fs::copy_options::overwrite_existing);
    return target;
  }

  void writeFile(const fs::path& path, const std::string& bytes) {
    ASSERT_TRUE(kiln::writeFileAtomically(path, bytes).isOk());
  }

  fs::path dir_;
};

void expectUserError(const Outcome& outcome, const std::string& message) {
  EXPECT_EQ(outcome.exitCode, 1) << outcome.err;
  EXPECT_NE(outcome.err.find(message), std::string::npos)
      << "stderr was: " << outcome.err << "\nexpected to contain: " << message;
}

TEST_F(KilnCli, InspectDescribesTheSampleModel) {
  Outcome outcome = kiln(fmt::format("inspect '{}'", KILN_SAMPLE_MODEL));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.err;
  EXPECT_NE(outcome.out.find("image : float32[1,3,32,32]"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find("probs : float32[1,10]"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find("Conv                     4"), std::string::npos) << outcome.out;
  // 3*16*9+16 + 4*16 + 2*(16*16*9+16) + 16*32+32 + 32*10+10
  EXPECT_NE(outcome.out.find("parameters: 6026"), std::string::npos) << outcome.out;
  // The roofline's counts: the classifier Gemm's 32 x 10 multiply-adds, every parameter's bytes.
  EXPECT_NE(outcome.out.find("Gemm                   640 in 1 nodes"), std::string::npos)
      << outcome.out;
  EXPECT_NE(outcome.out.find("weight_bytes: 24104"), std::string::npos) << outcome.out;
}

TEST_F(KilnCli, RunSavesOutputsThatSumToOne) {
  const fs::path outputs = dir_ / "out.npz";
  Outcome outcome =
      kiln(fmt::format("run '{}' --saveOutputs '{}'", KILN_SAMPLE_MODEL, outputs.string()));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.err;
  auto saved = kiln::ir::readNpz(outputs);
  ASSERT_TRUE(saved.isOk()) << saved.status().message();
  ASSERT_EQ(saved->size(), 1u);
  EXPECT_EQ((*saved)[0].first, "probs");
  double sum = 0;
  for (float p : (*saved)[0].second.data<float>()) {
    EXPECT_GE(p, 0.0f);
    sum += p;
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

// --saveInputs writes the seeded inputs; loading them back gives the same outputs bit for bit.
TEST_F(KilnCli, SavedInputsLoadBackToTheSameOutputs) {
  const fs::path inputs = dir_ / "in.npz", first = dir_ / "a.npz", second = dir_ / "b.npz";
  ASSERT_EQ(kiln(fmt::format("run '{}' --seed 7 --duration 0 --saveInputs '{}' --saveOutputs '{}'",
                             KILN_SAMPLE_MODEL, inputs.string(), first.string()))
                .exitCode,
            0);
  auto saved = kiln::ir::readNpz(inputs);
  ASSERT_TRUE(saved.isOk()) << saved.status().message();
  ASSERT_EQ(saved->size(), 1u);
  EXPECT_EQ((*saved)[0].first, "image");
  EXPECT_EQ((*saved)[0].second.shape(), (kiln::ir::Shape{1, 3, 32, 32}));
  Outcome loaded = kiln(fmt::format("run '{}' --duration 0 --loadInputs '{}' --saveOutputs '{}'",
                                    KILN_SAMPLE_MODEL, inputs.string(), second.string()));
  ASSERT_EQ(loaded.exitCode, 0) << loaded.err;
  EXPECT_NE(loaded.out.find("(loaded)"), std::string::npos) << loaded.out;
  auto a = kiln::ir::readNpz(first);
  auto b = kiln::ir::readNpz(second);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_EQ((*a)[0].second.byteSize(), (*b)[0].second.byteSize());
  EXPECT_EQ(std::memcmp((*a)[0].second.rawData(), (*b)[0].second.rawData(),
                        static_cast<size_t>((*a)[0].second.byteSize())),
            0);
  Outcome bad = kiln(fmt::format("run '{}' --duration 0 --saveInputs '{}'", KILN_SAMPLE_MODEL,
                                 (dir_ / "in.txt").string()));
  EXPECT_NE(bad.exitCode, 0);
  EXPECT_NE(bad.err.find("--saveInputs"), std::string::npos) << bad.err;
}

// The CUDA backend: without a GPU (CI) a clear error; with one, the outputs of the CPU backend.
TEST_F(KilnCli, RunOnTheGpuMatchesTheCpuOrSaysThereIsNoGpu) {
  const fs::path onCpu = dir_ / "cpu.npz";
  const fs::path onGpu = dir_ / "gpu.npz";
  Outcome gpu = kiln(fmt::format("run '{}' --backend cuda --duration 0 --saveOutputs '{}'",
                                 KILN_SAMPLE_MODEL, onGpu.string()));
#if KILN_HAVE_CUDA
  if (gpu.exitCode != 0) {
    expectUserError(gpu, "no CUDA device is visible");
    return;
  }
  EXPECT_NE(gpu.out.find("GPU compute time over"), std::string::npos) << gpu.out;
  ASSERT_EQ(kiln(fmt::format("run '{}' --duration 0 --saveOutputs '{}'", KILN_SAMPLE_MODEL,
                             onCpu.string()))
                .exitCode,
            0);
  auto a = kiln::ir::readNpz(onCpu), b = kiln::ir::readNpz(onGpu);
  ASSERT_TRUE(a.isOk() && b.isOk());
  const auto& x = (*a)[0].second;
  const auto& y = (*b)[0].second;
  ASSERT_EQ(x.shape(), y.shape());
  for (int64_t i = 0; i < x.elementCount(); ++i) {
    EXPECT_NEAR(x.elementAsDouble(i), y.elementAsDouble(i), 1e-5) << "element " << i;
  }
#else
  expectUserError(gpu, "this kiln was built without the CUDA backend");
#endif
}

TEST_F(KilnCli, DataTransfersIsForTheGpuOnly) {
  expectUserError(kiln(fmt::format("run '{}' --dataTransfers", KILN_SAMPLE_MODEL)),
                  "--dataTransfers applies to --backend cuda only");
}

TEST_F(KilnCli, RunIsDeterministicForASeedAndLoadsInputs) {
  const fs::path first = dir_ / "a.npz";
  const fs::path second = dir_ / "b.npz";
  ASSERT_EQ(
      kiln(fmt::format("run '{}' --seed 7 --saveOutputs '{}'", KILN_SAMPLE_MODEL, first.string()))
          .exitCode,
      0);
  // Feeding an input file gives the outputs of that input, not of random data.
  kiln::ir::Tensor zeros(kiln::ir::DType::kFloat32, kiln::ir::Shape{1, 3, 32, 32});
  ASSERT_TRUE(kiln::ir::writeNpy(dir_ / "zeros.npy", zeros).isOk());
  ASSERT_EQ(kiln(fmt::format("run '{}' --loadInputs image:'{}' --saveOutputs '{}'",
                             KILN_SAMPLE_MODEL, (dir_ / "zeros.npy").string(), second.string()))
                .exitCode,
            0);
  const fs::path third = dir_ / "c.npz";
  ASSERT_EQ(
      kiln(fmt::format("run '{}' --seed 7 --saveOutputs '{}'", KILN_SAMPLE_MODEL, third.string()))
          .exitCode,
      0);
  auto a = kiln::ir::readNpz(first).value()[0].second;
  auto b = kiln::ir::readNpz(second).value()[0].second;
  auto c = kiln::ir::readNpz(third).value()[0].second;
  EXPECT_EQ(std::memcmp(a.rawData(), c.rawData(), a.byteSize()), 0);
  EXPECT_NE(std::memcmp(a.rawData(), b.rawData(), a.byteSize()), 0);
}

TEST_F(KilnCli, RefusesTruncatedModel) {
  auto bytes = kiln::readFileBytes(KILN_SAMPLE_MODEL).value();
  // Cut inside the first initializer's raw data, and at several other points.
  for (size_t cut : {bytes.size() / 2, bytes.size() - 3, size_t{5}}) {
    const fs::path path = dir_ / "truncated.onnx";
    writeFile(path, bytes.substr(0, cut));
    Outcome outcome = kiln(fmt::format("inspect '{}'", path.string()));
    EXPECT_EQ(outcome.exitCode, 1) << "cut at " << cut << ": " << outcome.err;
    EXPECT_TRUE(outcome.err.find("truncated") != std::string::npos ||
                outcome.err.find("not an ONNX model") != std::string::npos)
        << "cut at " << cut << ": " << outcome.err;
  }
}

TEST_F(KilnCli, RefusesFilesThatAreNotOnnx) {
  const fs::path text = dir_ / "notes.onnx";
  writeFile(text, "this is a text file, not a model\n");
  expectUserError(kiln(fmt::format("inspect '{}'", text.string())), "not");
  const fs::path npy = fs::path(KILN_TEST_DATA_DIR) / "npy" / "c_float32.npy";
  expectUserError(kiln(fmt::format("inspect '{}'", npy.string())), "ONNX model");
  const fs::path empty = dir_ / "empty.onnx";
  writeFile(empty, "");
  expectUserError(kiln(fmt::format("inspect '{}'", empty.string())),
                  "the file is empty, not an ONNX model");
  expectUserError(kiln(fmt::format("inspect '{}'", (dir_ / "absent.onnx").string())),
                  "absent.onnx' does not exist");
}

TEST_F(KilnCli, RefusesExternalDataOutsideTheModelFolder) {
  const fs::path folder = dir_ / "model";
  writeFile(dir_ / "outside.bin", std::string(16, '\0'));
  expectUserError(kiln(fmt::format("inspect '{}'", stage("external_escape", folder).string())),
                  "external data location '../outside.bin' leaves the model's folder ('..')");
  expectUserError(kiln(fmt::format("inspect '{}'", stage("external_absolute", folder).string())),
                  "external data location '/etc/hostname' is an absolute path");
  fs::create_symlink(dir_ / "outside.bin", folder / "link.bin");
  expectUserError(kiln(fmt::format("inspect '{}'", stage("external_symlink", folder).string())),
                  "outside the model's folder");
}

TEST_F(KilnCli, ChecksExternalDataBounds) {
  const fs::path folder = dir_ / "model";
  expectUserError(kiln(fmt::format("inspect '{}'", stage("external_missing", folder).string())),
                  "external data file 'missing.bin' does not exist");
  writeFile(folder / "weights.bin", std::string(16, '\0'));
  expectUserError(
      kiln(fmt::format("inspect '{}'", stage("external_out_of_bounds", folder).string())),
      "external data range [offset 8, length 16] is out of bounds of 'weights.bin' (16 bytes)");
  Outcome ok = kiln(fmt::format("inspect '{}'", stage("external_ok", folder).string()));
  EXPECT_EQ(ok.exitCode, 0) << ok.err;
  EXPECT_NE(ok.out.find("parameters: 4"), std::string::npos) << ok.out;
}

// An initializer whose 32 GiB of data really are there (a sparse file) but do not fit in the
// memory the process may use: a clear error naming the tensor, not an abort or the OOM killer.
TEST_F(KilnCli, AnInitializerLargerThanMemoryAllowsIsAnError) {
  const fs::path folder = dir_ / "model";
  const fs::path staged = stage("external_huge", folder);
  writeFile(folder / "huge.bin", "");
  fs::resize_file(folder / "huge.bin", uintmax_t{1} << 35);
  const fs::path err = dir_ / "stderr.txt";
  const int status =
      std::system(fmt::format("(ulimit -v 8388608; '{}' inspect '{}') > /dev/null 2> '{}'",
                              KILN_BINARY, staged.string(), err.string())
                      .c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string message = kiln::readFileBytes(err).value();
  EXPECT_NE(message.find("tensor 'w': its 34359738368 bytes do not fit in the memory this process "
                         "may allocate"),
            std::string::npos)
      << message;
  fs::remove(folder / "huge.bin");
}

TEST_F(KilnCli, RefusesOverflowingDimensions) {
  expectUserError(kiln(fmt::format("run '{}'", model("overflow_dims").string())),
                  "input 'x': shape [4294967296,4294967296,8] has more than 2^40 elements");
  expectUserError(kiln(fmt::format("inspect '{}'", model("overflow_initializer").string())),
                  "tensor 'w': shape [3037000500,3037000500,3] has more than 2^40 elements");
}

TEST_F(KilnCli, NamesTheUnknownOp) {
  expectUserError(kiln(fmt::format("run '{}'", model("unknown_op").string())),
                  "node 'mystery' (FooBar, opset 18): kiln does not support op 'FooBar'");
}

TEST_F(KilnCli, RefusesKilnsReservedDomain) {
  expectUserError(kiln(fmt::format("run '{}'", model("reserved_domain").string())),
                  "node 'sneaky' (FusedConv) uses domain 'kiln', which is reserved for ops kiln "
                  "creates itself");
}

TEST_F(KilnCli, NamesTheAttributeOfTheWrongType) {
  expectUserError(kiln(fmt::format("run '{}'", model("bad_attribute_type").string())),
                  "node 'const' (Constant, opset 18): attribute 'value_int' must be of type "
                  "int, got float");
}

TEST_F(KilnCli, RequiresShapesForDynamicDimensions) {
  expectUserError(kiln(fmt::format("run '{}'", model("dynamic_dim").string())),
                  "input 'x' dimension 0 ('batch') is dynamic; fix it with --shapes x:DxD...");
  Outcome ok = kiln(fmt::format("run '{}' --shapes x:4x3", model("dynamic_dim").string()));
  EXPECT_EQ(ok.exitCode, 0) << ok.err;
  EXPECT_NE(ok.out.find("y : float32[4,3]"), std::string::npos) << ok.out;
  expectUserError(kiln(fmt::format("run '{}' --shapes x:4x5", model("dynamic_dim").string())),
                  "--shapes gives input 'x' dimension 1 = 5, but the model fixes it to 3");
  expectUserError(kiln(fmt::format("run '{}' --shapes y:4x3", model("dynamic_dim").string())),
                  "--shapes names 'y', which is not an input of the model");
  expectUserError(kiln(fmt::format("run '{}' --shapes x:4xq", model("dynamic_dim").string())),
                  "--shapes entry 'x:4xq': 'q' is not a non-negative dimension");
}

TEST_F(KilnCli, RefusesOpsetFromTheFuture) {
  expectUserError(kiln(fmt::format("run '{}'", model("future_opset").string())),
                  "default-domain opset 99 is outside the range kiln supports (6 to 21)");
}

TEST_F(KilnCli, NamesAnUndefinedInput) {
  expectUserError(kiln(fmt::format("inspect '{}'", model("undefined_input").string())),
                  "input 'nowhere' is neither a graph input, an initializer nor the output of an "
                  "earlier node");
}

TEST_F(KilnCli, RefusesInitializerWhoseDataDisagreesWithItsShape) {
  expectUserError(kiln(fmt::format("inspect '{}'", model("raw_size_mismatch").string())),
                  "tensor 'w': declared shape [4] of float32 needs 16 bytes, but raw_data holds 4");
}

// A model of a hundred bytes that declares a terabyte: the sizes are checked against the data
// present before anything is allocated (it used to allocate first and abort on bad_alloc).
TEST_F(KilnCli, RefusesTensorsThatDeclareMoreThanTheirData) {
  expectUserError(
      kiln(fmt::format("inspect '{}'", model("huge_declared_initializer").string())),
      "tensor 'w': declared shape [1099511627776] of float32 needs 4398046511104 bytes, but "
      "raw_data holds 0");
  expectUserError(kiln(fmt::format("inspect '{}'", model("huge_typed_constant").string())),
                  "tensor 't': float_data has 1 elements, but the shape [1048576,1048576] needs "
                  "1099511627776");
}

TEST_F(KilnCli, RefusesInputFilesThatDoNotFit) {
  kiln::ir::Tensor ints(kiln::ir::DType::kInt32, kiln::ir::Shape{1, 3, 32, 32});
  ASSERT_TRUE(kiln::ir::writeNpy(dir_ / "ints.npy", ints).isOk());
  expectUserError(kiln(fmt::format("run '{}' --loadInputs image:'{}'", KILN_SAMPLE_MODEL,
                                   (dir_ / "ints.npy").string())),
                  "input 'image' is float32 in the model, but the file holds int32");
  kiln::ir::Tensor small(kiln::ir::DType::kFloat32, kiln::ir::Shape{1, 3, 8, 8});
  ASSERT_TRUE(kiln::ir::writeNpy(dir_ / "small.npy", small).isOk());
  expectUserError(kiln(fmt::format("run '{}' --loadInputs image:'{}'", KILN_SAMPLE_MODEL,
                                   (dir_ / "small.npy").string())),
                  "--shapes gives input 'image' dimension 2 = 8, but the model fixes it to 32");
  expectUserError(kiln(fmt::format("run '{}' --loadInputs other:'{}'", KILN_SAMPLE_MODEL,
                                   (dir_ / "small.npy").string())),
                  "--shapes names 'other', which is not an input of the model");
}

TEST_F(KilnCli, BuildsInspectsAndRunsAnEngine) {
  const fs::path engine = dir_ / "sample.kiln";
  Outcome built =
      kiln(fmt::format("build '{}' --route '{} -cpu.conv.algo=direct' --saveEngine '{}'",
                       KILN_SAMPLE_MODEL, kiln::testing::kNativeNchwRoute, engine.string()));
  ASSERT_EQ(built.exitCode, 0) << built.err;
  EXPECT_NE(built.out.find("saved engine to"), std::string::npos) << built.out;

  Outcome inspected = kiln(fmt::format("inspect '{}'", engine.string()));
  ASSERT_EQ(inspected.exitCode, 0) << inspected.err;
  for (const char* expected :
       {"format_version: 1", "backend: cpu", "model_hash: fnv1a64:", "avx2 ",
        "route: -cpu.conv.algo=direct", "image : float32[1,3,32,32]", "stem.conv", "FusedConv",
        "direct", "head.fc", ".sgemm", "nchw     fp32"}) {
    EXPECT_NE(inspected.out.find(expected), std::string::npos)
        << "missing '" << expected << "' in:\n"
        << inspected.out;
  }

  // The engine computes exactly what a fresh build with the same route does.
  const fs::path fromEngine = dir_ / "engine.npz";
  const fs::path fromModel = dir_ / "model.npz";
  Outcome ran = kiln(fmt::format("run '{}' --seed 3 --duration 0 --warmUp 0 --saveOutputs '{}'",
                                 engine.string(), fromEngine.string()));
  ASSERT_EQ(ran.exitCode, 0) << ran.err;
  ASSERT_EQ(
      kiln(fmt::format("run '{}' --route '{} -cpu.conv.algo=direct' --seed 3 --duration 0 "
                       "--warmUp 0 --saveOutputs '{}'",
                       KILN_SAMPLE_MODEL, kiln::testing::kNativeNchwRoute, fromModel.string()))
          .exitCode,
      0);
  auto a = kiln::ir::readNpz(fromEngine).value()[0].second;
  auto b = kiln::ir::readNpz(fromModel).value()[0].second;
  ASSERT_EQ(a.byteSize(), b.byteSize());
  EXPECT_EQ(std::memcmp(a.rawData(), b.rawData(), a.byteSize()), 0);

  // Model-only flags do not silently apply to an engine.
  expectUserError(kiln(fmt::format("run '{}' --route '-cpu.threads=1'", engine.string())),
                  "is an engine file: --shapes, --route");
}

// kiln explain: an engine against the default route built now, layer by layer, sorted by where
// the time went; the same comparison as JSON; two engines of one route differ nowhere.
TEST_F(KilnCli, ExplainShowsWhereTheTimeWentLayerByLayer) {
  const fs::path engine = dir_ / "nchw.kiln";
  ASSERT_EQ(kiln(fmt::format("build '{}' --route '-graph.layout=nchw -fusion.conv_act=off' "
                             "--saveEngine '{}'",
                             KILN_SAMPLE_MODEL, engine.string()))
                .exitCode,
            0);
  Outcome text = kiln(fmt::format("explain '{}' --model '{}' --duration 0.2 --warmUp 0",
                                  engine.string(), KILN_SAMPLE_MODEL));
  ASSERT_EQ(text.exitCode, 0) << text.err;
  for (const char* expected :
       {"A: ", "(route -fusion.conv_act=off -graph.layout=nchw)",
        "B: the default route, built now from", "output probs: cosine distance between A and B",
        "total: A median", "95% interval [", "* stem.conv", "A: ", " nchw fp32",
        "B: ", " nhwc fp32", "(no such layer)"}) {
    EXPECT_NE(text.out.find(expected), std::string::npos) << expected << "\n" << text.out;
  }

  Outcome asJson = kiln(fmt::format("explain '{}' --model '{}' --duration 0.2 --warmUp 0 --json",
                                    engine.string(), KILN_SAMPLE_MODEL));
  ASSERT_EQ(asJson.exitCode, 0) << asJson.err;
  const auto j = nlohmann::json::parse(asJson.out);
  EXPECT_EQ(j["a"]["route"], "-fusion.conv_act=off -graph.layout=nchw");
  EXPECT_EQ(j["b"]["route"], "");
  EXPECT_LT(j["outputs_cos_distance"]["probs"].get<double>(), 1e-6);
  EXPECT_GE(j["runs"].get<int>(), 20);
  EXPECT_EQ(j["speedup_a_over_b"]["pairs"], j["runs"]);
  EXPECT_LE(j["speedup_a_over_b"]["low"].get<double>(),
            j["speedup_a_over_b"]["median"].get<double>());
  EXPECT_GE(j["speedup_a_over_b"]["high"].get<double>(),
            j["speedup_a_over_b"]["median"].get<double>());
  ASSERT_GE(j["layers"].size(), 8u);
  double previous = 1e300;
  int unfusedRelus = 0, differing = 0;
  for (const auto& layer : j["layers"]) {
    const double gap = std::abs(layer["a_ms"].get<double>() - layer["b_ms"].get<double>());
    EXPECT_LE(gap, previous) << layer.dump();  // sorted by where the time went
    previous = gap;
    differing += layer["differs"].get<bool>();
    // conv_act=off leaves the ReLUs as layers of their own in A; the default fuses them.
    if (layer["op"] == "Relu" && layer.contains("a") && !layer.contains("b")) ++unfusedRelus;
  }
  EXPECT_GE(unfusedRelus, 2);
  EXPECT_GE(differing, 4);  // every convolution's layout

  // The same route twice: nothing differs.
  const fs::path twin = dir_ / "twin.kiln";
  ASSERT_EQ(kiln(fmt::format("build '{}' --route '-graph.layout=nchw -fusion.conv_act=off' "
                             "--saveEngine '{}'",
                             KILN_SAMPLE_MODEL, twin.string()))
                .exitCode,
            0);
  Outcome same = kiln(fmt::format("explain '{}' --against '{}' --duration 0.1 --warmUp 0 --json",
                                  engine.string(), twin.string()));
  ASSERT_EQ(same.exitCode, 0) << same.err;
  for (const auto& layer : nlohmann::json::parse(same.out)["layers"]) {
    EXPECT_FALSE(layer["differs"].get<bool>()) << layer.dump();
  }

  // What it needs, named.
  expectUserError(kiln(fmt::format("explain '{}'", engine.string())), "give --model model.onnx");
  expectUserError(kiln(fmt::format("explain '{}' --model '{}'", engine.string(),
                                   model("dynamic_dim").string())),
                  "is not the model");
}

// On the GPU there are no engine files: explain compares two routes of the model. With a GPU,
// timed; with the CUDA backend but no GPU (CI's machines), the two plans' decisions untimed;
// without the CUDA backend, a clear error.
TEST_F(KilnCli, ExplainComparesTwoCudaRoutes) {
  const std::string command = fmt::format(
      "explain --backend cuda --model '{}' --route '-cuda.precision=fp16' --duration 0.2 "
      "--warmUp 0",
      KILN_SAMPLE_MODEL);
  Outcome text = kiln(command);
#if KILN_HAVE_CUDA
  ASSERT_EQ(text.exitCode, 0) << text.err;
  EXPECT_NE(text.out.find("A: --route -cuda.precision=fp16 (route -cuda.precision=fp16)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("B: the default route (route (default))"), std::string::npos) << text.out;
  Outcome asJson = kiln(command + " --json");
  ASSERT_EQ(asJson.exitCode, 0) << asJson.err;
  const auto j = nlohmann::json::parse(asJson.out);
  EXPECT_EQ(j["backend"], "cuda");
  ASSERT_GE(j["layers"].size(), 4u);
  int fp16 = 0, castsOnlyInA = 0;
  for (const auto& layer : j["layers"]) {
    if (!layer.contains("b")) {  // fp16 adds the casts at the edges
      EXPECT_EQ(layer["op"], "Cast") << layer.dump();
      ++castsOnlyInA;
    } else if (layer["a"]["precision"] == "fp16") {
      ++fp16;
      EXPECT_EQ(layer["b"]["precision"], "fp32") << layer.dump();
      EXPECT_TRUE(layer["differs"].get<bool>()) << layer.dump();
    }
  }
  EXPECT_GE(fp16, 3) << asJson.out;  // the convolutions at least
  EXPECT_EQ(castsOnlyInA, 2) << asJson.out;
  EXPECT_EQ(j["layers_differing"].get<int>() > 0, true);
  if (j["timed"].get<bool>()) {
    EXPECT_NE(text.out.find("total: A median"), std::string::npos) << text.out;
    EXPECT_GE(j["runs"].get<int>(), 20);
    EXPECT_LT(j["outputs_cos_distance"]["probs"].get<double>(), 1e-3);
  } else {
    EXPECT_NE(j["untimed_reason"].get<std::string>().find("no CUDA device is visible"),
              std::string::npos)
        << asJson.out;
    EXPECT_NE(text.out.find("not timed: "), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("layers differ, marked *"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("* stem.conv"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("B: (no such layer)"), std::string::npos) << text.out;
  }
#else
  expectUserError(text, "this kiln was built without the CUDA backend");
#endif
  expectUserError(kiln(fmt::format("explain --backend cuda '{}'", KILN_SAMPLE_MODEL)),
                  "compares two routes of a model");
  expectUserError(kiln("explain --backend cuda"), "--backend cuda needs --model");
  expectUserError(
      kiln(fmt::format("explain '{}' --route '-cuda.precision=fp16'", KILN_SAMPLE_MODEL)),
      "apply to --backend cuda");
}

TEST_F(KilnCli, RefusesATamperedEngine) {
  const fs::path engine = dir_ / "sample.kiln";
  ASSERT_EQ(kiln(fmt::format("build '{}' --saveEngine '{}'", KILN_SAMPLE_MODEL, engine.string()))
                .exitCode,
            0);
  std::string bytes = kiln::readFileBytes(engine).value();
  bytes[bytes.size() - 5] ^= 0x40;
  writeFile(engine, bytes);
  expectUserError(kiln(fmt::format("run '{}'", engine.string())),
                  fmt::format("engine '{}': corrupt or tampered", engine.string()));
  expectUserError(kiln(fmt::format("inspect '{}'", engine.string())), "corrupt or tampered");
  writeFile(engine, bytes.substr(0, bytes.size() / 2));
  expectUserError(kiln(fmt::format("run '{}'", engine.string())), "truncated");
  writeFile(engine, "not an engine at all");
  expectUserError(kiln(fmt::format("inspect '{}'", engine.string())), "not a kiln engine");
}

}  // namespace
