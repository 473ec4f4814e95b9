// Graph construction and typed attribute access with its error messages.
#include "kiln/ir/graph.h"

#include <gtest/gtest.h>

#include "kiln/ir/printer.h"

namespace kiln::ir {
namespace {

Node& makeNode(Graph& graph) {
  Node* node = graph.addNode("Conv");
  node->name = "conv3";
  node->opsetVersion = 18;
  node->attributes["group"] = {int64_t{2}};
  node->attributes["kernel_shape"] = {std::vector<int64_t>{3, 3}};
  node->attributes["epsilon"] = {1e-5f};
  return *node;
}

TEST(Node, DescribesItself) {
  Graph graph;
  EXPECT_EQ(makeNode(graph).describe(), "node 'conv3' (Conv, opset 18)");
}

TEST(Node, ReadsTypedAttributesAndDefaults) {
  Graph graph;
  const Node& node = makeNode(graph);
  EXPECT_EQ(node.getInt("group", 1).value(), 2);
  EXPECT_EQ(node.getInt("absent", 7).value(), 7);
  EXPECT_EQ(node.getInts("kernel_shape").value(), (std::vector<int64_t>{3, 3}));
  EXPECT_FLOAT_EQ(node.getFloat("epsilon", 0).value(), 1e-5f);
}

TEST(Node, NamesTheAttributeOfTheWrongKind) {
  Graph graph;
  const Node& node = makeNode(graph);
  auto wrong = node.getFloat("group", 0);
  ASSERT_FALSE(wrong.isOk());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(wrong.status().message(),
            "node 'conv3' (Conv, opset 18): attribute 'group' must be of type float, got int");
  auto missing = node.getTensor("value");
  ASSERT_FALSE(missing.isOk());
  EXPECT_EQ(missing.status().message(),
            "node 'conv3' (Conv, opset 18): required attribute 'value' is missing");
}

TEST(Graph, FindsValuesByNameAndCountsParameters) {
  Graph graph;
  Value* w = graph.addValue("w");
  w->constant = Tensor(DType::kFloat32, Shape{4, 3});
  w->isInitializer = true;
  graph.addValue("x");
  EXPECT_EQ(graph.findValue("w"), w);
  EXPECT_EQ(graph.findValue("nope"), nullptr);
  EXPECT_EQ(graph.parameterCount(), 12);
}

TEST(Printer, PrintsNodesWithTypesAndAttributes) {
  Graph graph;
  Value* x = graph.addValue("x");
  x->dtype = DType::kFloat32;
  x->shape = Shape{1, 4};
  x->hasType = true;
  graph.inputs.push_back(x);
  Node* node = graph.addNode("LeakyRelu");
  node->name = "act";
  node->inputs = {x};
  node->attributes["alpha"] = {0.5f};
  Value* y = graph.addValue("y");
  y->dtype = DType::kFloat32;
  y->shape = Shape{1, 4};
  y->hasType = true;
  y->producer = node;
  node->outputs = {y};
  graph.outputs.push_back(y);
  EXPECT_EQ(printGraph(graph),
            "input %x : float32[1,4]\n"
            "%y : float32[1,4] = LeakyRelu \"act\" (%x) {alpha=0.5}\n"
            "output %y\n");
}

TEST(Status, CarriesCodeAndContext) {
  Status status = invalidInput("bad {}", 3).withContext("model.onnx");
  EXPECT_EQ(status.message(), "model.onnx: bad 3");
  EXPECT_EQ(status.toString(), "invalid input: model.onnx: bad 3");
  EXPECT_TRUE(Status::ok().withContext("x").isOk());
  Result<int> result = unsupported("nope");
  EXPECT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace kiln::ir
