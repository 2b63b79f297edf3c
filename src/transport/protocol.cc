#include "vigil/transport/protocol.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <span>
#include <cmath>
#include <cstdio>
#include <bit>
#include <cstring>

namespace vigil::transport {
namespace {

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

// ---- encoding -----------------------------------------------------------------------------------

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void I32(int32_t v) { Le(static_cast<uint32_t>(v), 4); }
  void I64(int64_t v) { Le(static_cast<uint64_t>(v), 8); }
  void F32(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    Le(bits, 4);
  }
  void Str(std::string_view s) {
    U16(static_cast<uint16_t>(s.size()));
    out_->append(s);
  }
  void Bytes(std::span<const uint8_t> b) { out_->append(reinterpret_cast<const char*>(b.data()), b.size()); }
  void Raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }
  void Proof(std::string_view p) {
    U8(static_cast<uint8_t>(p.size()));
    out_->append(p);
  }

 private:
  void Le(uint64_t v, int bytes) {
    char b[8];
    for (int i = 0; i < bytes; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
    out_->append(b, static_cast<size_t>(bytes));
  }
  std::string* out_;
};

struct BodyEncoder {
  Writer w;
  MessageType operator()(const Hello& m) {
    w.Str(m.edge);
    w.U64(m.epoch);
    w.U16(m.protocol_version);
    w.U8(m.flags);
    w.Bytes(m.nonce);
    w.U32(static_cast<uint32_t>(m.class_names.size()));
    for (const std::string& n : m.class_names) w.Str(n);
    w.U32(static_cast<uint32_t>(m.streams.size()));
    for (const HelloStream& st : m.streams) {
      w.Str(st.stream);
      w.U64(st.run);
    }
    return MessageType::kHello;
  }
  MessageType operator()(const Welcome& m) {
    w.U64(m.epoch);
    w.U32(static_cast<uint32_t>(m.streams.size()));
    for (const WelcomeStream& st : m.streams) {
      w.Str(st.stream);
      w.U64(st.run);
      w.I64(st.contiguous_through);
      w.I64(st.highest_seq);
    }
    return MessageType::kWelcome;
  }
  MessageType operator()(const Report& m) { return ReportWith(m, m.edge, m.epoch, m.link_seq, m.detections); }
  MessageType ReportWith(const Report& m, std::string_view edge, uint64_t epoch, uint64_t link_seq,
                         std::span<const ReportDetection> rows) {
    w.Str(edge);
    w.Str(m.stream);
    w.U64(m.run);
    w.U64(m.seq_first);
    w.U64(m.seq_last);
    w.U64(epoch);
    w.U64(link_seq);
    w.U8(static_cast<uint8_t>(m.kind));
    w.U8(static_cast<uint8_t>(m.severity));
    w.I64(m.capture_ns);
    w.I64(m.pts_ns);
    w.I64(m.publish_ns);
    w.U32(m.width);
    w.U32(m.height);
    w.Str(m.rule);
    w.U32(static_cast<uint32_t>(rows.size()));
    if constexpr (std::endian::native == std::endian::little) {
      // The row layout on the wire is the struct's (6 little-endian f32): one copy, not 6 writes per row.
      if (!rows.empty()) w.Raw(rows.data(), rows.size() * sizeof(ReportDetection));
    } else {
      for (const ReportDetection& d : rows) {
        w.F32(d.x1);
        w.F32(d.y1);
        w.F32(d.x2);
        w.F32(d.y2);
        w.F32(d.score);
        w.F32(d.class_id);
      }
    }
    return MessageType::kReport;
  }
  MessageType operator()(const Ack& m) {
    w.Str(m.stream);
    w.U64(m.run);
    w.U64(m.epoch);
    w.U64(m.seq_first);
    w.U64(m.seq_last);
    w.I64(m.contiguous_through);
    return MessageType::kAck;
  }
  MessageType operator()(const Reject& m) {
    w.U8(static_cast<uint8_t>(m.reason));
    w.Str(m.stream);
    w.U64(m.run);
    w.U64(m.seq_first);
    w.U64(m.seq_last);
    w.U64(m.epoch);
    w.Str(m.detail);
    return MessageType::kReject;
  }
  MessageType operator()(const Heartbeat& m) {
    w.I64(m.sent_ns);
    return MessageType::kHeartbeat;
  }
  MessageType operator()(const Challenge& m) {
    w.Bytes(m.nonce);
    w.Proof(m.proof);
    return MessageType::kChallenge;
  }
  MessageType operator()(const Auth& m) {
    w.Proof(m.proof);
    return MessageType::kAuth;
  }
  MessageType operator()(const RingOffer& m) {
    w.Str(m.memory);
    w.Str(m.device);
    w.Str(m.handle);
    w.Str(m.control);
    w.U32(m.slots);
    w.U32(m.slot_bytes);
    w.Str(m.error);
    return MessageType::kRingOffer;
  }
  MessageType operator()(const RingAccept&) { return MessageType::kRingAccept; }
  MessageType operator()(const Snapshot& m) {
    w.Str(m.stream);
    w.U64(m.run);
    w.U64(m.seq);
    w.I32(m.box);
    w.U32(m.x);
    w.U32(m.y);
    w.U32(m.width);
    w.U32(m.height);
    w.U32(m.out_width);
    w.U32(m.out_height);
    w.U32(static_cast<uint32_t>(m.jpeg.size()));
    w.Raw(m.jpeg.data(), m.jpeg.size());
    return MessageType::kSnapshot;
  }
  MessageType operator()(const SourceStates& m) {
    w.U32(static_cast<uint32_t>(m.streams.size()));
    for (const SourceStates::Entry& e : m.streams) {
      w.Str(e.stream);
      w.U8(static_cast<uint8_t>(e.state));
    }
    return MessageType::kSourceStates;
  }
};

// ---- decoding -----------------------------------------------------------------------------------

// Bounds-checked little-endian reads; the first failure sticks and names the field.
class Reader {
 public:
  Reader(std::string_view data, const char* message) : data_(data), message_(message) {}

  template <typename T>
  bool Int(const char* field, T* out) {
    if (!Need(field, sizeof(T))) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += sizeof(T);
    *out = static_cast<T>(v);
    return true;
  }
  bool F32(const char* field, float* out) {
    uint32_t bits = 0;
    if (!Int(field, &bits)) return false;
    std::memcpy(out, &bits, 4);
    return true;
  }
  bool Str(const char* field, std::string* out) {
    uint16_t n = 0;
    if (!Int(field, &n) || !Need(field, n)) return false;
    out->assign(data_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  bool Raw(const char* field, void* out, size_t n) {
    if (!Need(field, n)) return false;
    if (n == 0) return true;  // `out` may be null (an empty vector's data())
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Bytes(const char* field, std::span<uint8_t> out) {
    if (!Need(field, out.size())) return false;
    std::memcpy(out.data(), data_.data() + pos_, out.size());
    pos_ += out.size();
    return true;
  }
  // u8 length, 0 or kProofBytes, then the proof.
  bool Proof(std::string* out) {
    uint8_t n = 0;
    if (!Int("proof_length", &n)) return false;
    if (n != 0 && n != kProofBytes) return Fail(StrCat("proof_length ", n, " is neither 0 nor ", kProofBytes));
    if (!Need("proof", n)) return false;
    out->assign(data_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  bool Fail(std::string reason) {
    if (error_.ok()) error_ = absl::InvalidArgumentError(StrCat(message_, " body: ", reason));
    return false;
  }
  size_t left() const { return data_.size() - pos_; }
  Status Finish() {
    if (error_.ok() && left() != 0) Fail(StrCat(left(), " unexpected bytes after the last field"));
    return error_;
  }

 private:
  bool Need(const char* field, size_t n) {
    if (!error_.ok()) return false;
    if (left() >= n) return true;
    return Fail(StrCat("field '", field, "' truncated (needs ", n, " bytes, ", left(), " left)"));
  }
  std::string_view data_;
  size_t pos_ = 0;
  const char* message_;
  Status error_;
};

StatusOr<Message> DecodeBody(MessageType type, std::string_view body) {
  switch (type) {
    case MessageType::kHello: {
      Reader r(body, "Hello");
      Hello m;
      uint32_t classes = 0, streams = 0;
      // A peer of another version may lay the rest out differently: stop after the version field and let
      // the receiver answer kUnsupportedVersion.
      bool ok = r.Str("edge", &m.edge) && r.Int("epoch", &m.epoch) && r.Int("protocol_version", &m.protocol_version);
      if (ok && m.protocol_version != kProtocolVersion) return Message(std::move(m));
      ok = ok && r.Int("flags", &m.flags) && r.Bytes("nonce", m.nonce) && r.Int("class_count", &classes);
      // Each name takes at least 2 bytes, each stream at least 10: check before allocating for a hostile count.
      if (ok && (classes > kMaxClasses || size_t{classes} * 2 > r.left())) {
        ok = r.Fail(StrCat("class_count ", classes, " does not fit the ", r.left(), " bytes left"));
      }
      for (uint32_t i = 0; ok && i < classes; ++i) ok = r.Str("class name", &m.class_names.emplace_back());
      ok = ok && r.Int("stream_count", &streams);
      if (ok && (streams > kMaxHelloStreams || size_t{streams} * 10 > r.left())) {
        ok = r.Fail(StrCat("stream_count ", streams, " does not fit the ", r.left(), " bytes left"));
      }
      for (uint32_t i = 0; ok && i < streams; ++i) {
        HelloStream& st = m.streams.emplace_back();
        ok = r.Str("stream", &st.stream) && r.Int("run", &st.run);
      }
      VIGIL_RETURN_IF_ERROR(r.Finish());
      VIGIL_RETURN_IF_ERROR(Annotate(ValidateHello(m), "Hello body"));
      return Message(std::move(m));
    }
    case MessageType::kWelcome: {
      Reader r(body, "Welcome");
      Welcome m;
      uint32_t streams = 0;
      bool ok = r.Int("epoch", &m.epoch) && r.Int("stream_count", &streams);
      if (ok && (streams > kMaxHelloStreams || size_t{streams} * 26 > r.left())) {
        ok = r.Fail(StrCat("stream_count ", streams, " does not fit the ", r.left(), " bytes left"));
      }
      for (uint32_t i = 0; ok && i < streams; ++i) {
        WelcomeStream& st = m.streams.emplace_back();
        ok = r.Str("stream", &st.stream) && r.Int("run", &st.run) &&
             r.Int("contiguous_through", &st.contiguous_through) && r.Int("highest_seq", &st.highest_seq);
      }
      VIGIL_RETURN_IF_ERROR(r.Finish());
      if (m.epoch == 0) return absl::InvalidArgumentError("Welcome body: epoch 0 (epochs start at 1)");
      for (const WelcomeStream& st : m.streams) {
        if (st.contiguous_through < -1 || st.highest_seq < st.contiguous_through) {
          return absl::InvalidArgumentError(StrCat("Welcome body: stream '", st.stream, "': contiguous_through ",
                                                   st.contiguous_through, " and highest_seq ", st.highest_seq,
                                                   " are not -1 ≤ contiguous_through ≤ highest_seq"));
        }
      }
      return Message(std::move(m));
    }
    case MessageType::kReport: {
      Reader r(body, "Report");
      Report m;
      uint8_t kind = 0, severity = 0;
      uint32_t n = 0;
      bool ok = r.Str("edge", &m.edge) && r.Str("stream", &m.stream) && r.Int("run", &m.run) &&
                r.Int("seq_first", &m.seq_first) && r.Int("seq_last", &m.seq_last) && r.Int("epoch", &m.epoch) &&
                r.Int("link_seq", &m.link_seq) && r.Int("kind", &kind) && r.Int("severity", &severity) && r.Int("capture_ns", &m.capture_ns) &&
                r.Int("pts_ns", &m.pts_ns) && r.Int("publish_ns", &m.publish_ns) && r.Int("width", &m.width) &&
                r.Int("height", &m.height) && r.Str("rule", &m.rule) && r.Int("detection_count", &n);
      // Each detection takes 24 bytes: check before allocating for a hostile count.
      if (ok && (n > kMaxDetections || size_t{n} * sizeof(ReportDetection) > r.left())) {
        ok = r.Fail(StrCat("detection_count ", n, " does not fit the ", r.left(), " bytes left"));
      }
      if constexpr (std::endian::native == std::endian::little) {
        if (ok) {
          m.detections.resize(n);
          ok = r.Raw("detections", m.detections.data(), size_t{n} * sizeof(ReportDetection));
        }
      } else {
        for (uint32_t i = 0; ok && i < n; ++i) {
          ReportDetection& d = m.detections.emplace_back();
          ok = r.F32("x1", &d.x1) && r.F32("y1", &d.y1) && r.F32("x2", &d.x2) && r.F32("y2", &d.y2) &&
               r.F32("score", &d.score) && r.F32("class", &d.class_id);
        }
      }
      VIGIL_RETURN_IF_ERROR(r.Finish());
      m.kind = static_cast<ReportKind>(kind);
      m.severity = static_cast<Severity>(severity);
      VIGIL_RETURN_IF_ERROR(Annotate(ValidateReport(m), "Report body"));
      return Message(std::move(m));
    }
    case MessageType::kAck: {
      Reader r(body, "Ack");
      Ack m;
      r.Str("stream", &m.stream) && r.Int("run", &m.run) && r.Int("epoch", &m.epoch) &&
          r.Int("seq_first", &m.seq_first) && r.Int("seq_last", &m.seq_last) &&
          r.Int("contiguous_through", &m.contiguous_through);
      VIGIL_RETURN_IF_ERROR(r.Finish());
      return Message(std::move(m));
    }
    case MessageType::kReject: {
      Reader r(body, "Reject");
      Reject m;
      uint8_t reason = 0;
      r.Int("reason", &reason) && r.Str("stream", &m.stream) && r.Int("run", &m.run) &&
          r.Int("seq_first", &m.seq_first) && r.Int("seq_last", &m.seq_last) && r.Int("epoch", &m.epoch) &&
          r.Str("detail", &m.detail);
      VIGIL_RETURN_IF_ERROR(r.Finish());
      if (reason < 1 || reason > 6) return absl::InvalidArgumentError(StrCat("Reject body: unknown reason ", reason));
      m.reason = static_cast<RejectReason>(reason);
      return Message(std::move(m));
    }
    case MessageType::kHeartbeat: {
      Reader r(body, "Heartbeat");
      Heartbeat m;
      r.Int("sent_ns", &m.sent_ns);
      VIGIL_RETURN_IF_ERROR(r.Finish());
      return Message(m);
    }
    case MessageType::kChallenge: {
      Reader r(body, "Challenge");
      Challenge m;
      r.Bytes("nonce", m.nonce) && r.Proof(&m.proof);
      VIGIL_RETURN_IF_ERROR(r.Finish());
      return Message(std::move(m));
    }
    case MessageType::kAuth: {
      Reader r(body, "Auth");
      Auth m;
      r.Proof(&m.proof);
      VIGIL_RETURN_IF_ERROR(r.Finish());
      return Message(std::move(m));
    }
    case MessageType::kRingOffer: {
      Reader r(body, "RingOffer");
      RingOffer m;
      r.Str("memory", &m.memory) && r.Str("device", &m.device) && r.Str("handle", &m.handle) &&
          r.Str("control", &m.control) && r.Int("slots", &m.slots) && r.Int("slot_bytes", &m.slot_bytes) &&
          r.Str("error", &m.error);
      VIGIL_RETURN_IF_ERROR(r.Finish());
      return Message(std::move(m));
    }
    case MessageType::kRingAccept: {
      Reader r(body, "RingAccept");
      VIGIL_RETURN_IF_ERROR(r.Finish());
      return Message(RingAccept{});
    }
    case MessageType::kSnapshot: {
      Reader r(body, "Snapshot");
      Snapshot m;
      uint32_t n = 0;
      bool ok = r.Str("stream", &m.stream) && r.Int("run", &m.run) && r.Int("seq", &m.seq) && r.Int("box", &m.box) &&
                r.Int("x", &m.x) && r.Int("y", &m.y) && r.Int("width", &m.width) && r.Int("height", &m.height) &&
                r.Int("out_width", &m.out_width) && r.Int("out_height", &m.out_height) && r.Int("jpeg_length", &n);
      if (ok && n > r.left()) ok = r.Fail(StrCat("jpeg_length ", n, " does not fit the ", r.left(), " bytes left"));
      if (ok) {
        m.jpeg.resize(n);
        r.Raw("jpeg", m.jpeg.data(), n);
      }
      VIGIL_RETURN_IF_ERROR(r.Finish());
      VIGIL_RETURN_IF_ERROR(Annotate(ValidateSnapshot(m), "Snapshot body"));
      return Message(std::move(m));
    }
    case MessageType::kSourceStates: {
      Reader r(body, "SourceStates");
      SourceStates m;
      uint32_t n = 0;
      bool ok = r.Int("count", &n);
      // Each entry takes 3 bytes at least: check before allocating for a hostile count.
      if (ok && (n > kMaxHelloStreams || size_t{n} * 3 > r.left())) {
        ok = r.Fail(StrCat("count ", n, " does not fit the ", r.left(), " bytes left"));
      }
      for (uint32_t i = 0; ok && i < n; ++i) {
        SourceStates::Entry& e = m.streams.emplace_back();
        uint8_t state = 0;
        ok = r.Str("stream", &e.stream) && r.Int("state", &state);
        e.state = static_cast<SourceState>(state);
      }
      VIGIL_RETURN_IF_ERROR(r.Finish());
      VIGIL_RETURN_IF_ERROR(Annotate(ValidateSourceStates(m), "SourceStates body"));
      return Message(std::move(m));
    }
  }
  return absl::InvalidArgumentError(StrCat("frame: unknown message type ", static_cast<int>(type)));
}

uint32_t LoadLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string_view ToString(Severity s) {
  switch (s) {
    case Severity::kNone:
      return "none";
    case Severity::kInfo:
      return "info";
    case Severity::kWarning:
      return "warning";
    case Severity::kCritical:
      return "critical";
  }
  return "unknown";
}

std::string_view ToString(RejectReason r) {
  switch (r) {
    case RejectReason::kStaleEpoch:
      return "stale_epoch";
    case RejectReason::kInvalid:
      return "invalid";
    case RejectReason::kUnsupportedVersion:
      return "unsupported_version";
    case RejectReason::kProtocolError:
      return "protocol_error";
    case RejectReason::kFenced:
      return "fenced";
    case RejectReason::kUnauthenticated:
      return "unauthenticated";
  }
  return "unknown";
}

std::string_view ToString(ReportKind k) {
  switch (k) {
    case ReportKind::kEvent:
      return "event";
    case ReportKind::kProgress:
      return "progress";
    case ReportKind::kDropped:
      return "dropped";
    case ReportKind::kLost:
      return "lost";
  }
  return "unknown";
}

std::string_view MessageName(const Message& m) {
  static constexpr std::string_view kNames[] = {"Hello",     "Welcome",   "Report", "Ack",
                                                "Reject",    "Heartbeat", "Challenge", "Auth",
                                                "RingOffer", "RingAccept", "Snapshot", "SourceStates"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[m.index()];
}

uint32_t Crc32(std::string_view data, uint32_t crc) {
  // zlib's CRC-32 is this one (same polynomial, same pre- and post-inversion, same continuation), and
  // several times faster than a byte-at-a-time table: at 64 KB frames the CRC was the largest cost of
  // framing (docs/benchmarks.md, transport links).
  uLong c = crc;
  while (!data.empty()) {
    const uInt n = static_cast<uInt>(std::min<size_t>(data.size(), 1u << 30));
    c = ::crc32(c, reinterpret_cast<const Bytef*>(data.data()), n);
    data.remove_prefix(n);
  }
  return static_cast<uint32_t>(c);
}

namespace {
// Ids, rules and class names are stored as text by both storage engines (PostgreSQL refuses a byte sequence
// that is not UTF-8, and any NUL) and rendered into JSON: valid UTF-8 (no overlong forms, no surrogates, at
// most U+10FFFF) without NUL.
bool IsText(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == 0) return false;
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

Status CheckReport(const Report& r, bool need_edge) {
  auto bad = [&](std::string reason) {
    return absl::InvalidArgumentError(
        StrCat("report ", r.edge, "/", r.stream, " run ", r.run, " seq ", r.seq_first, "..", r.seq_last, ": ", reason));
  };
  if ((need_edge && r.edge.empty()) || r.stream.empty()) return bad("empty edge or stream id");
  if (r.edge.size() > 65535 || r.stream.size() > 65535 || r.rule.size() > 65535) return bad("string over 65535 bytes");
  if (!IsText(r.edge) || !IsText(r.stream) || !IsText(r.rule)) {
    return bad("edge id, stream id and rule must be UTF-8 text without NUL bytes");
  }
  if (r.seq_first > r.seq_last) return bad("seq_first > seq_last");
  if (r.seq_last >= kMaxSeq) return bad(StrCat("seq_last ", r.seq_last, " is not below 2^63"));
  if (r.seq_last - r.seq_first >= kMaxReportFrames) {
    return bad(StrCat("covers ", r.seq_last - r.seq_first + 1, " frames, more than ", kMaxReportFrames));
  }
  if (r.kind == ReportKind::kEvent) {
    if (r.seq_first != r.seq_last) return bad("an event covers exactly one frame");
  } else if (r.kind == ReportKind::kProgress || r.kind == ReportKind::kDropped || r.kind == ReportKind::kLost) {
    if (!r.detections.empty()) return bad(StrCat("a ", ToString(r.kind), " report carries no detections"));
  } else {
    return bad(StrCat("unknown kind ", static_cast<int>(r.kind)));
  }
  if (static_cast<uint8_t>(r.severity) > static_cast<uint8_t>(Severity::kCritical)) {
    return bad(StrCat("unknown severity ", static_cast<int>(r.severity)));
  }
  if (r.detections.size() > kMaxDetections) {
    return bad(StrCat(r.detections.size(), " detections, more than ", kMaxDetections));
  }
  for (const ReportDetection& d : r.detections) {
    if (!std::isfinite(d.score) || !std::isfinite(d.x1) || !std::isfinite(d.y1) || !std::isfinite(d.x2) ||
        !std::isfinite(d.y2)) {
      return bad("a detection has a non-finite score or coordinate");
    }
    if (!(d.class_id >= 0 && d.class_id < 16777216.0f) || d.class_id != std::floor(d.class_id)) {
      return bad(StrCat("a detection has class ", d.class_id, ", not an integer in [0, 2^24)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status ValidateReport(const Report& r) { return CheckReport(r, /*need_edge=*/true); }
Status ValidateReportFields(const Report& r) { return CheckReport(r, /*need_edge=*/false); }

std::string_view ToString(SourceState s) {
  switch (s) {
    case SourceState::kIdle:
      return "idle";
    case SourceState::kConnecting:
      return "connecting";
    case SourceState::kStreaming:
      return "streaming";
    case SourceState::kReconnecting:
      return "reconnecting";
    case SourceState::kEnded:
      return "ended";
    case SourceState::kFailed:
      return "failed";
    case SourceState::kStopped:
      return "stopped";
  }
  return "unknown";
}

Status ValidateSourceStates(const SourceStates& s) {
  if (s.streams.size() > kMaxHelloStreams) {
    return absl::InvalidArgumentError(StrCat("source states: ", s.streams.size(), " streams, more than ", kMaxHelloStreams));
  }
  size_t bytes = 4;
  for (const SourceStates::Entry& e : s.streams) {
    if (e.stream.empty() || e.stream.size() > 65535 || !IsText(e.stream)) {
      return absl::InvalidArgumentError(
          "source states: a stream id must be 1..65535 bytes of UTF-8 text without NUL bytes");
    }
    if (static_cast<uint8_t>(e.state) > static_cast<uint8_t>(SourceState::kStopped)) {
      return absl::InvalidArgumentError(StrCat("source states: stream '", e.stream.substr(0, 200), "': unknown state ",
                                               static_cast<int>(e.state)));
    }
    bytes += 3 + e.stream.size();
  }
  if (bytes > kMaxBodyBytes) return absl::InvalidArgumentError(StrCat("source states: ", bytes, " bytes, over ", kMaxBodyBytes));
  return absl::OkStatus();
}

Status ValidateSnapshot(const Snapshot& s) {
  auto bad = [&](std::string reason) {
    return absl::InvalidArgumentError(
        StrCat("snapshot of ", s.stream.substr(0, 200), " run ", s.run, " seq ", s.seq, " box ", s.box, ": ", reason));
  };
  if (s.stream.empty() || s.stream.size() > 65535 || !IsText(s.stream)) {
    return bad("the stream id must be 1..65535 bytes of UTF-8 text without NUL bytes");
  }
  if (s.seq >= kMaxSeq) return bad(StrCat("seq ", s.seq, " is not below 2^63"));
  if (s.box < -1 || s.box >= static_cast<int64_t>(kMaxDetections)) {
    return bad(StrCat("box ", s.box, " is neither -1 (the frame) nor a detection index below ", kMaxDetections));
  }
  const auto dim = [](uint32_t v) { return v >= 1 && v <= 65535; };
  if (!dim(s.width) || !dim(s.height) || !dim(s.out_width) || !dim(s.out_height)) {
    return bad(StrCat("region ", s.width, "x", s.height, " or picture ", s.out_width, "x", s.out_height,
                      " is not 1..65535 pixels a side"));
  }
  if (s.jpeg.empty() || s.jpeg.size() > kMaxSnapshotBytes) {
    return bad(StrCat(s.jpeg.size(), " JPEG bytes, not 1..", kMaxSnapshotBytes));
  }
  if (s.jpeg.size() < 3 || static_cast<uint8_t>(s.jpeg[0]) != 0xFF || static_cast<uint8_t>(s.jpeg[1]) != 0xD8 ||
      static_cast<uint8_t>(s.jpeg[2]) != 0xFF) {
    return bad("the picture is not a JPEG (no FF D8 FF start of image)");
  }
  return absl::OkStatus();
}

Status ValidateHello(const Hello& h) {
  auto bad = [&](std::string reason) {
    return absl::InvalidArgumentError(StrCat("Hello of edge '", h.edge.substr(0, 200), "': ", reason));
  };
  if (h.edge.empty() || h.edge.size() > 65535) return bad("edge id must be 1..65535 bytes");
  if (!IsText(h.edge)) return bad("the edge id is not UTF-8 text without NUL bytes");
  if ((h.flags & ~kHelloPromote) != 0) return bad(StrCat("unknown flags ", static_cast<int>(h.flags)));
  if (h.class_names.size() > kMaxClasses) return bad(StrCat(h.class_names.size(), " class names, more than ", kMaxClasses));
  if (h.streams.size() > kMaxHelloStreams) return bad(StrCat(h.streams.size(), " streams, more than ", kMaxHelloStreams));
  size_t bytes = 2 + h.edge.size() + 8 + 2 + 1 + kNonceBytes + 4 + 4;
  size_t welcome_bytes = 8 + 4;  // the Welcome lists every stream again, with two i64 cursors each
  for (const std::string& n : h.class_names) {
    if (n.size() > 65535) return bad("a class name over 65535 bytes");
    if (!IsText(n)) return bad("a class name is not UTF-8 text without NUL bytes");
    bytes += 2 + n.size();
  }
  for (const HelloStream& s : h.streams) {
    if (s.stream.empty() || s.stream.size() > 65535) return bad("a stream id must be 1..65535 bytes");
    if (!IsText(s.stream)) return bad("a stream id is not UTF-8 text without NUL bytes");
    bytes += 2 + s.stream.size() + 8;
    welcome_bytes += 2 + s.stream.size() + 8 + 8 + 8;
  }
  if (bytes > kMaxBodyBytes) return bad(StrCat("encodes to ", bytes, " bytes, over the ", kMaxBodyBytes, " limit"));
  if (welcome_bytes > kMaxBodyBytes) {
    return bad(StrCat("its streams make a Welcome of ", welcome_bytes, " bytes, over the ", kMaxBodyBytes, " limit"));
  }
  return absl::OkStatus();
}

namespace {
// Writes the header of the frame whose body follows `start + kHeaderBytes` in `out`.
void FinishFrame(MessageType type, size_t start, std::string* out) {
  const size_t body = out->size() - start - kHeaderBytes;
  std::string header;
  Writer h(&header);
  h.U32(kMagic);
  h.U8(kProtocolVersion);
  h.U8(static_cast<uint8_t>(type));
  h.U16(0);
  h.U32(static_cast<uint32_t>(body));
  h.U32(Crc32(std::string_view(*out).substr(start + kHeaderBytes), Crc32(header)));
  out->replace(start, kHeaderBytes, header);
}
}  // namespace

void AppendFrame(const Message& m, std::string* out) {
  const size_t start = out->size();
  out->append(kHeaderBytes, '\0');
  FinishFrame(std::visit(BodyEncoder{Writer(out)}, m), start, out);
}

void AppendReportFrame(const Report& report, std::string_view edge, uint64_t epoch, uint64_t link_seq,
                       std::span<const ReportDetection> rows, std::string* out) {
  const size_t start = out->size();
  out->append(kHeaderBytes, '\0');
  FinishFrame(BodyEncoder{Writer(out)}.ReportWith(report, edge, epoch, link_seq, rows), start, out);
}

std::string EncodeFrame(const Message& m) {
  std::string out;
  AppendFrame(m, &out);
  return out;
}

void FrameDecoder::Feed(std::string_view bytes) {
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {  // compact: keep the unread tail only
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
}

StatusOr<size_t> WholeFrameBytes(std::string_view bytes, bool check_crc) {
  if (bytes.size() < kHeaderBytes) return size_t{0};
  const char* h = bytes.data();
  const uint32_t magic = LoadLe32(h);
  if (magic != kMagic) {
    return absl::InvalidArgumentError(
        StrCat("frame: bad magic ", Hex(magic), " (expected ", Hex(kMagic), " 'VGIL'): not a vigil report stream"));
  }
  const uint8_t version = static_cast<uint8_t>(h[4]);
  if (version != kProtocolVersion) {
    return absl::UnimplementedError(StrCat("frame: protocol version ", static_cast<int>(version),
                                           " not supported (this side speaks ", static_cast<int>(kProtocolVersion),
                                           ")"));
  }
  const uint16_t flags = static_cast<uint16_t>(static_cast<uint8_t>(h[6]) | (static_cast<uint8_t>(h[7]) << 8));
  if (flags != 0) return absl::InvalidArgumentError(StrCat("frame: reserved flags ", flags, " set"));
  const uint32_t length = LoadLe32(h + 8);
  if (length > kMaxBodyBytes) {
    return absl::InvalidArgumentError(StrCat("frame: body length ", length, " exceeds the limit ", kMaxBodyBytes));
  }
  if (bytes.size() < kHeaderBytes + length) return size_t{0};
  if (check_crc) {
    const uint32_t crc = Crc32(bytes.substr(kHeaderBytes, length), Crc32(bytes.substr(0, 12)));
    if (crc != LoadLe32(h + 12)) {
      return absl::DataLossError(
          StrCat("frame: CRC-32 mismatch (header says ", Hex(LoadLe32(h + 12)), ", content gives ", Hex(crc), ")"));
    }
  }
  return kHeaderBytes + length;
}

StatusOr<std::optional<Message>> FrameDecoder::Next() {
  const std::string_view rest(buf_.data() + pos_, pending());
  VIGIL_ASSIGN_OR_RETURN(const size_t bytes, WholeFrameBytes(rest, /*check_crc=*/true));
  if (bytes == 0) return std::optional<Message>();
  const auto type = static_cast<MessageType>(static_cast<uint8_t>(rest[5]));
  StatusOr<Message> m = DecodeBody(type, rest.substr(kHeaderBytes, bytes - kHeaderBytes));
  if (!m.ok()) return m.status();
  pos_ += bytes;
  return std::optional<Message>(std::move(*m));
}

StatusOr<Message> DecodeFrame(std::string_view frame) {
  FrameDecoder d;
  d.Feed(frame);
  VIGIL_ASSIGN_OR_RETURN(std::optional<Message> m, d.Next());
  if (!m && frame.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(
        StrCat("frame truncated: ", frame.size(), " bytes, a header needs ", kHeaderBytes));
  }
  if (!m) {
    return absl::InvalidArgumentError(StrCat("frame truncated: the header says ", LoadLe32(frame.data() + 8),
                                             " body bytes, ", frame.size() - kHeaderBytes, " present"));
  }
  if (d.pending() != 0) return absl::InvalidArgumentError(StrCat("frame: ", d.pending(), " bytes after the frame"));
  return std::move(*m);
}

}  // namespace vigil::transport
