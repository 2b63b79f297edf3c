// vigil/replication/pair.h — what a primary and its hot standby must agree on before they pair (issue 16):
// the same model, the same streams and the same rules, so the standby's warm engine computes what the
// primary would have. Role, peer addresses and node names are not part of it.
//
// The digest has four SHA-256 parts (32 raw bytes each):
//  - model: the ONNX ModelProto with what exporters stamp and nothing computes from cleared — producer name
//    and version, domain, model_version, doc strings (model, graph, nodes, functions) and metadata_props —
//    serialised deterministically. Two exports of the same network that differ only in those pair; a change
//    of weights, opset, graph or tensor names does not. A file that is not an ONNX model fails.
//  - settings: the detection settings the caller passes as canonical text (confidence, IoU, max_det,
//    class filter, precision, batch: PairInputs::settings).
//  - streams: each stream's identity and source as canonical text, in stream order.
//  - rules: each stream's rules as canonical text, in stream order.
// `pair` is SHA-256 over the four in that order. Describe() names which parts differ, with short hex
// prefixes, for the refusal message ("the model differs (primary 3fa1c2…, standby 9b07e4…)").
//
// Thread-safety: pure functions. Errors: ComputePairDigest → NotFound (model file unreadable),
// InvalidArgument (not an ONNX model), Internal (hashing failed).
#pragma once

#include <string>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::replication {

struct PairInputs {
  std::string model_path;            // the ONNX file
  std::string settings;              // canonical text of the detection settings
  std::vector<std::string> streams;  // canonical text per stream (identity, source, how it is read)
  std::vector<std::string> rules;    // canonical text per stream's rules
};

// One stream's share of the streams and rules parts, so that a refusal can name the stream that differs.
struct StreamDigest {
  std::string id;             // the stream id (the "id=" field of its canonical text)
  std::string stream, rules;  // SHA-256 of its identity text and of its rules text, 32 raw bytes each
  bool operator==(const StreamDigest&) const = default;
};

struct PairDigest {
  std::string model, settings, streams, rules;  // 32 raw bytes each
  std::string pair;                             // SHA-256 of the four, 32 raw bytes
  std::vector<StreamDigest> per_stream;         // in stream order; for DescribeMismatch (not hashed into pair)
  bool operator==(const PairDigest&) const = default;
};

StatusOr<PairDigest> ComputePairDigest(const PairInputs& inputs);

// "" when a and b agree; otherwise one sentence per differing part, joined by "; ", naming `a` as
// `a_name` and `b` as `b_name` ("the model differs (primary 3fa1c2d0, standby 9b07e41a)"), and, where the
// streams or rules differ and both sides sent per-stream digests, which streams ("stream 'door': its rules
// differ", "stream 'gate' only on the standby", "the same streams in another order").
std::string DescribeMismatch(const PairDigest& a, const PairDigest& b, const std::string& a_name,
                             const std::string& b_name);

// Lower-case hex of raw bytes.
std::string Hex(const std::string& bytes);

}  // namespace vigil::replication
