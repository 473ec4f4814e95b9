// Engine files: a saved and reloaded plan computes the same bits, and every damaged or foreign
// file is refused with a message that names the file and the problem.
#include "kiln/engine/engine_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "kiln/base/file.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// The sample CNN's structure at a smaller size: Conv+BN+Relu (folded and fused into kiln-domain
// ops), MaxPool, a residual Add, GlobalAveragePool, Flatten, Gemm, Softmax.
constexpr const char* kSampleLike = R"pb(
  ir_version: 8
  opset_import { version: 18 }
  graph {
    name: "sample_like"
    node {
      name: "stem.conv"
      op_type: "Conv"
      input: "image"
      input: "w1"
      input: "b1"
      output: "c1"
      attribute { name: "kernel_shape" ints: 3 ints: 3 type: INTS }
      attribute { name: "pads" ints: 1 ints: 1 ints: 1 ints: 1 type: INTS }
    }
    node {
      name: "stem.bn"
      op_type: "BatchNormalization"
      input: "c1"
      input: "bn_s"
      input: "bn_b"
      input: "bn_m"
      input: "bn_v"
      output: "bn"
    }
    node { name: "stem.relu" op_type: "Relu" input: "bn" output: "r1" }
    node {
      name: "stem.pool"
      op_type: "MaxPool"
      input: "r1"
      output: "p1"
      attribute { name: "kernel_shape" ints: 2 ints: 2 type: INTS }
      attribute { name: "strides" ints: 2 ints: 2 type: INTS }
    }
    node {
      name: "block.conv"
      op_type: "Conv"
      input: "p1"
      input: "w2"
      input: "b2"
      output: "c2"
      attribute { name: "kernel_shape" ints: 3 ints: 3 type: INTS }
      attribute { name: "pads" ints: 1 ints: 1 ints: 1 ints: 1 type: INTS }
    }
    node { name: "block.add" op_type: "Add" input: "c2" input: "p1" output: "a" }
    node { name: "block.relu" op_type: "Relu" input: "a" output: "r2" }
    node { name: "head.gap" op_type: "GlobalAveragePool" input: "r2" output: "g" }
    node {
      name: "head.flatten"
      op_type: "Flatten"
      input: "g"
      output: "f"
      attribute { name: "axis" i: 1 type: INT }
    }
    node {
      name: "head.fc"
      op_type: "Gemm"
      input: "f"
      input: "fc_w"
      input: "fc_b"
      output: "logits"
      attribute { name: "transB" i: 1 type: INT }
    }
    node {
      name: "head.softmax"
      op_type: "Softmax"
      input: "logits"
      output: "probs"
      attribute { name: "axis" i: -1 type: INT }
    }
    input {
      name: "image"
      type {
        tensor_type {
          elem_type: 1
          shape {
            dim { dim_value: 1 }
            dim { dim_value: 3 }
            dim { dim_value: 8 }
            dim { dim_value: 8 }
          }
        }
      }
    }
    input {
      name: "w1"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "b1"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "bn_s"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "bn_b"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "bn_m"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "bn_v"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "w2"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "b2"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "fc_w"
      type { tensor_type { elem_type: 1 } }
    }
    input {
      name: "fc_b"
      type { tensor_type { elem_type: 1 } }
    }
    output {
      name: "probs"
      type { tensor_type { elem_type: 1 } }
    }
  }
)pb";

ir::Tensor seeded(ir::Shape shape, std::mt19937& rng, float lo, float hi) {
  ir::Tensor tensor(ir::DType::kFloat32, std::move(shape));
  std::uniform_real_distribution<float> uniform(lo, hi);
  for (float& v : tensor.mutableData<float>()) v = uniform(rng);
  return tensor;
}

class EngineFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("kiln_engine_{}_{}", info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Builds the sample-like model with `route` and saves it; `edit` may change the contents.
  void build(const std::string& route = "",
             const std::function<void(EngineContents&)>& edit = nullptr) {
    std::mt19937 rng(42);
    onnx::ImportOptions options;
    options.constantInputs = {
        {"w1", seeded({4, 3, 3, 3}, rng, -0.5f, 0.5f)}, {"b1", seeded({4}, rng, -0.1f, 0.1f)},
        {"bn_s", seeded({4}, rng, 0.5f, 1.5f)},         {"bn_b", seeded({4}, rng, -0.1f, 0.1f)},
        {"bn_m", seeded({4}, rng, -0.1f, 0.1f)},        {"bn_v", seeded({4}, rng, 0.5f, 1.5f)},
        {"w2", seeded({4, 4, 3, 3}, rng, -0.5f, 0.5f)}, {"b2", seeded({4}, rng, -0.1f, 0.1f)},
        {"fc_w", seeded({5, 4}, rng, -0.5f, 0.5f)},     {"fc_b", seeded({5}, rng, -0.1f, 0.1f)},
    };
    auto model = onnx::importModelFromText(kSampleLike, options);
    ASSERT_TRUE(model.isOk()) << model.status().message();
    // Attributes of every kind, including a tensor and float bits JSON cannot spell, on a node
    // whose kernel ignores attributes it does not know.
    for (const auto& node : model->graph.nodes()) {
      if (node->name != "head.softmax") continue;
      node->attributes["t_int"].value = int64_t{-7};
      node->attributes["t_float"].value = std::nanf("");
      node->attributes["t_string"].value = std::string("text \"quoted\"");
      node->attributes["t_tensor"].value = ir::Tensor::fromVector<int64_t>({3}, {1, -2, 3});
      node->attributes["t_ints"].value = std::vector<int64_t>{1, 2};
      node->attributes["t_floats"].value = std::vector<float>{INFINITY, -0.0f, 1.5f};
      node->attributes["t_strings"].value = std::vector<std::string>{"a", ""};
    }
    BuilderConfig config;
    ASSERT_TRUE(config.setBuildRoute(route).isOk());
    auto built = buildCpu(std::move(model->graph), config);
    ASSERT_TRUE(built.isOk()) << built.status().message();
    build_.emplace(std::move(built).value());
    EngineContents contents;
    contents.kilnVersion = "test";
    contents.modelHash = modelHashOf(kSampleLike);
    contents.inputShapes = {{"image", {1, 3, 8, 8}}};
    contents.route = config.getBuildRoute();
    route_ = contents.route;
    contents.plan = &build_->plan;
    if (edit) edit(contents);
    Status saved = saveEngine(path(), contents);
    ASSERT_TRUE(saved.isOk()) << saved.message();
  }

  fs::path path() const { return dir_ / "m.kiln"; }
  std::string bytes() const { return readFileBytes(path()).value(); }
  void rewrite(const std::string& bytes) { ASSERT_TRUE(writeFileAtomically(path(), bytes).isOk()); }

  void expectRefused(const std::string& message) {
    auto loaded = loadEngine(path());
    ASSERT_FALSE(loaded.isOk());
    EXPECT_NE(loaded.status().message().find(path().string()), std::string::npos)
        << loaded.status().message();
    EXPECT_NE(loaded.status().message().find(message), std::string::npos)
        << "message was: " << loaded.status().message() << "\nexpected to contain: " << message;
  }

  fs::path dir_;
  std::optional<CpuBuild> build_;
  std::string route_;  // canonical text of the last build's route
};

TEST_F(EngineFileTest, RoundTripRunsBitForBit) {
  for (const std::string route : {"", "-cpu.conv.algo=direct -fusion.conv_act=off"}) {
    SCOPED_TRACE(route);
    build(route);
    auto loaded = loadEngine(path());
    ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
    EXPECT_EQ(loaded->route, route_);
    EXPECT_EQ(loaded->header.kilnVersion, "test");
    EXPECT_EQ(loaded->header.target, currentTarget());
    EXPECT_EQ(loaded->modelHash, modelHashOf(kSampleLike));
    EXPECT_EQ(loaded->inputShapes.at("image"), (std::vector<int64_t>{1, 3, 8, 8}));
    // The stored graph is the optimised one, kiln-domain ops and all, unchanged.
    EXPECT_EQ(ir::printGraph(loaded->plan.graph()), ir::printGraph(build_->plan.graph()));
    ASSERT_EQ(loaded->plan.steps().size(), build_->plan.steps().size());
    for (size_t i = 0; i < loaded->plan.steps().size(); ++i) {
      EXPECT_EQ(loaded->plan.steps()[i]->tactic, build_->plan.steps()[i]->tactic);
      EXPECT_EQ(loaded->steps[i].tactic, build_->plan.steps()[i]->tactic);
    }

    std::mt19937 rng(7);
    const std::vector<ir::Tensor> inputs = {seeded({1, 3, 8, 8}, rng, -1.0f, 1.0f)};
    auto expected = build_->plan.run(inputs);
    auto actual = loaded->plan.run(inputs);
    ASSERT_TRUE(expected.isOk() && actual.isOk());
    ASSERT_EQ(expected->size(), 1u);
    ASSERT_EQ((*actual)[0].byteSize(), (*expected)[0].byteSize());
    EXPECT_EQ(
        std::memcmp((*actual)[0].rawData(), (*expected)[0].rawData(), (*expected)[0].byteSize()),
        0);
  }
}

TEST_F(EngineFileTest, KeepsAttributesOfEveryKindExactly) {
  build();
  auto loaded = loadEngine(path());
  ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
  const ir::Node* add = nullptr;
  for (const auto& node : loaded->plan.graph().nodes()) {
    if (node->name == "head.softmax") add = node.get();
  }
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->getInt("t_int", 0).value(), -7);
  EXPECT_TRUE(std::isnan(add->getFloat("t_float", 0).value()));
  EXPECT_EQ(add->getString("t_string", "").value(), "text \"quoted\"");
  EXPECT_EQ(add->getTensor("t_tensor").value().toInt64Vector(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(add->getInts("t_ints").value(), (std::vector<int64_t>{1, 2}));
  const auto floats = add->getFloats("t_floats").value();
  ASSERT_EQ(floats.size(), 3u);
  EXPECT_TRUE(std::isinf(floats[0]));
  EXPECT_TRUE(std::signbit(floats[1]));
  EXPECT_EQ(floats[2], 1.5f);
  EXPECT_EQ(add->getStrings("t_strings").value(), (std::vector<std::string>{"a", ""}));
}

TEST_F(EngineFileTest, WeightsAreAligned) {
  build();
  const std::string file = bytes();
  // Every constant's bytes appear in the file at a 64-byte aligned offset.
  for (const auto& value : build_->plan.graph().values()) {
    if (!value->constant || value->constant->byteSize() < 16) continue;
    const std::string_view data(reinterpret_cast<const char*>(value->constant->rawData()),
                                value->constant->byteSize());
    const size_t at = file.find(data);
    ASSERT_NE(at, std::string::npos) << value->name;
    EXPECT_EQ(at % 64, 0u) << value->name;
  }
}

TEST_F(EngineFileTest, RefusesAFlippedByte) {
  build();
  for (size_t from_end : {size_t{1}, size_t{100}}) {
    std::string file = bytes();
    file[file.size() - from_end] ^= 0x01;
    rewrite(file);
    expectRefused("corrupt or tampered: checksum mismatch");
    file[file.size() - from_end] ^= 0x01;
    rewrite(file);
  }
  ASSERT_TRUE(loadEngine(path()).isOk());
}

TEST_F(EngineFileTest, RefusesWrongMagic) {
  build();
  std::string file = bytes();
  file[0] = 'X';
  rewrite(file);
  expectRefused("not a kiln engine");
  rewrite("PK\x03\x04 a zip file, not an engine");
  expectRefused("not a kiln engine");
}

TEST_F(EngineFileTest, RefusesANewerFormatVersion) {
  build();
  std::string file = bytes();
  const uint32_t next = kEngineFormatVersion + 1;
  std::memcpy(file.data() + 8, &next, sizeof next);
  rewrite(file);
  expectRefused("format version 2 is newer than this kiln reads (1)");
}

TEST_F(EngineFileTest, RefusesAnotherTarget) {
  build("", [](EngineContents& contents) { contents.target.cpuModel = "Imaginary CPU 9000"; });
  expectRefused("built for another target: cpu model (engine 'Imaginary CPU 9000'");
  build("", [](EngineContents& contents) { contents.target.avx512bf16 ^= true; });
  expectRefused("avx512_bf16 (engine ");
  // Editing the fingerprint in the file instead is tampering: the checksum covers the header.
  build();
  std::string file = bytes();
  uint32_t headerBytes;
  std::memcpy(&headerBytes, file.data() + 12, sizeof headerBytes);
  auto header = nlohmann::json::parse(file.substr(32, headerBytes));
  const bool fma = header["target"]["fma"].get<bool>();
  header["target"]["fma"] = !fma;
  const std::string edited = header.dump();
  file.replace(32, headerBytes, edited);
  headerBytes = static_cast<uint32_t>(edited.size());
  std::memcpy(file.data() + 12, &headerBytes, sizeof headerBytes);
  rewrite(file);
  expectRefused("corrupt or tampered: checksum mismatch");
}

// The engine with its metadata edited by `edit` and the checksum recomputed: a crafted file,
// not a damaged one. The edited metadata must not be longer than the original plus its padding.
std::string withMetadata(std::string file, const std::function<void(nlohmann::json&)>& edit) {
  uint32_t headerBytes;
  std::memcpy(&headerBytes, file.data() + 12, sizeof headerBytes);
  const size_t body = 32 + headerBytes;
  uint64_t metadataBytes;
  std::memcpy(&metadataBytes, file.data() + body, sizeof metadataBytes);
  nlohmann::json metadata = nlohmann::json::parse(file.substr(body + 8, metadataBytes));
  edit(metadata);
  const std::string text = metadata.dump();
  const size_t room = metadata["weights_offset"].get<size_t>() - 8;
  EXPECT_LE(text.size(), room);
  file.replace(body + 8, room, text + std::string(room - text.size(), '\0'));
  const uint64_t length = text.size();
  std::memcpy(file.data() + body, &length, sizeof length);
  const uint64_t checksum = engineChecksum(std::string_view(file).substr(32));
  std::memcpy(file.data() + 24, &checksum, sizeof checksum);
  return file;
}

// A checksum proves nothing about who wrote the file: a crafted engine whose graph disagrees
// with itself is refused before its kernels see the shapes. (The fuzzer found one: a Gemm
// operand stored with a longer shape than its constant held read past the weights.)
TEST_F(EngineFileTest, RefusesACraftedGraphThatDisagreesWithItself) {
  build();
  const std::string original = bytes();
  auto shrink = [](nlohmann::json& value) {
    nlohmann::json& shape = value["shape"];
    for (auto& dim : shape) {
      if (dim.get<int64_t>() > 1) {
        dim = 1;
        return true;
      }
    }
    return false;
  };
  // A node's output stored with another shape than its node gives.
  rewrite(withMetadata(original, [&](nlohmann::json& metadata) {
    for (auto& value : metadata["graph"]["values"]) {
      if (!value.contains("constant") && value["name"] != "image" && shrink(value)) return;
    }
  }));
  expectRefused("corrupt or tampered: value '");
  expectRefused("' is stored as float32[");
  // A constant whose value claims another shape than the tensor stored for it.
  rewrite(withMetadata(original, [&](nlohmann::json& metadata) {
    for (auto& value : metadata["graph"]["values"]) {
      if (value.contains("constant") && shrink(value)) return;
    }
  }));
  expectRefused("but its constant is float32[");
  // Unedited and resealed, the same file loads.
  rewrite(withMetadata(original, [](nlohmann::json&) {}));
  EXPECT_TRUE(loadEngine(path()).isOk());
}

// Format version 0 was never written; an engine of another backend (its header resealed, as a
// CUDA build's would be) is refused naming the backend.
TEST_F(EngineFileTest, RefusesVersionZeroAndAnotherBackend) {
  build();
  std::string file = bytes();
  const uint32_t zero = 0;
  std::memcpy(file.data() + 8, &zero, sizeof zero);
  rewrite(file);
  expectRefused("format version 0 is not valid");
  build();
  file = bytes();
  uint32_t headerBytes;
  std::memcpy(&headerBytes, file.data() + 12, sizeof headerBytes);
  auto header = nlohmann::json::parse(file.substr(32, headerBytes));
  header["backend"] = "cuda";
  std::string edited = header.dump();
  while ((32 + edited.size()) % 64 != 0) edited.push_back(' ');
  file.replace(32, headerBytes, edited);
  headerBytes = static_cast<uint32_t>(edited.size());
  std::memcpy(file.data() + 12, &headerBytes, sizeof headerBytes);
  const uint64_t checksum = engineChecksum(std::string_view(file).substr(32));
  std::memcpy(file.data() + 24, &checksum, sizeof checksum);
  rewrite(file);
  expectRefused("built for backend 'cuda'; this kiln loads cpu engines");
}

TEST_F(EngineFileTest, RefusesTruncation) {
  build();
  const std::string file = bytes();
  for (size_t cut : {size_t{3}, size_t{20}, size_t{40}, file.size() / 2, file.size() - 1}) {
    SCOPED_TRACE(cut);
    rewrite(file.substr(0, cut));
    expectRefused("truncated");
  }
}

TEST_F(EngineFileTest, RefusesAStoredTacticThisKilnWouldNotChoose) {
  build();
  std::string file = bytes();
  // Rewrite one stored tactic and fix the checksum, as an engine from another kiln would be.
  const std::string tactic = build_->plan.steps()[0]->tactic;
  const std::string needle = "\"tactic\":\"" + tactic + "\"";
  const size_t at = file.find(needle);
  ASSERT_NE(at, std::string::npos);
  std::string other = tactic;
  other[0] = other[0] == 'x' ? 'y' : 'x';
  file.replace(at + 10, tactic.size(), other);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 32; i < file.size(); ++i) {
    hash ^= static_cast<uint8_t>(file[i]);
    hash *= 0x100000001b3ull;
  }
  std::memcpy(file.data() + 24, &hash, sizeof hash);
  rewrite(file);
  expectRefused(fmt::format("node '{}': the engine stores tactic '{}' but this kiln chooses '{}'",
                            build_->plan.steps()[0]->node->name, other, tactic));
}

}  // namespace
}  // namespace kiln
