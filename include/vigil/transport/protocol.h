// vigil/transport/protocol.h — the edge ↔ aggregator report protocol, version 4.
//
// A connection (a session) is a byte stream of frames. The edge opens it and sends Hello first; the
// aggregator answers Challenge (its nonce, and its proof that it knows the edge's key); the edge checks
// the proof and answers Auth (its own proof); only then does the aggregator decide on the Hello and answer
// Welcome (it admits the edge and says which epoch the session holds) or Reject (kUnauthenticated,
// kFenced, kUnsupportedVersion, kProtocolError) and close (auth.h: the proofs). After the Welcome the edge sends Reports and
// Heartbeats; the aggregator answers each stored Report with an Ack, a refused one with a Reject, and
// echoes Heartbeats. An edge may also send Snapshots (an event's pictures), which are not acknowledged. Delivery is at-least-once: the edge re-sends every Report not yet acknowledged after
// a reconnect (on any link), and the aggregator stores a frame once, keyed by (edge, stream, run, seq)
// (docs/architecture.md: "exactly-once by idempotence").
//
// Frame layout (all integers little-endian, floats IEEE-754 binary32 little-endian):
//
//   offset size  field
//   0      4     magic        'V' 'G' 'I' 'L' (bytes 56 47 49 4C)
//   4      1     version      kProtocolVersion (4); a frame of another version is refused
//   5      1     type         MessageType
//   6      2     flags        0 (reserved; non-zero is refused)
//   8      4     body_length  N bytes, ≤ kMaxBodyBytes
//   12     4     crc32        CRC-32 (IEEE 802.3 / zlib: reflected polynomial 0xEDB88320, initial and
//                             final XOR 0xFFFFFFFF) of bytes 0..11 followed by the N body bytes
//   16     N     body         fields of the message type, in the order below, nothing after them
//
// Body field encodings: u8/u16/u32/u64/i64 fixed width; f32; str = u16 byte length + UTF-8 bytes.
//
//   Hello     str edge, u64 epoch, u16 protocol_version, u8 flags (bit 0: kHelloPromote; others 0),
//             32 bytes nonce (random, fresh per connection),
//             u32 class_count, class_count × str class name (index = class id),
//             u32 stream_count, stream_count × (str stream, u64 run)
//   Challenge 32 bytes nonce (the aggregator's, fresh per connection), u8 proof_length (0 or 32), proof
//   Auth      u8 proof_length (0 or 32), proof
//   Welcome   u64 epoch, u32 stream_count, stream_count × (str stream, u64 run, i64 contiguous_through,
//             i64 highest_seq)
//   Report    str edge, str stream, u64 run, u64 seq_first, u64 seq_last, u64 epoch, u64 link_seq,
//             u8 kind, u8 severity,
//             i64 capture_ns, i64 pts_ns, i64 publish_ns, u32 width, u32 height, str rule,
//             u32 detection_count, then detection_count rows of 6 f32: x1, y1, x2, y2, score, class
//             (the DetectionTensor row layout [max_det, 6] of docs/architecture.md, so a row is copied
//             from device or host memory as it is)
//   Ack       str stream, u64 run, u64 epoch, u64 seq_first, u64 seq_last, i64 contiguous_through
//   Reject    u8 reason, str stream, u64 run, u64 seq_first, u64 seq_last, u64 epoch, str detail
//   Heartbeat i64 sent_ns
//   RingOffer str memory ("cuda" or "host"), str device (the ring's GPU as a PCI bus id, "" for host),
//             str handle (cuda: the 64-byte cudaIpcMemHandle_t; host: a shared-memory name), str control
//             (the shared-memory name of the control block), u32 slots, u32 slot_bytes, str error
//             ("" = offered; otherwise why no ring could be set up: the other fields are then empty/0)
//   RingAccept (empty body)
//   Snapshot  str stream, u64 run, u64 seq, i32 box, u32 x, u32 y, u32 width, u32 height, u32 out_width,
//             u32 out_height, u32 jpeg_length, jpeg_length bytes of JPEG
//   SourceStates u32 count, count × (str stream, u8 state)
//
// Semantics:
//  - Authentication (auth.h): Challenge.proof = HMAC-SHA256 of the edge's key over the Hello and both
//    nonces, empty when the aggregator runs without authentication; Auth.proof likewise from the edge,
//    empty when it has no key. A Hello whose Auth does not prove the key is refused with
//    Reject(kUnauthenticated) and nothing of the connection reaches storage; the aggregator answers nothing
//    but that Challenge and that Reject before a valid Auth (no Heartbeat echo). A replayed Hello + Auth
//    fails: the aggregator's nonce is new on every connection.
//  - link_seq numbers the Reports of one session from 0, in the order the edge sent them (the link stamps
//    it). The aggregator takes only the next one: a repeat (a duplicated frame) is ignored, a gap or a
//    reordering (a frame lost on the link) closes the session with Reject(kProtocolError); the edge then
//    re-sends everything unacknowledged in a new session. So a session stores a prefix of what was sent,
//    in order, whatever the link below does.
//  - seq counts a stream's frames from 0 within a run; run changes only when a stream starts over
//    from scratch (its id is the epoch granted in the session where it started); epoch is the fencing
//    token, granted by the aggregator. Every seq of a run is reported exactly once by one kind or another,
//    or the aggregator shows a gap:
//      kEvent     one frame whose detections raised an event (seq_first == seq_last), with its detections;
//      kProgress  frames seq_first..seq_last processed without an event (coalesced marks);
//      kDropped   frames numbered but not processed (`rule` says why: queue_full, detect_error,
//                 backpressure), so a drop is not mistaken for loss;
//      kLost      frames numbered by an edge instance that died before delivering them (`rule` =
//                 "lost_on_restart"), reported once by the next instance.
//  - Epochs (Hello → Welcome): Hello.epoch is the epoch the edge holds, 0 for a new instance. The
//    aggregator grants a new epoch, strictly larger than any it granted that edge id and stored durably
//    before the Welcome, for epoch 0 and for kHelloPromote; it re-admits the current epoch; it refuses any
//    lower epoch with Reject(kFenced). Granting evicts every older session of that edge id at once
//    (Reject(kFenced) with an empty stream; the connection stays open until the edge closes it, and
//    whatever it still sends is refused), and a Report whose epoch is not the edge's current epoch is
//    refused with Reject(kStaleEpoch).
//  - Welcome lists, for each (stream, run) the Hello named, what the aggregator stored of it:
//    contiguous_through (highest S with 0..S all stored, -1 none) and highest_seq (-1 none); a Welcome
//    with contiguous_through < -1 or highest_seq < contiguous_through does not decode.
//  - Ack answers one Report (its stream, run, seq_first..seq_last, epoch) once the aggregator's storage
//    transaction holding it has committed (also when every frame was a duplicate), and carries
//    contiguous_through for (edge, stream, run). The edge persists it as its resume cursor.
//  - Reject answers a Report that will never be stored: kStaleEpoch (epoch = the edge's current epoch, or
//    the session's own when the report carried another epoch than its session), kInvalid. Reject with an empty stream refers to the connection (kFenced, kUnsupportedVersion,
//    kProtocolError, kUnauthenticated); the sender closes the connection after it.
//  - Snapshot (version 4): one picture of an event's frame (stream, run, seq), JPEG: the whole frame downscaled
//    (box -1) or the crop of the event's detection `box` (its index in the event report's rows); x, y, width,
//    height: the source region it shows, in source pixels; out_width × out_height: the JPEG's own size. The
//    edge sends them after the Welcome, beside the Reports (not counted in link_seq, not acknowledged: a
//    snapshot is best effort, and the edge counts what it could not send); the aggregator stores each once,
//    keyed (edge, stream, run, seq, box), the first copy winning, whether the event arrived before or after.
//  - SourceStates (version 4): what the edge's sources are doing (SourceState: connecting, streaming, reconnecting,
//    ended, failed, …), every stream of the edge, sent after the Welcome and whenever one changes; not
//    acknowledged (the newest wins). For the aggregator's view of its streams (a camera reconnecting vs a file
//    that ended), never for accounting.
//  - Times are nanoseconds: capture_ns and publish_ns on the edge's CLOCK_REALTIME (Unix epoch),
//    pts_ns the source's presentation time. Boxes are in source-image pixels (width × height).
//
// Thread-safety: functions are pure; a FrameDecoder is used by one thread at a time.
// Errors: decoding returns InvalidArgument naming the field and reason, DataLoss for a CRC mismatch,
// Unimplemented for a frame of another protocol version.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "vigil/common/frame_key.h"
#include "vigil/common/status.h"

namespace vigil::transport {

inline constexpr uint8_t kProtocolVersion = 4;
inline constexpr uint32_t kMagic = 0x4C494756;  // "VGIL" read as a little-endian u32
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kMaxBodyBytes = 1 << 20;  // 1 MiB: a report with 300 detections is ~10 KB
inline constexpr size_t kMaxDetections = 10000;
inline constexpr uint64_t kMaxSeq = uint64_t{1} << 63;          // seqs stay below (SQLite stores int64)
inline constexpr uint64_t kMaxReportFrames = uint64_t{1} << 24;  // frames one report may cover
inline constexpr size_t kMaxClasses = 65535;    // class names in a Hello
inline constexpr size_t kMaxHelloStreams = 65535;
inline constexpr uint8_t kHelloPromote = 1;     // Hello flag: a standby taking over asks for a new epoch
inline constexpr size_t kNonceBytes = 32;       // Hello and Challenge nonces
inline constexpr size_t kProofBytes = 32;       // HMAC-SHA256
// A Snapshot's JPEG at most (its frame within kMaxBodyBytes with the longest stream id).
inline constexpr size_t kMaxSnapshotBytes = kMaxBodyBytes - 65536 - 64;
using Nonce = std::array<uint8_t, kNonceBytes>;

enum class MessageType : uint8_t {
  kHello = 1,
  kReport = 2,
  kAck = 3,
  kReject = 4,
  kHeartbeat = 5,
  kWelcome = 6,
  kChallenge = 7,
  kAuth = 8,
  kRingOffer = 9,
  kRingAccept = 10,
  kSnapshot = 11,
  kSourceStates = 12,
};
enum class ReportKind : uint8_t { kEvent = 1, kProgress = 2, kDropped = 3, kLost = 4 };
enum class Severity : uint8_t { kNone = 0, kInfo = 1, kWarning = 2, kCritical = 3 };
enum class RejectReason : uint8_t {
  kStaleEpoch = 1,
  kInvalid = 2,
  kUnsupportedVersion = 3,
  kProtocolError = 4,
  kFenced = 5,
  kUnauthenticated = 6,
};

std::string_view ToString(Severity s);      // "none", "info", "warning", "critical"
std::string_view ToString(RejectReason r);  // "stale_epoch", "invalid", "unsupported_version", "protocol_error",
                                            // "fenced", "unauthenticated"
std::string_view ToString(ReportKind k);    // "event", "progress", "dropped", "lost"

// A (stream, run) the edge resumes, named in its Hello.
struct HelloStream {
  std::string stream;
  uint64_t run = 0;
  bool operator==(const HelloStream&) const = default;
};

struct Hello {
  std::string edge;  // edge id, non-empty
  uint64_t epoch = 0;  // the epoch the edge holds; 0 = a new instance
  uint16_t protocol_version = kProtocolVersion;
  uint8_t flags = 0;                     // kHelloPromote or 0
  std::vector<std::string> class_names;  // the model's classes, index = class id (labels of detections)
  std::vector<HelloStream> streams;      // (stream, run) pairs the edge resumes
  Nonce nonce{};  // the edge's nonce for this connection (the link draws it); on the wire after flags
  bool operator==(const Hello&) const = default;
};

// What the aggregator stored of one (stream, run) named in a Hello.
struct WelcomeStream {
  std::string stream;
  uint64_t run = 0;
  int64_t contiguous_through = -1;  // highest S with 0..S all stored; -1 none
  int64_t highest_seq = -1;         // highest stored seq; -1 none
  bool operator==(const WelcomeStream&) const = default;
};

struct Welcome {
  uint64_t epoch = 0;  // the epoch this session holds (granted or re-admitted)
  std::vector<WelcomeStream> streams;
  bool operator==(const Welcome&) const = default;
};

// One detection, the DetectionTensor row: box corners in source-image pixels, score in [0, 1], class id
// as a float (an integer 0..2^24). Standard layout, 24 bytes: rows are copied as they are.
struct ReportDetection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  float score = 0;
  float class_id = 0;
  bool operator==(const ReportDetection&) const = default;
};
static_assert(sizeof(ReportDetection) == 6 * sizeof(float));

struct Report {
  std::string edge, stream;  // non-empty
  uint64_t run = 0;
  uint64_t seq_first = 0, seq_last = 0;  // an event: seq_first == seq_last
  uint64_t epoch = 0;
  uint64_t link_seq = 0;                    // the report's place in its session, from 0 (the link stamps it)
  ReportKind kind = ReportKind::kProgress;
  Severity severity = Severity::kNone;
  int64_t capture_ns = 0;                   // capture time of frame seq_first, CLOCK_REALTIME ns
  int64_t pts_ns = 0;                       // presentation timestamp of seq_first in the source, ns
  int64_t publish_ns = 0;                   // when the edge handed the report to its publisher, CLOCK_REALTIME ns
  uint32_t width = 0, height = 0;           // source image size, pixels
  std::string rule;                         // event: the rule that raised it; dropped/lost: the reason; progress: ""
  std::vector<ReportDetection> detections;  // events only
  bool operator==(const Report&) const = default;
  // The frame seq_first names (an event's frame). `edge` as stamped by the link (the session's edge).
  FrameKey first_frame() const { return {edge, stream, run, seq_first}; }
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
  uint64_t epoch = 0;  // kStaleEpoch, kFenced: the edge's current epoch at the aggregator
  std::string detail;
  bool operator==(const Reject&) const = default;
};

// The aggregator's answer to a Hello before it decides on it.
struct Challenge {
  Nonce nonce{};      // the aggregator's nonce for this connection
  std::string proof;  // kProofBytes, or empty: the aggregator does not authenticate (auth.h)
  bool operator==(const Challenge&) const = default;
};

// The edge's answer to a Challenge.
struct Auth {
  std::string proof;  // kProofBytes, or empty: the edge has no key
  bool operator==(const Auth&) const = default;
};

struct Heartbeat {
  int64_t sent_ns = 0;
  bool operator==(const Heartbeat&) const = default;
};

// cuda_ipc links only (cuda_ipc.h): sent by the aggregator after a valid Auth and before it decides on the
// Hello, on the Unix-domain socket — the ring of result slots this session's Reports go through. The edge
// answers RingAccept once it mapped the ring (or hangs up); only then is the session admitted.
struct RingOffer {
  std::string memory;   // "cuda" (GPU memory, CUDA IPC) or "host" (shared host memory)
  std::string device;   // cuda: the ring's GPU, PCI bus id "0000:17:00.0"; host: ""
  std::string handle;   // cuda: cudaIpcMemHandle_t bytes (64); host: the slots' shared-memory name
  std::string control;  // shared-memory name of the control block (signal words, consumed cursor)
  uint32_t slots = 0, slot_bytes = 0;
  std::string error;    // non-empty: no ring (why); the edge falls back to its next link
  bool operator==(const RingOffer&) const = default;
};

// The edge's answer to a RingOffer: it mapped the ring; after the Welcome, Reports come through it.
struct RingAccept {
  bool operator==(const RingAccept&) const = default;
};

// One picture of an event's frame (edge → aggregator, after the Welcome; see "Snapshot" above).
struct Snapshot {
  std::string stream;             // non-empty
  uint64_t run = 0, seq = 0;      // the event's frame; seq < kMaxSeq
  int32_t box = -1;               // -1: the whole frame; else the event's detection row it crops, < kMaxDetections
  uint32_t x = 0, y = 0;          // the source region shown, source pixels: its top-left corner
  uint32_t width = 0, height = 0;  // and its size (1..65535 each)
  uint32_t out_width = 0, out_height = 0;  // the JPEG's size, pixels (1..65535 each)
  std::string jpeg;               // a JPEG file (starts FF D8 FF), 1..kMaxSnapshotBytes bytes
  bool operator==(const Snapshot&) const = default;
};

// What an edge's source is doing (video::StreamState's values).
enum class SourceState : uint8_t {
  kIdle = 0, kConnecting = 1, kStreaming = 2, kReconnecting = 3, kEnded = 4, kFailed = 5, kStopped = 6,
};
std::string_view ToString(SourceState s);  // "idle", "connecting", "streaming", "reconnecting", "ended", "failed", "stopped"

// The states of an edge's sources (edge → aggregator, after the Welcome; see "SourceStates" above).
struct SourceStates {
  struct Entry {
    std::string stream;  // non-empty
    SourceState state = SourceState::kIdle;
    bool operator==(const Entry&) const = default;
  };
  std::vector<Entry> streams;  // at most kMaxHelloStreams
  bool operator==(const SourceStates&) const = default;
};

using Message = std::variant<Hello, Welcome, Report, Ack, Reject, Heartbeat, Challenge, Auth, RingOffer, RingAccept,
                             Snapshot, SourceStates>;
// "Hello", "Welcome", "Report", ... for messages.
std::string_view MessageName(const Message& m);

// OK when `r` satisfies the field rules above (non-empty ids, seq_first ≤ seq_last, an event covers
// one frame, only events carry detections, kind/severity known, strings ≤ 65535 bytes, finite boxes and
// scores, class ids integers in [0, 2^24), seq_last < kMaxSeq, at most kMaxReportFrames frames).
Status ValidateReport(const Report& r);
// ValidateReport without the edge id, which a link stamps from its session (the Outbox's check).
Status ValidateReportFields(const Report& r);
// OK when `s` satisfies the Snapshot field rules above; InvalidArgument naming the field otherwise.
Status ValidateSnapshot(const Snapshot& s);
// OK when `s` has at most kMaxHelloStreams entries with UTF-8 stream ids (1..65535 bytes, no NUL), known states,
// and encodes within kMaxBodyBytes.
Status ValidateSourceStates(const SourceStates& s);

// OK when `h` has a non-empty edge id, ≤ kMaxClasses names and ≤ kMaxHelloStreams streams, strings
// ≤ 65535 bytes, known flags, and encodes within kMaxBodyBytes — and so does the Welcome answering it,
// which lists every stream again with its two cursors (16 bytes more per stream).
Status ValidateHello(const Hello& h);

// Appends the frame for `m` to `out`. REQUIRES: strings ≤ 65535 bytes, body ≤ kMaxBodyBytes (a Report
// that passes ValidateReport with ≤ kMaxDetections detections always fits; a Hello that passes
// ValidateHello fits).
void AppendFrame(const Message& m, std::string* out);
std::string EncodeFrame(const Message& m);
// Appends a Report frame for `report` with edge id `edge`, epoch `epoch`, link_seq `link_seq` and
// detections `rows` in place of report.edge, report.epoch, report.link_seq and report.detections: a link
// stamps its session's identity and sends rows that lived elsewhere (a staging copy of device memory)
// without copying the report. REQUIRES: as AppendFrame.
void AppendReportFrame(const Report& report, std::string_view edge, uint64_t epoch, uint64_t link_seq,
                       std::span<const ReportDetection> rows, std::string* out);

// CRC-32 (IEEE 802.3) of `data`, continuing from `crc` (0 to start). Crc32("123456789") = 0xCBF43926.
uint32_t Crc32(std::string_view data, uint32_t crc = 0);

// The length (header + body) of the whole frame at the start of `bytes`, 0 when more bytes are needed, without
// decoding its body: for code that moves frames between streams (the cuda_ipc ring). Checks the header
// (magic, version, flags, body length ≤ kMaxBodyBytes) and, with `check_crc`, the CRC. Errors: as
// FrameDecoder::Next for those checks (InvalidArgument, Unimplemented for another version, DataLoss for the CRC).
StatusOr<size_t> WholeFrameBytes(std::string_view bytes, bool check_crc);

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
