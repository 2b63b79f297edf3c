// Confirmation (issue 20): events decided by their tracks — hand-made report sequences with the outcomes worked out
// by hand. Times are passed in (the aggregator's clock is a parameter): no sleeps.
#include "vigil/aggregator/confirm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vigil::aggregator {
namespace {

using transport::Report;
using transport::ReportDetection;
using transport::ReportKind;

constexpr int64_t kFrameNs = 100'000'000;  // 10 FPS: round numbers for durations
constexpr int64_t kNow = 1'000'000'000;    // the aggregator's clock at the start

const std::vector<std::string> kNames = {"person", "bicycle", "car"};

ReportDetection Person(float x, float score = 0.9f, int cls = 0) { return {x, 50, x + 40, 150, score, static_cast<float>(cls)}; }

Report Event(uint64_t seq, std::vector<ReportDetection> dets, uint64_t run = 1) {
  Report r;
  r.edge = "edge-1";
  r.stream = "cam0";
  r.run = run;
  r.seq_first = r.seq_last = seq;
  r.epoch = 1;
  r.kind = ReportKind::kEvent;
  r.capture_ns = 5'000'000'000 + static_cast<int64_t>(seq) * kFrameNs;
  r.width = 640;
  r.height = 480;
  r.rule = "person";
  r.detections = std::move(dets);
  return r;
}

Report Progress(uint64_t first, uint64_t last, uint64_t run = 1) {
  Report r = Event(first, {}, run);
  r.kind = ReportKind::kProgress;
  r.seq_last = last;
  r.rule = "";
  return r;
}

ConfirmConfig Config(TrackRules rules = {}) {
  ConfirmConfig c;
  c.enabled = true;
  c.tracker.min_hits = 2;
  c.tracker.max_lost_s = 0.5;
  c.rules = rules;
  EXPECT_TRUE(ValidateConfirmConfig(c).ok());
  return c;
}

struct Feed {
  Confirmer confirmer;
  int64_t now = kNow;
  explicit Feed(ConfirmConfig c) : confirmer(std::move(c)) {}
  EventVerdict Next(const Report& r, bool current = true) {
    confirmer.Begin();
    std::optional<EventVerdict> v = confirmer.Observe(r, &kNames, current, now);
    confirmer.Commit();
    now += kFrameNs;
    EXPECT_EQ(v.has_value(), r.kind == ReportKind::kEvent);
    return v.value_or(EventVerdict{});
  }
  void Nothing(const Report& r) {
    confirmer.Begin();
    EXPECT_FALSE(confirmer.Observe(r, &kNames, true, now).has_value());
    confirmer.Commit();
    now += kFrameNs;
  }
  std::vector<EventDecision> Decisions() { return confirmer.TakeDecisions(); }
};

TEST(ConfirmerTest, AWalkingPersonIsConfirmedAtTheFrameItsTrackMeetsTheRulesAndTheEarlierEventsWithIt) {
  // Rules: seen in 3 of the last 5 frames, for 0.15 s, 15 px of travel. The person moves 10 px a frame at 10 FPS.
  Feed r(Config({.k = 3, .m = 5, .min_duration_s = 0.15, .min_travel_px = 15}));
  // Frame 0: a new track, tentative (1 of min_hits 2 matches).
  EventVerdict v = r.Next(Event(0, {Person(100)}));
  EXPECT_EQ(v.state, EventState::kPending);
  EXPECT_EQ(v.reason, "track 1 (person): tentative, matched in 1 of 2 consecutive frames");
  EXPECT_EQ(v.track_ids, (std::vector<int64_t>{1}));
  // Frame 1: confirmed by the tracker, but seen in 2 of 5 frames, for 0.10 s, 10 px.
  v = r.Next(Event(1, {Person(110)}));
  EXPECT_EQ(v.state, EventState::kPending);
  EXPECT_EQ(v.reason,
            "track 1 (person): seen in 2 of the last 5 frames, for 0.10 s, travelled 10 px; needs 3 of 5 frames, "
            "needs 0.15 s, needs 15 px of travel");
  EXPECT_TRUE(r.Decisions().empty());
  // Frame 2: 3 of 5, 0.20 s, 20 px: this event confirmed, and the two before it decided.
  v = r.Next(Event(2, {Person(120)}));
  const std::string met = "track 1 (person): seen in 3 of the last 5 frames, for 0.20 s, travelled 20 px";
  EXPECT_EQ(v.state, EventState::kConfirmed);
  EXPECT_EQ(v.reason, met);
  EXPECT_EQ(v.track_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(v.confirmed_by, 1);
  const std::vector<EventDecision> d = r.Decisions();
  ASSERT_EQ(d.size(), 2u);
  for (uint64_t seq : {0, 1}) {
    EXPECT_EQ(d[seq].seq, seq);
    EXPECT_EQ(d[seq].run, 1u);
    EXPECT_EQ(d[seq].edge, "edge-1");
    EXPECT_EQ(d[seq].stream, "cam0");
    EXPECT_EQ(d[seq].state, EventState::kConfirmed);
    EXPECT_EQ(d[seq].reason, met);
    EXPECT_EQ(d[seq].tracks, std::vector<int64_t>{1}) << "the track that confirmed it";
  }
  const ConfirmStats st = r.confirmer.stats();
  EXPECT_EQ(st.stored_pending, 2u);
  EXPECT_EQ(st.stored_confirmed, 1u);
  EXPECT_EQ(st.decided_confirmed, 2u);
  EXPECT_EQ(st.pending, 0u);
  EXPECT_EQ(st.tracks, 1u);
}

TEST(ConfirmerTest, OneFrameOfGlitterIsRejectedWhenTheNextFrameMissesIt) {
  Feed r(Config());
  EventVerdict v = r.Next(Event(0, {Person(300, 0.95f)}));
  EXPECT_EQ(v.state, EventState::kPending);
  r.Nothing(Progress(1, 4));  // nothing there in frames 1..4: the tentative track ends
  const std::vector<EventDecision> d = r.Decisions();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].seq, 0u);
  EXPECT_EQ(d[0].state, EventState::kRejected);
  EXPECT_EQ(d[0].reason, "track 1 (person): ended tentative, matched in 1 of 2 consecutive frames");
  EXPECT_EQ(r.confirmer.stats().pending, 0u);
  EXPECT_EQ(r.confirmer.stats().tracks, 0u);
}

TEST(ConfirmerTest, AnEventNoTrackTakesIsRejectedAtOnce) {
  Feed r(Config());
  // 0.45: below new_track_score (0.6) and no track to continue.
  const EventVerdict v = r.Next(Event(0, {Person(100, 0.45f), Person(300, 0.3f)}));
  EXPECT_EQ(v.state, EventState::kRejected);
  EXPECT_EQ(v.reason, "no detection started or continued a track (best score 0.45, a new track needs 0.60)");
  EXPECT_EQ(v.track_ids, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(r.confirmer.stats().stored_rejected, 1u);
}

TEST(ConfirmerTest, AParkedObjectStaysPendingUntilItsStreamGoesSilentThenItIsRejectedWithWhatItMissed) {
  // A parked car must travel 50 px: it never does. It stays pending while frames come; once the stream is silent
  // for idle_s, its track is judged as ended.
  ConfirmConfig c = Config({.k = 1, .m = 1, .min_duration_s = 0, .min_travel_px = 50});
  c.idle_s = 2;
  Feed r(std::move(c));
  for (uint64_t seq = 0; seq < 6; ++seq) {
    const EventVerdict v = r.Next(Event(seq, {Person(200, 0.8f, 2)}));
    EXPECT_EQ(v.state, EventState::kPending) << seq;
    EXPECT_EQ(v.track_ids, (std::vector<int64_t>{1})) << seq;
  }
  EXPECT_EQ(r.confirmer.stats().pending, 6u);
  r.confirmer.Begin();
  r.confirmer.Expire(r.now + 1'000'000'000);  // 1.1 s after the last report: not yet
  r.confirmer.Commit();
  EXPECT_TRUE(r.Decisions().empty());
  r.confirmer.Begin();
  r.confirmer.Expire(r.now + 2'000'000'000);
  r.confirmer.Commit();
  const std::vector<EventDecision> d = r.Decisions();
  ASSERT_EQ(d.size(), 6u);
  for (const EventDecision& e : d) {
    EXPECT_EQ(e.state, EventState::kRejected);
    EXPECT_EQ(e.reason,
              "track 1 (car): seen in 1 of the last 1 frames, for 0.50 s, travelled 0 px; ended, needs 50 px of "
              "travel; the stream went silent");
  }
  EXPECT_EQ(r.confirmer.stats().pending, 0u);
  EXPECT_EQ(r.confirmer.stats().tracks, 0u);
}

TEST(ConfirmerTest, IdsStayThroughAMissedFrameAnOcclusionAndANewRunOfTheStream) {
  Feed r(Config({.k = 4, .m = 10}));
  std::vector<int64_t> ids;
  ids.push_back(r.Next(Event(0, {Person(100)})).track_ids.at(0));
  ids.push_back(r.Next(Event(1, {Person(105)})).track_ids.at(0));
  r.Nothing(Progress(2, 2));  // missed: the track is lost, not ended (max_lost_s 0.5)
  ids.push_back(r.Next(Event(3, {Person(115)})).track_ids.at(0));
  // Occlusion: the score dips to 0.3 (stage two keeps the track); the event is confirmed: 4 of 10 frames.
  const EventVerdict occluded = r.Next(Event(4, {Person(120, 0.3f)}));
  ids.push_back(occluded.track_ids.at(0));
  EXPECT_EQ(occluded.state, EventState::kConfirmed);
  ids.push_back(r.Next(Event(5, {Person(125)})).track_ids.at(0));
  // The edge restarted: run 2 from seq 0, the same person 0.1 s later — the same track.
  Report restarted = Event(0, {Person(130)}, 2);
  restarted.capture_ns = Event(6, {}).capture_ns;
  ids.push_back(r.Next(restarted).track_ids.at(0));
  EXPECT_EQ(ids, (std::vector<int64_t>(6, 1)));
  // A frame of run 1 re-sent late is not fed (its event stored confirmed, untracked).
  const EventVerdict late = r.Next(Event(6, {Person(135)}, 1));
  EXPECT_EQ(late.state, EventState::kConfirmed);
  EXPECT_EQ(late.reason, "not tracked: an older run re-sent after a newer one");
  EXPECT_TRUE(late.track_ids.empty());
  // And a frame re-sent below the run's highest one likewise.
  EXPECT_EQ(r.Next(restarted).reason, "not tracked: re-sent after later frames");
  EXPECT_EQ(r.confirmer.stats().skipped, 2u);
}

TEST(ConfirmerTest, AFileReadFasterThanRealTimeIsTrackedInItsOwnTime) {
  // A file decoded in bursts: capture times 1 ms apart, then a 70 ms pause, while its presentation timestamps step
  // 100 ms a frame. A person walks 10 px a frame (100 px/s). On capture time the motion model would see 10 px/ms
  // and lose the track at the first pause; on the stream's own time it predicts 10 px a frame and keeps it.
  Feed r(Config({.k = 1, .m = 1, .min_duration_s = 0.75}));
  int64_t capture = 9'000'000'000;
  std::vector<int64_t> ids;
  EventVerdict v;
  for (uint64_t seq = 0; seq < 10; ++seq) {
    Report e = Event(seq, {Person(100 + 10.0f * static_cast<float>(seq))});
    e.pts_ns = static_cast<int64_t>(seq) * kFrameNs;
    capture += seq % 4 == 0 ? 70'000'000 : 1'000'000;
    e.capture_ns = capture;
    v = r.Next(e);
    ids.push_back(v.track_ids.at(0));
  }
  EXPECT_EQ(ids, (std::vector<int64_t>(10, 1)));
  EXPECT_EQ(v.state, EventState::kConfirmed);
  EXPECT_EQ(v.reason, "track 1 (person): seen in 1 of the last 1 frames, for 0.90 s, travelled 90 px");
}

TEST(ConfirmerTest, AReportOfAFencedEpochIsNotFed) {
  Feed r(Config());
  const EventVerdict v = r.Next(Event(0, {Person(100)}), /*current=*/false);
  EXPECT_EQ(v.state, EventState::kConfirmed);
  EXPECT_EQ(v.reason, "not tracked: its epoch is not the edge's current one");
  EXPECT_EQ(r.confirmer.stats().tracks, 0u);
  EXPECT_EQ(r.confirmer.stats().frames, 0u);
}

TEST(ConfirmerTest, ARolledBackBatchLeavesNoTraceAndItsReportsAreTrackedWhenResent) {
  Feed r(Config({.k = 2, .m = 2}));
  r.Next(Event(0, {Person(100)}));
  const ConfirmStats before = r.confirmer.stats();
  r.confirmer.Begin();
  std::optional<EventVerdict> v = r.confirmer.Observe(Event(1, {Person(110)}), &kNames, true, r.now);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->state, EventState::kConfirmed);
  EXPECT_EQ(r.confirmer.TakeDecisions().size(), 1u);  // frame 0's event
  // A second stream first seen in this batch goes too.
  Report other = Event(0, {Person(300)});
  other.stream = "cam1";
  ASSERT_TRUE(r.confirmer.Observe(other, &kNames, true, r.now));
  r.confirmer.Rollback();
  EXPECT_TRUE(r.confirmer.TakeDecisions().empty());
  const ConfirmStats after = r.confirmer.stats();
  EXPECT_EQ(after.frames, before.frames);
  EXPECT_EQ(after.pending, 1u);
  EXPECT_EQ(after.tracks, 1u) << "cam1's track went with the rollback";
  EXPECT_EQ(after.stored_confirmed, before.stored_confirmed);
  // The edge re-sends frame 1: tracked again (not "re-sent after later frames"), the same verdict and decision.
  const EventVerdict again = r.Next(Event(1, {Person(110)}));
  EXPECT_EQ(again.state, EventState::kConfirmed);
  EXPECT_EQ(again.track_ids, (std::vector<int64_t>{1}));
  const std::vector<EventDecision> d = r.Decisions();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].seq, 0u);
  EXPECT_EQ(d[0].state, EventState::kConfirmed);
}

TEST(ConfirmerTest, OverridesPickRulesByStreamAndClass) {
  ConfirmConfig c = Config({.k = 1, .m = 1});
  c.overrides = {{{"cam0"}, {"car"}, {.k = 3, .m = 3}}};
  Feed r(std::move(c));
  // Frame 0: a person and a car, both tentative.
  EventVerdict v = r.Next(Event(0, {Person(100), Person(400, 0.9f, 2)}));
  EXPECT_EQ(v.state, EventState::kPending);
  EXPECT_EQ(v.track_ids, (std::vector<int64_t>{1, 2}));
  // Frame 1: the car alone (the person's tentative track ends). The car's track is the tracker's now, but cam0's
  // cars need 3 of 3 frames.
  v = r.Next(Event(1, {Person(400, 0.9f, 2)}));
  EXPECT_EQ(v.state, EventState::kPending);
  EXPECT_EQ(v.reason, "track 2 (car): seen in 2 of the last 3 frames, for 0.10 s, travelled 0 px; needs 3 of 3 frames");
  EXPECT_TRUE(r.Decisions().empty()) << "frame 0's event still has the car";
  v = r.Next(Event(2, {Person(400, 0.9f, 2)}));
  EXPECT_EQ(v.state, EventState::kConfirmed);
  EXPECT_EQ(v.reason, "track 2 (car): seen in 3 of the last 3 frames, for 0.20 s, travelled 0 px");
  std::vector<EventDecision> d = r.Decisions();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].seq, 0u);
  EXPECT_EQ(d[1].seq, 1u);
  // Frame 0 had the person (track 1, never confirmed) and the car: the car confirmed it, and only the car is named.
  EXPECT_EQ(d[0].tracks, std::vector<int64_t>{2});
  EXPECT_EQ(v.confirmed_by, 2);
  // Another stream: the default rules (1 of 1) confirm a car at its second frame (min_hits 2).
  Report other = Event(0, {Person(400, 0.9f, 2)});
  other.stream = "cam1";
  EXPECT_EQ(r.Next(other).state, EventState::kPending);
  other.seq_first = other.seq_last = 1;
  other.capture_ns += kFrameNs;
  v = r.Next(other);
  EXPECT_EQ(v.state, EventState::kConfirmed);
  EXPECT_EQ(v.reason, "track 3 (car): seen in 1 of the last 1 frames, for 0.10 s, travelled 0 px");
}

TEST(ConfirmerTest, AfterARestartStoredEventsRebuildTheTracksAndPendingOnesAreDecidedByLiveFrames) {
  // The previous aggregator stored events 0 (confirmed) and 1, 2 (pending), then stopped. The new one resumes from the
  // store, then live frames 3.. arrive.
  Feed r(Config({.k = 4, .m = 5}));
  auto stored = [](uint64_t seq, float x, EventState state) {
    StoredEvent e;
    e.edge = "edge-1";
    e.stream = "cam0";
    e.run = 1;
    e.seq = seq;
    e.capture_ns = 5'000'000'000 + static_cast<int64_t>(seq) * kFrameNs;
    e.state = state;
    e.detections = {{0, "person", 0.9f, x, 50, x + 40, 150}};
    return e;
  };
  r.confirmer.Begin();
  r.confirmer.Resume(stored(0, 100, EventState::kConfirmed), r.now);
  r.confirmer.Resume(stored(1, 105, EventState::kPending), r.now);
  r.confirmer.Resume(stored(2, 110, EventState::kPending), r.now);
  r.confirmer.Commit();
  EXPECT_TRUE(r.Decisions().empty());
  EXPECT_EQ(r.confirmer.stats().pending, 2u);
  // Frame 3 is the 4th of the last 5: the track confirms, and the resumed pending events with it.
  const EventVerdict v = r.Next(Event(3, {Person(115)}));
  EXPECT_EQ(v.state, EventState::kConfirmed);
  const std::vector<EventDecision> d = r.Decisions();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].seq, 1u);
  EXPECT_EQ(d[1].seq, 2u);
  EXPECT_EQ(d[0].state, EventState::kConfirmed);
  // Resumed events count as neither stored nor decided until decided.
  EXPECT_EQ(r.confirmer.stats().stored_pending, 0u);
  EXPECT_EQ(r.confirmer.stats().decided_confirmed, 2u);
}

TEST(ConfirmerTest, TrackIdsStartWhereTheStoreLeftThemAndAreUniqueAcrossStreams) {
  Confirmer c(Config(), 41);
  c.Begin();
  Report a = Event(0, {Person(100)}), b = Event(0, {Person(100)});
  b.stream = "cam1";
  EXPECT_EQ(c.Observe(a, &kNames, true, kNow)->track_ids, (std::vector<int64_t>{41}));
  EXPECT_EQ(c.Observe(b, &kNames, true, kNow)->track_ids, (std::vector<int64_t>{42}));
  c.Commit();
}

TEST(ConfirmerTest, ConfigErrorsNameTheField) {
  ConfirmConfig c = Config();
  c.overrides = {{{}, {"car"}, {.k = 4, .m = 2}}};
  const Status st = ValidateConfirmConfig(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("confirm.overrides[0]"), std::string::npos) << st;
  c = Config();
  c.idle_s = 0;
  EXPECT_NE(ValidateConfirmConfig(c).message().find("confirm.idle_s"), std::string::npos);
  c = Config();
  c.tracker.low_score = 0.7f;
  EXPECT_NE(ValidateConfirmConfig(c).message().find("confirm.tracker"), std::string::npos);
}

}  // namespace
}  // namespace vigil::aggregator
