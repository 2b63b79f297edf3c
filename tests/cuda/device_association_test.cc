// The device Associator (issue 20, item 3) held to the host tracker bit for bit: random multi-stream sequences
// (tests/testing/track_scenes.h) with rollbacks, restarts, forgotten streams, crowded scenes, tables that
// outgrow the device's limits and more streams than its slots; and the Confirmer fed through it (every verdict and
// decision the host's alone).
#include <gtest/gtest.h>

#include "testing/confirm_scenes.h"
#include "testing/require_gpu.h"
#include "testing/track_scenes.h"
#include "vigil/aggregator/association.h"

namespace vigil::aggregator {
namespace {

std::unique_ptr<Associator> Device(DeviceAssociatorOptions o = {}) {
  StatusOr<std::unique_ptr<Associator>> a = MakeDeviceAssociator(o);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST(DeviceAssociatorTest, EqualsTheHostOverRandomStreamsBatchesRollbacksRestartsAndForgottenStreams) {
  VIGIL_REQUIRE_GPU();
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::unique_ptr<Associator> a = Device();
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->where(), "cuda:0");
    testing::HarnessOptions h;
    h.seed = seed;
    h.streams = 24;
    h.batches = 120;
    h.max_frames_per_batch = 96;
    h.scene.max_objects = 8 + 6 * static_cast<int>(seed);
    const testing::HarnessResult r = testing::RunAssociatorHarness(*a, h);
    EXPECT_GT(r.frames, 3000u);
    EXPECT_EQ(r.associated, r.frames) << "within the limits the device declines nothing";
    EXPECT_GT(r.compared_tracks, 24u);
    const AssociatorStats st = a->stats();
    EXPECT_EQ(st.failures, 0u);
    EXPECT_LT(st.copied_in, r.frames / 8) << "advanced streams stay on the device";
    if (HasFailure()) return;
  }
}

TEST(DeviceAssociatorTest, EqualsTheHostWithOtherOptions) {
  VIGIL_REQUIRE_GPU();
  testing::HarnessOptions h;
  h.seed = 9;
  h.tracker.high_score = 0.4f;
  h.tracker.low_score = 0.05f;
  h.tracker.new_track_score = 0.45f;
  h.tracker.match_iou = 0.1f;
  h.tracker.low_match_iou = 0.3f;
  h.tracker.min_hits = 1;
  h.tracker.max_lost_s = 0.25;
  h.tracker.velocity_smoothing = 0.8;
  h.scene.classes = 1;  // every pair is a candidate
  h.scene.max_objects = 20;
  std::unique_ptr<Associator> a = Device();
  ASSERT_NE(a, nullptr);
  const testing::HarnessResult r = testing::RunAssociatorHarness(*a, h);
  EXPECT_GT(r.frames, 300u);
  EXPECT_EQ(r.associated, r.frames);
}

TEST(DeviceAssociatorTest, CrowdedScenesOfHundredsOfBoxesEqualTheHost) {
  VIGIL_REQUIRE_GPU();
  testing::HarnessOptions h;
  h.seed = 5;
  h.streams = 6;
  h.batches = 25;
  h.max_frames_per_batch = 30;
  h.scene.max_objects = 300;
  h.scene.initial_objects = 250;
  h.scene.spawn = 3;
  h.scene.gap_chance = 0;
  DeviceAssociatorOptions o;
  o.max_tracks = 1024;  // 300 objects, the lost ones and the spurious ones' tentative tracks
  std::unique_ptr<Associator> a = Device(o);
  ASSERT_NE(a, nullptr);
  const testing::HarnessResult r = testing::RunAssociatorHarness(*a, h);
  EXPECT_GT(r.frames, 200u);
  EXPECT_EQ(r.associated, r.frames);
  EXPECT_GT(r.compared_tracks, 200u) << "crowded tables at the end";
}

TEST(DeviceAssociatorTest, FramesOverTheLimitsAreDeclinedWithTheReasonAndTheRestStaysEqual) {
  VIGIL_REQUIRE_GPU();
  DeviceAssociatorOptions o;
  o.max_tracks = 20;
  o.max_detections = 24;
  o.max_streams = 3;  // 8 streams: slots are evicted and copied in again, some batches have too many streams
  std::unique_ptr<Associator> a = Device(o);
  ASSERT_NE(a, nullptr);
  testing::HarnessOptions h;
  h.seed = 21;
  h.streams = 8;
  h.batches = 150;
  h.scene.max_objects = 26;
  const testing::HarnessResult r = testing::RunAssociatorHarness(*a, h);
  EXPECT_GT(r.associated, 200u);
  EXPECT_GT(r.declined, 50u) << "tables over 20 tracks, frames over 24 detections, a fourth stream in a batch";
  EXPECT_GT(a->stats().copied_in, 50u) << "evicted slots come back";
}

TEST(DeviceAssociatorTest, AConfirmerAssociatingOnTheDeviceDecidesAsTheHostAlone) {
  VIGIL_REQUIRE_GPU();
  std::unique_ptr<Associator> a = Device();
  ASSERT_NE(a, nullptr);
  Confirmer with(testing::RandomConfig(), 1, std::move(a));
  testing::RunConfirmers(with, 17, 200);
  EXPECT_GT(with.stats().associated, 1000u);
  EXPECT_EQ(with.stats().association_fallbacks, 0u);
  EXPECT_EQ(with.association_where(), "cuda:0");
}

}  // namespace
}  // namespace vigil::aggregator
