// Internal: the Edge (edge.cc, the composition root of the pipeline's parts) as RunEdge's replication roles
// (edge_roles.cc) drive it: a lone edge runs one; a primary, a standby and a fenced primary that rejoins run one
// per cycle, on the same registry.
//
// Ownership: RunEdge owns each EdgeNode for one Run. The channel, ring, window and contact it is handed are the
// caller's (they outlive Run). Threads: Run blocks its caller (see edge.h); FollowMirrored from the standby's
// state writer thread, FlushForHandover from the step-down thread; the setters before Run (or, the channel and
// ring, in after_load). Errors: Run's (edge.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vigil/common/status.h"
#include "vigil/metrics/registry.h"
#include "vigil/pipeline/edge.h"
#include "vigil/pipeline/edge_config.h"
#include "vigil/pipeline/health.h"
#include "vigil/pipeline/ledger.h"
#include "vigil/pipeline/mirror_window.h"
#include "vigil/pipeline/takeover_timeline.h"
#include "vigil/replication/channel.h"
#include "vigil/replication/frame_ring.h"

namespace vigil::pipeline {

class EdgeNode {
 public:
  virtual ~EdgeNode() = default;
  virtual Status Run(const EdgeRunOptions& options) = 0;
  // This edge is (or becomes, at a takeover) the primary and serves `channel` (not owned; outlives Run): every
  // state its ledger persists is mirrored to the paired standby and, with replication.mirror_frames, every live
  // picture it numbers (picture_mirror.h). Set before the ledger opens (before Run, or in after_load).
  virtual void set_primary_channel(replication::PrimaryChannel* channel) = 0;
  // With replication.mirror_via shm: the primary's picture ring (not owned; outlives Run).
  virtual void set_frame_publisher(replication::FramePublisher* frames) = 0;
  // A standby's window of the primary's mirrored live pictures (filled while it waits): at the takeover those
  // the aggregator lacks are processed again. Set before Run.
  virtual void set_mirror_window(std::shared_ptr<MirrorWindow> window) = 0;
  // A second Edge on the same registry (a fenced primary rejoining as standby) must not hook it again.
  virtual void set_register_numa(bool on) = 0;
  // A standby: the primary's last contact (steady ns) once it took over, 0 before (the camera gap). Before Run.
  virtual void set_takeover_contact(std::shared_ptr<const std::atomic<int64_t>> contact) = 0;
  // A standby's takeover, step by step (the caller starts it and marks the steps before Run's own).
  virtual TakeoverTimeline& takeover_timeline() = 0;
  // A hot standby (set before Run): the streams are opened before options.after_load (the wait for the primary
  // to fail) and the replayable ones read through a StandbyGate up to the cursor FollowMirrored passes; with
  // `cameras`, the live ones too (every picture discarded), so the takeover finds them connected.
  virtual void set_warm_standby(bool cameras) = 0;
  // The primary's ledger records as mirrored (any thread; before Run's after_load returns).
  virtual void FollowMirrored(const std::vector<StreamRecord>& records) = 0;
  // Calls `f` once, on Run's thread, when this edge finds itself unhealthy (health_watch.h). Set before Run.
  virtual void set_on_unhealthy(std::function<void(const std::string& why)> f, HealthBounds bounds) = 0;
  // A handover's flush (any thread, while the Edge lives): publishes every mark the ledger still holds and waits
  // until the aggregator acknowledged everything handed to the outbox so far. false: `timeout` passed (or the
  // edge is not publishing).
  virtual bool FlushForHandover(std::chrono::milliseconds timeout) = 0;
};

// The edge pipeline for `config` (edge.cc). `stop` and `registry` outlive it.
std::unique_ptr<EdgeNode> MakeEdgeNode(const EdgeConfig& config, const std::atomic<bool>& stop,
                                       metrics::Registry& registry);

}  // namespace vigil::pipeline
