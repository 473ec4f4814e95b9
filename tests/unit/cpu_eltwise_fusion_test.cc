// kiln.FusedElementwise: its schema's checks, its reference kernel against the unfused ops, its
// CPU kernel against the reference over programs, shapes, broadcast patterns and thread counts;
// and the threaded elementwise, softmax and layernorm kernels against the reference on 1 to 3
// threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/fused_elementwise.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::Attribute;
using ir::DType;
using ir::Shape;
using ir::Tensor;

using Attributes = std::map<std::string, Attribute>;
using Program = std::vector<std::string>;

Tensor randomTensor(Shape shape, unsigned seed, float low = -3, float high = 3) {
  return uniformTensor(std::move(shape), seed, low, high);
}

OpInput runtime(Tensor t) { return {std::move(t), false}; }
OpInput constant(Tensor t) { return {std::move(t), true}; }

Attributes programAttribute(const Program& program) { return {{"program", Attribute{program}}}; }

ir::Graph fusedGraph(const Program& program, const std::vector<OpInput>& inputs) {
  return makeSingleOpGraph("FusedElementwise", inputs, programAttribute(program), 1, 1,
                           ir::kKilnDomain);
}

std::vector<Tensor> runtimeInputs(const std::vector<OpInput>& inputs) {
  std::vector<Tensor> runtime;
  for (const OpInput& input : inputs) {
    if (!input.constant) runtime.push_back(input.tensor);
  }
  return runtime;
}

struct PlanRun {
  std::vector<std::string> tactics;  // one per step
  std::vector<Tensor> outputs;
};

PlanRun buildAndRun(const std::string& route, ir::Graph graph, const std::vector<Tensor>& inputs) {
  BuilderConfig config;
  Status routed = config.setBuildRoute(route);
  EXPECT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCpu(std::move(graph), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return {};
  PlanRun result;
  for (const auto& step : build->plan.steps()) result.tactics.push_back(step->tactic);
  auto outputs = build->plan.run(inputs);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().toString();
  if (outputs.isOk()) result.outputs = std::move(*outputs);
  return result;
}

// Within 1e-5 relative of the reference (absolute below 1), NaN where it is NaN, equal infinities.
void expectClose(const Tensor& actual, const Tensor& expected, double tolerance = 1e-5) {
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.elementCount(); ++i) {
    const double e = expected.elementAsDouble(i), a = actual.elementAsDouble(i);
    if (std::isnan(e)) {
      ASSERT_TRUE(std::isnan(a)) << "element " << i << ": " << a;
    } else if (std::isinf(e)) {
      ASSERT_EQ(a, e) << "element " << i;
    } else {
      ASSERT_NEAR(a, e, tolerance * std::max(1.0, std::fabs(e))) << "element " << i;
    }
  }
}

void expectBitwiseEqual(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(std::memcmp(a.rawData(), b.rawData(), static_cast<size_t>(a.byteSize())), 0);
}

// Builds `graph()` with `knob`=reference and with `knob`=fast on 1, 2 and 3 threads; expects the
// fast runs to use `fastTactic`, match the reference, and agree bit for bit with each other (each
// element's arithmetic does not depend on how the work is split).
void expectFastMatchesOnThreads(const std::string& knob, const std::string& fastTactic,
                                const std::function<ir::Graph()>& graph,
                                const std::vector<Tensor>& inputs) {
  const PlanRun reference = buildAndRun("-" + knob + "=reference", graph(), inputs);
  ASSERT_EQ(reference.outputs.size(), 1u);
  std::vector<PlanRun> fast;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    fast.push_back(
        buildAndRun("-" + knob + "=fast -cpu.threads=" + std::to_string(threads), graph(), inputs));
    ASSERT_EQ(fast.back().outputs.size(), 1u);
    EXPECT_NE(std::find(fast.back().tactics.begin(), fast.back().tactics.end(), fastTactic),
              fast.back().tactics.end());
    expectClose(fast.back().outputs[0], reference.outputs[0]);
    expectBitwiseEqual(fast.back().outputs[0], fast[0].outputs[0]);
  }
}

void expectFusedMatchesReference(const Program& program, const std::vector<OpInput>& inputs) {
  SCOPED_TRACE(fmt::format("program [{}]", fmt::join(program, "; ")));
  expectFastMatchesOnThreads(
      "cpu.eltwise.impl", "fast.fused_eltwise", [&] { return fusedGraph(program, inputs); },
      runtimeInputs(inputs));
}

// --- schema -------------------------------------------------------------------------------------

Status inferFused(const Program& program, const std::vector<OpInput>& inputs) {
  ir::Graph graph = fusedGraph(program, inputs);
  return ir::inferShapes(graph, nullptr);
}

void expectInferenceError(const Program& program, const std::vector<OpInput>& inputs,
                          const std::string& fragment) {
  const Status status = inferFused(program, inputs);
  ASSERT_FALSE(status.isOk()) << "program [" << fmt::format("{}", fmt::join(program, "; "))
                              << "] was accepted";
  EXPECT_NE(status.message().find(fragment), std::string::npos) << status.message();
}

TEST(FusedElementwiseSchema, OutputIsTheBroadcastOfTheInputs) {
  ir::Graph graph =
      fusedGraph({"Mul x0 x1", "Add t0 x2"}, {runtime(Tensor(DType::kFloat32, Shape{2, 3, 4})),
                                              runtime(Tensor(DType::kFloat32, Shape{4})),
                                              runtime(Tensor(DType::kFloat32, Shape{3, 1}))});
  ASSERT_TRUE(ir::inferShapes(graph, nullptr).isOk());
  EXPECT_EQ(graph.outputs[0]->shape, (Shape{2, 3, 4}));
  EXPECT_EQ(graph.outputs[0]->dtype, DType::kFloat32);
}

TEST(FusedElementwiseSchema, RefusesMalformedPrograms) {
  const std::vector<OpInput> two = {runtime(Tensor(DType::kFloat32, Shape{4})),
                                    runtime(Tensor(DType::kFloat32, Shape{4}))};
  expectInferenceError({"Frobnicate x0", "Add t0 x1"}, two, "unknown opcode 'Frobnicate'");
  expectInferenceError({"Relu x0", "Add t1 x1"}, two, "operand t1 is out of range: only t0..t0");
  expectInferenceError({"Add t0 x1"}, two, "no instruction precedes it");
  expectInferenceError({"Add x0 x2"}, two, "operand x2 is out of range: the node has 2 input(s)");
  expectInferenceError({"Add x0"}, two, "Add takes 2 operand(s) and 0 parameter(s)");
  expectInferenceError({"Clip x0 0", "Add t0 x1"}, two, "Clip takes 1 operand(s) and 2");
  expectInferenceError({"LeakyRelu x0 slope", "Add t0 x1"}, two, "parameter 'slope' is not");
  expectInferenceError({"Add x0 y1"}, two, "operand 'y1' is not x<input> or t<instruction>");
  expectInferenceError({}, two, "the program has no instructions");
  expectInferenceError({"Relu x0"}, two, "no instruction of the program reads input 1");
  expectInferenceError(
      {"Add x0 x1"},
      {runtime(Tensor(DType::kFloat32, Shape{4})), runtime(Tensor(DType::kFloat32, Shape{3}))},
      "does not broadcast");
  expectInferenceError(
      {"Add x0 x1"},
      {runtime(Tensor(DType::kFloat32, Shape{4})), runtime(Tensor(DType::kFloat64, Shape{4}))},
      "input 1 has dtype float64");
}

TEST(FusedElementwiseSchema, InstructionsPrintAsTheyParse) {
  auto program = ir::parseEltwiseProgram({"Clip t0 -inf 6", "LeakyRelu x1 0.1", "Max t1 x0"}, 2);
  ASSERT_FALSE(program.isOk());  // t0 precedes nothing
  program = ir::parseEltwiseProgram({"Clip x0 -inf 6", "LeakyRelu t0 0.1", "Max t1 x1"}, 2);
  ASSERT_TRUE(program.isOk()) << program.status().toString();
  EXPECT_EQ(program->toStrings(), (Program{"Clip x0 -inf 6", "LeakyRelu t0 0.1", "Max t1 x1"}));
  EXPECT_EQ(program->instructions[1].params[0], 0.1f);
}

// --- reference kernel ---------------------------------------------------------------------------

// The fused reference gives exactly what the ONNX ops give one after another on the reference.
TEST(FusedElementwiseReference, EqualsTheUnfusedOpsBitForBit) {
  const Tensor x = randomTensor(Shape{2, 3, 5}, 11);
  const Tensor bias = randomTensor(Shape{3, 1}, 12);
  auto step = [](const std::string& op, std::vector<OpInput> inputs, Attributes attributes = {}) {
    auto result = runSingleOp(op, inputs, attributes);
    EXPECT_TRUE(result.isOk()) << result.status().toString();
    return result.isOk() ? (*result)[0] : Tensor();
  };
  // y = gelu_tanh(leaky(x + bias) * sigmoid(x)) clipped to [-0.5, 2]
  const Tensor sum = step("Add", {runtime(x), runtime(bias)});
  const Tensor leaky = step("LeakyRelu", {runtime(sum)}, {{"alpha", floatAttr(0.3f)}});
  const Tensor gate = step("Sigmoid", {runtime(x)});
  const Tensor product = step("Mul", {runtime(leaky), runtime(gate)});
  const Tensor gelu = step("Gelu", {runtime(product)}, {{"approximate", stringAttr("tanh")}});
  const Tensor expected = step("Clip", {runtime(gelu), constant(Tensor::scalar<float>(-0.5f)),
                                        constant(Tensor::scalar<float>(2.0f))});
  auto fused = runSingleOp("FusedElementwise", {runtime(x), runtime(bias)},
                           programAttribute({"Add x0 x1", "LeakyRelu t0 0.3", "Sigmoid x0",
                                             "Mul t1 t2", "GeluTanh t3", "Clip t4 -0.5 2"}),
                           1, 1, ir::kKilnDomain);
  ASSERT_TRUE(fused.isOk()) << fused.status().toString();
  expectBitwiseEqual((*fused)[0], expected);
}

// --- CPU kernel ---------------------------------------------------------------------------------

TEST(CpuFusedEltwise, EveryOpcodeMatchesReference) {
  // Sizes around the 512-element block: a partial block, several, and one left over.
  for (const Shape& shape : {Shape{37}, Shape{3, 341}, Shape{2, 3, 5, 7}}) {
    SCOPED_TRACE(shape.toString());
    const Tensor x = randomTensor(shape, 21);
    const Tensor z = randomTensor(shape, 22);
    const std::vector<OpInput> two = {runtime(x), runtime(z)};
    expectFusedMatchesReference({"Relu x0", "Sigmoid t0", "Tanh x1", "Add t1 t2"}, two);
    expectFusedMatchesReference({"Exp x0", "Abs x1", "Log t1", "Sqrt t1", "Mul t0 t2", "Sub t4 t3"},
                                two);
    expectFusedMatchesReference({"Neg x0", "Erf t0", "Reciprocal x1", "Div t1 t2"}, two);
    expectFusedMatchesReference(
        {"HardSigmoid x0 0.2 0.5", "HardSwish x1", "LeakyRelu t1 0.05", "Mul t0 t2"}, two);
    expectFusedMatchesReference(
        {"Clip x0 -1 1.5", "Gelu x1", "GeluTanh x0", "Max t0 t1", "Min t3 t2"}, two);
    // Pow by constants: the square and square root the kernel specialises, and a general one.
    for (float exponent : {2.0f, 0.5f, 1.7f}) {
      expectFusedMatchesReference(
          {"Abs x0", "Pow t0 x1", "Add t1 x2"},
          {runtime(x), constant(Tensor::scalar<float>(exponent)), runtime(z)});
    }
  }
}

TEST(CpuFusedEltwise, NaNAndInfinityFollowTheReference) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::fromVector<float>(Shape{8}, {nan, 1, -inf, inf, 0, -0.0f, 3, -2});
  const Tensor z = Tensor::fromVector<float>(Shape{8}, {1, nan, 2, -inf, nan, 0, -1, inf});
  expectFusedMatchesReference({"Max x0 x1", "Min x0 x1", "Add t0 t1"}, {runtime(x), runtime(z)});
  expectFusedMatchesReference({"Clip x0 -1 2", "Relu x1", "Sub t0 t1"}, {runtime(x), runtime(z)});
  expectFusedMatchesReference({"Sigmoid x0", "Tanh x1", "Mul t0 t1"}, {runtime(x), runtime(z)});
}

TEST(CpuFusedEltwise, BroadcastPatternsMatchReference) {
  const Shape full{2, 37, 7, 9};
  const Tensor x = randomTensor(full, 31);
  struct Case {
    const char* what;
    Shape shape;
    bool constant;
  };
  const Case cases[] = {
      {"per-channel [37,1,1]", Shape{37, 1, 1}, true},
      {"per-channel runtime [1,37,1,1]", Shape{1, 37, 1, 1}, false},
      {"last axis [9]", Shape{9}, true},
      {"last two axes [7,9]", Shape{7, 9}, false},
      {"batch only [2,1,1,1]", Shape{2, 1, 1, 1}, false},
      {"middle axes [37,7,1]", Shape{37, 7, 1}, true},
      {"runtime scalar [1]", Shape{1}, false},
      {"constant scalar []", Shape{}, true},
      {"same shape", full, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Tensor operand = randomTensor(c.shape, 32);
    const OpInput second = c.constant ? constant(operand) : runtime(operand);
    expectFusedMatchesReference({"Mul x0 x1", "Sigmoid x1", "Add t0 t1"}, {runtime(x), second});
    // The broadcast operand first, so the full-shape one is not input 0.
    expectFusedMatchesReference({"Sub x0 x1", "Relu t0"}, {second, runtime(x)});
  }
  // Three operands broadcasting along different axes.
  expectFusedMatchesReference(
      {"Mul x0 x1", "Add t0 x2", "Max t1 x3"},
      {runtime(x), constant(randomTensor(Shape{37, 1, 1}, 33)), runtime(randomTensor(Shape{9}, 34)),
       constant(Tensor::scalar<float>(-0.25f))});
}

TEST(CpuFusedEltwise, LargeTensorsSplitOverThreadsMatchReference) {
  // Above the parallel grain, so 2 and 3 threads split the blocks.
  const Tensor x = randomTensor(Shape{5, 129, 331}, 41);
  const Tensor bias = randomTensor(Shape{331}, 42);
  expectFusedMatchesReference({"Add x0 x1", "Sigmoid t0", "Mul t0 t1"},
                              {runtime(x), runtime(bias)});
  expectFusedMatchesReference({"Add x0 x1", "Relu t0", "Mul t1 x1"}, {runtime(x), constant(bias)});
  expectFusedMatchesReference({"Mul x0 x1", "Gelu t0"},
                              {runtime(x), constant(randomTensor(Shape{129, 1}, 43))});
}

// Many values alive at once need more registers than a chain does.
TEST(CpuFusedEltwise, WideProgramsReuseRegistersCorrectly) {
  const Tensor x = randomTensor(Shape{5, 211}, 51);
  const Tensor z = randomTensor(Shape{211}, 52);
  expectFusedMatchesReference({"Relu x0", "Neg x0", "Abs x1", "Sigmoid x0", "Add t0 t1",
                               "Mul t2 t3", "Sub t4 t5", "Mul t6 t6", "Tanh t7", "Add t8 t0"},
                              {runtime(x), runtime(z)});
}

// --- the pass through the whole build ------------------------------------------------------------

TEST(CpuFusedEltwise, DefaultRouteFusesAChainAndKeepsItsOutputs) {
  auto graph = [] {
    ir::Graph g = makeSingleOpGraph("Sigmoid", {runtime(Tensor(DType::kFloat32, Shape{4, 300}))});
    // x -> Sigmoid (node) -> s; y = x * s; z = y + bias
    ir::Value* x = g.inputs[0];
    ir::Value* s = g.outputs[0];
    ir::Node* mul = g.addNode("Mul");
    mul->name = "mul";
    mul->opsetVersion = 18;
    ir::Value* y = g.addValue("y");
    y->producer = mul;
    mul->inputs = {x, s};
    mul->outputs = {y};
    ir::Value* bias = g.addValue("bias");
    bias->constant = randomTensor(Shape{300}, 61);
    bias->dtype = DType::kFloat32;
    bias->shape = Shape{300};
    bias->hasType = true;
    bias->isInitializer = true;
    ir::Node* add = g.addNode("Add");
    add->name = "add";
    add->opsetVersion = 18;
    ir::Value* z = g.addValue("z");
    z->producer = add;
    add->inputs = {y, bias};
    add->outputs = {z};
    g.outputs = {z};
    return g;
  };
  const std::vector<Tensor> inputs = {randomTensor(Shape{4, 300}, 62)};
  const PlanRun fused = buildAndRun("", graph(), inputs);
  EXPECT_EQ(fused.tactics, std::vector<std::string>{"fast.fused_eltwise"});
  const PlanRun unfused = buildAndRun("-fusion.eltwise_chain=off", graph(), inputs);
  EXPECT_EQ(unfused.tactics.size(), 3u);
  ir::Graph original = graph();
  ASSERT_TRUE(ir::inferShapes(original, nullptr).isOk());
  auto reference = reference::ReferenceExecutor::create(original)->run(inputs);
  ASSERT_TRUE(reference.isOk()) << reference.status().toString();
  ASSERT_EQ(fused.outputs.size(), 1u);
  expectClose(fused.outputs[0], (*reference)[0]);
  expectClose(unfused.outputs[0], (*reference)[0]);
}

// --- the threaded single-op kernels -------------------------------------------------------------

void expectSingleOpOnThreads(const std::string& knob, const std::string& tactic,
                             const std::string& opType, const std::vector<OpInput>& inputs,
                             const Attributes& attributes = {}) {
  SCOPED_TRACE(opType);
  expectFastMatchesOnThreads(
      knob, tactic, [&] { return makeSingleOpGraph(opType, inputs, attributes); },
      runtimeInputs(inputs));
}

TEST(CpuThreadedKernels, UnaryBinaryAndRowMeanMatchReferenceOnThreads) {
  // Above the parallel grains (128K elements for cheap ops), so 2 and 3 threads split the work.
  const Tensor x = randomTensor(Shape{5, 130, 617}, 71);
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Erf", "HardSwish"}) {
    expectSingleOpOnThreads("cpu.eltwise.impl", "fast.unary", op, {runtime(x)});
  }
  // A row broadcast, a column broadcast, a scalar and same-shape operands.
  for (const Shape& shape : {Shape{617}, Shape{130, 1}, Shape{}, Shape{5, 130, 617}}) {
    SCOPED_TRACE(shape.toString());
    const Tensor z = randomTensor(shape, 72);
    expectSingleOpOnThreads("cpu.eltwise.impl", "fast.binary_broadcast", "Add",
                            {runtime(x), runtime(z)});
    expectSingleOpOnThreads("cpu.eltwise.impl", "fast.binary_broadcast", "Div",
                            {runtime(z), runtime(x)});
  }
  expectSingleOpOnThreads("cpu.eltwise.impl", "fast.binary_broadcast", "Pow",
                          {runtime(randomTensor(Shape{5, 130, 617}, 73, 0.1f, 3)),
                           runtime(randomTensor(Shape{617}, 74))});
  expectSingleOpOnThreads("cpu.eltwise.impl", "fast.reduce_mean_rows", "ReduceMean",
                          {runtime(x), constant(Tensor::fromVector<int64_t>(Shape{1}, {-1}))});
  expectSingleOpOnThreads("cpu.eltwise.impl", "fast.reduce_mean_rows", "ReduceMean",
                          {runtime(randomTensor(Shape{100003, 3}, 75)),
                           constant(Tensor::fromVector<int64_t>(Shape{1}, {-1}))});
}

TEST(CpuThreadedKernels, SoftmaxAndLayerNormRowsMatchReferenceOnThreads) {
  for (const Shape& shape : {Shape{8, 128, 129}, Shape{30001, 5}}) {
    SCOPED_TRACE(shape.toString());
    const Tensor x = randomTensor(shape, 81);
    expectSingleOpOnThreads("cpu.softmax.impl", "fast.softmax_rows", "Softmax", {runtime(x)});
    expectSingleOpOnThreads("cpu.softmax.impl", "fast.softmax_rows", "LogSoftmax", {runtime(x)});
    const int64_t width = shape[shape.rank() - 1];
    expectSingleOpOnThreads("cpu.layernorm.impl", "fast.layernorm_rows", "LayerNormalization",
                            {runtime(x), constant(randomTensor(Shape{width}, 82)),
                             constant(randomTensor(Shape{width}, 83))},
                            {{"axis", intAttr(-1)}});
  }
}

}  // namespace
}  // namespace kiln::testing
