// The edge's link metrics (link_metrics.h) from hand-made courier stats: deltas become counter increments, the
// gauges follow the current session and what carries it.
#include "vigil/pipeline/link_metrics.h"

#include <gtest/gtest.h>

namespace vigil::pipeline {
namespace {

transport::CourierStats Stats(uint64_t tcp_sessions, uint64_t tcp_sent, uint64_t ucx_failures, std::string ucx_transports,
                              std::string link) {
  transport::CourierStats cs;
  cs.links.push_back({"tcp", "agg:7401", tcp_sessions, 0, tcp_sent, ""});
  cs.links.push_back({"ucx", "agg:7402", 0, ucx_failures, 0, std::move(ucx_transports)});
  cs.link = std::move(link);
  cs.connected = !cs.link.empty();
  return cs;
}

TEST(LinkMetrics, CountsWhatTheCourierCountedSinceTheLastSample) {
  metrics::Registry reg;
  LinkMetrics m(reg, {"tcp"});  // no ucx / cuda_ipc process counters read
  transport::CourierStats cs = Stats(1, 10, 2, "tcp", "tcp");
  cs.ack_timeouts = 1;
  cs.snapshots_sent = 4;
  m.Sample(cs);
  cs = Stats(2, 25, 3, "tcp", "tcp");
  cs.ack_timeouts = 1;
  cs.snapshots_sent = 6;
  m.Sample(cs);
  auto counter = [&](const char* name, metrics::Labels l) { return reg.GetCounter(name, "", std::move(l)).Value(); };
  auto gauge = [&](const char* name, metrics::Labels l) { return reg.GetGauge(name, "", std::move(l)).Value(); };
  EXPECT_EQ(counter("vigil_edge_link_sessions_total", {{"link", "tcp"}}), 2);
  EXPECT_EQ(counter("vigil_edge_link_messages_total", {{"link", "tcp"}}), 25);
  EXPECT_EQ(counter("vigil_edge_link_open_failures_total", {{"link", "ucx"}}), 3);
  EXPECT_EQ(counter("vigil_edge_ack_timeouts_total", {}), 1);
  EXPECT_EQ(counter("vigil_edge_snapshot_link_total", {{"result", "sent"}}), 6);
  EXPECT_EQ(gauge("vigil_edge_link_active", {{"link", "tcp"}}), 1);
  EXPECT_EQ(gauge("vigil_edge_link_active", {{"link", "ucx"}}), 0);
  // A ucx link whose only transport is TCP inside UCX is degraded.
  EXPECT_EQ(gauge("vigil_edge_link_degraded", {{"link", "ucx"}}), 1);
  EXPECT_EQ(gauge("vigil_edge_link_transports", {{"link", "ucx"}, {"transports", "tcp"}}), 1);
  m.Sample(Stats(2, 25, 3, "rc,cuda_copy", "ucx"));
  EXPECT_EQ(gauge("vigil_edge_link_degraded", {{"link", "ucx"}}), 0);
  EXPECT_EQ(gauge("vigil_edge_link_transports", {{"link", "ucx"}, {"transports", "tcp"}}), 0);
  EXPECT_EQ(gauge("vigil_edge_link_transports", {{"link", "ucx"}, {"transports", "rc,cuda_copy"}}), 1);
  EXPECT_EQ(gauge("vigil_edge_link_active", {{"link", "ucx"}}), 1);
  EXPECT_EQ(gauge("vigil_edge_link_active", {{"link", "tcp"}}), 0);
}

}  // namespace
}  // namespace vigil::pipeline
