// vigil/pipeline/takeover_controller.h — a hot standby's takeover as the new primary's edge sees it (issue 17):
// the steps on its path (takeover_timeline.h), the frame whose storage completes it, and what it reports.
//
// RunEdge starts the timeline at the old primary's last contact (timeline().Start) and marks the standby's own
// steps; the edge marks the rest as they happen (Mark: ledger, welcomed, durable, resumed, fed). The takeover's
// first detected batch names the frame that completes it (FirstBatch: its first frame's FrameKey), the first
// re-published result of the old primary another (Republishing); OnAck marks `stored` / `republished_stored` when
// the aggregator's Ack covers that frame, and then exports and logs the timeline:
//   vigil_edge_takeover_phase_seconds{phase}  seconds from the old primary's last contact to each step reached
//   vigil_edge_takeover_seconds               … to the first frame this node processed stored
//   vigil_edge_takeover_camera_gap_seconds{stream}  a live stream's camera time no node numbered: the old
//                                                   primary's last contact to this node's first frame of it
// Before Start (no takeover: a primary, a lone edge) every call is a cheap no-op apart from Mark's ignored marks.
//
// Ownership: the Edge owns it; it refers to the registry (outlives it) and the clock (never null).
// Threads: Mark from any thread (reader, feeder, courier, Run's); FirstBatch on the pool's sink thread;
// Republishing on a feeder thread; OnAck on the courier's reader thread. Thread-safe (one mutex for the two
// frames; the timeline is lock-free). Errors: none.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "vigil/common/clock.h"
#include "vigil/common/frame_key.h"
#include "vigil/common/mutex.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/takeover_timeline.h"
#include "vigil/pipeline/workers.h"
#include "vigil/transport/protocol.h"

namespace vigil::pipeline {

class TakeoverController {
 public:
  // `edge`: the edge id (FrameKey::edge, logs). `clock`: the steps' times (Default: the system clock).
  TakeoverController(std::string edge, metrics::Registry& registry, Clock* clock = SystemClock());

  // The timeline (RunEdge starts it and marks the standby's steps before Run's own).
  TakeoverTimeline& timeline() { return timeline_; }
  // Marks `p` now (the first mark of a phase wins; ignored before Start). true: this call marked it.
  bool Mark(TakeoverTimeline::Phase p) { return timeline_.Mark(p, clock_->SteadyNs()); }
  // The old primary's last contact (steady ns; 0 until the takeover), for the camera gap. Set before Run.
  void set_contact(std::shared_ptr<const std::atomic<int64_t>> contact) { contact_ = std::move(contact); }

  // A batch the pool completed (detections ready; not empty), `stream` the id of its first frame's stream: true
  // when it is the takeover's first (marks `detected`, remembers its first frame and logs where the batch's time
  // went), which the caller flushes at once.
  bool FirstBatch(const BatchResult& batch, const std::string& stream) VIGIL_EXCLUDES(mu_);
  // The frame whose storage completes the takeover (FirstBatch's), once known.
  std::optional<FrameKey> first_processed() const VIGIL_EXCLUDES(mu_);
  // A stream's first re-published result of the old primary (FeedReplay): marks `republished` once per takeover
  // and remembers `key`.
  void Republishing(const FrameKey& key) VIGIL_EXCLUDES(mu_);
  // An Ack of the aggregator (a stored report): completes the takeover when it covers the remembered frames.
  void OnAck(const transport::Ack& ack) VIGIL_EXCLUDES(mu_);
  // A live stream's first frame on this node (its seq): after a takeover, the camera time missed (gauge, log).
  void FirstLiveFrame(const std::string& stream, uint64_t seq);

 private:
  // Whether `ack` (this edge's) covers `key`.
  static bool Covers(const transport::Ack& ack, const std::optional<FrameKey>& key);
  void LogTimeline();           // once the first frame this node processed is stored
  void LogRepublishedStored();  // once the first re-published result is stored

  const std::string edge_;
  metrics::Registry& reg_;
  Clock* const clock_;
  TakeoverTimeline timeline_;
  std::shared_ptr<const std::atomic<int64_t>> contact_;  // set before Run
  mutable Mutex mu_;
  std::optional<FrameKey> first_processed_ VIGIL_GUARDED_BY(mu_);    // the takeover's first detected frame
  std::optional<FrameKey> first_republished_ VIGIL_GUARDED_BY(mu_);  // … and its first re-published result
};

}  // namespace vigil::pipeline
