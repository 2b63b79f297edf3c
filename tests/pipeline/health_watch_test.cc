// The edge's watch over its inference (health_watch.h) on a FakeClock: step-down once, stalls logged and counted
// once each, the injected faults. The injected stall's sleep is recorded, not slept.
#include "vigil/pipeline/health_watch.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vigil::pipeline {
namespace {

constexpr int64_t kMs = 1'000'000;

struct Fixture {
  Fixture() {
    HealthWatchOptions o;
    o.edge = "e1";
    o.registry = &registry;
    o.clock = &clock;
    o.sleep = [this](std::chrono::milliseconds d) { slept.push_back(d.count()); };
    watch = std::make_unique<HealthWatch>(std::move(o));
  }
  double Counter(const std::string& name) { return registry.GetCounter(name, "").Value(); }
  metrics::Registry registry;
  FakeClock clock;
  std::vector<int64_t> slept;
  std::unique_ptr<HealthWatch> watch;
};

TEST(HealthWatch, AStallWithFramesWaitingIsReportedOnce) {
  Fixture t;
  std::vector<std::string> why;
  t.watch->set_on_unhealthy([&](const std::string& w) { why.push_back(w); }, HealthBounds{3000, 3});
  t.watch->Start();
  EXPECT_EQ(t.Counter("vigil_edge_unhealthy_total"), 0);  // registered at Start
  t.clock.Advance(10'000 * kMs);
  t.watch->CheckHealth(t.clock.SteadyNs());  // idle: nothing waits, not a stall
  EXPECT_TRUE(why.empty());
  t.watch->Pushing();  // the stall clock starts with the first frame of an idle pool
  t.watch->Pushing();
  t.clock.Advance(2999 * kMs);
  t.watch->CheckHealth(t.clock.SteadyNs());
  EXPECT_TRUE(why.empty());
  t.clock.Advance(2 * kMs);
  t.watch->CheckHealth(t.clock.SteadyNs());
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("2 frame(s) waiting"), std::string::npos) << why[0];
  t.clock.Advance(5000 * kMs);
  t.watch->CheckHealth(t.clock.SteadyNs());  // once per Run
  EXPECT_EQ(why.size(), 1u);
  EXPECT_EQ(t.Counter("vigil_edge_unhealthy_total"), 1);
}

TEST(HealthWatch, FailingBatchesInARowAreUnhealthyWithTheLastError) {
  Fixture t;
  std::string why;
  t.watch->set_on_unhealthy([&](const std::string& w) { why = w; }, HealthBounds{0, 2});
  t.watch->Start();
  t.watch->Pushing();
  t.watch->BatchDone(1, absl::InternalError("first"));
  t.watch->Pushing();
  t.watch->BatchDone(1, absl::OkStatus());  // the row restarts
  t.watch->Pushing();
  t.watch->BatchDone(1, absl::InternalError("second"));
  t.watch->CheckHealth(t.clock.SteadyNs());
  EXPECT_TRUE(why.empty());
  t.watch->Pushing();
  t.watch->BatchDone(1, absl::InternalError("third"));
  t.watch->CheckHealth(t.clock.SteadyNs());
  EXPECT_NE(why.find("third"), std::string::npos) << why;
  EXPECT_EQ(t.watch->frames_waiting(), 0u);
}

TEST(HealthWatch, APushThePoolRefusedDoesNotWait) {
  Fixture t;
  t.watch->Pushing();
  t.watch->PushRefused();
  EXPECT_EQ(t.watch->frames_waiting(), 0u);
}

TEST(HealthWatch, NoFrameFor10sWithStreamsActiveIsOneStall) {
  Fixture t;
  int described = 0;
  auto where = [&] {
    ++described;
    return std::string("readers []");
  };
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 100, where);  // the first sample starts the clock
  t.clock.Advance(HealthWatch::kStallNs - 1);
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 100, where);
  EXPECT_EQ(described, 0);
  t.clock.Advance(1);
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 100, where);
  EXPECT_EQ(described, 1);
  EXPECT_EQ(t.Counter("vigil_edge_stalls_total"), 1);
  t.clock.Advance(HealthWatch::kStallNs);
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 100, where);  // the same stall: said once
  EXPECT_EQ(t.Counter("vigil_edge_stalls_total"), 1);
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 101, where);  // frames again: a new stall may come
  t.clock.Advance(HealthWatch::kStallNs);
  t.watch->WatchForStall(t.clock.SteadyNs(), 0, 101, where);  // no stream active: not a stall (the clock restarts)
  t.clock.Advance(HealthWatch::kStallNs - 1);
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 101, where);
  EXPECT_EQ(t.Counter("vigil_edge_stalls_total"), 1);
  t.clock.Advance(1);
  t.watch->WatchForStall(t.clock.SteadyNs(), 1, 101, where);
  EXPECT_EQ(t.Counter("vigil_edge_stalls_total"), 2);
  EXPECT_EQ(described, 2);
}

TEST(HealthWatch, InjectedFaults) {
  {
    Fixture t;
    EXPECT_TRUE(t.watch->SetFault(nullptr).ok());
    EXPECT_TRUE(t.watch->SetFault("").ok());
    EXPECT_TRUE(t.watch->BeforeBatch().ok());
    EXPECT_TRUE(absl::IsInvalidArgument(t.watch->SetFault("stall:0:10")));
    EXPECT_TRUE(absl::IsInvalidArgument(t.watch->SetFault("boom")));
  }
  {
    Fixture t;
    ASSERT_TRUE(t.watch->SetFault("stall:2:750").ok());
    EXPECT_TRUE(t.watch->BeforeBatch().ok());
    EXPECT_TRUE(t.slept.empty());
    EXPECT_TRUE(t.watch->BeforeBatch().ok());  // batch 2 stalls, then runs
    EXPECT_EQ(t.slept, std::vector<int64_t>{750});
    EXPECT_TRUE(t.watch->BeforeBatch().ok());
    EXPECT_EQ(t.slept.size(), 1u);
  }
  {
    Fixture t;
    ASSERT_TRUE(t.watch->SetFault("error:3").ok());
    EXPECT_TRUE(t.watch->BeforeBatch().ok());
    EXPECT_TRUE(t.watch->BeforeBatch().ok());
    EXPECT_TRUE(absl::IsInternal(t.watch->BeforeBatch()));
    EXPECT_TRUE(absl::IsInternal(t.watch->BeforeBatch()));
  }
}

}  // namespace
}  // namespace vigil::pipeline
