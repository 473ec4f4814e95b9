// Hostile ONNX models built byte by byte in protobuf's wire format: nesting deeper than the parser
// allows, subgraphs, and a graph of many nodes. Each gets a clear error or imports; none crashes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kiln/onnx/import.h"

namespace kiln::onnx {
namespace {

// Protobuf's wire format: a varint, a length-delimited field, a varint field.
std::string varint(uint64_t value) {
  std::string bytes;
  while (value >= 0x80) {
    bytes.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  bytes.push_back(static_cast<char>(value));
  return bytes;
}
std::string field(int number, const std::string& payload) {
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(payload.size()) + payload;
}
std::string intField(int number, uint64_t value) {
  return varint(static_cast<uint64_t>(number) << 3) + varint(value);
}

// ModelProto{ir_version 8, opset_import{version 18}, graph}.
std::string model(const std::string& graph) {
  return intField(1, 8) + field(8, intField(2, 18)) + field(7, graph);
}

// A GraphProto whose one node carries an attribute holding the graph one level down:
// Graph -> Node (field 1) -> Attribute (field 5) -> Graph (field 6), three messages a level.
std::string nestedGraph(int levels) {
  std::string graph = field(2, "leaf");  // GraphProto.name
  for (int i = 0; i < levels; ++i) {
    const std::string attribute = field(1, "then_branch") + intField(20, 5) + field(6, graph);
    const std::string node = field(4, "If") + field(3, "if" + std::to_string(i)) +
                             field(5, attribute);  // op_type, name, attribute
    graph = field(1, node) + field(2, "g" + std::to_string(i));
  }
  return graph;
}

TEST(HostileModel, NestingDeeperThanTheParserAllowsIsRefusedByName) {
  auto deep = importModelFromBytes(model(nestedGraph(40)), ".");
  ASSERT_FALSE(deep.isOk());
  EXPECT_NE(deep.status().message().find("nested more than 100 messages deep"), std::string::npos)
      << deep.status().message();
  // Ten thousand levels: protobuf stops at its limit, without recursing that deep.
  auto deeper = importModelFromBytes(model(nestedGraph(10000)), ".");
  ASSERT_FALSE(deeper.isOk());
}

TEST(HostileModel, SubgraphsAreRefusedAsUnsupported) {
  auto nested = importModelFromBytes(model(nestedGraph(3)), ".");
  ASSERT_FALSE(nested.isOk());
  EXPECT_NE(nested.status().message().find(
                "attribute 'then_branch' holds a subgraph; control flow is not supported yet"),
            std::string::npos)
      << nested.status().message();
}

// A chain of 200 000 Relu nodes: imported (and shape-inferred) in one piece, no recursion over
// its length.
TEST(HostileModel, AGraphOfManyNodesImports) {
  const int count = 200000;
  // ValueInfoProto{name "x0", type{tensor_type{elem_type 1, shape{dim{dim_value 4}}}}}
  const std::string type =
      field(1, intField(1, 1) + field(2, field(1, intField(1, 4))));  // TypeProto.tensor_type
  std::string graph = field(11, field(1, "x0") + field(2, type));     // input
  for (int i = 0; i < count; ++i) {
    graph += field(1, field(1, "x" + std::to_string(i)) + field(2, "x" + std::to_string(i + 1)) +
                          field(4, "Relu"));
  }
  graph += field(12, field(1, "x" + std::to_string(count)) + field(2, type));  // output
  auto imported = importModelFromBytes(model(graph + field(2, "chain")), ".");
  ASSERT_TRUE(imported.isOk()) << imported.status().toString();
  EXPECT_EQ(imported->graph.nodes().size(), static_cast<size_t>(count));
  EXPECT_EQ(imported->graph.outputs.at(0)->shape.toString(), "[4]");
}

}  // namespace
}  // namespace kiln::onnx
