// vigil/replication/channel.h — the hot standby's replication channel (issue 16): one bidirectional gRPC
// stream from the standby to its primary (src/replication/replication.proto), over mutual TLS.
//
// Pairing: the standby opens the stream and sends its Pair (edge id, node name, PairDigest: pair.h); the
// primary answers Paired when the edge ids and the digests agree and no other standby is paired, otherwise
// Refused with the reason (DescribeMismatch's sentence for a digest mismatch) and ends the stream. Only a
// peer whose certificate is signed by the pair's CA (`tls.ca_file`) gets past the TLS handshake: an
// unauthenticated peer learns nothing, not even the primary's digest. A primary with a same-host picture ring
// (frame_ring.h) names its socket and a fresh token for this standby in Paired (frames_offer).
// Heartbeats: after pairing the standby sends one every `heartbeat_interval`; the primary answers each at
// once (echo_ns = the standby's sent_ns). They travel on a gRPC stream of their own over a TCP connection of
// their own (Heartbeats, named by a fresh per-pairing token from Paired), each side reading them on a thread of
// their own: a standby slow to take ledger states, frames or results (a busy machine, a blocked callback), or
// flow control on the mirroring stream, delays no answer — a false takeover needs the primary truly silent. If
// that stream cannot be opened or ends, heartbeats go on the mirroring stream (the answers' thread is then the
// reader's). Each side calls its `on_heartbeat` with the arrival time (its options' `clock`, SteadyNs) — the input of a FailureDetector (failure_detector.h) — and `on_end` once with why the stream
// ended (the peer's process gone shows as EOF/reset at once; a hung peer only as missing heartbeats).
//
// Ledger mirroring: the primary publishes its ledger's records (PublishLedger: the latest state wins) and
// sends them to the paired standby right after Paired and on every change; the standby's `on_ledger` gets
// each state (the standby keeps them, so that a takeover resumes every stream where the primary was).
//
// Frame mirroring: the primary hands each live picture it numbered, as a JPEG (MirrorFrame), to the channel,
// which keeps it until the aggregator acknowledged it (Acknowledge: the edge's acks) — up to
// max_retained_frames, the oldest evicted beyond (frames_evicted) — and sends every kept frame to the paired
// standby's `on_frame`: a standby that pairs later gets the unacknowledged ones from before it paired too.
// Order: frames go out in the order given, and a frame given before a PublishLedger call goes out before that
// ledger state — so when the caller numbers a picture and hands it over under one lock that its ledger
// publication also takes, every mirrored ledger state's next_seq is covered by the frames sent before it
// (nothing numbered is unknown to a standby that has the state, except evicted frames). The primary never
// waits for its standby: a standby slower than the pictures loses the oldest to eviction.
//
// Result mirroring (issue 17, item 2): the primary also hands the channel each processed picture's detections
// (MirrorResult: the rows its rules read, source pixels), kept until acknowledged like frames (up to
// max_retained_results) and sent to the paired standby's `on_result` after the frames queued before them (up to
// 256 per message: the standby's callback still gets them one by one). At a
// takeover the standby re-publishes those results through its own ledger instead of running the pictures
// again: the aggregator gets the primary's own detections (not a recomputation from a JPEG), and the new
// primary's engine starts on the pictures nobody processed. The detections, not the raw head outputs: ≤ max_det
// rows of 24 bytes, where YOLOv8n's 640 head is 84 × 8400 floats (2.8 MB) per picture — as much as the picture.
//
// Threading: each channel runs its own threads (gRPC's server threads; on the standby a reader of the mirroring
// stream, a heartbeat writer and a reader of the answers); the callbacks run on them and should be quick —
// on_heartbeat runs on the answers' own thread, so a slow on_ledger/on_frame/on_result delays no heartbeat.
// Stop()/destructor end the stream and join.
// Errors: Start/Pair → InvalidArgument (options: missing TLS files, bad address), NotFound (unreadable TLS
// file), Unavailable (cannot listen; no primary answering within the timeout, or the TLS handshake failed:
// gRPC does not tell the two apart), FailedPrecondition (refused: the message says why), Unimplemented (built
// without gRPC: VIGIL_WITH_GRPC, Debian libgrpc++-dev).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/frame_key.h"
#include "vigil/common/status.h"
#include "vigil/replication/pair.h"

namespace vigil::replication {

// Mutual TLS: this side's certificate and key, and the CA that signed the peer's (PEM files). Required.
struct ChannelTls {
  std::string cert_file, key_file, ca_file;
};

// A stream's ledger record as mirrored (pipeline/ledger.h StreamRecord, without depending on it).
struct MirroredStream {
  std::string stream, source;
  uint64_t run = 0;
  std::optional<uint64_t> acked_through;
  uint64_t next_seq = 0;
  bool operator==(const MirroredStream&) const = default;
};

// A mirrored picture on the standby's GPU (a frame ring in GPU memory, frame_ring.h): NV12, packed — the luma
// plane `height` rows of `width` bytes at data, then the chroma plane (height + 1) / 2 rows of 2 × ((width + 1) / 2)
// bytes of (Cb, Cr) pairs at data + width × height (video/frame.h DeviceFrame with pitches width and
// 2 × ((width + 1) / 2)). `matrix` is a video::YuvMatrix value. `owner` keeps the device memory; read-only.
// Bytes of a packed NV12 picture of width × height (the layout below).
inline size_t PackedNv12Bytes(size_t width, size_t height) {
  return width * height + 2 * ((width + 1) / 2) * ((height + 1) / 2);
}

struct MirroredGpuPicture {
  int device = 0;
  const uint8_t* data = nullptr;  // device pointer
  size_t bytes = 0;
  int matrix = 0;
  bool full_range = false;
  std::shared_ptr<void> owner;
};

// One detection of a mirrored result: corners in source pixels, score in [0, 1], class id (detect::Detection).
struct MirroredDetection {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0, score = 0;
  int32_t class_id = 0;
  bool operator==(const MirroredDetection&) const = default;
};

// A processed picture's detections as the primary's rules read them (replication.proto MirroredResult).
struct MirroredResult {
  std::string stream;
  uint64_t run = 0, seq = 0;
  int64_t capture_ns = 0, pts_ns = 0;  // as MirroredFrame
  uint32_t width = 0, height = 0;      // the picture's size, pixels
  std::vector<MirroredDetection> detections;
  bool operator==(const MirroredResult&) const = default;
  // The frame it is, on the pair's edge `edge`.
  FrameKey key(const std::string& edge) const { return {edge, stream, run, seq}; }
};

// The most detections one mirrored result carries: MirrorResult refuses (counts) a larger one.
inline constexpr size_t kMaxMirroredDetections = 1u << 16;

// One mirrored live picture (replication.proto MirroredFrame).
struct MirroredFrame {
  std::string stream;
  uint64_t run = 0, seq = 0;
  int64_t capture_ns = 0;  // CLOCK_REALTIME ns
  int64_t pts_ns = 0;      // the stream's presentation time
  uint32_t width = 0, height = 0;  // pixels
  std::string jpeg;        // the picture (video/jpeg.h), over the channel; or, from a frame ring
                           // (frame_ring.h), empty and the raw pixels in bgr:
  std::vector<uint8_t> bgr;  // 8-bit BGR, `height` rows of `stride` bytes (video/frame.h's host form)
  uint32_t stride = 0;       // bytes per row of bgr
  std::shared_ptr<const MirroredGpuPicture> gpu;  // or, from a ring in GPU memory, the picture there
  // The primary's detections for this picture when they were mirrored too (MirrorWindow::Take sets it); the
  // picture may then be missing (has_picture() false): the result alone is enough to re-publish it.
  std::optional<MirroredResult> result;
  bool has_picture() const { return !jpeg.empty() || !bgr.empty() || gpu != nullptr; }
  size_t bytes() const { return jpeg.size() + bgr.size() + (gpu ? gpu->bytes : 0); }
  // The frame it is, on the pair's edge `edge` (the channel carries no edge id: one pair serves one edge).
  FrameKey key(const std::string& edge) const { return {edge, stream, run, seq}; }
};

// The largest mirrored picture the channel carries (bytes of JPEG): a larger one is refused by MirrorFrame.
inline constexpr size_t kMaxMirroredJpegBytes = 32u << 20;

// A primary's same-host picture ring (frame_ring.h), offered to a standby in Paired: the Unix socket and the
// token of this pairing. Empty socket: none.
struct FramesOffer {
  std::string socket, token;
};

struct PrimaryChannelOptions {
  std::string listen = "0.0.0.0:7420";  // host:port; port 0 = any free port (port() tells)
  ChannelTls tls;
  std::string edge;  // the edge id this pair serves
  std::string node;  // this primary's name (logs, Paired)
  PairDigest digest;
  // Called with (steady ns at arrival) for every standby heartbeat, and once per paired stream when it
  // ends (with the reason). Optional.
  std::function<void(int64_t)> on_heartbeat;
  std::function<void(const Status&)> on_end;
  Clock* clock = nullptr;  // heartbeat times (on_heartbeat, the answers' sent_ns). Default: null = SystemClock()
  size_t max_retained_frames = 256;  // mirrored frames kept until acknowledged, at most (≥ 1)
  size_t max_retained_results = 4096;  // mirrored results kept until acknowledged, at most (≥ 1)
  // Called at each pairing, before Paired is sent: the picture ring offered to that standby (optional;
  // FramePublisher::NewToken makes the token).
  std::function<FramesOffer()> frames_offer;
};

struct PrimaryChannelStats {
  uint64_t paired = 0;      // streams paired
  uint64_t refused = 0;     // pairings refused (digest, edge id, another standby, protocol)
  uint64_t heartbeats = 0;  // standby heartbeats answered
  uint64_t heartbeat_streams = 0;          // Heartbeats streams opened by a paired standby
  uint64_t heartbeat_streams_refused = 0;  // Heartbeats streams naming no current pairing (refused, unanswered)
  uint64_t ledger_states_sent = 0;
  uint64_t frames_sent = 0;        // mirrored frames written to the stream (to every standby paired so far)
  uint64_t frame_bytes_sent = 0;   // their JPEG bytes
  uint64_t frames_refused = 0;     // MirrorFrame calls without a JPEG or with one larger than kMaxMirroredJpegBytes
  uint64_t frames_evicted = 0;     // kept frames dropped for room before they were acknowledged
  size_t frames_retained = 0;      // kept now (not yet acknowledged)
  size_t retained_bytes = 0;       // their JPEG bytes
  uint64_t results_sent = 0;       // mirrored results written to the stream
  uint64_t results_refused = 0;    // MirrorResult calls with more than kMaxMirroredDetections detections
  uint64_t results_evicted = 0;    // kept results dropped for room before they were acknowledged
  size_t results_retained = 0;     // kept now
  bool standby_connected = false;
  std::string standby;      // the paired standby's node name ("" when none)
  std::string last_refusal;
};

class PrimaryChannel {
 public:
  static StatusOr<std::unique_ptr<PrimaryChannel>> Start(PrimaryChannelOptions options);
  virtual ~PrimaryChannel() = default;
  virtual uint16_t port() const = 0;
  virtual PrimaryChannelStats stats() const = 0;  // thread-safe
  // The ledger's records now (thread-safe; cheap: stored, sent by the stream's own thread).
  virtual void PublishLedger(std::vector<MirroredStream> streams) = 0;
  // Keeps `frame` for the standby (see "Frame mirroring" above); false: refused, no JPEG (a raw picture goes
  // through a frame ring, frame_ring.h) or larger than kMaxMirroredJpegBytes (frames_refused). Thread-safe; never blocks on the standby.
  virtual bool MirrorFrame(MirroredFrame frame) = 0;
  // Keeps `result` for the standby (see "Result mirroring"); false: refused (too many detections). Thread-safe;
  // never blocks on the standby.
  virtual bool MirrorResult(MirroredResult result) = 0;
  // The aggregator stored `stream`'s run `run` through seq `through`: the frames and results kept for it at or below are
  // dropped (and so are those of older runs). Thread-safe.
  virtual void Acknowledge(const std::string& stream, uint64_t run, uint64_t through) = 0;
  // Tells the paired standby that this primary ends on purpose (sent after the last ledger state, waiting up
  // to a second for it to go out): `streams_done` — every stream ended, the standby has nothing to take over;
  // otherwise a stop was asked for, or (`reason` non-empty) this primary steps down because it is unhealthy,
  // and the standby takes over at once. Then Stop(). Thread-safe; a second call only stops.
  virtual void Finish(bool streams_done, std::string reason = {}) = 0;
  virtual void Stop() = 0;                        // idempotent; ends the paired stream
};

struct StandbyChannelOptions {
  std::string primary;  // host:port of the primary's channel
  ChannelTls tls;
  std::string edge;
  std::string node;
  PairDigest digest;
  std::chrono::milliseconds heartbeat_interval{500};
  std::function<void(int64_t)> on_heartbeat;  // the primary's answers, arrival steady ns (clock->SteadyNs())
  Clock* clock = nullptr;  // heartbeat times (on_heartbeat, sent_ns). Default: null = SystemClock()
  std::function<void(const Status&)> on_end;  // once, when the stream ends after pairing
  std::function<void(const std::vector<MirroredStream>&)> on_ledger;  // each ledger state the primary sends
  std::function<void(MirroredFrame&&)> on_frame;  // each mirrored picture (empty: frames are received and dropped)
  std::function<void(MirroredResult&&)> on_result;  // each mirrored result (empty: received and dropped)
  // The primary ends on purpose (before on_end): every stream done, or a stop (reason "") or a step-down
  // (reason: why it found itself unhealthy).
  std::function<void(bool streams_done, const std::string& reason)> on_finished;
};

class StandbyChannel {
 public:
  // Connects and pairs within `timeout`; returns once Paired arrived (heartbeats then start).
  static StatusOr<std::unique_ptr<StandbyChannel>> Pair(StandbyChannelOptions options,
                                                        std::chrono::milliseconds timeout);
  virtual ~StandbyChannel() = default;
  virtual const std::string& primary_node() const = 0;  // from Paired
  virtual const FramesOffer& frames_offer() const = 0;   // from Paired (socket empty: no picture ring)
  virtual uint64_t heartbeats_answered() const = 0;      // thread-safe
  // Whether the heartbeats travel on their own stream and connection now (false: on the mirroring stream —
  // the primary offered no token, that connection failed, or it ended). Thread-safe.
  virtual bool heartbeats_on_own_connection() const = 0;
  virtual uint64_t frames_received() const = 0;          // mirrored frames; thread-safe
  virtual uint64_t results_received() const = 0;         // mirrored results; thread-safe
  virtual void Stop() = 0;                               // idempotent
};

}  // namespace vigil::replication
