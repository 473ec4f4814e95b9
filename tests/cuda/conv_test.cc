// The CUDA backend's convolutions (kernels/conv_steps.cc): Conv, kiln.FusedConv, kiln.NhwcConv
// and ConvTranspose from cuDNN and from kiln's direct kernels, against the reference executor.
// Without a GPU each case checks the lowering's tactic (and so every cuda.conv.* knob's effect on
// it); on a GPU it also runs the case, and checks that a step lowered to cuDNN still runs cuDNN
// once prepared (a silent fall back to kiln's kernel would hide a broken cuDNN graph).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "cuda_test_util.h"
#include "kiln/ir/op_schema.h"

namespace kiln::testing {
namespace {

using ir::Shape;

// cuDNN and kiln's kernel reorder the sums of the reference; fp32 accumulation stays within this.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

OpInput activations(Shape shape, unsigned seed) {
  return {uniformTensor(std::move(shape), seed, -1.0f, 1.0f), false};
}
OpInput constantWeights(Shape shape, unsigned seed) {
  return {uniformTensor(std::move(shape), seed, -0.5f, 0.5f), true};
}

// The tactic of the step for `c`'s node once the plan is prepared on the device ("" without one).
std::string preparedTactic(const CudaOpCase& c) {
  BuilderConfig config;
  // As expectCudaMatchesReference builds it: NCHW, so the case's op stays as written.
  EXPECT_TRUE(config.setBuildRoute("-cuda.host_fallback=off -cuda.layout=nchw " + c.route).isOk());
  auto build = buildCuda(
      makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, c.outputCount, c.domain),
      config);
  if (!build.isOk()) {
    ADD_FAILURE() << build.status().toString();
    return "";
  }
  const Status ready = build->plan.initialize();
  if (!ready.isOk()) {
    ADD_FAILURE() << ready.toString();
    return "";
  }
  return cudaTacticOf(*build, c.opType);
}

// Runs `c` (tactic checked at lowering) within `tolerance` (rtol and atol; 0: fp32's); on a GPU,
// a cuDNN step must stay on cuDNN unless `requireCudnn` is false (then where it ran is only
// recorded). Whether it kept its fused epilogue is recorded, not required: cuDNN may have no
// accurate enough engine for the fused graph, and then runs the bare convolution and kiln's
// epilogue kernel.
void expectConv(CudaOpCase c, double tolerance = 0, bool requireCudnn = true) {
  c.rtol = tolerance > 0 ? tolerance : kRtol;
  c.atol = tolerance > 0 ? tolerance : kAtol;
  expectCudaMatchesReference(c);
  if (!cuda::deviceAvailable() || c.expectTactic.rfind("cudnn", 0) != 0) return;
  const std::string prepared = preparedTactic(c);
  if (requireCudnn) {
    EXPECT_EQ(prepared.rfind("cudnn", 0), 0u)
        << "lowered to " << c.expectTactic << " but prepared as " << prepared;
  }
  ::testing::Test::RecordProperty("prepared_tactic", prepared);
}

// float16 and bfloat16, every tensor of the node in the type (as cuda.precision leaves a reduced
// node). float16 cases give the node float16 inputs: float math on the GPU, double in the
// reference, from the same rounded inputs; the outputs differ by the rounding of float sums, and
// by a second rounding where kiln's epilogue kernel finishes a cuDNN convolution. ONNX has no
// bfloat16 Conv before opset 22 (nor does the reference executor), so bfloat16 cases keep float32
// inputs and let cuda.precision=bf16 make the node bfloat16 between casts, and compare with the
// float32 reference (the inputs' rounding counts too).
struct ReducedType {
  ir::DType dtype;
  const char* name;
  double tolerance;
  bool direct;  // inputs in the type; else through cuda.precision
};
const ReducedType kReducedTypes[] = {{ir::DType::kFloat16, "fp16", 1e-2, true},
                                     {ir::DType::kBFloat16, "bf16", 5e-2, false}};

CudaOpCase inType(CudaOpCase c, const ReducedType& t) {
  if (!t.direct) {
    c.route += std::string(" -cuda.precision=") + t.name;
    return c;
  }
  for (OpInput& input : c.inputs) {
    if (!input.tensor.empty()) input.tensor = input.tensor.castTo(t.dtype);
  }
  return c;
}

struct ConvShape {
  std::string name;
  Shape x, w;
  CudaAttributes attributes;
  bool bias = true;
  bool symmetric = true;  // cuDNN-eligible pads
};

std::vector<ConvShape> convShapes() {
  return {
      {"1x1", {2, 8, 5, 7}, {6, 8, 1, 1}, {}},
      {"3x3", {1, 3, 9, 11}, {4, 3, 3, 3}, {{"pads", intsAttr({1, 1, 1, 1})}}},
      {"3x3_stride2",
       {2, 5, 13, 10},
       {7, 5, 3, 3},
       {{"pads", intsAttr({1, 1, 1, 1})}, {"strides", intsAttr({2, 2})}}},
      {"depthwise",
       {1, 6, 10, 9},
       {6, 1, 3, 3},
       {{"pads", intsAttr({1, 1, 1, 1})}, {"group", intAttr(6)}}},
      {"depthwise_multiplier2",
       {2, 3, 8, 7},
       {6, 1, 3, 3},
       {{"pads", intsAttr({1, 1, 1, 1})}, {"group", intAttr(3)}, {"strides", intsAttr({2, 1})}}},
      {"grouped", {2, 8, 7, 7}, {6, 4, 3, 3}, {{"group", intAttr(2)}}, false},
      {"dilated",
       {1, 4, 15, 13},
       {5, 4, 3, 3},
       {{"pads", intsAttr({2, 3, 2, 3})}, {"dilations", intsAttr({2, 3})}}},
      {"5x5_no_bias", {3, 2, 11, 12}, {3, 2, 5, 5}, {{"pads", intsAttr({2, 2, 2, 2})}}, false},
      {"kernel_shape_given",
       {1, 3, 6, 6},
       {2, 3, 2, 3},
       {{"kernel_shape", intsAttr({2, 3})}, {"pads", intsAttr({1, 1, 1, 1})}}},
      {"1x1_size1_dims", {1, 5, 1, 1}, {3, 5, 1, 1}, {}},
      {"asymmetric_pads",
       {1, 3, 8, 9},
       {4, 3, 3, 3},
       {{"pads", intsAttr({0, 1, 1, 2})}},
       true,
       false},
      {"same_upper_stride1", {2, 3, 7, 8}, {4, 3, 3, 3}, {{"auto_pad", stringAttr("SAME_UPPER")}}},
      // Stride 2 over an even extent: one pad in total per axis, at the end (upper) or start.
      {"same_upper_stride2",
       {1, 3, 8, 10},
       {4, 3, 3, 3},
       {{"auto_pad", stringAttr("SAME_UPPER")}, {"strides", intsAttr({2, 2})}},
       true,
       false},
      {"same_lower_stride2",
       {1, 3, 8, 10},
       {4, 3, 3, 3},
       {{"auto_pad", stringAttr("SAME_LOWER")}, {"strides", intsAttr({2, 2})}},
       true,
       false},
      {"valid", {2, 3, 9, 7}, {4, 3, 3, 2}, {{"auto_pad", stringAttr("VALID")}}},
      {"1d", {2, 3, 17}, {4, 3, 5}, {{"pads", intsAttr({2, 2})}, {"strides", intsAttr({2})}}},
      {"1d_asymmetric", {1, 4, 12}, {2, 4, 3}, {{"pads", intsAttr({0, 2})}}, true, false},
      {"1d_dilated_grouped",
       {2, 6, 19},
       {4, 3, 3},
       {{"pads", intsAttr({2, 2})}, {"dilations", intsAttr({2})}, {"group", intAttr(2)}}},
      {"3d", {1, 2, 5, 6, 7}, {3, 2, 3, 3, 3}, {{"pads", intsAttr({1, 1, 1, 1, 1, 1})}}},
      {"3d_strided",
       {2, 3, 6, 5, 4},
       {2, 3, 2, 3, 1},
       {{"strides", intsAttr({2, 1, 2})}, {"pads", intsAttr({0, 1, 0, 0, 1, 0})}}},
  };
}

CudaOpCase convCase(const ConvShape& s, unsigned seed) {
  CudaOpCase c{.opType = "Conv", .attributes = s.attributes};
  c.inputs = {activations(s.x, seed), constantWeights(s.w, seed + 1)};
  if (s.bias) c.inputs.push_back(constantWeights({s.w[0]}, seed + 2));
  return c;
}

TEST(CudaConv, CudnnMatchesReference) {
  unsigned seed = 10;
  for (const ConvShape& s : convShapes()) {
    SCOPED_TRACE(s.name);
    CudaOpCase c = convCase(s, seed += 3);
    // Asymmetric pads stay with kiln's kernel whatever the source.
    c.expectTactic = s.symmetric ? "cudnn" : "kiln.conv";
    expectConv(c);
  }
}

TEST(CudaConv, NativeMatchesReference) {
  unsigned seed = 100;
  for (const ConvShape& s : convShapes()) {
    SCOPED_TRACE(s.name);
    CudaOpCase c = convCase(s, seed += 3);
    c.route = "-cuda.conv.source=native";
    c.expectTactic = "kiln.conv";
    expectConv(c);
  }
}

TEST(CudaConv, TimedAlgoMatchesReference) {
  unsigned seed = 200;
  for (const ConvShape& s : convShapes()) {
    if (!s.symmetric) continue;
    SCOPED_TRACE(s.name);
    CudaOpCase c = convCase(s, seed += 3);
    c.route = "-cuda.conv.algo=timed";
    c.expectTactic = "cudnn.timed";
    expectConv(c);
  }
}

TEST(CudaConv, SeparateEpilogueAddsTheBiasAfterCudnn) {
  CudaOpCase c = convCase(convShapes()[2], 300);
  c.route = "-cuda.conv.epilogue=separate";
  c.expectTactic = "cudnn+epilogue";
  expectConv(c);
  // Without a bias there is nothing to separate.
  CudaOpCase plain = convCase(convShapes()[7], 301);
  plain.route = "-cuda.conv.epilogue=separate";
  plain.expectTactic = "cudnn";
  expectConv(plain);
}

TEST(CudaConv, RuntimeWeightsAndBias) {
  for (const char* source : {"cudnn", "native"}) {
    SCOPED_TRACE(source);
    CudaOpCase c{.opType = "Conv", .attributes = {{"pads", intsAttr({1, 1, 1, 1})}}};
    c.inputs = {activations({2, 4, 9, 6}, 400), activations({5, 4, 3, 3}, 401),
                activations({5}, 402)};
    c.route = std::string("-cuda.conv.source=") + source;
    c.expectTactic = std::string(source) == "cudnn" ? "cudnn" : "kiln.conv";
    expectConv(c);
  }
}

// A batch of zero images: no cuDNN (it takes no empty tensors), and nothing to launch.
TEST(CudaConv, EmptyBatchTakesKilnsKernel) {
  CudaOpCase c{.opType = "Conv", .attributes = {{"pads", intsAttr({1, 1, 1, 1})}}};
  c.inputs = {{ir::Tensor(ir::DType::kFloat32, Shape{0, 3, 5, 5}), false},
              constantWeights({2, 3, 3, 3}, 410)};
  c.expectTactic = "kiln.conv";
  expectConv(c);
}

// ---------------------------------------------------------------------------------------------
// kiln.FusedConv: every activation, with and without a residual.

struct Activation {
  std::string name;
  CudaAttributes attributes;
  bool cudnnFuses;  // a cuDNN pointwise mode computes it exactly
};

std::vector<Activation> activationList() {
  return {
      {"Relu", {}, true},
      {"LeakyRelu", {{"activation_alpha", floatAttr(0.1f)}}, true},
      {"Clip",
       {{"activation_alpha", floatAttr(-0.5f)}, {"activation_beta", floatAttr(0.7f)}},
       true},
      // An unbounded side has no RELU_FWD clip: kiln's epilogue kernel clips.
      {"Clip", {{"activation_beta", floatAttr(0.6f)}}, false},
      {"Sigmoid", {}, true},
      {"HardSigmoid",
       {{"activation_alpha", floatAttr(0.3f)}, {"activation_beta", floatAttr(0.4f)}},
       false},
      {"HardSwish", {}, false},
      {"Tanh", {}, true},
      {"Gelu", {}, true},
      {"GeluTanh", {}, true},  // GELU_APPROX_TANH_FWD
      {"Silu", {}, true},      // SWISH_FWD, beta 1
  };
}

CudaOpCase fusedCase(const Activation& a, bool residual, unsigned seed) {
  CudaOpCase c{.opType = "FusedConv",
               .attributes = {{"pads", intsAttr({1, 1, 1, 1})}, {"strides", intsAttr({1, 2})}},
               .domain = ir::kKilnDomain};
  c.attributes["activation"] = stringAttr(a.name);
  for (const auto& [key, value] : a.attributes) c.attributes[key] = value;
  c.inputs = {activations({2, 5, 9, 11}, seed), constantWeights({6, 5, 3, 3}, seed + 1),
              constantWeights({6}, seed + 2)};
  // Output [2, 6, 9, 6].
  if (residual) c.inputs.push_back(activations({2, 6, 9, 6}, seed + 3));
  return c;
}

TEST(CudaFusedConv, EveryActivationWithAndWithoutResidual) {
  unsigned seed = 500;
  for (const Activation& a : activationList()) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE(a.name + (residual ? " + residual" : ""));
      CudaOpCase fused = fusedCase(a, residual, seed += 5);
      fused.expectTactic = a.cudnnFuses ? "cudnn" : "cudnn+epilogue";
      expectConv(fused);

      CudaOpCase separate = fusedCase(a, residual, seed += 5);
      separate.route = "-cuda.conv.epilogue=separate";
      separate.expectTactic = "cudnn+epilogue";
      expectConv(separate);

      CudaOpCase native = fusedCase(a, residual, seed += 5);
      native.route = "-cuda.conv.source=native";
      native.expectTactic = "kiln.conv";
      expectConv(native);

      CudaOpCase timed = fusedCase(a, residual, seed += 5);
      timed.route = "-cuda.conv.algo=timed";
      timed.expectTactic = a.cudnnFuses ? "cudnn.timed" : "cudnn.timed+epilogue";
      expectConv(timed);
    }
  }
}

TEST(CudaFusedConv, ResidualWithoutBiasOrActivation) {
  for (const char* source : {"cudnn", "native"}) {
    SCOPED_TRACE(source);
    CudaOpCase c{
        .opType = "FusedConv", .attributes = {{"group", intAttr(4)}}, .domain = ir::kKilnDomain};
    c.inputs = {activations({1, 4, 7, 5}, 600), constantWeights({4, 1, 3, 3}, 601), OpInput{},
                activations({1, 4, 5, 3}, 602)};
    c.route = std::string("-cuda.conv.source=") + source;
    c.expectTactic = std::string(source) == "cudnn" ? "cudnn" : "kiln.conv";
    expectConv(c);
  }
}

TEST(CudaFusedConv, DepthwiseAndOneDimensional) {
  CudaOpCase depthwise{.opType = "FusedConv",
                       .attributes = {{"group", intAttr(6)},
                                      {"pads", intsAttr({1, 1, 1, 1})},
                                      {"strides", intsAttr({2, 2})},
                                      {"activation", stringAttr("HardSwish")}},
                       .domain = ir::kKilnDomain};
  depthwise.inputs = {activations({2, 6, 9, 9}, 610), constantWeights({6, 1, 3, 3}, 611),
                      constantWeights({6}, 612), activations({2, 6, 5, 5}, 613)};
  depthwise.expectTactic = "cudnn+epilogue";
  expectConv(depthwise);

  CudaOpCase oneD{.opType = "FusedConv",
                  .attributes = {{"pads", intsAttr({1, 1})}, {"activation", stringAttr("Relu")}},
                  .domain = ir::kKilnDomain};
  oneD.inputs = {activations({3, 4, 13}, 620), constantWeights({5, 4, 3}, 621),
                 constantWeights({5}, 622), activations({3, 5, 13}, 623)};
  oneD.expectTactic = "cudnn";
  expectConv(oneD);
}

// ---------------------------------------------------------------------------------------------
// kiln.NhwcConv: X [N, H, W, C], W [kH, kW, C/group, M], residual [N, OH, OW, M].

struct NhwcShape {
  std::string name;
  Shape x, w, y;
  CudaAttributes attributes;
  bool symmetric = true;
};

std::vector<NhwcShape> nhwcShapes() {
  return {
      {"3x3", {2, 9, 7, 5}, {3, 3, 5, 6}, {2, 9, 7, 6}, {{"pads", intsAttr({1, 1, 1, 1})}}},
      {"1x1_stride2", {1, 8, 6, 4}, {1, 1, 4, 3}, {1, 4, 3, 3}, {{"strides", intsAttr({2, 2})}}},
      {"depthwise",
       {1, 7, 8, 6},
       {3, 3, 1, 6},
       {1, 7, 8, 6},
       {{"pads", intsAttr({1, 1, 1, 1})}, {"group", intAttr(6)}}},
      {"grouped_dilated",
       {2, 10, 9, 4},
       {3, 3, 2, 6},
       {2, 6, 5, 6},
       {{"group", intAttr(2)}, {"dilations", intsAttr({2, 2})}}},
      // pads [h_begin, w_begin, h_end, w_end]: H padded 1 + 1, W only at the end.
      {"asymmetric",
       {1, 6, 6, 3},
       {3, 3, 3, 2},
       {1, 6, 5, 2},
       {{"pads", intsAttr({1, 0, 1, 1})}},
       false},
  };
}

CudaOpCase nhwcCase(const NhwcShape& s, const std::string& activation, bool residual,
                    bool constantWeightsOnly, unsigned seed) {
  CudaOpCase c{.opType = "NhwcConv", .attributes = s.attributes, .domain = ir::kKilnDomain};
  if (!activation.empty()) c.attributes["activation"] = stringAttr(activation);
  c.inputs = {activations(s.x, seed),
              constantWeightsOnly ? constantWeights(s.w, seed + 1) : activations(s.w, seed + 1),
              constantWeights({s.w[3]}, seed + 2)};
  if (residual) c.inputs.push_back(activations(s.y, seed + 3));
  return c;
}

TEST(CudaNhwcConv, MatchesReferenceFromEachSource) {
  unsigned seed = 700;
  for (const NhwcShape& s : nhwcShapes()) {
    for (const char* source : {"cudnn", "native"}) {
      for (bool residual : {false, true}) {
        SCOPED_TRACE(s.name + " " + source + (residual ? " + residual" : ""));
        CudaOpCase c = nhwcCase(s, "Relu", residual, true, seed += 4);
        c.route = std::string("-cuda.conv.depthwise=source -cuda.conv.source=") + source;
        c.expectTactic = std::string(source) == "cudnn" && s.symmetric ? "cudnn" : "kiln.conv";
        expectConv(c);
        // The NHWC layout is what the step records.
        BuilderConfig config;
        ASSERT_TRUE(config.setBuildRoute(c.route).isOk());
        auto build = buildCuda(
            makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, 1, c.domain), config);
        ASSERT_TRUE(build.isOk()) << build.status().toString();
        ASSERT_EQ(build->plan.steps().size(), 1u);
        EXPECT_EQ(build->plan.steps()[0]->layout, "nhwc");
      }
    }
  }
}

// Weights that are runtime inputs are reordered for cuDNN on every run, into the workspace.
TEST(CudaNhwcConv, RuntimeWeights) {
  unsigned seed = 800;
  for (const NhwcShape& s : nhwcShapes()) {
    if (!s.symmetric) continue;
    SCOPED_TRACE(s.name);
    CudaOpCase c = nhwcCase(s, "Sigmoid", true, false, seed += 4);
    c.route = "-cuda.conv.depthwise=source";
    c.expectTactic = "cudnn";
    expectConv(c);
    CudaOpCase timed = nhwcCase(s, "HardSigmoid", false, false, seed += 4);
    timed.route = "-cuda.conv.depthwise=source -cuda.conv.algo=timed -cuda.conv.epilogue=separate";
    timed.expectTactic = "cudnn.timed+epilogue";
    expectConv(timed);
  }
}

// kiln's depthwise NHWC kernels (cuda.conv.depthwise=kiln, the default): channel counts that give
// each vector width (16 bytes down to one element), strides, dilations, asymmetric pads, 1x1, 3x3,
// 5x5 and 7x7 kernels, rows narrower and wider than a thread's pixels, with and without bias,
// residual and activation, in each type. `window`: the window kernel takes it (3, 5 or 7 wide,
// stride 1 or 2 and dilation 1 along the row); the others run the direct kernel.
struct DepthwiseShape {
  std::string name;
  int64_t n, h, w, c, kh, kw;
  CudaAttributes attributes;
  int64_t oh, ow;
  bool window;
};

std::vector<DepthwiseShape> depthwiseShapes() {
  return {
      {"c32_3x3", 2, 12, 10, 32, 3, 3, {{"pads", intsAttr({1, 1, 1, 1})}}, 12, 10, true},
      {"c96_3x3_stride2",
       1,
       11,
       9,
       96,
       3,
       3,
       {{"pads", intsAttr({1, 1, 1, 1})}, {"strides", intsAttr({2, 2})}},
       6,
       5,
       true},
      {"c24_5x5_stride2",
       2,
       13,
       14,
       24,
       5,
       5,
       {{"pads", intsAttr({2, 2, 2, 2})}, {"strides", intsAttr({2, 2})}},
       7,
       7,
       true},
      {"c6_dilated",
       1,
       9,
       8,
       6,
       3,
       3,
       {{"pads", intsAttr({2, 2, 2, 2})}, {"dilations", intsAttr({2, 2})}},
       9,
       8,
       false},
      {"c7_asymmetric", 2, 6, 7, 7, 3, 2, {{"pads", intsAttr({0, 1, 2, 0})}}, 6, 7, false},
      {"c12_1x1_stride_2x1", 1, 5, 6, 12, 1, 1, {{"strides", intsAttr({2, 1})}}, 3, 6, false},
      {"c4_no_pad", 1, 4, 4, 4, 3, 3, {}, 2, 2, true},
      {"c16_7x7", 2, 9, 13, 16, 7, 7, {{"pads", intsAttr({3, 3, 3, 3})}}, 9, 13, true},
      {"c8_7x7_stride2",
       1,
       15,
       17,
       8,
       7,
       7,
       {{"pads", intsAttr({3, 3, 3, 3})}, {"strides", intsAttr({2, 2})}},
       8,
       9,
       true},
      // Pads [top, left, bottom, right]: rows cut short on one side, and 10 channels (runs of 2).
      {"c10_5x5_asymmetric", 1, 8, 9, 10, 5, 5, {{"pads", intsAttr({2, 1, 0, 3})}}, 6, 9, true},
      // The window kernel's 3-tall-by-3 rows under a column stride and dilation it takes as is.
      {"c5_3x3_tall_stride",
       2,
       10,
       6,
       5,
       3,
       3,
       {{"pads", intsAttr({2, 1, 2, 1})},
        {"strides", intsAttr({3, 1})},
        {"dilations", intsAttr({2, 1})}},
       4,
       6,
       true},
  };
}

TEST(CudaNhwcConv, DepthwiseKernel) {
  unsigned seed = 2300;
  for (const DepthwiseShape& s : depthwiseShapes()) {
    for (int variant = 0; variant < 3; ++variant) {
      // 0: bias + Relu; 1: bias + residual + HardSwish; 2: no bias, residual, no activation.
      SCOPED_TRACE(s.name + " variant " + std::to_string(variant));
      CudaOpCase c{.opType = "NhwcConv", .attributes = s.attributes, .domain = ir::kKilnDomain};
      c.attributes["group"] = intAttr(s.c);
      c.attributes["kernel_shape"] = intsAttr({s.kh, s.kw});
      if (variant == 0) c.attributes["activation"] = stringAttr("Relu");
      if (variant == 1) c.attributes["activation"] = stringAttr("HardSwish");
      c.inputs = {activations({s.n, s.h, s.w, s.c}, seed++),
                  constantWeights({s.kh, s.kw, 1, s.c}, seed++)};
      c.inputs.push_back(variant == 2 ? OpInput{} : constantWeights({s.c}, seed++));
      if (variant > 0) c.inputs.push_back(activations({s.n, s.oh, s.ow, s.c}, seed++));
      c.expectTactic = s.window ? "kiln.conv.depthwise.window" : "kiln.conv.depthwise";
      expectConv(c);
      for (const ReducedType& t : kReducedTypes) {
        SCOPED_TRACE(t.name);
        CudaOpCase reduced = inType(c, t);
        expectConv(reduced, t.tolerance);
      }
    }
  }
}

// The direct depthwise kernel's tilings (cuda.conv.depthwise.pixels, .block, the occupancy
// calculator's block included, with cuda.conv.depthwise.window=loads): rows whose width is not a
// multiple of the pixels a thread takes, strides, dilations and every epilogue.
TEST(CudaNhwcConv, DepthwiseKernelTilings) {
  unsigned seed = 2350;
  const std::string loads = "-cuda.conv.depthwise.window=loads ";
  const std::vector<std::pair<std::string, std::string>> tilings = {
      {loads, "kiln.conv.depthwise"},
      {loads + "-cuda.conv.depthwise.pixels=2", "kiln.conv.depthwise.px2"},
      {loads + "-cuda.conv.depthwise.pixels=4", "kiln.conv.depthwise.px4"},
      {loads + "-cuda.conv.depthwise.pixels=4 -cuda.conv.depthwise.block=128",
       "kiln.conv.depthwise.px4.block128"},
      {loads + "-cuda.conv.depthwise.block=512", "kiln.conv.depthwise.block512"},
      {loads + "-cuda.conv.depthwise.pixels=2 -cuda.conv.depthwise.block=occupancy",
       "kiln.conv.depthwise.px2.occupancy"}};
  for (const auto& [route, tactic] : tilings) {
    for (const DepthwiseShape& s : depthwiseShapes()) {
      SCOPED_TRACE(route + " " + s.name);
      CudaOpCase c{.opType = "NhwcConv", .attributes = s.attributes, .domain = ir::kKilnDomain};
      c.attributes["group"] = intAttr(s.c);
      c.attributes["kernel_shape"] = intsAttr({s.kh, s.kw});
      c.attributes["activation"] = stringAttr("HardSwish");
      c.inputs = {activations({s.n, s.h, s.w, s.c}, seed++),
                  constantWeights({s.kh, s.kw, 1, s.c}, seed++), constantWeights({s.c}, seed++),
                  activations({s.n, s.oh, s.ow, s.c}, seed++)};
      c.route = route;
      c.expectTactic = tactic;
      expectConv(c);
      CudaOpCase reduced = inType(c, kReducedTypes[0]);
      expectConv(reduced, kReducedTypes[0].tolerance);
    }
  }
}

// The window kernel against the reference and bit for bit against the direct kernel (the same sums
// in the same order): every shape it takes, each pixel count a thread (auto, 8, 4, 2) and channel
// run (16, 8 and 4 bytes), fp32 and fp16, an epilogue with bias, residual and activation, and a
// weight that is infinite: the taps in the padding must be skipped, not multiplied by zero (0 *
// inf would be NaN where the direct kernel and the reference have a number or inf).
TEST(CudaNhwcConv, DepthwiseWindowKernelMatchesTheDirectKernelBitForBit) {
  unsigned seed = 2380;
  const std::vector<std::pair<std::string, std::string>> windows = {
      {"", "kiln.conv.depthwise.window"},
      {"-cuda.conv.depthwise.window.pixels=8", "kiln.conv.depthwise.window.px8"},
      {"-cuda.conv.depthwise.window.pixels=4 -cuda.conv.depthwise.vector=16",
       "kiln.conv.depthwise.window.px4"},
      {"-cuda.conv.depthwise.window.pixels=2 -cuda.conv.depthwise.vector=4 "
       "-cuda.conv.depthwise.block=128",
       "kiln.conv.depthwise.window.px2.block128"},
      {"-cuda.conv.depthwise.window.pixels=8 -cuda.conv.depthwise.vector=4 "
       "-cuda.conv.depthwise.block=occupancy",
       "kiln.conv.depthwise.window.px8.occupancy"},
      // Capped registers (fp16 only; fp32 runs the plain instance): 8 and auto pixels.
      {"-cuda.conv.depthwise.window.pixels=8 -cuda.conv.depthwise.vector=4 "
       "-cuda.conv.depthwise.window.registers=56",
       "kiln.conv.depthwise.window.px8.regs56"},
      {"-cuda.conv.depthwise.window.registers=56", "kiln.conv.depthwise.window.regs56"}};
  for (const DepthwiseShape& s : depthwiseShapes()) {
    if (!s.window) continue;
    for (const ReducedType* type : {static_cast<const ReducedType*>(nullptr), &kReducedTypes[0]}) {
      CudaOpCase c{.opType = "NhwcConv", .attributes = s.attributes, .domain = ir::kKilnDomain};
      c.attributes["group"] = intAttr(s.c);
      c.attributes["kernel_shape"] = intsAttr({s.kh, s.kw});
      c.attributes["activation"] = stringAttr("HardSwish");
      ir::Tensor weights = uniformTensor({s.kh, s.kw, 1, s.c}, seed++, -0.5f, 0.5f);
      // The corner tap of channel 0: padding for the first outputs of every row.
      weights.mutableData<float>()[0] = std::numeric_limits<float>::infinity();
      c.inputs = {activations({s.n, s.h, s.w, s.c}, seed++), OpInput{weights, true},
                  constantWeights({s.c}, seed++), activations({s.n, s.oh, s.ow, s.c}, seed++)};
      if (type) c = inType(c, *type);
      auto runWith = [&](const std::string& route, const std::string& tactic) -> ir::Tensor {
        SCOPED_TRACE(s.name + (type ? " fp16 [" : " fp32 [") + route + "]");
        StepReport step;
        ir::Tensor output = runCudaCase(c, "-cuda.layout=nchw " + route, &step);
        EXPECT_EQ(step.tactic, tactic);
        return output;
      };
      const ir::Tensor direct = runWith("-cuda.conv.depthwise.window=loads", "kiln.conv.depthwise");
      for (const auto& [route, tactic] : windows) {
        CudaOpCase window = c;
        window.route = route;
        window.expectTactic = tactic;
        // The infinite weight makes the reference's outputs inf or NaN where it counts; the rest
        // within the type's tolerance.
        expectConv(window, type ? type->tolerance : 0);
        const ir::Tensor got = runWith(route, tactic);
        if (!cuda::deviceAvailable()) continue;
        SCOPED_TRACE(s.name + (type ? " fp16 [" : " fp32 [") + route + "]");
        ASSERT_EQ(got.byteSize(), direct.byteSize());
        EXPECT_EQ(std::memcmp(got.rawData(), direct.rawData(), got.byteSize()), 0);
      }
    }
  }
}

// The source knob's choice for depthwise convolutions, and what stays with the general sources:
// a grouped convolution that is not depthwise, and a channel multiplier above one.
TEST(CudaNhwcConv, DepthwiseKnobAndWhatIsNotDepthwise) {
  CudaOpCase c{.opType = "NhwcConv",
               .attributes = {{"group", intAttr(8)}, {"pads", intsAttr({1, 1, 1, 1})}},
               .domain = ir::kKilnDomain};
  c.inputs = {activations({1, 6, 6, 8}, 2400), constantWeights({3, 3, 1, 8}, 2401),
              constantWeights({8}, 2402)};
  c.expectTactic = "kiln.conv.depthwise.window";
  expectConv(c);
  c.route = "-cuda.conv.depthwise=source";
  c.expectTactic = "cudnn";
  expectConv(c);
  c.route = "-cuda.conv.depthwise=source -cuda.conv.source=native";
  c.expectTactic = "kiln.conv";
  expectConv(c);

  CudaOpCase grouped{.opType = "NhwcConv",
                     .attributes = {{"group", intAttr(4)}, {"pads", intsAttr({1, 1, 1, 1})}},
                     .domain = ir::kKilnDomain};
  grouped.inputs = {activations({1, 6, 6, 8}, 2410), constantWeights({3, 3, 2, 4}, 2411),
                    constantWeights({4}, 2412)};
  grouped.expectTactic = "cudnn";
  expectConv(grouped);

  CudaOpCase multiplier{.opType = "NhwcConv",
                        .attributes = {{"group", intAttr(4)}, {"pads", intsAttr({1, 1, 1, 1})}},
                        .domain = ir::kKilnDomain};
  multiplier.inputs = {activations({1, 6, 6, 4}, 2420), constantWeights({3, 3, 1, 8}, 2421),
                       constantWeights({8}, 2422)};
  multiplier.expectTactic = "cudnn";
  expectConv(multiplier);
}

// ---------------------------------------------------------------------------------------------
// What the factory leaves to others.

// float16 (and bfloat16) Conv is cuDNN's (below); float64 Conv and ConvTranspose are the host's;
// float32 ConvTranspose is cuDNN's (its cases below).
TEST(CudaConv, Float64IsTheHostsAndConvTransposeIsTaken) {
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("").isOk());
  auto half = buildCuda(
      makeSingleOpGraph("Conv", {{ir::Tensor(ir::DType::kFloat16, Shape{1, 2, 4, 4}), false},
                                 {ir::Tensor(ir::DType::kFloat16, Shape{3, 2, 3, 3}), true}}),
      config);
  ASSERT_TRUE(half.isOk()) << half.status().toString();
  EXPECT_EQ(cudaTacticOf(*half, "Conv"), "cudnn");

  const ir::Tensor wide =
      ir::Tensor(ir::DType::kFloat64, Shape{1, 2, 4, 4});  // zeros are enough for lowering
  auto build = buildCuda(
      makeSingleOpGraph(
          "Conv", {{wide, false}, {ir::Tensor(ir::DType::kFloat64, Shape{3, 2, 3, 3}), true}}),
      config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  EXPECT_EQ(cudaTacticOf(*build, "Conv"), "host.reference");
  auto wideTranspose =
      buildCuda(makeSingleOpGraph(
                    "ConvTranspose",
                    {{wide, false}, {ir::Tensor(ir::DType::kFloat64, Shape{2, 3, 3, 3}), true}}),
                config);
  ASSERT_TRUE(wideTranspose.isOk()) << wideTranspose.status().toString();
  EXPECT_EQ(cudaTacticOf(*wideTranspose, "ConvTranspose"), "host.reference");

  auto transpose = buildCuda(
      makeSingleOpGraph("ConvTranspose",
                        {activations({1, 2, 4, 4}, 900), constantWeights({2, 3, 3, 3}, 901)}),
      config);
  ASSERT_TRUE(transpose.isOk()) << transpose.status().toString();
  EXPECT_EQ(cudaTacticOf(*transpose, "ConvTranspose"), "cudnn");
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose: X [N, C, ...], W [C, M/group, k...], every attribute the reference takes.

struct TransposeShape {
  std::string name;
  Shape x, w;
  CudaAttributes attributes;
  bool bias = true;
  bool cudnn = true;  // pads cuDNN's backward data can take (else kiln's kernel whatever the knob)
};

std::vector<TransposeShape> transposeShapes() {
  return {
      {"3x3", {1, 2, 4, 4}, {2, 3, 3, 3}, {}},
      {"4x4_stride2_pads1",
       {2, 8, 5, 6},
       {8, 4, 4, 4},
       {{"strides", intsAttr({2, 2})}, {"pads", intsAttr({1, 1, 1, 1})}}},
      {"output_padding",
       {1, 3, 5, 5},
       {3, 2, 3, 3},
       {{"strides", intsAttr({3, 2})},
        {"pads", intsAttr({1, 1, 1, 1})},
        {"output_padding", intsAttr({1, 1})}}},
      // output_shape [10, 8] asks one more than the strides give on each axis: a negative pad.
      {"output_shape_larger",
       {1, 1, 3, 3},
       {1, 2, 3, 3},
       {{"strides", intsAttr({3, 2})}, {"output_shape", intsAttr({10, 8})}},
       true,
       false},
      // ONNX's kernel_shape case: output_padding and output_shape agree, no pads.
      {"kernel_shape_output_shape",
       {1, 1, 3, 3},
       {1, 2, 3, 3},
       {{"kernel_shape", intsAttr({3, 3})},
        {"strides", intsAttr({3, 2})},
        {"output_padding", intsAttr({1, 1})},
        {"output_shape", intsAttr({10, 8})}}},
      {"output_shape_smaller",
       {1, 2, 4, 4},
       {2, 2, 3, 3},
       {{"strides", intsAttr({2, 2})}, {"output_shape", intsAttr({7, 8})}},
       false,
       false},
      {"asymmetric_pads",
       {1, 2, 5, 5},
       {2, 2, 3, 3},
       {{"strides", intsAttr({2, 2})}, {"pads", intsAttr({0, 1, 1, 2})}},
       true,
       false},
      {"dilated",
       {1, 2, 4, 5},
       {2, 3, 2, 2},
       {{"dilations", intsAttr({2, 2})}, {"pads", intsAttr({1, 1, 1, 1})}}},
      {"grouped", {2, 4, 5, 5}, {4, 3, 3, 3}, {{"group", intAttr(2)}}},
      {"depthwise_stride2",
       {1, 4, 5, 5},
       {4, 1, 3, 3},
       {{"group", intAttr(4)}, {"strides", intsAttr({2, 2})}, {"pads", intsAttr({1, 1, 1, 1})}}},
      // SAME: the output is input * stride, the pad total 1 here, at the end or the start.
      {"same_upper",
       {1, 2, 3, 3},
       {2, 2, 3, 3},
       {{"auto_pad", stringAttr("SAME_UPPER")}, {"strides", intsAttr({2, 2})}},
       true,
       false},
      {"same_lower",
       {1, 2, 3, 3},
       {2, 2, 3, 3},
       {{"auto_pad", stringAttr("SAME_LOWER")}, {"strides", intsAttr({2, 2})}},
       true,
       false},
      {"valid",
       {1, 2, 3, 3},
       {2, 3, 3, 3},
       {{"auto_pad", stringAttr("VALID")}, {"strides", intsAttr({2, 2})}}},
      {"no_bias", {2, 3, 4, 3}, {3, 5, 2, 2}, {{"strides", intsAttr({2, 2})}}, false},
      {"1d", {2, 3, 7}, {3, 2, 3}, {{"strides", intsAttr({2})}, {"pads", intsAttr({1, 1})}}},
      {"1d_output_padding",
       {1, 2, 6},
       {2, 3, 4},
       {{"strides", intsAttr({3})}, {"output_padding", intsAttr({2})}}},
      {"3d",
       {1, 2, 3, 4, 5},
       {2, 2, 3, 3, 2},
       {{"strides", intsAttr({1, 2, 1})}, {"pads", intsAttr({1, 0, 1, 1, 0, 1})}}},
      {"3d_grouped_dilated",
       {1, 4, 3, 3, 3},
       {4, 1, 2, 2, 2},
       {{"group", intAttr(2)},
        {"dilations", intsAttr({2, 1, 2})},
        {"strides", intsAttr({2, 2, 1})}}},
  };
}

CudaOpCase transposeCase(const TransposeShape& s, unsigned seed) {
  CudaOpCase c{.opType = "ConvTranspose", .attributes = s.attributes};
  c.inputs = {activations(s.x, seed), constantWeights(s.w, seed + 1)};
  const int64_t group =
      s.attributes.count("group") ? std::get<int64_t>(s.attributes.at("group").value) : 1;
  if (s.bias) c.inputs.push_back(constantWeights({s.w[1] * group}, seed + 2));
  return c;
}

// Each shape from both sources. cuDNN may have no deterministic, accurate enough engine for an
// unusual shape: the step then runs kiln's kernel, recorded here, required below for the shapes
// decoders are made of.
TEST(CudaConvTranspose, EveryAttributeFromEachSource) {
  unsigned seed = 3000;
  for (const TransposeShape& s : transposeShapes()) {
    for (const char* source : {"cudnn", "native"}) {
      SCOPED_TRACE(s.name + " " + source);
      CudaOpCase c = transposeCase(s, seed += 3);
      c.route = std::string("-cuda.conv.source=") + source;
      c.expectTactic = std::string(source) == "cudnn" && s.cudnn ? "cudnn" : "kiln.convtranspose";
      expectConv(c, 0, false);
    }
  }
}

// The decoder shapes (2-D, kernel 4 stride 2 pad 1 or kernel 3 stride 2 with output_padding,
// channels a multiple of eight) must stay on cuDNN once prepared, through each algo choice and
// with the bias inside cuDNN's graph or in kiln's epilogue kernel.
TEST(CudaConvTranspose, DecoderShapesStayOnCudnn) {
  const std::vector<TransposeShape> shapes = {
      {"k4_s2_p1",
       {2, 16, 8, 8},
       {16, 8, 4, 4},
       {{"strides", intsAttr({2, 2})}, {"pads", intsAttr({1, 1, 1, 1})}}},
      {"k3_s2_output_padding",
       {1, 32, 7, 9},
       {32, 16, 3, 3},
       {{"strides", intsAttr({2, 2})},
        {"pads", intsAttr({1, 1, 1, 1})},
        {"output_padding", intsAttr({1, 1})}}},
      {"k2_s2_no_bias", {2, 8, 6, 6}, {8, 8, 2, 2}, {{"strides", intsAttr({2, 2})}}, false},
  };
  unsigned seed = 3200;
  for (const TransposeShape& s : shapes) {
    for (const char* route : {"", "-cuda.conv.algo=timed", "-cuda.conv.epilogue=separate"}) {
      SCOPED_TRACE(s.name + " [" + route + "]");
      CudaOpCase c = transposeCase(s, seed += 3);
      c.route = route;
      const bool timed = std::string(route).find("timed") != std::string::npos;
      const bool separate = std::string(route).find("separate") != std::string::npos;
      c.expectTactic =
          std::string(timed ? "cudnn.timed" : "cudnn") + (separate && s.bias ? "+epilogue" : "");
      expectConv(c);
    }
  }
}

TEST(CudaConvTranspose, RuntimeWeightsAndBias) {
  for (const char* source : {"cudnn", "native"}) {
    SCOPED_TRACE(source);
    CudaOpCase c{.opType = "ConvTranspose",
                 .attributes = {{"strides", intsAttr({2, 2})}, {"pads", intsAttr({1, 1, 1, 1})}}};
    c.inputs = {activations({2, 4, 5, 6}, 3300), activations({4, 3, 4, 4}, 3301),
                activations({3}, 3302)};
    c.route = std::string("-cuda.conv.source=") + source;
    c.expectTactic = std::string(source) == "cudnn" ? "cudnn" : "kiln.convtranspose";
    expectConv(c);
  }
}

// A batch of zero images: kiln's kernel, which has nothing to launch.
TEST(CudaConvTranspose, EmptyBatchTakesKilnsKernel) {
  CudaOpCase c{.opType = "ConvTranspose", .attributes = {{"strides", intsAttr({2, 2})}}};
  c.inputs = {{ir::Tensor(ir::DType::kFloat32, Shape{0, 3, 4, 4}), false},
              constantWeights({3, 2, 3, 3}, 3310)};
  c.expectTactic = "kiln.convtranspose";
  expectConv(c);
}

// float16 from each source (ONNX has no bfloat16 ConvTranspose, and cuda.precision leaves the op
// in float32).
TEST(CudaConvTranspose, Float16FromEachSource) {
  unsigned seed = 3400;
  const ReducedType& t = kReducedTypes[0];
  for (const TransposeShape& s : transposeShapes()) {
    for (const char* source : {"cudnn", "native"}) {
      SCOPED_TRACE(s.name + " " + source);
      CudaOpCase c = transposeCase(s, seed += 3);
      c.route = std::string("-cuda.conv.source=") + source;
      c = inType(c, t);
      c.expectTactic = std::string(source) == "cudnn" && s.cudnn ? "cudnn" : "kiln.convtranspose";
      expectConv(c, t.tolerance, false);
    }
  }
}

// cuda.precision=tf32 does not reach ConvTranspose: its step stays fp32 (no TF32 engines).
TEST(CudaConvTranspose, StaysFp32UnderTf32) {
  CudaOpCase c = transposeCase(transposeShapes()[1], 3500);
  c.route = "-cuda.precision=tf32";
  c.expectTactic = "cudnn";
  expectConv(c);
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute(c.route).isOk());
  auto build = buildCuda(makeSingleOpGraph(c.opType, c.inputs, c.attributes), config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  ASSERT_EQ(build->plan.steps().size(), 1u);
  EXPECT_EQ(build->plan.steps()[0]->precision, "fp32");
}

// cuda.conv.source applies to one ConvTranspose node like to a Conv.
TEST(CudaConvTranspose, SourceKnobAppliesPerNode) {
  CudaOpCase c = transposeCase(transposeShapes()[1], 3600);
  c.route = "-cuda.conv.source@node=native";
  c.expectTactic = "kiln.convtranspose";
  expectConv(c);
}

// ---------------------------------------------------------------------------------------------
// float16 and bfloat16.

// Every shape from cuDNN (where its pads allow) and from kiln's kernel. Where cuDNN has no
// engine for a shape in the type the step may still end on kiln's kernel: recorded here,
// required below for the shapes networks are made of.
TEST(CudaConv, ReducedTypesMatchReference) {
  unsigned seed = 1000;
  for (const ReducedType& t : kReducedTypes) {
    for (const ConvShape& s : convShapes()) {
      for (const char* source : {"cudnn", "native"}) {
        SCOPED_TRACE(std::string(t.name) + " " + s.name + " " + source);
        CudaOpCase c = convCase(s, seed += 3);
        c.route = std::string("-cuda.conv.source=") + source;
        c = inType(c, t);
        c.expectTactic = std::string(source) == "cudnn" && s.symmetric ? "cudnn" : "kiln.conv";
        // A reduced NCHW convolution with 1x1 output planes keeps its bias out of cuDNN's graph.
        if (c.expectTactic == "cudnn" && s.name == "1x1_size1_dims")
          c.expectTactic = "cudnn+epilogue";
        expectConv(c, t.tolerance, false);
      }
    }
  }
}

// Convolutions with channels a multiple of eight, the bias and a Relu fused, NCHW and NHWC, with
// constant and runtime weights: cuDNN must have an engine for each (a step that quietly fell
// back to kiln's kernel would hide a cuDNN graph the reduced types broke).
TEST(CudaConv, ReducedTypesStayOnCudnn) {
  unsigned seed = 1400;
  for (const ReducedType& t : kReducedTypes) {
    SCOPED_TRACE(t.name);
    CudaOpCase fused{
        .opType = "FusedConv",
        .attributes = {{"pads", intsAttr({1, 1, 1, 1})}, {"activation", stringAttr("Relu")}},
        .domain = ir::kKilnDomain};
    fused.inputs = {activations({2, 16, 10, 12}, seed), constantWeights({32, 16, 3, 3}, seed + 1),
                    constantWeights({32}, seed + 2), activations({2, 32, 10, 12}, seed + 3)};
    fused.expectTactic = "cudnn";
    expectConv(inType(fused, t), t.tolerance);

    CudaOpCase pointwise = convCase({"1x1", {2, 32, 7, 7}, {64, 32, 1, 1}, {}}, seed + 4);
    pointwise.expectTactic = "cudnn";
    expectConv(inType(pointwise, t), t.tolerance);

    for (bool constantWeightsOnly : {true, false}) {
      const NhwcShape s{"3x3",
                        {2, 10, 12, 16},
                        {3, 3, 16, 32},
                        {2, 10, 12, 32},
                        {{"pads", intsAttr({1, 1, 1, 1})}}};
      CudaOpCase nhwc = nhwcCase(s, "Relu", true, constantWeightsOnly, seed += 8);
      nhwc.expectTactic = "cudnn";
      expectConv(inType(nhwc, t), t.tolerance);
    }
  }
}

// Every activation, with and without a residual, through cuDNN's graph, kiln's epilogue kernel
// after it, and kiln's direct kernel.
TEST(CudaFusedConv, ReducedTypesEveryActivation) {
  unsigned seed = 1600;
  for (const ReducedType& t : kReducedTypes) {
    for (const Activation& a : activationList()) {
      for (bool residual : {false, true}) {
        SCOPED_TRACE(std::string(t.name) + " " + a.name + (residual ? " + residual" : ""));
        CudaOpCase fused = inType(fusedCase(a, residual, seed += 5), t);
        fused.expectTactic = a.cudnnFuses ? "cudnn" : "cudnn+epilogue";
        expectConv(fused, t.tolerance, false);

        CudaOpCase separate = fusedCase(a, residual, seed += 5);
        separate.route = "-cuda.conv.epilogue=separate";
        separate = inType(separate, t);
        separate.expectTactic = "cudnn+epilogue";
        expectConv(separate, t.tolerance, false);

        CudaOpCase native = fusedCase(a, residual, seed += 5);
        native.route = "-cuda.conv.source=native";
        native = inType(native, t);
        native.expectTactic = "kiln.conv";
        expectConv(native, t.tolerance);
      }
    }
  }
}

// Squeeze-and-excitation's 1x1 convolutions over pooled channels (1x1 output planes), float16 and
// bfloat16 in NCHW: cuDNN's fused engines for them left part of Y unwritten (EfficientNet-B0 gave
// NaN), so the bias and activation run in kiln's epilogue kernel after the bare cuDNN convolution.
TEST(CudaFusedConv, ReducedTypesPooledChannelsKeepTheEpilogueOutOfCudnn) {
  unsigned seed = 1700;
  struct Squeeze {
    int64_t in, out;
    const char* activation;
  };
  for (const ReducedType& t : kReducedTypes) {
    for (const Squeeze& q : {Squeeze{480, 20, "Relu"}, Squeeze{20, 480, "Sigmoid"},
                             Squeeze{96, 4, "Relu"}, Squeeze{24, 480, "Sigmoid"}}) {
      SCOPED_TRACE(fmt::format("{} {}->{} {}", t.name, q.in, q.out, q.activation));
      CudaOpCase fused{.opType = "FusedConv",
                       .attributes = {{"activation", stringAttr(q.activation)}},
                       .domain = ir::kKilnDomain};
      fused.inputs = {activations({8, q.in, 1, 1}, seed),
                      constantWeights({q.out, q.in, 1, 1}, seed + 1),
                      constantWeights({q.out}, seed + 2)};
      seed += 3;
      fused.expectTactic = "cudnn+epilogue";
      expectConv(inType(fused, t), t.tolerance);
    }
  }
}

// NHWC from each source; runtime weights are reordered for cuDNN (two-byte elements) every run.
TEST(CudaNhwcConv, ReducedTypesFromEachSource) {
  unsigned seed = 1900;
  for (const ReducedType& t : kReducedTypes) {
    for (const NhwcShape& s : nhwcShapes()) {
      for (const char* source : {"cudnn", "native"}) {
        for (bool constantWeightsOnly : {true, false}) {
          SCOPED_TRACE(std::string(t.name) + " " + s.name + " " + source +
                       (constantWeightsOnly ? "" : " runtime weights"));
          CudaOpCase c = nhwcCase(s, "Relu", !constantWeightsOnly, constantWeightsOnly, seed += 4);
          c.route = std::string("-cuda.conv.depthwise=source -cuda.conv.source=") + source;
          c = inType(c, t);
          c.expectTactic = std::string(source) == "cudnn" && s.symmetric ? "cudnn" : "kiln.conv";
          expectConv(c, t.tolerance, false);
        }
      }
    }
  }
}

// cuda.precision=tf32: the step records tf32 and cuDNN may take TF32 tensor-core engines (10-bit
// mantissas for the products: a looser tolerance); without it the step stays fp32.
TEST(CudaConv, Tf32AllowsTensorCores) {
  unsigned seed = 2100;
  for (const ConvShape& s : convShapes()) {
    if (!s.symmetric) continue;
    SCOPED_TRACE(s.name);
    CudaOpCase c = convCase(s, seed += 3);
    c.route = "-cuda.precision=tf32";
    c.expectTactic = "cudnn";
    expectConv(c, 1e-2);
  }
  CudaOpCase c = convCase(convShapes()[1], 2200);
  for (const char* precision : {"fp32", "tf32"}) {
    BuilderConfig config;
    ASSERT_TRUE(
        config.setBuildRoute(std::string("-cuda.layout=nchw -cuda.precision=") + precision).isOk());
    auto build = buildCuda(makeSingleOpGraph(c.opType, c.inputs, c.attributes), config);
    ASSERT_TRUE(build.isOk()) << build.status().toString();
    ASSERT_EQ(build->plan.steps().size(), 1u);
    EXPECT_EQ(build->plan.steps()[0]->precision, precision);
  }
}

// Each cuda.conv.* knob can be set for one node; the others keep the default.
TEST(CudaConv, KnobsApplyPerNode) {
  CudaOpCase c = convCase(convShapes()[1], 950);
  c.route = "-cuda.conv.source@node=native";
  c.expectTactic = "kiln.conv";
  expectConv(c);
  c.route = "-cuda.conv.source@other*=native";
  c.expectTactic = "cudnn";
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute(c.route).isOk());
  // A selector that matches no node is the route's error, not a silent default.
  auto build =
      buildCuda(makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, 1, c.domain), config);
  EXPECT_FALSE(build.isOk());
}

}  // namespace
}  // namespace kiln::testing
