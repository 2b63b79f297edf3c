// The takeover controller (takeover_controller.h) on a FakeClock: which Acks complete a takeover, the phases and
// metrics it exports, and that nothing happens without a takeover. No process, no sleep.
#include "vigil/pipeline/takeover_controller.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>

namespace vigil::pipeline {
namespace {

constexpr int64_t kMs = 1'000'000;

BatchResult Batch(uint64_t run, uint64_t seq, size_t frames = 2) {
  BatchResult r;
  for (size_t k = 0; k < frames; ++k) {
    WorkItem item;
    item.stream = 0;
    item.frame.run = run;
    item.frame.seq = seq + k;
    r.items.push_back(std::move(item));
  }
  r.timing.resize(frames);
  return r;
}

transport::Ack AckOf(const std::string& stream, uint64_t run, uint64_t first, uint64_t last) {
  transport::Ack a;
  a.stream = stream;
  a.run = run;
  a.seq_first = first;
  a.seq_last = last;
  a.contiguous_through = static_cast<int64_t>(last);
  return a;
}

double Gauge(metrics::Registry& reg, const std::string& name, metrics::Labels labels = {}) {
  return reg.GetGauge(name, "", std::move(labels)).Value();
}

TEST(TakeoverController, WithoutATakeoverNothingIsMarkedOrExported) {
  metrics::Registry reg;
  FakeClock clock;
  TakeoverController t("e1", reg, &clock);
  EXPECT_FALSE(t.Mark(TakeoverTimeline::kLedger));
  EXPECT_FALSE(t.FirstBatch(Batch(5, 0), "cam"));
  t.Republishing(FrameKey{"e1", "cam", 5, 0});
  t.OnAck(AckOf("cam", 5, 0, 10));
  EXPECT_FALSE(t.first_processed().has_value());
  EXPECT_FALSE(t.timeline().Seconds(TakeoverTimeline::kStored).has_value());
  EXPECT_EQ(Gauge(reg, "vigil_edge_takeover_seconds"), 0);
}

TEST(TakeoverController, TheFirstProcessedFrameStoredCompletesTheTakeover) {
  metrics::Registry reg;
  FakeClock clock;
  TakeoverController t("e1", reg, &clock);
  t.timeline().Start(clock.SteadyNs());
  clock.Advance(10 * kMs);
  EXPECT_TRUE(t.Mark(TakeoverTimeline::kLedger));
  EXPECT_FALSE(t.Mark(TakeoverTimeline::kLedger));  // the first mark wins
  clock.Advance(20 * kMs);
  EXPECT_TRUE(t.FirstBatch(Batch(5, 100), "cam"));
  EXPECT_FALSE(t.FirstBatch(Batch(5, 102), "cam"));  // only the first batch
  ASSERT_TRUE(t.first_processed().has_value());
  EXPECT_EQ(*t.first_processed(), (FrameKey{"e1", "cam", 5, 100}));
  clock.Advance(30 * kMs);
  t.OnAck(AckOf("cam", 5, 90, 99));   // before the frame: not it
  t.OnAck(AckOf("cam", 4, 100, 100)); // another run
  t.OnAck(AckOf("cam2", 5, 100, 100));  // another stream
  EXPECT_FALSE(t.timeline().Seconds(TakeoverTimeline::kStored).has_value());
  t.OnAck(AckOf("cam", 5, 100, 101));
  ASSERT_TRUE(t.timeline().Seconds(TakeoverTimeline::kStored).has_value());
  EXPECT_NEAR(*t.timeline().Seconds(TakeoverTimeline::kStored), 0.060, 1e-9);
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_seconds"), 0.060, 1e-9);
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_phase_seconds", {{"phase", "ledger"}}), 0.010, 1e-9);
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_phase_seconds", {{"phase", "detected"}}), 0.030, 1e-9);
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_phase_seconds", {{"phase", "stored"}}), 0.060, 1e-9);
  clock.Advance(30 * kMs);
  t.OnAck(AckOf("cam", 5, 100, 101));  // a re-ack does not move it
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_seconds"), 0.060, 1e-9);
}

TEST(TakeoverController, RepublishedResultsStoredAreMarkedApart) {
  metrics::Registry reg;
  FakeClock clock;
  TakeoverController t("e1", reg, &clock);
  t.timeline().Start(clock.SteadyNs());
  clock.Advance(5 * kMs);
  t.Republishing(FrameKey{"e1", "cam", 5, 40});
  clock.Advance(5 * kMs);
  t.Republishing(FrameKey{"e1", "cam2", 5, 70});  // another stream's: the first one stays
  clock.Advance(5 * kMs);
  t.OnAck(AckOf("cam2", 5, 70, 70));
  EXPECT_FALSE(t.timeline().Seconds(TakeoverTimeline::kRepublishedStored).has_value());
  t.OnAck(AckOf("cam", 5, 40, 40));
  ASSERT_TRUE(t.timeline().Seconds(TakeoverTimeline::kRepublishedStored).has_value());
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_phase_seconds", {{"phase", "republished"}}), 0.005, 1e-9);
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_phase_seconds", {{"phase", "republished_stored"}}), 0.015, 1e-9);
  // No frame of its own processed yet: the takeover itself is not complete.
  EXPECT_FALSE(t.timeline().Seconds(TakeoverTimeline::kStored).has_value());
}

TEST(TakeoverController, ALiveStreamsFirstFrameMeasuresTheCameraGap) {
  metrics::Registry reg;
  FakeClock clock;
  TakeoverController t("e1", reg, &clock);
  auto contact = std::make_shared<std::atomic<int64_t>>(0);
  t.set_contact(contact);
  t.FirstLiveFrame("cam", 3);  // no takeover: nothing
  EXPECT_EQ(Gauge(reg, "vigil_edge_takeover_camera_gap_seconds", {{"stream", "cam"}}), 0);
  contact->store(clock.SteadyNs());
  clock.Advance(250 * kMs);
  t.FirstLiveFrame("cam", 4);
  EXPECT_NEAR(Gauge(reg, "vigil_edge_takeover_camera_gap_seconds", {{"stream", "cam"}}), 0.250, 1e-9);
}

}  // namespace
}  // namespace vigil::pipeline
