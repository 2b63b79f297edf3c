// Pair digests (replication/pair.h) over small ONNX models written here with the ONNX protobuf API.
#include "vigil/replication/pair.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace vigil::replication {
namespace {

namespace fs = std::filesystem;

// A one-Conv model; `producer`, `doc` and `weight` vary what exporters stamp and what the model computes.
onnx::ModelProto ConvModel(const std::string& producer, const std::string& doc, float weight) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name(producer);
  m.set_producer_version(producer + "-1.0");
  m.set_doc_string(doc);
  m.add_opset_import()->set_version(17);
  auto* meta = m.add_metadata_props();
  meta->set_key("exported_at");
  meta->set_value(producer + doc);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("net");
  g->set_doc_string(doc);
  auto value = [](onnx::ValueInfoProto* v, const char* name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value(g->add_input(), "images", {1, 1, 4, 4});
  value(g->add_output(), "out", {1, 1, 4, 4});
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {1, 1, 1, 1}) w->add_dims(d);
  w->add_float_data(weight);
  onnx::NodeProto* n = g->add_node();
  n->set_op_type("Conv");
  n->add_input("images");
  n->add_input("w");
  n->add_output("out");
  n->set_doc_string(doc + " conv");
  return m;
}

class PairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("vigil-pair-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const onnx::ModelProto& m) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    m.SerializeToOstream(&out);
    return path;
  }
  PairInputs Inputs(const std::string& model) const {
    return {model, "conf=0.25 iou=0.7 max_det=300", {"cam1 rtsp://10.0.0.1/a live", "cam2 /v/b.mp4 file"},
            {"classes=person min_score=0.5", "classes= min_score=0"}};
  }
  fs::path dir_;
};

TEST_F(PairTest, ExportsThatDifferOnlyInStampsPairAndEveryRealDifferenceIsNamed) {
  const std::string a = Write("a.onnx", ConvModel("pytorch", "exported monday", 0.5f));
  const std::string b = Write("b.onnx", ConvModel("ultralytics", "exported tuesday", 0.5f));
  const std::string c = Write("c.onnx", ConvModel("pytorch", "exported monday", 0.25f));
  StatusOr<PairDigest> da = ComputePairDigest(Inputs(a));
  StatusOr<PairDigest> db = ComputePairDigest(Inputs(b));
  StatusOr<PairDigest> dc = ComputePairDigest(Inputs(c));
  ASSERT_TRUE(da.ok() && db.ok() && dc.ok()) << da.status() << db.status() << dc.status();
  EXPECT_EQ(da->pair.size(), 32u);
  EXPECT_EQ(*da, *db);  // producer, versions, doc strings and metadata are not the model
  EXPECT_EQ(DescribeMismatch(*da, *db, "primary", "standby"), "");
  EXPECT_NE(da->model, dc->model);  // another weight is another model
  EXPECT_NE(da->pair, dc->pair);
  EXPECT_EQ(DescribeMismatch(*da, *dc, "primary", "standby"),
            "the model differs (primary " + Hex(da->model).substr(0, 8) + ", standby " + Hex(dc->model).substr(0, 8) +
                ")");
  EXPECT_EQ(da->settings, dc->settings);

  PairInputs other = Inputs(a);
  other.streams[1] = "cam2 /v/c.mp4 file";
  other.rules[0] = "classes=car min_score=0.5";
  other.settings = "conf=0.3 iou=0.7 max_det=300";
  StatusOr<PairDigest> dd = ComputePairDigest(other);
  ASSERT_TRUE(dd.ok());
  const std::string m = DescribeMismatch(*da, *dd, "primary", "standby");
  EXPECT_EQ(m.find("the model"), std::string::npos) << m;
  EXPECT_NE(m.find("the detection settings differ (primary "), std::string::npos) << m;
  EXPECT_NE(m.find("; the streams differ (primary "), std::string::npos) << m;
  EXPECT_NE(m.find("; the rules differ (primary "), std::string::npos) << m;
  // Lists are length-prefixed: moving text between entries is a difference.
  PairInputs moved = Inputs(a);
  moved.streams = {"cam1 rtsp://10.0.0.1/a live cam2", " /v/b.mp4 file"};
  EXPECT_NE(ComputePairDigest(moved)->streams, da->streams);
  // Stream order matters (the ledger numbers streams by position).
  PairInputs swapped = Inputs(a);
  std::swap(swapped.streams[0], swapped.streams[1]);
  EXPECT_NE(ComputePairDigest(swapped)->streams, da->streams);
}

TEST_F(PairTest, AMissingOrForeignModelFileIsAClearError) {
  StatusOr<PairDigest> missing = ComputePairDigest(Inputs((dir_ / "none.onnx").string()));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("none.onnx: cannot read the file"), std::string::npos) << missing.status();
  const std::string text = (dir_ / "notes.onnx").string();
  std::ofstream(text) << "this is not a model";
  StatusOr<PairDigest> foreign = ComputePairDigest(Inputs(text));
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("notes.onnx: not an ONNX model"), std::string::npos) << foreign.status();
}

TEST_F(PairTest, ARefusalNamesTheStreamsThatDiffer) {
  const std::string m = Write("m.onnx", ConvModel("pytorch", "x", 0.5f));
  PairInputs primary{m, "conf=0.25", {"id=door source=/v/door.mp4 realtime=1", "id=gate source=rtsp://g/1 realtime=0"},
                     {"classes=person", "classes=car"}};
  StatusOr<PairDigest> p = ComputePairDigest(primary);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->per_stream.size(), 2u);
  EXPECT_EQ(p->per_stream[0].id, "door");
  EXPECT_EQ(p->per_stream[1].id, "gate");

  PairInputs rules = primary;  // one stream's rules
  rules.rules[1] = "classes=car,truck";
  EXPECT_EQ(DescribeMismatch(*p, *ComputePairDigest(rules), "primary", "standby"),
            "the rules differ (primary " + Hex(p->rules).substr(0, 8) + ", standby " +
                Hex(ComputePairDigest(rules)->rules).substr(0, 8) + "); stream 'gate': its rules differ");

  PairInputs more = primary;  // a stream only one side has, and a source that moved
  more.streams.push_back("id=yard source=/v/yard.mp4 realtime=1");
  more.rules.push_back("classes=person");
  more.streams[0] = "id=door source=/v/door2.mp4 realtime=1";
  const std::string m2 = DescribeMismatch(*p, *ComputePairDigest(more), "primary", "standby");
  EXPECT_NE(m2.find("; stream 'door': its source or how it is read differs"), std::string::npos) << m2;
  EXPECT_NE(m2.find("; stream 'yard' only on the standby"), std::string::npos) << m2;
  EXPECT_EQ(m2.find("'gate'"), std::string::npos) << m2;  // the same on both sides: not named

  PairInputs swapped = primary;  // the same streams, another order (the ledger numbers streams by position)
  std::swap(swapped.streams[0], swapped.streams[1]);
  std::swap(swapped.rules[0], swapped.rules[1]);
  const std::string m3 = DescribeMismatch(*p, *ComputePairDigest(swapped), "primary", "standby");
  EXPECT_NE(m3.find("; the same streams in another order"), std::string::npos) << m3;
}

}  // namespace
}  // namespace vigil::replication
