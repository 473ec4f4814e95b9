// Reduced precision on the GPU: every op that cuda.precision puts in fp16 or bf16 must have a GPU
// kernel for it (the host fallback is off, so a missing kernel fails the build anywhere), its
// steps must say so, and where a GPU is present the outputs must stay close to the CPU
// backend's float32 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../knobs/graph_sketch.h"
#include "kiln/backends/cuda/runtime.h"
#include "kiln/engine/builder.h"

namespace kiln::testing {
namespace {

struct PrecisionCase {
  std::string title;
  std::function<ir::Graph()> graph;
  std::string route;                    // besides -cuda.precision=... -cuda.host_fallback=off
  std::vector<std::string> reducedOps;  // ops (domain-prefixed) whose steps must be reduced
  double tolerance = 2e-2;              // of the largest |expected|, and at least this absolute
};

std::string opOf(const ir::Node& node) {
  return node.domain.empty() ? node.opType : node.domain + "." + node.opType;
}

std::vector<ir::Tensor> seededInputs(const ir::Graph& graph) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    ir::Tensor tensor(input->dtype, input->shape);
    if (input->dtype == ir::DType::kFloat32) {
      for (float& v : tensor.mutableData<float>()) v = uniform(rng);
    }
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

void expectReducedRunsOnTheGpu(const PrecisionCase& c, const std::string& precision) {
  SCOPED_TRACE(c.title + " [" + precision + "]");
  BuilderConfig config;
  ASSERT_TRUE(
      config.setBuildRoute("-cuda.host_fallback=off -cuda.precision=" + precision + " " + c.route)
          .isOk());
  auto build = buildCuda(c.graph(), config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  std::set<std::string> seen;
  for (const auto& step : build->plan.steps()) {
    const std::string op = opOf(*step->node);
    if (op == "Cast") continue;
    if (std::find(c.reducedOps.begin(), c.reducedOps.end(), op) != c.reducedOps.end()) {
      EXPECT_EQ(step->precision, precision) << step->node->name << " (" << op << ")";
      seen.insert(op);
    }
  }
  for (const std::string& op : c.reducedOps) EXPECT_TRUE(seen.count(op)) << "no " << op << " step";
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();

  ir::Graph graph = c.graph();
  const std::vector<ir::Tensor> inputs = seededInputs(graph);
  BuilderConfig cpuConfig;
  ASSERT_TRUE(cpuConfig.setBuildRoute(c.route).isOk());
  auto cpu = buildCpu(std::move(graph), cpuConfig);
  ASSERT_TRUE(cpu.isOk()) << cpu.status().toString();
  auto expected = cpu->plan.run(inputs);
  ASSERT_TRUE(expected.isOk()) << expected.status().toString();
  auto actual = build->plan.run(inputs);
  ASSERT_TRUE(actual.isOk()) << actual.status().toString();
  ASSERT_EQ(actual->size(), expected->size());
  for (size_t o = 0; o < expected->size(); ++o) {
    const ir::Tensor& e = (*expected)[o];
    const ir::Tensor& a = (*actual)[o];
    ASSERT_EQ(a.dtype(), e.dtype());
    ASSERT_EQ(a.shape(), e.shape());
    double scale = 1.0;
    for (int64_t i = 0; i < e.elementCount(); ++i) {
      scale = std::max(scale, std::fabs(e.elementAsDouble(i)));
    }
    // bf16 keeps 8 bits of mantissa to fp16's 11.
    const double bound = c.tolerance * scale * (precision == "bf16" ? 8.0 : 1.0);
    int bad = 0;
    for (int64_t i = 0; i < e.elementCount(); ++i) {
      const double diff = std::fabs(a.elementAsDouble(i) - e.elementAsDouble(i));
      if (!(diff <= bound) && bad++ < 5) {
        ADD_FAILURE() << "output " << o << " element " << i << ": got " << a.elementAsDouble(i)
                      << ", expected " << e.elementAsDouble(i) << " (bound " << bound << ")";
      }
    }
  }
}

std::map<std::string, ir::Attribute> attrs(std::map<std::string, ir::Attribute> a) { return a; }

std::vector<PrecisionCase> cases() {
  std::vector<PrecisionCase> all;
  all.push_back({"Conv + bias + Relu (FusedConv), then MaxPool and GlobalAveragePool",
                 [] {
                   GraphSketch g;
                   auto c = g.node("Conv",
                                   {g.input("x", {2, 8, 10, 10}), g.weight("w", {16, 8, 3, 3}),
                                    g.weight("b", {16})},
                                   {{"pads", ints({1, 1, 1, 1})}}, "conv");
                   auto r = g.node("Relu", {c}, {}, "relu");
                   auto p =
                       g.node("MaxPool", {r},
                              {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}}, "pool");
                   g.output(g.node("GlobalAveragePool", {p}, {}, "gap"));
                   return g.take();
                 },
                 "-cuda.layout=nchw",
                 {"kiln.FusedConv", "MaxPool", "GlobalAveragePool"}});
  all.push_back(
      {"the same channels-last (cuda.layout=nhwc, the default)",
       [] {
         GraphSketch g;
         auto c = g.node(
             "Conv",
             {g.input("x", {2, 8, 10, 10}), g.weight("w", {16, 8, 3, 3}), g.weight("b", {16})},
             {{"pads", ints({1, 1, 1, 1})}}, "conv");
         auto r = g.node("Relu", {c}, {}, "relu");
         auto p = g.node("AveragePool", {r},
                         {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}}, "pool");
         g.output(g.node("GlobalAveragePool", {p}, {}, "gap"));
         return g.take();
       },
       "-cuda.layout=nhwc",
       {"kiln.NhwcConv", "kiln.NhwcAveragePool", "kiln.NhwcGlobalAveragePool", "Transpose"}});
  all.push_back({"depthwise and grouped convolutions",
                 [] {
                   GraphSketch g;
                   auto d = g.node(
                       "Conv", {g.input("x", {1, 16, 9, 9}), g.weight("w", {16, 1, 3, 3})},
                       {{"pads", ints({1, 1, 1, 1})}, {"group", ir::Attribute{int64_t{16}}}}, "dw");
                   g.output(g.node("Conv", {d, g.weight("w2", {8, 4, 1, 1})},
                                   {{"group", ir::Attribute{int64_t{4}}}}, "grouped"));
                   return g.take();
                 },
                 "-cuda.layout=nchw",
                 {"Conv"}});
  all.push_back(
      {"Gemm with bias, MatMul + Add + Relu (FusedGemm), batched MatMul",
       [] {
         GraphSketch g;
         auto a =
             g.node("Gemm", {g.input("x", {8, 32}), g.weight("w", {32, 64}), g.weight("b", {64})},
                    {}, "gemm");
         auto m = g.node("MatMul", {a, g.weight("w2", {64, 16})}, {}, "mm");
         auto r = g.node("Relu", {g.node("Add", {m, g.weight("b2", {16})}, {}, "add")}, {}, "relu");
         g.output(r);
         g.output(g.node("MatMul", {g.input("p", {3, 5, 8}), g.input("q", {3, 8, 4})}, {}, "bmm"));
         return g.take();
       },
       "",
       {"Gemm", "kiln.FusedGemm", "MatMul"}});
  all.push_back(
      {"attention: MatMul / scale -> Softmax -> MatMul (kiln.Attention)",
       [] {
         GraphSketch g;
         auto s = g.node("MatMul", {g.input("q", {2, 4, 16, 8}), g.input("kt", {2, 4, 8, 16})}, {},
                         "qk");
         auto c = g.constant("scale", ir::Tensor::scalar<float>(0.35f));
         auto d = g.node("Mul", {s, c}, {}, "scale_mul");
         auto p = g.node("Softmax", {d}, {{"axis", ir::Attribute{int64_t{-1}}}}, "softmax");
         g.output(g.node("MatMul", {p, g.input("v", {2, 4, 16, 8})}, {}, "pv"));
         return g.take();
       },
       "",
       {"kiln.Attention"}});
  all.push_back({"elementwise: broadcast Add, Mul, Sigmoid, Tanh, a fused chain",
                 [] {
                   GraphSketch g;
                   auto x = g.input("x", {4, 6, 10});
                   auto a = g.node("Add", {x, g.weight("row", {10})}, {}, "add");
                   auto m = g.node("Mul", {a, g.input("y", {4, 1, 10})}, {}, "mul");
                   auto s = g.node("Sigmoid", {m}, {}, "sigmoid");
                   g.output(g.node("Tanh", {s}, {}, "tanh"));
                   g.output(g.node("Div", {x, g.node("Abs", {m}, {}, "abs")}, {}, "div"));
                   return g.take();
                 },
                 "-fusion.eltwise_chain=off",
                 {"Add", "Mul", "Sigmoid", "Tanh", "Abs", "Div"}});
  all.push_back({"a fused elementwise chain (kiln.FusedElementwise)",
                 [] {
                   GraphSketch g;
                   auto x = g.input("x", {4, 6, 10});
                   auto a = g.node("Add", {x, g.weight("row", {10})}, {}, "add");
                   auto s = g.node("Sigmoid", {a}, {}, "sigmoid");
                   g.output(g.node("Mul", {s, a}, {}, "mul"));
                   return g.take();
                 },
                 "",
                 {"kiln.FusedElementwise"}});
  all.push_back(
      {"data movement: Transpose, Concat, Slice, Gather, Reshape, nearest and linear Resize",
       [] {
         GraphSketch g;
         auto x = g.input("x", {1, 4, 6, 6});
         auto e = g.node("Exp", {x}, {}, "exp");
         auto t = g.node("Transpose", {e}, {{"perm", ints({0, 2, 3, 1})}}, "transpose");
         auto c = g.node("Concat", {t, t}, {{"axis", ir::Attribute{int64_t{3}}}}, "concat");
         auto s =
             g.node("Slice",
                    {c, g.constant("starts", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {1})),
                     g.constant("ends", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {5})),
                     g.constant("axes", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {1}))},
                    {}, "slice");
         auto gi =
             g.node("Gather",
                    {s, g.constant("idx", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {2, 0}))},
                    {{"axis", ir::Attribute{int64_t{2}}}}, "gather");
         g.output(gi);
         auto r = g.node(
             "Resize",
             {e, "",
              g.constant("scales", ir::Tensor::fromVector<float>(ir::Shape{4}, {1, 1, 2, 2}))},
             {{"mode", ir::Attribute{std::string("nearest")}}}, "resize");
         g.output(g.node("Neg", {r}, {}, "neg"));
         auto linear = g.node(
             "Resize",
             {e, "",
              g.constant("scales2", ir::Tensor::fromVector<float>(ir::Shape{4}, {1, 1, 1.5, 2}))},
             {{"mode", ir::Attribute{std::string("linear")}}}, "resize_linear");
         g.output(g.node("Neg", {linear}, {}, "neg_linear"));
         return g.take();
       },
       // graph.compose_row_moves would make the Slice and the Gather after it one Gather of rows.
       "-fusion.eltwise_chain=off -graph.compose_row_moves=off",
       {"Exp", "Transpose", "Concat", "Slice", "Gather", "Resize", "Neg"}});
  all.push_back(
      {"ReduceMean and, with norm_fp32 off, LayerNormalization and Softmax",
       [] {
         GraphSketch g;
         auto x = g.input("x", {4, 32});
         auto n = g.node("LayerNormalization", {x, g.weight("gamma", {32}), g.weight("beta", {32})},
                         {{"axis", ir::Attribute{int64_t{-1}}}}, "ln");
         auto s = g.node("Softmax", {n}, {{"axis", ir::Attribute{int64_t{-1}}}}, "softmax");
         g.output(
             g.node("ReduceMean",
                    {s, g.constant("axes", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {1}))}, {},
                    "mean"));
         return g.take();
       },
       "-cuda.precision.norm_fp32=off",
       {"LayerNormalization", "Softmax", "ReduceMean"}});
  return all;
}

TEST(CudaPrecision, Fp16RunsEveryReducedOpOnTheGpu) {
  for (const PrecisionCase& c : cases()) expectReducedRunsOnTheGpu(c, "fp16");
}

TEST(CudaPrecision, Bf16RunsEveryReducedOpOnTheGpu) {
  for (const PrecisionCase& c : cases()) expectReducedRunsOnTheGpu(c, "bf16");
}

}  // namespace
}  // namespace kiln::testing
