// aggregator/transport_metrics.h — the links' counters mirrored into the aggregator's metrics registry at scrape
// time (internal to src/aggregator): each receiver's ReceiverStats (vigil_transport_*{link}), the ucx link's rows
// messages (vigil_ucx_*) and the cuda_ipc link's rings (vigil_cuda_ipc_*). The sources count monotonically; at
// every scrape (a Registry collect hook) each counter is advanced by what its source counted since the last one.
// Every vigil_transport_rejected_total reason exists from the start (at 0), so a dashboard's rate() sees the first.
//
// Ownership: each Mirror* call adds one collect hook to `registry` that owns what it needs (its last-seen copy,
// the source function); the source must stay valid as long as the registry may collect (the aggregator stops its
// HTTP server, the only scraper, before its receivers go). No threads of its own: hooks run on the scraping thread.
// Thread-safety: hooks may run concurrently (each last-seen copy has its own mutex); the source functions must be
// thread-safe (Receiver::Stats, GetUcxCounters and GetCudaIpcCounters are).
// Errors: none.
#pragma once

#include <functional>
#include <string>

#include "vigil/metrics/registry.h"
#include "vigil/transport/cuda_ipc.h"
#include "vigil/transport/receiver.h"
#include "vigil/transport/ucx.h"

namespace vigil::aggregator {

// vigil_transport_{connections,disconnects,repeated_reports,received_bytes,received_frames,rejected}_total{link}.
void MirrorReceiverStats(metrics::Registry& registry, const std::string& link,
                         std::function<transport::ReceiverStats()> stats);

// vigil_ucx_rows_{messages,into_device,rejected}_total and the vigil_ucx_cuda_memory gauge.
void MirrorUcxCounters(metrics::Registry& registry,
                       std::function<transport::UcxCounters()> counters = transport::GetUcxCounters);

// vigil_cuda_ipc_{rings_offered,ring_failures,slots,slots_rejected,device_reports,bytes}_total.
void MirrorCudaIpcCounters(metrics::Registry& registry,
                           std::function<transport::CudaIpcCounters()> counters = transport::GetCudaIpcCounters);

}  // namespace vigil::aggregator
