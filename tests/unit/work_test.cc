// countWork: the FLOPs of matrix products and the bytes of traffic, checked by hand.
#include "kiln/ir/work.h"

#include <gtest/gtest.h>

namespace kiln::ir {
namespace {

Value* typedValue(Graph& graph, const std::string& name, Shape shape, bool constant = false) {
  Value* value = graph.addValue(name);
  value->shape = shape;
  value->hasType = true;
  if (constant) {
    value->constant = Tensor(DType::kFloat32, shape);
    value->isInitializer = true;
  }
  return value;
}

Node* addNode(Graph& graph, const std::string& op, std::vector<Value*> inputs, Value* output) {
  Node* node = graph.addNode(op);
  node->name = op;
  node->inputs = std::move(inputs);
  node->outputs = {output};
  output->producer = node;
  return node;
}

TEST(CountWork, ProductsAndTraffic) {
  Graph graph;
  // Grouped Conv: X [1,8,10,10], W [16,4,3,3] (group 2), Y [1,16,8,8]: each of the 1024 outputs
  // sums 4*3*3 = 36 products.
  Value* x = typedValue(graph, "x", Shape{1, 8, 10, 10});
  Value* w = typedValue(graph, "w", Shape{16, 4, 3, 3}, true);
  Value* y = typedValue(graph, "y", Shape{1, 16, 8, 8});
  addNode(graph, "Conv", {x, w}, y)->attributes["group"] = {int64_t{2}};
  // ConvTranspose, stride 2: X [1,16,8,8] (1024 elements), W [16,2,2,2]: each input scatters
  // 2*2*2 = 8.
  Value* wt = typedValue(graph, "wt", Shape{16, 2, 2, 2}, true);
  Value* t = typedValue(graph, "t", Shape{1, 2, 16, 16});
  addNode(graph, "ConvTranspose", {y, wt}, t)->attributes["strides"] = {std::vector<int64_t>{2, 2}};
  // Gemm with transA: A [5,3] read as [3,5], B [5,7]: 3*7 outputs of 5 products.
  Value* a = typedValue(graph, "a", Shape{5, 3});
  Value* b = typedValue(graph, "b", Shape{5, 7}, true);
  Value* g = typedValue(graph, "g", Shape{3, 7});
  addNode(graph, "Gemm", {a, b}, g)->attributes["transA"] = {int64_t{1}};
  // Batched MatMul: [2,4,6] x [6,3] -> [2,4,3], 6 products each; it reads b's twin constant.
  Value* m = typedValue(graph, "m", Shape{2, 4, 6});
  Value* k = typedValue(graph, "k", Shape{6, 3}, true);
  Value* p = typedValue(graph, "p", Shape{2, 4, 3});
  addNode(graph, "MatMul", {m, k}, p);
  // Not a product: counted in bytes only. It reads the constant k a second time.
  Value* q = typedValue(graph, "q", Shape{6, 3});
  addNode(graph, "Relu", {k}, q);
  graph.inputs = {x, a, m};
  graph.outputs = {t, g, p, q};

  const GraphWork work = countWork(graph);
  const double conv = 2.0 * 1024 * 36, transpose = 2.0 * 1024 * 8, gemm = 2.0 * 21 * 5,
               matmul = 2.0 * 24 * 6;
  EXPECT_DOUBLE_EQ(work.byOp.at("Conv").flops, conv);
  EXPECT_DOUBLE_EQ(work.byOp.at("ConvTranspose").flops, transpose);
  EXPECT_DOUBLE_EQ(work.byOp.at("Gemm").flops, gemm);
  EXPECT_DOUBLE_EQ(work.byOp.at("MatMul").flops, matmul);
  EXPECT_EQ(work.byOp.count("Relu"), 0u);
  EXPECT_EQ(work.byOp.at("Conv").nodes, 1);
  EXPECT_DOUBLE_EQ(work.flops, conv + transpose + gemm + matmul);

  // Constants once each, though k is read twice: 576 + 128 + 35 + 18 floats.
  EXPECT_DOUBLE_EQ(work.weightBytes, 4.0 * (576 + 128 + 35 + 18));
  // Inputs 800 + 15 + 48, outputs 512 + 21 + 24 + 18 floats.
  EXPECT_DOUBLE_EQ(work.ioBytes, 4.0 * (800 + 15 + 48 + 512 + 21 + 24 + 18));
  EXPECT_DOUBLE_EQ(work.minimumBytes(), work.weightBytes + work.ioBytes);
  // Each node's activations: Conv 800+1024, ConvTranspose 1024+512, Gemm 15+21, MatMul 48+24,
  // Relu 18 (its input is a constant), plus the constants.
  EXPECT_DOUBLE_EQ(work.unfusedBytes,
                   4.0 * (800 + 1024 + 1024 + 512 + 15 + 21 + 48 + 24 + 18) + work.weightBytes);
}

TEST(CountWork, UntypedValuesCountNothing) {
  Graph graph;
  Value* x = graph.addValue("x");
  Value* w = graph.addValue("w");
  Value* y = graph.addValue("y");
  addNode(graph, "MatMul", {x, w}, y);
  graph.inputs = {x, w};
  graph.outputs = {y};
  const GraphWork work = countWork(graph);
  EXPECT_EQ(work.flops, 0);
  EXPECT_TRUE(work.byOp.empty());
  EXPECT_EQ(work.unfusedBytes, 0);
  EXPECT_EQ(work.ioBytes, 0);
}

}  // namespace
}  // namespace kiln::ir
