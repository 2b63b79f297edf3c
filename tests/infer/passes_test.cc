// Tests for passes.h and memory_plan.h on hand-built graphs, plus the load pipeline on the real
// models in ../shared/models (skipped with a message when absent).
#include "infer/passes/passes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>

#include "infer/onnx_import.h"
#include "infer/op_registry.h"
#include "infer/passes/memory_plan.h"

namespace vigil::infer {
namespace {

using ::testing::HasSubstr;

std::string Msg(const Status& s) { return std::string(s.message()); }

Node MakeNode(std::string name, std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

ValueInfo Info(const std::string& name, DType dtype, const std::vector<Dim>& dims) {
  return ValueInfo{name, dtype, dims, true};
}
Dim D(int64_t v) { return Dim{v, ""}; }
Dim S(const std::string& symbol) { return Dim{-1, symbol}; }

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes) ++counts[n.op_type];
  return counts;
}

// ---- FixInputShapes ---------------------------------------------------------------------------

Graph ImageGraph(std::vector<Dim> dims) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("images", DType::kFloat32, dims));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.nodes.push_back(MakeNode("relu", "Relu", {"images"}, {"y"}));
  return g;
}

TEST(FixInputShapesTest, SymbolicImageDimsTakeUltralyticsMetadata) {
  Graph g = ImageGraph({S("batch"), D(3), S("height"), S("width")});
  g.metadata["imgsz"] = "[480, 640]";
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  EXPECT_EQ(g.types.at("images"), (TensorType{DType::kFloat32, {1, 3, 480, 640}}));
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(g.inputs[0].dims[i].is_static()) << i;
  EXPECT_EQ(g.inputs[0].dims[3].value, 640);
}

TEST(FixInputShapesTest, OverridesFixSymbolicDims) {
  Graph g = ImageGraph({S("batch"), D(3), S("height"), S("width")});
  g.metadata["imgsz"] = "[640, 640]";
  ShapeOverrides o;
  o.batch = 4;
  o.height = 320;
  o.width = 256;
  ASSERT_TRUE(FixInputShapes(g, o).ok());
  EXPECT_EQ(g.types.at("images").shape, (Shape{4, 3, 320, 256}));
}

TEST(FixInputShapesTest, StaticDimContradictedByOverrideIsAnError) {
  Graph g = ImageGraph({D(1), D(3), D(640), D(640)});
  ShapeOverrides o;
  o.height = 320;
  const Status s = FixInputShapes(g, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("'images'"));
  EXPECT_THAT(Msg(s), HasSubstr("dimension 2"));
  EXPECT_THAT(Msg(s), HasSubstr("640"));
  EXPECT_THAT(Msg(s), HasSubstr("320"));
  ShapeOverrides same;
  same.height = 640;  // agreeing with the model is fine
  EXPECT_TRUE(FixInputShapes(g, same).ok());
}

TEST(FixInputShapesTest, SymbolWithoutValueIsAnErrorNamingInputAndSymbol) {
  // An image input without imgsz metadata takes Ultralytics' default 640 (and batch 1).
  Graph g = ImageGraph({S("batch"), D(3), S("height"), S("width")});
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  EXPECT_EQ(g.types.at("images").shape, (Shape{1, 3, 640, 640}));

  Graph tokens;
  Status s;
  tokens.inputs.push_back(Info("tokens", DType::kInt64, {S("seq")}));
  s = FixInputShapes(tokens, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("'tokens'"));
  EXPECT_THAT(Msg(s), HasSubstr("'seq'"));
  ShapeOverrides o;
  o.symbols["seq"] = 7;
  ASSERT_TRUE(FixInputShapes(tokens, o).ok());
  EXPECT_EQ(tokens.types.at("tokens"), (TensorType{DType::kInt64, {7}}));
}

TEST(FixInputShapesTest, SymbolsAreSharedAcrossInputs) {
  Graph g = ImageGraph({S("N"), D(3), D(64), D(64)});
  g.inputs.push_back(Info("ratio", DType::kFloat32, {S("N"), D(2)}));
  ShapeOverrides o;
  o.batch = 2;
  ASSERT_TRUE(FixInputShapes(g, o).ok());
  EXPECT_EQ(g.types.at("ratio").shape, (Shape{2, 2}));
}

TEST(FixInputShapesTest, FullInputShapesWin) {
  Graph g = ImageGraph({S("batch"), D(3), S("h"), S("w")});
  ShapeOverrides o;
  o.input_shapes["images"] = {2, 3, 96, 128};
  o.height = 64;  // input_shapes takes precedence
  ASSERT_TRUE(FixInputShapes(g, o).ok());
  EXPECT_EQ(g.types.at("images").shape, (Shape{2, 3, 96, 128}));

  Graph wrong_rank = ImageGraph({S("batch"), D(3), S("h"), S("w")});
  ShapeOverrides r;
  r.input_shapes["images"] = {3, 96, 128};
  EXPECT_EQ(FixInputShapes(wrong_rank, r).code(), absl::StatusCode::kInvalidArgument);

  Graph unknown = ImageGraph({D(1), D(3), D(8), D(8)});
  ShapeOverrides u;
  u.input_shapes["image"] = {1, 3, 8, 8};
  const Status s = FixInputShapes(unknown, u);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("'image'"));
}

// ---- DequantizeWeights ------------------------------------------------------------------------

// Adds x → DynamicQuantizeLinear and returns the names of (x_q, x_scale, x_zero_point).
std::array<std::string, 3> AddDynamicQuantize(Graph& g, const std::string& x) {
  std::array<std::string, 3> q = {x + "_q", x + "_scale", x + "_zp"};
  g.nodes.push_back(MakeNode(x + "_dql", "DynamicQuantizeLinear", {x}, {q[0], q[1], q[2]}));
  return q;
}

// Adds the quantize_dynamic chain after `op` (ConvInteger or MatMulInteger), as ONNX Runtime
// writes it: op → Cast(float) → Mul(·, Mul(x_scale, w_scale)), ending in `out`.
void AddIntegerChain(Graph& g, const std::string& op, const std::array<std::string, 3>& q, const std::string& w,
                     const std::string& w_zp, const std::string& w_scale, const std::string& out,
                     bool swap_mul_inputs = false) {
  const std::string p = out + "_";
  Node n = MakeNode(p + op, op, {q[0], w, q[2], w_zp}, {p + "int"});
  if (op == "ConvInteger") n.attrs["kernel_shape"] = std::vector<int64_t>{1, 1};
  g.nodes.push_back(n);
  Node cast = MakeNode(p + "cast", "Cast", {p + "int"}, {p + "float"});
  cast.attrs["to"] = int64_t{1};
  g.nodes.push_back(cast);
  std::vector<std::string> scales_in = {q[1], w_scale};
  std::vector<std::string> mul_in = {p + "float", p + "scales"};
  if (swap_mul_inputs) {
    std::swap(scales_in[0], scales_in[1]);
    std::swap(mul_in[0], mul_in[1]);
  }
  g.nodes.push_back(MakeNode(p + "scales_mul", "Mul", scales_in, {p + "scales"}));
  g.nodes.push_back(MakeNode(p + "mul", "Mul", mul_in, {out}));
}

TEST(DequantizeWeightsTest, ConvIntegerChainBecomesFloatConvPerTensor) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(1), D(2), D(2)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.initializers["w_q"] = Tensor::FromVector<uint8_t>({130, 120}, {2, 1, 1, 1});
  g.initializers["w_zp"] = Tensor::Scalar<uint8_t>(128);
  g.initializers["w_scale"] = Tensor::Scalar<float>(0.5f);
  g.initializers["b"] = Tensor::FromVector<float>({0.f, 1.f}, {1, 2, 1, 1});
  const auto q = AddDynamicQuantize(g, "x");
  AddIntegerChain(g, "ConvInteger", q, "w_q", "w_zp", "w_scale", "scaled");
  g.nodes.push_back(MakeNode("bias_add", "Add", {"scaled", "b"}, {"y"}));
  ASSERT_TRUE(ValidateGraph(g).ok());

  ASSERT_TRUE(DequantizeWeights(g, Int8Activation::kFloat).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  ASSERT_EQ(g.nodes.size(), 2u);  // Conv, Add
  const Node& conv = g.nodes[0];
  EXPECT_EQ(conv.op_type, "Conv");
  EXPECT_EQ(conv.GetInts("kernel_shape"), (std::vector<int64_t>{1, 1}));
  ASSERT_EQ(conv.inputs.size(), 2u);
  EXPECT_EQ(conv.inputs[0], "x");
  EXPECT_EQ(conv.outputs, (std::vector<std::string>{"scaled"}));
  const Tensor& w = g.initializers.at(conv.inputs[1]);
  EXPECT_EQ(w.dtype(), DType::kFloat32);
  EXPECT_EQ(w.shape(), (Shape{2, 1, 1, 1}));
  // (130 − 128)·0.5 = 1, (120 − 128)·0.5 = −4
  EXPECT_EQ(Values<float>(w), (std::vector<float>{1.f, -4.f}));
  EXPECT_EQ(g.nodes[1].op_type, "Add");
  EXPECT_FALSE(g.IsInitializer("w_q"));  // now unused
  EXPECT_TRUE(g.IsInitializer("b"));
}

TEST(DequantizeWeightsTest, PerChannelScalesAndSharedDynamicQuantize) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(1), D(2), D(2)}));
  g.outputs.push_back(ValueInfo{"y1", DType::kFloat32, {}, false});
  g.outputs.push_back(ValueInfo{"y2", DType::kFloat32, {}, false});
  g.initializers["w_q"] = Tensor::FromVector<uint8_t>({130, 120}, {2, 1, 1, 1});
  g.initializers["w_zp"] = Tensor::FromVector<uint8_t>({128, 100}, {2});
  g.initializers["w_scale"] = Tensor::FromVector<float>({0.5f, 0.25f}, {2});
  g.initializers["v_q"] = Tensor::FromVector<int8_t>({-3, 5}, {2, 1, 1, 1});
  g.initializers["v_scale"] = Tensor::Scalar<float>(2.f);
  const auto q = AddDynamicQuantize(g, "x");  // feeds both ConvIntegers
  AddIntegerChain(g, "ConvInteger", q, "w_q", "w_zp", "w_scale", "y1", /*swap_mul_inputs=*/true);
  AddIntegerChain(g, "ConvInteger", q, "v_q", "", "v_scale", "y2");  // no weight zero point: 0
  ASSERT_TRUE(ValidateGraph(g).ok());

  ASSERT_TRUE(DequantizeWeights(g, Int8Activation::kFloat).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  EXPECT_EQ(OpCounts(g), (std::map<std::string, int>{{"Conv", 2}}));
  // (130 − 128)·0.5 = 1, (120 − 100)·0.25 = 5; and −3·2, 5·2.
  EXPECT_EQ(Values<float>(g.initializers.at(g.nodes[0].inputs[1])), (std::vector<float>{1.f, 5.f}));
  EXPECT_EQ(Values<float>(g.initializers.at(g.nodes[1].inputs[1])), (std::vector<float>{-6.f, 10.f}));
  EXPECT_EQ(g.nodes[0].outputs[0], "y1");
  EXPECT_EQ(g.nodes[1].outputs[0], "y2");
}

// As exported (EngineOptions::int8_activations kQuantized): the activation goes through one DynamicFakeQuantize
// per DynamicQuantizeLinear, right after where that stood, shared by every convolution it fed.
TEST(DequantizeWeightsTest, QuantizedActivationsGetOneFakeQuantizePerDynamicQuantize) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(1), D(2), D(2)}));
  g.outputs.push_back(ValueInfo{"y1", DType::kFloat32, {}, false});
  g.outputs.push_back(ValueInfo{"y2", DType::kFloat32, {}, false});
  g.initializers["w_q"] = Tensor::FromVector<uint8_t>({130, 120}, {2, 1, 1, 1});
  g.initializers["w_scale"] = Tensor::Scalar<float>(0.5f);
  g.initializers["v_q"] = Tensor::FromVector<int8_t>({-3, 5}, {2, 1, 1, 1});
  g.initializers["v_scale"] = Tensor::Scalar<float>(2.f);
  const auto q = AddDynamicQuantize(g, "x");
  AddIntegerChain(g, "ConvInteger", q, "w_q", "", "w_scale", "y1");
  AddIntegerChain(g, "ConvInteger", q, "v_q", "", "v_scale", "y2");
  Graph exact = g;
  ASSERT_TRUE(DequantizeWeights(g, Int8Activation::kFakeQuantized).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  EXPECT_EQ(OpCounts(g), (std::map<std::string, int>{{"Conv", 2}, {"DynamicFakeQuantize", 1}}));
  ASSERT_EQ(g.nodes.size(), 3u);
  const Node& fq = g.nodes[0];
  EXPECT_EQ(fq.domain, "vigil");
  EXPECT_EQ(fq.op_type, "DynamicFakeQuantize");
  EXPECT_EQ(fq.inputs, (std::vector<std::string>{"x"}));
  EXPECT_EQ(g.nodes[1].inputs[0], fq.outputs[0]);
  EXPECT_EQ(g.nodes[2].inputs[0], fq.outputs[0]);
  EXPECT_EQ(Values<float>(g.initializers.at(g.nodes[1].inputs[1])), (std::vector<float>{65.f, 60.f}));  // no zp: q·0.5

  // Exact products: the centered activation and unscaled integer weights; the export's scale Mul (now reading the
  // DynamicFakeQuantize's scale) and output Mul stay.
  ASSERT_TRUE(DequantizeWeights(exact, Int8Activation::kExactProducts).ok());
  ASSERT_TRUE(ValidateGraph(exact).ok());
  EXPECT_EQ(OpCounts(exact), (std::map<std::string, int>{{"Conv", 2}, {"DynamicFakeQuantize", 1}, {"Mul", 4}}));
  const Node& cq = exact.nodes[0];
  ASSERT_EQ(cq.op_type, "DynamicFakeQuantize");
  EXPECT_EQ(cq.GetInt("centered", 0), 1);
  ASSERT_EQ(cq.outputs.size(), 2u);
  for (const Node& n : exact.nodes) {
    if (n.op_type == "Conv") {
      EXPECT_EQ(n.inputs[0], cq.outputs[0]);
      const std::vector<float> w = Values<float>(exact.initializers.at(n.inputs[1]));
      EXPECT_TRUE(w == (std::vector<float>{130.f, 120.f}) || w == (std::vector<float>{-3.f, 5.f})) << n.name;
    }
    if (n.op_type == "Mul" && n.name.find("scales_mul") != std::string::npos) {
      EXPECT_EQ(n.inputs[0], cq.outputs[1]) << "the scale product reads the DynamicFakeQuantize's scale";
    }
  }
}

TEST(DequantizeWeightsTest, MatMulIntegerWithPerColumnScales) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("a", DType::kFloat32, {D(2), D(3)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.initializers["b_q"] = Tensor::FromVector<uint8_t>({129, 130, 127, 126, 128, 128}, {3, 2});
  g.initializers["b_zp"] = Tensor::FromVector<uint8_t>({128, 126}, {2});
  g.initializers["b_scale"] = Tensor::FromVector<float>({1.f, 0.5f}, {2});
  AddIntegerChain(g, "MatMulInteger", AddDynamicQuantize(g, "a"), "b_q", "b_zp", "b_scale", "y");
  ASSERT_TRUE(DequantizeWeights(g, Int8Activation::kFloat).ok());
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "MatMul");
  EXPECT_EQ(g.nodes[0].inputs[0], "a");
  // column 0: (q − 128)·1; column 1: (q − 126)·0.5
  EXPECT_EQ(Values<float>(g.initializers.at(g.nodes[0].inputs[1])), (std::vector<float>{1, 2, -1, 0, 0, 1}));
}

TEST(DequantizeWeightsTest, LeavesOtherPatternsAlone) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(1), D(1), D(1)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.initializers["w_q"] = Tensor::FromVector<uint8_t>({1}, {1, 1, 1, 1});
  g.initializers["w_scale"] = Tensor::Scalar<float>(1.f);
  AddIntegerChain(g, "ConvInteger", AddDynamicQuantize(g, "x"), "w_q", "", "w_scale", "y");
  g.nodes[2].attrs["to"] = int64_t{6};  // Cast to int32: not the dequantization chain
  const size_t before = g.nodes.size();
  ASSERT_TRUE(DequantizeWeights(g, Int8Activation::kFloat).ok());
  EXPECT_EQ(g.nodes.size(), before);
  EXPECT_EQ(g.nodes[1].op_type, "ConvInteger");
}

// ---- InferShapesAndFold -----------------------------------------------------------------------

// Skips the calling test when an op it needs has no schema yet.
#define REQUIRE_OPS(...)                                                             \
  for (const char* op : {__VA_ARGS__}) {                                             \
    if (!FindOp("", op)) GTEST_SKIP() << "op '" << op << "' has no schema in this build"; \
  }

TEST(InferShapesAndFoldTest, FoldsConstantSubgraphsAndTypesEveryValue) {
  REQUIRE_OPS("Add", "Mul");
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(2), D(3)}));
  g.outputs.push_back(Info("y", DType::kFloat32, {D(2), D(3)}));
  g.initializers["a"] = Tensor::FromVector<float>({1.f, 2.f, 3.f}, {3});
  g.initializers["b"] = Tensor::FromVector<float>({0.5f, -2.f, 10.f}, {3});
  g.nodes.push_back(MakeNode("add", "Add", {"a", "b"}, {"c"}));
  g.nodes.push_back(MakeNode("mul", "Mul", {"x", "c"}, {"y"}));
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  ASSERT_TRUE(InferShapesAndFold(g).ok());
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].name, "mul");
  ASSERT_TRUE(g.IsInitializer("c"));
  EXPECT_EQ(Values<float>(g.initializers.at("c")), (std::vector<float>{1.5f, 0.f, 13.f}));
  EXPECT_EQ(g.types.at("c"), (TensorType{DType::kFloat32, {3}}));
  EXPECT_EQ(g.types.at("y"), (TensorType{DType::kFloat32, {2, 3}}));
  EXPECT_EQ(g.types.at("x"), (TensorType{DType::kFloat32, {2, 3}}));
  EXPECT_TRUE(ValidateGraph(g).ok());
}

TEST(InferShapesAndFoldTest, ShapeOfAStaticValueFolds) {
  REQUIRE_OPS("Shape", "Relu", "Reshape");
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(3), D(4)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.nodes.push_back(MakeNode("relu", "Relu", {"x"}, {"r"}));
  Node shape = MakeNode("shape", "Shape", {"r"}, {"s"});  // r is computed, but its shape is known
  shape.attrs["start"] = int64_t{1};                        // Shape-15: dims [1, rank) = [3, 4]
  g.nodes.push_back(shape);
  g.nodes.push_back(MakeNode("reshape", "Reshape", {"x", "s"}, {"y"}));
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  ASSERT_TRUE(InferShapesAndFold(g).ok());
  EXPECT_EQ(OpCounts(g), (std::map<std::string, int>{{"Relu", 1}, {"Reshape", 1}}));
  ASSERT_TRUE(g.IsInitializer("s"));
  EXPECT_EQ(Values<int64_t>(g.initializers.at("s")), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(g.types.at("y").shape, (Shape{3, 4}));
  EXPECT_EQ(g.outputs[0].dims.size(), 2u);  // the graph output now carries the static shape
}

TEST(InferShapesAndFoldTest, UnsupportedOpNamesOpNodeAndOpset) {
  Graph g;
  g.opset = 17;
  g.opset_imports = {{"", 17}, {"com.example", 2}};
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.nodes.push_back(MakeNode("mystery", "FooBar", {"x"}, {"y"}));
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  Status s = InferShapesAndFold(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Msg(s), "unsupported op 'FooBar' (node 'mystery', opset 17)");
  g.nodes[0].domain = "com.example";
  s = InferShapesAndFold(g);
  EXPECT_THAT(Msg(s), HasSubstr("unsupported op 'com.example.FooBar' (node 'mystery', opset 2)"));
}

TEST(InferShapesAndFoldTest, NeedsInputTypesAndChecksDeclaredOutputs) {
  REQUIRE_OPS("Relu");
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(2), D(3)}));
  g.outputs.push_back(Info("y", DType::kFloat32, {D(2), D(4)}));  // wrong: Relu keeps [2,3]
  g.nodes.push_back(MakeNode("relu", "Relu", {"x"}, {"y"}));
  EXPECT_EQ(InferShapesAndFold(g).code(), absl::StatusCode::kFailedPrecondition);  // no FixInputShapes
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  const Status s = InferShapesAndFold(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("graph output 'y'"));
  EXPECT_THAT(Msg(s), HasSubstr("[2,3]"));
}

// ---- RemoveNoOps, FuseConvActivation, EliminateDeadNodes --------------------------------------

// ---- SlicesToSplit ---------------------------------------------------------------------------------

// x [1, 32, 4, 4] → Relu → r, and Slices of r along axis 1 with the given [start, end) (steps 1, or `steps`).
Graph SlicedGraph(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t step = 1) {
  Graph g;
  g.opset = 17;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(32), D(4), D(4)}));
  g.types["x"] = TensorType{DType::kFloat32, {1, 32, 4, 4}};
  g.nodes.push_back(MakeNode("relu", "Relu", {"x"}, {"r"}));
  g.types["r"] = TensorType{DType::kFloat32, {1, 32, 4, 4}};
  g.initializers["axis"] = Tensor::FromVector<int64_t>({1}, {1});
  g.initializers["step"] = Tensor::FromVector<int64_t>({step}, {1});
  for (size_t i = 0; i < ranges.size(); ++i) {
    const std::string k = std::to_string(i);
    g.initializers["s" + k] = Tensor::FromVector<int64_t>({ranges[i].first}, {1});
    g.initializers["e" + k] = Tensor::FromVector<int64_t>({ranges[i].second}, {1});
    g.nodes.push_back(MakeNode("slice" + k, "Slice", {"r", "s" + k, "e" + k, "axis", "step"}, {"y" + k}));
    g.outputs.push_back(ValueInfo{"y" + k, DType::kFloat32, {}, false});
  }
  return g;
}

TEST(SlicesToSplitTest, SlicesTilingAnAxisBecomeOneSplitInRangeOrder) {
  // Written out of order, the last one's end past the axis and negative starts counted from the back (ONNX clamping).
  Graph g = SlicedGraph({{-8, 9223372036854775807LL}, {0, 16}, {16, -8}});
  ASSERT_TRUE(SlicesToSplit(g).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  EXPECT_EQ(OpCounts(g), (std::map<std::string, int>{{"Relu", 1}, {"Split", 1}}));
  const Node& split = g.nodes[1];
  EXPECT_EQ(split.GetInt("axis", -1), 1);
  EXPECT_EQ(split.outputs, (std::vector<std::string>{"y1", "y2", "y0"}));
  ASSERT_EQ(split.inputs.size(), 2u);
  EXPECT_EQ(Values<int64_t>(g.initializers.at(split.inputs[1])), (std::vector<int64_t>{16, 8, 8}));
  EXPECT_FALSE(g.IsInitializer("s0")) << "the Slices' bounds are gone";
}

TEST(SlicesToSplitTest, LeavesSlicesThatDoNotSplitExactly) {
  for (const auto& ranges : std::vector<std::vector<std::pair<int64_t, int64_t>>>{
           {{0, 16}, {17, 32}},            // a gap
           {{0, 16}, {8, 32}},             // an overlap
           {{0, 16}},                      // one Slice: nothing to merge
           {{0, 16}, {16, 24}}}) {         // not the whole axis
    Graph g = SlicedGraph(ranges);
    const size_t before = g.nodes.size();
    ASSERT_TRUE(SlicesToSplit(g).ok());
    EXPECT_EQ(g.nodes.size(), before);
  }
  Graph strided = SlicedGraph({{0, 16}, {16, 32}}, 2);  // step 2
  ASSERT_TRUE(SlicesToSplit(strided).ok());
  EXPECT_EQ(OpCounts(strided).count("Split"), 0u);
}

TEST(RemoveNoOpsTest, BypassesIdentitiesAndKeepsGraphOutputNames) {
  Graph g;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(4)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.outputs.push_back(ValueInfo{"x_copy", DType::kFloat32, {}, false});
  g.nodes.push_back(MakeNode("relu", "Relu", {"x"}, {"r"}));
  g.nodes.push_back(MakeNode("id1", "Identity", {"r"}, {"r1"}));
  g.nodes.push_back(MakeNode("sig", "Sigmoid", {"r1"}, {"s"}));
  g.nodes.push_back(MakeNode("id2", "Identity", {"s"}, {"y"}));
  g.nodes.push_back(MakeNode("id3", "Identity", {"x"}, {"x_copy"}));  // input → output: must stay
  ASSERT_TRUE(RemoveNoOps(g).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(g.nodes[0].name, "relu");
  EXPECT_EQ(g.nodes[1].name, "sig");
  EXPECT_EQ(g.nodes[1].inputs[0], "r");
  EXPECT_EQ(g.nodes[1].outputs[0], "y");  // the producer took the graph output's name
  EXPECT_EQ(g.nodes[2].name, "id3");
}

TEST(RemoveNoOpsTest, RemovesShapePreservingReshapeAndSameTypeCast) {
  Graph g;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(4)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.initializers["same"] = Tensor::FromVector<int64_t>({1, 4}, {2});
  g.initializers["flat"] = Tensor::FromVector<int64_t>({4}, {1});
  g.nodes.push_back(MakeNode("keep_shape", "Reshape", {"x", "same"}, {"a"}));
  Node cast = MakeNode("cast", "Cast", {"a"}, {"b"});
  cast.attrs["to"] = int64_t{1};
  g.nodes.push_back(cast);
  g.nodes.push_back(MakeNode("flatten", "Reshape", {"b", "flat"}, {"y"}));
  g.types = {{"x", {DType::kFloat32, {1, 4}}}, {"a", {DType::kFloat32, {1, 4}}},
             {"b", {DType::kFloat32, {1, 4}}}, {"y", {DType::kFloat32, {4}}}};
  ASSERT_TRUE(RemoveNoOps(g).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].name, "flatten");
  EXPECT_EQ(g.nodes[0].inputs[0], "x");
}

Graph ConvGraph() {
  Graph g;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1), D(1), D(3), D(3)}));
  g.outputs.push_back(ValueInfo{"y", DType::kFloat32, {}, false});
  g.initializers["w"] = Tensor::FromVector<float>({1.f, -1.f}, {2, 1, 1, 1});
  Node conv = MakeNode("conv", "Conv", {"x", "w"}, {"c"});
  conv.attrs["strides"] = std::vector<int64_t>{1, 1};
  g.nodes.push_back(conv);
  return g;
}

TEST(FuseConvActivationTest, FusesSiLUInEitherMulOrder) {
  for (bool sigmoid_first : {false, true}) {
    SCOPED_TRACE(sigmoid_first ? "Mul(sigmoid, conv)" : "Mul(conv, sigmoid)");
    Graph g = ConvGraph();
    g.nodes.push_back(MakeNode("sig", "Sigmoid", {"c"}, {"s"}));
    g.nodes.push_back(MakeNode("mul", "Mul", sigmoid_first ? std::vector<std::string>{"s", "c"}
                                                           : std::vector<std::string>{"c", "s"},
                               {"y"}));
    g.nodes.push_back(MakeNode("tail", "Relu", {"x"}, {"unrelated"}));
    ASSERT_TRUE(FuseConvActivation(g).ok());
    ASSERT_TRUE(ValidateGraph(g).ok());
    ASSERT_EQ(g.nodes.size(), 2u);
    const Node& f = g.nodes[0];
    EXPECT_EQ(f.domain, "vigil");
    EXPECT_EQ(f.op_type, "FusedConv");
    EXPECT_EQ(f.GetString("activation", ""), "SiLU");
    EXPECT_EQ(f.GetInts("strides"), (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(f.inputs, (std::vector<std::string>{"x", "w"}));
    EXPECT_EQ(f.outputs, (std::vector<std::string>{"y"}));
    EXPECT_EQ(g.nodes[1].name, "tail");
  }
}

TEST(FuseConvActivationTest, FusesRelu) {
  Graph g = ConvGraph();
  g.nodes.push_back(MakeNode("relu", "Relu", {"c"}, {"y"}));
  ASSERT_TRUE(FuseConvActivation(g).ok());
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "FusedConv");
  EXPECT_EQ(g.nodes[0].GetString("activation", ""), "Relu");
  EXPECT_EQ(g.nodes[0].outputs[0], "y");
}

TEST(FuseConvActivationTest, LeavesConvWithOtherConsumersOrGraphOutput) {
  Graph g = ConvGraph();
  g.nodes.push_back(MakeNode("sig", "Sigmoid", {"c"}, {"s"}));
  g.nodes.push_back(MakeNode("mul", "Mul", {"c", "s"}, {"m"}));
  g.nodes.push_back(MakeNode("other", "Add", {"c", "m"}, {"y"}));  // a third reader of c
  ASSERT_TRUE(FuseConvActivation(g).ok());
  EXPECT_EQ(g.nodes.size(), 4u);
  EXPECT_EQ(g.nodes[0].op_type, "Conv");

  Graph out = ConvGraph();
  out.outputs.push_back(ValueInfo{"c", DType::kFloat32, {}, false});  // the Conv output is a graph output
  out.nodes.push_back(MakeNode("relu", "Relu", {"c"}, {"y"}));
  ASSERT_TRUE(FuseConvActivation(out).ok());
  EXPECT_EQ(out.nodes.size(), 2u);
  EXPECT_EQ(out.nodes[0].op_type, "Conv");
}

TEST(FuseConvActivationTest, AbsorbsAChannelBiasAddBeforeTheActivation) {
  Graph g = ConvGraph();
  g.initializers["b0"] = Tensor::FromVector<float>({1.f, 2.f}, {2});
  g.nodes[0].inputs.push_back("b0");
  g.initializers["b"] = Tensor::FromVector<float>({0.5f, -1.f}, {1, 2, 1, 1});
  g.nodes.push_back(MakeNode("bias", "Add", {"b", "c"}, {"cb"}));
  g.nodes.push_back(MakeNode("sig", "Sigmoid", {"cb"}, {"s"}));
  g.nodes.push_back(MakeNode("mul", "Mul", {"cb", "s"}, {"y"}));
  ASSERT_TRUE(FuseConvActivation(g).ok());
  ASSERT_TRUE(ValidateGraph(g).ok());
  ASSERT_EQ(g.nodes.size(), 1u);
  const Node& f = g.nodes[0];
  EXPECT_EQ(f.op_type, "FusedConv");
  EXPECT_EQ(f.GetString("activation", ""), "SiLU");
  ASSERT_EQ(f.inputs.size(), 3u);
  const Tensor& bias = g.initializers.at(f.inputs[2]);
  EXPECT_EQ(bias.shape(), (Shape{2}));
  EXPECT_EQ(Values<float>(bias), (std::vector<float>{1.5f, 1.f}));

  Graph full = ConvGraph();  // an Add of a full-size tensor is not a bias
  full.initializers["t"] = Tensor(DType::kFloat32, {1, 2, 3, 3});
  full.nodes.push_back(MakeNode("add", "Add", {"c", "t"}, {"y"}));
  ASSERT_TRUE(FuseConvActivation(full).ok());
  EXPECT_EQ(OpCounts(full), (std::map<std::string, int>{{"Add", 1}, {"Conv", 1}}));
}

TEST(EliminateDeadNodesTest, DropsUnreachableNodesAndUnusedInitializers) {
  Graph g = ConvGraph();
  g.initializers["unused"] = Tensor::Scalar<float>(0.f);
  g.initializers["k"] = Tensor::Scalar<float>(2.f);
  g.nodes.push_back(MakeNode("dead", "Mul", {"c", "k"}, {"d"}));
  g.nodes.push_back(MakeNode("dead2", "Relu", {"d"}, {"d2"}));
  g.nodes.push_back(MakeNode("live", "Relu", {"c"}, {"y"}));
  ASSERT_TRUE(EliminateDeadNodes(g).ok());
  EXPECT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[1].name, "live");
  EXPECT_EQ(g.initializers.size(), 1u);
  EXPECT_TRUE(g.IsInitializer("w"));
}

// ---- PlanMemory -------------------------------------------------------------------------------

TEST(PlanMemoryTest, ChainReusesTwoBuffers) {
  Graph g;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(1000)}));
  g.types["x"] = {DType::kFloat32, {1000}};
  std::string prev = "x";
  for (int i = 0; i < 8; ++i) {
    const std::string out = "v" + std::to_string(i);
    g.nodes.push_back(MakeNode("relu" + std::to_string(i), "Relu", {prev}, {out}));
    g.types[out] = {DType::kFloat32, {1000}};
    prev = out;
  }
  g.outputs.push_back(ValueInfo{prev, DType::kFloat32, {}, false});
  const MemoryPlan plan = PlanMemory(g, 64);
  // 4000 bytes round up to 4032; a chain needs only a producer's input and output at once.
  EXPECT_EQ(plan.unshared_bytes, 8u * 4032u);
  EXPECT_EQ(plan.arena_bytes, 2u * 4032u);
  EXPECT_EQ(plan.offsets.size(), 8u);
}

TEST(PlanMemoryTest, ValuesLiveAtTheSameTimeNeverShareBytes) {
  std::random_device rd;
  const unsigned seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Graph g;
  g.inputs.push_back(Info("x", DType::kFloat32, {D(16)}));
  g.types["x"] = {DType::kFloat32, {16}};
  std::vector<std::string> values = {"x"};
  const int n = 40;
  for (int i = 0; i < n; ++i) {  // each node reads the previous value and one random earlier one
    const std::string out = "v" + std::to_string(i);
    const std::string skip = values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
    g.nodes.push_back(MakeNode("n" + std::to_string(i), "Add", {values.back(), skip}, {out}));
    g.types[out] = {DType::kFloat32, {std::uniform_int_distribution<int64_t>(1, 5000)(rng)}};
    values.push_back(out);
  }
  g.outputs.push_back(ValueInfo{values.back(), DType::kFloat32, {}, false});
  g.outputs.push_back(ValueInfo{values[n / 2], DType::kFloat32, {}, false});
  const size_t alignment = 64;
  const MemoryPlan plan = PlanMemory(g, alignment);

  // Lifetimes computed here independently: [producer index, last reader index or end].
  std::map<std::string, std::pair<size_t, size_t>> life;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    life[g.nodes[i].outputs[0]] = {i, i};
    for (const std::string& in : g.nodes[i].inputs) {
      if (life.count(in)) life[in].second = i;
    }
  }
  for (const ValueInfo& out : g.outputs) life[out.name].second = g.nodes.size();
  ASSERT_EQ(plan.offsets.size(), life.size());
  size_t total = 0;
  for (const auto& [a, la] : life) {
    const size_t off_a = plan.offsets.at(a);
    const size_t size_a = static_cast<size_t>(g.types.at(a).shape[0]) * 4;
    EXPECT_EQ(off_a % alignment, 0u) << a;
    EXPECT_LE(off_a + size_a, plan.arena_bytes) << a;
    total += size_a;
    for (const auto& [b, lb] : life) {
      if (a >= b || la.first > lb.second || lb.first > la.second) continue;  // lifetimes disjoint
      const size_t off_b = plan.offsets.at(b);
      const size_t size_b = static_cast<size_t>(g.types.at(b).shape[0]) * 4;
      EXPECT_TRUE(off_a + size_a <= off_b || off_b + size_b <= off_a)
          << a << " [" << off_a << ", +" << size_a << ") overlaps " << b << " [" << off_b << ", +" << size_b << ")";
    }
  }
  EXPECT_GE(plan.unshared_bytes, total);
  EXPECT_LE(plan.arena_bytes, plan.unshared_bytes);
}

// ---- The load pipeline on the real models -----------------------------------------------------

std::string ModelsDir() {
  const char* env = std::getenv("VIGIL_SOURCE_DIR");
  return std::string(env ? env : VIGIL_SOURCE_DIR) + "/../shared/models";
}

// Runs the passes in Engine::Load's order (passes.h).
void RunPipeline(Graph& g) {
  ASSERT_TRUE(FixInputShapes(g, {}).ok());
  ASSERT_TRUE(DequantizeWeights(g, Int8Activation::kFloat).ok());
  Status s = InferShapesAndFold(g);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(RemoveNoOps(g).ok());
  ASSERT_TRUE(FuseConvActivation(g).ok());
  ASSERT_TRUE(EliminateDeadNodes(g).ok());
  s = InferShapesAndFold(g);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(ValidateGraph(g).ok());
}

// Ops of `g` that have no schema in this build, as "Op1 Op2".
std::string MissingOps(const Graph& g) {
  std::set<std::string> missing;
  for (const Node& n : g.nodes) {
    if (!FindOp(n.domain, n.op_type)) missing.insert(n.op_type);
  }
  if (!FindOp("", "Conv")) missing.insert("Conv");
  if (!FindOp("vigil", "FusedConv")) missing.insert("FusedConv");
  std::string s;
  for (const std::string& op : missing) s += op + " ";
  return s;
}

TEST(RealModelPassesTest, DequantizesYoloV8nInt8) {
  const std::string path = ModelsDir() + "/yolov8n_coco_640_int8dyn.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  StatusOr<Graph> g = ImportOnnxFile(path);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(DequantizeWeights(*g, Int8Activation::kFloat).ok());
  ASSERT_TRUE(ValidateGraph(*g).ok());
  // SOURCES.md: 610 nodes; each of the 64 chains loses its Cast, output Mul and scale Mul, and all
  // 59 DynamicQuantizeLinear nodes fall away: 610 − 3·64 − 59 = 359.
  EXPECT_EQ(g->nodes.size(), 359u);
  const auto counts = OpCounts(*g);
  EXPECT_EQ(counts.at("Conv"), 64);
  EXPECT_EQ(counts.at("Mul"), 186 - 2 * 64);
  EXPECT_EQ(counts.count("ConvInteger") + counts.count("DynamicQuantizeLinear") + counts.count("Cast"), 0u);
  size_t quantized = 0;
  for (const auto& [name, t] : g->initializers) quantized += t.dtype() == DType::kUInt8;
  EXPECT_EQ(quantized, 0u);
}

TEST(RealModelPassesTest, YoloV8nInt8AsExportedKeepsEveryActivationQuantization) {
  const std::string path = ModelsDir() + "/yolov8n_coco_640_int8dyn.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  StatusOr<Graph> g = ImportOnnxFile(path);
  ASSERT_TRUE(g.ok()) << g.status();
  Graph exact = *g;
  ASSERT_TRUE(DequantizeWeights(*g, Int8Activation::kFakeQuantized).ok());
  ASSERT_TRUE(ValidateGraph(*g).ok());
  const auto counts = OpCounts(*g);
  EXPECT_EQ(counts.at("Conv"), 64);
  EXPECT_EQ(counts.at("DynamicFakeQuantize"), 59) << "one per DynamicQuantizeLinear of the file";
  EXPECT_EQ(g->nodes.size(), 359u + 59u);
  // Exact products: each chain keeps its output Mul and scale Mul (610 − 64 Casts − 59 DynamicQuantizeLinears
  // + 59 DynamicFakeQuantizes).
  ASSERT_TRUE(DequantizeWeights(exact, Int8Activation::kExactProducts).ok());
  ASSERT_TRUE(ValidateGraph(exact).ok());
  EXPECT_EQ(exact.nodes.size(), 610u - 64u);
  EXPECT_EQ(OpCounts(exact).at("Mul"), 186);
  EXPECT_EQ(OpCounts(exact).count("ConvInteger") + OpCounts(exact).count("DynamicQuantizeLinear"), 0u);
}

TEST(RealModelPassesTest, YoloV8nInt8LoadPipeline) {
  const std::string path = ModelsDir() + "/yolov8n_coco_640_int8dyn.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  StatusOr<Graph> g = ImportOnnxFile(path);
  ASSERT_TRUE(g.ok()) << g.status();
  Graph dq = *g;
  ASSERT_TRUE(DequantizeWeights(dq, Int8Activation::kFloat).ok());
  if (const std::string missing = MissingOps(dq); !missing.empty()) GTEST_SKIP() << "ops without schema: " << missing;
  RunPipeline(*g);
  EXPECT_EQ(g->types.at("output0"), (TensorType{DType::kFloat32, {1, 84, 8400}}));
  // 63 bias Reshapes fold, 63 bias Adds join their Conv, 57 Conv+Sigmoid+Mul become SiLU FusedConvs.
  EXPECT_EQ(OpCounts(*g), (std::map<std::string, int>{
                              {"FusedConv", 57}, {"Conv", 7}, {"Add", 8}, {"Reshape", 8}, {"Mul", 1},
                              {"Sigmoid", 1}, {"Concat", 17}, {"Split", 8}, {"MaxPool", 3}, {"Resize", 2},
                              {"Slice", 2}, {"Sub", 2}, {"Transpose", 1}, {"Softmax", 1}, {"Div", 1}}));
  std::cout << "yolov8n int8: 610 nodes imported, " << g->nodes.size() << " after the load passes\n";
}

TEST(RealModelPassesTest, YoloxNanoLoadPipeline) {
  const std::string path = ModelsDir() + "/yolox_nano_coco_416_fp32.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  StatusOr<Graph> g = ImportOnnxFile(path);
  ASSERT_TRUE(g.ok()) << g.status();
  if (const std::string missing = MissingOps(*g); !missing.empty()) GTEST_SKIP() << "ops without schema: " << missing;
  RunPipeline(*g);
  EXPECT_EQ(g->types.at("output"), (TensorType{DType::kFloat32, {1, 3549, 85}}));
  // SOURCES.md op counts; 104 of the 113 Convs end in SiLU (the 9 head prediction Convs do not).
  EXPECT_EQ(OpCounts(*g), (std::map<std::string, int>{{"FusedConv", 104}, {"Conv", 9}, {"Sigmoid", 6},
                                                        {"Concat", 18}, {"Slice", 8}, {"Add", 7},
                                                        {"MaxPool", 3}, {"Reshape", 3}, {"Resize", 2},
                                                        {"Transpose", 1}}));
  std::cout << "yolox nano: 369 nodes imported, " << g->nodes.size() << " after the load passes\n";
}

}  // namespace
}  // namespace vigil::infer
