#include "aggregator/transport_metrics.h"

#include <map>
#include <memory>

#include "vigil/common/mutex.h"

namespace vigil::aggregator {
namespace {

// The source's value at the last scrape.
template <class T>
class LastSeen {
 public:
  // Stores `now`, returns what was stored before.
  T Swap(const T& now) VIGIL_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    T was = last_;
    last_ = now;
    return was;
  }

 private:
  Mutex mu_;
  T last_ VIGIL_GUARDED_BY(mu_){};
};

double Delta(uint64_t now, uint64_t was) { return static_cast<double>(now - was); }

}  // namespace

void MirrorCudaIpcCounters(metrics::Registry& registry, std::function<transport::CudaIpcCounters()> counters) {
  auto mirror = std::make_shared<LastSeen<transport::CudaIpcCounters>>();
  auto counter = [&](const char* name, const char* help) { return &registry.GetCounter(name, help, {}); };
  metrics::Counter* offered = counter("vigil_cuda_ipc_rings_offered_total", "cuda_ipc sessions offered a ring");
  metrics::Counter* failed =
      counter("vigil_cuda_ipc_ring_failures_total", "cuda_ipc sessions whose ring could not be set up");
  metrics::Counter* slots = counter("vigil_cuda_ipc_slots_total", "cuda_ipc ring slots taken and checked");
  metrics::Counter* rejected =
      counter("vigil_cuda_ipc_slots_rejected_total", "cuda_ipc ring slots that failed a check (not stored)");
  metrics::Counter* device =
      counter("vigil_cuda_ipc_device_reports_total", "Reports whose rows came from the edge's device memory");
  metrics::Counter* bytes = counter("vigil_cuda_ipc_bytes_total", "cuda_ipc slot bytes copied to the host");
  registry.AddCollectHook([=, counters = std::move(counters)] {
    const transport::CudaIpcCounters now = counters();
    const transport::CudaIpcCounters last = mirror->Swap(now);
    offered->Inc(Delta(now.rings_offered, last.rings_offered));
    failed->Inc(Delta(now.ring_failures, last.ring_failures));
    slots->Inc(Delta(now.slots_received, last.slots_received));
    rejected->Inc(Delta(now.slots_rejected, last.slots_rejected));
    device->Inc(Delta(now.device_reports, last.device_reports));
    bytes->Inc(Delta(now.bytes_received, last.bytes_received));
  });
}

void MirrorUcxCounters(metrics::Registry& registry, std::function<transport::UcxCounters()> counters) {
  auto mirror = std::make_shared<LastSeen<transport::UcxCounters>>();
  auto counter = [&](const char* name, const char* help) { return &registry.GetCounter(name, help, {}); };
  metrics::Counter* rows = counter("vigil_ucx_rows_messages_total",
                                   "ucx Reports whose rows came apart from their frame (from the edge's GPU memory)");
  metrics::Counter* into_device =
      counter("vigil_ucx_rows_into_device_total", "… of them received into this aggregator's GPU memory (ucx_device)");
  metrics::Counter* rejected =
      counter("vigil_ucx_rows_rejected_total", "ucx rows messages that failed a check (not stored; session ended)");
  metrics::Gauge* cuda =
      &registry.GetGauge("vigil_ucx_cuda_memory", "1 when the UCX loaded takes CUDA memory (CUDA transports)", {});
  registry.AddCollectHook([=, counters = std::move(counters)] {
    const transport::UcxCounters now = counters();
    const transport::UcxCounters last = mirror->Swap(now);
    rows->Inc(Delta(now.rows_messages_received, last.rows_messages_received));
    into_device->Inc(Delta(now.rows_received_into_device, last.rows_received_into_device));
    rejected->Inc(Delta(now.rows_messages_rejected, last.rows_messages_rejected));
    cuda->Set(now.cuda_memory_workers > 0 ? 1 : 0);
  });
}

void MirrorReceiverStats(metrics::Registry& registry, const std::string& link,
                         std::function<transport::ReceiverStats()> stats) {
  auto mirror = std::make_shared<LastSeen<transport::ReceiverStats>>();
  const char* conn_help = "Edge connections by outcome";
  auto conn = [&](const char* result) -> metrics::Counter* {
    return &registry.GetCounter("vigil_transport_connections_total", conn_help, {{"link", link}, {"result", result}});
  };
  const char* disc_help = "Edge connections closed by the aggregator";
  auto disc = [&](const char* reason) -> metrics::Counter* {
    return &registry.GetCounter("vigil_transport_disconnects_total", disc_help, {{"link", link}, {"reason", reason}});
  };
  struct Counters {
    metrics::Counter *accepted, *refused, *authenticated, *protocol, *timeouts, *gaps, *repeated, *bytes, *frames;
  } c{conn("accepted"),
      conn("refused"),
      conn("authenticated"),
      disc("protocol_error"),
      disc("timeout"),
      disc("sequence_gap"),
      &registry.GetCounter("vigil_transport_repeated_reports_total", "Duplicated report frames ignored",
                           {{"link", link}}),
      &registry.GetCounter("vigil_transport_received_bytes_total", "Bytes received from edges", {{"link", link}}),
      &registry.GetCounter("vigil_transport_received_frames_total", "Protocol frames received", {{"link", link}})};
  // Every reason exists from the start (at 0), so a dashboard's rate() sees the first rejection.
  std::map<std::string, metrics::Counter*> rejected;
  for (const char* reason : {transport::kRejectAddress, transport::kRejectUnknownEdge, transport::kRejectBadProof,
                             transport::kRejectNoProof, transport::kRejectHandshakeTimeout,
                             transport::kRejectMalformed, transport::kRejectVersion, transport::kRejectTls,
                             transport::kRejectChallengeRefused, transport::kRejectPeerCredentials,
                             transport::kRejectRingUnavailable, transport::kRejectRingRefused}) {
    rejected[reason] = &registry.GetCounter("vigil_transport_rejected_total",
                                            "Connections refused before their session began, by reason",
                                            {{"link", link}, {"reason", reason}});
  }
  registry.AddCollectHook([=, stats = std::move(stats)] {
    const transport::ReceiverStats now = stats();
    const transport::ReceiverStats last = mirror->Swap(now);
    c.accepted->Inc(Delta(now.accepted, last.accepted));
    c.refused->Inc(Delta(now.refused, last.refused));
    c.authenticated->Inc(Delta(now.authenticated, last.authenticated));
    c.protocol->Inc(Delta(now.protocol_errors - now.sequence_gaps, last.protocol_errors - last.sequence_gaps));
    c.timeouts->Inc(Delta(now.timeouts, last.timeouts));
    c.gaps->Inc(Delta(now.sequence_gaps, last.sequence_gaps));
    c.repeated->Inc(Delta(now.repeated_reports, last.repeated_reports));
    c.bytes->Inc(Delta(now.bytes, last.bytes));
    c.frames->Inc(Delta(now.frames, last.frames));
    for (const auto& [reason, n] : now.rejected) {
      auto it = rejected.find(reason);
      if (it == rejected.end()) continue;
      auto was = last.rejected.find(reason);
      it->second->Inc(Delta(n, was == last.rejected.end() ? 0 : was->second));
    }
  });
}

}  // namespace vigil::aggregator
