// vigil/transport/protocol.h — the edge ↔ aggregator report protocol, version 1.
//
// A connection is a byte stream of frames. The edge (publisher) opens it and sends Hello first, then
// Reports and Heartbeats; the aggregator (receiver) answers each stored Report with an Ack, a refused
// one with a Reject, and echoes Heartbeats. Delivery is at-least-once: the publisher re-sends every
// Report not yet acknowledged after a reconnect, and the aggregator stores a frame once, keyed by
// (edge, stream, run, seq) (docs/architecture.md: "exactly-once by idempotence").
//
// Frame layout (all integers little-endian, floats IEEE-754 binary32 little-endian):
//
//   offset size  field
//   0      4     magic        'V' 'G' 'I' 'L' (bytes 56 47 49 4C)
//   4      1     version      kProtocolVersion (1); a frame of another version is refused
//   5      1     type         MessageType
//   6      2     flags        0 (reserved; non-zero is refused)
//   8      4     body_length  N bytes, ≤ kMaxBodyBytes
//   12     4     crc32        CRC-32 (IEEE 802.3 / zlib: reflected polynomial 0xEDB88320, initial and
//                             final XOR 0xFFFFFFFF) of bytes 0..11 followed by the N body bytes
//   16     N     body         fields of the message type, in the order below, nothing after them
//
// Body field encodings: u8/u16/u32/u64/i64 fixed width; f32; str = u16 byte length + UTF-8 bytes.
//
//   Hello     str edge, u64 epoch, u16 protocol_version
//   Report    str edge, str stream, u64 run, u64 seq_first, u64 seq_last, u64 epoch, u8 kind, u8 severity,
//             i64 capture_ns, i64 pts_ns, i64 publish_ns, u32 width, u32 height, str rule,
//             u32 detection_count, then per detection: i32 class_id, f32 score, f32 x1, f32 y1,
//             f32 x2, f32 y2, str label
//   Ack       str stream, u64 run, u64 epoch, u64 seq_first, u64 seq_last, i64 contiguous_through
//   Reject    u8 reason, str stream, u64 run, u64 seq_first, u64 seq_last, u64 epoch, str detail
//   Heartbeat i64 sent_ns
//
// Semantics:
//  - seq counts a stream's frames from 0 within a run; run changes only when a stream starts over
//    from scratch; epoch changes at every edge start (fencing token). An event report covers one frame
//    (seq_first == seq_last); a progress report covers frames seq_first..seq_last that produced no
//    event (coalesced marks, no detections). Every seq of a run must be reported exactly by one
//    report kind or another, or the aggregator shows a gap.
//  - Ack answers one Report (its stream, run, seq_first..seq_last, epoch) once the aggregator's storage
//    transaction holding it has committed (also when every frame was a duplicate), and carries
//    contiguous_through: the highest seq S of (edge, stream, run) such that all of 0..S are stored,
//    -1 when seq 0 is not stored yet. The edge persists it as its resume cursor.
//  - Reject answers a Report that will never be stored: kStaleEpoch when its epoch is older than the
//    newest the aggregator has seen for (edge, stream) (epoch = that newest), kInvalid for a malformed
//    one. Reject with an empty stream refers to the connection (kUnsupportedVersion, kProtocolError);
//    the receiver closes the connection after it.
//  - Times are nanoseconds: capture_ns and publish_ns on the edge's CLOCK_REALTIME (Unix epoch),
//    pts_ns the source's presentation time. Boxes are in source-image pixels (width × height).
//
// Thread-safety: functions are pure; a FrameDecoder is used by one thread at a time.
// Errors: decoding returns InvalidArgument naming the field and reason, DataLoss for a CRC mismatch,
// Unimplemented for a frame of another protocol version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "vigil/common/status.h"

namespace vigil::transport {

inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr uint32_t kMagic = 0x4C494756;  // "VGIL" read as a little-endian u32
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kMaxBodyBytes = 1 << 20;  // 1 MiB: a report with 300 detections is ~10 KB
inline constexpr size_t kMaxDetections = 10000;

enum class MessageType : uint8_t { kHello = 1, kReport = 2, kAck = 3, kReject = 4, kHeartbeat = 5 };
enum class ReportKind : uint8_t { kEvent = 1, kProgress = 2 };
enum class Severity : uint8_t { kNone = 0, kInfo = 1, kWarning = 2, kCritical = 3 };
enum class RejectReason : uint8_t { kStaleEpoch = 1, kInvalid = 2, kUnsupportedVersion = 3, kProtocolError = 4 };

std::string_view ToString(Severity s);      // "none", "info", "warning", "critical"
std::string_view ToString(RejectReason r);  // "stale_epoch", "invalid", "unsupported_version", "protocol_error"

struct Hello {
  std::string edge;  // edge id, non-empty
  uint64_t epoch = 0;
  uint16_t protocol_version = kProtocolVersion;
  bool operator==(const Hello&) const = default;
};

// One detection: box corners in source-image pixels, score in [0, 1].
struct ReportDetection {
  int32_t class_id = 0;
  float score = 0;
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  std::string label;  // class name, "" when unknown
  bool operator==(const ReportDetection&) const = default;
};

struct Report {
  std::string edge, stream;  // non-empty
  uint64_t run = 0;
  uint64_t seq_first = 0, seq_last = 0;  // an event: seq_first == seq_last
  uint64_t epoch = 0;
  ReportKind kind = ReportKind::kProgress;
  Severity severity = Severity::kNone;
  int64_t capture_ns = 0;                   // capture time of frame seq_first, CLOCK_REALTIME ns
  int64_t pts_ns = 0;                       // presentation timestamp of seq_first in the source, ns
  int64_t publish_ns = 0;                   // when the edge handed the report to its publisher, CLOCK_REALTIME ns
  uint32_t width = 0, height = 0;           // source image size, pixels
  std::string rule;                         // rule that raised the event ("" for progress)
  std::vector<ReportDetection> detections;  // empty for progress
  bool operator==(const Report&) const = default;
};

struct Ack {
  std::string stream;
  uint64_t run = 0, epoch = 0;
  uint64_t seq_first = 0, seq_last = 0;
  int64_t contiguous_through = -1;
  bool operator==(const Ack&) const = default;
};

struct Reject {
  RejectReason reason = RejectReason::kInvalid;
  std::string stream;  // "" = the connection
  uint64_t run = 0, seq_first = 0, seq_last = 0;
  uint64_t epoch = 0;  // kStaleEpoch: the newest epoch the aggregator knows for the stream
  std::string detail;
  bool operator==(const Reject&) const = default;
};

struct Heartbeat {
  int64_t sent_ns = 0;
  bool operator==(const Heartbeat&) const = default;
};

using Message = std::variant<Hello, Report, Ack, Reject, Heartbeat>;

// OK when `r` satisfies the field rules above (non-empty ids, seq_first ≤ seq_last, an event covers
// one frame, progress has no detections, kind/severity known, strings ≤ 65535 bytes, finite scores).
Status ValidateReport(const Report& r);

// Appends the frame for `m` to `out`. REQUIRES: strings ≤ 65535 bytes, body ≤ kMaxBodyBytes (a Report
// that passes ValidateReport with ≤ kMaxDetections detections always fits).
void AppendFrame(const Message& m, std::string* out);
std::string EncodeFrame(const Message& m);

// CRC-32 (IEEE 802.3) of `data`, continuing from `crc` (0 to start). Crc32("123456789") = 0xCBF43926.
uint32_t Crc32(std::string_view data, uint32_t crc = 0);

// Incremental frame parser for one byte stream.
class FrameDecoder {
 public:
  // Appends received bytes.
  void Feed(std::string_view bytes);
  // The next complete message; nullopt when more bytes are needed; an error when the stream is
  // corrupt (bad magic, version, flags, length, CRC, unknown type, malformed body) — the stream is
  // then unusable and the connection must be closed.
  StatusOr<std::optional<Message>> Next();
  // Bytes received but not yet decoded (a partial frame).
  size_t pending() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
};

// Decodes exactly one frame: errors also for a truncated frame or trailing bytes.
StatusOr<Message> DecodeFrame(std::string_view frame);

}  // namespace vigil::transport
