// vigil/pipeline/stream_ingest.h — the edge's stream ingest (issue 41): each configured stream's source, reader
// and feeder thread, from opening the input to handing its numbered frames to the engines.
//
// Per stream (config order, index = the ledger's and the pool's stream index):
//   Open           the source (its StreamMetrics made, the stream added to the PrimaryMirror, save_frames' folder
//                  created); one that does not open is logged ("{message}", which names the stream) and counted
//                  (errors), and gets no reader — a takeover's replay still feeds it.
//   StartFollowing a warm standby: every opened file stream (and camera, with `cameras`) is read through the
//                  StandbyGate while it waits (FollowMirrored raises the gate to the primary's cursor).
//   Admitted       the ledger admitted this instance: the stream's run, its lost_on_restart, and a takeover's
//                  mirrored pictures the aggregator lacks (MirrorWindow::Take → replayed; kept for this node's own
//                  standby: PrimaryMirror::KeepTakenOver).
//   StartReaders   a reader per opened stream (a resumed file does not pace what the ledger skips; one read while
//                  standby resumes at the gate's position, or is opened again when that lies past the first picture
//                  the aggregator lacks); the gate opens; takeover step `resumed`.
//   StartFeeders   a feeder thread per stream with a reader or a replay: the replay first (the old primary's own
//                  results re-published through `republish`; pictures decoded and pushed), then the reader's frames
//                  to the FrameIntake. When the last feeder ends the intake is closed.
// A reader's picture is numbered by the ledger (PrimaryMirror::Number hands a live one to the standby under the
// order lock); a live picture that is never processed becomes a drop mark (ledger Dropped, StreamMetrics dropped:
// "queue_full" counted from the reader's stats, "shutdown", "mirror_error"); a file's is read again after a
// restart. Log lines are those of the edge: "stream '…': ended; decoded on …, N decode errors", "stream '…':
// resumes at position …", "stream '…': re-published the old primary's own results for N frame(s)", "edge '…'
// (standby): reading N file stream(s) …", and the others below.
//
// Ownership: the Edge owns it. It owns the sources, the readers (and their decode threads), the StandbyGate, the
// feeder threads and the streams' StreamMetrics. It refers to, without owning (all outlive it): the registry, the
// clock, the PrimaryMirror, the TakeoverController, the HealthWatch, the FrameIntake and the ledger (set_ledger).
// Threads: Open, StartFollowing, Admitted, StartReaders, Activate, StartFeeders, JoinFeeders and the accessors on
// Run's thread; the readers' callbacks on their decode threads; Feed on the feeder threads; FollowMirrored on any
// thread (the replication channel's); SaveFrames and DropQueued on the pool's workers / Run's thread.
// Thread-safety: the per-stream state is written on Run's thread before the threads that read it start (readers,
// feeders), or published through the gate (a gated reader passes only after Open, after set_ledger and Admitted);
// active_ is atomic. The destructor closes the gate and stops a warm standby's readers (joined).
// Errors: Open returns InvalidArgument when a save_frames folder cannot be created; everything else is logged and
// counted (above), never returned.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "vigil/common/clock.h"
#include "vigil/common/status.h"
#include "vigil/detect/detection.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/pipeline/health_watch.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/pipeline/mirror_window.h"
#include "vigil/pipeline/picture_mirror.h"
#include "vigil/pipeline/placement.h"
#include "vigil/pipeline/standby_gate.h"
#include "vigil/pipeline/stream_metrics.h"
#include "vigil/pipeline/takeover_controller.h"
#include "vigil/pipeline/workers.h"
#include "vigil/replication/frame_ring.h"
#include "vigil/video/source.h"
#include "vigil/video/stream_reader.h"

namespace vigil::pipeline {

// Where the ingest hands its frames: the edge's WorkerPool (the Edge adapts it), a recording fake in tests.
// Thread-safety: Push from the feeder threads concurrently, Close from any; both thread-safe.
class FrameIntake {
 public:
  virtual ~FrameIntake() = default;
  // Takes `frame` of `stream`; false when closed (the frame is not taken).
  virtual bool Push(size_t stream, video::Frame frame) = 0;
  // No more frames will come (the last feeder ended).
  virtual void Close() = 0;
};

// How stream i decodes (from worker_setup.h EdgeWorkers): its hwaccel, and the CUDA ordinal whose NVDEC frames its
// Detectors read in place (-1 none).
struct StreamDecode {
  std::string hwaccel;
  int gpu = -1;
};

struct StreamIngestOptions {
  std::string edge;                          // the edge id (logs)
  std::vector<StreamConfig> streams;         // config order
  int max_batch = 1;                         // a reader's queue holds max(4, max_batch) frames
  metrics::Registry* registry = nullptr;     // required; outlives the ingest
  Clock* clock = SystemClock();              // the frames' source times, decode times. Default: the system clock
  PrimaryMirror* mirror = nullptr;           // required
  TakeoverController* takeover = nullptr;    // required
  HealthWatch* health = nullptr;             // required: Pushing / PushRefused per frame
  FrameIntake* intake = nullptr;             // required
  std::function<bool()> stopping;            // true once stopped or fenced (may be empty: never)
  std::function<void(ThreadRole role, size_t stream)> place_thread;  // decode and feed threads (may be empty)
  // A takeover's re-published result of the old primary (DetectionSink::RecordFrame; may be empty in tests).
  std::function<void(size_t stream, const FrameInfo& info, std::span<const detect::Detection> dets,
                     int64_t source_steady_ns)>
      republish;
  // Opens a stream's source. Default: video::OpenSource.
  std::function<StatusOr<std::unique_ptr<video::Source>>(video::SourceOptions)> open_source;
};

class StreamIngest {
 public:
  explicit StreamIngest(StreamIngestOptions options);
  ~StreamIngest();  // closes the gate, stops the readers a warm standby started (joined)
  StreamIngest(const StreamIngest&) = delete;
  StreamIngest& operator=(const StreamIngest&) = delete;

  // Opens every configured stream (see above); `decode`: per stream (config order). Errors: InvalidArgument when a
  // save_frames folder cannot be created.
  Status Open(std::vector<StreamDecode> decode);
  // The ledger frames are numbered in (not owned), once it is open: before StartReaders, and before Open of a warm
  // standby's gate lets a picture through.
  void set_ledger(StreamLedger* ledger) { ledger_ = ledger; }

  // A warm standby, before its wait: every opened file stream (and camera, with `cameras`) read through the gate.
  void StartFollowing(bool cameras);
  // A warm standby: the primary's mirrored ledger records raise its gate (pictures at or before a file's acked
  // cursor are discarded and not paced). No-op before StartFollowing. Any thread.
  void FollowMirrored(const std::vector<StreamRecord>& records);

  // The ledger admitted this instance: each stream's run and resume; `window` (a standby's mirrored pictures; may
  // be null) gives a takeover's replays.
  void Admitted(MirrorWindow* window);
  // Starts (or resumes) a reader per opened stream; opens the gate.
  void StartReaders();

  // The streams a feeder will run (a reader or a replay): the feeders' count, which closes the intake when it
  // reaches zero. Before StartFeeders.
  int Activate();
  void StartFeeders();  // a feeder thread per active stream
  void JoinFeeders();

  // A worker, before a batch runs: its host frames of streams with save_frames written (NNNNNN.npy).
  void SaveFrames(const std::vector<WorkItem>& batch) const;
  // A queued frame the stop discarded: a live stream's becomes a drop mark ("shutdown"); a file's is read again.
  void DropQueued(size_t stream, uint64_t seq);

  // Run's thread.
  size_t size() const { return streams_.size(); }
  const StreamConfig& config(size_t i) const { return streams_[i].config; }
  bool live(size_t i) const { return streams_[i].live; }
  uint64_t run(size_t i) const { return streams_[i].run; }
  StreamMetrics& metrics(size_t i) const { return *streams_[i].metrics; }
  const video::StreamReader* reader(size_t i) const { return streams_[i].reader.get(); }
  size_t replay_size(size_t i) const { return streams_[i].replay.size(); }  // before its feeder starts
  // Whether any stream opened (a source or a reader).
  bool any_open() const;
  // Per stream: what its source told when it opened (zeros for one that did not, or whose reader took it).
  std::vector<video::Source::Probe> Probes() const;

 private:
  struct Stream {
    StreamConfig config;
    std::unique_ptr<video::Source> source;        // opened, until its reader takes it
    std::unique_ptr<video::StreamReader> reader;  // null when the stream failed to open
    video::Source* read = nullptr;                // the reader's source (DoNotPaceThrough), while `reader` lives
    bool live = false;
    bool first_frame_seen = false;  // Feed's thread
    uint64_t run = 0;               // set once the ledger is admitted, before the reader starts
    std::unique_ptr<StreamMetrics> metrics;
    std::vector<replication::MirroredFrame> replay;  // a takeover's mirrored pictures, fed before the source's
  };

  bool Stopping() const { return options_.stopping && options_.stopping(); }
  void PlaceThread(ThreadRole role, size_t stream) const {
    if (options_.place_thread) options_.place_thread(role, stream);
  }
  video::SourceOptions SourceOptionsOf(size_t index) const;
  video::StreamReaderOptions ReaderOptionsOf(size_t index, bool gated);
  void Feed(size_t index);
  bool FeedReplay(size_t index);  // false: stopped (what was left became drop marks)
  bool PushToPool(size_t index, video::Frame frame);
  void SaveFrame(const Stream& s, const video::Frame& f) const;

  StreamIngestOptions options_;
  Clock* const clock_;
  std::vector<StreamDecode> decode_;  // Open
  std::vector<Stream> streams_;       // complete before any thread reads it
  StreamLedger* ledger_ = nullptr;    // set_ledger
  bool warm_cameras_ = false;         // StartFollowing
  // A warm standby: the gate its readers pass before the takeover. streams_ is complete before gate_ is set, and
  // FollowMirrored sees the gate (following_) only after both.
  std::unique_ptr<StandbyGate> gate_;             // Run's thread sets it before the readers start
  std::atomic<StandbyGate*> following_{nullptr};  // gate_, published to FollowMirrored (any thread)
  std::atomic<int> active_{0};
  std::vector<std::thread> feeders_;
};

}  // namespace vigil::pipeline
