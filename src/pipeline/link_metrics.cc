#include "vigil/pipeline/link_metrics.h"

#include <algorithm>
#include <utility>

namespace vigil::pipeline {

// Per link: sessions, messages and failed opens as counters; which link carries the session now; and
// whether a ucx link runs over TCP inside UCX (degraded: the fast path is not there).
LinkMetrics::LinkMetrics(metrics::Registry& registry, std::vector<std::string> links)
    : reg_(registry),
      cuda_ipc_(std::find(links.begin(), links.end(), "cuda_ipc") != links.end()),
      ucx_(std::find(links.begin(), links.end(), "ucx") != links.end()) {}

void LinkMetrics::Sample(const transport::CourierStats& cs) {
  auto delta = [](uint64_t now_v, uint64_t before) { return static_cast<double>(now_v - before); };
  MutexLock lock(mu_);  // scrapes and the final sample may overlap
  for (size_t i = 0; i < cs.links.size(); ++i) {
    const transport::CourierLinkStats& l = cs.links[i];
    const transport::CourierLinkStats before = i < last_courier_.links.size() ? last_courier_.links[i]
                                                                            : transport::CourierLinkStats{};
    const metrics::Labels labels{{"link", l.kind}};
    reg_.GetCounter("vigil_edge_link_sessions_total", "Sessions admitted, by link", labels)
        .Inc(delta(l.sessions, before.sessions));
    reg_.GetCounter("vigil_edge_link_messages_total", "Reports written, re-sends included, by link", labels)
        .Inc(delta(l.sent, before.sent));
    reg_.GetCounter("vigil_edge_link_open_failures_total", "Sessions that could not be opened, by link", labels)
        .Inc(delta(l.open_failures, before.open_failures));
    reg_.GetGauge("vigil_edge_link_active", "1 on the link that carries the session now", labels)
        .Set(cs.connected && cs.link == l.kind ? 1 : 0);
    // UCX may fall back to TCP inside itself (no shared memory, no RDMA): working, but not the fast path.
    const bool degraded = l.kind == "ucx" && !l.transports.empty() && l.transports.find("tcp") != std::string::npos &&
                          l.transports.find(',') == std::string::npos;
    reg_.GetGauge("vigil_edge_link_degraded", "1 when a ucx link's last session ran over TCP inside UCX", labels)
        .Set(degraded ? 1 : 0);
    // What carries the link underneath (UCX's selected transports), Prometheus' "info" pattern: 1 on the
    // current value, 0 on an old one.
    std::string& shown = transports_[l.kind];
    if (!l.transports.empty() && l.transports != shown) {
      auto info = [&](const std::string& t) -> metrics::Gauge& {
        return reg_.GetGauge("vigil_edge_link_transports", "1 on what carries the link underneath (UCX: its transports)",
                             {{"link", l.kind}, {"transports", t}});
      };
      if (!shown.empty()) info(shown).Set(0);
      info(l.transports).Set(1);
      shown = l.transports;
    }
  }
  reg_.GetCounter("vigil_edge_link_switches_total", "Sessions on another link than the previous one")
      .Inc(delta(cs.link_switches, last_courier_.link_switches));
  reg_.GetCounter("vigil_edge_link_fail_backs_total", "Moves back to a preferred link found by a probe")
      .Inc(delta(cs.fail_backs, last_courier_.fail_backs));
  reg_.GetCounter("vigil_edge_auth_failures_total", "Sessions refused for authentication (either side)")
      .Inc(delta(cs.auth_failures, last_courier_.auth_failures));
  reg_.GetCounter("vigil_edge_ack_timeouts_total", "Sessions replaced because an ack did not come in time")
      .Inc(delta(cs.ack_timeouts, last_courier_.ack_timeouts));
  const char* snap_help = "Snapshots the courier wrote (sent), refused for a full queue or at its close (dropped), "
                          "or lost with a broken session (lost)";
  reg_.GetCounter("vigil_edge_snapshot_link_total", snap_help, {{"result", "sent"}})
      .Inc(delta(cs.snapshots_sent, last_courier_.snapshots_sent));
  reg_.GetCounter("vigil_edge_snapshot_link_total", snap_help, {{"result", "dropped"}})
      .Inc(delta(cs.snapshots_dropped, last_courier_.snapshots_dropped));
  reg_.GetCounter("vigil_edge_snapshot_link_total", snap_help, {{"result", "lost"}})
      .Inc(delta(cs.snapshots_lost, last_courier_.snapshots_lost));
  last_courier_ = cs;
  // The cuda_ipc link's ring, edge side (process-wide counters; only with that link configured).
  if (cuda_ipc_) {
    const transport::CudaIpcCounters now = transport::GetCudaIpcCounters();
    const transport::CudaIpcCounters& was = last_ring_;
    reg_.GetCounter("vigil_edge_cuda_ipc_slots_total", "cuda_ipc ring slots published")
        .Inc(delta(now.slots_written, was.slots_written));
    reg_.GetCounter("vigil_edge_cuda_ipc_slot_waits_total", "Sends that found every ring slot in use and waited")
        .Inc(delta(now.slot_waits, was.slot_waits));
    reg_.GetCounter("vigil_edge_cuda_ipc_device_reports_total", "Reports sent from device memory without a host copy")
        .Inc(delta(now.device_rows_sent, was.device_rows_sent));
    reg_.GetCounter("vigil_edge_cuda_ipc_map_failures_total", "Ring offers that could not be mapped or carried an error")
        .Inc(delta(now.map_failures, was.map_failures));
    reg_.GetCounter("vigil_edge_cuda_ipc_publisher_launches_total",
                    "Launches of the resident publisher kernel (GPU rings; far fewer than slots under load)")
        .Inc(delta(now.publisher_launches, was.publisher_launches));
    last_ring_ = now;
  }
  // The ucx link's rows sent from GPU memory (process-wide counters; only with that link configured).
  if (ucx_) {
    const transport::UcxCounters now = transport::GetUcxCounters();
    reg_.GetCounter("vigil_edge_ucx_device_reports_total", "Reports whose rows UCX sent from GPU memory (no host copy)")
        .Inc(delta(now.rows_messages_sent_from_device, last_ucx_.rows_messages_sent_from_device));
    reg_.GetGauge("vigil_edge_ucx_cuda_memory", "1 when the UCX loaded takes CUDA memory (CUDA transports)")
        .Set(now.cuda_memory_workers > 0 ? 1 : 0);
    last_ucx_ = now;
  }
}

}  // namespace vigil::pipeline
