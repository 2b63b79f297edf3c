// vigil/pipeline/link_metrics.h — the edge's link metrics, sampled from the courier's stats (transport/courier.h)
// and the process-wide counters of the cuda_ipc and ucx links.
//
// Sample(stats) turns what the courier counted since the last Sample into counter increments, and sets the gauges:
//   vigil_edge_link_sessions_total{link}, _link_messages_total{link}, _link_open_failures_total{link}
//   vigil_edge_link_active{link}      1 on the link that carries the session now
//   vigil_edge_link_degraded{link}    1 when a ucx link's last session ran over TCP inside UCX (not the fast path)
//   vigil_edge_link_transports{link,transports}  1 on what carries the link underneath now, 0 on an old value
//   vigil_edge_link_switches_total, _link_fail_backs_total, _auth_failures_total, _ack_timeouts_total,
//   vigil_edge_snapshot_link_total{result=sent|dropped|lost}
//   with a cuda_ipc link: vigil_edge_cuda_ipc_slots_total, _slot_waits_total, _device_reports_total,
//     _map_failures_total, _publisher_launches_total; with a ucx link: vigil_edge_ucx_device_reports_total,
//     vigil_edge_ucx_cuda_memory.
// Ownership: the Edge owns it; it refers to the registry (outlives it). Threads: Run's periodic tick and the
// final sample (Sample may overlap a scrape's: one mutex). Thread-safety: Sample is thread-safe. Errors: none.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "vigil/common/mutex.h"
#include "vigil/metrics/registry.h"
#include "vigil/transport/courier.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/ucx.h"

namespace vigil::pipeline {

class LinkMetrics {
 public:
  // `links`: the configured link kinds (edge_config.h transport.links), e.g. {"tcp", "ucx"}.
  LinkMetrics(metrics::Registry& registry, std::vector<std::string> links);
  void Sample(const transport::CourierStats& stats) VIGIL_EXCLUDES(mu_);

 private:
  metrics::Registry& reg_;
  const bool cuda_ipc_, ucx_;  // those links configured
  Mutex mu_;
  transport::CourierStats last_courier_ VIGIL_GUARDED_BY(mu_);  // at the last Sample
  transport::CudaIpcCounters last_ring_ VIGIL_GUARDED_BY(mu_);
  transport::UcxCounters last_ucx_ VIGIL_GUARDED_BY(mu_);
  std::map<std::string, std::string> transports_ VIGIL_GUARDED_BY(mu_);  // link → transports shown
};

}  // namespace vigil::pipeline
