// Kernels generated at build time (src/kiln/backends/cuda/codegen/): what fused_codegen.cc writes
// for kiln.FusedElementwise under each broadcast pattern (read anywhere, and compiled by NVRTC
// for sm_90 wherever NVRTC loads, which needs no GPU), and, on a GPU, the generated kernels of
// each launch knob against the reference executor, equal kernels compiled once a plan, and
// plans reusing what an earlier plan compiled.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../knobs/graph_sketch.h"
#include "cuda_test_util.h"
#include "kiln/backends/cuda/codegen/fused_codegen.h"
#include "kiln/backends/cuda/codegen/nvrtc.h"
#include "kiln/backends/cuda/kernels/eltwise.h"
#include "kiln/ir/op_schema.h"
#include "kiln/reference/executor.h"

namespace kiln::testing {
namespace {

using ir::Shape;
using ir::Tensor;

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }

Tensor floats(Shape shape, unsigned seed) { return uniformTensor(std::move(shape), seed, -3, 3); }

CudaOpCase fusedCase(std::vector<std::string> program, std::vector<OpInput> inputs,
                     const std::string& route = "") {
  CudaOpCase c = fusedElementwiseCase(std::move(program), std::move(inputs), 1e-5, 1e-5);
  c.route = "-cuda.eltwise.codegen=nvrtc " + route;
  c.expectTactic = "kiln.fused_eltwise.nvrtc";
  return c;
}

// The generated definitions and launch details of the case's one step.
struct Generated {
  std::string code;
  std::string detail;
};

Generated generatedFor(const CudaOpCase& c) {
  BuilderConfig config;
  EXPECT_TRUE(config.setBuildRoute("-cuda.host_fallback=off " + c.route).isOk());
  auto build = buildCuda(
      makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, c.outputCount, c.domain),
      config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return {};
  // The fused node's step (a reduced-precision route adds Casts around it).
  for (const auto& step : build->plan.steps()) {
    if (step->node->opType != c.opType) continue;
    EXPECT_EQ(step->tactic, "kiln.fused_eltwise.nvrtc");
    return {step->generatedCode(), step->detail()};
  }
  ADD_FAILURE() << "no " << c.opType << " step";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

#define KILN_REQUIRE_NVRTC()                              \
  do {                                                    \
    std::string why;                                      \
    if (!cuda::nvrtcAvailable(&why)) GTEST_SKIP() << why; \
  } while (false)

// An NHWC squeeze-excite scale: [8, 14, 14, 96] times [8, 1, 1, 96], merged to [8, 196, 96].
CudaOpCase channelScale(const std::string& route = "") {
  return fusedCase({"Sigmoid x1", "Mul x0 t0"},
                   {runtime(floats({8, 14, 14, 96}, 10)), runtime(floats({8, 1, 1, 96}, 11))},
                   route);
}

TEST(CudaCodegen, EachOperandIsReadTheWidestWayItsStridesAllow) {
  KILN_REQUIRE_NVRTC();
  // Both operands walk the innermost axis: aligned packs of four floats; the scale's offset
  // skips the middle axis (its stride there is 0).
  Generated scale = generatedFor(channelScale());
  EXPECT_TRUE(contains(scale.code, "dims [8, 196, 96], 32-bit index")) << scale.code;
  EXPECT_TRUE(contains(scale.code, "const kiln_pack<float, 4> q0")) << scale.code;
  EXPECT_TRUE(contains(scale.code, "const kiln_pack<float, 4> q1")) << scale.code;
  EXPECT_TRUE(contains(scale.code, "const idx_t o0 = i;")) << scale.code;
  EXPECT_TRUE(contains(scale.code, "const idx_t o1 = c0 * 96u + c2;")) << scale.code;
  EXPECT_TRUE(contains(scale.code, "kiln_sigmoid(q1.v[e])")) << scale.code;
  EXPECT_TRUE(contains(scale.code, "kiln_mul(q0.v[e], t0)")) << scale.code;
  EXPECT_EQ(scale.detail.substr(scale.detail.find(',')),
            ", vector 4 (16 bytes), block 256, unroll 1");

  // A column ([64, 1] against [64, 128]) is one value a pack; a scalar one value a thread.
  Generated column = generatedFor(fusedCase(
      {"Add x0 x1", "Mul t0 x2"}, {runtime(floats({64, 128}, 12)), runtime(floats({64, 1}, 13)),
                                   constant(Tensor::scalar<float>(0.5f))}));
  EXPECT_TRUE(contains(column.code, "const float b1 = in1[o1];")) << column.code;
  EXPECT_TRUE(contains(column.code, "const float s2 = in2[0];")) << column.code;

  // A flat walk whose count is not a whole number of packs ends with a tail; float16 packs hold
  // eight elements and convert through float.
  CudaOpCase half =
      fusedCase({"HardSwish x0"}, {runtime(floats({1027}, 14))}, "-cuda.precision=fp16");
  half.expectTactic = "";
  Generated tail = generatedFor(half);
  EXPECT_TRUE(contains(tail.code, "kiln_pack<unsigned short, 8>")) << tail.code;
  EXPECT_TRUE(contains(tail.code, "The last 3 elements")) << tail.code;
  EXPECT_TRUE(contains(tail.code, "kiln_float_to_half(t0)")) << tail.code;
  EXPECT_TRUE(contains(tail.code, "kiln_half_to_float(q0.v[e])")) << tail.code;

  // A row that is not a whole number of packs leaves only the scalar kernel.
  Generated odd = generatedFor(
      fusedCase({"Sub x0 x1"}, {runtime(floats({5, 3, 7}, 15)), runtime(floats({5, 1, 7}, 16))}));
  EXPECT_FALSE(contains(odd.code, "_v(")) << odd.code;
  EXPECT_TRUE(contains(odd.code, "_s(")) << odd.code;
  EXPECT_TRUE(contains(odd.detail, "vector 1")) << odd.detail;
}

TEST(CudaCodegen, ParametersAreWrittenAsExactBits) {
  KILN_REQUIRE_NVRTC();
  Generated clip = generatedFor(
      fusedCase({"Clip x0 -0.1 0.7", "LeakyRelu t0 0.01"}, {runtime(floats({256}, 20))}));
  // -0.1f and 0.7f and 0.01f as their float32 bit patterns.
  EXPECT_TRUE(contains(clip.code, "__uint_as_float(0xbdcccccdu), __uint_as_float(0x3f333333u)"))
      << clip.code;
  EXPECT_TRUE(contains(clip.code, "__uint_as_float(0x3c23d70au)")) << clip.code;
}

TEST(CudaCodegen, GeneratedSourcesCompileForHopper) {
  KILN_REQUIRE_NVRTC();
  // Every pattern above and every launch knob, in one program as a plan compiles them.
  std::vector<CudaOpCase> cases = {channelScale(), channelScale("-cuda.eltwise.codegen.unroll=4"),
                                   channelScale("-cuda.eltwise.codegen.block=1024"),
                                   channelScale("-cuda.eltwise.codegen.vector_bytes=8"),
                                   channelScale("-cuda.precision=bf16")};
  cases.back().expectTactic = "";
  cases.push_back(fusedCase({"Add x0 x1", "Gelu t0", "GeluTanh t1", "Max t2 x1", "Pow t3 x0"},
                            {runtime(floats({64, 128}, 30)), runtime(floats({64, 1}, 31))}));
  std::string program = cuda::codegenPreamble();
  for (const CudaOpCase& c : cases) {
    SCOPED_TRACE(c.route);
    Generated generated = generatedFor(c);
    ASSERT_FALSE(generated.code.empty());
    program += generated.code;
  }
  auto cubin = cuda::compileToCubin(program, "codegen_test.cu", 9, 0);
  ASSERT_TRUE(cubin.isOk()) << cubin.status().toString() << "\n" << program;
  EXPECT_GT(cubin->size(), 1000u);
  // Compiling it again finds the machine code kept.
  const int compilations = cuda::nvrtcCompilations();
  ASSERT_TRUE(cuda::compileToCubin(program, "codegen_test.cu", 9, 0).isOk());
  EXPECT_EQ(cuda::nvrtcCompilations(), compilations);
}

// cuda.eltwise.codegen.fast_math: the approximate functions replace the exact ones in the
// generated source (and nowhere else), the program still compiles for sm_90, and on a GPU the
// results stay within the approximations' error.
TEST(CudaCodegen, FastMathUsesTheApproximationsAndStaysClose) {
  KILN_REQUIRE_NVRTC();
  // Every instruction feeds the output: x1 / exp(tanh(sigmoid(x0))) through its reciprocal and
  // GeluTanh, plus log of the exponential.
  const std::vector<std::string> program = {"Sigmoid x0",    "Tanh t0",     "Exp t1", "Div t2 x1",
                                            "Reciprocal t3", "GeluTanh t4", "Log t2", "Add t5 t6"};
  const std::vector<OpInput> inputs = {runtime(floats({64, 128}, 32)),
                                       runtime(floats({64, 128}, 33))};
  const Generated exact = generatedFor(fusedCase(program, inputs));
  CudaOpCase fast = fusedCase(program, inputs, "-cuda.eltwise.codegen.fast_math=on");
  const Generated approximate = generatedFor(fast);
  for (const char* function : {"kiln_sigmoid(", "kiln_tanh(", "kiln_exp(", "kiln_div(",
                               "kiln_reciprocal(", "kiln_gelu_tanh(", "kiln_log("}) {
    EXPECT_TRUE(contains(exact.code, function)) << function;
    EXPECT_FALSE(contains(approximate.code, function)) << function;
    EXPECT_TRUE(contains(approximate.code, std::string("kiln_fast_") + (function + 5))) << function;
  }
  EXPECT_TRUE(contains(approximate.detail, ", fast math")) << approximate.detail;
  EXPECT_FALSE(contains(exact.detail, "fast math")) << exact.detail;
  auto cubin =
      cuda::compileToCubin(cuda::codegenPreamble() + approximate.code, "fast_math.cu", 9, 0);
  ASSERT_TRUE(cubin.isOk()) << cubin.status().toString();
  fast.rtol = 2e-3;
  fast.atol = 2e-3;
  expectCudaMatchesReference(fast);
}

TEST(CudaCodegen, CompileErrorsNameTheProgramAndCarryTheLog) {
  KILN_REQUIRE_NVRTC();
  auto cubin =
      cuda::compileToCubin("__global__ void broken() { undeclared(); }", "broken.cu", 9, 0);
  ASSERT_FALSE(cubin.isOk());
  EXPECT_EQ(cubin.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(contains(cubin.status().message(), "broken.cu")) << cubin.status().message();
  EXPECT_TRUE(contains(cubin.status().message(), "undeclared")) << cubin.status().message();
}

// --- On a GPU ----------------------------------------------------------------------------------

TEST(CudaCodegen, EveryLaunchKnobMatchesTheReference) {
  KILN_REQUIRE_NVRTC();
  for (const char* route :
       {"", "-cuda.eltwise.codegen.block=128", "-cuda.eltwise.codegen.block=512",
        "-cuda.eltwise.codegen.block=1024", "-cuda.eltwise.codegen.vector_bytes=8",
        "-cuda.eltwise.codegen.vector_bytes=4", "-cuda.eltwise.codegen.unroll=2",
        "-cuda.eltwise.codegen.unroll=4"}) {
    SCOPED_TRACE(route);
    expectCudaMatchesReference(channelScale(route));
    // A flat walk with a tail, and a 64-bit index walk would need 2^30 elements: the flat one
    // here covers the tail and scalars.
    expectCudaMatchesReference(
        fusedCase({"Mul x0 x1", "Add t0 x2", "Tanh t1"},
                  {runtime(floats({4099}, 40)), constant(Tensor::scalar<float>(1.5f)),
                   runtime(floats({4099}, 41))},
                  route));
    // Column and row broadcasts at once, over a rank-3 walk.
    expectCudaMatchesReference(
        fusedCase({"Sub x0 x1", "Div t0 x2", "Relu t1"},
                  {runtime(floats({6, 10, 64}, 42)), runtime(floats({6, 10, 1}, 43)),
                   constant(uniformTensor({64}, 44, 1, 2))},
                  route));
  }
}

TEST(CudaCodegen, LoneBinaryOpsOverAStridedBroadcastAreGenerated) {
  KILN_REQUIRE_NVRTC();
  auto binary = [](const char* op, std::vector<OpInput> inputs, const char* tactic,
                   const std::string& route = "") {
    CudaOpCase c;
    c.opType = op;
    c.inputs = std::move(inputs);
    c.route = route;
    c.expectTactic = tactic;
    c.rtol = c.atol = route.empty() ? 1e-5 : 1e-2;
    return c;
  };
  // A squeeze-excite scale over NHWC and a per-row bias: strided walks, generated.
  expectCudaMatchesReference(
      binary("Mul", {runtime(floats({8, 14, 14, 96}, 60)), runtime(floats({8, 1, 1, 96}, 61))},
             "kiln.eltwise.nvrtc"));
  expectCudaMatchesReference(
      binary("Mul", {runtime(floats({8, 14, 14, 96}, 62)), runtime(floats({8, 1, 1, 96}, 63))},
             "kiln.eltwise.nvrtc", "-cuda.precision=fp16"));
  expectCudaMatchesReference(binary(
      "Sub", {runtime(floats({6, 40}, 64)), constant(floats({6, 1}, 65))}, "kiln.eltwise.nvrtc"));
  // Flat walks (same shapes, a scalar) keep kiln.binary's vector kernel; so do integers and the
  // ops a program has no opcode for.
  expectCudaMatchesReference(
      binary("Add", {runtime(floats({4, 33}, 66)), runtime(floats({4, 33}, 67))}, "kiln.binary"));
  expectCudaMatchesReference(binary(
      "Add", {runtime(floats({4, 33}, 68)), constant(Tensor::scalar<float>(2.0f))}, "kiln.binary"));
  expectCudaMatchesReference(binary("Add",
                                    {runtime(floats({6, 40}, 69).castTo(ir::DType::kInt32)),
                                     runtime(floats({6, 1}, 70).castTo(ir::DType::kInt32))},
                                    "kiln.binary"));
  expectCudaMatchesReference(
      binary("Equal", {runtime(floats({6, 40}, 71)), runtime(floats({6, 1}, 72))}, "kiln.binary"));
}

TEST(CudaCodegen, MisalignedOperandsRunTheScalarKernel) {
  KILN_REQUIRE_NVRTC();
  // A Slice of one element off a float buffer leaves the fused node's input 4 bytes past a pack
  // boundary when the slice is read in place (or a copy); either way the result must hold.
  auto make = [] {
    GraphSketch g;
    auto x = g.input("x", {1, 1029});
    auto starts = g.constant("starts", Tensor::fromVector<int64_t>(Shape{1}, {1}));
    auto ends = g.constant("ends", Tensor::fromVector<int64_t>(Shape{1}, {1029}));
    auto axes = g.constant("axes", Tensor::fromVector<int64_t>(Shape{1}, {1}));
    auto sliced = g.node("Slice", {x, starts, ends, axes}, {}, "slice");
    auto f = g.node("FusedElementwise", {sliced, g.weight("w", {1028})},
                    {{"program", ir::Attribute{std::vector<std::string>{"Mul x0 x1", "Exp t0"}}}},
                    "fused", ir::kKilnDomain);
    g.output(f);
    return g.take();
  };
  ir::Graph reference = make();
  ASSERT_TRUE(ir::inferShapes(reference, nullptr).isOk());
  const Tensor input = floats({1, 1029}, 50);
  auto executor = reference::ReferenceExecutor::create(reference);
  ASSERT_TRUE(executor.isOk());
  auto expected = executor->run({input});
  ASSERT_TRUE(expected.isOk());
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("-cuda.host_fallback=off -cuda.eltwise.codegen=nvrtc").isOk());
  auto build = buildCuda(make(), config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  auto actual = build->plan.run({input});
  ASSERT_TRUE(actual.isOk()) << actual.status().toString();
  for (int64_t i = 0; i < (*expected)[0].elementCount(); ++i) {
    const double e = (*expected)[0].elementAsDouble(i), a = (*actual)[0].elementAsDouble(i);
    ASSERT_NEAR(a, e, 1e-5 + 1e-5 * std::fabs(e)) << "element " << i;
  }
}

TEST(CudaCodegen, EqualKernelsCompileOnceAndLaterPlansReuseThem) {
  KILN_REQUIRE_NVRTC();
  // Two fused nodes of one program and shape generate one definition; a second plan of the same
  // graph finds its program compiled.
  auto make = [] {
    GraphSketch g;
    auto x = g.input("x", {3, 515});
    const std::vector<std::string> program = {"Mul x0 x1", "Sigmoid t0", "Mul x0 t1"};
    auto a = g.node("FusedElementwise", {x, g.weight("w1", {515})},
                    {{"program", ir::Attribute{program}}}, "a", ir::kKilnDomain);
    auto b = g.node("FusedElementwise", {a, g.weight("w2", {515})},
                    {{"program", ir::Attribute{program}}}, "b", ir::kKilnDomain);
    g.output(b);
    return g.take();
  };
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("-cuda.host_fallback=off -cuda.eltwise.codegen=nvrtc").isOk());
  auto first = buildCuda(make(), config);
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  ASSERT_EQ(first->plan.steps().size(), 2u);
  EXPECT_EQ(first->plan.steps()[0]->generatedCode(), first->plan.steps()[1]->generatedCode());
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  ASSERT_TRUE(first->plan.initialize().isOk());
  EXPECT_EQ(first->plan.generatedKernels(), 1);
  auto second = buildCuda(make(), config);
  ASSERT_TRUE(second.isOk());
  const int compilations = cuda::nvrtcCompilations();
  ASSERT_TRUE(second->plan.initialize().isOk());
  EXPECT_EQ(cuda::nvrtcCompilations(), compilations);
  EXPECT_EQ(second->plan.codegenMilliseconds(), 0.0);
}

}  // namespace
}  // namespace kiln::testing
