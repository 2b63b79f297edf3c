// The links' counters mirrored into a registry at each Render, from fake sources (no receivers, no sockets).
#include "aggregator/transport_metrics.h"

#include <gtest/gtest.h>

namespace vigil::aggregator {
namespace {

bool Has(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST(TransportMetricsTest, ReceiverStatsAdvanceByWhatWasCountedSinceTheLastScrape) {
  metrics::Registry registry;
  transport::ReceiverStats stats;
  MirrorReceiverStats(registry, "tcp", [&stats] { return stats; });
  std::string text = registry.Render();
  // Every rejection reason is there from the start.
  EXPECT_TRUE(Has(text, "vigil_transport_rejected_total{link=\"tcp\",reason=\"bad_proof\"} 0")) << text;
  EXPECT_TRUE(Has(text, "vigil_transport_connections_total{link=\"tcp\",result=\"accepted\"} 0")) << text;

  stats.accepted = 5;
  stats.protocol_errors = 3;  // one of them a sequence gap
  stats.sequence_gaps = 1;
  stats.bytes = 1000;
  stats.rejected[transport::kRejectBadProof] = 2;
  text = registry.Render();
  EXPECT_TRUE(Has(text, "vigil_transport_connections_total{link=\"tcp\",result=\"accepted\"} 5")) << text;
  EXPECT_TRUE(Has(text, "vigil_transport_disconnects_total{link=\"tcp\",reason=\"protocol_error\"} 2")) << text;
  EXPECT_TRUE(Has(text, "vigil_transport_disconnects_total{link=\"tcp\",reason=\"sequence_gap\"} 1")) << text;
  EXPECT_TRUE(Has(text, "vigil_transport_received_bytes_total{link=\"tcp\"} 1000")) << text;
  EXPECT_TRUE(Has(text, "vigil_transport_rejected_total{link=\"tcp\",reason=\"bad_proof\"} 2")) << text;

  stats.accepted = 7;
  stats.rejected[transport::kRejectBadProof] = 3;
  stats.rejected["not_a_reason"] = 9;  // unknown reasons are not invented
  text = registry.Render();
  EXPECT_TRUE(Has(text, "vigil_transport_connections_total{link=\"tcp\",result=\"accepted\"} 7")) << text;
  EXPECT_TRUE(Has(text, "vigil_transport_rejected_total{link=\"tcp\",reason=\"bad_proof\"} 3")) << text;
  EXPECT_EQ(text.find("not_a_reason"), std::string::npos);
  // A scrape with nothing new changes nothing.
  EXPECT_EQ(registry.Render(), text);
}

TEST(TransportMetricsTest, UcxAndCudaIpcCountersAreMirrored) {
  metrics::Registry registry;
  transport::UcxCounters ucx;
  transport::CudaIpcCounters ipc;
  MirrorUcxCounters(registry, [&ucx] { return ucx; });
  MirrorCudaIpcCounters(registry, [&ipc] { return ipc; });
  ucx.rows_messages_received = 4;
  ucx.cuda_memory_workers = 1;
  ipc.slots_received = 6;
  ipc.bytes_received = 600;
  std::string text = registry.Render();
  EXPECT_TRUE(Has(text, "vigil_ucx_rows_messages_total 4")) << text;
  EXPECT_TRUE(Has(text, "vigil_ucx_cuda_memory 1")) << text;
  EXPECT_TRUE(Has(text, "vigil_cuda_ipc_slots_total 6")) << text;
  EXPECT_TRUE(Has(text, "vigil_cuda_ipc_bytes_total 600")) << text;
  ucx.cuda_memory_workers = 0;
  ipc.slots_received = 10;
  text = registry.Render();
  EXPECT_TRUE(Has(text, "vigil_ucx_cuda_memory 0")) << text;
  EXPECT_TRUE(Has(text, "vigil_cuda_ipc_slots_total 10")) << text;
}

}  // namespace
}  // namespace vigil::aggregator
