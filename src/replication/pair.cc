// Pair digests (replication/pair.h): a normalised ONNX model and canonical texts, hashed with OpenSSL.
#include "vigil/replication/pair.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/onnx_pb.h>
#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

namespace vigil::replication {
namespace {

StatusOr<std::string> Sha256(const std::string& bytes) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out, &len, EVP_sha256(), nullptr) != 1 || len != 32) {
    return absl::InternalError("SHA-256 failed (OpenSSL EVP_Digest)");
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

void ClearNodeDocs(onnx::GraphProto* g);

void ClearNodeDocs(onnx::NodeProto* n) {
  n->clear_doc_string();
  for (onnx::AttributeProto& a : *n->mutable_attribute()) {
    a.clear_doc_string();
    if (a.has_g()) ClearNodeDocs(a.mutable_g());
    for (onnx::GraphProto& g : *a.mutable_graphs()) ClearNodeDocs(&g);
  }
}

void ClearNodeDocs(onnx::GraphProto* g) {
  g->clear_doc_string();
  for (onnx::NodeProto& n : *g->mutable_node()) ClearNodeDocs(&n);
  for (onnx::ValueInfoProto& v : *g->mutable_input()) v.clear_doc_string();
  for (onnx::ValueInfoProto& v : *g->mutable_output()) v.clear_doc_string();
  for (onnx::ValueInfoProto& v : *g->mutable_value_info()) v.clear_doc_string();
  for (onnx::TensorProto& t : *g->mutable_initializer()) t.clear_doc_string();
}

// The model as it computes: exporter stamps and documentation cleared, serialised deterministically.
StatusOr<std::string> NormalisedModel(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("model ", path, ": cannot read the file"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  onnx::ModelProto m;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  if (bytes.empty() || !m.ParseFromCodedStream(&coded) || !m.has_graph()) {
    return absl::InvalidArgumentError(StrCat("model ", path, ": not an ONNX model (the file does not parse as a ModelProto)"));
  }
  m.clear_producer_name();
  m.clear_producer_version();
  m.clear_domain();
  m.clear_model_version();
  m.clear_doc_string();
  m.clear_metadata_props();
  ClearNodeDocs(m.mutable_graph());
  for (onnx::FunctionProto& f : *m.mutable_functions()) {
    f.clear_doc_string();
    for (onnx::NodeProto& n : *f.mutable_node()) ClearNodeDocs(&n);
  }
  std::string out;
  google::protobuf::io::StringOutputStream os(&out);
  google::protobuf::io::CodedOutputStream cos(&os);
  cos.SetSerializationDeterministic(true);
  if (!m.SerializeToCodedStream(&cos)) return absl::InternalError(StrCat("model ", path, ": cannot serialise it"));
  cos.Trim();
  return out;
}

// Texts joined with their lengths, so that no two lists hash alike ("a","bc" vs "ab","c").
std::string Joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += StrCat(p.size(), ":", p, ";");
  return out;
}

}  // namespace

std::string Hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string h;
  h.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    h += d[c >> 4];
    h += d[c & 15];
  }
  return h;
}

StatusOr<PairDigest> ComputePairDigest(const PairInputs& inputs) {
  PairDigest d;
  VIGIL_ASSIGN_OR_RETURN(std::string model, NormalisedModel(inputs.model_path));
  VIGIL_ASSIGN_OR_RETURN(d.model, Sha256(model));
  VIGIL_ASSIGN_OR_RETURN(d.settings, Sha256(inputs.settings));
  VIGIL_ASSIGN_OR_RETURN(d.streams, Sha256(Joined(inputs.streams)));
  VIGIL_ASSIGN_OR_RETURN(d.rules, Sha256(Joined(inputs.rules)));
  VIGIL_ASSIGN_OR_RETURN(d.pair, Sha256(d.model + d.settings + d.streams + d.rules));
  for (size_t i = 0; i < inputs.streams.size(); ++i) {
    StreamDigest s;
    const std::string& text = inputs.streams[i];
    if (text.rfind("id=", 0) == 0) s.id = text.substr(3, text.find(' ') == std::string::npos ? std::string::npos
                                                                                            : text.find(' ') - 3);
    if (s.id.empty()) s.id = StrCat("#", i + 1);
    VIGIL_ASSIGN_OR_RETURN(s.stream, Sha256(text));
    VIGIL_ASSIGN_OR_RETURN(s.rules, Sha256(i < inputs.rules.size() ? inputs.rules[i] : std::string()));
    d.per_stream.push_back(std::move(s));
  }
  return d;
}

std::string DescribeMismatch(const PairDigest& a, const PairDigest& b, const std::string& a_name,
                             const std::string& b_name) {
  std::string out;
  auto part = [&](const char* what, const std::string& x, const std::string& y) {
    if (x == y) return;
    if (!out.empty()) out += "; ";
    out += StrCat(what, " differ", what[std::string_view(what).size() - 1] == 's' ? "" : "s", " (", a_name, " ",
                  Hex(x).substr(0, 8), ", ", b_name, " ", Hex(y).substr(0, 8), ")");
  };
  part("the model", a.model, b.model);
  part("the detection settings", a.settings, b.settings);
  part("the streams", a.streams, b.streams);
  part("the rules", a.rules, b.rules);
  if (out.empty() && a.pair != b.pair) out = "the pair digests differ";
  if ((a.streams != b.streams || a.rules != b.rules) && !a.per_stream.empty() && !b.per_stream.empty()) {
    // Which streams: by id, then the order.
    std::vector<std::string> details;
    for (const StreamDigest& x : a.per_stream) {
      const auto y = std::find_if(b.per_stream.begin(), b.per_stream.end(),
                                  [&](const StreamDigest& s) { return s.id == x.id; });
      if (y == b.per_stream.end()) {
        details.push_back(StrCat("stream '", x.id, "' only on the ", a_name));
        continue;
      }
      if (x.stream != y->stream) details.push_back(StrCat("stream '", x.id, "': its source or how it is read differs"));
      if (x.rules != y->rules) details.push_back(StrCat("stream '", x.id, "': its rules differ"));
    }
    for (const StreamDigest& y : b.per_stream) {
      if (std::none_of(a.per_stream.begin(), a.per_stream.end(), [&](const StreamDigest& s) { return s.id == y.id; })) {
        details.push_back(StrCat("stream '", y.id, "' only on the ", b_name));
      }
    }
    if (details.empty()) details.push_back("the same streams in another order");
    for (const std::string& d : details) out += StrCat("; ", d);
  }
  return out;
}

}  // namespace vigil::replication
