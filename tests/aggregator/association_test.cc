// Association elsewhere (issue 20, item 3): Tracker::Update applying a given association, the host Associator
// (the reference the device one is held to, tests/cuda) and the Confirmer fed through an Associator — every
// association, verdict and decision the same as the host's alone, through rollbacks, restarts and fallbacks.
#include "vigil/aggregator/association.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "testing/confirm_scenes.h"
#include "testing/track_scenes.h"
#include "vigil/aggregator/confirm.h"

namespace vigil::aggregator {
namespace {

using testing::RandomConfig;
using testing::RunConfirmers;

constexpr int64_t kFrameNs = 33'333'333;

TrackInput Det(float x, float score = 0.9f, int cls = 0) { return {{x, 50, x + 40, 150}, score, cls}; }

TEST(TrackerAssociationTest, AGivenAssociationIsAppliedLikeTheTrackersOwn) {
  Tracker own(TrackerOptions{}), given(TrackerOptions{});
  const std::vector<std::vector<TrackInput>> frames = {
      {Det(100), Det(300)}, {Det(112), Det(290, 0.3f)}, {Det(124), Det(280)}, {Det(500)}, {Det(136), Det(270)}};
  for (uint64_t f = 0; f < frames.size(); ++f) {
    StatusOr<TrackUpdate> a = own.Update(f, static_cast<int64_t>(f) * kFrameNs, frames[f]);
    ASSERT_TRUE(a.ok());
    StatusOr<TrackUpdate> b = given.Update(f, static_cast<int64_t>(f) * kFrameNs, frames[f], &a->det_of_track);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->track_of, a->track_of) << "frame " << f;
    EXPECT_EQ(b->det_of_track, a->det_of_track);
    EXPECT_EQ(b->ended.size(), a->ended.size());
  }
  // Frame 1's low-score box continued track 2 (seen in frame 0): stage two.
  ASSERT_EQ(given.tracks().size(), own.tracks().size());
  for (size_t i = 0; i < own.tracks().size(); ++i) {
    EXPECT_EQ(given.tracks()[i].id, own.tracks()[i].id);
    EXPECT_EQ(given.tracks()[i].hits, own.tracks()[i].hits);
    EXPECT_EQ(given.velocities()[i].x1, own.velocities()[i].x1);
  }
  EXPECT_EQ(own.Find(1)->hits, 4u);
  EXPECT_EQ(own.Find(2)->hits, 4u);
}

TEST(TrackerAssociationTest, AnAssociationThatCannotBeTheTrackersIsRefusedAndChangesNothing) {
  TrackerOptions o;
  o.min_hits = 1;
  Tracker t(o);
  ASSERT_TRUE(t.Update(1, 0, std::vector<TrackInput>{Det(100, 0.9f, 0), Det(300, 0.9f, 1)}).ok());
  ASSERT_TRUE(t.Update(2, kFrameNs, std::vector<TrackInput>{Det(102, 0.9f, 0)}).ok());  // track 2 missed: lost
  const uint64_t id = t.state_id();
  const std::vector<TrackInput> dets = {Det(104, 0.9f, 0), Det(302, 0.3f, 1), Det(600, 0.9f, 1)};
  auto refused = [&](std::vector<int> a, const std::string& why) {
    StatusOr<TrackUpdate> u = t.Update(3, 2 * kFrameNs, dets, &a);
    EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << why;
    EXPECT_NE(u.status().message().find(why), std::string::npos) << u.status();
    EXPECT_EQ(t.state_id(), id) << "nothing changed";
    EXPECT_EQ(t.last_seq(), 2u);
  };
  refused({0}, "the association has 1 entries for 2 tracks");
  refused({0, 3}, "track 2 detection 3: there are 3 detections");
  refused({0, 0}, "track 2 detection 0: given to another track too");
  refused({1, -1}, "track 1 detection 1: another class");
  // Track 2 was not seen in frame 2: a low-score box cannot continue it (stage two is for the previous frame's).
  refused({0, 1}, "track 2 detection 1: its score cannot match that track");
  std::vector<int> fine = {0, 2};
  StatusOr<TrackUpdate> u = t.Update(3, 2 * kFrameNs, dets, &fine);
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->track_of, (std::vector<int64_t>{1, 0, 2})) << "the association given, not the tracker's own (3 new)";
  EXPECT_NE(t.state_id(), id);
}

TEST(TrackerAssociationTest, StateIdsNameStatesAndCopiesShareThem) {
  Tracker a(TrackerOptions{});
  const uint64_t first = a.state_id();
  Tracker b = a;
  EXPECT_EQ(b.state_id(), first);
  ASSERT_TRUE(a.Update(1, 0, std::vector<TrackInput>{Det(1)}).ok());
  EXPECT_NE(a.state_id(), first);
  const uint64_t after = a.state_id();
  a.Restart();
  EXPECT_NE(a.state_id(), after);
  EXPECT_NE(Tracker(TrackerOptions{}).state_id(), first) << "unique in the process";
}

TEST(HostAssociatorTest, EqualsTheTrackersOwnAssociationOverRandomStreamsBatchesRollbacksAndRestarts) {
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::unique_ptr<Associator> a = MakeHostAssociator();
    testing::HarnessOptions h;
    h.seed = seed;
    h.streams = 6;
    h.batches = 80;
    h.scene.max_objects = 6 + static_cast<int>(seed) * 4;
    testing::HarnessResult r = testing::RunAssociatorHarness(*a, h);
    EXPECT_GT(r.frames, 500u);
    EXPECT_EQ(r.associated, r.frames) << "the host declines nothing";
    EXPECT_GT(r.compared_tracks, 0u);
    const AssociatorStats st = a->stats();
    EXPECT_EQ(st.batches, 80u);
    EXPECT_GT(st.copied_in, 6u) << "rollbacks, restarts and forgotten streams copy states in again";
    EXPECT_LT(st.copied_in, r.frames / 4) << "advanced streams are not copied";
    EXPECT_EQ(a->where(), "host");
    if (HasFailure()) return;
  }
}

TEST(ConfirmerAssociationTest, WithTheHostAssociatorEveryVerdictAndDecisionIsTheHostsAlone) {
  Confirmer with(RandomConfig(), 1, MakeHostAssociator());
  RunConfirmers(with, 7, 200);
  const ConfirmStats st = with.stats();
  EXPECT_GT(st.associated, 1000u);
  EXPECT_EQ(st.association_fallbacks, 0u);
  EXPECT_EQ(st.association_failures, 0u);
  EXPECT_EQ(with.association_where(), "host");
}

// An Associator that misbehaves on purpose: fails calls, declines frames, or gives associations a tracker refuses.
class Unreliable final : public Associator {
 public:
  enum Mode { kFail, kDecline, kWrong };
  explicit Unreliable(Mode m, int* calls = nullptr) : mode_(m), calls_(calls) {}
  StatusOr<std::vector<Association>> Associate(std::span<const AssociationFrame> frames) override {
    if (calls_ != nullptr) ++*calls_;
    if (mode_ == kFail) return absl::InternalError("association: the batch: cudaErrorIllegalAddress (injected)");
    StatusOr<std::vector<Association>> got = host_->Associate(frames);
    for (size_t k = 0; k < got->size(); ++k) {
      Association& a = (*got)[k];
      if (mode_ == kDecline && k % 3 == 1) {
        a.ok = false;
        a.why = "injected";
      } else if (mode_ == kWrong && a.ok && !a.det_of_track.empty()) {
        a.det_of_track.assign(a.det_of_track.size(), static_cast<int>(frames[k].detections.size()) + 5);
      }
    }
    return got;
  }
  void Advanced(uint64_t stream, uint64_t id) override { host_->Advanced(stream, id); }
  void Forget(uint64_t stream) override { host_->Forget(stream); }
  std::string where() const override { return "test"; }
  AssociatorStats stats() const override { return {}; }

 private:
  Mode mode_;
  int* calls_;
  std::unique_ptr<Associator> host_ = MakeHostAssociator();
};

TEST(ConfirmerAssociationTest, WhatTheAssociatorDeclinesRefusesOrFailsIsAssociatedOnTheHostWithTheSameOutcome) {
  {
    auto u = std::make_unique<Unreliable>(Unreliable::kDecline);
    Confirmer with(RandomConfig(), 1, std::move(u));
    RunConfirmers(with, 11, 120);
    EXPECT_GT(with.stats().associated, 100u);
    EXPECT_GT(with.stats().association_fallbacks, 100u) << "declined frames and their streams' later ones";
    EXPECT_EQ(with.association_where(), "test");
  }
  {
    Confirmer with(RandomConfig(), 1, std::make_unique<Unreliable>(Unreliable::kWrong));
    RunConfirmers(with, 12, 60);
    EXPECT_GT(with.stats().association_fallbacks, 50u) << "each refused association counted";
  }
  {
    int calls = 0;
    Confirmer with(RandomConfig(), 1, std::make_unique<Unreliable>(Unreliable::kFail, &calls));
    RunConfirmers(with, 13, 30);
    EXPECT_EQ(calls, 3) << "dropped after three failed batches in a row";
    EXPECT_EQ(with.stats().association_failures, 3u);
    EXPECT_EQ(with.association_where(), "host");
  }
}

TEST(ConfirmerAssociationTest, ConfigErrorsNameTheAssociationField) {
  ConfirmConfig c = RandomConfig();
  c.association_device = "gpu";
  EXPECT_NE(ValidateConfirmConfig(c).message().find("confirm.association.device: 'gpu' is not auto, cpu or cuda:N"),
            std::string::npos)
      << ValidateConfirmConfig(c);
  c = RandomConfig();
  c.association_device = "cuda:1";
  EXPECT_TRUE(ValidateConfirmConfig(c).ok());
  c.association_limits.max_tracks = 0;
  EXPECT_NE(ValidateConfirmConfig(c).message().find("confirm.association.max_tracks: 0"), std::string::npos);
  c = RandomConfig();
  c.association_limits.max_detections = 20000;
  EXPECT_NE(ValidateConfirmConfig(c).message().find("confirm.association.max_detections: 20000"), std::string::npos);
}

TEST(DeviceAssociatorTest, BadOptionsOrNoGpuGiveAClearError) {
  DeviceAssociatorOptions o;
  o.max_tracks = 0;
  StatusOr<std::unique_ptr<Associator>> a = MakeDeviceAssociator(o);
  ASSERT_FALSE(a.ok());
  // Built without CUDA: Unimplemented; with CUDA: InvalidArgument for the options.
  EXPECT_TRUE(a.status().code() == absl::StatusCode::kInvalidArgument ||
              a.status().code() == absl::StatusCode::kUnimplemented)
      << a.status();
  EXPECT_NE(a.status().message().find("cuda:0"), std::string::npos) << a.status();
  o = {};
  o.device = 99;
  a = MakeDeviceAssociator(o);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(a.status().code() == absl::StatusCode::kUnavailable ||
              a.status().code() == absl::StatusCode::kUnimplemented)
      << a.status();
  EXPECT_NE(a.status().message().find("cuda:99"), std::string::npos) << a.status();
}

}  // namespace
}  // namespace vigil::aggregator
