// kiln.Attention: its schema's shapes and errors, its reference kernel against the unfused
// MatMul / Mul / Add / Softmax / MatMul chain, and its CPU kernel against the reference kernel
// over shapes (row counts that are not a multiple of the block, odd depths, batches), both K
// forms, masks of several broadcast shapes, NaN handling, GEMM sources and 1 to 3 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/attention.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::Attribute;
using ir::DType;
using ir::Shape;
using ir::Tensor;

using Attributes = std::map<std::string, Attribute>;

Tensor randomTensor(Shape shape, unsigned seed, float low = -1, float high = 1) {
  return uniformTensor(std::move(shape), seed, low, high);
}

OpInput runtime(Tensor t) { return {std::move(t), false}; }

Attributes attentionAttributes(float scale, bool transposeK, bool nanToZero = false) {
  Attributes attributes = {{"scale", Attribute{scale}}};
  if (transposeK) attributes["transpose_k"] = Attribute{int64_t{1}};
  if (nanToZero) attributes["nan_to_zero"] = Attribute{int64_t{1}};
  return attributes;
}

ir::Graph attentionGraph(const std::vector<OpInput>& inputs, const Attributes& attributes) {
  return makeSingleOpGraph("Attention", inputs, attributes, 1, 1, ir::kKilnDomain);
}

std::vector<Tensor> runtimeInputs(const std::vector<OpInput>& inputs) {
  std::vector<Tensor> runtime;
  for (const OpInput& input : inputs) {
    if (!input.constant && !input.tensor.empty()) runtime.push_back(input.tensor);
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

// Within `tolerance` of the reference (relative above 1, absolute below), NaN where it is NaN.
void expectClose(const Tensor& actual, const Tensor& expected, double tolerance) {
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.elementCount(); ++i) {
    const double e = expected.elementAsDouble(i), a = actual.elementAsDouble(i);
    if (std::isnan(e)) {
      ASSERT_TRUE(std::isnan(a)) << "element " << i << ": " << a;
    } else {
      ASSERT_NEAR(a, e, tolerance * std::max(1.0, std::fabs(e))) << "element " << i;
    }
  }
}

void expectBitwiseEqual(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(std::memcmp(a.rawData(), b.rawData(), static_cast<size_t>(a.byteSize())), 0);
}

// --- schema -------------------------------------------------------------------------------------

Result<Shape> inferredShape(const std::vector<Shape>& shapes, const Attributes& attributes,
                            DType dtype = DType::kFloat32) {
  std::vector<OpInput> inputs;
  for (const Shape& shape : shapes) inputs.push_back(runtime(Tensor(dtype, shape)));
  ir::Graph graph = attentionGraph(inputs, attributes);
  KILN_RETURN_IF_ERROR(ir::inferShapes(graph, nullptr));
  return graph.outputs[0]->shape;
}

void expectInferenceError(const std::vector<Shape>& shapes, const Attributes& attributes,
                          const std::string& fragment, DType dtype = DType::kFloat32) {
  auto shape = inferredShape(shapes, attributes, dtype);
  ASSERT_FALSE(shape.isOk()) << "accepted, giving " << shape->toString();
  EXPECT_NE(shape.status().message().find(fragment), std::string::npos) << shape.status().message();
}

TEST(AttentionSchema, OutputIsQueriesByValueDepth) {
  // K' [.., D, Skv] by default; K [.., Skv, D] with transpose_k.
  auto plain = inferredShape({{2, 4, 7, 16}, {2, 4, 16, 9}, {2, 4, 9, 5}}, {});
  ASSERT_TRUE(plain.isOk()) << plain.status().message();
  EXPECT_EQ(*plain, (Shape{2, 4, 7, 5}));
  auto transposed =
      inferredShape({{3, 7, 16}, {3, 9, 16}, {3, 9, 5}, {7, 9}}, attentionAttributes(0.25f, true));
  ASSERT_TRUE(transposed.isOk()) << transposed.status().message();
  EXPECT_EQ(*transposed, (Shape{3, 7, 5}));
  auto matrices = inferredShape({{7, 16}, {16, 9}, {9, 5}, {1, 9}}, {});
  ASSERT_TRUE(matrices.isOk()) << matrices.status().message();
  EXPECT_EQ(*matrices, (Shape{7, 5}));
}

TEST(AttentionSchema, RefusesMismatchedShapesWithTheirDimensions) {
  expectInferenceError({{2, 7, 16}, {2, 15, 9}, {2, 9, 5}}, {}, "has depth D=16");
  expectInferenceError({{2, 7, 16}, {2, 9, 16}, {2, 9, 5}}, {}, "in the form [..., D, Skv]");
  expectInferenceError({{2, 7, 16}, {2, 16, 9}, {2, 8, 5}}, {}, "gives Skv=9 keys");
  expectInferenceError({{2, 7, 16}, {3, 16, 9}, {2, 9, 5}}, {}, "same batch dimensions");
  expectInferenceError({{2, 7, 16}, {16, 9}, {9, 5}}, {}, "must have one rank");
  expectInferenceError({{16}, {16}, {16}}, {}, "must have one rank");
  expectInferenceError({{2, 7, 16}, {2, 16, 9}, {2, 9, 5}, {7, 8}}, {}, "does not broadcast");
  expectInferenceError({{2, 7, 16}, {2, 16, 9}, {2, 9, 5}, {1, 2, 7, 9}}, {}, "higher rank");
  expectInferenceError({{2, 7, 16}, {2, 16, 9}, {2, 9, 5}},
                       {{"transpose_k", Attribute{int64_t{2}}}}, "must be 0 or 1");
  expectInferenceError({{2, 7, 16}, {2, 16, 9}, {2, 9, 5}}, {{"scale", Attribute{int64_t{2}}}},
                       "scale");
  expectInferenceError({{2, 7, 16}, {2, 16, 9}, {2, 9, 5}}, {}, "floating-point", DType::kInt32);
}

TEST(AttentionSchema, RefusesMixedDtypes) {
  ir::Graph graph = attentionGraph(
      {runtime(Tensor(DType::kFloat32, Shape{7, 4})), runtime(Tensor(DType::kFloat32, Shape{4, 9})),
       runtime(Tensor(DType::kFloat64, Shape{9, 5}))},
      {});
  const Status status = ir::inferShapes(graph, nullptr);
  ASSERT_FALSE(status.isOk());
  EXPECT_NE(status.message().find("V has dtype float64"), std::string::npos) << status.message();
}

TEST(AttentionSchema, MaskOffsetsFollowBroadcasting) {
  ir::Graph graph = attentionGraph({runtime(Tensor(DType::kFloat32, Shape{2, 3, 4, 8})),
                                    runtime(Tensor(DType::kFloat32, Shape{2, 3, 8, 5})),
                                    runtime(Tensor(DType::kFloat32, Shape{2, 3, 5, 6})),
                                    runtime(Tensor(DType::kFloat32, Shape{2, 1, 1, 5}))},
                                   {});
  ASSERT_TRUE(ir::inferShapes(graph, nullptr).isOk());
  auto geometry = ir::attentionGeometry(*graph.nodes()[0]);
  ASSERT_TRUE(geometry.isOk()) << geometry.status().message();
  EXPECT_EQ(geometry->batch, 6);
  EXPECT_EQ(geometry->maskBatchOffsets, (std::vector<int64_t>{0, 0, 0, 5, 5, 5}));
  EXPECT_EQ(geometry->maskRowStride, 0);
  EXPECT_EQ(geometry->maskColumnStride, 1);
}

// --- reference kernel ---------------------------------------------------------------------------

// softmax(scale * Q · K' + mask) · V through the reference executor's MatMul, Mul, Add and
// Softmax (and Where(IsNaN) for nan_to_zero): what the fused op stands for.
Tensor unfusedAttention(const Tensor& q, const Tensor& kt, const Tensor& v, const Tensor* mask,
                        float scale, bool nanToZero) {
  ir::Graph graph;
  graph.opsetImports[""] = 18;
  auto addValue = [&](const std::string& name, const Tensor& tensor, bool constant) {
    ir::Value* value = graph.addValue(name);
    value->dtype = tensor.dtype();
    value->shape = tensor.shape();
    value->hasType = true;
    if (constant) {
      value->constant = tensor;
      value->isInitializer = true;
    } else {
      graph.inputs.push_back(value);
    }
    return value;
  };
  auto addNode = [&](const std::string& op, std::vector<ir::Value*> inputs) {
    ir::Node* node = graph.addNode(op);
    node->name = op + std::to_string(graph.nodes().size());
    node->opsetVersion = 18;
    node->inputs = std::move(inputs);
    ir::Value* out = graph.addValue(node->name + "_y");
    out->producer = node;
    node->outputs = {out};
    return out;
  };
  ir::Value* scores = addNode("MatMul", {addValue("q", q, false), addValue("kt", kt, false)});
  scores = addNode("Mul", {scores, addValue("scale", Tensor::scalar<float>(scale), true)});
  if (mask) {
    scores = addNode("Add", {scores, addValue("mask", *mask, false)});
  }
  ir::Value* p = addNode("Softmax", {scores});
  if (nanToZero) {
    ir::Value* isNan = addNode("IsNaN", {p});
    p = addNode("Where", {isNan, addValue("zero", Tensor::scalar<float>(0.0f), true), p});
  }
  ir::Value* y = addNode("MatMul", {p, addValue("v", v, false)});
  graph.outputs.push_back(y);
  // The graph's inputs, in the order they were added.
  std::vector<Tensor> ordered = {q, kt};
  if (mask) ordered.push_back(*mask);
  ordered.push_back(v);
  EXPECT_TRUE(ir::inferShapes(graph, nullptr).isOk());
  auto executor = reference::ReferenceExecutor::create(graph);
  EXPECT_TRUE(executor.isOk());
  auto outputs = executor->run(ordered);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().message();
  return outputs.isOk() ? (*outputs)[0] : Tensor();
}

TEST(AttentionReference, EqualsTheUnfusedChain) {
  const Tensor q = randomTensor({2, 3, 6, 5}, 1);
  const Tensor kt = randomTensor({2, 3, 5, 7}, 2);
  const Tensor v = randomTensor({2, 3, 7, 4}, 3);
  const Tensor mask = randomTensor({2, 1, 6, 7}, 4, -2, 2);
  for (const Tensor* m : {static_cast<const Tensor*>(nullptr), &mask}) {
    std::vector<OpInput> inputs = {runtime(q), runtime(kt), runtime(v)};
    if (m) inputs.push_back(runtime(*m));
    auto fused =
        runSingleOp("Attention", inputs, attentionAttributes(0.3f, false), 1, 1, ir::kKilnDomain);
    ASSERT_TRUE(fused.isOk()) << fused.status().message();
    expectClose((*fused)[0], unfusedAttention(q, kt, v, m, 0.3f, false), 1e-6);
  }
}

TEST(AttentionReference, TransposedKeysEqualTheirTranspose) {
  const Tensor q = randomTensor({4, 6, 5}, 5);
  const Tensor k = randomTensor({4, 7, 5}, 6);
  const Tensor v = randomTensor({4, 7, 3}, 7);
  Tensor kt(DType::kFloat32, Shape{4, 5, 7});
  for (int64_t b = 0; b < 4; ++b) {
    for (int64_t s = 0; s < 7; ++s) {
      for (int64_t d = 0; d < 5; ++d) {
        kt.mutableData<float>()[static_cast<size_t>((b * 5 + d) * 7 + s)] =
            k.data<float>()[static_cast<size_t>((b * 7 + s) * 5 + d)];
      }
    }
  }
  auto fused = runSingleOp("Attention", {runtime(q), runtime(k), runtime(v)},
                           attentionAttributes(0.5f, true), 1, 1, ir::kKilnDomain);
  ASSERT_TRUE(fused.isOk()) << fused.status().message();
  expectClose((*fused)[0], unfusedAttention(q, kt, v, nullptr, 0.5f, false), 1e-6);
}

TEST(AttentionReference, FullyMaskedRowsAreNaNOrZero) {
  const Tensor q = randomTensor({3, 4}, 8);
  const Tensor kt = randomTensor({4, 5}, 9);
  const Tensor v = randomTensor({5, 2}, 10);
  Tensor mask = randomTensor({3, 5}, 11);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < 5; ++j) mask.mutableData<float>()[static_cast<size_t>(5 + j)] = -inf;
  for (bool nanToZero : {false, true}) {
    auto fused = runSingleOp("Attention", {runtime(q), runtime(kt), runtime(v), runtime(mask)},
                             attentionAttributes(1.0f, false, nanToZero), 1, 1, ir::kKilnDomain);
    ASSERT_TRUE(fused.isOk()) << fused.status().message();
    const Tensor expected = unfusedAttention(q, kt, v, &mask, 1.0f, nanToZero);
    expectClose((*fused)[0], expected, 1e-6);
    // Row 1 is the masked one.
    EXPECT_EQ(std::isnan((*fused)[0].elementAsDouble(2)), !nanToZero);
    if (nanToZero) {
      EXPECT_EQ((*fused)[0].elementAsDouble(2), 0.0);
    }
  }
}

// --- CPU kernel ---------------------------------------------------------------------------------

struct Case {
  std::string name;
  std::vector<int64_t> batch;  // batch dimensions
  int64_t sq, skv, d, dv;
  bool transposeK = false;
  std::optional<std::vector<int64_t>> mask;  // its shape, if any
  bool nanToZero = false;
  bool maskRows = false;  // fully mask some rows with -inf
};

std::vector<OpInput> caseInputs(const Case& c, unsigned seed) {
  auto shape = [&](int64_t a, int64_t b) {
    std::vector<int64_t> dims = c.batch;
    dims.push_back(a);
    dims.push_back(b);
    return Shape(std::move(dims));
  };
  std::vector<OpInput> inputs = {
      runtime(randomTensor(shape(c.sq, c.d), seed)),
      runtime(randomTensor(c.transposeK ? shape(c.skv, c.d) : shape(c.d, c.skv), seed + 1)),
      runtime(randomTensor(shape(c.skv, c.dv), seed + 2)),
  };
  if (c.mask) {
    Tensor mask = randomTensor(Shape(*c.mask), seed + 3, -3, 3);
    if (c.maskRows) {
      // Every third row of the mask's last two axes entirely -inf.
      const int64_t cols = c.mask->back();
      const int64_t rows = c.mask->size() >= 2 ? (*c.mask)[c.mask->size() - 2] : 1;
      auto data = mask.mutableData<float>();
      for (int64_t i = 0; i < mask.elementCount(); ++i) {
        if ((i / cols) % rows % 3 == 1) {
          data[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
        }
      }
    }
    inputs.push_back(runtime(std::move(mask)));
  }
  return inputs;
}

// Builds the case with cpu.attention.impl=reference and =fast on 1, 2 and 3 threads and the
// given GEMM source; expects the fast runs to use fast.attention, match the reference, and
// agree bit for bit with each other (a block's arithmetic does not depend on the split).
void expectFastMatchesReference(const Case& c, const std::string& source) {
  SCOPED_TRACE(c.name + " with cpu.gemm.source=" + source);
  const std::vector<OpInput> inputs = caseInputs(c, 17);
  const Attributes attributes = attentionAttributes(0.37f, c.transposeK, c.nanToZero);
  const std::vector<Tensor> runtimeValues = runtimeInputs(inputs);
  const PlanRun reference = buildAndRun("-cpu.attention.impl=reference",
                                        attentionGraph(inputs, attributes), runtimeValues);
  ASSERT_EQ(reference.outputs.size(), 1u);
  EXPECT_EQ(reference.tactics, std::vector<std::string>{"reference"});
  std::vector<PlanRun> fast;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    fast.push_back(
        buildAndRun("-cpu.gemm.source=" + source + " -cpu.threads=" + std::to_string(threads),
                    attentionGraph(inputs, attributes), runtimeValues));
    ASSERT_EQ(fast.back().outputs.size(), 1u);
    EXPECT_EQ(fast.back().tactics, std::vector<std::string>{"fast.attention"});
    expectClose(fast.back().outputs[0], reference.outputs[0], 2e-5);
    expectBitwiseEqual(fast.back().outputs[0], fast[0].outputs[0]);
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"bert-like heads", {1, 4}, 128, 128, 64, 64},
      {"rows not a multiple of the block, odd depth", {3}, 197, 197, 33, 17},
      {"one row, one key", {2}, 1, 1, 1, 1},
      {"long rows of keys, so blocks of few rows", {1}, 40, 5000, 4, 3},
      {"fewer keys than queries", {2, 2}, 70, 5, 7, 9},
      {"more keys than queries, no batch", {}, 13, 150, 8, 3},
      {"K transposed", {2, 3}, 65, 67, 31, 16, true},
      {"key-padding mask [B, 1, 1, Skv]", {2, 3}, 40, 41, 16, 8, false, {{2, 1, 1, 41}}},
      {"full mask [B, H, Sq, Skv]", {2, 3}, 40, 41, 16, 8, true, {{2, 3, 40, 41}}},
      {"mask [Sq, Skv] shared by every head", {2, 3}, 66, 20, 5, 5, false, {{66, 20}}},
      {"mask [Skv]", {4}, 30, 20, 5, 5, false, {{20}}},
      {"mask [1, H, Sq, 1] broadcast along keys", {2, 3}, 33, 20, 5, 5, false, {{1, 3, 33, 1}}},
      {"fully masked rows become zeros", {2}, 100, 24, 8, 8, false, {{2, 100, 24}}, true, true},
      {"fully masked rows stay NaN", {2}, 100, 24, 8, 8, false, {{100, 24}}, false, true},
  };
  return all;
}

TEST(CpuAttention, MatchesReferenceOnThreadsWithBlas) {
  for (const Case& c : cases()) expectFastMatchesReference(c, "blas");
}

TEST(CpuAttention, MatchesReferenceOnThreadsWithNativeGemm) {
  for (const Case& c : cases()) expectFastMatchesReference(c, "native");
}

TEST(CpuAttention, OtherDtypesRunTheReferenceKernel) {
  std::vector<OpInput> inputs;
  for (const Shape& shape : {Shape{2, 5, 4}, Shape{2, 4, 6}, Shape{2, 6, 3}}) {
    inputs.push_back(runtime(randomTensor(shape, 3).castTo(DType::kFloat64)));
  }
  const PlanRun run = buildAndRun("", attentionGraph(inputs, attentionAttributes(0.5f, false)),
                                  runtimeInputs(inputs));
  EXPECT_EQ(run.tactics, std::vector<std::string>{"reference"});
  ASSERT_EQ(run.outputs.size(), 1u);
  auto expected =
      runSingleOp("Attention", inputs, attentionAttributes(0.5f, false), 1, 1, ir::kKilnDomain);
  ASSERT_TRUE(expected.isOk());
  expectBitwiseEqual(run.outputs[0], (*expected)[0]);
}

// --- the heads form (num_heads) -----------------------------------------------------------------

Attributes headsAttributes(int64_t heads, float scale) {
  return {{"num_heads", Attribute{heads}},
          {"transpose_k", Attribute{int64_t{1}}},
          {"scale", Attribute{scale}}};
}

TEST(AttentionSchema, HeadsFormShapes) {
  // Q [B, Sq, H * D], K [B, Skv, H * D], V [B, Skv, H * Dv] -> [B, Sq, H * Dv].
  auto separate = inferredShape({{2, 7, 3 * 16}, {2, 9, 3 * 16}, {2, 9, 3 * 5}, {2, 1, 1, 9}},
                                headsAttributes(3, 0.25f));
  ASSERT_TRUE(separate.isOk()) << separate.status().message();
  EXPECT_EQ(*separate, (Shape{2, 7, 15}));
  // Packed: Q [B, S, 3 * H * D] with K and V omitted.
  ir::Graph graph =
      attentionGraph({runtime(Tensor(DType::kFloat32, Shape{2, 5, 3 * 2 * 8})), OpInput{},
                      OpInput{}, runtime(Tensor(DType::kFloat32, Shape{1, 1, 5, 5}))},
                     headsAttributes(2, 0.5f));
  ASSERT_TRUE(ir::inferShapes(graph, nullptr).isOk());
  EXPECT_EQ(graph.outputs[0]->shape, (Shape{2, 5, 16}));
  auto g = ir::attentionGeometry(*graph.nodes()[0]);
  ASSERT_TRUE(g.isOk()) << g.status().message();
  EXPECT_TRUE(g->packed);
  EXPECT_EQ(g->batch, 4);
  EXPECT_EQ(g->heads, 2);
  EXPECT_EQ(g->d, 8);
  // Batch entry 3 is outer entry 1, head 1: one S x 48 matrix in, 8 columns along.
  EXPECT_EQ(g->q.offset(3, 2), 5 * 48 + 8);
  EXPECT_EQ(g->k.offset(3, 2), 5 * 48 + 16 + 8);
  EXPECT_EQ(g->v.offset(3, 2), 5 * 48 + 32 + 8);
  EXPECT_EQ(g->y.offset(3, 2), 5 * 16 + 8);
  EXPECT_EQ(g->q.rowStride, 48);
  EXPECT_EQ(g->y.rowStride, 16);
}

TEST(AttentionSchema, HeadsFormRefusesWhatItCannotRead) {
  Attributes kPrime = headsAttributes(2, 1.0f);
  kPrime.erase("transpose_k");
  expectInferenceError({{1, 4, 8}, {1, 4, 8}, {1, 4, 8}}, kPrime, "needs transpose_k=1");
  expectInferenceError({{1, 4, 9}, {1, 4, 9}, {1, 4, 8}}, headsAttributes(2, 1.0f),
                       "whole multiples of H");
  expectInferenceError({{1, 4, 8}, {1, 4, 6}, {1, 4, 8}}, headsAttributes(2, 1.0f),
                       "same H * D columns");
  expectInferenceError({{1, 4, 2, 8}, {1, 4, 8}, {1, 4, 8}}, headsAttributes(2, 1.0f),
                       "must be [B, S, columns]");
  expectInferenceError({{1, 4, 8}, {1, 5, 8}, {1, 4, 8}}, headsAttributes(2, 1.0f),
                       "must be [B, Sq, H * D]");
  expectInferenceError({{1, 4, 8}, {1, 4, 8}, {1, 4, 8}}, {{"num_heads", Attribute{int64_t{-1}}}},
                       "must be positive");
  ir::Graph packed =
      attentionGraph({runtime(Tensor(DType::kFloat32, Shape{1, 4, 20})), OpInput{}, OpInput{}},
                     headsAttributes(2, 1.0f));
  const Status notThree = ir::inferShapes(packed, nullptr);
  ASSERT_FALSE(notThree.isOk());
  EXPECT_NE(notThree.message().find("3 * H * D columns"), std::string::npos) << notThree.message();
  ir::Graph half = attentionGraph({runtime(Tensor(DType::kFloat32, Shape{1, 4, 24})),
                                   runtime(Tensor(DType::kFloat32, Shape{1, 4, 8})), OpInput{}},
                                  headsAttributes(2, 1.0f));
  const Status oneOmitted = ir::inferShapes(half, nullptr);
  ASSERT_FALSE(oneOmitted.isOk());
  EXPECT_NE(oneOmitted.message().find("both given or both omitted"), std::string::npos)
      << oneOmitted.message();
}

// Columns [first, first + heads * depth) of x [B, S, C] as [B, heads, S, depth].
Tensor headsOf(const Tensor& x, int64_t first, int64_t heads, int64_t depth) {
  const int64_t b = x.shape()[0], s = x.shape()[1], c = x.shape()[2];
  Tensor out(DType::kFloat32, Shape{b, heads, s, depth});
  auto to = out.mutableData<float>();
  auto from = x.data<float>();
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = 0; r < s; ++r) {
        for (int64_t e = 0; e < depth; ++e) {
          to[static_cast<size_t>(((i * heads + h) * s + r) * depth + e)] =
              from[static_cast<size_t>((i * s + r) * c + first + h * depth + e)];
        }
      }
    }
  }
  return out;
}

// The packed heads form equals the plain form on the heads cut out of the packed tensor.
TEST(AttentionReference, PackedHeadsEqualThePlainFormOnTheirHeads) {
  const int64_t b = 2, s = 6, heads = 3, d = 4;
  const Tensor x = randomTensor({b, s, 3 * heads * d}, 31);
  const Tensor mask = randomTensor({b, 1, 1, s}, 32, -2, 2);
  auto packed = runSingleOp("Attention", {runtime(x), OpInput{}, OpInput{}, runtime(mask)},
                            headsAttributes(heads, 0.4f), 1, 1, ir::kKilnDomain);
  ASSERT_TRUE(packed.isOk()) << packed.status().message();
  auto plain = runSingleOp("Attention",
                           {runtime(headsOf(x, 0, heads, d)), runtime(headsOf(x, 12, heads, d)),
                            runtime(headsOf(x, 24, heads, d)), runtime(mask)},
                           attentionAttributes(0.4f, true), 1, 1, ir::kKilnDomain);
  ASSERT_TRUE(plain.isOk()) << plain.status().message();
  // The heads-form output [B, S, H * D], cut back into heads, is the plain output.
  expectClose(headsOf((*packed)[0], 0, heads, d), (*plain)[0], 1e-6);
}

TEST(CpuAttention, HeadsFormMatchesReference) {
  struct HeadsCase {
    std::string name;
    std::vector<OpInput> inputs;
  };
  const Tensor mask = randomTensor({2, 1, 1, 9}, 41, -3, 3);
  const std::vector<HeadsCase> headsCases = {
      {"packed, per-key mask",
       {runtime(randomTensor({2, 9, 3 * 3 * 8}, 42)), OpInput{}, OpInput{}, runtime(mask)}},
      {"separate, Dv != D, Sq != Skv",
       {runtime(randomTensor({2, 5, 3 * 8}, 43)), runtime(randomTensor({2, 9, 3 * 8}, 44)),
        runtime(randomTensor({2, 9, 3 * 6}, 45)), runtime(mask)}},
  };
  for (const HeadsCase& c : headsCases) {
    SCOPED_TRACE(c.name);
    const Attributes attributes = headsAttributes(3, 0.3f);
    const std::vector<Tensor> values = runtimeInputs(c.inputs);
    const PlanRun reference =
        buildAndRun("-cpu.attention.impl=reference", attentionGraph(c.inputs, attributes), values);
    ASSERT_EQ(reference.outputs.size(), 1u);
    for (int threads : {1, 2}) {
      const PlanRun fast = buildAndRun("-cpu.threads=" + std::to_string(threads),
                                       attentionGraph(c.inputs, attributes), values);
      ASSERT_EQ(fast.outputs.size(), 1u);
      EXPECT_EQ(fast.tactics, std::vector<std::string>{"fast.attention"});
      expectClose(fast.outputs[0], reference.outputs[0], 2e-5);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
