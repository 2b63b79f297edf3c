// Tests for onnx_import.h: models built with the ONNX protobuf API, serialized, and imported.
#include "infer/onnx_import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#ifndef ONNX_ML
#define ONNX_ML 1  // the test target gets libonnx only through vigil_infer's link interface
#endif
#include <onnx/onnx_pb.h>

namespace vigil::infer {
namespace {

using ::testing::HasSubstr;

std::string Msg(const Status& s) { return std::string(s.message()); }

std::string ModelsDir() {
  const char* env = std::getenv("VIGIL_SOURCE_DIR");
  return std::string(env ? env : VIGIL_SOURCE_DIR) + "/../shared/models";
}

void SetType(onnx::ValueInfoProto* v, const std::string& name, int elem_type,
             const std::vector<std::string>& dims) {  // a dim is a number or a symbol
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (const std::string& d : dims) {
    auto* dim = shape->add_dim();
    if (!d.empty() && std::isdigit(static_cast<unsigned char>(d[0]))) {
      dim->set_dim_value(std::stoll(d));
    } else {
      dim->set_dim_param(d);
    }
  }
}

onnx::NodeProto* AddNode(onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& in,
                         const std::vector<std::string>& out, const std::string& name = "") {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : in) n->add_input(i);
  for (const auto& o : out) n->add_output(o);
  return n;
}

// x float[1,3] → Relu → y.
onnx::ModelProto BaseModel() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("vigil-test");
  m.set_producer_version("0.1");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  SetType(g->add_input(), "x", onnx::TensorProto::FLOAT, {"1", "3"});
  SetType(g->add_output(), "y", onnx::TensorProto::FLOAT, {"1", "3"});
  AddNode(g, "Relu", {"x"}, {"y"}, "relu");
  return m;
}

StatusOr<Graph> Import(const onnx::ModelProto& m) { return ImportOnnxBytes(m.SerializeAsString(), "test.onnx"); }

onnx::TensorProto* AddInitializer(onnx::ModelProto& m, const std::string& name, int data_type,
                                  const std::vector<int64_t>& dims) {
  onnx::TensorProto* t = m.mutable_graph()->add_initializer();
  t->set_name(name);
  t->set_data_type(data_type);
  for (int64_t d : dims) t->add_dims(d);
  return t;
}

template <typename T>
std::string RawBytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

TEST(OnnxImportTest, ReadsModelFields) {
  onnx::ModelProto m = BaseModel();
  m.set_ir_version(9);
  auto* ms = m.add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  auto* meta = m.add_metadata_props();
  meta->set_key("imgsz");
  meta->set_value("[640, 640]");
  onnx::GraphProto* g = m.mutable_graph();
  g->clear_input();
  SetType(g->add_input(), "x", onnx::TensorProto::FLOAT, {"batch", "3", "height", "640"});
  SetType(g->add_input(), "w", onnx::TensorProto::FLOAT, {"1"});  // also an initializer (IR < 4 style)
  AddInitializer(m, "w", onnx::TensorProto::FLOAT, {1})->add_float_data(2.f);
  AddNode(g, "Mul", {"y", "w"}, {"z"});  // unnamed: gets "Mul_1"
  SetType(g->add_output(), "z", onnx::TensorProto::FLOAT, {});

  StatusOr<Graph> graph = Import(m);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->ir_version, 9);
  EXPECT_EQ(graph->opset, 17);
  EXPECT_EQ(graph->opset_imports, (std::map<std::string, int64_t>{{"", 17}, {"com.microsoft", 1}}));
  EXPECT_EQ(graph->producer_name, "vigil-test");
  EXPECT_EQ(graph->producer_version, "0.1");
  EXPECT_EQ(graph->metadata.at("imgsz"), "[640, 640]");
  ASSERT_EQ(graph->inputs.size(), 1u);  // "w" is an initializer, not a real input
  const ValueInfo& x = graph->inputs[0];
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.dtype, DType::kFloat32);
  ASSERT_TRUE(x.has_shape);
  ASSERT_EQ(x.dims.size(), 4u);
  EXPECT_EQ(x.dims[0].symbol, "batch");
  EXPECT_FALSE(x.dims[0].is_static());
  EXPECT_EQ(x.dims[1].value, 3);
  EXPECT_EQ(x.dims[2].symbol, "height");
  EXPECT_EQ(x.dims[3].value, 640);
  ASSERT_EQ(graph->outputs.size(), 2u);
  EXPECT_EQ(graph->outputs[1].name, "z");
  ASSERT_EQ(graph->nodes.size(), 2u);
  EXPECT_EQ(graph->nodes[0].name, "relu");
  EXPECT_EQ(graph->nodes[1].name, "Mul_1");
  EXPECT_EQ(graph->nodes[1].inputs, (std::vector<std::string>{"y", "w"}));
}

TEST(OnnxImportTest, ConvertsEveryNonGraphAttributeKind) {
  onnx::ModelProto m = BaseModel();
  onnx::NodeProto* n = m.mutable_graph()->mutable_node(0);
  auto add = [&](const std::string& name, onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  };
  add("f", onnx::AttributeProto::FLOAT)->set_f(0.5f);
  add("i", onnx::AttributeProto::INT)->set_i(-7);
  add("s", onnx::AttributeProto::STRING)->set_s("nearest");
  onnx::TensorProto* t = add("t", onnx::AttributeProto::TENSOR)->mutable_t();
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(2);
  t->add_int64_data(4);
  t->add_int64_data(-1);
  onnx::AttributeProto* fs = add("fs", onnx::AttributeProto::FLOATS);
  fs->add_floats(1.f);
  fs->add_floats(2.5f);
  onnx::AttributeProto* is = add("is", onnx::AttributeProto::INTS);
  for (int64_t v : {1, 1, 2, 2}) is->add_ints(v);
  onnx::AttributeProto* ss = add("ss", onnx::AttributeProto::STRINGS);
  ss->add_strings("a");
  ss->add_strings("bc");

  StatusOr<Graph> graph = Import(m);
  ASSERT_TRUE(graph.ok()) << graph.status();
  const Node& node = graph->nodes[0];
  EXPECT_FLOAT_EQ(node.GetFloat("f", 0.f), 0.5f);
  EXPECT_EQ(node.GetInt("i", 0), -7);
  EXPECT_EQ(node.GetString("s", ""), "nearest");
  ASSERT_NE(node.GetTensor("t"), nullptr);
  EXPECT_EQ(node.GetTensor("t")->shape(), (Shape{2}));
  EXPECT_EQ(Values<int64_t>(*node.GetTensor("t")), (std::vector<int64_t>{4, -1}));
  EXPECT_EQ(node.GetFloats("fs"), (std::vector<float>{1.f, 2.5f}));
  EXPECT_EQ(node.GetInts("is"), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(std::get<std::vector<std::string>>(node.attrs.at("ss")), (std::vector<std::string>{"a", "bc"}));
}

TEST(OnnxImportTest, GraphAttributeIsUnimplementedNamingTheNode) {
  onnx::ModelProto m = BaseModel();
  onnx::NodeProto* n = AddNode(m.mutable_graph(), "If", {"cond"}, {"out"}, "branch");
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name("then_branch");
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name("then");
  StatusOr<Graph> graph = Import(m);
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(graph.status()), HasSubstr("node 'branch' (If)"));
  EXPECT_THAT(Msg(graph.status()), HasSubstr("then_branch"));
}

TEST(OnnxImportTest, DecodesInitializersInEveryEncoding) {
  onnx::ModelProto m = BaseModel();
  AddInitializer(m, "f32_raw", onnx::TensorProto::FLOAT, {2})->set_raw_data(RawBytes<float>({1.5f, -2.f}));
  auto* f32 = AddInitializer(m, "f32_typed", onnx::TensorProto::FLOAT, {1, 2});
  f32->add_float_data(0.25f);
  f32->add_float_data(3.f);
  // float16 bit patterns: 0x3C00 = 1.0, 0xC000 = -2.0, 0x3800 = 0.5 (IEEE 754 binary16).
  auto* f16 = AddInitializer(m, "f16_typed", onnx::TensorProto::FLOAT16, {2});
  f16->add_int32_data(0x3C00);
  f16->add_int32_data(0xC000);
  AddInitializer(m, "f16_raw", onnx::TensorProto::FLOAT16, {1})->set_raw_data(RawBytes<uint16_t>({0x3800}));
  auto* f64 = AddInitializer(m, "f64", onnx::TensorProto::DOUBLE, {1});
  f64->add_double_data(0.125);
  auto* i8 = AddInitializer(m, "i8", onnx::TensorProto::INT8, {2});
  i8->add_int32_data(-5);
  i8->add_int32_data(7);
  AddInitializer(m, "u8_raw", onnx::TensorProto::UINT8, {2})->set_raw_data(RawBytes<uint8_t>({200, 3}));
  AddInitializer(m, "i16", onnx::TensorProto::INT16, {1})->add_int32_data(-300);
  AddInitializer(m, "i32", onnx::TensorProto::INT32, {1})->add_int32_data(123456);
  auto* i64 = AddInitializer(m, "i64_scalar", onnx::TensorProto::INT64, {});
  i64->add_int64_data(int64_t{1} << 40);
  AddInitializer(m, "i64_raw", onnx::TensorProto::INT64, {2})->set_raw_data(RawBytes<int64_t>({-1, 9}));
  auto* b = AddInitializer(m, "bool", onnx::TensorProto::BOOL, {3});
  for (int v : {1, 0, 1}) b->add_int32_data(v);
  AddInitializer(m, "empty", onnx::TensorProto::FLOAT, {0, 3});

  StatusOr<Graph> graph = Import(m);
  ASSERT_TRUE(graph.ok()) << graph.status();
  auto get = [&](const std::string& name) -> const Tensor& { return graph->initializers.at(name); };
  EXPECT_EQ(get("f32_raw").shape(), (Shape{2}));
  EXPECT_EQ(Values<float>(get("f32_raw")), (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(get("f32_typed").shape(), (Shape{1, 2}));
  EXPECT_EQ(Values<float>(get("f32_typed")), (std::vector<float>{0.25f, 3.f}));
  EXPECT_EQ(get("f16_typed").dtype(), DType::kFloat16);
  EXPECT_EQ(get("f16_typed").ToFloatVector(), (std::vector<float>{1.f, -2.f}));
  EXPECT_EQ(get("f16_raw").ToFloatVector(), (std::vector<float>{0.5f}));
  EXPECT_EQ(Values<double>(get("f64")), (std::vector<double>{0.125}));
  EXPECT_EQ(Values<int8_t>(get("i8")), (std::vector<int8_t>{-5, 7}));
  EXPECT_EQ(Values<uint8_t>(get("u8_raw")), (std::vector<uint8_t>{200, 3}));
  EXPECT_EQ(Values<int16_t>(get("i16")), (std::vector<int16_t>{-300}));
  EXPECT_EQ(Values<int32_t>(get("i32")), (std::vector<int32_t>{123456}));
  EXPECT_EQ(get("i64_scalar").shape(), Shape{});
  EXPECT_EQ(Values<int64_t>(get("i64_scalar")), (std::vector<int64_t>{int64_t{1} << 40}));
  EXPECT_EQ(Values<int64_t>(get("i64_raw")), (std::vector<int64_t>{-1, 9}));
  EXPECT_EQ(get("bool").dtype(), DType::kBool);
  EXPECT_EQ(Values<uint8_t>(get("bool")), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(get("empty").shape(), (Shape{0, 3}));
  EXPECT_EQ(get("empty").numel(), 0);
}

TEST(OnnxImportTest, RejectsInitializerDataThatDoesNotMatchItsShape) {
  onnx::ModelProto typed = BaseModel();
  AddInitializer(typed, "short", onnx::TensorProto::FLOAT, {3})->add_float_data(1.f);
  StatusOr<Graph> g1 = Import(typed);
  EXPECT_EQ(g1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g1.status()), HasSubstr("tensor 'short'"));

  onnx::ModelProto raw = BaseModel();
  AddInitializer(raw, "odd", onnx::TensorProto::INT32, {2})->set_raw_data("abc");
  StatusOr<Graph> g2 = Import(raw);
  EXPECT_EQ(g2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g2.status()), HasSubstr("tensor 'odd'"));
}

// ImportOnnxFile reads external data from the model's folder (offset and length honoured) and refuses
// locations outside it.
TEST(OnnxImportTest, ReadsExternalDataBesideTheFile) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("vigil_ext_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  {
    std::ofstream bin(dir / "weights.bin", std::ios::binary);
    const std::string pad(8, 'x');
    bin << pad << RawBytes(values);
  }
  auto write = [&](const std::string& location) {
    onnx::ModelProto m = BaseModel();
    onnx::TensorProto* t = AddInitializer(m, "w", onnx::TensorProto::FLOAT, {3});
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    for (auto [k, v] : {std::pair<std::string, std::string>{"location", location}, {"offset", "8"}, {"length", "12"}}) {
      auto* kv = t->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    }
    std::ofstream(dir / "m.onnx", std::ios::binary) << m.SerializeAsString();
  };
  write("weights.bin");
  StatusOr<Graph> g = ImportOnnxFile((dir / "m.onnx").string());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(Values<float>(g->initializers.at("w")), values);
  write("../weights.bin");
  g = ImportOnnxFile((dir / "m.onnx").string());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g.status()), HasSubstr("inside the model's folder"));
  write("missing.bin");
  g = ImportOnnxFile((dir / "m.onnx").string());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(OnnxImportTest, ExternalDataAndStringTensorsAreUnimplemented) {
  onnx::ModelProto ext = BaseModel();
  onnx::TensorProto* t = AddInitializer(ext, "big_weight", onnx::TensorProto::FLOAT, {1024});
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* loc = t->add_external_data();
  loc->set_key("location");
  loc->set_value("weights.bin");
  StatusOr<Graph> g1 = Import(ext);
  EXPECT_EQ(g1.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(g1.status()), HasSubstr("tensor 'big_weight'"));

  onnx::ModelProto str = BaseModel();
  AddInitializer(str, "labels", onnx::TensorProto::STRING, {1})->add_string_data("person");
  StatusOr<Graph> g2 = Import(str);
  EXPECT_EQ(g2.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(g2.status()), HasSubstr("tensor 'labels'"));
  EXPECT_THAT(Msg(g2.status()), HasSubstr("STRING"));
}

TEST(OnnxImportTest, ConstantNodesBecomeInitializers) {
  onnx::ModelProto m = BaseModel();
  onnx::GraphProto* g = m.mutable_graph();
  auto constant = [&](const std::string& out, const std::string& attr, onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* a = AddNode(g, "Constant", {}, {out})->add_attribute();
    a->set_name(attr);
    a->set_type(type);
    return a;
  };
  onnx::TensorProto* t = constant("c_tensor", "value", onnx::AttributeProto::TENSOR)->mutable_t();
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(2);
  t->set_raw_data(RawBytes<float>({4.f, 5.f}));
  constant("c_float", "value_float", onnx::AttributeProto::FLOAT)->set_f(0.75f);
  onnx::AttributeProto* fs = constant("c_floats", "value_floats", onnx::AttributeProto::FLOATS);
  fs->add_floats(1.f);
  fs->add_floats(-1.f);
  constant("c_int", "value_int", onnx::AttributeProto::INT)->set_i(3);
  onnx::AttributeProto* is = constant("c_ints", "value_ints", onnx::AttributeProto::INTS);
  for (int64_t v : {1, -1, 80}) is->add_ints(v);
  AddNode(g, "Sum", {"y", "c_tensor", "c_float", "c_floats"}, {"s"}, "sum");

  StatusOr<Graph> graph = Import(m);
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_EQ(graph->nodes.size(), 2u);  // Relu and Sum; the five Constants are gone
  const auto& init = graph->initializers;
  EXPECT_EQ(Values<float>(init.at("c_tensor")), (std::vector<float>{4.f, 5.f}));
  EXPECT_EQ(init.at("c_float").shape(), Shape{});
  EXPECT_EQ(Values<float>(init.at("c_float")), (std::vector<float>{0.75f}));
  EXPECT_EQ(init.at("c_floats").shape(), (Shape{2}));
  EXPECT_EQ(Values<float>(init.at("c_floats")), (std::vector<float>{1.f, -1.f}));
  EXPECT_EQ(init.at("c_int").dtype(), DType::kInt64);
  EXPECT_EQ(Values<int64_t>(init.at("c_int")), (std::vector<int64_t>{3}));
  EXPECT_EQ(Values<int64_t>(init.at("c_ints")), (std::vector<int64_t>{1, -1, 80}));
}

TEST(OnnxImportTest, SortsNodesAndRejectsCyclesAndDanglingInputs) {
  onnx::ModelProto unsorted = BaseModel();
  onnx::GraphProto* g = unsorted.mutable_graph();
  g->clear_node();
  g->clear_output();
  SetType(g->add_output(), "z", onnx::TensorProto::FLOAT, {"1", "3"});
  AddNode(g, "Sigmoid", {"y"}, {"z"}, "second");
  AddNode(g, "Relu", {"x"}, {"y"}, "first");
  StatusOr<Graph> sorted = Import(unsorted);
  ASSERT_TRUE(sorted.ok()) << sorted.status();
  EXPECT_EQ(sorted->nodes[0].name, "first");
  EXPECT_EQ(sorted->nodes[1].name, "second");

  onnx::ModelProto cycle = unsorted;
  cycle.mutable_graph()->mutable_node(1)->set_input(0, "z");  // first reads second's output
  StatusOr<Graph> g1 = Import(cycle);
  EXPECT_EQ(g1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g1.status()), HasSubstr("cycle"));

  onnx::ModelProto dangling = BaseModel();
  dangling.mutable_graph()->mutable_node(0)->set_input(0, "missing");
  StatusOr<Graph> g2 = Import(dangling);
  EXPECT_EQ(g2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(g2.status()), HasSubstr("node 'relu' (Relu): input 'missing'"));
}

TEST(OnnxImportTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = ::testing::TempDir() + "/no_such_model.onnx";
  StatusOr<Graph> graph = ImportOnnxFile(path);
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(graph.status()), HasSubstr(path));
}

TEST(OnnxImportTest, RejectsBytesThatAreNotAnOnnxModel) {
  std::random_device rd;
  const unsigned seed = rd();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  const std::string png("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
  for (const std::string& bytes : {std::string(), std::string("hello, this is not a model\n"), png, noise}) {
    StatusOr<Graph> graph = ImportOnnxBytes(bytes, "junk.onnx");
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument) << graph.status();
    EXPECT_THAT(Msg(graph.status()), HasSubstr("'junk.onnx' is not a valid ONNX model"));
  }
}

TEST(OnnxImportTest, RejectsModelsMissingEssentialParts) {
  onnx::ModelProto no_opset = BaseModel();
  no_opset.clear_opset_import();
  onnx::ModelProto no_graph = BaseModel();
  no_graph.clear_graph();
  onnx::ModelProto no_nodes = BaseModel();
  no_nodes.mutable_graph()->clear_node();
  for (const auto* m : {&no_opset, &no_graph, &no_nodes}) {
    StatusOr<Graph> graph = Import(*m);
    EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument) << graph.status();
    EXPECT_THAT(Msg(graph.status()), HasSubstr("is not a valid ONNX model"));
  }
  onnx::ModelProto old_opset = BaseModel();
  old_opset.mutable_opset_import(0)->set_version(6);
  StatusOr<Graph> graph = Import(old_opset);
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(graph.status()), HasSubstr("opset 6"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(OnnxImportTest, TruncatedRealModelIsInvalid) {
  const std::string path = ModelsDir() + "/yolox_nano_coco_416_fp32.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  const std::string bytes = ReadFile(path);
  ASSERT_GT(bytes.size(), 1000u);
  StatusOr<Graph> graph = ImportOnnxBytes(std::string_view(bytes).substr(0, bytes.size() / 2), path);
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kInvalidArgument) << graph.status();
  EXPECT_THAT(Msg(graph.status()), HasSubstr("is not a valid ONNX model"));
}

std::map<std::string, int> OpCounts(const Graph& g) {
  std::map<std::string, int> counts;
  for (const Node& n : g.nodes) ++counts[n.op_type];
  return counts;
}

// Expected values: ../shared/models/SOURCES.md.
TEST(OnnxImportTest, ImportsRealYoloV8nInt8) {
  const std::string path = ModelsDir() + "/yolov8n_coco_640_int8dyn.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  StatusOr<Graph> graph = ImportOnnxFile(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->ir_version, 9);
  EXPECT_EQ(graph->opset, 20);
  EXPECT_EQ(graph->producer_name, "onnx.quantize");
  EXPECT_EQ(graph->nodes.size(), 610u);
  EXPECT_EQ(OpCounts(*graph), (std::map<std::string, int>{
                                  {"Mul", 186}, {"Add", 71}, {"Reshape", 71}, {"ConvInteger", 64}, {"Cast", 64},
                                  {"DynamicQuantizeLinear", 59}, {"Sigmoid", 58}, {"Concat", 17}, {"Split", 8},
                                  {"MaxPool", 3}, {"Resize", 2}, {"Slice", 2}, {"Sub", 2}, {"Transpose", 1},
                                  {"Softmax", 1}, {"Div", 1}}));
  std::map<DType, int> init_types;
  for (const auto& [name, t] : graph->initializers) ++init_types[t.dtype()];
  EXPECT_EQ(init_types,
            (std::map<DType, int>{{DType::kUInt8, 128}, {DType::kFloat32, 132}, {DType::kInt64, 75}}));
  ASSERT_EQ(graph->inputs.size(), 1u);
  EXPECT_EQ(graph->inputs[0].name, "images");
  ASSERT_EQ(graph->inputs[0].dims.size(), 4u);
  EXPECT_EQ(graph->inputs[0].dims[2].value, 640);
  ASSERT_EQ(graph->outputs.size(), 1u);
  EXPECT_EQ(graph->outputs[0].name, "output0");
  EXPECT_EQ(graph->metadata.at("imgsz"), "[640, 640]");
}

TEST(OnnxImportTest, ImportsRealYoloxNano) {
  const std::string path = ModelsDir() + "/yolox_nano_coco_416_fp32.onnx";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "real model not found at " << path;
  StatusOr<Graph> graph = ImportOnnxFile(path);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(graph->ir_version, 6);
  EXPECT_EQ(graph->opset, 11);
  EXPECT_EQ(graph->nodes.size(), 369u);
  EXPECT_EQ(OpCounts(*graph), (std::map<std::string, int>{{"Conv", 113}, {"Sigmoid", 110}, {"Mul", 104},
                                                            {"Concat", 18}, {"Slice", 8}, {"Add", 7},
                                                            {"MaxPool", 3}, {"Reshape", 3}, {"Resize", 2},
                                                            {"Transpose", 1}}));
  std::map<DType, int> init_types;
  for (const auto& [name, t] : graph->initializers) ++init_types[t.dtype()];
  EXPECT_EQ(init_types, (std::map<DType, int>{{DType::kFloat32, 228}, {DType::kInt64, 8}}));
  ASSERT_EQ(graph->inputs.size(), 1u);
  EXPECT_EQ(graph->inputs[0].dims[3].value, 416);
  EXPECT_TRUE(graph->metadata.empty());
}

}  // namespace
}  // namespace vigil::infer
