// The edge's HTTP server (edge_http.h) on a free loopback port with fake callbacks: the three routes, and a
// server that is off.
#include "vigil/pipeline/edge_http.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <string>

namespace vigil::pipeline {
namespace {

TEST(EdgeHttp, PortZeroIsNoServer) {
  metrics::Registry reg;
  EdgeHttp http;
  EdgeHttpOptions o;
  o.registry = &reg;
  ASSERT_TRUE(http.Start(std::move(o)).ok());
  EXPECT_TRUE(http.started());
  EXPECT_EQ(http.port(), 0);
  http.Stop();
}

TEST(EdgeHttp, ServesHealthMetricsAndPlacement) {
  metrics::Registry reg;
  reg.GetCounter("vigil_test_things_total", "Things").Inc(3);
  std::atomic<bool> placed{false};
  EdgeHttp http;
  EdgeHttpOptions o;
  o.edge = "e1";
  o.host = "127.0.0.1";
  o.any_port = true;
  o.registry = &reg;
  o.healthz = [] { return std::make_pair(503, std::string(R"({"status":"fenced"})")); };
  o.placement_json = [&]() -> std::optional<std::string> {
    if (!placed.load()) return std::nullopt;
    return std::string(R"({"threads":[]})");
  };
  ASSERT_TRUE(http.Start(std::move(o)).ok());
  ASSERT_GT(http.port(), 0);
  httplib::Client client("127.0.0.1", http.port());
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(health->body, R"({"status":"fenced"})");
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("vigil_test_things_total 3"), std::string::npos) << metrics->body;
  httplib::Result not_placed = client.Get("/api/placement");
  ASSERT_TRUE(not_placed);
  EXPECT_EQ(not_placed->status, 503);
  placed = true;
  httplib::Result report = client.Get("/api/placement");
  ASSERT_TRUE(report);
  EXPECT_EQ(report->status, 200);
  EXPECT_EQ(report->body, R"({"threads":[]})");
  http.Stop();
  http.Stop();  // idempotent
}

}  // namespace
}  // namespace vigil::pipeline
