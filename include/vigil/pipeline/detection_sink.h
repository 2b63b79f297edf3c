// vigil/pipeline/detection_sink.h — the edge's sink side (issue 41): what becomes of each batch the worker pool
// detected. Per frame: its stage times, its detections through the stream's ledger (rules → event or progress
// mark → outbox), the stream's counters, an event's frame to the Snapshotter, its result to the standby (a live
// stream of a primary with replication.mirror_results: the mirror_result hook); and per stream the tallies Run's
// thread samples: frames recorded (fps, stalls, the final "done" line) and the recorded frames' source times until
// the aggregator acknowledges them (frame_to_ack).
//
// A failed batch's frames become drop marks ("detect_error"; counted in the stream's dropped{reason}) and one error
// line "detection of a batch of N frames on DEVICE failed: …". The takeover's first batch (TakeoverController::
// FirstBatch) ticks the ledger at once, so its progress marks do not wait for progress_flush.
// Metrics (registered by the constructor, in this order): vigil_edge_stage_seconds{stage=decode|queue|preprocess|
// inference|postprocess|rules|publish|frame_to_ack}, vigil_edge_frame_to_detection_seconds,
// vigil_edge_engine_busy_seconds_total, vigil_edge_batch_frames; per stream (StreamMetrics): frames, events,
// dropped{detect_error}.
//
// Ownership: the Edge owns it (made at the start of Run). It refers to, without owning: the registry, the clock,
// the HealthWatch and the TakeoverController (they outlive it), the ledger (set_ledger) and the Snapshotter
// (set_snapshotter), the streams' StreamMetrics (Open; owned by StreamIngest). It owns the tallies and starts no
// thread.
// Threads: OnBatch on the pool's sink thread (batches in the order they were taken, so each stream's frames in
// order); RecordFrame there and on a feeder thread (a takeover's re-published results: StreamIngest); Acked and
// frames on Run's thread. Open, set_ledger and set_snapshotter on Run's thread before the pool starts.
// Thread-safety: the tallies are under one mutex; everything else is set before the pool starts.
// Errors: none returned (a failed batch is counted and logged, as above).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/mutex.h"
#include "vigil/detect/detection.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/health_watch.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/pipeline/snapshotter.h"
#include "vigil/pipeline/stream_metrics.h"
#include "vigil/pipeline/takeover_controller.h"
#include "vigil/pipeline/workers.h"

namespace vigil::pipeline {

struct DetectionSinkOptions {
  std::vector<std::string> devices;        // EdgeConfig::devices: BatchResult::device names one in the error line
  metrics::Registry* registry = nullptr;   // required; outlives the sink
  Clock* clock = SystemClock();            // the rules' and publish stage's times. Default: the system clock
  HealthWatch* health = nullptr;           // required: BatchDone per batch
  TakeoverController* takeover = nullptr;  // required: FirstBatch
  std::function<void(const BatchResult&)> on_detected;  // EdgeRunOptions::on_detected (may be empty)
  // A recorded frame's detections for the standby (PrimaryMirror::MirrorResult with the stream's live and run);
  // may be empty.
  std::function<void(size_t stream, const FrameInfo& info, std::span<const detect::Detection> dets)> mirror_result;
};

// What the sink knows of one stream (config order).
struct SinkStream {
  std::string id;
  StreamMetrics* metrics = nullptr;  // required; outlives the sink
  bool snapshots = false;            // StreamConfig::snapshots.enabled
  video::SnapshotOptions snapshot_options;
};

class DetectionSink {
 public:
  static constexpr size_t kMaxUnackedTimes = 100000;  // frame times kept per stream for frame_to_ack

  explicit DetectionSink(DetectionSinkOptions options);
  DetectionSink(const DetectionSink&) = delete;
  DetectionSink& operator=(const DetectionSink&) = delete;

  // The streams, before any frame is recorded (their tallies start at zero).
  void Open(std::vector<SinkStream> streams) VIGIL_EXCLUDES(mu_);
  // The ledger frames are recorded in (not owned), before the pool starts.
  void set_ledger(StreamLedger* ledger) { ledger_ = ledger; }
  // The Snapshotter an event's frame goes to (not owned; null: none), before the pool starts.
  void set_snapshotter(Snapshotter* snapshotter) { snapshotter_ = snapshotter; }

  // The pool's sink thread: one detected (or failed) batch. Moves the frame of an event with a snapshot out of `r`.
  void OnBatch(BatchResult& r);
  // One processed (or re-published) frame's detections through the ledger, the stream's metrics, the tallies and
  // the mirror_result hook. `source_steady_ns`: when its source released it (steady ns; frame_to_ack's start).
  StreamLedger::Recorded RecordFrame(size_t stream, const FrameInfo& info, std::span<const detect::Detection> dets,
                                     const detect::DeviceRows* rows, int64_t source_steady_ns) VIGIL_EXCLUDES(mu_);

  // Run's thread: the aggregator acknowledged `stream` through `acked` (the ledger's cursor; nullopt: nothing yet):
  // frame_to_ack observed at `now` (steady ns) for the recorded frames it covers. Returns the stream's frames
  // recorded so far.
  uint64_t Acked(size_t stream, std::optional<uint64_t> acked, int64_t now) VIGIL_EXCLUDES(mu_);
  // Frames recorded, all streams.
  uint64_t frames() const VIGIL_EXCLUDES(mu_);
  // Recorded frames of `stream` not yet acknowledged (tests; at most kMaxUnackedTimes).
  size_t unacked(size_t stream) const VIGIL_EXCLUDES(mu_);

 private:
  metrics::Histogram& Stage(const char* stage);

  DetectionSinkOptions options_;
  metrics::Registry& reg_;
  Clock* const clock_;
  struct Stages {
    metrics::Histogram *decode, *queue, *preprocess, *inference, *postprocess, *rules, *publish, *frame_to_ack;
  } stages_{};
  metrics::Histogram* frame_to_detection_ = nullptr;
  metrics::Counter* engine_busy_ = nullptr;
  metrics::Histogram* batch_frames_ = nullptr;
  std::vector<SinkStream> streams_;       // Open
  StreamLedger* ledger_ = nullptr;        // set_ledger
  Snapshotter* snapshotter_ = nullptr;    // set_snapshotter
  // Per stream, what the sink recorded and Run's thread reads (frame_to_ack, fps, stalls).
  struct Tally {
    std::deque<std::pair<uint64_t, int64_t>> unacked;  // (seq, source_steady_ns) of reported frames
    uint64_t frames = 0;                               // frames recorded
  };
  mutable Mutex mu_;
  std::vector<Tally> tallies_ VIGIL_GUARDED_BY(mu_);
};

}  // namespace vigil::pipeline
