// RunEdge (edge.h): an edge alone, or in its replication role (edge_config.h `replication:`) — a primary that
// serves the channel and steps down when unhealthy, a standby that waits and takes over, a fenced primary that
// rejoins as the standby — each cycle one EdgeNode (edge_node.h) on the same registry.
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "edge_node.h"
#include "replication_role.h"
#include "vigil/transport/device_memory.h"
#include "vigil/common/clock.h"
#include "vigil/pipeline/mirror_window.h"
#include "vigil/pipeline/placement.h"

namespace vigil::pipeline {
namespace {

int64_t SteadyNs() { return SystemClock()->SteadyNs(); }

}  // namespace

Status RunEdge(const EdgeConfig& config, const std::atomic<bool>& stop, metrics::Registry& registry,
               const EdgeRunOptions& options) {
  const ReplicationConfig& rc = config.replication;
  if (rc.role == ReplicationConfig::Role::kNone) {
    return MakeEdgeNode(config, stop, registry)->Run(options);
  }
  VIGIL_ASSIGN_OR_RETURN(replication::PairDigest digest, PairDigestOf(config));
  if (rc.mirror_via == ReplicationConfig::MirrorVia::kShm && rc.mirror_memory != "host") {
    // The ring this node creates whenever it is the standby: its GPU must be there (said now, not at a pairing).
    // Only counted: a CUDA context made here, before FFmpeg's, would make NVDEC refuse the device.
    const int device = std::stoi(rc.mirror_memory.substr(5));
    const int visible = transport::device_memory::VisibleDevices();
    if (device >= visible) {
      return absl::FailedPreconditionError(
          StrCat("replication.mirror_memory ", rc.mirror_memory, ": no such GPU here (", visible, " visible",
                 transport::device_memory::Available() ? "" : "; this vigil was built without CUDA", ")"));
    }
  }
  auto role = [&registry](const char* r) -> metrics::Gauge& {
    return registry.GetGauge("vigil_edge_replication_role", "1 on this edge's current replication role", {{"role", r}});
  };
  metrics::Counter& takeovers = registry.GetCounter("vigil_edge_takeovers_total", "Takeovers of this standby");
  metrics::Counter& rejoins =
      registry.GetCounter("vigil_edge_rejoins_total", "Times this primary was fenced and rejoined as the standby");
  // vigil_edge_takeover_seconds and _phase_seconds: the Edge sets them (TakeoverController); scrapeable at 0.
  registry.GetGauge("vigil_edge_takeover_seconds",
                    "The primary's last contact to the first frame this edge processed stored, last takeover");
  metrics::Counter& step_downs =
      registry.GetCounter("vigil_edge_step_downs_total", "Times this primary found itself unhealthy and handed over");
  bool standby = rc.role == ReplicationConfig::Role::kStandby;
  if (!standby) {
    // Restarted after the peer took over? Then the peer is the primary and this node its standby.
    VIGIL_ASSIGN_OR_RETURN(standby, PeerIsPrimary(config, digest));
    if (standby) spdlog::warn("replication: the peer at {} is the primary now: '{}' starts as its standby", rc.peer, rc.node);
  }
  for (int cycle = 0;; ++cycle) {
    const std::unique_ptr<EdgeNode> node = MakeEdgeNode(config, stop, registry);
    EdgeNode& edge = *node;
    edge.set_register_numa(cycle == 0);
    std::unique_ptr<replication::FramePublisher> frames;  // mirror_via shm: the standby's ring (before channel:
                                                           // the channel's offer uses it)
    std::unique_ptr<replication::PrimaryChannel> channel;
    // Serve the channel and mirror every persisted ledger state: before the ledger opens.
    auto become_primary = [&]() -> Status {
      if (rc.mirror_frames && rc.mirror_via == ReplicationConfig::MirrorVia::kShm && !frames) {
        VIGIL_ASSIGN_OR_RETURN(frames, ListenForFrameRing(config));
        edge.set_frame_publisher(frames.get());
      }
      VIGIL_ASSIGN_OR_RETURN(channel, StartPrimaryChannel(config, digest, frames.get()));
      edge.set_primary_channel(channel.get());
      role("primary").Set(1);
      role("standby").Set(0);
      return absl::OkStatus();
    };
    // The primary's own health: unhealthy with a standby paired, it hands over at once (Finished with the
    // reason; the standby's promotion then fences this node, which rejoins as the standby). Without a standby
    // it goes on: a degraded primary publishes more than none.
    std::thread stepping_down;
    edge.set_on_unhealthy(
        [&](const std::string& why) {
          if (!channel || !channel->stats().standby_connected) {
            spdlog::error("replication: '{}' is unhealthy ({}) but has no standby to hand over to: it goes on", rc.node,
                          why);
            return;
          }
          step_downs.Inc();
          spdlog::error("replication: '{}' steps down: {}; its standby takes over", rc.node, why);
          stepping_down = std::thread([ch = channel.get(), why, &edge, &rc] {
            // What this primary decided (the failed batches' drop marks) is stored before the standby
            // resumes from the aggregator's cursor; bounded: an unreachable aggregator must not hold the
            // handover (the standby needs it too, and would then re-process those frames instead).
            const auto bound = std::chrono::milliseconds(1000);
            if (!edge.FlushForHandover(bound)) {
              spdlog::warn("replication: '{}' hands over with reports not yet acknowledged after {} ms: the "
                           "standby processes their frames again",
                           rc.node, bound.count());
            }
            ch->Finish(/*streams_done=*/false, why);
          });
        },
        HealthBounds{rc.step_down_stall_ms, rc.step_down_errors});
    EdgeRunOptions o = options;
    if (!standby) {
      VIGIL_RETURN_IF_ERROR(become_primary());
    } else {
      role("primary").Set(0);
      role("standby").Set(1);
      // The primary's last contact once taken over (the takeover's and the camera gap's start).
      auto contact = std::make_shared<std::atomic<int64_t>>(0);
      edge.set_takeover_contact(contact);
      if (rc.warm_sources != ReplicationConfig::WarmSources::kNone) {
        edge.set_warm_standby(/*cameras=*/rc.warm_sources == ReplicationConfig::WarmSources::kAll);
      }
      // The primary's live pictures the aggregator has not acknowledged, to process again at the takeover.
      std::shared_ptr<MirrorWindow> window;
      if (rc.mirror_frames) {
        std::vector<std::string> ids;
        for (const StreamConfig& sc : config.streams) ids.push_back(sc.id);
        window = std::make_shared<MirrorWindow>(std::move(ids), static_cast<size_t>(rc.mirror_window));
        edge.set_mirror_window(window);
      }
      o.after_load = [&, contact, window]() -> Status {
        PrewarmPlacement(config.placement);  // the topology discovery is not left on the takeover's path
        std::function<void(replication::MirroredFrame&&)> on_frame;
        std::function<void(replication::MirroredResult&&)> on_result;
        std::function<bool(const replication::MirroredFrame&)> wanted;  // a ring copies no acknowledged picture
        if (window) {
          on_frame = [window](replication::MirroredFrame&& f) { window->Add(std::move(f)); };
          wanted = [window](const replication::MirroredFrame& f) { return window->Wanted(f); };
        }
        if (window && rc.mirror_results) {
          on_result = [window](replication::MirroredResult&& r) { window->AddResult(std::move(r)); };
        }
        VIGIL_ASSIGN_OR_RETURN(Takeover t, RunStandby(
                                               config, digest, stop,
                                               [&edge, window](const std::vector<StreamRecord>& r) {
                                                 if (window) window->Follow(r);
                                                 edge.FollowMirrored(r);
                                               },
                                               std::move(on_frame), std::move(on_result), std::move(wanted)));
        takeovers.Inc();
        contact->store(t.last_contact_ns);
        edge.takeover_timeline().Start(t.last_contact_ns);
        edge.takeover_timeline().Mark(TakeoverTimeline::kDecided, t.decided_ns);
        edge.takeover_timeline().Mark(TakeoverTimeline::kDrained, SteadyNs());
        spdlog::warn("replication: '{}' is now the primary of edge '{}' ({} ms after the primary's last contact)",
                     rc.node, config.edge, (t.decided_ns - t.last_contact_ns) / 1'000'000);
        // The takeover goes on even when the channel cannot be served: publishing matters more than a standby.
        if (Status served = become_primary(); !served.ok()) {
          spdlog::error("replication: '{}' publishes without a standby: {}", rc.node, std::string(served.message()));
          role("primary").Set(1);
          role("standby").Set(0);
        }
        edge.takeover_timeline().Mark(TakeoverTimeline::kServing, SteadyNs());
        return absl::OkStatus();
      };
    }
    Status st = edge.Run(o);
    if (stepping_down.joinable()) stepping_down.join();
    if (channel) {
      // Tell the standby why this primary ends: every stream done (nothing to take over), or a stop asked for
      // (it takes over at once). A failure says nothing: the standby sees the stream end and takes over.
      if (st.ok()) channel->Finish(/*streams_done=*/!stop.load());
      channel->Stop();
    }
    if (stop.load() && (absl::IsCancelled(st) || absl::IsAborted(st))) return absl::OkStatus();
    if (standby && !channel && absl::IsCancelled(st)) return absl::OkStatus();  // the primary finished: so do we
    if (absl::IsAborted(st)) {
      // Fenced: the aggregator admitted the peer's newer epoch (it took over while this node was paused or
      // cut off from it). Nothing of ours is published any more; follow the peer as its standby.
      spdlog::warn("replication: '{}' was fenced ({}); rejoining edge '{}' as the standby of {}", rc.node,
                   std::string(st.message()), config.edge, rc.peer);
      rejoins.Inc();
      standby = true;
      continue;
    }
    return st;
  }
}

}  // namespace vigil::pipeline
