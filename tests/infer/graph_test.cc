// Tests for graph.h: attribute accessors, TopologicalSort, ValidateGraph.
#include "vigil/infer/graph.h"

#include "absl/strings/match.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace vigil::infer {
namespace {

using ::testing::HasSubstr;

Node MakeNode(std::string name, std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// x → a → b → y, stored out of order.
Graph ChainGraph() {
  Graph g;
  g.inputs.push_back(ValueInfo{"x", DType::kFloat32, {Dim{1, ""}}, true});
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.nodes.push_back(MakeNode("n2", "Relu", {"b"}, {"y"}));
  g.nodes.push_back(MakeNode("n0", "Relu", {"x"}, {"a"}));
  g.nodes.push_back(MakeNode("n1", "Relu", {"a"}, {"b"}));
  return g;
}

TEST(NodeTest, AccessorsReadTheirKindAndFallBackOtherwise) {
  Node n = MakeNode("conv", "Conv", {"x", "", "w", ""}, {"y"});
  n.attrs["group"] = int64_t{4};
  n.attrs["alpha"] = 0.25f;
  n.attrs["mode"] = std::string("nearest");
  n.attrs["pads"] = std::vector<int64_t>{1, 2, 3, 4};
  n.attrs["scales"] = std::vector<float>{1.5f, 2.f};
  n.attrs["value"] = Tensor::Scalar<float>(7.f);

  EXPECT_EQ(n.GetInt("group", 1), 4);
  EXPECT_EQ(n.GetInt("alpha", -1), -1);  // a float is not an int
  EXPECT_EQ(n.GetInt("missing", 9), 9);
  EXPECT_FLOAT_EQ(n.GetFloat("alpha", 0.f), 0.25f);
  EXPECT_FLOAT_EQ(n.GetFloat("group", 0.f), 4.f);  // an int reads as float
  EXPECT_FLOAT_EQ(n.GetFloat("mode", -1.f), -1.f);
  EXPECT_EQ(n.GetString("mode", ""), "nearest");
  EXPECT_EQ(n.GetString("group", "none"), "none");
  EXPECT_EQ(n.GetInts("pads"), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(n.GetInts("missing", {5}), (std::vector<int64_t>{5}));
  EXPECT_EQ(n.GetFloats("scales"), (std::vector<float>{1.5f, 2.f}));
  EXPECT_EQ(n.GetFloats("pads"), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  ASSERT_NE(n.GetTensor("value"), nullptr);
  EXPECT_FLOAT_EQ(n.GetTensor("value")->data<float>()[0], 7.f);
  EXPECT_EQ(n.GetTensor("group"), nullptr);
  EXPECT_EQ(n.NumInputs(), 3u);  // "x", "", "w": the trailing omitted input does not count
  EXPECT_TRUE(n.HasInput(2));
  EXPECT_FALSE(n.HasInput(1));
  EXPECT_EQ(n.Describe(), "node 'conv' (Conv)");
}

TEST(GraphTest, FindInitializer) {
  Graph g;
  g.initializers["w"] = Tensor::Scalar<int64_t>(3);
  ASSERT_NE(g.FindInitializer("w"), nullptr);
  EXPECT_EQ(g.FindInitializer("w")->data<int64_t>()[0], 3);
  EXPECT_EQ(g.FindInitializer("x"), nullptr);
}

TEST(TopologicalSortTest, OrdersAChainAndValidates) {
  Graph g = ChainGraph();
  EXPECT_FALSE(ValidateGraph(g).ok());  // n2 reads "b" before n1 defines it
  ASSERT_TRUE(TopologicalSort(g).ok());
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes[0].name, "n0");
  EXPECT_EQ(g.nodes[1].name, "n1");
  EXPECT_EQ(g.nodes[2].name, "n2");
  EXPECT_TRUE(ValidateGraph(g).ok());
}

TEST(TopologicalSortTest, KeepsFileOrderAmongIndependentNodes) {
  Graph g;
  g.inputs.push_back(ValueInfo{"x", DType::kFloat32, {}, false});
  g.outputs.push_back(ValueInfo{"s", DType::kFloat32, {}, false});
  g.nodes.push_back(MakeNode("c", "Relu", {"x"}, {"c_out"}));
  g.nodes.push_back(MakeNode("sum", "Sum", {"a_out", "b_out", "c_out"}, {"s"}));
  g.nodes.push_back(MakeNode("a", "Relu", {"x"}, {"a_out"}));
  g.nodes.push_back(MakeNode("b", "Relu", {"x"}, {"b_out"}));
  ASSERT_TRUE(TopologicalSort(g).ok());
  std::vector<std::string> names;
  for (const Node& n : g.nodes) names.push_back(n.name);
  EXPECT_EQ(names, (std::vector<std::string>{"c", "a", "b", "sum"}));
}

TEST(TopologicalSortTest, NamesANodeOnACycle) {
  Graph g = ChainGraph();
  g.nodes[1].inputs = {"b"};  // n0 now reads n1's output, and n1 reads n0's: a cycle
  g.nodes.push_back(MakeNode("feeder", "Relu", {"x"}, {"unused"}));
  const Status s = TopologicalSort(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cycle"));
  const bool names_cycle_node = absl::StrContains(s.message(), "'n0'") || absl::StrContains(s.message(), "'n1'");
  EXPECT_TRUE(names_cycle_node) << s.message();
}

TEST(TopologicalSortTest, RejectsADanglingInput) {
  Graph g = ChainGraph();
  g.nodes[2].inputs = {"nowhere"};
  const Status s = TopologicalSort(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 'n1' (Relu)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'nowhere'"));
}

TEST(TopologicalSortTest, RejectsAValueProducedTwice) {
  Graph g = ChainGraph();
  g.nodes.push_back(MakeNode("again", "Relu", {"x"}, {"a"}));
  const Status s = TopologicalSort(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'a'"));
}

TEST(ValidateGraphTest, NamesNodeOpAndInput) {
  Graph g = ChainGraph();
  ASSERT_TRUE(TopologicalSort(g).ok());
  g.nodes[1].inputs = {"ghost"};
  const Status s = ValidateGraph(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 'n1' (Relu): input 'ghost'"));
}

TEST(ValidateGraphTest, RejectsAnUnproducedGraphOutput) {
  Graph g = ChainGraph();
  ASSERT_TRUE(TopologicalSort(g).ok());
  g.outputs.push_back(ValueInfo{"z", DType::kFloat32, {}, false});
  const Status s = ValidateGraph(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("graph output 'z'"));
}

TEST(ValidateGraphTest, AcceptsInitializersAndOmittedInputs) {
  Graph g = ChainGraph();
  ASSERT_TRUE(TopologicalSort(g).ok());
  g.initializers["w"] = Tensor::Scalar<float>(1.f);
  g.nodes[1].inputs = {"a", "", "w"};
  EXPECT_TRUE(ValidateGraph(g).ok());
  g.nodes[1].outputs = {"w"};  // an output may not redefine an initializer
  const Status s = ValidateGraph(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 'n1' (Relu): output 'w'"));
}

}  // namespace
}  // namespace vigil::infer
