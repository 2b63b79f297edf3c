// Tracking (issue 20, first step): hand-made detection sequences with the outcomes worked out by hand.
#include "vigil/aggregator/tracking.h"

#include <gtest/gtest.h>

#include <vector>

namespace vigil::aggregator {
namespace {

constexpr int64_t kFrameNs = 33'333'333;  // 30 FPS

TrackInput Det(float x, float y, float score = 0.9f, int cls = 0, float w = 40, float h = 100) {
  return {{x, y, x + w, y + h}, score, cls};
}

struct Sequence {
  Tracker tracker;
  uint64_t seq = 0;
  explicit Sequence(TrackerOptions o = {}) : tracker(o) {}
  TrackUpdate Next(std::vector<TrackInput> dets) {
    StatusOr<TrackUpdate> u = tracker.Update(seq, static_cast<int64_t>(seq) * kFrameNs, dets);
    ++seq;
    EXPECT_TRUE(u.ok()) << u.status();
    return u.ok() ? *u : TrackUpdate{};
  }
};

TEST(AssignTest, FindsTheOptimumWhereGreedyWouldNotAndNeverTakesForbiddenPairs) {
  // Greedy (cheapest pair first) takes A–X (0.1) and is left with B–Y (0.9): 1.0 in all. The optimum is
  // A–Y + B–X = 0.5.
  const std::vector<double> cost = {0.1, 0.2,   // A: X, Y
                                    0.3, 0.9};  // B: X, Y
  EXPECT_EQ(Assign(cost, 2, 2, 0.95), (std::vector<int>{1, 0}));
  // B–Y forbidden (above max_cost) changes nothing; with B–X forbidden too, B gets nothing and A its best.
  EXPECT_EQ(Assign(cost, 2, 2, 0.5), (std::vector<int>{1, 0}));
  EXPECT_EQ(Assign(std::vector<double>{0.1, 0.2, 0.6, 0.9}, 2, 2, 0.5), (std::vector<int>{0, -1}));
  // Rectangular: three rows, one column: the cheapest row gets it.
  EXPECT_EQ(Assign(std::vector<double>{0.4, 0.2, 0.3}, 3, 1, 1.0), (std::vector<int>{-1, 0, -1}));
  EXPECT_EQ(Assign(std::vector<double>{}, 0, 3, 1.0), (std::vector<int>{}));
}

TEST(TrackerTest, TwoPeopleCrossingKeepTheirIdsThroughTheMotionModel) {
  Sequence r;
  // A walks right, B walks left, 12 px a frame, at the same height: they overlap around frames 7–9.
  std::vector<int64_t> a_ids, b_ids;
  for (int f = 0; f < 16; ++f) {
    const float ax = 12.0f * f, bx = 192.0f - 12.0f * f;
    TrackUpdate u = r.Next({Det(ax, 50), Det(bx, 50)});
    ASSERT_EQ(u.track_of.size(), 2u);
    a_ids.push_back(u.track_of[0]);
    b_ids.push_back(u.track_of[1]);
  }
  for (int f = 0; f < 16; ++f) {
    EXPECT_EQ(a_ids[f], 1) << "frame " << f;
    EXPECT_EQ(b_ids[f], 2) << "frame " << f;
  }
  EXPECT_EQ(r.tracker.Find(1)->state, TrackState::kConfirmed);
  EXPECT_EQ(r.tracker.Find(1)->hits, 16u);
}

TEST(TrackerTest, AMissedFrameAndAShortOcclusionKeepTheIdALongOneEndsTheTrack) {
  TrackerOptions o;
  o.max_lost_s = 0.5;  // 15 frames
  Sequence r(o);
  // Moving right 10 px a frame.
  for (int f = 0; f < 5; ++f) EXPECT_EQ(r.Next({Det(10.0f * f, 0)}).track_of[0], 1);
  // Frame 5 missed; frame 6 where the motion puts it.
  TrackUpdate u = r.Next({});
  EXPECT_TRUE(u.ended.empty());
  EXPECT_EQ(r.tracker.Find(1)->state, TrackState::kLost);
  EXPECT_EQ(r.Next({Det(60, 0)}).track_of[0], 1);
  EXPECT_EQ(r.tracker.Find(1)->state, TrackState::kConfirmed);
  // Occluded for frames 7–16 (0.33 s), back at frame 17, 110 px further: predicted there, same id.
  for (int f = 7; f < 17; ++f) EXPECT_TRUE(r.Next({}).ended.empty());
  EXPECT_EQ(r.Next({Det(170, 0)}).track_of[0], 1);
  // Gone for 20 frames (0.67 s > 0.5 s): the track ends at the 16th missed frame; back later it is a new one.
  std::vector<int64_t> ended;
  for (int f = 18; f < 38; ++f) {
    for (const Track& t : r.Next({}).ended) ended.push_back(t.id);
  }
  EXPECT_EQ(ended, std::vector<int64_t>{1});
  EXPECT_EQ(r.tracker.Find(1), nullptr);
  EXPECT_EQ(r.Next({Det(370, 0)}).track_of[0], 2);
}

TEST(TrackerTest, ALowScoreDetectionKeepsItsTrackButStartsNone) {
  Sequence r;
  EXPECT_EQ(r.Next({Det(0, 0)}).track_of[0], 1);
  EXPECT_EQ(r.Next({Det(2, 0)}).track_of[0], 1);
  // Partly hidden: 0.3 (stage two: above low_score 0.1, IoU with the prediction above 0.5) keeps the track.
  EXPECT_EQ(r.Next({Det(4, 0, 0.3f)}).track_of[0], 1);
  EXPECT_EQ(r.tracker.Find(1)->state, TrackState::kConfirmed);
  // A low-score box elsewhere, and a high-score one below new_track_score (0.6): no track.
  TrackUpdate u = r.Next({Det(6, 0), Det(400, 0, 0.3f), Det(800, 0, 0.55f)});
  EXPECT_EQ(u.track_of, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(r.tracker.tracks().size(), 1u);
}

TEST(TrackerTest, ClassesNeverShareATrack) {
  Sequence r;
  EXPECT_EQ(r.Next({Det(0, 0, 0.9f, 0)}).track_of[0], 1);
  // The same place, another class: a new track; the first is missed (tentative, one hit: dropped).
  TrackUpdate u = r.Next({Det(0, 0, 0.9f, 2)});
  EXPECT_EQ(u.track_of[0], 2);
  ASSERT_EQ(u.ended.size(), 1u);
  EXPECT_EQ(u.ended[0].id, 1);
}

TEST(TrackRulesTest, ConfirmedRejectedAndPendingAsWorkedOutByHand) {
  TrackRules rules;
  rules.k = 3;
  rules.m = 5;
  Sequence r;
  // A person seen in frames 0, 1, 3, 4 (missed 2): pending after 0 and 1 (2 of 5), confirmed at frame 3
  // (0, 1, 3: 3 of the last 5).
  r.Next({Det(0, 0)});
  EXPECT_EQ(Evaluate(rules, *r.tracker.Find(1), 0, false).kind, TrackVerdict::kPending);
  r.Next({Det(5, 0)});
  TrackVerdict v = Evaluate(rules, *r.tracker.Find(1), 1, false);
  EXPECT_EQ(v.kind, TrackVerdict::kPending);
  EXPECT_EQ(v.reason, "seen in 2 of the last 5 frames, for 0.03 s, travelled 5 px; needs 3 of 5 frames");
  r.Next({});
  r.Next({Det(15, 0)});
  v = Evaluate(rules, *r.tracker.Find(1), 3, false);
  EXPECT_EQ(v.kind, TrackVerdict::kConfirmed) << v.reason;
  EXPECT_EQ(v.reason, "seen in 3 of the last 5 frames, for 0.10 s, travelled 15 px");

  // One glittering frame: a tentative track, missed next frame, ended: rejected.
  Sequence glint;
  glint.Next({Det(300, 300)});
  TrackUpdate u = glint.Next({});
  ASSERT_EQ(u.ended.size(), 1u);
  v = Evaluate(rules, u.ended[0], 1, true);
  EXPECT_EQ(v.kind, TrackVerdict::kRejected);
  EXPECT_EQ(v.reason, "seen in 1 of the last 5 frames, for 0.00 s, travelled 0 px; ended, needs 3 of 5 frames");

  // A parked car: seen in every frame but never moving: pending while seen, rejected once it ended.
  TrackRules moving;
  moving.min_travel_px = 50;
  moving.min_duration_s = 0.2;
  TrackerOptions o;
  o.max_lost_s = 0.1;
  Sequence car(o);
  for (int f = 0; f < 10; ++f) car.Next({Det(100, 100, 0.8f, 2, 120, 60)});
  v = Evaluate(moving, *car.tracker.Find(1), 9, false);
  EXPECT_EQ(v.kind, TrackVerdict::kPending);
  EXPECT_EQ(v.reason, "seen in 1 of the last 1 frames, for 0.30 s, travelled 0 px; needs 50 px of travel");
  std::vector<Track> ended;
  for (int f = 10; f < 15; ++f) {
    for (Track& t : car.Next({}).ended) ended.push_back(t);
  }
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(Evaluate(moving, ended[0], 14, true).kind, TrackVerdict::kRejected);
}

TEST(TrackerTest, BadInputAndOptionsAreNamed) {
  Sequence r;
  r.Next({Det(0, 0)});
  StatusOr<TrackUpdate> u = r.tracker.Update(0, 0, {});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(std::string(u.status().message()), "tracker: frame 0 at 0 ns after frame 0 at 0 ns: frames must come in order");
  const TrackInput nan{{0, 0, std::nanf(""), 10}, 0.9f, 0};
  u = r.tracker.Update(5, 5 * kFrameNs, std::vector<TrackInput>{nan});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(std::string(u.status().message()), "tracker: frame 5 detection 0: not a finite box");
  TrackerOptions o;
  o.low_score = 0.6f;
  EXPECT_EQ(std::string(ValidateTrackerOptions(o).message()), "tracker: low_score 0.6: must be in [0, high_score 0.5)");
  o = {};
  o.min_hits = 0;
  EXPECT_FALSE(ValidateTrackerOptions(o).ok());
  EXPECT_TRUE(ValidateTrackerOptions({}).ok());
  EXPECT_EQ(std::string(ValidateTrackRules({4, 3}).message()), "track rules: k 4 of m 3: need 1 <= k <= m <= 1000");
}

}  // namespace
}  // namespace vigil::aggregator
